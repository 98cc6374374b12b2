"""The sglang engine: SGLang's decode performance at one commit of the user's checkout, with or
without a patch set, profiled, and turned into a result bundle.

On the host: a detached git worktree of the configured repository at the resolved sha; the
variant's patches applied with `git apply` (a patch that does not apply raises PatchFailed with
git's message); then, with the worktree's `python/` first on PYTHONPATH and a fresh
SGLANG_TORCH_PROFILER_DIR as the working directory (older releases write the trace there):

- TP 1: `python -m sglang.benchmark.one_batch` (or `sglang.bench_one_batch` in older checkouts)
  with the profiling flags the checkout's benchmark declares; the median decode latency and
  throughput come from its JSONL (its printed lines as a fallback), the trace from its file name;
- TP > 1 (or run_sglang_server): `python -m sglang.launch_server`, driven by a small standard-
  library script on the host (SERVER_DRIVER_SCRIPT): POST /start_profile by stage for
  profile_steps decode steps, batch_size streaming requests, every rank's DECODE trace.

Back here: versions, the model's layer count, and a bundle (kernels/bundle.py) written locally, so
the host needs nothing of stepwatch installed. Everything that reads SGLang's formats or builds
its command lines is a small pure function, tested on SGLang's real formats
(tests/test_engine_sglang.py) and against a real release's sources (tests/test_sglang_flags.py).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Callable

from kernels.bundle import Manifest, Timing, write_bundle

from ..errors import CommandCancelled, CommandFailed, CommandTimeout, RunError, SpecError
from ..git import add_worktree, remove_worktree
from ..hosts import Host
from ..spec import Config, RunSpec, SweepSpec, Workload
from .base import Checkout, Engine, EngineIO
from .sglang_server import (ENVIRON_FILE, LAUNCH_SERVER_FILE, RUN_NAME, SERVER_DRIVER_SCRIPT,  # noqa: F401
                            SERVER_TIMING_METHOD, build_driver_config, build_engine_flags,
                            build_profile_request, build_server_argv, build_server_env, check_server_workload,
                            explain_missing_decode, plan_dp_ranks, read_extra_arg, read_no_decode_report,
                            reads_decode_min_bs)

CURRENT_MODULE = "sglang.benchmark.one_batch"
OLD_MODULE = "sglang.bench_one_batch"
_MODULE_FILES = ((CURRENT_MODULE, "python/sglang/benchmark/one_batch.py"),
                 (OLD_MODULE, "python/sglang/bench_one_batch.py"))
PROFILE_PREFIX = "stepwatch"
TIMING_METHOD = "sglang-one-batch"
STAGES = ("worktree", "patches", "benchmark", "trace", "versions", "bundle")
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# Workload fields that only the reference engine reads; left out of an sglang run's manifest.
_REFERENCE_ONLY = ("preset", "kv", "cuda_graph", "graph_mapping", "context")
_SHORT_S = 300.0  # git, listing and version probes


class PatchFailed(RunError):
    """A patch of the variant that does not apply at the commit; `output` is git's message."""

    def __init__(self, message: str, patch: str, output: str):
        super().__init__(message)
        self.patch = patch
        self.output = output


# ---------------------------------------------------------------------------------------------
# Pure functions over SGLang's formats
# ---------------------------------------------------------------------------------------------

def find_bench_module(has_file: Callable[[str], bool]) -> str:
    """The one-batch benchmark module a checkout has: `has_file` answers for a path relative to
    the checkout's root. sglang >= 0.5.23 has only the new name, older checkouts only the old."""
    for module, path in _MODULE_FILES:
        if has_file(path):
            return module
    raise RunError("the checkout has no one-batch benchmark: neither "
                   + " nor ".join(path for _, path in _MODULE_FILES) + " exists")


def module_path(module: str) -> str:
    """The checkout-relative source file of a benchmark module name."""
    return dict(_MODULE_FILES)[module]


@dataclass(frozen=True)
class BenchFlags:
    """The optional profiling flags a checkout's one-batch benchmark accepts, read from its
    source: the oldest releases profile the whole run into `--profile-filename-prefix`, later
    ones add `--profile-stage` and `--profile-record-shapes`, then `--profile-steps` and
    `--profile-start-step`, and rename the prefix flag to `--profile-prefix`."""

    prefix: str | None = "--profile-prefix"
    stage: bool = True
    steps: bool = True
    start_step: bool = True
    record_shapes: bool = True


def _declares(source: str, flag: str) -> bool:
    return re.search(r"""["']""" + re.escape(flag) + r"""["']""", source) is not None


def detect_bench_flags(source: str) -> BenchFlags:
    """Which optional flags the benchmark module's source text declares."""
    prefix = next((f for f in ("--profile-prefix", "--profile-filename-prefix") if _declares(source, f)), None)
    return BenchFlags(prefix=prefix, stage=_declares(source, "--profile-stage"),
                      steps=_declares(source, "--profile-steps"),
                      start_step=_declares(source, "--profile-start-step"),
                      record_shapes=_declares(source, "--profile-record-shapes"))


def plan_profile_start_step(output_len: int, profile_steps: int) -> int:
    """The decode step to start profiling at: SGLang's default (output_len // 2) when the
    profiled steps fit before the last of the output_len - 1 decode steps, else as late as fits.
    SGLang itself never stops (so never writes the trace) when they do not fit."""
    decode_steps = output_len - 1
    if profile_steps > decode_steps:
        raise SpecError(f"workload.profile_steps {profile_steps}: more than the {decode_steps} decode steps "
                       f"of output_len {output_len}; raise output_len to at least {profile_steps + 1}")
    return min(output_len // 2, decode_steps - profile_steps)


def count_profiled_steps(workload: Workload, flags: BenchFlags) -> int:
    """Decode steps in the trace: the requested ones, one (releases without --profile-steps), or
    the whole run of the oldest releases (the prefill and every decode step: output_len)."""
    if not flags.stage:
        return workload.output_len
    return workload.profile_steps if flags.steps else 1


def build_one_batch_argv(python: str, module: str, workload: Workload, *, result_file: str, run_name: str,
                         profile_prefix: str, flags: BenchFlags,
                         axes: dict[str, tuple[int, ...]] | None = None) -> list[str]:
    """The benchmark's command line, one value per argv element; optional profiling flags only
    where `flags` says the checkout accepts them. `axes` (a sweep): the lists of batch sizes,
    input and output lengths the benchmark runs in one process (its `nargs="+"` arguments,
    one_batch.py BenchArgs.add_cli_args); the profiled decode steps start where they fit the
    shortest output length (the start step is one for all combinations)."""
    if workload.model_path is None:
        raise RunError("workload.model_path: the sglang engine needs a model path")
    axes = axes or {}
    lists = {key: [str(v) for v in axes.get(key, (getattr(workload, key),))]
             for key in ("batch_size", "input_len", "output_len")}
    argv = [python, "-m", module, "--model-path", workload.model_path,
            "--batch-size", *lists["batch_size"], "--input-len", *lists["input_len"],
            "--output-len", *lists["output_len"], "--run-name", run_name,
            "--result-filename", result_file, "--profile"]
    if flags.record_shapes:
        argv.append("--profile-record-shapes")
    if flags.stage:
        argv += ["--profile-stage", "decode"]
    if flags.steps:
        argv += ["--profile-steps", str(workload.profile_steps)]
        if flags.start_step:
            argv += ["--profile-start-step",
                     str(min(plan_profile_start_step(int(ol), workload.profile_steps) for ol in lists["output_len"]))]
    if flags.prefix:
        argv += [flags.prefix, profile_prefix]
    argv += build_engine_flags(workload)
    if workload.tp != 1:
        argv += ["--tp-size", str(workload.tp)]
    return argv + list(workload.extra_args)


def parse_result_records(text: str, where: str = "result JSONL") -> list[dict]:
    """Every record of the benchmark's --result-filename, in order (a sweep appends one a combination
    that ran, in its loop order: one_batch.py latency_test writes result_list at the end)."""
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise RunError(f"{where}: line {n} is not JSON ({e})") from None
        if not isinstance(record, dict):
            raise RunError(f"{where}: line {n} is not a JSON object")
        records.append(record)
    return records


def match_sweep_records(records: list[dict], points: list[tuple[int, int, int]]) -> dict[int, dict]:
    """{point index: its record} for the (batch size, input len, output len) of each point: a
    record is matched by its own batch_size, input_len and output_len fields, never by position
    (a combination over the model's max batch size is skipped and writes none: one_batch.py
    latency_test_run_once returns None after `skipping (bs, il, ol) due to max batch size limit`)."""
    by_shape = {}
    for record in records:
        try:
            shape = (int(record["batch_size"]), int(record["input_len"]), int(record["output_len"]))
        except (KeyError, TypeError, ValueError):
            continue
        by_shape[shape] = record  # a later record of the same shape wins, as parse_result_jsonl's last line
    return {i: by_shape[shape] for i, shape in enumerate(points) if shape in by_shape}


def parse_result_jsonl(text: str, where: str = "result JSONL") -> dict:
    """The last record of the benchmark's --result-filename (it appends one per run)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise RunError(f"{where}: empty, the benchmark wrote no result")
    try:
        record = json.loads(lines[-1])
    except ValueError as e:
        raise RunError(f"{where}: line {len(lines)} is not JSON ({e})") from None
    if not isinstance(record, dict):
        raise RunError(f"{where}: line {len(lines)} is not a JSON object")
    return record


def read_decode_figures(record: dict, where: str = "result JSONL") -> tuple[float, float]:
    """(median decode latency in s, median decode throughput in tok/s) of a JSONL record."""
    try:
        latency_s = float(record["median_decode_latency"])
        tok_per_s = float(record["median_decode_throughput"])
    except KeyError as e:
        raise RunError(f"{where}: the record has no {e.args[0]!r} (output_len 1 has no decode step)") from None
    except (TypeError, ValueError):
        raise RunError(f"{where}: median_decode_latency/throughput are not numbers") from None
    if not (latency_s > 0 and tok_per_s > 0):
        raise RunError(f"{where}: median decode latency {latency_s} s / throughput {tok_per_s} tok/s")
    return latency_s, tok_per_s


_NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf)"
_MEDIAN_LINE = re.compile(rf"Decode\.\s+median latency:\s*{_NUMBER} s, median throughput:\s*{_NUMBER} token/s")
# Older releases: `Decode.  latency: ...`; later ones `Decode 3. Batch size: 1, latency: ...`.
_STEP_LINE = re.compile(rf"Decode(?:\.| \d+\. Batch size: \d+,)\s+latency:\s*{_NUMBER} s, "
                        rf"throughput:\s*{_NUMBER} token/s")


def parse_printed_decode(text: str) -> tuple[float, float]:
    """(median decode latency in s, median throughput in tok/s) from the benchmark's printed
    output, after its last `Benchmark ...` line (before it is the warm-up): its median line, else
    the median of the per-step lines (releases that print no median line; they print the first
    five steps only)."""
    at = text.rfind("Benchmark ...")
    text = text[at:] if at >= 0 else text
    medians = _MEDIAN_LINE.findall(text)
    if medians:
        latency_s, tok_per_s = (float(v) for v in medians[-1])
    else:
        steps = _STEP_LINE.findall(text)
        if not steps:
            raise RunError("the benchmark printed no `Decode.  median latency` line and no per-step "
                           "`Decode ... latency` lines")
        latency_s = statistics.median(float(s) for s, _ in steps)
        tok_per_s = statistics.median(float(t) for _, t in steps)
    if not (latency_s > 0 and tok_per_s > 0):
        raise RunError(f"the benchmark printed a median decode latency of {latency_s} s, {tok_per_s} tok/s")
    return latency_s, tok_per_s


def list_decode_trace_names(prefix: str, bs: int, il: int, ol: int) -> list[str]:
    """The names the one-batch benchmark gives its decode trace, newest layout first."""
    stem = f"{prefix}_batch{bs}_input{il}_output{ol}"
    return [f"{stem}_decode.trace.json.gz", f"{stem}.trace.json.gz",
            f"{stem}_decode.trace.json", f"{stem}.trace.json"]


def find_decode_trace(names: list[str], prefix: str, bs: int, il: int, ol: int) -> str:
    """The decode trace among `names` (a directory listing)."""
    present = set(names)
    for name in list_decode_trace_names(prefix, bs, il, ol):
        if name in present:
            return name
    expected = list_decode_trace_names(prefix, bs, il, ol)[:2]
    found = ", ".join(sorted(n for n in names if ".json" in n)) or "no trace files"
    raise RunError(f"no decode trace: expected {expected[0]} (or {expected[1]}), found {found}")


_SERVER_TRACE = re.compile(
    r"^(?:(?P<prefix>.+)-)?(?P<id>[^-/]+)-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?"
    r"(?:-EP-(?P<ep>\d+))?(?:-(?P<stage>EXTEND|DECODE))?\.trace\.json(?:\.gz)?$")


def find_server_traces(names: list[str], profile_id: str, prefix: str | None = None) -> list[str]:
    """Every rank's decode trace of one server profile (`POST /start_profile`), ordered by TP,
    DP, PP and EP rank: `[prefix-]{profile_id}-TP-{rank}[-DP-..][-PP-..][-EP-..][-EXTEND|-DECODE]`.
    The DECODE ones of a by-stage profile, else the ones without a stage (/stop_profile's)."""
    hits = []
    for name in names:
        m = _SERVER_TRACE.match(name)
        if not m or m["id"] != profile_id or (m["prefix"] or None) != (prefix or None):
            continue
        ranks = tuple(int(m[k] or 0) for k in ("tp", "dp", "pp", "ep"))
        hits.append((m["stage"], ranks, name))
    chosen = [h for h in hits if h[0] == "DECODE"] or [h for h in hits if h[0] is None]
    if not chosen:
        stages = sorted({h[0] for h in hits})
        raise RunError(f"no decode traces of server profile {profile_id!r}"
                       + (f" with prefix {prefix!r}" if prefix else "")
                       + (f": only {', '.join(stages)} ones" if stages else f" among {len(names)} files"))
    return [name for _, _, name in sorted(chosen, key=lambda h: h[1])]


# The versions probe runs on the host with the checkout's root as argv[1]. The sglang version is
# the CHECKOUT's, never the installed package's: it never imports sglang, because 0.5.x's
# python/sglang/version.py (setuptools-scm layout) falls back to importlib.metadata.version("sglang")
# (the installed one) when the tree has no generated _version.py, and a fresh worktree has none.
# In order: a literal __version__ in python/sglang/version.py or __init__.py (older layouts), the
# static [project] version of python/pyproject.toml, else the tag the commit descends from
# (`git describe --tags --long --match v[0-9]*`: "0.5.23" on the tag, "0.5.23-12-gabc1234" twelve
# commits after it). "sglang_source" says which; "sglang_installed" is the installed package's.
VERSIONS_SCRIPT = r'''
import json, os, platform, re, subprocess, sys
from importlib import metadata
found = {"python": platform.python_version(), "sglang": None, "sglang_source": None, "sglang_installed": None,
         "sglang_kernel": None, "sglang_kernel_package": None, "sglang_kernel_pinned": None, "torch": None,
         "cuda": None, "driver": None, "gpu": None, "gpu_count": None,
         "cpu": platform.processor() or platform.machine()}
checkout = sys.argv[1] if len(sys.argv) > 1 else "."


def read(rel):
    try:
        with open(os.path.join(checkout, rel)) as f:
            return f.read()
    except OSError:
        return None


def checkout_version():
    for rel in ("python/sglang/version.py", "python/sglang/__init__.py"):
        m = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", read(rel) or "", re.M)
        if m:
            return m.group(1), rel
    project = re.split(r"^\[project\]\s*$", read("python/pyproject.toml") or "", maxsplit=1, flags=re.M)
    if len(project) == 2:
        m = re.search(r"^version\s*=\s*[\"']([^\"']+)[\"']", re.split(r"^\[", project[1], maxsplit=1, flags=re.M)[0],
                      re.M)
        if m:
            return m.group(1), "python/pyproject.toml"
    try:
        out = subprocess.run(["git", "-C", checkout, "describe", "--tags", "--long", "--match", "v[0-9]*"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None, None
    m = re.fullmatch(r"v(.+)-(\d+)-(g[0-9a-f]+)", out.stdout.strip()) if out.returncode == 0 else None
    if not m:
        return None, None
    return (m.group(1) if m.group(2) == "0" else f"{m.group(1)}-{m.group(2)}-{m.group(3)}"), "git describe"


found["sglang"], found["sglang_source"] = checkout_version()
try:
    found["sglang_installed"] = metadata.version("sglang")
except Exception:
    pass
for package in ("sglang-kernel", "sgl-kernel"):
    try:
        found["sglang_kernel"] = metadata.version(package)
        found["sglang_kernel_package"] = package
        break
    except Exception:
        pass
try:
    pin = re.search(r"\b(sglang-kernel|sgl-kernel)\s*==\s*([0-9][^\"',\s]*)",
                    open(checkout + "/python/pyproject.toml").read())
    found["sglang_kernel_pinned"] = pin.group(2) if pin else None
except OSError:
    pass
try:
    import torch
    found["torch"] = torch.__version__
    found["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_count"] = torch.cuda.device_count()
except Exception:
    pass
try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    if out:
        driver, _, name = out[0].partition(",")
        found["driver"] = driver.strip() or None
        found["gpu"] = found["gpu"] or name.strip() or None
        found["gpu_count"] = found["gpu_count"] or len(out)
except Exception:
    pass
print(json.dumps(found))
'''

LAYERS_SCRIPT = r'''
import json, os, sys
layers = None
try:
    with open(os.path.join(sys.argv[1], "config.json")) as f:
        config = json.load(f)
    for scope in (config, config.get("text_config") or {}, config.get("language_config") or {}):
        if isinstance(scope.get("num_hidden_layers"), int):
            layers = scope["num_hidden_layers"]
            break
except Exception:
    pass
print(json.dumps({"layers": layers}))
'''

# Runs on the host with the model directory, the tokenizer's directory and "1" when the tokenizer is
# loaded: the first problem sglang 0.5.23 would stop on even with --load-format dummy, or null.
# ModelConfig.from_server_args (benchmark/one_batch.py:332; transformers' AutoConfig) needs
# config.json with a model_type; get_tokenizer (one_batch.py:374-378, the server's tokenizer
# manager unless --skip-tokenizer-init) needs the tokenizer's files. A model name that is no
# directory here (`org/name`) is a Hugging Face hub id SGLang downloads: nothing to check.
MODEL_DIR_SCRIPT = r'''
import json, os, sys
model, tokenizer, needs_tokenizer = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "tiktoken.model")


def problem():
    if not os.path.isdir(model):
        return f"{model} is not a directory" if os.path.isabs(model) or model.startswith(".") else None
    config = os.path.join(model, "config.json")
    if not os.path.isfile(config):
        return f"{model} has no config.json"
    try:
        with open(config) as f:
            body = json.load(f)
    except (OSError, ValueError) as e:
        return f"{config} is not JSON ({str(e)[:80]})"
    if not isinstance(body, dict) or "model_type" not in body:
        return f"{config} has no model_type (a Hugging Face config names its model type)"
    if needs_tokenizer and os.path.isdir(tokenizer):
        names = os.listdir(tokenizer)
        if not any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names):
            return f"{tokenizer} has no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json, ...)"
    return None


print(json.dumps({"problem": problem()}))
'''

LIST_SCRIPT = r'''
import json, os, sys
print(json.dumps(sorted(os.listdir(sys.argv[1]))))
'''

PYTHONPATH_SCRIPT = r'''
import json, os
print(json.dumps(os.environ.get("PYTHONPATH", "")))
'''


def parse_json_line(output: str, what: str):
    """The last line of a probe's output that is JSON (importing packages may print first)."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line[:1] in "{[\"":
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise RunError(f"{what}: printed no JSON (output ends: {output.strip()[-200:]!r})")


def plan_model_dir_check(workload: Workload, server: bool) -> list[str]:
    """MODEL_DIR_SCRIPT's arguments: the model directory, the tokenizer's (--tokenizer-path, else
    the model's) and whether the run loads a tokenizer (the one-batch benchmark always does,
    one_batch.py:374; the server unless --skip-tokenizer-init)."""
    tokenizer = read_extra_arg(workload.extra_args, "--tokenizer-path") or workload.model_path
    skips = server and "--skip-tokenizer-init" in workload.extra_args
    return [str(workload.model_path), str(tokenizer), "0" if skips else "1"]


def explain_model_dir_problem(problem: str) -> str:
    """One line for a model directory SGLang would refuse."""
    return (f"workload.model_path: {problem}; sglang 0.5.23 reads the model's Hugging Face config.json and its "
            "tokenizer even with --load-format dummy (only the weights are skipped)")


def describe_device(versions: dict, device_type: str) -> dict:
    """The manifest's device: the GPU the versions probe saw, or the CPU."""
    if versions.get("gpu"):
        return {"type": "cuda", "name": versions["gpu"], "count": versions.get("gpu_count"),
                "driver": versions.get("driver")}
    return {"type": device_type, "name": versions.get("cpu")}


def build_manifest(spec: RunSpec, *, sha: str, measured: Measured, versions: dict, layers: int | None,
                   patches: list[str]) -> Manifest:
    """An sglang run's manifest. SGLang reports only a median decode step, so p10 and p90
    equal the median and step_ms holds that one figure."""
    median_ms = measured.latency_s * 1000.0
    workload = {k: v for k, v in asdict(spec.workload).items() if k not in _REFERENCE_ONLY}
    workload["extra_args"] = list(spec.workload.extra_args)
    return Manifest(
        engine="sglang", variant=spec.variant, workload=workload,
        device=describe_device(versions, spec.device), versions=versions, traces=list(measured.traces),
        timing=Timing(step_ms=[median_ms], median_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms,
                      tok_per_s=measured.tok_per_s, method=measured.method),
        layers=layers, repo=spec.repo, commit=sha, profiled_steps=measured.profiled_steps,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        extra={**measured.extra, "patches": patches})


# ---------------------------------------------------------------------------------------------
# The run, on a host
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostDirs:
    """The run's directories on the host, all under one temporary directory."""

    base: str
    worktree: str
    profile: str
    patches: str
    result_file: str

    @classmethod
    def under(cls, base: str) -> "HostDirs":
        join = lambda *p: str(PurePosixPath(base, *p))  # noqa: E731
        return cls(base, join("worktree"), join("profile"), join("patches"), join("result.jsonl"))


@dataclass(frozen=True)
class Measured:
    """What one way of measuring (one-batch benchmark or server) found."""

    traces: list[str]  # file names in the profiler directory
    latency_s: float
    tok_per_s: float
    profiled_steps: int | None  # None: the trace's step spans tell
    method: str  # Timing.method
    output: str  # the benchmark's (or driver's) log
    extra: dict


@dataclass(frozen=True)
class Context:
    host: Host
    python: str
    dirs: HostDirs
    spec: RunSpec
    staging: Path  # local
    on_line: Callable[[str], None] | None
    should_stop: Callable[[], bool] | None


def _probe(host: Host, argv: list[str], what: str, **kw):
    return parse_json_line(host.run(argv, timeout_s=_SHORT_S, **kw).output, what)


def _has_file(host: Host, root: str) -> Callable[[str], bool]:
    def has_file(rel: str) -> bool:
        path = str(PurePosixPath(root, rel))
        return host.run(["test", "-f", path], timeout_s=_SHORT_S, check=False).returncode == 0
    return has_file


def apply_patches(host: Host, dirs: HostDirs, patch_files: tuple[str, ...], where: str) -> list[str]:
    """Put each patch on the host and `git apply` it in the worktree; return the applied names."""
    applied = []
    for i, local in enumerate(patch_files):
        slot = str(PurePosixPath(dirs.patches, str(i)))
        host.run(["mkdir", "-p", "--", slot], timeout_s=_SHORT_S)
        remote = host.put(Path(local), slot)
        done = host.run(["git", "-C", dirs.worktree, "apply", "--whitespace=nowarn", "--", remote],
                        timeout_s=_SHORT_S, check=False)
        if done.returncode != 0:
            message = done.output.strip()
            raise PatchFailed(f"patch {Path(local).name} does not apply to {where}: {message}",
                              patch=str(local), output=message)
        applied.append(Path(local).name)
    return applied


def read_host_text(host: Host, remote: str, staging: Path) -> str:
    """A small text file of the host, through a local copy."""
    local = host.get(remote, staging)
    try:
        return local.read_text(errors="replace")
    finally:
        local.unlink(missing_ok=True)


def run_in_worktree(ctx: Context, argv: list[str]) -> str:
    """Run argv with the worktree's sources first on PYTHONPATH, a fresh profiler directory as
    SGLANG_TORCH_PROFILER_DIR and as the working directory; return its output."""
    host_path = _probe(ctx.host, [ctx.python, "-c", PYTHONPATH_SCRIPT], "PYTHONPATH probe")
    pythonpath = str(PurePosixPath(ctx.dirs.worktree, "python")) + (f":{host_path}" if host_path else "")
    env = {"PYTHONPATH": pythonpath, "SGLANG_TORCH_PROFILER_DIR": ctx.dirs.profile, "PYTHONUNBUFFERED": "1"}
    return ctx.host.run(argv, cwd=ctx.dirs.profile, env=env, timeout_s=ctx.spec.timeout_s, on_line=ctx.on_line,
                        should_stop=ctx.should_stop).output


def read_decode_result(ctx: Context, output: str) -> tuple[float, float, str, dict]:
    """(latency s, tok/s, source, JSONL record or {}): the JSONL first, the printed lines else."""
    try:
        text = read_host_text(ctx.host, ctx.dirs.result_file, ctx.staging)
    except RunError:
        text = None
    if text and text.strip():
        record = parse_result_jsonl(text, "the benchmark's --result-filename")
        latency_s, tok_per_s = read_decode_figures(record, "the benchmark's --result-filename")
        return latency_s, tok_per_s, "jsonl", record
    latency_s, tok_per_s = parse_printed_decode(output)
    return latency_s, tok_per_s, "printed", {}


def list_profile_dir(ctx: Context) -> list[str]:
    return _probe(ctx.host, [ctx.python, "-c", LIST_SCRIPT, ctx.dirs.profile], "listing the profiler directory")


def measure_one_batch(ctx: Context) -> Measured:
    """SGLang's one-batch benchmark (TP 1): its JSONL or printed median, its decode trace."""
    module = find_bench_module(_has_file(ctx.host, ctx.dirs.worktree))
    source = read_host_text(ctx.host, str(PurePosixPath(ctx.dirs.worktree, module_path(module))), ctx.staging)
    flags = detect_bench_flags(source)
    w = ctx.spec.workload
    argv = build_one_batch_argv(ctx.python, module, w, result_file=ctx.dirs.result_file, run_name=RUN_NAME,
                                profile_prefix=PROFILE_PREFIX, flags=flags)
    output = run_in_worktree(ctx, argv)
    latency_s, tok_per_s, source_kind, record = read_decode_result(ctx, output)
    trace = find_decode_trace(list_profile_dir(ctx), PROFILE_PREFIX, w.batch_size, w.input_len, w.output_len)
    extra = {"module": module, "argv": argv, "bench_flags": asdict(flags), "timing_source": source_kind,
             "result": record, "timing_note": "SGLang reports the median decode step only: p10 and p90 equal it"}
    return Measured([trace], latency_s, tok_per_s, count_profiled_steps(w, flags), TIMING_METHOD, output, extra)


def measure_one_batch_sweep(ctx: Context, sweep: SweepSpec) -> dict[int, Measured | str]:
    """SGLang's one-batch benchmark given the sweep's lists (ONE process, the model loaded once):
    {point index: its Measured, or why it has none}. Each point's figures are its own JSONL
    record (matched by shape: match_sweep_records), its trace the decode trace named for its
    batch size and lengths; a sweep needs the JSONL (the printed lines do not say which line is
    which point's once the benchmark skips one)."""
    module = find_bench_module(_has_file(ctx.host, ctx.dirs.worktree))
    source = read_host_text(ctx.host, str(PurePosixPath(ctx.dirs.worktree, module_path(module))), ctx.staging)
    flags = detect_bench_flags(source)
    axes = dict(sweep.axes)
    argv = build_one_batch_argv(ctx.python, module, ctx.spec.workload, result_file=ctx.dirs.result_file,
                                run_name=RUN_NAME, profile_prefix=PROFILE_PREFIX, flags=flags, axes=axes)
    output = run_in_worktree(ctx, argv)
    try:
        text = read_host_text(ctx.host, ctx.dirs.result_file, ctx.staging)
    except RunError:
        text = ""
    shapes = [(p.workload.batch_size, p.workload.input_len, p.workload.output_len) for p in sweep.points]
    records = match_sweep_records(parse_result_records(text, "the benchmark's --result-filename"), shapes)
    names = list_profile_dir(ctx)
    found: dict[int, Measured | str] = {}
    for i, (point, (bs, il, ol)) in enumerate(zip(sweep.points, shapes)):
        if i not in records:
            skipped = f"skipping ({bs}, {il}, {ol}) due to max batch size limit" in output
            found[i] = ("SGLang skipped it: over the model's max batch size for these lengths (its log: "
                        f"'skipping ({bs}, {il}, {ol}) due to max batch size limit')" if skipped else
                        "the benchmark wrote no JSONL record for it" + ("" if text.strip() else
                                                                       " (its --result-filename is empty)"))
            continue
        try:
            latency_s, tok_per_s = read_decode_figures(records[i], f"the JSONL record of point {i + 1}")
            trace = find_decode_trace(names, PROFILE_PREFIX, bs, il, ol)
        except RunError as e:
            found[i] = str(e)
            continue
        extra = {"module": module, "argv": argv, "bench_flags": asdict(flags), "timing_source": "jsonl",
                 "result": records[i], "sweep": {"id": sweep.sweep_id, "point": i, "points": len(sweep.points),
                                                 "axes": {k: list(v) for k, v in sweep.axes}},
                 "timing_note": "SGLang reports the median decode step only: p10 and p90 equal it"}
        found[i] = Measured([trace], latency_s, tok_per_s, count_profiled_steps(point.workload, flags),
                            TIMING_METHOD, output, extra)
    return found


def measure_server(ctx: Context) -> Measured:
    """SGLang's server (any TP): every rank's DECODE trace, decode steps timed from streamed tokens.
    A run whose server writes no DECODE trace ends with CommandFailed saying why (the driver
    reports it as soon as the batch is over; explain_missing_decode words it)."""
    has_file = _has_file(ctx.host, ctx.dirs.worktree)
    if not has_file(LAUNCH_SERVER_FILE):
        raise RunError(f"the checkout has no {LAUNCH_SERVER_FILE}")
    environ = (read_host_text(ctx.host, str(PurePosixPath(ctx.dirs.worktree, ENVIRON_FILE)), ctx.staging)
               if has_file(ENVIRON_FILE) else None)
    min_bs_read = reads_decode_min_bs(environ)
    w = ctx.spec.workload
    profile_id = uuid.uuid4().hex
    request = build_profile_request(ctx.dirs.profile, w.profile_steps, PROFILE_PREFIX, profile_id)
    server_argv = build_server_argv(ctx.python, w)
    config = build_driver_config(server_argv, w, result_file=ctx.dirs.result_file, trace_dir=ctx.dirs.profile,
                                 profile_request=request, startup_timeout_s=ctx.spec.timeout_s)
    try:
        output = run_in_worktree(ctx, [ctx.python, "-c", SERVER_DRIVER_SCRIPT, json.dumps(config)])
    except CommandFailed as e:
        report = None if isinstance(e, (CommandTimeout, CommandCancelled)) or e.result is None \
            else read_no_decode_report(e.result.output)
        if report is None:
            raise
        raise CommandFailed(explain_missing_decode(report, w, trace_stem=config["trace_stem"],
                                                   min_bs_read=min_bs_read), e.result) from None
    latency_s, tok_per_s, source_kind, record = read_decode_result(ctx, output)
    traces = find_server_traces(list_profile_dir(ctx), profile_id, PROFILE_PREFIX)
    by_stage = all(t.split(".trace.json")[0].endswith("-DECODE") for t in traces)
    extra = {"module": "sglang.launch_server", "argv": server_argv, "server_env": config["server_env"],
             "decode_min_bs_read": min_bs_read, "profile_request": request, "timing_source": source_kind,
             "result": record, "decode_capture": "by-stage" if by_stage else "stop_profile",
             "timing_note": "decode step = a request's time from its first streamed token to its last, per "
                            "token; median over the batch's requests; p10 and p90 equal it"}
    # A capture saved by /stop_profile holds the decode steps run until the batch ended: up to
    # profile_steps, how many is for the trace's own step spans to say.
    profiled = w.profile_steps if by_stage else None
    return Measured(traces, latency_s, tok_per_s, profiled, SERVER_TIMING_METHOD, output, extra)


def check_sglang(spec: RunSpec, config: Config, host: Host | None = None, *, server: bool | None = None) -> str:
    """What can be known before anything runs (the engine's check): the repo is in the config, the
    workload fits the path it takes (one batch, or the server for TP > 1 or `server`), the variant
    names a patch set whose files exist. Returns the repo path; raises SpecError."""
    if spec.engine != "sglang":
        raise SpecError(f"spec.engine {spec.engine!r}: the sglang engine runs sglang specs only")
    if spec.repo not in config.repos:
        raise SpecError(f"spec.repo {spec.repo!r}: not in the config's [repos]")
    if spec.workload.model_path is None:
        raise SpecError("workload.model_path: the sglang engine needs a model path")
    if spec.workload.tp > 1 if server is None else server:
        check_server_workload(spec.workload)
    else:
        plan_profile_start_step(spec.workload.output_len, spec.workload.profile_steps)
    for f in _patch_files(spec, config):
        if not Path(f).is_file():
            raise SpecError(f"spec.variant {spec.variant!r}: patch file {f} does not exist")
    return config.repos[spec.repo].path


def _patch_files(spec: RunSpec, config: Config) -> tuple[str, ...]:
    patches = () if spec.variant == "unpatched" else config.patches.get(spec.variant)
    if patches is None:
        raise SpecError(f"spec.variant {spec.variant!r}: not a patch set in the config's [patches]")
    return tuple(patches)


def _check_runnable(spec: RunSpec, config: Config, sha: str, server: bool) -> tuple[str, tuple[str, ...]]:
    """(repo path, patch files) of a spec this engine can run; RunError before anything runs."""
    repo_path = check_sglang(spec, config, server=server)
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise RunError(f"sha {sha!r}: expected a full commit sha (resolve the ref first)")
    return repo_path, _patch_files(spec, config)


def run_sglang(spec: RunSpec, config: Config, host: Host, *, sha: str, work_dir_local: Path,
               on_line: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None,
               on_progress: Callable[[int, int], None] | None = None,
               on_scratch: Callable[[str, str | None], None] | None = None) -> Path:
    """Run `spec` at commit `sha` on `host`; return the local bundle directory (in work_dir_local).
    TP 1 runs the one-batch benchmark, TP > 1 the server path (run_sglang_server). The directory
    made on the host (with the repo's worktree in it) is told to `on_scratch(path, repo)` as soon
    as it exists, so that it can be removed should the caller die before removing it.

    Raises PatchFailed for a patch that does not apply, RunError for anything else that stops
    the run (CommandFailed, CommandTimeout and CommandCancelled from the benchmark itself)."""
    measure = measure_server if spec.workload.tp > 1 else measure_one_batch
    return _run(spec, config, host, measure, sha=sha, work_dir_local=work_dir_local, on_line=on_line,
                should_stop=should_stop, on_progress=on_progress, on_scratch=on_scratch)


def run_sglang_server(spec: RunSpec, config: Config, host: Host, *, sha: str, work_dir_local: Path,
                      on_line: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None,
                      on_progress: Callable[[int, int], None] | None = None,
                      on_scratch: Callable[[str, str | None], None] | None = None) -> Path:
    """As run_sglang, through SGLang's server whatever the TP size: `launch_server`, POST
    /start_profile (by stage, profile_steps decode steps), a batch of streaming requests, every
    rank's DECODE trace in the bundle."""
    return _run(spec, config, host, measure_server, sha=sha, work_dir_local=work_dir_local, on_line=on_line,
                should_stop=should_stop, on_progress=on_progress, on_scratch=on_scratch)


def _progress_of(on_progress: Callable[[int, int], None] | None) -> Callable[[str], None]:
    """A stage name -> on_progress(its place among STAGES, how many there are)."""
    return (lambda stage: on_progress(STAGES.index(stage) + 1, len(STAGES))) if on_progress else (lambda stage: None)


@contextmanager
def _checkout_on_host(spec: RunSpec, config: Config, host: Host, *, sha: str, work_dir_local: Path, server: bool,
                      kind: str, on_scratch, progress: Callable[[str], None]):
    """What a run and a sweep share before their benchmark and after it: check the spec, probe the
    model directory, make the host's scratch directories and the worktree at `sha`, apply the
    patches; yield (python, dirs, staging, applied patches), `staging` a local directory (`kind`
    in its name) that the caller fills and renames. The staging directory is removed if the body
    raises; the worktree and the host's scratch always."""
    repo_path, patch_files = _check_runnable(spec, config, sha, server=server)
    python = config.host(spec.host).python
    work_dir_local = Path(work_dir_local)
    work_dir_local.mkdir(parents=True, exist_ok=True)
    variant = re.sub(r"[^A-Za-z0-9._+-]", "_", spec.variant)  # a label may hold '/' (fix/a): not a path here
    staging = Path(tempfile.mkdtemp(dir=work_dir_local, prefix=f".sglang-{kind}{sha[:12]}-{variant}-"))
    dirs = HostDirs.under(host.mkdtemp("stepwatch-sglang-"))
    if on_scratch:
        on_scratch(dirs.base, repo_path)
    try:
        problem = _probe(host, [python, "-c", MODEL_DIR_SCRIPT, *plan_model_dir_check(spec.workload, server)],
                         "model directory probe").get("problem")
        if problem:
            raise RunError(explain_model_dir_problem(str(problem)))
        host.run(["mkdir", "-p", "--", dirs.profile, dirs.patches], timeout_s=_SHORT_S)
        add_worktree(host, repo_path, sha, dirs.worktree)
        progress("worktree")
        applied = apply_patches(host, dirs, patch_files, f"{spec.repo}@{sha[:12]}")
        progress("patches")
        yield python, dirs, staging, applied
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        remove_worktree(host, repo_path, dirs.worktree)  # also when `worktree add` stopped half-way
        host.rmtree(dirs.base)


def _probe_versions_and_layers(host: Host, python: str, dirs: HostDirs, model_path: str) -> tuple[dict, int | None]:
    """The checkout's package versions and the model's layer count (None when its config has none)."""
    env = {"PYTHONPATH": str(PurePosixPath(dirs.worktree, "python"))}
    versions = _probe(host, [python, "-c", VERSIONS_SCRIPT, dirs.worktree], "versions probe",
                      cwd=dirs.worktree, env=env)
    layers = _probe(host, [python, "-c", LAYERS_SCRIPT, model_path], "model config probe").get("layers")
    return versions, layers if isinstance(layers, int) and layers > 0 else None


def _run(spec: RunSpec, config: Config, host: Host, measure: Callable[[Context], Measured], *, sha: str,
         work_dir_local: Path, on_line, should_stop, on_progress, on_scratch=None) -> Path:
    progress = _progress_of(on_progress)
    with _checkout_on_host(spec, config, host, sha=sha, work_dir_local=work_dir_local,
                           server=measure is measure_server, kind="", on_scratch=on_scratch,
                           progress=progress) as (python, dirs, staging, applied):
        measured = measure(Context(host, python, dirs, spec, staging, on_line, should_stop))
        progress("benchmark")
        for name in measured.traces:
            host.get(str(PurePosixPath(dirs.profile, name)), staging)
        progress("trace")
        versions, layers = _probe_versions_and_layers(host, python, dirs, spec.workload.model_path)
        progress("versions")
        (staging / "benchmark.log").write_text(measured.output)
        write_bundle(staging, build_manifest(spec, sha=sha, measured=measured, versions=versions, layers=layers,
                                             patches=applied))
        bundle = staging.with_name(staging.name.lstrip("."))
        staging.rename(bundle)
        progress("bundle")
        return bundle


def run_sglang_sweep(sweep: SweepSpec, config: Config, host: Host, *, sha: str, work_dir_local: Path,
                     on_line: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None,
                     on_progress: Callable[[int, int], None] | None = None,
                     on_scratch: Callable[[str, str | None], None] | None = None) -> tuple[Path, dict[int, str]]:
    """Run every point of an in-process sweep (TP 1) at commit `sha` in ONE process of SGLang's
    one-batch benchmark (measure_one_batch_sweep); return (a local directory with one bundle a
    point that has a result, `point-NNN`, {point index: why it has none}). One worktree, one set
    of patches, one versions probe for all points; each point's bundle is as run_sglang's."""
    first = sweep.points[0]
    if not sweep.in_one_process:
        raise RunError(f"sweep {sweep.sweep_id}: only the one-batch benchmark (TP 1) runs a sweep in one process")
    progress = _progress_of(on_progress)
    with _checkout_on_host(first, config, host, sha=sha, work_dir_local=work_dir_local, server=False,
                           kind="sweep-", on_scratch=on_scratch, progress=progress) as (python, dirs, staging, applied):
        found = measure_one_batch_sweep(Context(host, python, dirs, first, staging, on_line, should_stop), sweep)
        progress("benchmark")
        versions, layers = _probe_versions_and_layers(host, python, dirs, first.workload.model_path)
        progress("versions")
        missing = {}
        for i, measured in found.items():
            if isinstance(measured, str):
                missing[i] = measured
                continue
            point_dir = staging / f"point-{i:03d}"
            point_dir.mkdir()
            for name in measured.traces:
                host.get(str(PurePosixPath(dirs.profile, name)), point_dir)
            (point_dir / "benchmark.log").write_text(measured.output)
            write_bundle(point_dir, build_manifest(sweep.points[i], sha=sha, measured=measured, versions=versions,
                                                   layers=layers, patches=applied))
        progress("trace")
        directory = staging.with_name(staging.name.lstrip("."))
        staging.rename(directory)
        progress("bundle")
        return directory, missing


def _run_sweep_engine(sweep: SweepSpec, config: Config, host: Host, checkout: Checkout, work_dir: Path,
                      io: EngineIO) -> tuple[Path, dict[int, str]]:
    return run_sglang_sweep(sweep, config, host, sha=checkout.sha, work_dir_local=work_dir, on_line=io.on_line,
                            should_stop=io.should_stop, on_progress=io.on_progress, on_scratch=io.on_scratch)


def _run_engine(spec: RunSpec, config: Config, host: Host, checkout: Checkout, work_dir: Path, io: EngineIO) -> Path:
    return run_sglang(spec, config, host, sha=checkout.sha, work_dir_local=work_dir, on_line=io.on_line,
                      should_stop=io.should_stop, on_progress=io.on_progress, on_scratch=io.on_scratch)


ENGINE = Engine("sglang", check_sglang, _run_engine, _run_sweep_engine)
