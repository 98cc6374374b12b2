"""Everything measured on the lent GPU, in one run: `python -m kernels.studies.gpu_suite --out $OUT`.

Stages (each in its own try/except; results.json is rewritten after every stage):
  a  bit-exact checks of the Triton kernels against torch (random data + all 256 patterns)
  b  bandwidth: D2D copy, torch cast, Triton cast, gather-cast and cast-rows (do_bench median)
  c  glm5 (tiny on --device cpu), every KV strategy x {eager, graph}: bundles, step ms, floor
  d  tiny on the device, full-pool-cast and fused x {eager, graph} x {stack, nostack}: small bundles
  f  the GPU tests (pytest -m gpu tests/test_kernels_gpu.py; reported as not run without pytest)
  e  the big trace: glm5 full-pool-cast eager, 30 profiled steps (skipped with --quick)
  g  pack $OUT/bundles into $OUT/bundles.tar.gz (only files two levels deep come back)

`--device cpu --quick` runs a, c (tiny), d, f and g on the CPU, to catch mistakes before the GPU run.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import torch

from kernels import kv_cast
from kernels.bench import describe_device, describe_versions, find_commit, run_bench
from kernels.bundle import read_bundle
from kernels.kv_cast import BF16, FP8, cast_fp8_to_bf16, cast_rows_fp8_to_bf16, gather_cast_fp8_to_bf16
from kernels.workload import (
    KV_STRATEGIES,
    DecodeWorkload,
    build_model,
    count_floor_bytes,
    count_weight_bytes,
    fill_fp8_pool,
    get_config,
)

ROOT = Path(__file__).resolve().parents[2]
POOL_TOKENS, KV_DIM = 495_000, 576
GATHER_ROWS = (2048, 65_536, 262_144)
TINY_TRACE_LIMIT_BYTES = 100_000
CAST_SWEEP = [{"BLOCK": b, "num_warps": w} for b, w in ((4096, 4), (8192, 8), (16384, 8), (16384, 16), (32768, 16))]
GATHER_SWEEP = [{"ROWS": r, "num_warps": w} for r, w in ((4, 4), (8, 4), (8, 8), (16, 8))]


class Suite:
    """Shared state of one run: output paths, the log, results, and the clock."""

    def __init__(self, out: Path, device: torch.device, quick: bool, budget_s: float):
        self.out, self.device, self.quick, self.budget_s = out, device, quick, budget_s
        self.bundles = out / "bundles"
        self.bundles.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "suite.log", "a")
        self.started = time.monotonic()
        self.results: dict = {"device": describe_device(device), "versions": describe_versions(),
                              "quick": quick, "stages": {}}
        self.copy_tb_per_s: float | None = None
        self.state = None  # the glm5 ModelState shared by stages c and e
        self.commit: str | None = None

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def save(self) -> None:
        tmp = self.out / ".results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "results.json")

    def run_stage(self, name: str, fn) -> None:
        self.log(f"stage {name}: start")
        t0 = time.monotonic()
        entry: dict = {}
        try:
            entry["result"] = fn(self)
            entry["ok"] = True
        except Exception as e:  # one failed stage must not lose the others' results
            entry["ok"] = False
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["traceback"] = traceback.format_exc()
            self.log(entry["traceback"])
        entry["seconds"] = round(time.monotonic() - t0, 2)
        self.results["stages"][name] = entry
        self.log(f"stage {name}: {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']} s")
        self.save()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def count_mismatches(got: torch.Tensor, want: torch.Tensor) -> int:
    """Elements whose BF16 bits differ (NaN included: the bits must match too)."""
    return int((got.view(torch.int16) != want.view(torch.int16)).sum().item())


# --- stage a -------------------------------------------------------------------------------

def check_bit_exact(suite: Suite) -> dict:
    """Mismatch counts of each kernel against torch on all 256 patterns and on random rows."""
    dev = suite.device
    backend = "triton" if dev.type == "cuda" else "auto"
    gen = torch.Generator(device=dev).manual_seed(0)
    patterns = torch.arange(256, device=dev, dtype=torch.int32).to(torch.uint8)
    pool = torch.randint(0, 256, (50_000, KV_DIM), dtype=torch.uint8, device=dev, generator=gen)
    pool[:16] = patterns.view(16, 16).repeat(1, KV_DIM // 16)
    want_pool = pool.view(FP8).to(BF16)
    rows = torch.randperm(50_000, device=dev, generator=gen)[:20_000]
    rows[:16] = torch.arange(16, device=dev)
    n_active = torch.tensor([15_000], device=dev)
    scratch = torch.zeros_like(want_pool)
    cast_rows_fp8_to_bf16(pool, rows, n_active, scratch, backend=backend)
    used = rows[:15_000]
    result = {
        "backend": backend if dev.type == "cuda" else "torch-fallback",
        "cast_256_patterns": count_mismatches(cast_fp8_to_bf16(patterns, backend=backend),
                                              patterns.view(FP8).to(BF16)),
        "cast_random": count_mismatches(cast_fp8_to_bf16(pool, backend=backend), want_pool),
        "gather_int64": count_mismatches(gather_cast_fp8_to_bf16(pool, rows, backend=backend), want_pool[rows]),
        "gather_int32_n_active": count_mismatches(
            gather_cast_fp8_to_bf16(pool, rows.int(), n_active.int(), backend=backend)[:15_000], want_pool[used]),
        "cast_rows": count_mismatches(scratch[used], want_pool[used]),
    }
    result["all_exact"] = all(v == 0 for k, v in result.items() if k != "backend")
    if not result["all_exact"]:
        raise AssertionError(f"bit mismatches: {result}")
    return result


# --- stage b -------------------------------------------------------------------------------

def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def bench_graph_ms(fn) -> float:
    """Median time of `fn` replayed from a CUDA graph: for launches short enough that Python's
    launch cost (tens of us for a Triton kernel) would otherwise be what is measured. It is also
    how decode runs these kernels (under CUDA graphs)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


def describe_bandwidth(ms: float, bytes_moved: int, copy_tb_per_s: float | None) -> dict:
    tb_per_s = bytes_moved / (ms / 1000.0) / 1e12
    row = {"us": round(ms * 1000.0, 2), "bytes": bytes_moved, "tb_per_s": round(tb_per_s, 3)}
    if copy_tb_per_s:
        row["fraction_of_copy"] = round(tb_per_s / copy_tb_per_s, 3)
    return row


def pick_fastest(configs: list[dict], target: dict, fn, timer=bench_ms) -> tuple[dict, list[dict]]:
    """Time `fn` under each config (written into `target`); leave the fastest in `target`."""
    timings = []
    for cfg in configs:
        target.clear()
        target.update(cfg)
        try:
            timings.append({**cfg, "us": round(timer(fn) * 1000.0, 2)})
        except Exception as e:  # a config that does not compile is data, not a failure
            timings.append({**cfg, "error": f"{type(e).__name__}: {e}"})
    best = min((t for t in timings if "us" in t), key=lambda t: t["us"])
    target.clear()
    target.update({k: best[k] for k in configs[0]})
    return dict(target), timings


def measure_bandwidth(suite: Suite) -> dict:
    """Copy, cast and gather-cast throughput over a 495,000 x 576 pool (bytes = read + write)."""
    if suite.device.type != "cuda":
        return {"skipped": "needs cuda (triton.testing.do_bench)"}
    dev = suite.device
    n = POOL_TOKENS * KV_DIM
    pool = fill_fp8_pool(POOL_TOKENS, KV_DIM, torch.Generator(device=dev).manual_seed(1), dev)
    src = torch.empty((POOL_TOKENS, KV_DIM), dtype=BF16, device=dev).copy_(pool.view(FP8))
    dst = torch.empty_like(src)
    res: dict = {}
    copy = describe_bandwidth(bench_ms(lambda: dst.copy_(src)), 4 * n, None)
    suite.copy_tb_per_s = copy["tb_per_s"]
    res["copy_bf16"] = copy
    bw = suite.copy_tb_per_s
    res["torch_cast"] = describe_bandwidth(bench_ms(lambda: pool.view(FP8).to(BF16)), 3 * n, bw)
    res["triton_cast_config"], res["triton_cast_sweep"] = pick_fastest(
        CAST_SWEEP, kv_cast.CAST_CONFIG, lambda: cast_fp8_to_bf16(pool, dst))
    res["triton_cast"] = describe_bandwidth(bench_ms(lambda: cast_fp8_to_bf16(pool, dst)), 3 * n, bw)
    suite.log(f"copy {copy['tb_per_s']} TB/s; torch cast {res['torch_cast']['tb_per_s']} TB/s; "
              f"triton cast {res['triton_cast']['tb_per_s']} TB/s with {res['triton_cast_config']}")
    perm = torch.randperm(POOL_TOKENS, device=dev)
    out = torch.empty((max(GATHER_ROWS), KV_DIM), dtype=BF16, device=dev)
    rows_64k = perm[:65_536].contiguous()
    res["gather_config"], res["gather_sweep"] = pick_fastest(
        GATHER_SWEEP, kv_cast.GATHER_CONFIG, lambda: gather_cast_fp8_to_bf16(pool, rows_64k, out=out),
        bench_graph_ms)
    n_active = torch.tensor([0], device=dev)
    for m in GATHER_ROWS:
        rows = perm[:m].contiguous()
        n_active.fill_(m)
        moved = 3 * m * KV_DIM  # FP8 rows read + BF16 rows written (row indices not counted)
        # timed as CUDA-graph replays (see bench_graph_ms); eager launch cost is recorded too
        res[f"gather_{m}_torch"] = describe_bandwidth(
            bench_graph_ms(lambda: pool[rows].view(FP8).to(BF16)), moved, bw)
        res[f"gather_{m}_triton"] = describe_bandwidth(
            bench_graph_ms(lambda: gather_cast_fp8_to_bf16(pool, rows, n_active, out=out)), moved, bw)
        res[f"cast_rows_{m}_triton"] = describe_bandwidth(
            bench_graph_ms(lambda: cast_rows_fp8_to_bf16(pool, rows, n_active, dst)), moved, bw)
        res[f"gather_{m}_triton_eager_launch"] = describe_bandwidth(
            bench_ms(lambda: gather_cast_fp8_to_bf16(pool, rows, n_active, out=out)), moved, bw)
        suite.log(f"gather {m} rows: triton {res[f'gather_{m}_triton']['us']} us "
                  f"({res[f'gather_{m}_triton']['tb_per_s']} TB/s), torch {res[f'gather_{m}_torch']['us']} us")
    del pool, src, dst, out, perm
    free_memory()
    return res


# --- stages c, d, e ------------------------------------------------------------------------

def run_config(suite: Suite, state, kv: str, graph: bool, name: str, *, steps: int, with_stack: bool,
               timing_steps: int = 20, warmup: int = 5) -> dict:
    """Build one workload on `state`, write its bundle under bundles/<name>, return its figures."""
    workload = DecodeWorkload(state, kv, cuda_graph=graph)
    try:
        path = run_bench(workload, suite.bundles / name, timing_steps=timing_steps, warmup=warmup,
                         steps=steps, with_stack=with_stack, commit=suite.commit,
                         repo="stepwatch")
    finally:
        workload.release()
        del workload
        free_memory()
    timing = read_bundle(path).timing
    row = {"name": name, "kv": kv, "cuda_graph": graph, "with_stack": with_stack,
           "median_ms": round(timing.median_ms, 3), "p10_ms": round(timing.p10_ms, 3),
           "p90_ms": round(timing.p90_ms, 3), "tok_per_s": round(timing.tok_per_s, 2),
           "trace_bytes": (path / "trace.json.gz").stat().st_size}
    suite.log(f"{name}: {row['median_ms']} ms/step, {row['tok_per_s']} tok/s, trace {row['trace_bytes']} B")
    return row


def run_preset_matrix(suite: Suite) -> dict:
    """Every KV strategy x {eager, graph} on glm5 (tiny on the CPU), with the floor."""
    preset = "glm5" if suite.device.type == "cuda" else "tiny"
    cfg = get_config(preset)
    suite.log(f"building {preset} on {suite.device}")
    t0 = time.monotonic()
    suite.state = build_model(cfg, suite.device)
    if suite.device.type == "cuda":
        torch.cuda.synchronize()
    res: dict = {"preset": preset, "build_s": round(time.monotonic() - t0, 2), "runs": []}
    modes = (False, True) if suite.device.type == "cuda" else (False,)
    for kv in KV_STRATEGIES:
        for graph in modes:
            name = f"{preset}-{kv}-{'graph' if graph else 'eager'}"
            try:
                res["runs"].append(run_config(suite, suite.state, kv, graph, name, steps=2, with_stack=True))
            except Exception as e:
                suite.log(traceback.format_exc())
                res["runs"].append({"name": name, "error": f"{type(e).__name__}: {e}"})
    floor_bytes = count_floor_bytes(cfg)
    res["floor_bytes"] = floor_bytes
    res["weight_bytes"] = count_weight_bytes(cfg)
    if suite.copy_tb_per_s:
        floor_ms = floor_bytes / (suite.copy_tb_per_s * 1e12) * 1000.0
        res["floor_ms"] = round(floor_ms, 3)
        res["copy_tb_per_s"] = suite.copy_tb_per_s
        for run in res["runs"]:
            if "median_ms" in run:
                run["x_floor"] = round(run["median_ms"] / floor_ms, 2)
    by_name = {r["name"]: r for r in res["runs"] if "median_ms" in r}
    full, fused = by_name.get(f"{preset}-full-pool-cast-graph"), by_name.get(f"{preset}-fused-graph")
    if full and fused:
        res["graph_speedup_fused_vs_full"] = round(full["median_ms"] / fused["median_ms"], 2)
    return res


def run_tiny_matrix(suite: Suite) -> dict:
    """Small traces for the trace reader's tests; each should gzip to under 100 KB."""
    runs = []
    modes = (False, True) if suite.device.type == "cuda" else (False,)
    for layers in (None, 2):
        state = build_model(get_config("tiny", layers=layers), suite.device)
        suffix = "" if layers is None else f"-{layers}layers"
        runs_here = []
        for kv in ("full-pool-cast", "fused"):
            for graph in modes:
                for stack in (True, False):
                    name = f"tiny-{kv}-{'graph' if graph else 'eager'}-{'stack' if stack else 'nostack'}{suffix}"
                    runs_here.append(run_config(suite, state, kv, graph, name, steps=3, with_stack=stack,
                                                timing_steps=10, warmup=3))
        del state
        free_memory()
        runs += runs_here
        if all(r["trace_bytes"] < TINY_TRACE_LIMIT_BYTES for r in runs_here):
            break
        suite.log("some tiny traces are over 100 KB: adding a 2-layer set")
    return {"runs": runs, "limit_bytes": TINY_TRACE_LIMIT_BYTES,
            "all_under_limit": all(r["trace_bytes"] < TINY_TRACE_LIMIT_BYTES for r in runs)}


def run_big_trace(suite: Suite) -> dict:
    """glm5 full-pool-cast eager, 30 profiled steps with stack; the trace goes to $OUT directly."""
    if suite.quick:
        return {"skipped": "--quick"}
    if suite.state is None or suite.state.cfg.preset != "glm5":
        return {"skipped": "no glm5 state (stage c failed or ran on the CPU)"}
    if suite.elapsed_s() > suite.budget_s * 0.6:
        return {"skipped": f"over time: {suite.elapsed_s():.0f} s used of {suite.budget_s:.0f} s"}
    name = "big-glm5-fullpool-30steps"
    row = run_config(suite, suite.state, "full-pool-cast", False, name, steps=30, with_stack=True,
                     timing_steps=5, warmup=2)
    target = suite.out / f"{name}.trace.json.gz"
    shutil.move(suite.bundles / name / "trace.json.gz", target)
    row["trace_file"] = target.name
    row["note"] = f"the bundle's trace.json.gz was moved out of bundles/{name}/ to $OUT/{target.name}"
    return row


def release_state(suite: Suite) -> dict:
    suite.state = None
    free_memory()
    return {"freed": True}


# --- stages f, g ---------------------------------------------------------------------------

def run_gpu_tests(suite: Suite) -> dict:
    """The `gpu` tests (tests/test_kernels_gpu.py) through pytest, in a process of their own; without
    pytest on the GPU machine they are reported as not run (the suite does not import test modules)."""
    if importlib.util.find_spec("pytest") is None:
        return {"runner": None, "passed": None, "skipped": "pytest is not installed: the GPU tests were not run"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_kernels_gpu.py", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    return {"runner": "pytest", "returncode": done.returncode, "passed": done.returncode == 0, "tail": tail}


def pack_bundles(suite: Suite) -> dict:
    """tar+gzip $OUT/bundles into $OUT/bundles.tar.gz and delete the folder."""
    target = suite.out / "bundles.tar.gz"
    with tarfile.open(target, "w:gz", compresslevel=6) as tar:
        tar.add(suite.bundles, arcname="bundles")
    names = sorted(p.name for p in suite.bundles.iterdir())
    shutil.rmtree(suite.bundles)
    return {"file": target.name, "bytes": target.stat().st_size, "bundles": names}


# --- report ---------------------------------------------------------------------------------

def format_table(results: dict) -> str:
    """A short plain-text summary of the stages and the headline numbers."""
    lines = ["stage                 ok     seconds"]
    for name, entry in results["stages"].items():
        lines.append(f"{name:<21} {str(entry['ok']):<6} {entry['seconds']:>7}")
    bw = results["stages"].get("b_bandwidth", {}).get("result") or {}
    for key in ("copy_bf16", "torch_cast", "triton_cast", *(f"gather_{m}_{s}" for m in GATHER_ROWS
                                                              for s in ("triton", "torch"))):
        if key in bw:
            row = bw[key]
            lines.append(f"  {key:<24} {row['us']:>10} us {row['tb_per_s']:>7} TB/s "
                         f"{row.get('fraction_of_copy', '')}")
    for stage in ("c_preset_matrix", "d_tiny_bundles", "e_big_trace"):
        res = results["stages"].get(stage, {}).get("result") or {}
        for run in res.get("runs", [res] if "median_ms" in res else []):
            if "median_ms" in run:
                lines.append(f"  {run['name']:<44} {run['median_ms']:>9} ms {run['tok_per_s']:>8} tok/s "
                             f"{str(run['x_floor']) + 'x floor' if 'x_floor' in run else ''}  trace {run['trace_bytes']} B")
        if "floor_ms" in res:
            lines.append(f"  floor: {res['floor_bytes']} B / {res['copy_tb_per_s']} TB/s = {res['floor_ms']} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.studies.gpu_suite", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder ($OUT on the GPU machine)")
    p.add_argument("--quick", action="store_true", help="skip the 30-step big trace")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--commit", help="commit to record in every bundle (default: git rev-parse HEAD)")
    p.add_argument("--budget-s", type=float, default=480.0, help="skip the big trace past 60%% of this")
    p.add_argument("--only", metavar="LETTERS", help="run only these stages, e.g. 'ab' (default: all)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("python -m kernels.studies.gpu_suite: error: --device cuda: CUDA is not available", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suite = Suite(out, torch.device(args.device), args.quick, args.budget_s)
    suite.commit = args.commit or find_commit()
    suite.results["commit"] = suite.commit
    suite.log(f"device {suite.results['device']}; versions {suite.results['versions']}")
    for name, fn in (("a_bit_exact", check_bit_exact), ("b_bandwidth", measure_bandwidth),
                     ("c_preset_matrix", run_preset_matrix), ("d_tiny_bundles", run_tiny_matrix),
                     ("f_gpu_tests", run_gpu_tests), ("e_big_trace", run_big_trace),
                     ("release_state", release_state), ("g_pack", pack_bundles)):
        if args.only and name[0] not in args.only and name != "release_state":
            continue
        suite.run_stage(name, fn)
    suite.results["total_seconds"] = round(suite.elapsed_s(), 1)
    suite.save()
    table = format_table(suite.results)
    suite.log("summary\n" + table)
    return 0 if all(e["ok"] for e in suite.results["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
