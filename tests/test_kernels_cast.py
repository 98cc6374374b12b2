"""kernels.kv_cast on the CPU (torch fallback): bit-exact against `.to(torch.bfloat16)`."""

import pytest
import torch

from kernels.kv_cast import (
    FP8,
    cast_fp8_to_bf16,
    cast_rows_fp8_to_bf16,
    gather_cast_fp8_to_bf16,
)


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
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
