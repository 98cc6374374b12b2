"""Variants of the live-row gather at the points that decide issue #11: `python -m kernels.studies.live_study --out $OUT`.

Each variant is checked bit for bit against the torch fallback, then timed (cold and kernel-timed,
as kernels.studies.serving_grid times them, with its copy baseline) for the rows path and the pages path
(page sizes 1 and 64) at bs 32 x 1K on both pools, bs 128 x 1K, bs 32 x 8K, 1M live rows and
bs 1 x 8K, against the kernel as it is (kv_cast), in one run: study.json, study.log. Since 2026-12-01
kv_cast.py's kernel is `off32_late` (32-bit offsets where they fit); the kept study files' baseline
("base", "old", kernels/results/2026-12-01-h200-serving-grid-early-ids/) is the int64 kernel before it.

The variants (kernels/BENCHMARKS.md section 6 has their figures): `persist*`, a persistent grid of
the resident programs with equal piece ranges (prefetching the next step's row ids, two steps in
flight, 32-bit offsets); `fused*`, the pages path in one launch; `*off32*` / `grid_off32`, 32-bit
piece and element offsets; `*early*`, the first block's row ids loaded beside the count;
`*_r32`, at most 32 registers; `candidate*`, 32-bit offsets plus early ids peeled off the loop.
Session 9: `pipe*`, the compact loop as `tl.range(..., num_stages=S)` for Triton's software pipeliner
(asynchronous copies of the row ids and rows into shared memory); `gs_*`, the grid-stride loop with the
next block's row ids loaded before this block's store, over the resident programs or a fixed number
per SM (figures: kernels/results/2026-12-01-h200-pipelined-prefetch/). The pipelined kernel does not
run under Triton 3.6's interpreter (its `tl.range` wants Python integers for run-time bounds), so
`--smoke` cannot check `pipe*`; the GPU run checks them bit for bit before timing.
Also session 9: `l2pf*` / `l2pfl*`, `prefetch.global.L2` (inline PTX) of the row ids and of the pool rows
of the block a program of a later wave will move (per piece, or one predicated request per 128-byte line),
and `kv_cast_identity`, the kernel as it is on row ids 0..n-1 (a gather without the scatter; rows path
only), to split the gap to the contiguous cast (kernels/results/2026-12-01-h200-l2-prefetch/). Inline PTX
does not run under the interpreter either.
`--smoke` runs the checks alone under Triton's interpreter (CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from kernels import kv_cast
from kernels.kv_cast import BF16, FP8, HAS_TRITON, _as_pool_2d, _fp8_to_bf16, _move_rows, _piece, _row_tiles
from kernels.studies.serving_grid import (
    ColdTimer,
    KernelTimer,
    Point,
    StudyLog,
    describe_time,
    make_pool,
    measure_copy,
    same_bits,
)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _row_src(rows_ptr, t, mask, PAGE: tl.constexpr, OFF32: tl.constexpr):
        """Pool row of compact row t: rows[t] (PAGE 1) or rows[t // PAGE] * PAGE + t % PAGE."""
        if PAGE == 1:
            src = tl.load(rows_ptr + t, mask=mask, other=0)
        else:
            src = tl.load(rows_ptr + t // PAGE, mask=mask, other=0) * PAGE + t % PAGE
        if OFF32:
            src = src.to(tl.int32)
        else:
            src = src.to(tl.int64)
        return src

    @triton.jit
    def _write_index(index_ptr, base, n_pieces, CHUNKS: tl.constexpr, PIECES: tl.constexpr,
                     INDEX_ROWS: tl.constexpr):
        """index[t] = t for the rows whose first piece is in the block of pieces [base, base + CHUNKS)."""
        first = tl.cdiv(base, PIECES)
        end = tl.cdiv(tl.minimum(base + CHUNKS, n_pieces), PIECES)
        tt = first + tl.arange(0, INDEX_ROWS)
        tl.store(index_ptr + tt, tt, mask=tt < end)

    @triton.jit
    def _study_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_max, capacity, pool_stride,
                             out_stride, PAGE: tl.constexpr, WRITE_INDEX: tl.constexpr, ROWS: tl.constexpr,
                             CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr, DIM: tl.constexpr,
                             MAIN: tl.constexpr, TAIL: tl.constexpr, PERSIST: tl.constexpr, PREFETCH: tl.constexpr,
                             OFF32: tl.constexpr, PIPE: tl.constexpr):
        """_gather_live_kernel with PERSIST (program p takes pieces [p * per, (p + 1) * per), per =
        cdiv(n_pieces, G)), PREFETCH (the next step's row ids before this step's store) and OFF32."""
        PIECES: tl.constexpr = DIM // VEC
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max)
        if OFF32:
            n = n.to(tl.int32)
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * PIECES)
            if PERSIST:
                per = tl.cdiv(n_pieces, tl.num_programs(0))
                base = tl.program_id(0) * per
                hi = tl.minimum(base + per, n_pieces)
                step = CHUNKS
            else:
                base = tl.program_id(0) * CHUNKS
                if not OFF32:
                    base = base.to(tl.int64)
                hi = n_pieces
                step = tl.num_programs(0) * CHUNKS
            k = base + tl.arange(0, CHUNKS)
            mask = (k < hi) & (k < base + CHUNKS)
            t = k // PIECES
            src = _row_src(rows_ptr, t, mask, PAGE, OFF32)
            if PIPE:  # two steps' pool rows in flight: the next step's loaded before this one is stored
                c = (k % PIECES) * VEC
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
                k_n = base + step + tl.arange(0, CHUNKS)
                mask_n = k_n < hi
                t_n = k_n // PIECES
                src_n = _row_src(rows_ptr, t_n, mask_n, PAGE, OFF32)
                while base < hi:
                    c_n = (k_n % PIECES) * VEC
                    x_n = tl.load(pool_ptr + (src_n * pool_stride + c_n)[:, None] + v, mask=mask_n[:, None])
                    k_nn = k_n + step
                    mask_nn = k_nn < hi
                    t_nn = k_nn // PIECES
                    src_nn = _row_src(rows_ptr, t_nn, mask_nn, PAGE, OFF32)
                    tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
                    if WRITE_INDEX:
                        _write_index(index_ptr, base, hi, CHUNKS, PIECES, INDEX_ROWS)
                    base, mask, t, c, x = base + step, mask_n, t_n, c_n, x_n
                    k_n, mask_n, t_n, src_n = k_nn, mask_nn, t_nn, src_nn
            else:
                while base < hi:
                    c = (k % PIECES) * VEC
                    x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
                    nxt = base + step
                    k_n = nxt + tl.arange(0, CHUNKS)
                    mask_n = k_n < hi
                    t_n = k_n // PIECES
                    if PREFETCH:
                        src_n = _row_src(rows_ptr, t_n, mask_n, PAGE, OFF32)
                    tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
                    if WRITE_INDEX:
                        _write_index(index_ptr, base, hi, CHUNKS, PIECES, INDEX_ROWS)
                    if not PREFETCH:
                        src_n = _row_src(rows_ptr, t_n, mask_n, PAGE, OFF32)
                    base, k, mask, t, src = nxt, k_n, mask_n, t_n, src_n
        elif WRITE_INDEX:
            step = tl.num_programs(0)
            blk = tl.program_id(0).to(tl.int64)
            n_blocks = tl.cdiv(n, ROWS)
            while blk < n_blocks:
                i = blk * ROWS + tl.arange(0, ROWS)
                mask = i < n
                src = tl.load(index_ptr + i, mask=mask, other=0).to(tl.int64)
                _move_rows(pool_ptr, out_ptr, src, src, mask, pool_stride, out_stride, DIM, MAIN, TAIL)
                blk += step

    @triton.jit
    def _early_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_max, capacity, rows_len,
                             pool_stride, out_stride, PAGE: tl.constexpr, WRITE_INDEX: tl.constexpr,
                             ROWS: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr,
                             DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr, EARLY: tl.constexpr,
                             OFF32: tl.constexpr, POOL_EVICT: tl.constexpr = "", OUT_CACHE: tl.constexpr = ""):
        """_gather_live_kernel (grid stride) whose first block's row ids are loaded together with the
        count (EARLY: masked by the ids buffer's length rows_len, not by the count), so a block waits
        for max(count, ids) and then the pool rows instead of count, then ids, then pool rows.
        POOL_EVICT / OUT_CACHE: the pool rows' load eviction policy ('evict_first': read once) and
        the scratch store's cache modifier ('.cs': streaming), '' for the defaults."""
        PIECES: tl.constexpr = DIM // VEC
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max)
        base = tl.program_id(0) * CHUNKS
        if OFF32:
            n = n.to(tl.int32)
        else:
            base = base.to(tl.int64)
        k = base + tl.arange(0, CHUNKS)
        t = k // PIECES
        if EARLY:
            src = _row_src(rows_ptr, t, t // PAGE < rows_len, PAGE, OFF32)
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * PIECES)
            step = tl.num_programs(0) * CHUNKS
            while base < n_pieces:
                mask = k < n_pieces
                if not EARLY:
                    src = _row_src(rows_ptr, t, mask, PAGE, OFF32)
                c = (k % PIECES) * VEC
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None],
                            eviction_policy=POOL_EVICT)
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None],
                         cache_modifier=OUT_CACHE)
                if WRITE_INDEX:
                    _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)
                base += step
                k = base + tl.arange(0, CHUNKS)
                t = k // PIECES
                if EARLY:
                    src = _row_src(rows_ptr, t, k < n_pieces, PAGE, OFF32)
        elif WRITE_INDEX:
            blk = tl.program_id(0).to(tl.int64)
            n_blocks = tl.cdiv(n, ROWS)
            while blk < n_blocks:
                i = blk * ROWS + tl.arange(0, ROWS)
                live = i < n
                used = tl.load(index_ptr + i, mask=live, other=0).to(tl.int64)
                _move_rows(pool_ptr, out_ptr, used, used, live, pool_stride, out_stride, DIM, MAIN, TAIL)
                blk += tl.num_programs(0)

    @triton.jit
    def _pipelined_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_max, capacity, pool_stride,
                                 out_stride, PAGE: tl.constexpr, WRITE_INDEX: tl.constexpr, ROWS: tl.constexpr,
                                 CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr,
                                 DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr, STAGES: tl.constexpr):
        """_gather_live_kernel (32-bit offsets) with its compact loop written as a counted loop over
        the program's blocks, `tl.range(..., num_stages=STAGES)`, so Triton's software pipeliner can
        issue the row ids and the pool rows of later blocks as asynchronous copies into shared memory
        (sm_80+ cp.async) while this block is cast and stored: more loads in flight per program
        without holding them in registers, where the hand-written prefetches above cost registers."""
        PIECES: tl.constexpr = DIM // VEC
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max).to(tl.int32)
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * PIECES)
            n_blocks = tl.cdiv(n_pieces, CHUNKS)
            for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=STAGES):
                base = blk * CHUNKS
                k = base + tl.arange(0, CHUNKS)
                mask = k < n_pieces
                t = k // PIECES
                src = _row_src(rows_ptr, t, mask, PAGE, True)
                c = (k % PIECES) * VEC
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
                if WRITE_INDEX:
                    _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)
        elif WRITE_INDEX:  # (the positional path, as kv_cast's)
            _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS, DIM, MAIN, TAIL)

    @triton.jit
    def _prefetch_l2(ptrs):
        """`prefetch.global.L2` of the line holding each address: a hint, no register written back."""
        return tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                         dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _prefetch_l2_if(ptrs, pred):
        """`prefetch.global.L2` of the line holding each address where pred is non-zero (predicated
        off elsewhere: no request at all, where _prefetch_l2 needs a harmless address)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }", "=r,l,r",
            [ptrs, pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _l2pf_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_max, capacity, rows_len, ahead,
                            pool_stride, out_stride, PAGE: tl.constexpr, WRITE_INDEX: tl.constexpr,
                            ROWS: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr,
                            DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr, IDS_PF: tl.constexpr,
                            ROWS_PF: tl.constexpr, LINES: tl.constexpr = False):
        """_gather_live_kernel (32-bit offsets) with L2 prefetches for the programs of later waves.

        IDS_PF: program p first prefetches lines p, p + G, ... of the row-id buffer (rows_len ids),
        so programs that start after the first wave find their ids in L2.
        ROWS_PF: with each block b it moves, a program also loads the row ids of block b + ahead
        (ahead: about one wave of resident programs, in pieces) beside its own and prefetches those
        pool rows into L2 (no registers held): the program that moves block b + ahead a wave later
        finds its ids and rows in L2 instead of waiting on DRAM for each in turn."""
        PIECES: tl.constexpr = DIM // VEC
        ID_LINE: tl.constexpr = 32  # ids (int32) per 128-byte line
        if IDS_PF:
            lines = tl.cdiv(rows_len, ID_LINE)
            ln = tl.program_id(0)
            while ln < lines:
                _prefetch_l2(rows_ptr + ln * ID_LINE + tl.zeros([32], tl.int32))
                ln += tl.num_programs(0)
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max).to(tl.int32)
        base = tl.program_id(0) * CHUNKS
        k = base + tl.arange(0, CHUNKS)
        t = k // PIECES
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * PIECES)
            step = tl.num_programs(0) * CHUNKS
            while base < n_pieces:
                mask = k < n_pieces
                src = _row_src(rows_ptr, t, mask, PAGE, True)
                c = (k % PIECES) * VEC
                if ROWS_PF:
                    ka = k + ahead
                    ma = ka < n_pieces
                    srca = _row_src(rows_ptr, ka // PIECES, ma, PAGE, True)
                    ca = (ka % PIECES) * VEC
                    if LINES:  # one request per 128-byte line: pieces that start a line or a row
                        offa = srca * pool_stride + ca
                        _prefetch_l2_if(pool_ptr + offa, ma & ((offa % 128 == 0) | (ca == 0)))
                    else:
                        _prefetch_l2(tl.where(ma, pool_ptr + srca * pool_stride + ca, pool_ptr))
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
                if WRITE_INDEX:
                    _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)
                base += step
                k = base + tl.arange(0, CHUNKS)
                t = k // PIECES
        elif WRITE_INDEX:  # (the positional path, as kv_cast's)
            _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS, DIM, MAIN, TAIL)

    @triton.jit
    def _diag_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_arg, pool_stride, out_stride,
                            CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr, DIM: tl.constexpr,
                            COUNT: tl.constexpr, IDS: tl.constexpr, WRITE_INDEX: tl.constexpr):
        """Diagnostic: _gather_live_kernel's compact loop (32-bit) with parts taken away, on row ids
        0..n-1 (so every form gives the same output): COUNT, the live count read from count_ptr (else
        n_arg from the launch); IDS, each piece's row id read from rows_ptr (else its row t itself);
        WRITE_INDEX, index[t] = t. Which part of the chain costs what, against the contiguous cast."""
        PIECES: tl.constexpr = DIM // VEC
        if COUNT:
            n = tl.load(count_ptr).to(tl.int32)
        else:
            n = n_arg
        base = tl.program_id(0) * CHUNKS
        k = base + tl.arange(0, CHUNKS)
        t = k // PIECES
        v = tl.arange(0, VEC)[None, :]
        n_pieces = n * PIECES
        step = tl.num_programs(0) * CHUNKS
        while base < n_pieces:
            mask = k < n_pieces
            if IDS:
                src = tl.load(rows_ptr + t, mask=mask, other=0)
            else:
                src = t
            c = (k % PIECES) * VEC
            x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
            tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
            if WRITE_INDEX:
                _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)
            base += step
            k = base + tl.arange(0, CHUNKS)
            t = k // PIECES

    @triton.jit
    def _flat2d_gather_kernel(pool_ptr, rows_ptr, index_ptr, count_ptr, out_ptr, n_max, capacity, pool_stride,
                              out_stride, PAGE: tl.constexpr, WRITE_INDEX: tl.constexpr, ROWS: tl.constexpr,
                              CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr, DIM: tl.constexpr,
                              MAIN: tl.constexpr, TAIL: tl.constexpr):
        """_gather_live_kernel (32-bit) with every piece index kept as a [CHUNKS, 1] column of the
        [CHUNKS, VEC] tile rather than a 1-D vector broadcast into it, so that (with VEC 8: a load of 8
        bytes and a store of 16 per piece in the same thread) no value crosses layouts (shared memory
        and a barrier each) between the row ids, the loads and the stores."""
        PIECES: tl.constexpr = DIM // VEC
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max).to(tl.int32)
        base = tl.program_id(0) * CHUNKS
        v = tl.arange(0, VEC)[None, :]
        if n <= capacity:
            n_pieces = n * (PAGE * PIECES)
            step = tl.num_programs(0) * CHUNKS
            while base < n_pieces:
                k = base + tl.arange(0, CHUNKS)[:, None]
                t = k // PIECES
                mask = k < n_pieces
                if PAGE == 1:
                    src = tl.load(rows_ptr + t, mask=mask, other=0)
                else:
                    src = tl.load(rows_ptr + t // PAGE, mask=mask, other=0) * PAGE + t % PAGE
                c = (k % PIECES) * VEC
                x = tl.load(pool_ptr + src * pool_stride + c + v, mask=mask)
                tl.store(out_ptr + t * out_stride + c + v, _fp8_to_bf16(x), mask=mask)
                if WRITE_INDEX:
                    _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)
                base += step
        elif WRITE_INDEX:  # (the positional path, as kv_cast's)
            _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS, DIM, MAIN, TAIL)

    @triton.jit
    def _candidate_move_pieces(pool_ptr, out_ptr, index_ptr, src, base, n_pieces, pool_stride, out_stride,
                     WRITE_INDEX: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, INDEX_ROWS: tl.constexpr,
                     DIM: tl.constexpr):
        """One compact block: pieces k = base + [0, CHUNKS) below n_pieces, piece k (pool row src
        of its row t = k // PIECES, column c) to out row t; with WRITE_INDEX index[t] = t for the
        rows whose first piece is in the block."""
        PIECES: tl.constexpr = DIM // VEC
        k = base + tl.arange(0, CHUNKS)
        t = k // PIECES
        c = (k % PIECES) * VEC
        v = tl.arange(0, VEC)[None, :]
        m = (k < n_pieces)[:, None]
        x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=m)
        tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=m)
        if WRITE_INDEX:
            _write_index(index_ptr, base, n_pieces, CHUNKS, PIECES, INDEX_ROWS)

    @triton.jit
    def _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS: tl.constexpr,
                       DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr):
        """out[index[i]] = bf16(pool[index[i]]) for i < n, ROWS whole rows a block (grid stride)."""
        blk = tl.program_id(0).to(tl.int64)
        n_blocks = tl.cdiv(n, ROWS)
        while blk < n_blocks:
            i = blk * ROWS + tl.arange(0, ROWS)
            live = i < n
            used = tl.load(index_ptr + i, mask=live, other=0).to(tl.int64)
            _move_rows(pool_ptr, out_ptr, used, used, live, pool_stride, out_stride, DIM, MAIN, TAIL)
            blk += tl.num_programs(0)

    @triton.jit
    def _candidate_gather_kernel(
        pool_ptr,
        rows_ptr,
        index_ptr,
        count_ptr,
        out_ptr,
        n_max,
        capacity,
        rows_len,
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
    ):
        """The candidate: kv_cast._gather_live_kernel with 32-bit offsets where they fit and the first
        block's row ids loaded beside the count (peeled off the loop); 2026-12-01, not adopted.

        Compact gather-cast of n = min(count[0], n_max) live entries, with a bounded grid.

        n <= capacity: out[t] = bf16(pool[rows[t // PAGE] * PAGE + t % PAGE]) for t < n * PAGE
        (an entry is a row, or a page of PAGE rows), and with WRITE_INDEX index[t] = t.
        n > capacity (WRITE_INDEX only): out[index[i]] = bf16(pool[index[i]]) for i < n, rows cast
        at their own positions into a pool-shaped out; index is left as it is.
        Program p handles blocks p, p + G, ... (G programs): CHUNKS pieces of VEC elements when
        compact, ROWS whole rows when positional; nothing past n is touched. rows holds rows_len
        entries; OFFSETS_32 when every piece and element offset fits in 32 bits.
        """
        PIECES: tl.constexpr = DIM // VEC
        n = tl.minimum(tl.load(count_ptr).to(tl.int64), n_max)
        # The live rows are cut into VEC-element pieces, piece k = (row t, column c) with
        # t = k // PIECES; a block is CHUNKS consecutive pieces, so reads and writes run as in a
        # contiguous cast (out is contiguous; a row's pieces are contiguous in the pool), with the
        # row id looked up per piece (_candidate_move_pieces).
        if OFFSETS_32:
            # The first block's row ids are loaded beside the count, masked by the length of rows
            # rather than by the count: that block waits for both at once, then for its pool rows
            # (not for the count, then the ids, then the rows). It is peeled off the loop, so its
            # ids are not carried through it (registers).
            n = n.to(tl.int32)
            base = tl.program_id(0) * CHUNKS
            k = base + tl.arange(0, CHUNKS)
            first_ids = _row_src(rows_ptr, k // PIECES, k // PIECES // PAGE < rows_len, PAGE, OFFSETS_32)
            if n <= capacity:
                n_pieces = n * (PAGE * PIECES)
                if base < n_pieces:
                    _candidate_move_pieces(pool_ptr, out_ptr, index_ptr, first_ids, base, n_pieces, pool_stride,
                                           out_stride, WRITE_INDEX, CHUNKS, VEC, INDEX_ROWS, DIM)
                base += tl.num_programs(0) * CHUNKS
                while base < n_pieces:
                    k = base + tl.arange(0, CHUNKS)
                    ids = _row_src(rows_ptr, k // PIECES, k < n_pieces, PAGE, OFFSETS_32)
                    _candidate_move_pieces(pool_ptr, out_ptr, index_ptr, ids, base, n_pieces, pool_stride,
                                           out_stride, WRITE_INDEX, CHUNKS, VEC, INDEX_ROWS, DIM)
                    base += tl.num_programs(0) * CHUNKS
            elif WRITE_INDEX:
                _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS, DIM, MAIN,
                                         TAIL)
        else:  # 64-bit offsets (pools of 2**31 elements or more): the ids after the count, as before
            blk = tl.program_id(0).to(tl.int64)
            if n <= capacity:
                n_pieces = n * (PAGE * PIECES)
                n_blocks = tl.cdiv(n_pieces, CHUNKS)
                while blk < n_blocks:
                    k = blk * CHUNKS + tl.arange(0, CHUNKS)
                    ids = _row_src(rows_ptr, k // PIECES, k < n_pieces, PAGE, OFFSETS_32)
                    _candidate_move_pieces(pool_ptr, out_ptr, index_ptr, ids, blk * CHUNKS, n_pieces, pool_stride,
                                           out_stride, WRITE_INDEX, CHUNKS, VEC, INDEX_ROWS, DIM)
                    blk += tl.num_programs(0)
            elif WRITE_INDEX:
                _candidate_cast_in_place(pool_ptr, index_ptr, out_ptr, n, pool_stride, out_stride, ROWS, DIM, MAIN,
                                         TAIL)

    @triton.jit
    def _page_of(p, ends, pages):
        """(request b, page j within it) of compact pages p, from the requests' inclusive page ends."""
        before = ends[None, :] <= p[:, None]
        b = tl.sum(before.to(tl.int32), axis=1)
        start = tl.sum(tl.where(before, pages[None, :], 0), axis=1)
        return b, p - start

    @triton.jit
    def _study_pages_kernel(pool_ptr, table_ptr, seq_lens_ptr, table_out_ptr, out_ptr, bs, width, table_stride,
                            table_out_stride, capacity, pool_stride, out_stride, PAGE: tl.constexpr,
                            BS_BLOCK: tl.constexpr, ROWS: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                            SPAN: tl.constexpr, DIM: tl.constexpr, MAIN: tl.constexpr, TAIL: tl.constexpr,
                            PREFETCH: tl.constexpr):
        """The pages path in one launch (persistent, equal piece ranges): every program sums the
        requests' pages from seq_lens itself; a piece's pool row comes from its request's table row.
        total <= capacity: out[t] = bf16(pool row of compact row t) and table_out[b, j] = start_b + j;
        total > capacity: pages cast at their own positions, table_out[b, j] = table[b, j]."""
        PIECES: tl.constexpr = DIM // VEC
        offs = tl.arange(0, BS_BLOCK)
        lens = tl.load(seq_lens_ptr + offs, mask=offs < bs, other=0).to(tl.int64)
        pages = tl.minimum(tl.maximum((lens + PAGE - 1) // PAGE, 0), width)
        ends = tl.cumsum(pages, axis=0)
        total = tl.sum(pages, axis=0)
        v = tl.arange(0, VEC)[None, :]
        if total <= capacity:
            n_rows = total * PAGE
            n_pieces = n_rows * PIECES
            per = tl.cdiv(n_pieces, tl.num_programs(0))
            base = tl.program_id(0) * per
            hi = tl.minimum(base + per, n_pieces)
            # rows touched by a step: SPAN rows from the one holding its first piece
            tr = base // PIECES + tl.arange(0, SPAN)
            rmask = tr < n_rows
            b, j = _page_of(tr // PAGE, ends, pages)
            rsrc = tl.load(table_ptr + b * table_stride + j, mask=rmask, other=0).to(tl.int64) * PAGE + tr % PAGE
            while base < hi:
                k = base + tl.arange(0, CHUNKS)
                mask = k < hi
                t = k // PIECES
                src = tl.gather(rsrc, (t - base // PIECES).to(tl.int32), axis=0)
                c = (k % PIECES) * VEC
                x = tl.load(pool_ptr + (src * pool_stride + c)[:, None] + v, mask=mask[:, None])
                nxt = base + CHUNKS
                tr_n = nxt // PIECES + tl.arange(0, SPAN)
                if PREFETCH:
                    b_n, j_n = _page_of(tr_n // PAGE, ends, pages)
                    rsrc_n = tl.load(table_ptr + b_n * table_stride + j_n, mask=tr_n < n_rows,
                                     other=0).to(tl.int64) * PAGE + tr_n % PAGE
                tl.store(out_ptr + (t * out_stride + c)[:, None] + v, _fp8_to_bf16(x), mask=mask[:, None])
                # rows whose first piece is in this step and that start a page: table_out[b, j] = page
                first = tr * PIECES
                starts = (first >= base) & (first < tl.minimum(nxt, hi)) & (tr % PAGE == 0)
                tl.store(table_out_ptr + b * table_out_stride + j, tr // PAGE, mask=starts)
                if not PREFETCH:
                    b_n, j_n = _page_of(tr_n // PAGE, ends, pages)
                    rsrc_n = tl.load(table_ptr + b_n * table_stride + j_n, mask=tr_n < n_rows,
                                     other=0).to(tl.int64) * PAGE + tr_n % PAGE
                base, tr, b, j, rsrc = nxt, tr_n, b_n, j_n, rsrc_n
        else:
            n_rows = total * PAGE
            step = tl.num_programs(0)
            blk = tl.program_id(0).to(tl.int64)
            n_blocks = tl.cdiv(n_rows, ROWS)
            while blk < n_blocks:
                t = blk * ROWS + tl.arange(0, ROWS)
                mask = t < n_rows
                b, j = _page_of(t // PAGE, ends, pages)
                page = tl.load(table_ptr + b * table_stride + j, mask=mask, other=0).to(tl.int64)
                src = page * PAGE + t % PAGE
                _move_rows(pool_ptr, out_ptr, src, src, mask, pool_stride, out_stride, DIM, MAIN, TAIL)
                tl.store(table_out_ptr + b * table_out_stride + j, page, mask=mask & (t % PAGE == 0))
                blk += step


def resident_per_sm(compiled, num_warps: int) -> int:
    """Programs of `compiled` an H100/H200 SM holds at once: registers, warps, blocks, shared memory."""
    regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * num_warps) if compiled.n_regs else 64
    shared = compiled.metadata.shared
    by_smem = (233472 // (shared + 1024)) if shared else 32
    return max(1, min(32, 64 // num_warps, by_regs, by_smem))


_RESIDENT: dict = {}


def _persistent_grid(kernel, key, args, kwargs, device) -> int:
    """SMs x resident programs per SM of this compiled variant (4 programs under the interpreter)."""
    if device.type != "cuda":
        return 4
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
        compiled._init_handles()
        _RESIDENT[key] = (resident_per_sm(compiled, kwargs["num_warps"]), compiled.n_regs, compiled.n_spills,
                          compiled.metadata.shared)
    per_sm = _RESIDENT[key][0]
    return kv_cast._count_sms(device.index if device.index is not None else torch.cuda.current_device()) * per_sm


def fits_32bit(pool2d, out2d, rows_total: int, dim: int, vec: int) -> bool:
    return max(pool2d.shape[0] * pool2d.stride(0), out2d.shape[0] * out2d.stride(0), rows_total * (dim // vec),
               rows_total) < 2**31 - 2**20


def _study_grid(pool2d, most_rows: int, dim: int, vec: int, cfg: dict) -> int:
    """kv_cast._launch_gather_live's bounded grid, with `cfg`'s programs per SM."""
    blocks = max(triton.cdiv(most_rows * (dim // vec), cfg["CHUNKS"]), triton.cdiv(most_rows, cfg["ROWS"]))
    return max(1, min(blocks, kv_cast._count_sms(torch.cuda.current_device()) * cfg["PROGRAMS_PER_SM"]
                      if pool2d.is_cuda else 4))


def launch_candidate(pool2d, rows, index, count, out2d, n_max, capacity, page, cfg: dict) -> None:
    """The candidate's _launch_gather_live: 32-bit offsets when every offset fits (cfg OFFSETS_32)."""
    dim = pool2d.shape[1]
    main, tail = _row_tiles(dim)
    most_rows = max(min(n_max, capacity) * page, n_max if index is not None else 0)
    if most_rows == 0:
        return
    vec = _piece(dim, cfg["VEC"])
    grid = _study_grid(pool2d, most_rows, dim, vec, cfg)
    most_pieces = min(n_max, capacity) * page * (dim // vec) + (grid + 1) * cfg["CHUNKS"]
    most_elements = max(pool2d.shape[0] * pool2d.stride(0), out2d.shape[0] * out2d.stride(0))
    offsets_32 = cfg.get("OFFSETS_32", True) and max(most_pieces, most_elements, n_max, rows.numel()) < 2**31
    _candidate_gather_kernel[(grid,)](
        pool2d, rows, index if index is not None else rows, count, out2d, n_max, capacity, rows.numel(),
        pool2d.stride(0), out2d.stride(0), PAGE=page, WRITE_INDEX=index is not None, ROWS=cfg["ROWS"],
        CHUNKS=cfg["CHUNKS"], VEC=vec, INDEX_ROWS=triton.next_power_of_2(triton.cdiv(cfg["CHUNKS"], dim // vec)),
        DIM=dim, MAIN=main, TAIL=tail, OFFSETS_32=offsets_32, num_warps=cfg["num_warps"])


def launch_study_gather(pool2d, rows, index, count, out2d, n_max, capacity, page, var: dict) -> None:
    cfg = {**kv_cast.LIVE_CONFIG, **var.get("cfg", {})}
    dim = pool2d.shape[1]
    main, tail = _row_tiles(dim)
    vec = _piece(dim, cfg["VEC"])
    off32 = var.get("off32", False) and fits_32bit(pool2d, out2d, min(n_max, capacity) * page, dim, vec)
    most = max(min(n_max, capacity) * page, n_max if index is not None else 0)
    args = (pool2d, rows, index if index is not None else rows, count, out2d, n_max, capacity, pool2d.stride(0),
            out2d.stride(0))
    kwargs = dict(PAGE=page, WRITE_INDEX=index is not None, ROWS=cfg["ROWS"], CHUNKS=cfg["CHUNKS"], VEC=vec,
                  INDEX_ROWS=triton.next_power_of_2(triton.cdiv(cfg["CHUNKS"], dim // vec)), DIM=dim, MAIN=main,
                  TAIL=tail, PERSIST=var.get("persist", False), PREFETCH=var.get("prefetch", False), OFF32=off32,
                  PIPE=var.get("pipe", False), num_warps=cfg["num_warps"])
    if var.get("kind") == "candidate":
        launch_candidate(pool2d, rows, index, count, out2d, n_max, capacity, page, cfg)
        return
    if var.get("l2pf"):  # (ids, rows, waves ahead[, one prefetch per line])
        ids_pf, rows_pf, waves, lines = (*var["l2pf"], False)[:4]
        kwargs["LINES"] = lines
        for key in ("PERSIST", "PREFETCH", "PIPE", "OFF32"):
            kwargs.pop(key)
        assert fits_32bit(pool2d, out2d, most, dim, vec), "the L2-prefetch variant has 32-bit offsets only"
        resident = kv_cast._count_sms(pool2d.device.index or 0) * 6 if pool2d.is_cuda else 4
        args = (pool2d, rows, index if index is not None else rows, count, out2d, n_max, capacity, rows.numel(),
                int(waves * resident * cfg["CHUNKS"]), pool2d.stride(0), out2d.stride(0))
        _l2pf_gather_kernel[(_study_grid(pool2d, most, dim, vec, cfg),)](*args, IDS_PF=ids_pf, ROWS_PF=rows_pf,
                                                                          **kwargs)
        return
    if var.get("kind") == "flat2d":
        for key in ("PERSIST", "PREFETCH", "PIPE", "OFF32"):
            kwargs.pop(key)
        assert fits_32bit(pool2d, out2d, most, dim, vec), "the flat2d variant has 32-bit offsets only"
        _flat2d_gather_kernel[(_study_grid(pool2d, most, dim, vec, cfg),)](*args, **kwargs)
        return
    if var.get("stages"):
        for key in ("PERSIST", "PREFETCH", "PIPE", "OFF32"):
            kwargs.pop(key)
        kwargs["STAGES"] = var["stages"]
        assert fits_32bit(pool2d, out2d, most, dim, vec), "the pipelined variant has 32-bit offsets only"
        _pipelined_gather_kernel[(_study_grid(pool2d, most, dim, vec, cfg),)](*args, **kwargs)
        return
    if var.get("early") is not None:
        args = (pool2d, rows, index if index is not None else rows, count, out2d, n_max, capacity, rows.numel(),
                pool2d.stride(0), out2d.stride(0))
        for key in ("PERSIST", "PREFETCH", "PIPE"):
            kwargs.pop(key)
        kwargs["EARLY"] = var["early"]
        kwargs["POOL_EVICT"] = var.get("pool_evict", "")
        kwargs["OUT_CACHE"] = var.get("out_cache", "")
        if var.get("maxnreg"):
            kwargs["maxnreg"] = var["maxnreg"]
        grid = _study_grid(pool2d, most, dim, vec, cfg)
        _early_gather_kernel[(grid,)](*args, **kwargs)
        return
    if var.get("persist") or var.get("resident"):  # resident: grid stride over SMs x resident programs
        key = ("gather", tuple(sorted((k, v) for k, v in kwargs.items())))
        grid = _persistent_grid(_study_gather_kernel, key, args, dict(kwargs), pool2d.device)
        grid = grid * var.get("resident_scale", 1)
        if var.get("resident"):
            grid = max(1, min(grid, triton.cdiv(most * (dim // vec), cfg["CHUNKS"])))
    else:
        grid = _study_grid(pool2d, most, dim, vec, cfg)
    _study_gather_kernel[(grid,)](*args, **kwargs)


def _with_config(cfg: dict, fn):
    saved = dict(kv_cast.LIVE_CONFIG)
    kv_cast.LIVE_CONFIG.update(cfg)
    try:
        return fn()
    finally:
        kv_cast.LIVE_CONFIG.clear()
        kv_cast.LIVE_CONFIG.update(saved)


def study_rows(pool, rows, count, out, index, var: dict):
    if var.get("kind") == "diag":  # row ids 0..n-1 only (time_variants' identity branch)
        cfg = {**kv_cast.LIVE_CONFIG, **var.get("cfg", {})}
        pool2d = _as_pool_2d(pool)
        out2d = out.view(out.shape[0], -1)
        dim = pool2d.shape[1]
        vec = _piece(dim, cfg["VEC"])
        n = var["_n"]  # the live count as a launch argument (set by time_variants: no sync in a graph)
        most = min(index.numel(), out2d.shape[0])
        grid = _study_grid(pool2d, most, dim, vec, cfg)
        _diag_gather_kernel[(grid,)](pool2d, rows, index, count, out2d, n, pool2d.stride(0),
                                     out2d.stride(0), CHUNKS=cfg["CHUNKS"], VEC=vec,
                                     INDEX_ROWS=triton.next_power_of_2(triton.cdiv(cfg["CHUNKS"], dim // vec)),
                                     DIM=dim, COUNT=var["count"], IDS=var["ids"], WRITE_INDEX=var["write_index"],
                                     num_warps=cfg["num_warps"])
        return out
    if var.get("kind") == "kv_cast":
        return _with_config(var.get("cfg", {}),
                            lambda: kv_cast.gather_cast_live_rows(pool, rows, count, out, index=index))
    pool2d = _as_pool_2d(pool)
    out2d = out.view(out.shape[0], -1)
    launch_study_gather(pool2d, rows, index, count, out2d, index.numel(), out2d.shape[0], 1, var)
    return out


def study_pages(pool, table, lens, page, out, table_out, var: dict):
    if var.get("kind") == "kv_cast":
        return _with_config(var.get("cfg", {}),
                            lambda: kv_cast.gather_cast_live_pages(pool, table, lens, page, out, table_out))
    pool2d = _as_pool_2d(pool)
    out2d = out.view(out.shape[0], -1)
    bs, width = table.shape
    capacity = out2d.shape[0] // page
    dev = pool2d.device
    if var.get("kind") == "fused":
        cfg = {**kv_cast.LIVE_CONFIG, **var.get("cfg", {})}
        dim = pool2d.shape[1]
        main, tail = _row_tiles(dim)
        vec = _piece(dim, cfg["VEC"])
        args = (pool2d, table, lens, table_out, out2d, bs, width, table.stride(0), table_out.stride(0), capacity,
                pool2d.stride(0), out2d.stride(0))
        kwargs = dict(PAGE=page, BS_BLOCK=max(16, triton.next_power_of_2(bs)), ROWS=cfg["ROWS"],
                      CHUNKS=cfg["CHUNKS"], VEC=vec,
                      SPAN=triton.next_power_of_2(triton.cdiv(cfg["CHUNKS"], dim // vec) + 1), DIM=dim, MAIN=main,
                      TAIL=tail, PREFETCH=var.get("prefetch", False), num_warps=cfg["num_warps"])
        key = ("pages", tuple(sorted((k, v) for k, v in kwargs.items())))
        grid = _persistent_grid(_study_pages_kernel, key, args, dict(kwargs), dev)
        _study_pages_kernel[(grid,)](*args, **kwargs)
        return out
    flat = torch.empty(max(1, min(capacity, bs * width)), dtype=torch.int32, device=dev)
    count = torch.empty(1, dtype=torch.int32, device=dev)
    kv_cast._launch_index_pages(table, lens, flat, count, table_out, capacity, page)
    launch_study_gather(pool2d, flat, None, count, out2d, bs * width, capacity, page, var)
    return out


# Names as in the kept study files (kernels/results/2026-12-01-h200-serving-grid-early-ids/), except
# where noted: there the kernel as it is was "old" (study-early-ids, study-final) or "base", and the
# candidate was "kv_cast" (study-early-ids: 32 programs per SM; study-final: 16).
VARIANTS = {
    "kv_cast": {"kind": "kv_cast"},  # the kernel as it is (since 2026-12-01 off32_late; "base", "old" before)
    "kv_cast_pps16": {"kind": "kv_cast", "cfg": {"PROGRAMS_PER_SM": 16}},  # "old_pps16"
    "base_pps8": {"kind": "kv_cast", "cfg": {"PROGRAMS_PER_SM": 8}},
    "candidate": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 16}},  # "kv_cast" in study-final
    "candidate_pps32": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 32}},  # "kv_cast_pps32"
    "candidate_int64": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 16, "OFFSETS_32": False}},
    "candidate_c1024": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 32, "CHUNKS": 1024}},  # "kv_cast_c1024"
    "grid_off32": {"off32": True},
    "persist": {"persist": True},
    "persist_pf": {"persist": True, "prefetch": True},
    "persist_pf32": {"persist": True, "prefetch": True, "off32": True},
    "persist_pipe": {"persist": True, "pipe": True},
    "persist_pf_x2": {"persist": True, "prefetch": True, "resident_scale": 2},
    "persist_pf_w4": {"persist": True, "prefetch": True, "cfg": {"CHUNKS": 256, "num_warps": 4}},
    "fused_pf": {"kind": "fused", "prefetch": True},
    "fused": {"kind": "fused", "prefetch": False},
    "int64_early": {"early": True},
    "int64_late": {"early": False},
    "off32_late": {"early": False, "off32": True},
    "off32_early": {"early": True, "off32": True},
    "off32_late_r32": {"early": False, "off32": True, "maxnreg": 32},
    "off32_early_r32": {"early": True, "off32": True, "maxnreg": 32},
    # 2026-12-02: cache hints on the pool rows' load and the scratch's store
    "off32_evict": {"early": False, "off32": True, "pool_evict": "evict_first"},
    "off32_cs": {"early": False, "off32": True, "out_cache": ".cs"},
    "off32_evict_cs": {"early": False, "off32": True, "pool_evict": "evict_first", "out_cache": ".cs"},
    "off32_early_evict_cs": {"early": True, "off32": True, "pool_evict": "evict_first", "out_cache": ".cs"},
    "off32_pps16_evict_cs": {"early": False, "off32": True, "pool_evict": "evict_first", "out_cache": ".cs",
                             "cfg": {"PROGRAMS_PER_SM": 16}},
    # 2026-12-01 (session 9): Triton's software pipeliner on the compact loop (tl.range num_stages)
    "pipe2": {"stages": 2},
    "pipe3": {"stages": 3},
    "pipe4": {"stages": 4},
    "pipe3_pps16": {"stages": 3, "cfg": {"PROGRAMS_PER_SM": 16}},
    "pipe3_c256": {"stages": 3, "cfg": {"CHUNKS": 256}},
    "pipe4_c256": {"stages": 4, "cfg": {"CHUNKS": 256}},
    "pipe3_c256_w4": {"stages": 3, "cfg": {"CHUNKS": 256, "num_warps": 4}},
    "pipe4_c256_w4": {"stages": 4, "cfg": {"CHUNKS": 256, "num_warps": 4}},
    "pipe6_c128_w4": {"stages": 6, "cfg": {"CHUNKS": 128, "num_warps": 4}},
    # L2 prefetches for later waves: (row ids, pool rows, waves ahead)
    "l2pf_ids": {"l2pf": (True, False, 1)},
    "l2pf_rows1": {"l2pf": (False, True, 1)},
    "l2pf_both1": {"l2pf": (True, True, 1)},
    "l2pf_rows2": {"l2pf": (False, True, 2)},
    "l2pf_both2": {"l2pf": (True, True, 2)},
    "l2pf_rows05": {"l2pf": (False, True, 0.5)},
    "l2pf_both1_pps16": {"l2pf": (True, True, 1), "cfg": {"PROGRAMS_PER_SM": 16}},
    "l2pfl_rows1": {"l2pf": (False, True, 1, True)},
    "l2pfl_rows05": {"l2pf": (False, True, 0.5, True)},
    "l2pfl_rows2": {"l2pf": (False, True, 2, True)},
    "l2pfl_rows1_pps16": {"l2pf": (False, True, 1, True), "cfg": {"PROGRAMS_PER_SM": 16}},
    # 8-element pieces: a piece's 8-byte load and 16-byte store in one thread, so the cast data does
    # not cross layouts (with 16, Triton loads 16 per thread and stores 8: a shared-memory shuffle)
    "kv_cast_v16_c512": {"kind": "kv_cast", "cfg": {"VEC": 16, "CHUNKS": 512}},  # LIVE_CONFIG before session 9
    "candidate_v8_c1024_pps32": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 32, "VEC": 8, "CHUNKS": 1024}},
    "kv_cast_v8_c512": {"kind": "kv_cast", "cfg": {"VEC": 8, "CHUNKS": 512}},
    "kv_cast_v8_c1024": {"kind": "kv_cast", "cfg": {"VEC": 8, "CHUNKS": 1024}},
    "kv_cast_v8_c1024_pps16": {"kind": "kv_cast", "cfg": {"VEC": 8, "CHUNKS": 1024, "PROGRAMS_PER_SM": 16}},
    "kv_cast_v8_c2048": {"kind": "kv_cast", "cfg": {"VEC": 8, "CHUNKS": 2048}},
    # the positional path's row blocks (ROWS) set the kernel's registers: 16 -> 40, 8 -> 38, 4 -> 32
    # (ptxas, pieces of 8): full occupancy for the compact path; with early ids 34
    "kv_cast_r8": {"kind": "kv_cast", "cfg": {"ROWS": 8}},
    "kv_cast_r4": {"kind": "kv_cast", "cfg": {"ROWS": 4}},
    "early_r4": {"early": True, "off32": True, "cfg": {"ROWS": 4}},
    "early_r4_pps16": {"early": True, "off32": True, "cfg": {"ROWS": 4, "PROGRAMS_PER_SM": 16}},
    "flat2d_v8_c512": {"kind": "flat2d", "cfg": {"VEC": 8, "CHUNKS": 512}},
    "flat2d_v8_c1024": {"kind": "flat2d", "cfg": {"VEC": 8, "CHUNKS": 1024}},
    "flat2d_v16_c512": {"kind": "flat2d"},
    "candidate_v8_c1024": {"kind": "candidate", "cfg": {"PROGRAMS_PER_SM": 16, "VEC": 8, "CHUNKS": 1024}},
    # diagnostic: the kernel as it is on contiguous row ids (0..n-1): the gather without the scatter
    "diag_full": {"kind": "diag", "identity": True, "count": True, "ids": True, "write_index": True},
    "diag_nocount": {"kind": "diag", "identity": True, "count": False, "ids": True, "write_index": True},
    "diag_noids": {"kind": "diag", "identity": True, "count": True, "ids": False, "write_index": True},
    "diag_noindex": {"kind": "diag", "identity": True, "count": True, "ids": True, "write_index": False},
    "diag_bare": {"kind": "diag", "identity": True, "count": False, "ids": False, "write_index": True},
    "diag_bare_noindex": {"kind": "diag", "identity": True, "count": False, "ids": False, "write_index": False},
    "diag_bare_noindex_w4": {"kind": "diag", "identity": True, "count": False, "ids": False, "write_index": False,
                             "cfg": {"CHUNKS": 256, "num_warps": 4}},
    "kv_cast_identity": {"kind": "kv_cast", "identity": True},
    # grid stride (not equal ranges) with the next block's row ids loaded before this block's store,
    # 32-bit: over exactly the resident programs, or a fixed number per SM
    "gs_pf32_res": {"resident": True, "prefetch": True, "off32": True},
    "gs_off32_res": {"resident": True, "off32": True},
    "gs_pf32_pps6": {"prefetch": True, "off32": True, "cfg": {"PROGRAMS_PER_SM": 6}},
    "gs_pf32_pps12": {"prefetch": True, "off32": True, "cfg": {"PROGRAMS_PER_SM": 12}},
    "gs_pf32_res_w4": {"resident": True, "prefetch": True, "off32": True, "cfg": {"CHUNKS": 256, "num_warps": 4}},
    "gs_pf32_res_x2": {"resident": True, "prefetch": True, "off32": True, "resident_scale": 2},
}
PAGES_ONLY = ("fused_pf", "fused")


# --- checks ---------------------------------------------------------------------------------

def check_variant(name: str, var: dict, device, tokens: int, dim: int = 576) -> list:
    """Bit-exact against the torch fallback: rows compact / count 0 / overflow, pages 1, 4, 64."""
    gen = torch.Generator(device=device).manual_seed(5)
    pool = torch.randint(0, 256, (tokens, 1, dim), generator=gen, device=device, dtype=torch.uint8)
    pool[:16, 0] = torch.arange(256, device=device, dtype=torch.int32).to(torch.uint8).view(16, 16).repeat(1, dim // 16)
    failures = []

    def both(fn_var, fn_ref, *tensors):
        got = [t.clone() for t in tensors]
        want = [t.clone() for t in tensors]
        fn_var(*got)
        fn_ref(*want)
        return all(same_bits(g, w) for g, w in zip(got, want))

    if name not in PAGES_ONLY:
        for cap, n_index, count in ((tokens // 2, tokens // 2, tokens // 3), (tokens // 2, tokens // 2, 0),
                                    (tokens // 2, tokens // 2, tokens // 2), (tokens // 2, tokens // 2, 7),
                                    (tokens, 2 * tokens, tokens + 17)):
            index = torch.randint(0, tokens, (n_index,), generator=gen, device=device, dtype=torch.int32)
            index[:16] = torch.arange(16, device=device)
            rows = index[:cap].clone()
            out = torch.full((cap, 1, dim), 7.0, dtype=BF16, device=device)
            n = torch.tensor([count], dtype=torch.int32, device=device)
            if not both(lambda o, i: study_rows(pool, rows, n, o, i, var),
                        lambda o, i: kv_cast.gather_cast_live_rows(pool, rows, n, o, index=i, backend="torch"),
                        out, index):
                failures.append(("rows", cap, n_index, count))
    for page in (1, 4, 64):
        pool_pages = tokens // page
        for bs, width, scale in ((3, 8, 0.5), (5, max(2, pool_pages // 4), 0.3), (8, pool_pages // 2, 1.0),
                                 (37, max(2, pool_pages // 16), 0.6)):
            table = torch.randint(0, pool_pages, (bs, width), generator=gen, device=device, dtype=torch.int32)
            k = min(width, 16 // page + 1)
            table[0, :k] = torch.arange(k, device=device)
            lens = (torch.rand(bs, generator=gen, device=device) * scale * width * page).to(torch.int32)
            lens[1] = 0
            cap = min(bs * width, pool_pages)
            out = torch.full((cap * page, 1, dim), 7.0, dtype=BF16, device=device)
            table_out = torch.full_like(table, -5)
            if not both(lambda o, t: study_pages(pool, table, lens, page, o, t, var),
                        lambda o, t: kv_cast.gather_cast_live_pages(pool, table, lens, page, o, t, backend="torch"),
                        out, table_out):
                failures.append(("pages", page, bs, width, scale))
    return failures


# --- timing ---------------------------------------------------------------------------------

POINTS = ((131_072, 32, 1024), (1_048_576, 32, 1024), (1_048_576, 128, 1024), (1_048_576, 32, 8192),
          (1_048_576, 32, 32_768), (1_048_576, 1, 8192))


def time_variants(log, out_dir: Path, names: list[str]) -> dict:
    dev = torch.device("cuda")

    class _Run:  # what measure_copy needs
        device = dev

    timer = ColdTimer(dev)
    copy = measure_copy(_Run(), timer)
    copy_tb = copy["tb_per_s"]
    log(f"copy {copy}")
    kt = KernelTimer(dev)
    pools = {p: make_pool(p, dev, seed=p % 97) for p in {p for p, _, _ in POINTS}}
    scratch = torch.empty(max(pools), 1, 576, dtype=BF16, device=dev)
    results = {"copy": copy, "points": [], "resident": {}}
    for pool_tokens, bs, ctx in POINTS:
        pt = Point(pools[pool_tokens], bs, ctx, seed=bs * 1000 + ctx)
        moved = 3 * pt.live_rows * 576
        compact = scratch[: pt.rows_capacity()]
        contiguous_src = pt.pool[: pt.live_rows]
        contiguous_out = scratch[: pt.live_rows].view(contiguous_src.shape)
        row = {"pool": pool_tokens, "bs": bs, "ctx": ctx, "live_rows": pt.live_rows,
               "contiguous_cast_kernel_us": kt.time_us(lambda: kv_cast.cast_fp8_to_bf16(contiguous_src,
                                                                                         contiguous_out)),
               "variants": {}}
        tables = {page: pt.table(page) for page in (1, 64)}
        for name in names:
            var = VARIANTS[name]
            cell = {}
            if var.get("identity"):  # rows path on row ids 0..n-1 (contiguous), exact against pool[:n]
                var = {**var, "_n": pt.live_rows}
                ids = torch.arange(pt.index.numel(), dtype=torch.int32, device=dev)
                id_rows, id_index = ids[: pt.rows_capacity()].clone(), ids.clone()
                for tname, tm in (("cold", timer), ("kernel", kt)):
                    us = tm.time_us(lambda: study_rows(pt.pool, id_rows, pt.count, compact, id_index, var))
                    id_index.copy_(ids)
                    cell[f"rows_{tname}"] = describe_time(us, moved, copy_tb) if us else None
                study_rows(pt.pool, id_rows, pt.count, compact, id_index, var)
                want = pt.pool[: pt.live_rows].view(FP8).to(BF16).view(-1, 576)
                cell["rows_exact"] = bool(torch.equal(compact[: pt.live_rows].view(-1, 576).view(torch.int16),
                                                      want.view(torch.int16)))
                row["variants"][name] = cell
                log(f"{pool_tokens} bs {bs} ctx {ctx} {name}: " + ", ".join(
                    f"{k} {c['us']} ({c['fraction_of_copy']})" if isinstance(c, dict) else f"{k} {c}"
                    for k, c in cell.items()))
                continue

            def rows_call():
                study_rows(pt.pool, pt.rows, pt.count, compact, pt.index, var)

            if name not in PAGES_ONLY:
                for tname, tm in (("cold", timer), ("kernel", kt)):
                    us = tm.time_us(rows_call)
                    pt.index[: pt.live_rows] = pt.tokens.flatten()
                    cell[f"rows_{tname}"] = describe_time(us, moved, copy_tb) if us else None
            for page in (1, 64):
                table = tables[page]
                out = scratch[: min(pool_tokens // page, table.numel()) * page]
                table_out = torch.empty_like(table)

                def pages_call():
                    study_pages(pt.pool, table, pt.lens, page, out, table_out, var)

                for tname, tm in (("cold", timer), ("kernel", kt)):
                    us = tm.time_us(pages_call)
                    cell[f"pages{page}_{tname}"] = describe_time(us, moved, copy_tb) if us else None
                # exact against torch at this point
                flat = table_out[:, : -(-ctx // page)].flatten().long()
                got = out.view(-1, page, 576)[flat].view(-1, 576)
                src_pages = table[:, : -(-ctx // page)].flatten().long()
                want_out = pt.pool.view(-1, page, 576)[src_pages].view(FP8).to(BF16).view(-1, 576)
                cell[f"pages{page}_exact"] = bool(torch.equal(got.view(torch.int16), want_out.view(torch.int16))
                                                  and torch.equal(flat.sort().values.cpu(),
                                                                  torch.arange(pt.live_rows // page)))
            if name not in PAGES_ONLY:
                rows_call()
                want = pt.pool[pt.tokens.flatten().long()].view(FP8).to(BF16)
                cell["rows_exact"] = bool(torch.equal(compact[: pt.live_rows].view(-1, 576).view(torch.int16),
                                                      want.view(torch.int16))
                                          and torch.equal(pt.index[: pt.live_rows].cpu(),
                                                          torch.arange(pt.live_rows, dtype=torch.int32)))
                pt.index[: pt.live_rows] = pt.tokens.flatten()
            row["variants"][name] = cell
            log(f"{pool_tokens} bs {bs} ctx {ctx} {name}: " + ", ".join(
                f"{k} {c['us']} ({c['fraction_of_copy']})" if isinstance(c, dict) else f"{k} {c}"
                for k, c in cell.items()))
        results["points"].append(row)
        results["resident"] = {f"{k[0]} {dict(k[1])}": v for k, v in _RESIDENT.items()}
        (out_dir / "study.json").write_text(json.dumps(results, indent=1) + "\n")
        del pt
        torch.cuda.empty_cache()
    return results


def describe_compiled() -> list[dict]:
    """Registers, spills, shared memory and resident programs per SM of every compiled live kernel."""
    rows = []
    for kernel in (kv_cast._gather_live_kernel, _candidate_gather_kernel, _early_gather_kernel, _study_gather_kernel,
                   _pipelined_gather_kernel, _l2pf_gather_kernel, _diag_gather_kernel,
                   _flat2d_gather_kernel):
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                compiled._init_handles()
                names = compiled.src.fn.arg_names
                consts = {(names[k[0]] if isinstance(k, tuple) and len(k) == 1 else k): v
                          for k, v in getattr(compiled.src, "constants", {}).items()}
                rows.append({"kernel": compiled.name, "n_regs": compiled.n_regs, "n_spills": compiled.n_spills,
                             "shared": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps,
                             "resident_per_sm": resident_per_sm(compiled, compiled.metadata.num_warps),
                             "async_copies": compiled.asm.get("ttgir", "").count("async_copy_global_to_local"),
                             "constants": {str(k): str(v) for k, v in consts.items()}})
    return rows


def summarize(results: dict, names: list[str]) -> str:
    lines = []
    for p in results["points"]:
        head = f"{p['pool']:>8} bs{p['bs']:<4} ctx{p['ctx']:<6} contig {p['contiguous_cast_kernel_us']:.1f}"
        lines.append(head)
        for name in names:
            c = p["variants"].get(name, {})
            cells = []
            for key in ("rows_cold", "rows_kernel", "pages1_cold", "pages1_kernel", "pages64_cold", "pages64_kernel"):
                x = c.get(key)
                cells.append(f"{x['us']:7.1f} {x['fraction_of_copy']:.3f}" if x else " " * 13)
            ok = all(v for k, v in c.items() if k.endswith("exact"))
            lines.append(f"   {name:<15} " + " | ".join(cells) + ("" if ok else "  NOT EXACT"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.studies.live_study")
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--variants", default="kv_cast,kv_cast_pps16,candidate_pps32,candidate,off32_late")
    args = p.parse_args(argv)
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        os.execve(sys.executable, [sys.executable, "-m", "kernels.studies.live_study", *(argv or sys.argv[1:])],
                  {**os.environ, "TRITON_INTERPRET": "1"})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = StudyLog(out / "study.log")

    names = args.variants.split(",")
    dev = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        kv_cast.LIVE_CONFIG.update(ROWS=8)
    bad = {}
    for name in names:
        if VARIANTS[name].get("kind") == "diag":  # row ids 0..n-1 only: checked at every point instead
            continue
        try:
            f = check_variant(name, VARIANTS[name], dev, tokens=512 if args.smoke else 40_960)
        except Exception as e:  # a variant that does not compile is dropped, the others still run
            f = [f"{type(e).__name__}: {str(e)[-1500:]}"]
        log(f"check {name}: {f or 'exact'}")
        if f:
            bad[name] = f
    if args.smoke:
        return 1 if bad else 0
    names = [n for n in names if n not in bad]
    results = time_variants(log, out, names)
    try:
        results["compiled"] = describe_compiled()
    except Exception as e:  # diagnostics only
        results["compiled"] = repr(e)
    (out / "study.json").write_text(json.dumps(results, indent=1) + "\n")
    if HAS_TRITON:  # the pipelined kernels' TTGIR (does the pipeliner make async copies of both loads?)
        with open(out / "pipelined.ttgir", "w") as f:
            for cache in _pipelined_gather_kernel.device_caches.values():
                for compiled in cache[0].values():
                    f.write(f"// ===== {compiled.metadata.num_warps} warps, {compiled.n_regs} regs\n")
                    f.write(compiled.asm.get("ttgir", "") + "\n")
    for c in results["compiled"] if isinstance(results["compiled"], list) else []:
        log(f"compiled {c['kernel']}: {c['n_regs']} regs, {c['n_spills']} spills, {c['shared']} B shared, "
            f"{c['num_warps']} warps -> {c['resident_per_sm']}/SM, {c.get('async_copies', 0)} async copies; "
            + ",".join(f"{k}={v}" for k, v in c["constants"].items() if len(k) < 12))
    log("resident " + json.dumps(results["resident"]))
    log("rows cold | rows kernel | pages1 cold | pages1 kernel | pages64 cold | pages64 kernel (us, of copy)\n"
        + summarize(results, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
