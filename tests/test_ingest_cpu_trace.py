"""A real CPU-only torch.profiler trace (torch 2.13, tests/data/traces/make_cpu_trace.py):
its CPU ops play the kernels, and calls and self time agree with torch's key_averages()."""

import json

import pytest

from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.trace_read import read_trace
from tests.helpers import TRACES


@pytest.fixture(scope="module")
def figures():
    return analyse_trace(read_trace(TRACES / "cpu_small.trace.json"), load_rule_chain())


def test_calls_and_self_time_match_key_averages(figures):
    expected = {r["name"]: r for r in json.loads((TRACES / "cpu_small.key_averages.json").read_text())}
    per_name = figures.kernel_stats.to_pandas().groupby("name").agg(calls=("calls", "sum"),
                                                                    total_us=("total_us", "sum"))
    assert len(per_name) == 15
    for name, row in per_name.iterrows():
        assert row.calls == expected[name]["count"], name
        assert row.total_us == pytest.approx(expected[name]["self_cpu_time_total_us"], rel=5e-3), name


def test_steps_and_headline_figures(figures):
    assert figures.kernels_from_cpu_ops
    assert figures.step_method == "profiler-step"
    assert figures.steps == 3
    top = figures.kernel_stats.to_dicts()[0]
    # the fp8 -> bf16 copy of a 256x32 pool: bf16 written + fp8 read, from the recorded shapes
    assert (top["name"], top["category"], top["calls_per_step"]) == ("aten::copy_", "cast", 1.0)
    assert top["bytes_per_call"] == 256 * 32 * 2 + 256 * 32 * 1
    line = next(i for i, text in enumerate((TRACES / "make_cpu_trace.py").read_text().splitlines(), 1)
                if text.startswith("def step("))
    # torch names a Python frame by the line its function starts on
    assert top["source"] == f"make_cpu_trace.py({line}): step"
    mm = figures.kernel_stats.to_pandas().set_index("name").loc["aten::mm"]
    assert mm["category"] == "gemm" and mm["bytes_per_call"] == (4 * 64 + 64 * 64) * 2
    assert figures.gpu_busy_share is None and figures.peak_gbps is None
    assert 0 < figures.copy_share < 1
