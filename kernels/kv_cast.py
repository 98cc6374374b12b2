"""FP8 (e4m3fn) -> BF16 KV-cache kernels: whole-buffer cast, gather-cast and in-place row cast.

Each function is bit-exact against `x.to(torch.bfloat16)` (NaN inputs give NaN). On CUDA with
Triton installed it runs a Triton kernel; otherwise it falls back to torch ops, so the same
call works on the CPU. Pools may be float8_e4m3fn or uint8 (SGLang stores FP8 KV as uint8);
uint8 is viewed as float8_e4m3fn, never converted.

The row kernels read how many rows are active from a 1-element device tensor, so a CUDA graph
captured once stays valid when the batch shrinks: the grid is sized from `rows.numel()` and
programs past `n_active` do nothing.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: kernels/ must import on a CPU-only machine.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    HAS_TRITON = False

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16

# Launch parameters; kernels.gpu_suite re-checks them with a small sweep on each run.
# Whole-buffer cast: 4096 elements per program, 4 warps (97 % of copy bandwidth on the H200).
CAST_CONFIG = {"BLOCK": 4096, "num_warps": 4}
# Gather: whole rows, 8 per program, 4 warps: the best of a sweep on the H200 (kernels/tune_gather.py,
# kernels/BENCHMARKS.md): 80 % of copy bandwidth at 64K random rows, 90 % at 256K.
GATHER_CONFIG = {"ROWS": 8, "num_warps": 4}


if HAS_TRITON:

    @triton.jit
    def _fp8_to_bf16(x):
        """bf16(x); NaN (|bits| == 0x7F) is written 0x7FFF, as torch on CUDA writes it."""
        bits = x.to(tl.uint8, bitcast=True)
        y = x.to(tl.bfloat16).to(tl.int16, bitcast=True)
        y = tl.where((bits & 0x7F) == 0x7F, 0x7FFF, y).to(tl.int16)
        return y.to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _cast_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
        """dst[i] = bf16(src[i]) for i < n_elements; one BLOCK of elements per program."""
        start = tl.program_id(0).to(tl.int64) * BLOCK
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_elements
        x = tl.load(src_ptr + offs, mask=mask, eviction_policy="evict_first")
        tl.store(dst_ptr + offs, _fp8_to_bf16(x), mask=mask)

    @triton.jit
    def _gather_cast_kernel(
        pool_ptr,
        rows_ptr,
        n_active_ptr,
        out_ptr,
        n_rows,
        pool_stride,
        out_stride,
        HAS_N_ACTIVE: tl.constexpr,
        SAME_ROWS: tl.constexpr,
        ROWS: tl.constexpr,
        DIM: tl.constexpr,
        MAIN: tl.constexpr,
        TAIL: tl.constexpr,
    ):
        """out[j] = bf16(pool[rows[i]]) for i < n_active, j = rows[i] if SAME_ROWS else i.

        Each program moves ROWS whole rows: columns [0, MAIN) as one tile (MAIN, a power of
        two, <= DIM) and [MAIN, DIM) as a TAIL-wide tile, so a 576-wide MLA row is a
        512 + 64 pair with no idle lanes. Programs past n_active (read from device memory)
        return at once, which keeps a captured CUDA graph valid for any active count.
        """
        if HAS_N_ACTIVE:
            n = tl.minimum(tl.load(n_active_ptr).to(tl.int64), n_rows)
        else:
            n = n_rows
        first = tl.program_id(0).to(tl.int64) * ROWS
        if first < n:
            i = first + tl.arange(0, ROWS)
            row_mask = (i < n)[:, None]
            r = tl.load(rows_ptr + i, mask=i < n, other=0).to(tl.int64)
            if SAME_ROWS:
                o = r
            else:
                o = i
            src = pool_ptr + r[:, None] * pool_stride
            dst = out_ptr + o[:, None] * out_stride
            a = tl.arange(0, MAIN)[None, :]
            tl.store(dst + a, _fp8_to_bf16(tl.load(src + a, mask=row_mask)), mask=row_mask)
            if TAIL > 0:
                b = MAIN + tl.arange(0, TAIL)[None, :]
                if MAIN + TAIL == DIM:  # e.g. 576 = 512 + 64: only whole rows are masked
                    tail_mask = row_mask
                else:
                    tail_mask = row_mask & (b < DIM)
                tl.store(dst + b, _fp8_to_bf16(tl.load(src + b, mask=tail_mask)), mask=tail_mask)


def _use_triton(tensor: torch.Tensor, backend: str) -> bool:
    if backend == "torch":
        return False
    if backend == "triton":
        if not HAS_TRITON:
            raise RuntimeError("backend='triton': triton is not installed")
        return True
    if backend != "auto":
        raise ValueError(f"backend: {backend!r}, expected 'auto', 'triton' or 'torch'")
    return HAS_TRITON and tensor.is_cuda


def _as_fp8(name: str, x: torch.Tensor) -> torch.Tensor:
    """Return `x` viewed as float8_e4m3fn; uint8 is reinterpreted, anything else is an error."""
    if x.dtype == torch.uint8:
        return x.view(FP8)
    if x.dtype != FP8:
        raise ValueError(f"{name}: dtype {x.dtype}, expected torch.float8_e4m3fn or torch.uint8")
    return x


def _as_pool_2d(pool: torch.Tensor) -> torch.Tensor:
    """Return the pool as [tokens, dim] FP8 with unit column stride (SGLang's is [N, 1, 576])."""
    pool = _as_fp8("pool", pool)
    if pool.dim() < 2:
        raise ValueError(f"pool: {pool.dim()} dims, expected [tokens, dim] or [tokens, 1, dim]")
    pool = pool.reshape(pool.shape[0], -1)
    if pool.stride(1) != 1:
        raise ValueError("pool: the last dimension must be contiguous")
    return pool


def _check_rows(rows: torch.Tensor, n_active: torch.Tensor | None, pool: torch.Tensor) -> None:
    if rows.dtype not in (torch.int32, torch.int64) or rows.dim() != 1:
        raise ValueError(f"rows: dtype {rows.dtype}, {rows.dim()} dims; expected 1-D int32 or int64")
    if rows.device != pool.device:
        raise ValueError(f"rows: on {rows.device}, pool on {pool.device}")
    if n_active is not None:
        if n_active.numel() != 1 or n_active.dtype not in (torch.int32, torch.int64):
            raise ValueError("n_active: expected a 1-element int32 or int64 tensor")
        if n_active.device != pool.device:
            raise ValueError(f"n_active: on {n_active.device}, pool on {pool.device}")


def _count_active(rows: torch.Tensor, n_active: torch.Tensor | None) -> int:
    """Host-side active row count for the torch fallback (syncs; not CUDA-graph safe)."""
    if n_active is None:
        return rows.numel()
    return max(0, min(int(n_active.reshape(()).item()), rows.numel()))


def cast_fp8_to_bf16(
    src: torch.Tensor, out: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """Cast a whole FP8 (or uint8-stored FP8) buffer to BF16; returns `out` (same shape)."""
    src = _as_fp8("src", src)
    if out is None:
        out = torch.empty(src.shape, dtype=BF16, device=src.device)
    if out.dtype != BF16 or out.shape != src.shape or out.device != src.device:
        raise ValueError(f"out: {out.dtype} {tuple(out.shape)} on {out.device}, expected "
                         f"bfloat16 {tuple(src.shape)} on {src.device}")
    if not _use_triton(src, backend):
        out.copy_(src)
        return out
    if not (src.is_contiguous() and out.is_contiguous()):
        raise ValueError("src/out: the Triton cast needs contiguous buffers")
    n = src.numel()
    if n:
        block = CAST_CONFIG["BLOCK"]
        _cast_kernel[(triton.cdiv(n, block),)](
            src, out, n, BLOCK=block, num_warps=CAST_CONFIG["num_warps"]
        )
    return out


def _launch_gather(pool2d, rows, n_active, out2d, same_rows: bool) -> None:
    m = rows.numel()
    if m == 0:
        return
    cfg = GATHER_CONFIG
    dim = pool2d.shape[1]
    main = 1 << (dim.bit_length() - 1)  # the largest power of two <= dim
    tail = triton.next_power_of_2(dim - main) if dim > main else 0
    _gather_cast_kernel[(triton.cdiv(m, cfg["ROWS"]),)](
        pool2d,
        rows,
        n_active if n_active is not None else rows,  # unused when HAS_N_ACTIVE is False
        out2d,
        m,
        pool2d.stride(0),
        out2d.stride(0),
        HAS_N_ACTIVE=n_active is not None,
        SAME_ROWS=same_rows,
        ROWS=cfg["ROWS"],
        DIM=dim,
        MAIN=main,
        TAIL=tail,
        num_warps=cfg["num_warps"],
    )


def gather_cast_fp8_to_bf16(
    pool: torch.Tensor,
    rows: torch.Tensor,
    n_active: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """out[i] = bf16(pool[rows[i]]) for i < n_active (all of `rows` when None); returns out.

    pool: [tokens, dim] (or [tokens, 1, dim]) FP8 or uint8; rows: 1-D int32/int64 [M];
    n_active: 1-element int32/int64 tensor on the pool's device, read inside the kernel;
    out: [M, dim] BF16 (allocated when None). Rows i >= n_active of `out` are left untouched.
    """
    pool2d = _as_pool_2d(pool)
    _check_rows(rows, n_active, pool2d)
    m, dim = rows.numel(), pool2d.shape[1]
    if out is None:
        out = torch.empty((m, dim), dtype=BF16, device=pool2d.device)
    if out.dtype != BF16 or out.dim() != 2 or out.shape[0] < m or out.shape[1] != dim:
        raise ValueError(f"out: {out.dtype} {tuple(out.shape)}, expected bfloat16 [>={m}, {dim}]")
    if out.stride(1) != 1:
        raise ValueError("out: the last dimension must be contiguous")
    if _use_triton(pool2d, backend):
        _launch_gather(pool2d, rows, n_active, out, same_rows=False)
        return out
    n = _count_active(rows, n_active)
    out[:n] = pool2d[rows[:n]].to(BF16)
    return out


def cast_rows_fp8_to_bf16(
    pool: torch.Tensor,
    rows: torch.Tensor,
    n_active: torch.Tensor | None,
    out: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """out[rows[i]] = bf16(pool[rows[i]]) for i < n_active: refresh only the referenced rows.

    `out` is a persistent BF16 scratch with the pool's [tokens, dim] shape, so indices planned
    against the whole pool stay valid; rows not referenced keep their old contents. Returns out.
    """
    pool2d = _as_pool_2d(pool)
    _check_rows(rows, n_active, pool2d)
    if out.dtype != BF16 or out.dim() < 2 or out.numel() != pool2d.numel() or not out.is_contiguous():
        raise ValueError(f"out: {out.dtype} {tuple(out.shape)}, expected contiguous bfloat16 "
                         f"with the pool's shape {tuple(pool2d.shape)}")
    out2d = out.view(pool2d.shape)
    if _use_triton(pool2d, backend):
        _launch_gather(pool2d, rows, n_active, out2d, same_rows=True)
        return out
    n = _count_active(rows, n_active)
    index = rows[:n]
    out2d[index] = pool2d[index].to(BF16)
    return out
