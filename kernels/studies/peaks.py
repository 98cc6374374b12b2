"""The GPU's ceilings, measured: `python -m kernels.studies.peaks --out DIR` (prints JSON, writes DIR/peaks.json).

What the roofline (ingest/traces/costs.py, devices.toml) divides achieved rates by, measured on the
card itself rather than taken from its datasheet (METHOD.md: datasheet rates are leads):

- dense GEMM TFLOP/s at large square sizes (2*N^3 FLOPs a product) for BF16 (`torch.mm`), FP8 e4m3
  (`torch._scaled_mm`, BF16 out, per-tensor scales), FP32 with TF32 off (`highest`) and on (`high`);
- device-to-device copy bandwidth, TB/s counting bytes read plus bytes written (`dst.copy_(src)`).

Inputs are random (never zeros: a BF16 product ran 13 % faster on zeros on an H200 here). Each figure
is the median of `--reps` timed calls (CUDA events around each) after warm-up; the inputs are several
times the L2, so no call is served from cache. Each GEMM is checked against a reference
(‖out − ref‖ / ‖ref‖) so that a fast wrong path cannot pass as a peak. torch only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def _time_ms(fn, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def measure_gemm(kind: str, n: int, reps: int, device: torch.device) -> dict:
    """TFLOP/s of one n x n x n product of `kind` (bf16, fp8, fp32, tf32), median of `reps`."""
    gen = torch.Generator(device=device).manual_seed(n)
    a32 = torch.randn((n, n), generator=gen, device=device)
    b32 = torch.randn((n, n), generator=gen, device=device)
    precision = torch.get_float32_matmul_precision()
    try:
        if kind == "bf16":
            a, b = a32.to(torch.bfloat16), b32.to(torch.bfloat16)
            fn = lambda: torch.mm(a, b)  # noqa: E731
            ref_a, ref_b = a.float(), b.float()
        elif kind == "fp8":
            a = a32.to(torch.float8_e4m3fn)
            b = b32.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
            one = torch.ones((), device=device)
            fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            ref_a, ref_b = a.float(), b.float()
        elif kind in ("fp32", "tf32"):
            torch.set_float32_matmul_precision("highest" if kind == "fp32" else "high")
            a, b = a32, b32
            fn = lambda: torch.mm(a, b)  # noqa: E731
            ref_a, ref_b = a32, b32
        else:
            raise ValueError(kind)
        times = _time_ms(fn, reps)
        out = fn().float()
        torch.set_float32_matmul_precision("highest")
        rows = slice(0, 256)  # the reference on a slice of rows: FP32 "highest" on the GPU, checked in float64
        error = _rel_error(out[rows], ref_a[rows].double() @ ref_b.double())
    finally:
        torch.set_float32_matmul_precision(precision)
    ms = statistics.median(times)
    return {"kind": kind, "n": n, "flops": 2 * n ** 3, "median_ms": ms, "tflops": 2 * n ** 3 / ms / 1e9,
            "min_ms": min(times), "max_ms": max(times), "reps": reps, "rel_error": error}


def measure_copy(gib: float, reps: int, device: torch.device) -> dict:
    """TB/s of dst.copy_(src) over `gib` GiB, bytes read plus bytes written, median of `reps`."""
    n = int(gib * 2 ** 30)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = _time_ms(lambda: dst.copy_(src), reps)
    if not torch.equal(dst, src):
        raise RuntimeError("copy check failed: dst differs from src")
    ms = statistics.median(times)
    return {"kind": "d2d_copy", "bytes_read_plus_written": 2 * n, "median_ms": ms, "tbps": 2 * n / ms / 1e9,
            "min_ms": min(times), "max_ms": max(times), "reps": reps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="directory for peaks.json")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sizes", default="8192,16384", help="square GEMM sizes, comma-separated")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the peaks are measured on the GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    result = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "gemm": [], "copy": []}
    for kind in ("bf16", "fp8", "tf32", "fp32"):
        for n in (int(s) for s in args.sizes.split(",")):
            if kind == "fp32" and n > 8192:
                continue  # 16384^3 in plain FP32 is 0.2 s a call: the 8192 figure is the ceiling already
            result["gemm"].append(measure_gemm(kind, n, args.reps, device))
            torch.cuda.empty_cache()
    for gib in (1.0, 4.0):
        result["copy"].append(measure_copy(gib, args.reps, device))
    best = {}
    for g in result["gemm"]:
        best[f"{g['kind']}_tflops"] = max(best.get(f"{g['kind']}_tflops", 0.0), g["tflops"])
    best["copy_tbps"] = max(c["tbps"] for c in result["copy"])
    result["best"] = best
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peaks.json").write_text(text + "\n")
    print(text)
    print("best:", json.dumps({k: round(v, 1) for k, v in best.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
