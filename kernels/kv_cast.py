"""FP8 (e4m3fn) -> BF16 KV-cache kernels: whole-buffer cast, gather-cast and in-place row cast.

Each function is bit-exact against `x.to(torch.bfloat16)` (NaN inputs give NaN). On CUDA with
Triton installed it runs a Triton kernel; otherwise it falls back to torch ops, so the same
call works on the CPU. Pools may be float8_e4m3fn or uint8 (SGLang stores FP8 KV as uint8);
uint8 is viewed as float8_e4m3fn, never converted.

The row kernels read how many rows are active from a 1-element device tensor, so a CUDA graph
captured once stays valid when the batch shrinks: the grid is sized from `rows.numel()` and
programs past `n_active` do nothing.

The live-row kernels (the end of this file) are what a serving engine needs under CUDA graphs,
where the buffers are sized for the largest batch a graph was captured for: a bounded grid
(about `PROGRAMS_PER_SM` programs per SM) whose programs loop up to the live count read on the
device, so their cost follows the live rows, not the captured buffers; they write the rows
compacted to the front of a scratch that is at most as large as the pool. The SGLang patch in
`kernels/patches/` carries a verbatim copy of them.
"""

from __future__ import annotations

import functools

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

# Launch parameters; kernels.studies.gpu_suite re-checks them with a small sweep on each run.
# Whole-buffer cast: 4096 elements per program, 4 warps (97 % of copy bandwidth on the H200).
CAST_CONFIG = {"BLOCK": 4096, "num_warps": 4}
# Gather: whole rows, 8 per program, 4 warps: the best of a sweep on the H200 (kernels/studies/tune_gather.py,
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
            r = tl.load(rows_ptr + i, mask=i < n, other=0).to(tl.int64)
            if SAME_ROWS:
                o = r
            else:
                o = i
            _move_rows(pool_ptr, out_ptr, r, o, i < n, pool_stride, out_stride, DIM, MAIN, TAIL)

    @triton.jit
    def _move_rows(pool_ptr, out_ptr, src, dst, mask, pool_stride, out_stride,
                   DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr):
        """out[dst[k]] = bf16(pool[src[k]]) where mask[k]: whole rows, a MAIN and a TAIL tile."""
        m = mask[:, None]
        s = pool_ptr + src.to(tl.int64)[:, None] * pool_stride
        d = out_ptr + dst.to(tl.int64)[:, None] * out_stride
        a = tl.arange(0, MAIN)[None, :]
        tl.store(d + a, _fp8_to_bf16(tl.load(s + a, mask=m)), mask=m)
        if TAIL > 0:
            b = MAIN + tl.arange(0, TAIL)[None, :]
            if MAIN + TAIL == DIM:  # e.g. 576 = 512 + 64: only whole rows are masked
                tail_mask = m
            else:
                tail_mask = m & (b < DIM)
            tl.store(d + b, _fp8_to_bf16(tl.load(s + b, mask=tail_mask)), mask=tail_mask)


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


# --- Live-row kernels: a bounded grid whose cost follows the live rows ---------------------
#
# Under CUDA graphs every buffer is sized for the captured maximum (SGLang: max_bs x
# max_context_len kv indices, a [bs, max_pages] page table), and a grid sized from them costs
# time in every idle program. These kernels launch a fixed grid of at most PROGRAMS_PER_SM
# programs per SM that loop (grid stride) up to the live count read on the device, so a graph
# captured once is correct and cheap for any count. They write the live rows compacted to the
# front of the scratch (contiguous writes move 82-88 % of the copy bandwidth, scattered ones
# 66-70 %, kernels/BENCHMARKS.md) and publish where each row went: the rows path rewrites the
# caller's row-id buffer to 0..n-1, the pages path writes a compacted page table.
#
# Capacity: the scratch holds `capacity` entries (rows, or pages of PAGE rows). A batch whose
# requests share prefix pages can reference more entries than the pool has; when the live
# count exceeds the capacity the kernels cast at their own positions instead (the caller then
# sizes the scratch like the pool): the rows path the referenced rows, leaving the row ids as
# they are; the pages path the whole pool, its table keeping the original page numbers.
#
# The pages path is two kernels: the plan (live page list, count, compacted table), which reads
# the table and lengths only, and the gather, which reads a layer's pool through the plan; a
# serving engine plans once per forward and gathers in every layer (kernels/BENCHMARKS.md
# section 6: the plan in every layer cost 2-4 us a layer, cold, at every grid point).

# Bounded grid: compact gathers move CHUNKS pieces of VEC elements per loop iteration, positional
# ones ROWS whole rows; kernels.studies.serving_grid sweeps these on the GPU (kernels/BENCHMARKS.md
# section 6). ROWS 4: the rows path's positional (overflow) tiles of whole rows set the kernel's
# registers; with 4 rows every path compiles to 32-34 (pieces of 8) or 39-40 registers, with 16 to 40-48.
# IDS_EVICT "evict_last": the count and row-id loads ask L2 to keep those lines, which every layer
# of a step reads again (the pool rows and the scratch are each layer's own); on the H200 the later
# layers then find them in L2 through the 256 MB written between calls (kernels.studies.step_study).
# Only the live entries' lines are so marked: 4 bytes a live row (or page), 4 MB at 1M live rows.
# Pieces of 16 at 256 a block, 4 warps: Triton loads 16 FP8 a thread and stores 8 BF16 a thread, so
# the values cross threads through shared memory; pieces of 8 (1,024 a block, 8 warps) avoid that
# and are 1-2.5 % faster from 131K live rows up, but 0.1-0.3 us slower at 8K-32K live rows, where
# the gather is furthest from the copy bandwidth (2026-12-01, session 10, both measured in one run).
LIVE_CONFIG = {"ROWS": 4, "CHUNKS": 256, "VEC": 16, "PROGRAMS_PER_SM": 32, "num_warps": 4, "IDS_EVICT": "evict_last"}
# Page-table index kernel: one program row per request, SPLIT programs each, BLOCK entries a step.
PAGE_INDEX_CONFIG = {"BLOCK": 1024, "SPLIT": 8, "num_warps": 4}


@functools.lru_cache(maxsize=None)
def _count_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _live_programs(device: torch.device, blocks: int) -> int:
    """Programs of the bounded grid: at most PROGRAMS_PER_SM per SM (4 under the interpreter)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        limit = _count_sms(index) * LIVE_CONFIG["PROGRAMS_PER_SM"]
    else:
        limit = 4
    return max(1, min(blocks, limit))


def _piece(dim: int, most: int) -> int:
    """The compact gather's piece: the largest power of two <= most that divides dim."""
    vec = 1
    while vec * 2 <= most and dim % (vec * 2) == 0:
        vec *= 2
    return vec


def _row_tiles(dim: int) -> tuple[int, int]:
    """(MAIN, TAIL): a power-of-two tile and the power-of-two tile covering the rest of a row."""
    main = 1 << (dim.bit_length() - 1)
    tail = 1 << (dim - main - 1).bit_length() if dim > main else 0
    return main, tail


if HAS_TRITON:

    @triton.jit
    def _gather_live_kernel(
        pool_ptr,
        rows_ptr,
        index_ptr,
        count_ptr,
        out_ptr,
        n_max,
        capacity,
        pool_stride,
        out_stride,
        PAGE: tl.constexpr,
        WRITE_INDEX: tl.constexpr,
        ROWS: tl.constexpr,
        CHUNKS: tl.constexpr,
        VEC: tl.constexpr,
        INDEX_ROWS: tl.constexpr,
        DIM: tl.constexpr,
        MAIN: tl.constexpr,
        TAIL: tl.constexpr,
        OFFSETS_32: tl.constexpr,
        IDS_EVICT: tl.constexpr,
    ):
        """Compact gather-cast of n = min(count[0], n_max) live entries, with a bounded grid.

        n <= capacity: out[t] = bf16(pool[rows[t // PAGE] * PAGE + t % PAGE]) for t < n * PAGE
        (an entry is a row, or a page of PAGE rows), and with WRITE_INDEX index[t] = t.
        n > capacity, WRITE_INDEX (rows): out[index[i]] = bf16(pool[index[i]]) for i < n, rows cast
        at their own positions into a pool-shaped out; index is left as it is.
        n > capacity, no WRITE_INDEX (pages): out[t] = bf16(pool[t]) for every t < capacity * PAGE,
        the whole pool cast at its own positions (out is pool-shaped: more pages are referenced
        than the pool has, so this moves no more than a cast of the referenced pages would), in
        pieces as a contiguous cast (0.91 of the copy bandwidth on the H200; in whole-row blocks
        of ROWS, 0.80).

        Compact: the live rows are cut into VEC-element pieces, piece k = (row t, column c) with
        t = k // (DIM // VEC); program p moves pieces [base, base + CHUNKS) for base = p * CHUNKS,
        p * CHUNKS + G * CHUNKS, ... (G programs), so reads and writes run as in a contiguous cast
        (out is contiguous; a row's pieces are contiguous in the pool), with the row id looked up
        per piece. Positional (rows path): blocks of ROWS whole rows, program p taking blocks p,
        p + G, ... Nothing past n is touched.

        OFFSETS_32: the compact path computes piece numbers, row numbers and element offsets in
        int32 (the launcher sets it only when every one of them fits, see _fits_int32), int64
        otherwise (pools or scratches of 2**31 elements or more). int32 takes fewer registers and
        address instructions (kernels/BENCHMARKS.md section 6).
        IDS_EVICT: the L2 eviction policy of the count and row-id loads ("evict_last": every layer
        of a step reads the same ones, kernels/BENCHMARKS.md section 6), "" for the default.
        """
        n = tl.minimum(tl.load(count_ptr, eviction_policy=IDS_EVICT).to(tl.int64), n_max)
        base = tl.program_id(0) * CHUNKS
        if OFFSETS_32:
            n = n.to(tl.int32)
        else:
            base = base.to(tl.int64)
        # k, t and v are made before the loop and k, t advanced at its end: computed at the top of
        # the loop instead, the same code takes 42-48 registers on sm_90 (5 programs per SM, not 6).
        k = base + tl.arange(0, CHUNKS)
        t = k // (DIM // VEC)
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * (DIM // VEC))
            step = tl.num_programs(0) * CHUNKS
            while base < n_pieces:
                mask = k < n_pieces
                if PAGE == 1:  # the pool row of each piece, in the offsets' type (t's)
                    src = tl.load(rows_ptr + t, mask=mask, other=0, eviction_policy=IDS_EVICT).to(t.dtype)
                else:
                    src = (tl.load(rows_ptr + t // PAGE, mask=mask, other=0, eviction_policy=IDS_EVICT).to(t.dtype)
                           * PAGE + t % PAGE)
                c = (k % (DIM // VEC)) * VEC
                m = mask[:, None]
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=m)
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=m)
                if WRITE_INDEX:  # index[t] = t for the rows whose first piece is in this block
                    first = tl.cdiv(base, DIM // VEC)
                    end = tl.cdiv(tl.minimum(base + CHUNKS, n_pieces), DIM // VEC)
                    tt = first + tl.arange(0, INDEX_ROWS)
                    tl.store(index_ptr + tt, tt, mask=tt < end)
                base += step
                k = base + tl.arange(0, CHUNKS)
                t = k // (DIM // VEC)
        elif WRITE_INDEX:  # the rows path: the live rows cast at their own positions, ROWS whole rows a block
            step = tl.num_programs(0)
            blk = tl.program_id(0).to(tl.int64)
            n_blocks = tl.cdiv(n, ROWS)
            while blk < n_blocks:
                i = blk * ROWS + tl.arange(0, ROWS)
                mask = i < n
                src = tl.load(index_ptr + i, mask=mask, other=0).to(tl.int64)
                _move_rows(pool_ptr, out_ptr, src, src, mask, pool_stride, out_stride, DIM, MAIN, TAIL)
                blk += step
        else:  # the pages paths: every pool row at its own position, in pieces as a contiguous cast
            n_pieces = tl.minimum(n, capacity) * (PAGE * (DIM // VEC))
            step = tl.num_programs(0) * CHUNKS
            while base < n_pieces:
                mask = k < n_pieces
                c = (k % (DIM // VEC)) * VEC
                m = mask[:, None]
                x = tl.load(pool_ptr + (t * pool_stride + c)[:, None] + v, mask=m)
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=m)
                base += step
                k = base + tl.arange(0, CHUNKS)
                t = k // (DIM // VEC)

    @triton.jit
    def _copy_live_kernel(src_ptr, count_ptr, dst_ptr, n_max, BLOCK: tl.constexpr):
        """dst[i] = src[i] for i < min(count[0], n_max), with a bounded grid."""
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max)
        step = tl.num_programs(0)
        blk = tl.program_id(0).to(tl.int64)
        n_blocks = tl.cdiv(n, BLOCK)
        while blk < n_blocks:
            i = blk * BLOCK + tl.arange(0, BLOCK)
            tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)
            blk += step

    @triton.jit
    def _index_pages_kernel(
        table_ptr,
        ends_ptr,
        flat_ptr,
        count_ptr,
        table_out_ptr,
        bs,
        width,
        table_stride,
        table_out_stride,
        capacity,
        PAGE: tl.constexpr,
        ZERO_TAIL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """The compacted page plan of request b = program_id(0) (axis 1 splits its pages).

        Request b reads pages table[b, :np_b], np_b = min(cdiv(seq_lens[b], PAGE), width);
        ends[b] = np_0 + ... + np_b (the launcher's cumsum), so start_b = ends[b - 1] and
        total = ends[bs - 1]: each program reads two or three lengths, not all bs of them.
        Program (0, 0) writes total to count[0].
        total <= capacity: flat[start_b + j] = table[b, j] and table_out[b, j] = start_b + j,
        for _gather_live_kernel to cast flat's pages into the front of out.
        total > capacity: table_out[b, j] = table[b, j] (flat is not written), and
        _gather_live_kernel casts the whole pool at its own positions (out is pool-shaped).
        Entries j >= np_b of table_out: ZERO_TAIL writes 0 there (SGLang's rule for a fresh,
        torch.empty table: the tail points at page 0, its padding page), otherwise they are not
        touched (a caller-owned table refreshed in place keeps what it had). The plan depends on
        the table and the lengths only, not on a layer's pool: one plan serves every layer.
        """
        b = tl.program_id(0)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        end = tl.load(ends_ptr + b)
        start = tl.where(b > 0, tl.load(ends_ptr + tl.maximum(b - 1, 0)), 0)
        total = tl.load(ends_ptr + bs - 1)
        n_b = end - start
        if (b == 0) & (part == 0):
            tl.store(count_ptr, total)
        row = table_ptr + b.to(tl.int64) * table_stride
        row_out = table_out_ptr + b.to(tl.int64) * table_out_stride
        blk = part.to(tl.int64)
        if ZERO_TAIL:
            n_blocks = tl.cdiv(width, BLOCK)
        else:
            n_blocks = tl.cdiv(n_b, BLOCK)
        compact = total <= capacity
        while blk < n_blocks:
            j = blk * BLOCK + tl.arange(0, BLOCK)
            live = j < n_b
            written = (j < width) if ZERO_TAIL else live
            page = tl.load(row + j, mask=live, other=0)
            if compact:
                tl.store(flat_ptr + start + j, page, mask=live)
                tl.store(row_out + j, tl.where(live, start + j, 0), mask=written)
            else:
                tl.store(row_out + j, page, mask=written)
            blk += parts


def _fits_int32(pool2d, out2d, n_max: int, most_rows: int, pieces: int, chunks: int, programs: int) -> bool:
    """Whether every value _gather_live_kernel's compact path computes fits in int32 (OFFSETS_32).

    Those are the live count (<= n_max); piece numbers, which run one grid step and one block
    ((programs + 1) x chunks pieces) past the last of the most_rows x pieces live pieces; row
    numbers, up to a block's rows past the last piece's row (the rewritten index's included); and
    the element offsets they give, row x row stride + column, into pool and out. Shapes only.
    """
    most_pieces = most_rows * pieces + (programs + 1) * chunks
    most_row_numbers = most_pieces // pieces + chunks + 1
    dim = pool2d.shape[1]
    pool_end = pool2d.shape[0] * max(pool2d.stride(0), dim)
    out_end = max(most_row_numbers, out2d.shape[0]) * max(out2d.stride(0), dim)
    return max(n_max, most_pieces, pool_end, out_end) < 2**31


def _launch_gather_live(pool2d, rows, index, count, out2d, n_max: int, capacity: int, page: int,
                        offsets_32: bool | None = None) -> None:
    """Launch _gather_live_kernel on [tokens, dim] views; the grid depends on shapes only.

    offsets_32: int32 offsets in the compact path; None (callers) chooses them whenever
    _fits_int32 says they fit; True or False forces one (the tests run both).
    """
    cfg = LIVE_CONFIG
    dim = pool2d.shape[1]
    main, tail = _row_tiles(dim)
    most_rows = min(n_max, capacity) * page
    if index is not None:
        most_rows = max(most_rows, n_max)
    if most_rows == 0:
        return
    vec = _piece(dim, cfg["VEC"])
    pieces = dim // vec
    blocks = max(triton.cdiv(most_rows * pieces, cfg["CHUNKS"]), triton.cdiv(most_rows, cfg["ROWS"]))
    programs = _live_programs(pool2d.device, blocks)
    if offsets_32 is None:
        offsets_32 = _fits_int32(pool2d, out2d, n_max, min(n_max, capacity) * page, pieces, cfg["CHUNKS"], programs)
    _gather_live_kernel[(programs,)](
        pool2d,
        rows,
        index if index is not None else rows,  # not read unless WRITE_INDEX
        count,
        out2d,
        n_max,
        capacity,
        pool2d.stride(0),
        out2d.stride(0),
        PAGE=page,
        WRITE_INDEX=index is not None,
        ROWS=cfg["ROWS"],
        CHUNKS=cfg["CHUNKS"],
        VEC=vec,
        INDEX_ROWS=triton.next_power_of_2(triton.cdiv(cfg["CHUNKS"], pieces)),
        DIM=dim,
        MAIN=main,
        TAIL=tail,
        OFFSETS_32=offsets_32,
        IDS_EVICT=cfg.get("IDS_EVICT", ""),
        num_warps=cfg["num_warps"],
    )


def _launch_copy_live(src, count, dst) -> None:
    """dst[i] = src[i] for i < min(count[0], len(src), len(dst)), with a bounded grid."""
    n_max = min(src.numel(), dst.numel())
    if n_max == 0:
        return
    block = 1024
    grid = (_live_programs(src.device, triton.cdiv(n_max, block)),)
    _copy_live_kernel[grid](src, count, dst, n_max, BLOCK=block, num_warps=4)


def _launch_index_pages(table, seq_lens, flat, count, table_out, capacity: int, page: int,
                        zero_tail: bool = False) -> None:
    """Launch _index_pages_kernel: grid (requests, SPLIT), fixed by the table's shape; one compiled
    kernel whatever bs (the pages' running sum comes in, three small torch ops, no host sync)."""
    cfg = PAGE_INDEX_CONFIG
    bs, width = table.shape
    split = cfg["SPLIT"] if table.is_cuda else 2
    ends = torch.cumsum(torch.clamp((seq_lens[:bs].to(torch.int64) + (page - 1)) // page, 0, width), 0)
    _index_pages_kernel[(bs, split)](
        table,
        ends,
        flat,
        count,
        table_out,
        bs,
        width,
        table.stride(0),
        table_out.stride(0),
        capacity,
        PAGE=page,
        ZERO_TAIL=zero_tail,
        BLOCK=cfg["BLOCK"],
        num_warps=cfg["num_warps"],
    )


def _check_count(name: str, count: torch.Tensor, device: torch.device) -> None:
    if count.numel() != 1 or count.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected a 1-element int32 or int64 tensor")
    if count.device != device:
        raise ValueError(f"{name}: on {count.device}, pool on {device}")


def _as_rows_2d(name: str, out: torch.Tensor, dim: int, device: torch.device) -> torch.Tensor:
    """`out` ([rows, dim] or [rows, 1, dim] BF16 with contiguous rows) as a [rows, dim] view."""
    if out.dtype != BF16 or out.dim() < 2 or out.device != device:
        raise ValueError(f"{name}: {out.dtype} {tuple(out.shape)} on {out.device}, expected bfloat16 "
                         f"[rows, {dim}] on {device}")
    out2d = out.reshape(out.shape[0], -1)
    if out2d.shape[1] != dim or out2d.stride(1) != 1 or out2d.data_ptr() != out.data_ptr():
        raise ValueError(f"{name}: {tuple(out.shape)} with strides {out.stride()}, expected rows of "
                         f"{dim} contiguous elements")
    return out2d


def _check_index_1d(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.dtype not in (torch.int32, torch.int64) or x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"{name}: dtype {x.dtype}, {x.dim()} dims; expected contiguous 1-D int32 or int64")
    if x.device != device:
        raise ValueError(f"{name}: on {x.device}, pool on {device}")


def gather_cast_live_rows(
    pool: torch.Tensor,
    rows: torch.Tensor,
    n_active: torch.Tensor,
    out: torch.Tensor,
    *,
    index: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Cast the live rows compacted into `out` with a bounded grid; returns out.

    n = min(n_active[0], len(index) if index is given else len(rows)) rows are live.
    If n <= len(out): out[i] = bf16(pool[rows[i]]) for i < n, and index[i] = i (index, when
    given, is the row-id buffer an attention kernel reads: it then reads the compacted rows).
    Otherwise (more live rows than the scratch: shared prefixes) out must be pool-shaped, and
    out[index[i]] = bf16(pool[index[i]]) for i < n with index left as it is, so `index` must hold
    the same row ids as `rows` (`rows` is a copy of it taken before it is rewritten).
    Rows of out past n (compact) or not referenced (positional) are left untouched.

    pool: [tokens, dim] or [tokens, 1, dim] FP8 or uint8; rows, index: contiguous 1-D int32/int64;
    n_active: 1-element int32/int64 on the pool's device, read inside the kernel; out: BF16
    [capacity, dim] or [capacity, 1, dim].
    """
    pool2d = _as_pool_2d(pool)
    dev, dim = pool2d.device, pool2d.shape[1]
    _check_index_1d("rows", rows, dev)
    _check_count("n_active", n_active, dev)
    out2d = _as_rows_2d("out", out, dim, dev)
    capacity = out2d.shape[0]
    if index is None:
        n_max = rows.numel()
        if capacity < n_max:
            raise ValueError(f"out: {capacity} rows, fewer than the {n_max} rows that may be live "
                             "(pass index= for the positional fallback)")
    else:
        _check_index_1d("index", index, dev)
        n_max = index.numel()
        if capacity < min(n_max, pool2d.shape[0]):
            raise ValueError(f"out: {capacity} rows; needs min(len(index), pool rows) = "
                             f"{min(n_max, pool2d.shape[0])} so that any live count fits")
        if rows.numel() < min(n_max, capacity):
            raise ValueError(f"rows: {rows.numel()} entries, fewer than the {min(n_max, capacity)} "
                             "compacted rows out can hold")
    if _use_triton(pool2d, backend):
        _launch_gather_live(pool2d, rows, index, n_active, out2d, n_max, capacity, page=1)
        return out
    n = max(0, min(int(n_active.reshape(()).item()), n_max))
    if n <= capacity:
        out2d[:n] = pool2d[rows[:n].long()].to(BF16)
        if index is not None:
            index[:n] = torch.arange(n, device=dev, dtype=index.dtype)
    else:
        used = index[:n].long()
        out2d[used] = pool2d[used].to(BF16)
    return out


def copy_live_indices(
    src: torch.Tensor, n_active: torch.Tensor, out: torch.Tensor, *, backend: str = "auto"
) -> torch.Tensor:
    """out[i] = src[i] for i < min(n_active[0], len(src), len(out)), count read on the device."""
    _check_index_1d("src", src, src.device)
    _check_index_1d("out", out, src.device)
    _check_count("n_active", n_active, src.device)
    if out.dtype != src.dtype:
        raise ValueError(f"out: dtype {out.dtype}, src {src.dtype}")
    if _use_triton(src, backend):
        _launch_copy_live(src, n_active, out)
        return out
    n = max(0, min(int(n_active.reshape(()).item()), src.numel(), out.numel()))
    out[:n] = src[:n]
    return out


def _check_page_table(page_table: torch.Tensor, seq_lens: torch.Tensor, dev: torch.device) -> tuple[int, int]:
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.stride(1) != 1:
        raise ValueError(f"page_table: {page_table.dtype} {tuple(page_table.shape)}, expected int32 "
                         "[bs, width] with contiguous rows")
    if page_table.device != dev or seq_lens.device != dev:
        raise ValueError(f"page_table/seq_lens: on {page_table.device}/{seq_lens.device}, pool on {dev}")
    bs, width = page_table.shape
    if seq_lens.dim() != 1 or seq_lens.numel() < bs or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens: {seq_lens.dtype} {tuple(seq_lens.shape)}, expected 1-D int32/int64 [>= {bs}]")
    return bs, width


def _live_pages(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> list[int]:
    """np_b = min(cdiv(seq_lens[b], page_size), width) per request, on the host (the fallbacks)."""
    bs, width = page_table.shape
    lens = seq_lens[:bs].long().clamp(min=0)
    return ((lens + page_size - 1) // page_size).clamp(max=width).tolist()


def _check_table_out(table_out: torch.Tensor, page_table: torch.Tensor) -> None:
    if table_out.dtype != torch.int32 or table_out.shape != page_table.shape or not table_out.is_contiguous():
        raise ValueError(f"table_out: {table_out.dtype} {tuple(table_out.shape)}, expected contiguous "
                         f"int32 {tuple(page_table.shape)}")


def _pages_capacity(pool2d: torch.Tensor, out2d: torch.Tensor, page_size: int, n_max: int) -> tuple[int, int]:
    """(pool pages, capacity = min(out pages, pool pages)), refusing an out that some live count up
    to n_max (the table's bs x width) would not fit: a count past it would cast only part of the pool."""
    if page_size < 1 or pool2d.shape[0] % page_size:
        raise ValueError(f"page_size: {page_size}, pool has {pool2d.shape[0]} rows (need a multiple)")
    pool_pages = pool2d.shape[0] // page_size
    capacity = min(out2d.shape[0] // page_size, pool_pages)
    if capacity < min(n_max, pool_pages):
        raise ValueError(f"out: {out2d.shape[0] // page_size} pages; needs min(bs * width, pool pages) = "
                         f"{min(n_max, pool_pages)} so that any live count fits")
    return pool_pages, capacity


def plan_live_pages(
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    capacity: int,
    flat: torch.Tensor,
    count: torch.Tensor,
    table_out: torch.Tensor,
    *,
    zero_tail: bool = False,
    backend: str = "auto",
) -> None:
    """The compacted page plan of a paged attention call: one launch, no host sync.

    Request b reads pages page_table[b, :np_b], np_b = min(cdiv(seq_lens[b], page_size), width);
    count[0] = total = sum(np_b). total <= capacity: flat[start_b + j] = page_table[b, j] and
    table_out[b, j] = start_b + j (start_b: the pages of the requests before b); otherwise
    table_out[b, j] = page_table[b, j] and flat is not written. Entries j >= np_b of table_out are
    set to 0 with zero_tail (SGLang's rule for a fresh torch.empty table: page 0 is its padding
    page), otherwise not touched (a caller-owned table refreshed in place). The plan reads the table and the lengths only, so every layer of a forward can
    share it (gather_cast_planned_pages casts a layer's pages with it); `capacity` must be the
    gather's, min(out pages, pool pages).

    page_table: [bs, width] int32 with contiguous rows; seq_lens: [>= bs] int32/int64;
    flat: int32 [>= min(capacity, bs * width)] (at least 1); count: 1-element int32;
    table_out: int32, the table's shape, contiguous. All on one device.
    """
    dev = page_table.device
    bs, width = _check_page_table(page_table, seq_lens, dev)
    if page_size < 1 or capacity < 0:
        raise ValueError(f"page_size/capacity: {page_size}/{capacity}, expected >= 1 / >= 0")
    _check_table_out(table_out, page_table)
    _check_index_1d("flat", flat, dev)
    most = max(1, min(capacity, bs * width))
    if flat.dtype != torch.int32 or flat.numel() < most:
        raise ValueError(f"flat: {flat.dtype} [{flat.numel()}], expected int32 [>= {most}]")
    _check_count("count", count, dev)
    if bs == 0 or width == 0:
        count.fill_(0)
        return
    if _use_triton(page_table, backend):
        _launch_index_pages(page_table, seq_lens, flat, count, table_out, capacity, page_size, zero_tail)
        return
    pages = _live_pages(page_table, seq_lens, page_size)
    total = sum(pages)
    count.fill_(total)
    start = 0
    for b, n_b in enumerate(pages):
        if total <= capacity:
            flat[start : start + n_b] = page_table[b, :n_b]
            table_out[b, :n_b] = torch.arange(start, start + n_b, dtype=torch.int32, device=dev)
        else:
            table_out[b, :n_b] = page_table[b, :n_b]
        if zero_tail:
            table_out[b, n_b:] = 0
        start += n_b


def gather_cast_planned_pages(
    pool: torch.Tensor,
    flat: torch.Tensor,
    count: torch.Tensor,
    n_max: int,
    page_size: int,
    out: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Cast the pages of a plan (plan_live_pages) into out: one launch of the bounded-grid gather.

    n = min(count[0], n_max) pages, capacity = min(out pages, pool pages). n <= capacity: out's
    first n pages are the pool pages flat[:n], in order, and the rest of out is not touched.
    n > capacity (requests sharing pages reference more than the pool has; out is then
    pool-shaped): every pool page is cast at its own position, out[:capacity pages] =
    bf16(pool[:capacity pages]), which moves no more than casting the referenced pages would.
    Returns out.

    pool: [tokens, dim] or [tokens, 1, dim] FP8/uint8, tokens a multiple of page_size; flat:
    contiguous 1-D int32/int64; count: 1-element int32/int64 read on the device; n_max: the
    most pages the plan can count (the table's bs x width); out: BF16 [rows, (1,) dim].
    """
    pool2d = _as_pool_2d(pool)
    dev, dim = pool2d.device, pool2d.shape[1]
    _check_index_1d("flat", flat, dev)
    _check_count("count", count, dev)
    out2d = _as_rows_2d("out", out, dim, dev)
    pool_pages, capacity = _pages_capacity(pool2d, out2d, page_size, n_max)
    if flat.numel() < max(1, min(capacity, n_max)):
        raise ValueError(f"flat: {flat.numel()} entries, fewer than the {min(capacity, n_max)} pages out can hold")
    if n_max <= 0:
        return out
    if _use_triton(pool2d, backend):
        _launch_gather_live(pool2d, flat, None, count, out2d, n_max, capacity, page=page_size)
        return out
    n = max(0, min(int(count.reshape(()).item()), n_max))
    pool_paged = pool2d.view(pool_pages, page_size * dim)
    out_paged = out2d[: capacity * page_size].view(capacity, page_size * dim)
    if n <= capacity:
        out_paged[:n] = pool_paged[flat[:n].long()].to(BF16)
    else:
        out_paged[:] = pool_paged[:capacity].to(BF16)
    return out


def gather_cast_live_pages(
    pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    out: torch.Tensor,
    table_out: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Cast the pages a paged attention call reads, compacted, and write the compacted table.

    plan_live_pages then gather_cast_planned_pages (two launches; a forward's later layers can
    reuse the plan and skip the first). Request b reads pages page_table[b, :np_b], np_b =
    min(cdiv(seq_lens[b], page_size), width). With total = sum(np_b) and capacity = min(out
    pages, pool pages): total <= capacity: the pages are cast in request order into the front of
    out and table_out[b, j] = (pages before request b) + j; total > capacity (shared pages): out
    must be pool-shaped, the whole pool is cast at its own positions and table_out[b, j] =
    page_table[b, j]. table_out[b, j] for j >= np_b (and, compact, the rest of out) are not
    touched. Returns out.

    pool: [tokens, dim] or [tokens, 1, dim] FP8/uint8 with tokens a multiple of page_size;
    page_table: [bs, width] int32 with contiguous rows; seq_lens: [>= bs] int32/int64 (device,
    read inside the kernel); out: BF16 [capacity * page_size, (1,) dim]; table_out: int32, the
    table's shape, contiguous.
    """
    pool2d = _as_pool_2d(pool)
    dev, dim = pool2d.device, pool2d.shape[1]
    bs, width = _check_page_table(page_table, seq_lens, dev)
    _check_table_out(table_out, page_table)
    out2d = _as_rows_2d("out", out, dim, dev)
    _, capacity = _pages_capacity(pool2d, out2d, page_size, bs * width)
    if bs == 0 or width == 0:
        return out
    flat = torch.empty(max(1, min(capacity, bs * width)), dtype=torch.int32, device=dev)
    count = torch.empty(1, dtype=torch.int32, device=dev)
    plan_live_pages(page_table, seq_lens, page_size, capacity, flat, count, table_out, backend=backend)
    gather_cast_planned_pages(pool2d, flat, count, bs * width, page_size, out2d, backend=backend)
    return out
