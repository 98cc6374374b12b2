"""Triton kernels and the workload on a CUDA GPU (marked `gpu`; skipped without CUDA).

kernels.gpu_suite runs these on the lent H200, through pytest when it is installed there and
by calling each `test_*` function directly when it is not, so they take no fixtures.
"""

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # the GPU machine may lack pytest; gpu_suite then calls the tests itself
    pytest = None

import torch

from kernels.kv_cast import FP8, cast_fp8_to_bf16, cast_rows_fp8_to_bf16, gather_cast_fp8_to_bf16
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
