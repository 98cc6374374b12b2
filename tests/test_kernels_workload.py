"""kernels.workload on the CPU: the tiny preset runs, and the three KV strategies agree."""

import pytest
import torch

from kernels.workload import (
    KV_STRATEGIES,
    DecodeWorkload,
    build_model,
    count_floor_bytes,
    count_weight_bytes,
    get_config,
)


@pytest.fixture(scope="module")
def tiny_outputs():
    cfg = get_config("tiny")
    outputs = {}
    for kv in KV_STRATEGIES:
        workload = DecodeWorkload(build_model(cfg, "cpu"), kv)
        outputs[kv] = [workload.run_step().clone() for _ in range(2)]
    return outputs


def test_tiny_step_is_finite_bf16(tiny_outputs):
    out = tiny_outputs["full-pool-cast"][0]
    assert out.dtype == torch.bfloat16 and out.shape == (1, 256)
    assert torch.isfinite(out).all()
    assert 0.1 < out.float().abs().mean().item() < 100


@pytest.mark.parametrize("kv", ["gather-then-cast", "fused"])
def test_strategies_match_full_pool_cast(tiny_outputs, kv):
    for got, want in zip(tiny_outputs[kv], tiny_outputs["full-pool-cast"]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_new_token_row_is_written_into_each_layer_pool():
    cfg = get_config("tiny", layers=2, batch_size=2, context=16)
    state = build_model(cfg, "cpu")
    before = [p[state.new_rows].clone() for p in state.pools]
    DecodeWorkload(state, "fused").run_step()
    for pool, old in zip(state.pools, before):
        assert not torch.equal(pool[state.new_rows], old)
    assert state.rows.numel() == 2 * 17 and len(set(state.rows.tolist())) == 2 * 17


def test_seed_fixes_rows_and_weights():
    a, b = (build_model(get_config("tiny", layers=1), "cpu") for _ in range(2))
    assert torch.equal(a.rows, b.rows) and torch.equal(a.layers[0].w_qkv, b.layers[0].w_qkv)
    c = build_model(get_config("tiny", layers=1, seed=1), "cpu")
    assert not torch.equal(a.rows, c.rows)


def test_glm5_floor_bytes():
    cfg = get_config("glm5")
    assert count_weight_bytes(cfg) == 2 * 78 * (2048 * 9792 + 8192 * 2048 + 2048 * 8192 + 4096 * 2048 + 4096)
    assert count_floor_bytes(cfg) - count_weight_bytes(cfg) == 78 * (2049 * 576 + 576)
    assert get_config("deepseek-v3").layers == 61


@pytest.mark.parametrize(
    "overrides, message",
    [({"context": 5000}, "pool_tokens"), ({"layers": 0}, "layers"), ({"heads_x": 1}, "unknown")],
)
def test_bad_config_names_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_config("tiny", **overrides)


def test_unknown_strategy_and_preset():
    with pytest.raises(ValueError, match="kv:"):
        DecodeWorkload(build_model(get_config("tiny", layers=1), "cpu"), "paged")
    with pytest.raises(ValueError, match="preset:"):
        get_config("llama")
