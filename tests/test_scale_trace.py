"""The scale benchmark's trace builder (ingest/scale_benchmark.py): a trace of S steps made by
repeating the steps of a real capture must be a valid trace whose figures are known in advance:
whole copies multiply torch's key_averages() of the capture, a partial copy adds the steps it
holds. Built here from two small H200 captures (eager with stack, CUDA graph with stack); the
scaled traces are also read by two processes (small pieces, so the helper takes some), which
must give the same columns as one."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from ingest.studies.scale import build_scaled_trace, expected_kernels, read_source
from ingest.traces.analyse import K, analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA

BUNDLES = DATA / "bundles"


def _kernel_figures(trace) -> dict:
    stats = analyse_trace(trace, load_rule_chain()).kernel_stats.to_pandas()
    got = stats.groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"))
    return {name: (int(row.calls), float(row.total_us)) for name, row in got.iterrows()}


@pytest.mark.parametrize("bundle", ["tiny-full-pool-cast-eager-stack", "tiny-full-pool-cast-graph-stack"])
def test_whole_copies_multiply_key_averages_and_a_partial_copy_adds_its_steps(bundle, tmp_path):
    source = BUNDLES / bundle / "trace.json.gz"
    src = read_source(source)
    assert src.steps == 3

    # three steps: the capture itself, byte for byte
    same = tmp_path / "same.json.gz"
    build_scaled_trace(src, 3, same)
    assert gzip.decompress(same.read_bytes()) == gzip.decompress(source.read_bytes())

    original = read_trace(source)
    gpu = np.isin(original.kind, [K["kernel"], K["gpu_memcpy"], K["gpu_memset"]])
    gpu_names = {original.names[i] for i in np.unique(original.name_id[gpu])}
    key_averages = {r["name"]: r for r in json.loads((BUNDLES / bundle / "key_averages.json").read_text())
                    if r["name"] in gpu_names}
    assert len(key_averages) >= 3

    # two whole copies: every kernel's calls and time twice key_averages()
    doubled = tmp_path / "six.json.gz"
    expected = build_scaled_trace(src, 6, doubled)
    trace = read_trace(doubled, split=False)
    figures = _kernel_figures(trace)
    assert set(figures) == set(key_averages) == set(expected)
    for name, (calls, total_us) in figures.items():
        assert calls == 2 * key_averages[name]["count"] == expected[name][0], name
        assert total_us == pytest.approx(2 * key_averages[name]["self_device_time_total_us"], rel=1e-9), name
    record = analyse_trace(trace, load_rule_chain())
    assert record.steps == 6 and record.step_method == "profiler-step"
    assert record.between_steps_kernels == 2 * analyse_trace(original, load_rule_chain()).between_steps_kernels
    # every repeated step is a new one: its kernels are where the original step's were
    per_step = record.step_table["kernel_us"]
    assert per_step[3:] == pytest.approx(per_step[:3], rel=1e-9)

    # two copies and one step: the expected figures add the first step's kernels
    seven = tmp_path / "seven.json.gz"
    expected7 = build_scaled_trace(src, 7, seven)
    assert expected7 == expected_kernels(src, [3, 3, 1])
    one_step = expected_kernels(src, [1])
    figures7 = _kernel_figures(read_trace(seven, split=False))
    for name, (calls, total_us) in figures7.items():
        assert calls == expected7[name][0] == expected[name][0] + one_step.get(name, [0])[0], name
        assert total_us == pytest.approx(expected7[name][1], rel=1e-9), name
    assert analyse_trace(read_trace(seven, split=False), load_rule_chain()).steps == 7

    # the scaled trace read by two processes, in pieces small enough for both to take some
    one = read_trace(seven, split=False, chunk_bytes=4096)
    two = read_trace(seven, split=True, chunk_bytes=4096)
    assert two.processes == 2 and two.events_seen == one.events_seen
    for col in ("kind", "ts_us", "dur_us", "correlation", "external_id"):
        assert np.array_equal(getattr(one, col), getattr(two, col)), col
    names_one, names_two = np.asarray(one.names, dtype=object), np.asarray(two.names, dtype=object)
    assert np.array_equal(names_one[one.name_id], names_two[two.name_id])
