"""kernels.kv_cast on the CPU: the torch fallbacks bit-exact against `.to(torch.bfloat16)`, and
the live-row (bounded-grid) Triton kernels under Triton's interpreter against the fallbacks.

The interpreter tests run in a subprocess (TRITON_INTERPRET=1 must be set before triton is
imported); triton comes with requirements.txt, so a missing triton fails them.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.kv_cast import (
    FP8,
    _fits_int32,
    cast_fp8_to_bf16,
    cast_rows_fp8_to_bf16,
    copy_live_indices,
    gather_cast_fp8_to_bf16,
    gather_cast_live_pages,
    gather_cast_live_rows,
    gather_cast_planned_pages,
    plan_live_pages,
)

ROOT = Path(__file__).resolve().parents[1]


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same bit patterns everywhere except NaN, which must be NaN on both sides."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def all_patterns() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8)


def test_cast_all_256_patterns_uint8_and_fp8():
    pat = all_patterns()
    want = pat.view(FP8).to(torch.bfloat16)
    assert torch.isnan(want).sum() == 2  # 0x7F and 0xFF
    assert_bits_equal(cast_fp8_to_bf16(pat), want)
    assert_bits_equal(cast_fp8_to_bf16(pat.view(FP8)), want)
    assert want[0x38].item() == 1.0 and want[0x7E].item() == 448.0 and want[0x01].item() == 2.0**-9


def test_cast_random_buffer_into_out():
    src = torch.randint(0, 256, (333, 576), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    out = torch.empty(333, 576, dtype=torch.bfloat16)
    assert cast_fp8_to_bf16(src, out) is out
    assert_bits_equal(out, src.view(FP8).to(torch.bfloat16))


def test_gather_cast_random_rows_and_patterns():
    gen = torch.Generator().manual_seed(2)
    pool = torch.randint(0, 256, (1000, 576), dtype=torch.uint8, generator=gen)
    pool[:16] = all_patterns().view(16, 16).repeat(1, 36)  # every pattern inside the pool too
    rows = torch.cat([torch.arange(16), torch.randperm(1000, generator=gen)[:300]])
    for index in (rows, rows.to(torch.int32)):
        got = gather_cast_fp8_to_bf16(pool, index)
        assert_bits_equal(got, pool[rows].view(FP8).to(torch.bfloat16))


def test_gather_cast_stops_at_n_active():
    pool = torch.randint(0, 256, (64, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([5, 9, 63, 0, 17], dtype=torch.int32)
    out = torch.zeros(5, 8, dtype=torch.bfloat16)
    gather_cast_fp8_to_bf16(pool.view(FP8), rows, torch.tensor([3], dtype=torch.int32), out)
    assert_bits_equal(out[:3], pool[rows[:3].long()].view(FP8).to(torch.bfloat16))
    assert torch.count_nonzero(out[3:]) == 0


def test_cast_rows_writes_only_the_referenced_rows():
    pool = torch.randint(0, 256, (50, 1, 576), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    scratch = torch.zeros(50, 1, 576, dtype=torch.bfloat16)
    rows = torch.tensor([3, 40, 7, 11])
    cast_rows_fp8_to_bf16(pool, rows, torch.tensor([3]), scratch)
    want = pool.view(FP8).to(torch.bfloat16)
    assert_bits_equal(scratch[[3, 40, 7]], want[[3, 40, 7]])
    untouched = torch.ones(50, dtype=torch.bool)
    untouched[[3, 40, 7]] = False
    assert torch.count_nonzero(scratch[untouched]) == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: cast_fp8_to_bf16(torch.zeros(4, dtype=torch.float16)), "src: dtype torch.float16"),
        (lambda: gather_cast_fp8_to_bf16(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(2)), "rows:"),
        (lambda: gather_cast_fp8_to_bf16(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64),
                                         torch.tensor([1, 2])), "n_active:"),
        (lambda: cast_rows_fp8_to_bf16(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64),
                                       None, torch.zeros(3, 8, dtype=torch.bfloat16)), "out:"),
        (lambda: cast_fp8_to_bf16(torch.zeros(4, dtype=torch.uint8), backend="cuda"), "backend:"),
        (lambda: gather_cast_live_rows(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(6, dtype=torch.int32),
                                       torch.tensor([1]), torch.zeros(5, 4, dtype=torch.bfloat16)), "out: 5 rows"),
        (lambda: gather_cast_live_rows(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32),
                                       torch.tensor([1]), torch.zeros(5, 4, dtype=torch.bfloat16),
                                       index=torch.zeros(9, dtype=torch.int32)), "out: 5 rows; needs"),
        (lambda: gather_cast_live_rows(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32),
                                       torch.tensor([1]), torch.zeros(8, 4, dtype=torch.bfloat16),
                                       index=torch.zeros(9, dtype=torch.int32)), "rows: 2 entries"),
        (lambda: gather_cast_live_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.int64),
                                        torch.zeros(2, dtype=torch.int32), 1, torch.zeros(8, 4, dtype=torch.bfloat16),
                                        torch.zeros(2, 3, dtype=torch.int32)), "page_table:"),
        (lambda: gather_cast_live_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.int32),
                                        torch.zeros(2, dtype=torch.int32), 4, torch.zeros(4, 4, dtype=torch.bfloat16),
                                        torch.zeros(2, 3, dtype=torch.int32)), "out: 1 pages"),
        (lambda: gather_cast_live_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.int32),
                                        torch.zeros(2, dtype=torch.int32), 3, torch.zeros(8, 4, dtype=torch.bfloat16),
                                        torch.zeros(2, 3, dtype=torch.int32)), "page_size: 3"),
        (lambda: plan_live_pages(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 1, 6,
                                 torch.zeros(5, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                 torch.zeros(2, 3, dtype=torch.int32)),
         "flat: torch.int32 \\[5\\], expected int32 \\[>= 6\\]"),
        (lambda: plan_live_pages(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 1, 6,
                                 torch.zeros(6, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                 torch.zeros(2, 3, dtype=torch.int32)), "count: expected a 1-element"),
        (lambda: plan_live_pages(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 1, 6,
                                 torch.zeros(6, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                 torch.zeros(3, 2, dtype=torch.int32)), "table_out:"),
        (lambda: gather_cast_planned_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(3, dtype=torch.int32),
                                           torch.zeros(1, dtype=torch.int32), 6, 1,
                                           torch.zeros(6, 4, dtype=torch.bfloat16)), "flat: 3 entries"),
        (lambda: gather_cast_planned_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(6, dtype=torch.int32),
                                           torch.zeros(1, dtype=torch.int32), 6, 3,
                                           torch.zeros(6, 4, dtype=torch.bfloat16)), "page_size: 3"),
        (lambda: gather_cast_planned_pages(torch.zeros(8, 4, dtype=torch.uint8), torch.zeros(6, dtype=torch.int32),
                                           torch.zeros(1, dtype=torch.int32), 12, 1,
                                           torch.zeros(6, 4, dtype=torch.bfloat16)), "out: 6 pages; needs"),
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- live-row kernels: torch fallbacks -----------------------------------------------------

def random_pool(tokens: int, seed: int, dim: int = 576) -> torch.Tensor:
    pool = torch.randint(0, 256, (tokens, 1, dim), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    pool[:16, 0] = all_patterns().view(16, 16).repeat(1, dim // 16)
    return pool


def test_live_rows_compact_rewrites_the_index_and_stops_at_the_count():
    pool = random_pool(200, 5)
    index = torch.randperm(200, generator=torch.Generator().manual_seed(6))[:120].to(torch.int32)
    rows = index.clone()
    out = torch.full((120, 1, 576), 9.0, dtype=torch.bfloat16)
    gather_cast_live_rows(pool, rows, torch.tensor([70], dtype=torch.int32), out, index=index)
    assert_bits_equal(out[:70, 0], pool[rows[:70].long(), 0].view(FP8).to(torch.bfloat16))
    assert torch.all(out[70:] == 9.0)  # past the live count: untouched
    assert torch.equal(index[:70], torch.arange(70, dtype=torch.int32)) and torch.equal(index[70:], rows[70:])


def test_live_rows_overflow_casts_in_place_and_keeps_the_index():
    pool = random_pool(64, 7)
    index = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(8), dtype=torch.int32)
    before = index.clone()
    out = torch.full((64, 1, 576), 9.0, dtype=torch.bfloat16)
    gather_cast_live_rows(pool, index[:64].clone(), torch.tensor([250]), out, index=index)
    used = before[:250].long().unique()
    assert_bits_equal(out[used, 0], pool[used, 0].view(FP8).to(torch.bfloat16))
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[used] = False
    assert torch.all(out[untouched] == 9.0) and torch.equal(index, before)


def test_live_pages_compact_table_and_overflow():
    pool = random_pool(256, 9, dim=32)
    gen = torch.Generator().manual_seed(10)
    for page, lens, want_compact in ((1, [5, 0, 17], True), (4, [5, 0, 17], True), (4, [40] * 8, False)):
        bs = len(lens)
        table = torch.randint(0, 256 // page, (bs, 10), generator=gen, dtype=torch.int32)
        cap = min(256 // page, bs * 10)
        out = torch.full((cap * page, 1, 32), 9.0, dtype=torch.bfloat16)
        table_out = torch.full_like(table, -1)
        gather_cast_live_pages(pool, table, torch.tensor(lens, dtype=torch.int32), page, out, table_out)
        n_pages = [min(-(-n // page), 10) for n in lens]
        start = 0
        for b, n in enumerate(n_pages):
            dst = table_out[b, :n].long()
            if want_compact:
                assert torch.equal(dst, torch.arange(start, start + n))
            else:
                assert torch.equal(dst, table[b, :n].long())
            got = out.view(-1, page, 32)[dst]
            assert_bits_equal(got.reshape(-1, 32), pool.view(-1, page, 32)[table[b, :n].long()].view(FP8)
                              .to(torch.bfloat16).reshape(-1, 32))
            assert torch.all(table_out[b, n:] == -1)
            start += n


def test_live_pages_overflow_casts_the_whole_pool_in_place():
    """More live pages than the pool has (requests sharing pages): the table is kept and the whole
    pool is cast at its own positions, unreferenced pages included."""
    pool = random_pool(64, 13, dim=32)
    table = torch.randint(0, 16, (6, 10), generator=torch.Generator().manual_seed(14), dtype=torch.int32)
    lens = torch.tensor([40, 40, 40, 40, 40, 1], dtype=torch.int32)  # 10 x 5 + 1 = 51 pages > 16
    out = torch.full((64, 1, 32), 9.0, dtype=torch.bfloat16)
    table_out = torch.full_like(table, -1)
    gather_cast_live_pages(pool, table, lens, 4, out, table_out)
    assert_bits_equal(out, pool.view(FP8).to(torch.bfloat16))
    assert torch.equal(table_out[:5], table[:5]) and table_out[5, 0] == table[5, 0]
    assert torch.all(table_out[5, 1:] == -1)


def test_one_page_plan_serves_every_layer():
    """plan_live_pages once, gather_cast_planned_pages for three layers' pools: each layer's pages,
    through the one compacted table, equal the pool's; the plan's buffers are not rewritten."""
    gen = torch.Generator().manual_seed(15)
    pools = [random_pool(256, 16 + i, dim=32) for i in range(3)]
    table = torch.randint(0, 64, (4, 12), generator=gen, dtype=torch.int32)
    lens = torch.tensor([9, 0, 30, 17], dtype=torch.int32)
    pages = [3, 0, 8, 5]
    flat, count = torch.full((48,), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    table_out = torch.full_like(table, -1)
    plan_live_pages(table, lens, 4, 48, flat, count, table_out)
    assert count.item() == 16 and torch.equal(flat[16:], torch.full((32,), -1, dtype=torch.int32))
    planned = (flat.clone(), count.clone(), table_out.clone())
    for pool in pools:
        out = torch.full((48 * 4, 1, 32), 9.0, dtype=torch.bfloat16)
        gather_cast_planned_pages(pool, flat, count, table.numel(), 4, out)
        for b, n in enumerate(pages):
            got = out.view(-1, 4, 32)[table_out[b, :n].long()]
            want = pool.view(-1, 4, 32)[table[b, :n].long()].view(FP8).to(torch.bfloat16)
            assert_bits_equal(got.reshape(-1, 32), want.reshape(-1, 32))
        assert torch.all(out[16 * 4:] == 9.0)  # past the live pages: untouched
    assert all(torch.equal(a, b) for a, b in zip((flat, count, table_out), planned))


def test_page_plan_zero_tail_writes_the_padding_page_past_each_request():
    """zero_tail (the patch's fresh, torch.empty table): every entry past a request's pages is page 0,
    in the compact and the overflow plan; without it a caller-owned table keeps its tail."""
    table = torch.randint(1, 16, (3, 6), generator=torch.Generator().manual_seed(21), dtype=torch.int32)
    for lens, capacity, compact in (([5, 0, 9], 16, True), ([24, 24, 24], 16, False)):
        lens = torch.tensor(lens, dtype=torch.int32)
        pages = [min(-(-int(n) // 4), 6) for n in lens]
        for zero_tail, tail in ((True, 0), (False, -1)):
            flat, count = torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
            table_out = torch.full_like(table, -1)
            plan_live_pages(table, lens, 4, capacity, flat, count, table_out, zero_tail=zero_tail)
            assert count.item() == sum(pages)
            start = 0
            for b, n in enumerate(pages):
                want = torch.arange(start, start + n, dtype=torch.int32) if compact else table[b, :n]
                assert torch.equal(table_out[b, :n], want)
                assert torch.all(table_out[b, n:] == tail), (compact, zero_tail, table_out[b])
                start += n


def test_copy_live_indices_stops_at_the_count():
    out = torch.full((10,), -1, dtype=torch.int32)
    copy_live_indices(torch.arange(20, dtype=torch.int32), torch.tensor([6]), out)
    assert out.tolist() == [0, 1, 2, 3, 4, 5] + [-1] * 4


def _meta_rows(rows: int, dim: int = 576, row_stride: int | None = None) -> torch.Tensor:
    """A [rows, dim] uint8 view with the given row stride and no memory behind it (meta device)."""
    return torch.empty_strided((rows, dim), (row_stride or dim, 1), dtype=torch.uint8, device="meta")


# _fits_int32(pool2d, out2d, n_max, most_rows, pieces per row, pieces per block, programs):
# 576-wide rows in 36 pieces of 16, blocks of 512 pieces, an H200's 132 SMs x 32 programs.
GRID = {"pieces": 36, "chunks": 512, "programs": 132 * 32}
LAST_FITTING_ROWS = (2**31 - 1) // 576  # 3,728,270 rows x 576 = 2,147,483,520 elements < 2**31


@pytest.mark.parametrize("case, pool_rows, out_rows, n_max, most_rows, fits", [
    # every shape of the serving grid (kernels/studies/serving_grid.py): int32
    ("grid rows path, 1M pool, bs 128", 1_048_576, 1_048_576, 128 * 163_840, 1_048_576, True),
    ("grid pages path, 1M pool, bs 128, pages of 64", 1_048_576, 1_048_576, 128 * 2_560, 1_048_576, True),
    # the pool alone decides: rows x 576 elements below 2**31 or not
    ("pool of the last fitting row count", LAST_FITTING_ROWS, 1_024, 1_024, 1_024, True),
    ("pool one row larger", LAST_FITTING_ROWS + 1, 1_024, 1_024, 1_024, False),
    # the scratch alone decides, and its live rows' block overshoot counts too
    ("scratch one row past the limit", 1_024, LAST_FITTING_ROWS + 1, 1_024, 1_024, False),
    ("scratch that fits, live rows short of it", 1_024, 3_700_000, 3_700_000, 3_600_000, True),
    ("scratch that fits, filled: a block past its end does not", 1_024, 3_700_000, 3_700_000, 3_700_000, False),
    # the live count alone decides
    ("index of 2**31 entries", 1_024, 1_024, 2**31, 1_024, False),
])
def test_fits_int32_chooses_offsets_by_shape(case, pool_rows, out_rows, n_max, most_rows, fits):
    assert _fits_int32(_meta_rows(pool_rows), _meta_rows(out_rows), n_max, most_rows, **GRID) is fits, case


def test_fits_int32_counts_row_strides_not_only_shapes():
    """A pool viewed with a longer row stride (rows of a wider buffer) reaches further."""
    rows = 2**31 // 1024
    assert _fits_int32(_meta_rows(rows - 1, row_stride=1024), _meta_rows(8), 8, 8, **GRID)
    assert not _fits_int32(_meta_rows(rows, row_stride=1024), _meta_rows(8), 8, 8, **GRID)
    assert not _fits_int32(_meta_rows(8), _meta_rows(rows, row_stride=1024), 8, 8, **GRID)


# --- live-row kernels: Triton's interpreter against the fallbacks --------------------------

# both interpreted scripts compare tensors with this
_SAME = r"""
import torch


def same(a, b):  # every bit, except that a NaN only has to be NaN (torch on the CPU writes other bits)
    if a.dtype != torch.bfloat16:
        return torch.equal(a, b)
    nan = torch.isnan(b)
    return torch.equal(torch.isnan(a), nan) and torch.equal(a.view(torch.int16)[~nan], b.view(torch.int16)[~nan])
"""

_INTERPRETED = _SAME + r"""
from kernels.kv_cast import (FP8, LIVE_CONFIG, cast_rows_fp8_to_bf16, copy_live_indices, gather_cast_fp8_to_bf16,
                             gather_cast_live_pages, gather_cast_live_rows, gather_cast_planned_pages,
                             plan_live_pages)


def both(fn, *tensors):
    got = [t.clone() for t in tensors]
    want = [t.clone() for t in tensors]
    fn("triton", *got)
    fn("torch", *want)
    return all(same(g, w) for g, w in zip(got, want))

LIVE_CONFIG.update(ROWS=8, PROGRAMS_PER_SM=1)  # 4 programs on the CPU: each loops over many blocks (pieces split rows)
gen = torch.Generator().manual_seed(0)
N, D = 512, 576
pool = torch.randint(0, 256, (N, 1, D), dtype=torch.uint8, generator=gen)
pool[:16, 0] = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(16, 16).repeat(1, D // 16)
failures = []
for cap, n_index, count in ((300, 300, 200), (300, 300, 0), (300, 300, 300), (N, 900, 400), (N, 900, 700)):
    index = torch.randint(0, N, (n_index,), generator=gen, dtype=torch.int32)
    index[:16] = torch.arange(16)
    rows = index[:cap].clone()
    out = torch.full((cap, 1, D), 7.0, dtype=torch.bfloat16)
    if not both(lambda be, o, i: gather_cast_live_rows(pool, rows, torch.tensor([count]), o, index=i, backend=be),
                out, index):
        failures.append(("rows", cap, n_index, count))
for page in (1, 4, 64):
    for bs, width, scale in ((3, 8, 0.5), (5, N // page, 0.3), (8, N // page, 1.0)):
        table = torch.randint(0, N // page, (bs, width), generator=gen, dtype=torch.int32)
        k = min(width, 16 // page + 1)
        table[0, :k] = torch.arange(k)
        lens = (torch.rand(bs, generator=gen) * scale * width * page).to(torch.int32)
        cap = min(bs * width, N // page)
        out = torch.full((cap * page, 1, D), 7.0, dtype=torch.bfloat16)
        table_out = torch.full_like(table, -5)
        if not both(lambda be, o, t: gather_cast_live_pages(pool, table, lens, page, o, t, backend=be), out, table_out):
            failures.append(("pages", page, bs, width, scale))
# one plan, three layers' pools (the FA3 path plans once per forward): compact and overflow
pools = [pool] + [torch.randint(0, 256, (N, 1, D), dtype=torch.uint8, generator=gen) for _ in range(2)]
# (bs 17 and 100: the plan reads the pages' running sum, one compiled kernel for every bs; zero_tail: a fresh
# table's entries past each request's pages are 0, as SGLang zeroes a torch.empty table's tail)
for page in (1, 64):
    for bs, width, scale in ((4, N // page // 4, 0.6), (8, N // page, 1.0), (17, 3, 0.9), (100, 4, 0.8)):
        table = torch.randint(0, N // page, (bs, width), generator=gen, dtype=torch.int32)
        lens = (torch.rand(bs, generator=gen) * scale * width * page).to(torch.int32)
        cap = min(bs * width, N // page)
        for zero_tail in (False, True):

            def layers(be, table_out, *outs):
                flat, count = torch.zeros(max(1, cap), dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
                plan_live_pages(table, lens, page, cap, flat, count, table_out, zero_tail=zero_tail, backend=be)
                for layer_pool, o in zip(pools, outs):
                    gather_cast_planned_pages(layer_pool, flat, count, bs * width, page, o, backend=be)

            outs = [torch.full((cap * page, 1, D), 7.0, dtype=torch.bfloat16) for _ in pools]
            if not both(layers, torch.full_like(table, -5), *outs):
                failures.append(("plan shared by layers", page, bs, width, zero_tail))
dst = torch.full((300,), -1, dtype=torch.int32)
if not both(lambda be, d: copy_live_indices(torch.arange(1000, dtype=torch.int32), torch.tensor([257]), d, backend=be),
            dst):
    failures.append("copy")
# the exact-grid kernels (the fused reference strategy and the old patch kernel) share _move_rows
rows = torch.randint(0, N, (100,), generator=gen, dtype=torch.int64)
for count in (0, 37, 100):
    if not both(lambda be, o: gather_cast_fp8_to_bf16(pool, rows, torch.tensor([count]), o, backend=be),
                torch.full((100, D), 7.0, dtype=torch.bfloat16)):
        failures.append(("gather", count))
    if not both(lambda be, o: cast_rows_fp8_to_bf16(pool, rows, torch.tensor([count]), o, backend=be),
                torch.full((N, 1, D), 7.0, dtype=torch.bfloat16)):
        failures.append(("cast_rows", count))
print("failures", failures)
print("ok" if not failures else "FAILED")
"""


# Each offset width of the compact gather, forced through its launcher (callers pass None and get
# int32 for any pool under 2**31 elements, so int64 is otherwise never run here): the launcher
# calls of gather_cast_live_rows and gather_cast_live_pages, written out with offsets_32 added.
_OFFSET_WIDTHS = _SAME + r"""
from kernels.kv_cast import (LIVE_CONFIG, _as_pool_2d, _launch_gather_live, _launch_index_pages,
                             gather_cast_live_pages, gather_cast_live_rows)


def rows_call(width, pool, rows, count, out, index):
    if width == "fallback":
        gather_cast_live_rows(pool, rows, count, out, index=index, backend="torch")
    else:
        out2d = out.view(out.shape[0], -1)
        _launch_gather_live(_as_pool_2d(pool), rows, index, count, out2d, index.numel(), out2d.shape[0], 1,
                            offsets_32=width == "int32")

def pages_call(width, pool, table, lens, page, out, table_out):
    if width == "fallback":
        gather_cast_live_pages(pool, table, lens, page, out, table_out, backend="torch")
    else:
        pool2d, out2d = _as_pool_2d(pool), out.view(out.shape[0], -1)
        capacity, (bs, w) = out2d.shape[0] // page, table.shape
        flat = torch.empty(max(1, min(capacity, bs * w)), dtype=torch.int32)
        count = torch.empty(1, dtype=torch.int32)
        _launch_index_pages(table, lens, flat, count, table_out, capacity, page)
        _launch_gather_live(pool2d, flat, None, count, out2d, bs * w, capacity, page, offsets_32=width == "int32")

def widths_agree(call, inputs, outputs):
    got = {}
    for width in ("int32", "int64", "fallback"):
        got[width] = [t.clone() for t in outputs]
        call(width, *inputs, *got[width])
    return all(same(g, w) for width in ("int32", "int64") for g, w in zip(got[width], got["fallback"]))

LIVE_CONFIG.update(PROGRAMS_PER_SM=1)  # 4 programs on the CPU, each looping over many blocks
gen = torch.Generator().manual_seed(1)
N, D = 512, 576
pool = torch.randint(0, 256, (N, 1, D), dtype=torch.uint8, generator=gen)
pool[:16, 0] = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(16, 16).repeat(1, D // 16)
failures = []
for cap, n_index, count, dtype in ((300, 300, 211, torch.int32), (300, 300, 300, torch.int64),
                                   (N, 900, 700, torch.int32)):
    index = torch.randint(0, N, (n_index,), generator=gen, dtype=dtype)
    index[:16] = torch.arange(16)
    out = torch.full((cap, 1, D), 7.0, dtype=torch.bfloat16)
    if not widths_agree(rows_call, (pool, index[:cap].clone(), torch.tensor([count])), (out, index)):
        failures.append(("rows", cap, n_index, count, dtype))
for page in (1, 64):
    bs, width = 5, N // page
    table = torch.randint(0, N // page, (bs, width), generator=gen, dtype=torch.int32)
    lens = (torch.rand(bs, generator=gen) * 0.3 * width * page).to(torch.int32)
    out = torch.full((min(bs * width, N // page) * page, 1, D), 7.0, dtype=torch.bfloat16)
    if not widths_agree(pages_call, (pool, table, lens, page), (out, torch.full_like(table, -5))):
        failures.append(("pages", page))
print("failures", failures)
print("ok" if not failures else "FAILED")
"""


def run_interpreted(tmp_path: Path, source: str) -> None:
    """Run `source` under TRITON_INTERPRET=1 in a subprocess; it prints "ok" last when it passes."""
    import triton  # noqa: F401  (requirements.txt installs it: its interpreter runs the kernels here)

    script = tmp_path / "interpreted.py"
    script.write_text(source)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_live_kernels_under_triton_interpreter_match_the_fallbacks(tmp_path):
    """The bounded-grid kernels (4 programs looping over many blocks) under TRITON_INTERPRET=1:
    compact and overflow modes, count 0 and full, page sizes 1, 4 and 64, every output tensor
    (scratch, rewritten index, compacted table) compared with the torch fallback."""
    run_interpreted(tmp_path, _INTERPRETED)


@pytest.mark.slow
def test_live_gather_int32_and_int64_offsets_under_triton_interpreter(tmp_path):
    """_gather_live_kernel with OFFSETS_32 forced on and off: rows compact (int32 and int64 row
    ids, index rewritten) and overflow, pages of 1 and 64 rows, each bit-exact against the
    fallback, scratch, index and compacted table included."""
    run_interpreted(tmp_path, _OFFSET_WIDTHS)
