"""The SGLang patch in kernels/patches/ applies to sglang 0.5.23 and carries stepwatch's kernel.

The sources come from the sglang 0.5.23 wheel (it ships its Python files): it is downloaded
once with pip into ~/.cache/stepwatch/ (or $STEPWATCH_CACHE), or taken from
$STEPWATCH_SGLANG_WHEEL, by the session fixture `sglang_wheel` (tests/conftest.py,
tests/sglang_wheel.py). Without a network the download tests skip; any other failure fails.
"""

from __future__ import annotations

import ast
import os
import py_compile
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.sglang_wheel import SGLANG_VERSION

ROOT = Path(__file__).resolve().parents[1]
PATCH = ROOT / "kernels" / "patches" / "sglang-0.5.23-mla-gather-then-cast.patch"
KV_CAST = ROOT / "kernels" / "kv_cast.py"
NEW_MODULE = "python/sglang/srt/layers/attention/mla_kv_cast.py"
FLASHINFER_MLA = "python/sglang/srt/layers/attention/flashinfer_mla_backend.py"
FLASHATTENTION = "python/sglang/srt/layers/attention/flashattention_backend.py"
WHOLE_POOL_CAST = "get_key_buffer(layer.layer_id).to(q.dtype)"
# Definitions of kernels/kv_cast.py that the patch's new module copies verbatim
# (kernels/patches/sync_kernel_copy.py writes them; this test checks them independently).
SHARED_FUNCTIONS = ("_count_sms", "_live_programs", "_piece", "_row_tiles", "_fp8_to_bf16", "_move_rows",
                    "_gather_live_kernel", "_copy_live_kernel", "_index_pages_kernel",
                    "_fits_int32", "_launch_gather_live", "_launch_copy_live", "_launch_index_pages")
SHARED_CONSTANTS = ("LIVE_CONFIG", "PAGE_INDEX_CONFIG")


def _patched_paths(patch_text: str) -> tuple[list[str], list[str]]:
    """(paths the patch modifies, paths it creates), relative to the checkout root."""
    modified, created = [], []
    for old, new in re.findall(r"^--- (\S+)\n\+\+\+ (\S+)$", patch_text, flags=re.M):
        if old == "/dev/null":
            created.append(new.removeprefix("b/"))
        else:
            modified.append(old.removeprefix("a/"))
    return modified, created


@pytest.fixture(scope="module")
def sglang_tree(sglang_wheel: Path, tmp_path_factory) -> Path:
    """sglang's attention sources and every file the patch touches, as python/sglang/... in a git repo."""
    root = tmp_path_factory.mktemp("sglang-src")
    modified, _ = _patched_paths(PATCH.read_text())
    wanted = {p.removeprefix("python/") for p in modified}
    with zipfile.ZipFile(sglang_wheel) as whl:
        names = whl.namelist()
        members = [n for n in names
                   if re.fullmatch(r"sglang/srt/layers/attention/[^/]+\.py", n) or n in wanted]
        missing = wanted - set(names)
        assert not missing, f"the sglang {SGLANG_VERSION} wheel lacks files the patch edits: {missing}"
        for name in members:
            dest = root / "python" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(whl.read(name))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _git_apply(tree: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "apply", "-p1", *extra, str(PATCH)], cwd=tree,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def patched_tree(sglang_tree: Path, tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("sglang-patched")
    shutil.copytree(sglang_tree, tree, dirs_exist_ok=True)
    check = _git_apply(tree, "--check")
    assert check.returncode == 0, f"git apply --check failed:\n{check.stderr}"
    applied = _git_apply(tree)
    assert applied.returncode == 0, f"git apply failed:\n{applied.stderr}"
    return tree


def _function_source(source: str, name: str, cls: str | None = None) -> str:
    """Dedented text of function `name` (decorators included), optionally inside class `cls`."""
    tree = ast.parse(source)
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls] if cls else [tree]
    lines = source.splitlines()
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
    raise LookupError(f"no function {name!r}" + (f" in class {cls!r}" if cls else ""))


def _new_file_from_patch(patch_text: str, path: str) -> str:
    """The content of a file the patch creates, rebuilt from its '+' lines."""
    match = re.search(rf"^diff --git a/{re.escape(path)} b/{re.escape(path)}\n(.*?)(?=^diff --git |\Z)",
                      patch_text, flags=re.M | re.S)
    assert match, f"the patch does not create {path}"
    body = match.group(1)
    assert "new file mode" in body.split("@@", 1)[0], f"{path} is not a new file in the patch"
    hunks = body.split("\n@@", 1)[1].split("\n", 1)[1]
    return "".join(line[1:] + "\n" for line in hunks.splitlines() if line.startswith("+"))


def test_patch_header_states_what_was_and_was_not_verified():
    text = PATCH.read_text()
    header = text.split("diff --git ", 1)[0]
    assert "What was verified" in header and "What was NOT verified" in header
    assert "end-to-end" in header and "BENCHMARKS.md" in header
    modified, created = _patched_paths(text)
    assert set(modified) == {FLASHINFER_MLA, FLASHATTENTION}
    assert created == [NEW_MODULE]


def test_patch_applies_cleanly_and_compiles(patched_tree: Path):
    modified, created = _patched_paths(PATCH.read_text())
    for rel in modified + created:
        path = patched_tree / rel
        assert path.is_file(), rel
        py_compile.compile(str(path), cfile=str(path) + "c", doraise=True)
    assert (patched_tree / NEW_MODULE).read_text() == _new_file_from_patch(PATCH.read_text(), NEW_MODULE)


def test_patch_removes_whole_pool_cast_from_mla_decode(sglang_tree: Path, patched_tree: Path):
    cases = [(FLASHINFER_MLA, "FlashInferMLAAttnBackend", "forward_decode", "mla_kv_live_rows.gather_cast("),
             (FLASHINFER_MLA, "FlashInferMLAAttnBackend", "forward_extend",
              "mla_kv_live_rows_prefill.gather_cast("),
             (FLASHATTENTION, "FlashAttentionBackend", "forward_decode", "self.mla_kv_pages.gather_cast("),
             (FLASHATTENTION, "FlashAttentionBackend", "forward_extend", "self.mla_kv_pages.gather_cast(")]
    for rel, cls, fn, helper in cases:
        before = _function_source((sglang_tree / rel).read_text(), fn, cls)
        after = _function_source((patched_tree / rel).read_text(), fn, cls)
        flat_before = re.sub(r"\s+", "", before)
        assert re.sub(r"\s+", "", WHOLE_POOL_CAST) in flat_before, f"{rel} {fn}: nothing to patch?"
        assert re.sub(r"\s+", "", WHOLE_POOL_CAST) not in re.sub(r"\s+", "", after), f"{rel} {fn}"
        assert helper in after, f"{rel} {fn} does not call {helper}"
        # The fallback for pools that are not FP8 stays.
        assert ".to(q.dtype)" in after
    # FA3: one page plan per backend, told the layer and the forward it serves
    after = (patched_tree / FLASHATTENTION).read_text()
    assert "self.mla_kv_pages = MLAKVPagePlan()" in _function_source(after, "__init__", "FlashAttentionBackend")
    for fn in ("forward_decode", "forward_extend"):
        call = re.sub(r"\s+", "", _function_source(after, fn, "FlashAttentionBackend"))
        assert "self.page_size,layer.layer_id,forward_batch,)" in call, fn


def test_patch_saves_row_ids_after_every_flashinfer_plan(sglang_tree: Path, patched_tree: Path):
    """forget() before planning and save() after it, in both indices updaters: a wrapper's row ids
    are never used from an earlier plan or from a plan that skipped the save."""
    after = (patched_tree / FLASHINFER_MLA).read_text()
    for cls, attr in (("FlashInferMLAIndicesUpdaterDecode", "mla_kv_live_rows"),
                      ("FlashInferMLAIndicesUpdaterPrefill", "mla_kv_live_rows_prefill")):
        body = _function_source(after, "call_begin_forward", cls)
        assert f"self.attn_backend.{attr}" in body, cls
        forget, plan, save = body.index("live_rows.forget()"), body.rindex(".plan("), body.rindex("live_rows.save(")
        assert forget < plan < save, cls
    init = _function_source(after, "__init__", "FlashInferMLAAttnBackend")
    assert "MLAKVLiveRows(self.token_to_kv_pool)" in init


def test_patch_kernel_is_kv_cast_verbatim():
    """The patch's new module copies kernels/kv_cast.py's live-row kernels and launchers."""
    ours = KV_CAST.read_text()
    absent = [f for f in SHARED_FUNCTIONS if not re.search(rf"^\s*def {f}\(", ours, flags=re.M)]
    assert not absent, f"kernels/kv_cast.py lacks {absent}, which the patch copies"
    module = _new_file_from_patch(PATCH.read_text(), NEW_MODULE)
    assert "----- begin: verbatim from stepwatch kernels/kv_cast.py -----" in module
    sync = "run kernels/patches/sync_kernel_copy.py to copy kv_cast.py's version into the patch"
    for name in SHARED_FUNCTIONS:
        assert _function_source(module, name) == _function_source(ours, name), (
            f"{name} in {NEW_MODULE} (inside the patch) differs from kernels/kv_cast.py: {sync}")
    for name in SHARED_CONSTANTS:
        line = re.compile(rf"^{name} = .*$", re.M)
        assert line.search(module).group(0) == line.search(ours).group(0), f"{name}: {sync}"
    # The entry points launch the shared kernels.
    pages = _function_source(module, "gather_cast", "MLAKVPagePlan")
    assert "_launch_index_pages(" in pages and "_launch_gather_live(" in pages
    assert "_launch_copy_live(" in _function_source(module, "save", "MLAKVLiveRows")
    assert "_launch_gather_live(" in _function_source(module, "gather_cast", "MLAKVLiveRows")


_KERNEL_CHECK = r'''
import importlib.util, sys, types, torch
spec = importlib.util.spec_from_file_location("mla_kv_cast", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
dev = sys.argv[2]
if dev == "cpu":  # the module only runs on CUDA in SGLang; here Triton's interpreter runs it
    m._DEVICE_TYPES = ("cuda", "cpu")
torch.manual_seed(0)
FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16

def same(a, b):  # bit-exact, NaN where NaN
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])

N, D = 1024, 576
pool = torch.randint(0, 256, (N, 1, D), dtype=torch.uint8, device=dev).view(FP8)
ref = pool.to(BF16)

# FA3 path: MLAKVPagePlan, one plan per forward shared by its layers (each layer its own pool);
# compacted pages and table, then the overflow (more live pages than the pool has: whole pool cast)
class Batch:  # stands for SGLang's ForwardBatch: the plan only compares its identity
    pass

pools = [pool] + [torch.randint(0, 256, (N, 1, D), dtype=torch.uint8, device=dev).view(FP8) for _ in range(2)]
refs = [p.to(BF16) for p in pools]
for ps, seq in ((1, [7, 0, 101]), (4, [7, 0, 101]), (4, [160] * 8)):
    bs = len(seq)
    table = torch.randint(0, N // ps, (bs, 40), dtype=torch.int32, device=dev)
    lens = torch.tensor(seq, dtype=torch.int32, device=dev)
    plan, batch, tables = m.MLAKVPagePlan(), Batch(), []
    pages = [min((s + ps - 1) // ps, 40) for s in seq]
    junk = torch.full((bs, 40), -7, dtype=torch.int32, device=dev)  # freed memory the plan's torch.empty may reuse
    del junk
    for layer, (layer_pool, layer_ref) in enumerate(zip(pools, refs)):
        out, table_out = plan.gather_cast(layer_pool, table, lens, ps, 10 + layer, batch)
        tables.append(table_out)
        compact = sum(pages) <= out.shape[0] // ps
        o, r = out.view(-1, ps, D), layer_ref.view(-1, ps, D)
        start = 0
        for b, n in enumerate(pages):
            t = table_out[b, :n].long()
            want_t = torch.arange(start, start + n, device=dev) if compact else table[b, :n].long()
            assert torch.equal(t, want_t), ("table", ps, seq, layer, b)
            assert same(o[t], r[table[b, :n].long()]), ("pages", ps, seq, layer, b)
            start += n
        assert compact == (sum(pages) <= 40 * bs and sum(pages) <= N // ps), (ps, seq)
        for b, n in enumerate(pages):  # a fresh table's tail is SGLang's padding page (kv_read_table.py)
            assert torch.all(table_out[b, n:] == 0), ("table tail not zeroed", ps, seq, layer, b)
        if not compact:
            assert same(out, layer_ref), ("overflow: the whole pool, cast in place", ps, seq, layer)
    assert tables[1] is tables[0] and tables[2] is tables[0], ("later layers made a plan again", ps, seq)
    # a new pass over the layers with the same batch (CUDA-graph warm-up, then capture): a new plan
    _, again = plan.gather_cast(pools[0], table, lens, ps, 10, batch)
    assert again is not tables[0], "a second pass over the layers reused the first pass's plan"
    other = Batch()  # another forward: a new plan, even at a later layer id
    _, t_other = plan.gather_cast(pools[1], table, lens, ps, 11, other)
    assert t_other is not again, "another forward_batch reused a plan"
    new_table = table.clone()  # another table object in the same forward: a new plan
    _, t_new = plan.gather_cast(pools[2], new_table, lens, ps, 12, other)
    assert t_new is not t_other, "another page table reused a plan"

if dev == "cuda":
    # SGLang's CUDA-graph capture (decode_cuda_graph_runner.capture_one_batch_size): one forward_batch,
    # run twice to warm up, then once under capture; each replay follows an in-place rewrite of the
    # table and lengths. The captured first layer must hold the plan, so every replay reads its pages.
    for ps in (1, 64):
        bs, width = 8, 4096 // ps // 2
        graph_pools = [torch.randint(0, 256, (4096, 1, D), dtype=torch.uint8, device=dev).view(FP8)
                       for _ in range(3)]
        table = torch.zeros(bs, width, dtype=torch.int32, device=dev)
        lens = torch.zeros(bs, dtype=torch.int32, device=dev)
        plan, batch = m.MLAKVPagePlan(), Batch()

        def run_once():
            return [plan.gather_cast(p, table, lens, ps, 10 + layer, batch) for layer, p in enumerate(graph_pools)]

        def refill(scale):
            table.copy_(torch.randint(0, 4096 // ps, (bs, width), dtype=torch.int32, device=dev))
            lens.copy_((torch.rand(bs, device=dev) * scale * width * ps).to(torch.int32))

        refill(0.5)
        run_once()
        run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run_once()
        for scale in (0.3, 0.0, 1.0, 0.6):  # 1.0: more pages than the pool has, the whole-pool cast
            refill(scale)
            graph.replay()
            torch.cuda.synchronize()
            pages = [min(-(-int(n) // ps), width) for n in lens.tolist()]
            for layer, ((out, table_out), p) in enumerate(zip(captured, graph_pools)):
                o, r = out.view(-1, ps, D), p.to(BF16).view(-1, ps, D)
                for b, n in enumerate(pages):
                    assert same(o[table_out[b, :n].long()], r[table[b, :n].long()]), ("graph", ps, scale, layer, b)
        del graph

# flashinfer path: save() after a plan, gather_cast() in the forward
fake_pool = types.SimpleNamespace(dtype=FP8, size=N - 1, page_size=1)
live = m.MLAKVLiveRows(fake_pool)
def wrapper(index, backend="fa3", graph=True):  # stand-in for flashinfer's planned wrapper
    return types.SimpleNamespace(_kv_indices_buf=index, _planned_backend_name=backend, _use_cuda_graph=graph)
index = torch.randint(0, N, (700,), dtype=torch.int32, device=dev)
rows = index.clone()
w = wrapper(index)
live.save(w, torch.tensor([300], dtype=torch.int32, device=dev))
assert live.gather_cast(wrapper(index), pool, BF16) is None, "another wrapper's plan was used"
out = live.gather_cast(w, pool, BF16)
assert out.shape == (700, 1, D) and same(out[:300], ref[rows[:300].long()]), "rows: wrong values"
assert torch.equal(index[:300], torch.arange(300, dtype=torch.int32, device=dev)), "rows: index not rewritten"
assert torch.equal(index[300:], rows[300:]), "rows: index past the live count touched"
live.forget()
assert live.gather_cast(w, pool, BF16) is None, "forget() kept the plan"
big = torch.randint(0, N, (3000,), dtype=torch.int32, device=dev)  # shared prefixes: more rows than the pool
before = big.clone()
w = wrapper(big)
live.save(w, torch.tensor([2500], dtype=torch.int32, device=dev))
out = live.gather_cast(w, pool, BF16)
used = before[:2500].long()
assert out.shape[0] == N and same(out[used], ref[used]) and torch.equal(big, before), "overflow"
assert live.gather_cast(w, pool, torch.float16) is None, "a float16 query was given BF16 rows"
for bad in (wrapper(index, backend="trtllm-gen"), wrapper(index, backend=None)):
    live.save(bad, torch.tensor([10], dtype=torch.int32, device=dev))
    assert live.gather_cast(bad, pool, BF16) is None, "a non-FA plan was used"
# a later layer of the same forward that falls back to .to() (here: a float16 query) must find the
# wrapper's planned row ids, not the 0..n-1 an earlier layer's gather wrote (flashinfer would read pool rows
# 0..n-1 of the whole-pool cast: wrong attention, silently)
index = torch.randint(0, N, (700,), dtype=torch.int32, device=dev)
rows = index.clone()
w = wrapper(index)
live.save(w, torch.tensor([300], dtype=torch.int32, device=dev))
assert live.gather_cast(w, pool, BF16) is not None  # layer 0 gathers and rewrites the indices
assert live.gather_cast(w, pool, torch.float16) is None  # layer 1 falls back
assert torch.equal(index, rows), "a layer that fell back to .to() reads rewritten indices"
out = live.gather_cast(w, pool, BF16)  # layer 2 gathers again from the saved ids
assert same(out[:300], ref[rows[:300].long()]) and torch.equal(index[:300], torch.arange(300, device=dev, dtype=torch.int32))
# a saved-row buffer smaller than the rows a call can read: the whole-pool cast, the planned ids in place
small = m.MLAKVLiveRows(types.SimpleNamespace(dtype=FP8, size=99, page_size=1))
index = torch.randint(0, N, (700,), dtype=torch.int32, device=dev)
rows = index.clone()
w = wrapper(index)
small.save(w, torch.tensor([50], dtype=torch.int32, device=dev))
assert small.gather_cast(w, pool, BF16) is None and torch.equal(index, rows), "undersized buffer"
eager = wrapper(index.clone(), graph=True)
live.save(eager, torch.tensor([10], dtype=torch.int32, device=dev), cuda_graph_ok=False)
assert live.gather_cast(eager, pool, BF16) is None, "a graph wrapper passed cuda_graph_ok=False"
print("ok")
'''


@pytest.mark.slow
def test_patch_kernels_against_torch(tmp_path: Path):
    """The new module's kernels, run as Triton (on CUDA if present, else Triton's CPU interpreter)."""
    import torch
    import triton  # noqa: F401  (requirements.txt installs it: its interpreter runs the kernels here)

    module = tmp_path / "mla_kv_cast.py"
    module.write_text(_new_file_from_patch(PATCH.read_text(), NEW_MODULE))
    script = tmp_path / "check.py"
    script.write_text(_KERNEL_CHECK)
    env = dict(os.environ)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(script), str(module), device], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
