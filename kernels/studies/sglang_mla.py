"""SGLang 0.5.23's own flashinfer MLA backend on the GPU, unpatched and patched, through SGLang's test kit.

What runs is SGLang's code, not a copy of it: the wheel's Python sources (`sglang/srt/...`), once as
published and once with kernels/patches/sglang-0.5.23-mla-gather-then-cast.patch applied, each in its
own process. The backend is built the way SGLang's attention test kit builds it
(`sglang/test/kits/attention_unittest/attention_methods/mla_attention.py`: `MockMLAModelRunner` with
`fp8_kv_cache=True`, a real `MLATokenToKVPool`, `ATTENTION_BACKENDS["flashinfer"]`), and flashinfer
0.7.2's MLA kernel is JIT-compiled on the machine. Every decode point runs eagerly
(`init_forward_metadata`, then `forward_decode`) and under a real CUDA graph through the backend's own
graph calls (`init_cuda_graph_state`, `init_forward_metadata_out_graph(in_capture=True)` and
`init_forward_metadata_in_graph`, two warm-up forwards, capture, then for each replay new page tables
and lengths written in place and `init_forward_metadata_out_graph` before `replay()`); the paged
extend (prefill with a prefix) runs eagerly.

Not SGLang's: `sgl_kernel` (sglang-kernel 0.4.10 is a 373 MB wheel built for torch 2.14.1) is replaced
by a stub package holding every name the wheel's sources import from it unguarded at module level (91 in
0.5.23, found by an AST scan of the tree at run time; the 18 of ../shared/FACTS.md were not enough for
the test kit's import chain); each raises if called, and the worker records that none is called. `sglang/__init__.py` is skipped (the
package is registered by path) because it imports the server. The FA3 path (SGLang's default MLA
backend on Hopper) cannot run: its kernel ships only in sgl-kernel.

Figures per point: the layer's attention (cast + flashinfer kernel) in microseconds, eager (CUDA events
around each call, median) and under the graph (replay time of LAYERS_PER_GRAPH calls / LAYERS_PER_GRAPH);
peak memory above the steady state for one eager call, the peak while capturing a graph (what its
private pool must hold) and the memory a captured graph keeps; outputs
compared bit for bit between the two variants (the same BF16 values reach the same kernel in the same
order, so they must be equal), between each graph replay and the eager call on the same batch, and,
for the small points, against a float32 torch reference.

Usage, in two places:
  here (has pip and the network):  python -m kernels.studies.sglang_mla pack .device/sglang
  on the GPU machine:              python -m kernels.studies.sglang_mla run --pack .device/sglang --out $OUT
  (`--quick` runs four points per variant: the GPU test, tests/test_sglang_mla_gpu.py, does that.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "kernels" / "patches" / "sglang-0.5.23-mla-gather-then-cast.patch"
SGLANG_VERSION = "0.5.23"
FLASHINFER_VERSION = "0.7.2"
VARIANTS = ("unpatched", "patched")
KV_LORA_RANK, ROPE_DIM = 512, 64  # DeepSeek-V3's MLA: a 576-wide latent row, 512 of it the value
PAGE_SIZE = 1  # flashinfer MLA in SGLang runs page size 1 (DeepSeek's default)
LAYERS_PER_GRAPH = 4  # a timed graph replays this many layer calls (all on layer 0's pool)
EAGER_CALLS = 20
GRAPH_REPLAYS = 20
GRAPH_REWRITES = 3  # replays after in-place table / length rewrites, each checked against eager
REFERENCE_MAX_ROWS = 8 * 4096  # points with at most this many live rows are checked against torch too

# sgl_kernel is replaced by a stub package: each name that the wheel's sources import from sgl_kernel (or a
# submodule) at module level outside a try block -- an import that would fail without sglang-kernel --
# is a function that raises when called (found by unguarded_sgl_kernel_imports over the tree; 91 names
# in 0.5.23); every other name raises ImportError, so SGLang's own guarded fallbacks are taken. The
# worker reports which stub names the loaded modules bound and which were called (none may be).
STUB_HEADER = '''"""stepwatch stub: sgl_kernel (sglang-kernel) is not installed. The names below exist so that SGLang's
unguarded module-level imports succeed; each raises when called."""
CALLED = []


def _stub(qualname):
    def call(*args, **kwargs):
        CALLED.append(qualname)
        raise RuntimeError(f"{qualname} is a stepwatch stub and was called")
    call.__name__ = qualname.rsplit(".", 1)[-1]
    call.__stepwatch_stub__ = qualname
    return call
'''

# Wheels the import chain needs that the GPU machine's image lacks (cp312), as SGLANG_ON_H200.md lists.
CARRIED_WHEELS = (
    "orjson==3.13.0", "pybase64==1.5.1", "msgspec==0.23.0", "pyzmq==27.3.0", "pydantic==2.14.4",
    "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5", "openai==2.8.0",
    "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1", "partial-json-parser==0.2.1.1.post7",
    "compressed-tensors==0.18.0", "loguru==0.7.3", "gguf==0.19.0", "dill==0.4.1", "starlette==1.10.0",
    "python-multipart==0.0.34", "fastapi==0.165.0", "uvicorn==0.54.0", "apache-tvm-ffi==0.1.11",
)
# flashinfer's files that the MLA JIT build reads (the wheel is 65 MB; this subset is what
# BatchMLAPagedAttentionWrapper's fa2/fa3 modules include).
FLASHINFER_DATA = ("data/include", "data/cutlass/include", "data/cutlass/tools/util/include", "data/cccl",
                   "data/spdlog/include", "data/csrc/tvm_ffi_utils.h")
FLASHINFER_DATA_GLOB = "data/csrc/batch_mla*"


@dataclass(frozen=True)
class Point:
    """One measured configuration: a decode (bs requests of ctx tokens) or a paged extend (bs requests
    with a ctx-token prefix and `extend` new tokens each), over a pool of `pool` token rows."""
    mode: str
    heads: int
    pool: int
    bs: int
    ctx: int
    extend: int = 0

    @property
    def name(self) -> str:
        tail = f"-x{self.extend}" if self.mode == "extend" else ""
        return f"{self.mode}-h{self.heads}-pool{self.pool // 1024}K-bs{self.bs}-ctx{self.ctx // 1024}K{tail}"

    @property
    def live_rows(self) -> int:
        return self.bs * (self.ctx + self.extend)


def list_points(quick: bool) -> list[Point]:
    """The grid: DeepSeek-V3 shapes, 16 and 128 heads, bs 1-128 x context 1K-32K where the live rows fit
    the pool (131K or 1M tokens), and paged extends; --quick: four points."""
    if quick:
        return [Point("decode", 16, 131072, 1, 1024), Point("decode", 128, 131072, 32, 2048),
                Point("decode", 16, 1048576, 8, 8192), Point("extend", 16, 131072, 4, 1024, 64)]
    points = []
    for heads in (16, 128):
        for pool in (131072, 1048576):
            for bs in (1, 8, 32, 128):
                for ctx in (1024, 4096, 8192, 32768):
                    if bs * ctx <= pool:
                        points.append(Point("decode", heads, pool, bs, ctx))
            points += [Point("extend", heads, pool, 4, 1024, 64), Point("extend", heads, pool, 4, 8192, 64)]
    return points


# --- here: what travels to the GPU machine ------------------------------------------------------

def pack(dest: Path) -> None:
    """Download the sglang and flashinfer wheels and the small wheels, and lay out in `dest` what the GPU
    machine needs: sglang's Python sources (tar.xz), flashinfer's MLA subset (tar.xz), the wheels."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / "download"
    tmp.mkdir(exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run(pip + ["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
                          "--implementation", "cp", "--abi", "cp311", "-d", str(tmp),
                          f"sglang=={SGLANG_VERSION}"], check=True)
    subprocess.run(pip + ["-d", str(tmp), f"flashinfer-python=={FLASHINFER_VERSION}"], check=True)
    platforms = [arg for n in (17, 24, 26, 27, 28) for arg in ("--platform", f"manylinux_2_{n}_x86_64")]
    wheels = dest / "whl"
    wheels.mkdir(exist_ok=True)
    for spec in CARRIED_WHEELS:
        subprocess.run(pip + platforms + ["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
                                          "--python-version", "3.12", "--implementation", "cp",
                                          "-d", str(wheels), spec], check=True)
    import zipfile
    with zipfile.ZipFile(next(tmp.glob(f"sglang-{SGLANG_VERSION}-*.whl"))) as whl, \
            tarfile.open(dest / f"sglang-{SGLANG_VERSION}-py.tar.xz", "w:xz") as tar:
        for info in whl.infolist():
            # every source file, the JIT's .cuh/.h/.cu included (sglang.kernels.jit checks its include/ and
            # csrc/ exist at import), but not the wheel's compiled .so files
            if info.filename.startswith("sglang/") and not info.filename.endswith(".so") and not info.is_dir():
                data = whl.read(info)
                member = tarfile.TarInfo(info.filename)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    with zipfile.ZipFile(next(tmp.glob(f"flashinfer_python-{FLASHINFER_VERSION}-*.whl"))) as whl, \
            tarfile.open(dest / f"flashinfer-{FLASHINFER_VERSION}-subset.tar.xz", "w:xz") as tar:
        for info in whl.infolist():
            name = info.filename
            inside = name.split("/", 1)[1] if name.startswith("flashinfer/") else ""
            keep = (name.endswith(".py") or ".dist-info/" in name
                    or any(inside.startswith(prefix) for prefix in FLASHINFER_DATA)
                    or (inside.startswith("data/csrc/batch_mla")))
            if keep and not info.is_dir():
                data = whl.read(info)
                member = tarfile.TarInfo(name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    shutil.rmtree(tmp)


# --- on the GPU machine: the two trees ------------------------------------------------------------

def unguarded_sgl_kernel_imports(tree: Path) -> dict[str, set[str]]:
    """{module: names} of every `from sgl_kernel[.sub] import name` in tree's .py files that runs at import
    time (module level, under any `if`, not inside a function, class or try block)."""
    import ast

    found: dict[str, set[str]] = {}

    def visit(node, guarded: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, ast.Try):
            for part in node.body:
                visit(part, True)
            for part in node.handlers + node.orelse + node.finalbody:
                visit(part, guarded)
            return
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sgl_kernel" and not guarded:
            found.setdefault(node.module, set()).update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    for path in tree.rglob("*.py"):
        try:
            module = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for top in module.body:
            visit(top, False)
    return found


def write_sgl_kernel_stub(root: Path, names: dict[str, set[str]]) -> None:
    """The package `sgl_kernel` under root: a module per key of `names`, each name a raising stub."""
    package = root / "sgl_kernel"
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    modules = {"sgl_kernel": set()} | names
    for module, bound in sorted(modules.items()):
        parts = module.split(".")
        path = package.joinpath(*parts[1:-1], parts[-1] + ".py") if len(parts) > 1 else package / "__init__.py"
        if len(parts) > 2:
            for depth in range(2, len(parts)):
                init = package.joinpath(*parts[1:depth], "__init__.py")
                init.parent.mkdir(parents=True, exist_ok=True)
                init.touch()
        head = STUB_HEADER if module == "sgl_kernel" else "from sgl_kernel import _stub\n"
        lines = [f"{name} = _stub({module + '.' + name!r})" for name in sorted(bound)]
        path.write_text(head + "\n" + "\n".join(lines) + "\n")


def bound_stub_names() -> list[str]:
    """The stub functions that loaded sglang modules hold as module attributes."""
    bound = set()
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.") and module is not None:
            for value in list(vars(module).values()):
                qualname = getattr(value, "__stepwatch_stub__", None)  # (a Mock answers any attribute)
                if isinstance(qualname, str) and qualname.startswith("sgl_kernel."):
                    bound.add(qualname)
    return sorted(bound)


def prepare(pack_dir: Path, work: Path, log) -> dict:
    """Unpack the wheels, flashinfer and the two sglang trees (the patch applied to one) under `work`."""
    site = work / "site"
    stamp = json.dumps(sorted((str(p.relative_to(pack_dir)), p.stat().st_size) for p in pack_dir.rglob("*")
                              if p.is_file()) + [PATCH.stat().st_size])
    marker = work / ".prepared"
    if not marker.exists() or marker.read_text() != stamp:
        shutil.rmtree(work, ignore_errors=True)
        site.mkdir(parents=True)
        wheels = sorted(str(p) for p in (pack_dir / "whl").glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--target", str(site)] + wheels, check=True)
        with tarfile.open(pack_dir / f"flashinfer-{FLASHINFER_VERSION}-subset.tar.xz") as tar:
            tar.extractall(site, filter="data")
        for variant in VARIANTS:
            tree = work / variant / "python"
            tree.mkdir(parents=True)
            with tarfile.open(pack_dir / f"sglang-{SGLANG_VERSION}-py.tar.xz") as tar:
                tar.extractall(tree, filter="data")
        tool = ["git", "apply", "-p1"] if shutil.which("git") else ["patch", "-p1", "-s", "-i"]
        applied = subprocess.run(tool + [str(PATCH)], cwd=work / "patched", capture_output=True, text=True)
        if applied.returncode != 0:
            raise RuntimeError(f"{PATCH.name} did not apply: {applied.stderr.strip()}")
        ipython = work / "stub" / "IPython"
        ipython.mkdir(parents=True, exist_ok=True)
        (ipython / "__init__.py").write_text('"""stepwatch stub: sglang/utils.py imports IPython.display for notebooks."""\n')
        (ipython / "display.py").write_text("def HTML(*a, **k):\n    raise RuntimeError('IPython stub')\n\n"
                                             "def display(*a, **k):\n    raise RuntimeError('IPython stub')\n")
        marker.write_text(stamp)
        log("prepared: wheels, flashinfer subset, sglang unpatched and patched")
    # every run: the stub is this file's, made from the unpatched tree's imports
    write_sgl_kernel_stub(work / "stub", unguarded_sgl_kernel_imports(work / "unpatched" / "python" / "sglang"))
    return {"site": str(site), "stub": str(work / "stub")}


def variant_env(work: Path, variant: str) -> dict:
    env = dict(os.environ)
    paths = [str(REPO), str(work / variant / "python"), str(work / "stub"), str(work / "site")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    env["TVM_FFI_DISABLE_TORCH_C_DLPACK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["STEPWATCH_SGLANG_TREE"] = str(work / variant / "python")
    return env


# --- in each variant's process: SGLang's backend ----------------------------------------------------

def import_sglang(tree: Path):
    """Register `sglang` by path (its __init__ imports the server) and import what the points use."""
    package = types.ModuleType("sglang")
    package.__path__ = [str(tree / "sglang")]
    sys.modules["sglang"] = package
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as kit
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    return kit, RadixAttention, ForwardBatch, ForwardMode


class Backend:
    """SGLang's flashinfer MLA backend over a real FP8 MLATokenToKVPool, built by the test kit's runner."""

    def __init__(self, sg, point: Point, graph: bool, seed: int):
        import torch
        kit, RadixAttention, ForwardBatch, ForwardMode = sg
        self.torch, self.ForwardBatch, self.ForwardMode = torch, ForwardBatch, ForwardMode
        self.point = point
        mode = ForwardMode.DECODE if point.mode == "decode" else ForwardMode.EXTEND
        self.max_context_len = point.ctx + point.extend
        runner_bs = max(point.bs, point.pool // self.max_context_len)
        case = kit.MLAAttentionCase(name=point.name, backend="flashinfer", forward_mode=mode,
                                    num_heads=point.heads, page_size=PAGE_SIZE,
                                    prefix_lens=(point.ctx,) * point.bs,
                                    extend_lens=(point.extend,) * point.bs if point.extend else ())
        config = kit.TinyMLAModelConfig(num_heads=point.heads, kv_lora_rank=KV_LORA_RANK,
                                        qk_rope_head_dim=ROPE_DIM, hidden_size=64,
                                        context_len=self.max_context_len)
        self.runner = kit.MockMLAModelRunner(
            case=case, model_config=config, dtype=torch.bfloat16, device="cuda",
            max_context_len=self.max_context_len, kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=ROPE_DIM,
            disable_cuda_graph=not graph, runner_batch_size=runner_bs, fp8_kv_cache=True)
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        self.backend = ATTENTION_BACKENDS["flashinfer"](self.runner)
        self.layer = RadixAttention(num_heads=point.heads, head_dim=KV_LORA_RANK + ROPE_DIM,
                                    scaling=config.scaling, num_kv_heads=1, layer_id=0,
                                    v_head_dim=KV_LORA_RANK)
        self.pool = self.runner.token_to_kv_pool
        self.pool_rows = self.pool.kv_buffer[0].shape[0]
        self.fill_pool(seed)

    def fill_pool(self, seed: int) -> None:
        """Random FP8 rows in the whole pool (the same seed gives the same bytes in both processes)."""
        torch = self.torch
        fp8 = self.pool.kv_buffer[0].view(torch.float8_e4m3fn).view(self.pool_rows, -1)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        step = 65536
        for start in range(0, self.pool_rows, step):
            rows = min(step, self.pool_rows - start)
            fp8[start:start + rows] = torch.randn(rows, fp8.shape[1], device="cuda", generator=gen,
                                                  dtype=torch.bfloat16).to(torch.float8_e4m3fn)

    def make_batch(self, seed: int, lens: list[int] | None = None):
        """A batch of point.bs requests whose tokens sit at random pool rows (slot 0 is SGLang's padding
        slot), written into req_to_token in place, as SGLang's scheduler does."""
        torch, point = self.torch, self.point
        gen = torch.Generator(device="cuda").manual_seed(seed)
        seq = lens or [point.ctx + point.extend] * point.bs  # decode: the prefix; extend: prefix + new
        total = sum(seq)
        rows = torch.randperm(self.pool_rows - PAGE_SIZE, device="cuda", generator=gen)[:total] + PAGE_SIZE
        table = self.runner.req_to_token_pool.req_to_token
        starts = [0]
        for n in seq:
            starts.append(starts[-1] + n)
        for b, n in enumerate(seq):
            table[b, :n] = rows[starts[b]:starts[b + 1]].to(table.dtype)
        bs = point.bs
        seq_t = torch.tensor(seq, dtype=torch.int32, device="cuda")
        if point.mode == "decode":
            positions = seq_t.to(torch.int64) - 1
            out_loc = torch.stack([rows[starts[b + 1] - 1] for b in range(bs)]).to(torch.int64)
            tokens = bs
        else:
            positions = torch.cat([torch.arange(n - point.extend, n, device="cuda") for n in seq])
            out_loc = torch.cat([rows[starts[b + 1] - point.extend:starts[b + 1]] for b in range(bs)]).to(torch.int64)
            tokens = bs * point.extend
        batch = self.ForwardBatch(
            forward_mode=self.ForwardMode.DECODE if point.mode == "decode" else self.ForwardMode.EXTEND,
            batch_size=bs, input_ids=torch.arange(tokens, dtype=torch.int64, device="cuda"),
            req_pool_indices=torch.arange(bs, dtype=torch.int32, device="cuda"), seq_lens=seq_t,
            seq_lens_cpu=seq_t.cpu(), out_cache_loc=out_loc, seq_lens_sum=total, positions=positions)
        self.runner.kv_index_translator.bind_own_plan(batch)
        if point.mode == "extend":
            ext = torch.full((bs,), point.extend, dtype=torch.int32, device="cuda")
            batch.extend_prefix_lens = seq_t - point.extend
            batch.extend_prefix_lens_cpu = [n - point.extend for n in seq]
            batch.extend_seq_lens = ext
            batch.extend_seq_lens_cpu = [point.extend] * bs
            batch.extend_start_loc = torch.arange(0, tokens, point.extend, dtype=torch.int32, device="cuda")
            batch.extend_num_tokens = tokens
        return batch, rows, seq

    def make_q(self, tokens: int, seed: int):
        torch = self.torch
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randn(tokens, self.point.heads * (KV_LORA_RANK + ROPE_DIM), device="cuda",
                           generator=gen, dtype=torch.bfloat16) * 0.5

    def call(self, q, batch):
        if self.point.mode == "decode":
            return self.backend.forward_decode(q, None, None, self.layer, batch, save_kv_cache=False)
        return self.backend.forward_extend(q, None, None, self.layer, batch, save_kv_cache=False)

    def replay_metadata(self, batch) -> None:
        """What SGLang's graph runner does before replay() (as the kit's
        runner_modes/cuda_graph_decode_runner.py _init_cuda_graph_replay_metadata)."""
        view = types.SimpleNamespace(
            batch_size=batch.batch_size, forward_mode=batch.forward_mode, actual_forward_mode=batch.forward_mode,
            input_ids=batch.input_ids, positions=batch.positions, req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens, seq_lens_sum=batch.seq_lens_sum, seq_lens_cpu=batch.seq_lens_cpu,
            encoder_lens=batch.encoder_lens, extend_seq_lens=getattr(batch, "extend_seq_lens", None),
            out_cache_loc=batch.out_cache_loc, kv_loc_plan=batch.kv_loc_plan, kv_loc_cols=batch.kv_loc_cols,
            spec_info=batch.spec_info)
        self.backend.init_forward_metadata_out_graph(view)
        self.backend.init_forward_metadata_in_graph(view)


def reference(sg_backend: Backend, q, rows, seq, point: Point):
    """float32 attention over the rows each request reads, cast from the pool by torch: [tokens, heads*512]."""
    torch = sg_backend.torch
    pool = sg_backend.pool.kv_buffer[0].view(torch.float8_e4m3fn).view(sg_backend.pool_rows, -1)
    scale = sg_backend.layer.scaling
    qv = q.view(-1, point.heads, KV_LORA_RANK + ROPE_DIM).float()
    outs, start, token = [], 0, 0
    for n in seq:
        keys = pool[rows[start:start + n]].to(torch.bfloat16).float()  # [n, 576]
        queries = 1 if point.mode == "decode" else point.extend
        for i in range(queries):
            visible = n if point.mode == "decode" else n - point.extend + i + 1
            scores = qv[token] @ keys[:visible].T * scale  # [heads, visible]
            outs.append(torch.softmax(scores, dim=-1) @ keys[:visible, :KV_LORA_RANK])
            token += 1
        start += n
    return torch.stack(outs).view(token, -1)


PROFILE_CALLS = 5


def profile_kernels(call) -> list[dict]:
    """torch.profiler over PROFILE_CALLS calls: each GPU kernel's calls and time per call (us), the
    longest first (the top 12), and the host time of one call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILE_CALLS):
            call()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(ev, "self_cuda_time_total", 0)
        if dev_us > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"kernel": ev.key[:120], "calls_per_call": ev.count / PROFILE_CALLS,
                         "us_per_call": dev_us / PROFILE_CALLS})
    return sorted(rows, key=lambda r: -r["us_per_call"])[:12]


def measure_point(sg, point: Point, out_dir: Path, log) -> dict:
    import torch
    result = {"point": asdict(point), "name": point.name}
    seed = 1000 + point.heads + point.pool // 1024 + point.bs * 7 + point.ctx
    # eager
    be = Backend(sg, point, graph=False, seed=seed)
    batch, rows, seq = be.make_batch(seed + 1)
    tokens = batch.input_ids.numel()
    q = be.make_q(tokens, seed + 2)
    with torch.no_grad():
        be.backend.init_forward_metadata(batch)
        out = be.call(q, batch)
        torch.cuda.synchronize()
        torch.save(out.cpu(), out_dir / f"{point.name}-eager.pt")
        if point.live_rows <= REFERENCE_MAX_ROWS:
            ref = reference(be, q, rows, seq, point)
            result["eager_vs_reference_max_abs"] = float((out.float() - ref).abs().max())
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        be.call(q, batch)
        torch.cuda.synchronize()
        result["eager_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
        times = []
        for _ in range(EAGER_CALLS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            be.call(q, batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000)
        result["eager_us"] = sorted(times)[len(times) // 2]
        if os.environ.get("STEPWATCH_SGLANG_PROFILE"):  # `run --profile`: where an eager call's GPU time goes
            result["profile_kernels"] = profile_kernels(lambda: be.call(q, batch))
    del be, out
    torch.cuda.empty_cache()
    if point.mode != "decode":
        return result
    # CUDA graph: SGLang's capture sequence, then replays after in-place rewrites
    be = Backend(sg, point, graph=True, seed=seed)
    bs = point.bs
    with torch.no_grad():
        be.backend.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs)
        fill = be.backend.get_cuda_graph_seq_len_fill_value()
        capture_batch, _, _ = be.make_batch(seed + 3, lens=[max(fill, 1)] * bs)
        be.backend.init_forward_metadata_out_graph(capture_batch, in_capture=True)
        be.backend.init_forward_metadata_in_graph(capture_batch)
        static_q = be.make_q(bs, seed + 4)
        for _ in range(2):  # SGLang's runner runs the forward twice before capturing
            be.call(static_q, capture_batch)
        torch.cuda.synchronize()
        allocated0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # (it empties the allocator's cache first: reserved memory says nothing)
            outs = [be.call(static_q, capture_batch) for _ in range(LAYERS_PER_GRAPH)]
        torch.cuda.synchronize()
        # the peak while capturing (the scratch, in the graph's pool) and what the graph keeps (its outputs)
        result["graph_capture_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - allocated0
        result["graph_allocated_bytes"] = torch.cuda.memory_allocated() - allocated0
        checks = []
        for rewrite in range(GRAPH_REWRITES):
            lens = [point.ctx] * bs if rewrite == 0 else [
                max(1, int(point.ctx * f)) for f in torch.rand(bs, generator=torch.Generator().manual_seed(seed + rewrite)).tolist()]
            batch, rows, seq = be.make_batch(seed + 10 + rewrite, lens=lens)
            q_now = be.make_q(bs, seed + 20 + rewrite)
            be.backend.init_forward_metadata(batch)
            eager = be.call(q_now, batch).clone()
            be.replay_metadata(batch)
            static_q.copy_(q_now)
            graph.replay()
            torch.cuda.synchronize()
            same = all(torch.equal(o, eager) for o in outs)
            checks.append({"lens": "full" if rewrite == 0 else "random", "all_layers_equal_eager": same,
                           "max_abs": max(float((o.float() - eager.float()).abs().max()) for o in outs)})
            if rewrite == 0:
                torch.save(outs[-1].cpu(), out_dir / f"{point.name}-graph.pt")
        result["graph_replays"] = checks
        batch, _, _ = be.make_batch(seed + 1)
        be.replay_metadata(batch)
        static_q.copy_(q)  # the eager point's queries and rows: the timed replay reads the same batch
        times = []
        for _ in range(GRAPH_REPLAYS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / LAYERS_PER_GRAPH)
        result["graph_us"] = sorted(times)[len(times) // 2]
    del graph, outs, be
    torch.cuda.empty_cache()
    return result


def main_worker(args) -> int:
    import torch
    tree = Path(os.environ["STEPWATCH_SGLANG_TREE"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sg = import_sglang(tree)
    import flashinfer
    patched = (tree / "sglang" / "srt" / "layers" / "attention" / "mla_kv_cast.py").exists()
    stub = sys.modules.get("sgl_kernel")
    stub_used = bound_stub_names()
    header = {"variant": args.variant, "patched_module_present": patched, "flashinfer": flashinfer.__version__,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "sgl_kernel_names_stubbed": stub_used,
              "sglang_modules_loaded": sum(1 for n in sys.modules if n.startswith("sglang."))}
    lines = [json.dumps({"header": header})]
    print(json.dumps(header), flush=True)
    for point in [Point(**p) for p in json.loads(args.points)]:
        began = time.monotonic()
        try:
            row = measure_point(sg, point, out_dir, print)
        except Exception as exc:  # a failed point is recorded as data, the others still run
            import traceback
            row = {"name": point.name, "point": asdict(point), "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-3000:]}
        row["wall_s"] = round(time.monotonic() - began, 2)
        row["sgl_kernel_stubs_called"] = sorted(set(getattr(stub, "CALLED", [])))
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        lines.append(json.dumps(row))
        (out_dir / "rows.jsonl").write_text("\n".join(lines) + "\n")
    return 0


# --- on the GPU machine: both variants, then the comparison ---------------------------------------

def compare_outputs(work: Path, name: str, kind: str) -> dict | None:
    import torch
    paths = [work / f"out-{v}" / f"{name}-{kind}.pt" for v in VARIANTS]
    if not all(p.exists() for p in paths):
        return None
    a, b = (torch.load(p) for p in paths)
    return {"equal": bool(torch.equal(a, b)), "max_abs": float((a.float() - b.float()).abs().max())}


def summarise(work: Path) -> list[dict]:
    rows = {}
    for variant in VARIANTS:
        path = work / f"out-{variant}" / "rows.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            row = json.loads(line)
            if "header" in row:
                rows.setdefault("_headers", {})[variant] = row["header"]
                continue
            rows.setdefault(row["name"], {})[variant] = row
    table = []
    for name, by_variant in rows.items():
        if name == "_headers":
            continue
        entry = {"name": name, **{v: by_variant.get(v) for v in VARIANTS}}
        entry["eager_outputs"] = compare_outputs(work, name, "eager")
        entry["graph_outputs"] = compare_outputs(work, name, "graph")
        u, p = by_variant.get("unpatched", {}), by_variant.get("patched", {})
        for key in ("eager_us", "graph_us"):
            if u.get(key) and p.get(key):
                entry[f"{key}_speedup"] = round(u[key] / p[key], 2)
        table.append(entry)
    return [{"headers": rows.get("_headers")}] + table


def format_table(summary: list[dict]) -> str:
    lines = ["| point | eager us (unpatched -> patched) | graph us (unpatched -> patched) | outputs equal "
             "(eager, graph) | eager peak extra MiB (u -> p) | graph capture peak MiB (u -> p) | graph keeps MiB (u -> p) | "
             "graph replays = eager (u, p) |",
             "|---|---|---|---|---|---|---|---|"]
    mib = 2 ** 20
    for e in summary[1:]:
        u, p = e.get("unpatched") or {}, e.get("patched") or {}
        if u.get("error") or p.get("error"):
            lines.append(f"| {e['name']} | error: {(u.get('error') or p.get('error'))[:80]} ||||||")
            continue

        def fig(key, scale=1.0, digits=1):
            a, b = u.get(key), p.get(key)
            return "-" if a is None or b is None else f"{a / scale:.{digits}f} -> {b / scale:.{digits}f}"
        eq = [("yes" if o["equal"] else f"no ({o['max_abs']:.2g})") if o else "-"
              for o in (e["eager_outputs"], e["graph_outputs"])]
        replays = [("all" if all(c["all_layers_equal_eager"] for c in r.get("graph_replays", [])) else "NO")
                   if r.get("graph_replays") else "-" for r in (u, p)]
        lines.append(f"| {e['name']} | {fig('eager_us')} | {fig('graph_us')} | {eq[0]}, {eq[1]} | "
                     f"{fig('eager_peak_extra_bytes', mib, 0)} | {fig('graph_capture_peak_extra_bytes', mib, 0)} | "
                     f"{fig('graph_allocated_bytes', mib, 0)} | "
                     f"{replays[0]}, {replays[1]} |")
    return "\n".join(lines)


def main_run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    log_file = open(out / "sglang_mla.log", "a")
    began = time.monotonic()

    def log(message):
        line = f"[{time.monotonic() - began:6.1f}s] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()
    prepare(Path(args.pack), work, log)
    points = json.dumps([asdict(p) for p in list_points(args.quick) if not args.only or any(
        name in p.name for name in args.only.split(","))])
    for variant in VARIANTS:
        target = work / f"out-{variant}"
        shutil.rmtree(target, ignore_errors=True)
        log(f"{variant}: {len(json.loads(points))} points")
        try:
            env = {**variant_env(work, variant), **({"STEPWATCH_SGLANG_PROFILE": "1"} if args.profile else {})}
            proc = subprocess.run([sys.executable, "-m", "kernels.studies.sglang_mla", "worker", "--variant",
                                   variant, "--out", str(target), "--points", points], env=env,
                                  cwd=REPO, capture_output=True, text=True, timeout=args.timeout_s)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:  # the points done so far are in rows.jsonl
            code, stdout, stderr = "timeout", (exc.stdout or b"").decode(errors="replace"), \
                (exc.stderr or b"").decode(errors="replace")
        with open(out / "workers.log", "a") as workers:
            workers.write(f"=== {variant} (exit {code})\n{stdout[-300000:]}\n--- stderr ---\n{stderr[-100000:]}\n")
        log(f"{variant}: exit {code}; last lines: {stdout.strip().splitlines()[-1:]}"
            f" {stderr.strip().splitlines()[-3:] if code else ''}")
    summary = summarise(work)
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    log("\n" + format_table(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.studies.sglang_mla", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: download and lay out what the GPU machine needs")
    p.add_argument("dest", type=Path)
    r = sub.add_parser("run", help="on the GPU machine: both variants and the comparison")
    r.add_argument("--pack", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="/tmp/stepwatch-sglang-mla")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--timeout-s", type=int, default=540)
    r.add_argument("--only", help="the points whose names contain one of these comma-separated parts")
    r.add_argument("--profile", action="store_true", help="also profile each point's eager call (its kernels)")
    w = sub.add_parser("worker", help="one variant's points, in the process whose PYTHONPATH holds its tree")
    w.add_argument("--variant", choices=VARIANTS, required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--points", required=True)
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.dest)
        return 0
    if args.command == "run":
        return main_run(args)
    return main_worker(args)


if __name__ == "__main__":
    sys.exit(main())
