"""One event, one card (issue 30): change tracking's verdicts through the noise model on seeded
synthetic series (ingest.runs.track.judge_changes, pure), and the grouping of one change point's
metrics into one event (ingest.regress.report.group_events, what `ingest check` prints)."""

import numpy as np

from ingest.regress.detect import Point
from ingest.regress.report import format_markdown, group_events
from ingest.runs.track import _direction, judge_changes


def _series(levels, runs_per_commit, sigma, seed):
    """(points of 20 steps per run pooled per commit, run values per commit) around `levels`."""
    rng = np.random.default_rng(seed)
    points, values = [], []
    for i, level in enumerate(levels):
        runs = [level * float(np.exp(rng.normal(0, sigma))) for _ in range(runs_per_commit)]
        steps = [r * float(np.exp(rng.normal(0, 0.002))) for r in runs for _ in range(20)]
        points.append(Point(f"c{i}", tuple(steps)))
        values.append(runs)
    return points, values


def test_a_3x_step_change_with_repeats_is_a_confirmed_regression():
    points, values = _series([10.0] * 6 + [30.0] * 6, 2, 0.03, 1)
    (found,) = judge_changes("step_ms", False, points, values)
    change, verdict = found
    assert (change.first_bad, verdict.verdict, verdict.spread.source) == (6, "regression", "repeats")
    assert (verdict.n_a, verdict.n_b) == (12, 12)


def test_two_single_runs_with_no_history_are_suspected_never_confirmed():
    points, values = _series([10.0, 14.2], 1, 0.0, 2)  # +42 %, 20 steps a run that agree to 0.2 %
    (found,) = judge_changes("step_ms", False, points, values)  # the detector's candidate (the steps say so) ...
    assert found[1].verdict == "not enough data" and not found[1].changed  # ... but no spread: suspected


def test_a_a_history_with_steps_that_agree_more_than_runs_confirms_nothing():
    # the pseudo-replication case: each run's 20 steps agree to 0.2 %, the runs differ by 8 %
    for seed in range(5):
        points, values = _series([10.0] * 22, 1, 0.08, 10 + seed)
        assert [v.verdict for _, v in judge_changes("step_ms", False, points, values) if v.changed] == []


def test_a_vanished_kernel_is_removed_not_an_improvement():
    key = "kernel:ms_per_step:_gather_cast_kernel\x1f\x1fkernels/workload.py(238): run_step"
    values = [[0.293]] * 4 + [[0.0]] * 4
    points = [Point(f"c{i}", tuple(v)) for i, v in enumerate(values)]
    (found,) = judge_changes(key, False, points, values)
    change, verdict = found
    assert verdict.changed and verdict.spread.source == "exact"
    assert _direction(key, change, verdict) == "removed"


def _row(metric, direction, rel, verdict, before=1.0, after=2.0):
    return {"repo": "r", "engine": "reference", "workload_key": '{"preset": "tiny"}', "device_name": None,
            "variant": "unpatched", "metric": metric, "direction": direction, "rel_change": rel,
            "before_value": before, "after_value": after, "p_value": 0.001, "commits_between": 0,
            "last_good_commit_id": 1, "first_bad_commit_id": 2,
            "explanation": {"noise": {"verdict": verdict, "spread": 0.02, "spread_source": "repeats",
                                      "runs_before": 3, "runs_after": 3}}}


def test_one_change_point_is_one_event_with_its_kernels_added_and_removed():
    cast = "kernel:calls_per_step:void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda" \
           "(at::TensorIteratorBase&)::{lambda()#3}>(int)\x1f\x1f"
    rows = [_row("step_ms", "regression", 2.0, "regression"), _row("tok_per_s", "regression", -0.66, "regression"),
            _row("copy_share", "regression", 5.0, "regression"),
            _row("category:gemm", "regression", 0.05, "not enough data"),  # no spread of its own: not listed
            _row(cast, "added", float("inf"), "regression", 0.0, 78.0),
            _row(cast.replace("calls_per_step", "ms_per_step"), "added", float("inf"), "regression", 0.0, 67.0),
            _row("kernel:ms_per_step:_gather_cast_kernel\x1f\x1f", "removed", -1.0, "improvement", 0.29, 0.0)]
    (event,) = group_events(rows)
    assert event["head"]["metric"] == "tok_per_s"
    assert [r["metric"] for r in event["others"]] == ["step_ms", "copy_share"]
    assert event["kernels"] == ["unrolled_elementwise_kernel<direct_copy_kernel_cuda> added",
                                "_gather_cast_kernel removed"]
    text = format_markdown(rows, {2: {"sha": "9f8e7d6c5b4a", "subject": "switch back"}}, "a..b")
    assert "**2 confirmed regression(s)** of tok/s or step time; 1 event(s), 7 change(s)" in text
    assert "improvement" not in text.split("### ")[0].split("| --- |")[-1]  # no kernel "improvement" in the table
    assert text.count("\n| reference tiny") == 1  # one row for the event


def test_a_count_that_changes_between_two_single_runs_is_exact():
    key = "kernel:calls_per_step:aten::copy_\x1faten::copy_\x1fkernels/workload.py(200): _fetch_kv"
    values = [[0.0], [4.0]]  # the cast kernel absent at c1, 4 calls a step at c8: one run each
    points = [Point(f"c{i}", tuple(v)) for i, v in enumerate(values)]
    (found,) = judge_changes(key, False, points, values)
    change, verdict = found
    assert (change.last_good, change.first_bad, verdict.spread.source) == (0, 1, "exact")
    assert _direction(key, change, verdict) == "added"
    # 78 -> 79 calls a step (+1.3 %) is exact too: a count has no noise, so no relative floor applies
    # (80 layers instead of 78 launch each per-layer kernel 80 times: +2.6 %, under the speed floor)
    for before, after in ((78.0, 79.0), (78.0, 80.0)):
        flat = [[before], [before], [after]]
        (found,) = judge_changes(key, False, [Point(f"c{i}", tuple(v)) for i, v in enumerate(flat)], flat)
        change, verdict = found
        assert (change.first_bad, change.before_median, change.after_median) == (2, before, after)
        assert (verdict.verdict, verdict.spread.source) == ("regression", "exact")
    # a commit whose runs disagree on the count: not exact, the detector decides (with its floor)
    mixed = [[78.0, 79.0], [78.0, 78.0], [79.0, 79.0]]
    assert judge_changes(key, False, [Point(f"c{i}", tuple(v)) for i, v in enumerate(mixed)], mixed) == []
