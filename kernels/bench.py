"""Time and profile the reference decode workload, and write a result bundle.

    python -m kernels.bench --preset tiny --kv fused --device cpu --out out/tiny-fused

Decode steps are first timed without the profiler (CUDA events on cuda, perf_counter on cpu;
each step is synchronised, as a serving loop that samples a token every step is), then
`--steps` steps are profiled with torch.profiler (one `ProfilerStep#N` per decode step,
record_shapes, with_stack unless --no-stack). With --cuda-graph --graph-mapping the same
model (same weights, pools and rows) then runs the same steps eagerly under the profiler, as
the bundle's graph-off mapping trace: the importer aligns its kernels with the graph replay's to
give each replayed kernel its op, Python line and layer (ingest/traces/graph_attribution.py).
The bundle (manifest.json, trace.json.gz,
key_averages.json) is assembled in a temporary directory beside --out and renamed into place,
so --out is either complete or absent. Progress goes to stderr; the last stdout line is the
bundle directory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from kernels.bundle import Manifest, Timing, write_bundle
from kernels.workload import KV_STRATEGIES, PRESETS, DecodeWorkload, ModelConfig, build_model
from kernels.workload import count_floor_bytes, count_weight_bytes, get_config

TRACE_NAME = "trace.json.gz"
KEY_AVERAGES_NAME = "key_averages.json"
MAPPING_TRACE_NAME = "mapping.trace.json.gz"
MAPPING_KEY_AVERAGES_NAME = "mapping_key_averages.json"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


class BenchError(RuntimeError):
    """A run that cannot start (e.g. --device cuda without CUDA); the message is one line."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage too; keep it to one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--kv", required=True, choices=KV_STRATEGIES, help="KV-cache strategy")
    p.add_argument("--cuda-graph", action="store_true", help="capture one decode step, replay it")
    p.add_argument("--graph-mapping", action="store_true",
                   help="with --cuda-graph: also profile the same steps eagerly (the graph-off mapping trace)")
    p.add_argument("--steps", type=_positive_int, default=3, help="profiled decode steps")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available, else cpu")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--context", type=_positive_int, help="context tokens per sequence")
    p.add_argument("--layers", type=_positive_int)
    p.add_argument("--pool-tokens", type=_positive_int, help="KV pool rows per layer")
    p.add_argument("--timing-steps", type=_positive_int, default=20)
    p.add_argument("--warmup", type=_non_negative_int, default=5)
    p.add_argument("--no-stack", action="store_true", help="profile without with_stack")
    p.add_argument("--seed", type=int)
    p.add_argument("--commit", help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--repo", default="stepwatch")
    return p


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize_step_ms(step_ms: list[float], batch_size: int, method: str) -> Timing:
    """Median, p10, p90 (ms) of per-step samples, and tokens/s = batch_size / median seconds."""
    ordered = sorted(step_ms)
    q = statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1 else ordered * 9
    median = statistics.median(ordered)
    return Timing(step_ms=step_ms, median_ms=median, p10_ms=q[0], p90_ms=q[8],
                  tok_per_s=batch_size / (median / 1000.0), method=method)


def time_steps(workload: DecodeWorkload, steps: int, warmup: int, progress=None) -> Timing:
    """Run `warmup` untimed then `steps` timed decode steps; per-step ms without the profiler."""
    device = workload.state.device
    for _ in range(warmup):
        workload.run_step()
    synchronize(device)
    step_ms = []
    for i in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            workload.run_step()
            end.record()
            end.synchronize()
            step_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            workload.run_step()
            step_ms.append((time.perf_counter() - t0) * 1000.0)
        if progress:
            progress(f"timing {i + 1}/{steps}")
    method = "cuda-events" if device.type == "cuda" else "perf-counter"
    return summarize_step_ms(step_ms, workload.state.cfg.batch_size, method)


def _device_time(avg, name: str) -> float:
    """torch >= 2.4 names it *_device_time_total; older builds only *_cuda_time_total."""
    value = getattr(avg, name, None)
    if value is None:
        value = getattr(avg, name.replace("device", "cuda"), 0.0)
    return float(value)


def summarize_key_averages(prof) -> list[dict]:
    """One row per op/kernel name of `prof.key_averages()`, times in microseconds."""
    return [
        {
            "name": avg.key,
            "count": int(avg.count),
            "self_device_time_total_us": _device_time(avg, "self_device_time_total"),
            "device_time_total_us": _device_time(avg, "device_time_total"),
            "self_cpu_time_total_us": float(avg.self_cpu_time_total),
            "cpu_time_total_us": float(avg.cpu_time_total),
        }
        for avg in prof.key_averages()
    ]


def profile_steps(workload: DecodeWorkload, steps: int, with_stack: bool, out_dir: Path,
                  progress=None, trace_name: str = TRACE_NAME, key_averages_name: str = KEY_AVERAGES_NAME) -> None:
    """Profile one warm-up plus `steps` decode steps; write `trace_name` and `key_averages_name`."""
    device = workload.state.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                with_stack=with_stack) as prof:
        for i in range(1 + steps):
            workload.run_step()
            synchronize(device)
            prof.step()
            if progress and i:
                progress(f"profile {i}/{steps}")
    raw = out_dir / "trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out_dir / trace_name, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    raw.unlink()
    rows = summarize_key_averages(prof)
    (out_dir / key_averages_name).write_text(json.dumps(rows, indent=1) + "\n")


def describe_device(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(),
                "cpu_count": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "sm_count": props.multi_processor_count,
            "total_memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}"}


def measure_peak_memory(device: torch.device) -> dict:
    """{"peak_gpu_mem_bytes": N}: the most memory torch's allocator held on the GPU in this process
    so far (weights, KV pool, activations, a graph's pool: torch.cuda.max_memory_allocated), for
    the run's manifest; {} on the CPU, where there is none to report."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_mem_bytes": int(torch.cuda.max_memory_allocated(device))}


def describe_versions() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
            "python": platform.python_version()}


def find_commit() -> str | None:
    """HEAD of the project checkout, or None when it is not a git checkout (or has no commit)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and len(sha) == 40 else None


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"--device cuda: CUDA is not available (torch {torch.__version__})")
    return torch.device(name)


def prepare_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BenchError(f"--out {out}: already exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)


def check_graph_mapping(graph_mapping: bool, cuda_graph: bool) -> None:
    if graph_mapping and not cuda_graph:
        raise BenchError("--graph-mapping: needs --cuda-graph (the mapping trace is the graph-off twin of a graph run)")


def run_bench(workload: DecodeWorkload, out: Path, *, timing_steps: int = 20, warmup: int = 5,
              steps: int = 3, with_stack: bool = True, commit: str | None = None,
              repo: str = "stepwatch", progress=None, variant: str | None = None,
              graph_mapping: bool = False) -> Path:
    """Time and profile `workload`, then write a complete bundle at `out`; return its path.
    The bundle's variant is the KV strategy unless `variant` names another. With
    `graph_mapping` (a CUDA-graph workload only) the same model then runs `steps` steps eagerly
    under the profiler, written as the bundle's mapping trace."""
    check_graph_mapping(graph_mapping, workload.cuda_graph)
    out = Path(out)
    prepare_out_dir(out)
    state = workload.state
    cfg: ModelConfig = state.cfg
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp."))
    try:
        timing = time_steps(workload, timing_steps, warmup, progress)
        profile_steps(workload, steps, with_stack, tmp, progress)
        mapping_traces = []
        if graph_mapping:
            workload.release()  # the graph's memory pool is not needed any more
            eager = DecodeWorkload(state, workload.kv, cuda_graph=False)
            profile_steps(eager, steps, with_stack, tmp, progress, MAPPING_TRACE_NAME, MAPPING_KEY_AVERAGES_NAME)
            eager.release()
            mapping_traces = [MAPPING_TRACE_NAME]
        workload_info = {
            **cfg.describe(),
            "kv": workload.kv,
            "cuda_graph": workload.cuda_graph,
            "device": state.device.type,
            "timing_steps": timing_steps,
            "warmup_steps": warmup,
            "profiled_steps": steps,
            "with_stack": with_stack,
            "record_shapes": True,
        }
        manifest = Manifest(
            engine="reference",
            variant=variant or workload.kv,
            workload=workload_info,
            device=describe_device(state.device),
            versions=describe_versions(),
            traces=[TRACE_NAME],
            timing=timing,
            layers=cfg.layers,
            repo=repo,
            commit=commit if commit is not None else find_commit(),
            profiled_steps=steps,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            extra={"weight_bytes": count_weight_bytes(cfg), "floor_bytes": count_floor_bytes(cfg),
                   "key_averages": KEY_AVERAGES_NAME, **measure_peak_memory(state.device),
                   **({"mapping_key_averages": MAPPING_KEY_AVERAGES_NAME} if graph_mapping else {})},
            mapping_traces=mapping_traces,
        )
        write_bundle(tmp, manifest)
        tmp.chmod(0o755)  # mkdtemp makes it private; a bundle is meant to be shared
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _print_progress(message: str) -> None:
    print(f"progress: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device = resolve_device(args.device)
        cfg = get_config(args.preset, batch_size=args.batch_size, context=args.context,
                         layers=args.layers, pool_tokens=args.pool_tokens, seed=args.seed)
        if args.cuda_graph and device.type != "cuda":
            raise BenchError("--cuda-graph: needs --device cuda")
        check_graph_mapping(args.graph_mapping, args.cuda_graph)  # before the model is built
        out = Path(args.out)
        prepare_out_dir(out)
    except (BenchError, ValueError) as e:
        print(f"python -m kernels.bench: error: {e}", file=sys.stderr)
        return 2
    _print_progress(f"building {cfg.preset} ({cfg.layers} layers, pool {cfg.pool_tokens} rows) "
                    f"on {device}")
    workload = DecodeWorkload(build_model(cfg, device), args.kv, cuda_graph=args.cuda_graph)
    path = run_bench(workload, out, timing_steps=args.timing_steps, warmup=args.warmup,
                     steps=args.steps, with_stack=not args.no_stack, commit=args.commit,
                     repo=args.repo, progress=_print_progress, graph_mapping=args.graph_mapping)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
