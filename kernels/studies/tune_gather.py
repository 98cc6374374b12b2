"""Tuning study for the FP8 -> BF16 gather-cast (run on the GPU; prints a table, writes JSON).

    python -m kernels.studies.tune_gather --out DIR

For 65,536 and 262,144 rows of a 495,000 x 576 FP8 pool, in random and in ascending order, it
times: the device-to-device copy (the ceiling), a plain FP8 row gather with no cast (what random
576-byte rows cost the memory system by themselves), torch's index + .to, and variants of the
Triton gather-cast. Bytes moved = rows x 576 read + rows x 1152 written (the gather copy: read +
write of 576 each). Every Triton variant is checked bit for bit against torch first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench, do_bench_cudagraph

from kernels.kv_cast import GATHER_CONFIG, _fp8_to_bf16, gather_cast_fp8_to_bf16

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
POOL, DIM = 495_000, 576


@triton.jit
def _split_row_kernel(pool_ptr, rows_ptr, out_ptr, n_rows, ROWS: tl.constexpr, EVICT: tl.constexpr):
    """Whole 576-wide rows as a 512-wide and a 64-wide tile (no masked columns)."""
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    m = i < n_rows
    r = tl.load(rows_ptr + i, mask=m, other=0).to(tl.int64)
    src = pool_ptr + r[:, None] * 576
    dst = out_ptr + i[:, None] * 576
    a = tl.arange(0, 512)[None, :]
    b = 512 + tl.arange(0, 64)[None, :]
    if EVICT:
        xa = tl.load(src + a, mask=m[:, None], eviction_policy="evict_first")
        xb = tl.load(src + b, mask=m[:, None], eviction_policy="evict_first")
        tl.store(dst + a, _fp8_to_bf16(xa), mask=m[:, None], cache_modifier=".cs")
        tl.store(dst + b, _fp8_to_bf16(xb), mask=m[:, None], cache_modifier=".cs")
    else:
        xa = tl.load(src + a, mask=m[:, None])
        xb = tl.load(src + b, mask=m[:, None])
        tl.store(dst + a, _fp8_to_bf16(xa), mask=m[:, None])
        tl.store(dst + b, _fp8_to_bf16(xb), mask=m[:, None])


@triton.jit
def _persistent_kernel(pool_ptr, rows_ptr, out_ptr, n_rows, iters, ROWS: tl.constexpr):
    """A fixed grid that strides over row tiles (fewer, longer-lived programs)."""
    a = tl.arange(0, 512)[None, :]
    b = 512 + tl.arange(0, 64)[None, :]
    for k in range(0, iters):
        t = tl.program_id(0).to(tl.int64) + k * tl.num_programs(0)
        i = t * ROWS + tl.arange(0, ROWS)
        m = i < n_rows
        r = tl.load(rows_ptr + i, mask=m, other=0).to(tl.int64)
        src = pool_ptr + r[:, None] * 576
        dst = out_ptr + i[:, None] * 576
        xa = tl.load(src + a, mask=m[:, None], eviction_policy="evict_first")
        xb = tl.load(src + b, mask=m[:, None], eviction_policy="evict_first")
        tl.store(dst + a, _fp8_to_bf16(xa), mask=m[:, None], cache_modifier=".cs")
        tl.store(dst + b, _fp8_to_bf16(xb), mask=m[:, None], cache_modifier=".cs")


@triton.jit
def _gather_copy_kernel(pool_ptr, rows_ptr, out_ptr, n_rows, ROWS: tl.constexpr):
    """The same access pattern with no cast: FP8 rows copied to an FP8 output."""
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    m = i < n_rows
    r = tl.load(rows_ptr + i, mask=m, other=0).to(tl.int64)
    a = tl.arange(0, 512)[None, :]
    b = 512 + tl.arange(0, 64)[None, :]
    tl.store(out_ptr + i[:, None] * 576 + a, tl.load(pool_ptr + r[:, None] * 576 + a, mask=m[:, None]), mask=m[:, None])
    tl.store(out_ptr + i[:, None] * 576 + b, tl.load(pool_ptr + r[:, None] * 576 + b, mask=m[:, None]), mask=m[:, None])


def time_us(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def time_graph_us(fn) -> float:
    """Replayed from a CUDA graph, so Python's launch cost is not what gets measured."""
    return float(do_bench_cudagraph(fn, rep=200, return_mode="median")) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    pool_u8 = torch.randint(0, 256, (POOL, DIM), dtype=torch.uint8, device=dev, generator=gen)
    pool_u8[pool_u8 & 0x7F == 0x7F] = 0  # finite data
    pool = pool_u8.view(FP8)
    big = torch.empty(POOL * DIM * 2, dtype=torch.uint8, device=dev)
    big2 = torch.empty_like(big)
    copy_us = time_us(lambda: big2.copy_(big))
    copy_tbs = 2 * big.numel() / copy_us / 1e6
    results = {"copy_us": copy_us, "copy_tb_per_s": copy_tbs, "rows": []}
    print(f"copy: {copy_us:.1f} us, {copy_tbs:.3f} TB/s")
    for n in (65_536, 262_144):
        for order in ("random", "sorted"):
            rows = torch.randperm(POOL, device=dev, generator=gen)[:n]
            if order == "sorted":
                rows = rows.sort().values
            want = pool[rows].to(BF16)
            out = torch.empty(n, DIM, dtype=BF16, device=dev)
            out8 = torch.empty(n, DIM, dtype=torch.uint8, device=dev)
            cast_bytes, copy_bytes = n * DIM * 3, n * DIM * 2
            cands = {
                "torch index+to": (lambda: pool[rows].to(BF16), cast_bytes, None),
                f"current {GATHER_CONFIG}": (lambda: gather_cast_fp8_to_bf16(pool, rows, out=out, backend="triton"),
                                              cast_bytes, out),
            }
            for R in (4, 8, 16, 32):
                for w in (4, 8):
                    for ev in (False, True):
                        cands[f"split R{R} w{w} evict{int(ev)}"] = (
                            (lambda R=R, w=w, ev=ev: _split_row_kernel[(triton.cdiv(n, R),)](
                                pool, rows, out, n, ROWS=R, EVICT=ev, num_warps=w)), cast_bytes, out)
            for R, progs in ((8, 132 * 8), (16, 132 * 4), (16, 132 * 8)):
                grid = min(progs, triton.cdiv(n, R))
                cands[f"persistent R{R} p{progs}"] = (
                    (lambda R=R, grid=grid: _persistent_kernel[(grid,)](
                        pool, rows, out, n, triton.cdiv(triton.cdiv(n, R), grid), ROWS=R, num_warps=8)),
                    cast_bytes, out)
            cands["gather copy (no cast) R16"] = (
                lambda: _gather_copy_kernel[(triton.cdiv(n, 16),)](pool_u8, rows, out8, n, ROWS=16, num_warps=8),
                copy_bytes, None)
            for name, (fn, nbytes, dst) in cands.items():
                try:
                    row = measure(name, fn, nbytes, dst, want, n, order, copy_tbs)
                except Exception as e:  # one broken variant must not hide the others
                    row = {"rows": n, "order": order, "variant": name, "error": f"{type(e).__name__}: {e}"[:300]}
                    print(f"{n:>7} {order:6} {name:32} ERROR {row['error']}")
                results["rows"].append(row)
    Path(args.out, "tune_gather.json").write_text(json.dumps(results, indent=1))


def measure(name, fn, nbytes, dst, want, n, order, copy_tbs) -> dict:
    """Check one variant bit for bit (when it writes BF16 rows), then time it."""
    exact = None
    if dst is not None:
        dst.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        exact = torch.equal(dst.view(torch.int16), want.view(torch.int16))
    us = time_graph_us(fn)
    tbs = nbytes / us / 1e6
    print(f"{n:>7} {order:6} {name:32} {us:8.2f} us {tbs:6.3f} TB/s {tbs / copy_tbs:6.3f} exact={exact}")
    return {"rows": n, "order": order, "variant": name, "us": round(us, 2), "tb_per_s": round(tbs, 3),
            "of_copy": round(tbs / copy_tbs, 3), "bit_exact": exact}


if __name__ == "__main__":
    main()
