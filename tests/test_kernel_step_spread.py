"""A kernel's step-to-step spread (kernel_stats.ms_per_step_sd), what Compare's kernel verdicts
rest on: checked against a plain per-event recount on real traces (an H200 CUDA-graph bundle
of the sample series, an eager TP=2 rank of the H200 captures, the CPU trace), and stored."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from db.store import open_db
from ingest.traces.analyse import aggregate, assign_steps, link_kernels
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from ingest.traces.trace_read import read_trace
from tests.helpers import ROOT

TRACES = [ROOT / "app" / "sample_data" / "demo-d445ae3-1-glm5-graph" / "trace.json.gz",
          ROOT / "tests" / "data" / "traces" / "cpu_small.trace.json",
          ROOT / "tests" / "data" / "h200" / "tp2" / "stepwatch-tp2-TP-1-DECODE.trace.json.gz",
          ROOT / "tests" / "data" / "h200" / "sglang-graph-decode"
          / "stepwatch_batch1_input2048_output2_decode.trace.json.gz"]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_spread_is_the_standard_deviation_of_each_kernels_ms_over_the_steps(path: Path):
    trace = read_trace(path)
    kernels = link_kernels(trace)
    steps = assign_steps(trace, kernels, None)
    rules = load_rule_chain()
    figures = aggregate(trace, kernels, steps, rules)
    n = figures.steps
    assert n >= 2
    stats = figures.kernel_stats.to_pandas()
    # the recount: per (name, launcher, source) and step, the sum of durations, one event at a time
    per_step = defaultdict(lambda: np.zeros(n))
    names = np.asarray(trace.names, dtype=object)[trace.name_id[kernels.event]]
    for name, launcher, source, step, dur in zip(names, kernels.launcher, kernels.source, steps.kernel_step,
                                                  kernels.dur_us):
        if step >= 0:
            per_step[(name, launcher, source)][step] += dur
    checked = 0
    for row in stats.itertuples():
        cells = per_step.get((row.name, row.launcher, row.source), np.zeros(n)) / 1e3
        assert row.ms_per_step == pytest.approx(cells.mean(), rel=1e-9, abs=1e-12)
        assert row.ms_per_step_sd == pytest.approx(cells.std(ddof=1), rel=1e-6, abs=1e-12)
        checked += 1
    assert checked == len(stats) >= 5


def test_the_spread_is_stored_and_read_back(tmp_path):
    bundle = ROOT / "app" / "sample_data" / "demo-d445ae3-1-glm5-graph"
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    with open_db(tmp_path / "s.duckdb") as store:
        run_id, _ = store.insert_run(record)
        rows = store.list_kernels(run_id)
    cast = rows[rows["category"] == "cast"].iloc[0]
    want = record.kernel_stats.to_pandas().set_index(["name", "launcher", "source"]).loc[
        (cast["name"], cast["launcher"], cast["source"]), "ms_per_step_sd"]
    assert cast["ms_per_step_sd"] == pytest.approx(want) and math.isfinite(want) and want > 0


def test_the_sparse_count_beyond_the_dense_limit_gives_the_same_spreads():
    # the cells of a real trace counted both ways: the dense table, and the path a trace with very
    # many kernel names and steps takes (memory bounded by its events), forced with dense_cells=0
    from ingest.traces.analyse import _step_spread_ms

    trace = read_trace(TRACES[2])
    kernels = link_kernels(trace)
    steps = assign_steps(trace, kernels, None)
    group = trace.name_id[kernels.event].astype(np.int64)  # one group per kernel name
    n_groups, n = int(group.max()) + 1, len(steps.wall_us)
    dense = _step_spread_ms(group, steps.kernel_step, kernels.dur_us, n_groups, n)
    sparse = _step_spread_ms(group, steps.kernel_step, kernels.dur_us, n_groups, n, dense_cells=0)
    assert n >= 2 and (dense > 0).sum() >= 5
    assert sparse == pytest.approx(dense, rel=1e-9, abs=1e-12)
