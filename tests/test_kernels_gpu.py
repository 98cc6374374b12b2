"""Triton kernels and the workload on a CUDA GPU (marked `gpu`; skipped without CUDA).

kernels.studies.gpu_suite runs these on the lent H200, through pytest when it is installed there and
by calling each `test_*` function directly when it is not, so they take no fixtures.
"""

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # the GPU machine may lack pytest; gpu_suite then calls the tests itself
    pytest = None

import torch

from kernels.kv_cast import (
    FP8,
    _as_pool_2d,
    _launch_gather_live,
    _launch_index_pages,
    cast_fp8_to_bf16,
    cast_rows_fp8_to_bf16,
    copy_live_indices,
    gather_cast_fp8_to_bf16,
    gather_cast_live_pages,
    gather_cast_live_rows,
    gather_cast_planned_pages,
    plan_live_pages,
)
from kernels.workload import KV_STRATEGIES, DecodeWorkload, build_model, fill_fp8_pool, get_config


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same bit patterns everywhere, NaN included (torch on CUDA writes NaN as 0x7FFF)."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def random_pool(tokens: int = 20_000, dim: int = 576, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool = torch.randint(0, 256, (tokens, dim), dtype=torch.uint8, device="cuda", generator=gen)
    pool[:16] = torch.arange(256, device="cuda", dtype=torch.int32).to(torch.uint8).view(16, 16).repeat(1, dim // 16)
    return pool


def test_triton_cast_all_256_patterns():
    pat = torch.arange(256, device="cuda", dtype=torch.int32).to(torch.uint8)
    assert_bits_equal(cast_fp8_to_bf16(pat, backend="triton"), pat.view(FP8).to(torch.bfloat16))


def test_triton_cast_random_buffers_of_odd_sizes():
    for n in (1, 1000, 8192 * 3 + 17, 495_000 * 576 // 100):
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        assert_bits_equal(cast_fp8_to_bf16(src.view(FP8), backend="triton"), src.view(FP8).to(torch.bfloat16))


def test_triton_gather_cast_random_rows():
    pool = random_pool()
    for n, dtype in ((16, torch.int64), (2048, torch.int32), (19_000, torch.int64)):
        rows = torch.randperm(pool.shape[0], device="cuda")[:n].to(dtype)
        rows[: min(n, 16)] = torch.arange(min(n, 16), device="cuda")  # the 256 patterns
        got = gather_cast_fp8_to_bf16(pool, rows, backend="triton")
        assert_bits_equal(got, pool[rows.long()].view(FP8).to(torch.bfloat16))


def test_triton_gather_cast_reads_n_active_inside_a_cuda_graph():
    pool = random_pool()
    rows = torch.randperm(pool.shape[0], device="cuda")[:1000]
    n_active = torch.tensor([1000], dtype=torch.int32, device="cuda")
    out = torch.zeros(1000, 576, dtype=torch.bfloat16, device="cuda")
    gather_cast_fp8_to_bf16(pool, rows, n_active, out, backend="triton")  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gather_cast_fp8_to_bf16(pool, rows, n_active, out, backend="triton")
    out.zero_()
    n_active.fill_(300)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out[:300], pool[rows[:300]].view(FP8).to(torch.bfloat16))
    assert torch.count_nonzero(out[300:]) == 0


def test_triton_cast_rows_touches_only_referenced_rows():
    pool = random_pool(tokens=5000)
    rows = torch.randperm(5000, device="cuda")[:700]
    scratch = torch.zeros(5000, 576, dtype=torch.bfloat16, device="cuda")
    cast_rows_fp8_to_bf16(pool, rows, torch.tensor([500], device="cuda"), scratch, backend="triton")
    used = rows[:500]
    assert_bits_equal(scratch[used], pool[used].view(FP8).to(torch.bfloat16))
    untouched = torch.ones(5000, dtype=torch.bool, device="cuda")
    untouched[used] = False
    assert torch.count_nonzero(scratch[untouched]) == 0


def test_pool_fill_has_no_nan():
    pool = fill_fp8_pool(10_000, 576, torch.Generator(device="cuda").manual_seed(0), "cuda")
    values = pool.view(FP8).to(torch.bfloat16)
    assert not torch.isnan(values).any() and values.abs().max().item() < 2


def test_tiny_strategies_agree_eager_and_graph():
    cfg = get_config("tiny")
    outputs = {}
    for kv in KV_STRATEGIES:
        for graph in (False, True):
            workload = DecodeWorkload(build_model(cfg, "cuda"), kv, cuda_graph=graph)
            outputs[kv, graph] = workload.run_step().clone()
    want = outputs["full-pool-cast", False]
    assert torch.isfinite(want).all()
    for key, got in outputs.items():
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, msg=f"{key} differs from eager full-pool-cast")


def assert_same_outputs(got: list, want: list) -> None:
    for g, w in zip(got, want):
        if g.dtype == torch.bfloat16:
            assert_bits_equal(g, w)
        else:
            assert torch.equal(g, w)


def test_live_rows_and_pages_match_torch_bit_for_bit():
    """Compact and overflow modes, page sizes 1 and 64; untouched rows and entries compared too."""
    pool = random_pool(tokens=12_800)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for n_index, count in ((6_000, 4_000), (6_000, 0), (30_000, 20_000)):
        index = torch.randint(0, 12_800, (n_index,), generator=gen, device="cuda", dtype=torch.int32)
        index[:16] = torch.arange(16, device="cuda")
        cap = min(n_index, 12_800)
        rows = index[:cap].clone()
        outs = {}
        for backend in ("triton", "torch"):
            out, idx = torch.full((cap, 576), -2.0, dtype=torch.bfloat16, device="cuda"), index.clone()
            gather_cast_live_rows(pool, rows, torch.tensor([count], device="cuda"), out, index=idx, backend=backend)
            outs[backend] = [out, idx]
        assert_same_outputs(outs["triton"], outs["torch"])
    for page in (1, 64):
        for bs, width, scale in ((6, 12_800 // page // 8, 0.5), (8, 12_800 // page // 2, 1.0)):
            table = torch.randint(0, 12_800 // page, (bs, width), generator=gen, device="cuda", dtype=torch.int32)
            lens = (torch.rand(bs, generator=gen, device="cuda") * scale * width * page).to(torch.int32)
            cap = min(bs * width, 12_800 // page)
            outs = {}
            for backend in ("triton", "torch"):
                out = torch.full((cap * page, 576), -2.0, dtype=torch.bfloat16, device="cuda")
                table_out = torch.full_like(table, -1)
                gather_cast_live_pages(pool, table, lens, page, out, table_out, backend=backend)
                outs[backend] = [out, table_out]
            assert_same_outputs(outs["triton"], outs["torch"])


def test_live_gather_int32_and_int64_offsets_match_torch():
    """_gather_live_kernel compiled with OFFSETS_32 on and off (callers get int32 below 2**31
    elements, so int64 runs only here): rows compact with the index rewritten, pages of 64."""
    pool = random_pool(tokens=12_800)
    pool2d = _as_pool_2d(pool)
    gen = torch.Generator(device="cuda").manual_seed(5)
    index = torch.randint(0, 12_800, (9_000,), generator=gen, device="cuda", dtype=torch.int32)
    count = torch.tensor([7_000], device="cuda")
    want = [torch.full((9_000, 576), -2.0, dtype=torch.bfloat16, device="cuda"), index.clone()]
    gather_cast_live_rows(pool, index.clone(), count, want[0], index=want[1], backend="torch")
    page, bs, width = 64, 8, 12_800 // 64 // 2
    table = torch.randint(0, 12_800 // page, (bs, width), generator=gen, device="cuda", dtype=torch.int32)
    lens = (torch.rand(bs, generator=gen, device="cuda") * width * page).to(torch.int32)
    capacity = min(bs * width, 12_800 // page)
    want_pages = [torch.full((capacity * page, 576), -2.0, dtype=torch.bfloat16, device="cuda"),
                  torch.full_like(table, -1)]
    gather_cast_live_pages(pool, table, lens, page, *want_pages, backend="torch")
    for offsets_32 in (True, False):
        got = [torch.full_like(want[0], -2.0), index.clone()]
        _launch_gather_live(pool2d, index.clone(), got[1], count, got[0], 9_000, 9_000, 1, offsets_32=offsets_32)
        assert_same_outputs(got, want)
        got = [torch.full_like(want_pages[0], -2.0), torch.full_like(table, -1)]
        flat = torch.empty(capacity, dtype=torch.int32, device="cuda")
        n_pages = torch.empty(1, dtype=torch.int32, device="cuda")
        _launch_index_pages(table, lens, flat, n_pages, got[1], capacity, page)
        _launch_gather_live(pool2d, flat, None, n_pages, got[0], bs * width, capacity, page, offsets_32=offsets_32)
        assert_same_outputs(got, want_pages)


def test_one_page_plan_serves_every_layer_in_a_graph():
    """The FA3 path as the patch runs it: plan_live_pages in the first layer, then one
    gather_cast_planned_pages per layer (three layers, three pools), captured in one CUDA graph and
    replayed with other tables and lengths, compact and overflow, against the torch fallback."""
    pools = [random_pool(tokens=8_192, seed=s) for s in (6, 7, 8)]
    for page in (1, 64):
        bs, width = 6, 8_192 // page // 3
        cap = min(bs * width, 8_192 // page)
        table = torch.zeros(bs, width, dtype=torch.int32, device="cuda")
        lens = torch.zeros(bs, dtype=torch.int32, device="cuda")
        flat = torch.zeros(cap, dtype=torch.int32, device="cuda")
        count = torch.zeros(1, dtype=torch.int32, device="cuda")
        outs = [torch.zeros(bs, width, dtype=torch.int32, device="cuda")] + [
            torch.zeros(cap * page, 576, dtype=torch.bfloat16, device="cuda") for _ in pools]

        def body(backend="triton", o=outs):
            plan_live_pages(table, lens, page, cap, flat, count, o[0], backend=backend)
            for pool, out in zip(pools, o[1:]):
                gather_cast_planned_pages(pool, flat, count, bs * width, page, out, backend=backend)

        body()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        gen = torch.Generator(device="cuda").manual_seed(9)
        for scale in (0.3, 0.0, 1.0):  # 1.0: about 3,000 of the 8,192 // page pages x 2: overflow
            table.copy_(torch.randint(0, 8_192 // page, (bs, width), generator=gen, device="cuda", dtype=torch.int32))
            lens.copy_((torch.rand(bs, generator=gen, device="cuda") * scale * 2 * width * page).to(torch.int32))
            want = [t.clone() for t in outs]
            body("torch", want)
            graph.replay()
            torch.cuda.synchronize()
            assert_same_outputs(outs, want)
        del graph


def test_live_kernels_one_graph_replayed_with_other_rows_and_counts():
    pool = random_pool(tokens=8_192)
    n_index, bs, width, page = 20_000, 4, 64, 64
    index = torch.zeros(n_index, dtype=torch.int32, device="cuda")
    rows = torch.zeros(8_192, dtype=torch.int32, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    table = torch.zeros(bs, width, dtype=torch.int32, device="cuda")
    lens = torch.zeros(bs, dtype=torch.int32, device="cuda")
    outs = [torch.zeros(8_192, 576, dtype=torch.bfloat16, device="cuda"), index,
            torch.zeros(min(bs * width, 8_192 // page) * page, 576, dtype=torch.bfloat16, device="cuda"),
            torch.zeros(bs, width, dtype=torch.int32, device="cuda")]

    def body(backend="triton", o=outs):
        gather_cast_live_rows(pool, rows, count, o[0], index=o[1], backend=backend)
        gather_cast_live_pages(pool, table, lens, page, o[2], o[3], backend=backend)

    body()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    gen = torch.Generator(device="cuda").manual_seed(4)
    for n_live, scale in ((5_000, 0.2), (0, 0.0), (9_000, 1.0), (300, 0.05)):
        index.copy_(torch.randint(0, 8_192, (n_index,), generator=gen, device="cuda", dtype=torch.int32))
        count.fill_(n_live)
        copy_live_indices(index, count, rows)
        table.copy_(torch.randint(0, 8_192 // page, (bs, width), generator=gen, device="cuda", dtype=torch.int32))
        lens.copy_((torch.rand(bs, generator=gen, device="cuda") * scale * width * page).to(torch.int32))
        want = [t.clone() for t in outs]
        body("torch", want)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_outputs(outs, want)
