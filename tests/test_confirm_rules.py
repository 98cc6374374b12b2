"""The rules of re-runs that confirm (ingest/runs/confirm.py, ingest/runs/track.py), as pure
functions over a series' runs: the interleaved order, the verdict from all runs of both commits
pooled (ingest.regress.noise.judge), what a dismissal drops. The worker doing it with real runs
is tests/test_confirm.py."""

import pandas as pd

from ingest.limits import CONFIRM_PAIRS
from ingest.runs.confirm import interleave, is_confirmation_batch
from ingest.runs.spec import RunSpec, Workload
from ingest.runs.track import SeriesData, apply_confirmations, judge_confirmations


def _series(values_by_commit: list[list[float]], confirmations: list[dict]) -> SeriesData:
    rows, run_id = [], 0
    for commit_id, values in enumerate(values_by_commit, 1):
        for v in values:
            run_id += 1
            rows.append({"run_id": run_id, "commit_id": commit_id, "sha": f"{commit_id:040x}", "seq": commit_id,
                         "step_ms": v, "step_ms_samples": [v] * 20, "batch_size": 1, "job_engine": "reference"})
    return SeriesData(pd.DataFrame(rows), pd.DataFrame(), {}, {}, True, tuple(confirmations))


def _window(state="queued", pending=0) -> dict:
    return {"confirmation_id": 7, "last_good_commit_id": 1, "first_bad_commit_id": 2, "host": "gpu1",
            "batch": "confirm x", "reruns": 4, "state": state, "verdict": None, "summary": None, "pending": pending}


def test_reruns_interleave_the_two_commits_on_the_specs_host():
    spec = RunSpec("reference", Workload(preset="tiny"), host="gpu1", ref="main")
    specs = interleave(spec, "a" * 40, "b" * 40)
    assert [s.ref for s in specs] == ["a" * 40, "b" * 40] * CONFIRM_PAIRS
    assert {s.host for s in specs} == {"gpu1"} and {s.workload for s in specs} == {spec.workload}
    assert is_confirmation_batch("confirm 0123") and not is_confirmation_batch("bisect 0123")
    assert not is_confirmation_batch(None)


def test_a_real_change_is_confirmed_from_the_pooled_runs():
    # 3 runs a commit, 1-2 % apart within a commit, the second commit 30 % slower
    data = _series([[10.0, 10.2, 9.9], [13.0, 13.1, 12.8]], [_window()])
    [judged] = judge_confirmations(data)
    assert (judged["confirmation_id"], judged["state"], judged["verdict"]) == (7, "confirmed", "regression")
    assert "3 and 3 runs" in judged["summary"]


def test_a_run_that_was_disturbed_once_is_dismissed():
    # the first bad commit's first run 3x slow, its two re-runs like the last good commit's runs
    data = _series([[10.0, 10.2, 9.9], [30.0, 10.1, 9.8]], [_window()])
    [judged] = judge_confirmations(data)
    assert judged["state"] == "dismissed" and judged["verdict"] in ("within noise", "too noisy")


def test_nothing_is_judged_before_the_reruns_are_in_or_twice():
    assert judge_confirmations(_series([[10.0, 10.1], [13.0]], [_window(pending=2)])) == []
    assert judge_confirmations(_series([[10.0, 10.2, 9.9], [13.0, 13.1, 12.8]], [_window("confirmed")])) == []


def test_failed_reruns_give_no_verdict():
    # the re-runs failed: one run a commit, no spread: not enough data, the change stays suspected
    [judged] = judge_confirmations(_series([[10.0], [13.0]], [_window()]))
    assert (judged["state"], judged["verdict"]) == ("failed", "not enough data")


def test_a_dismissal_drops_the_speed_rows_of_its_window_only():
    data = _series([[10.0, 10.2, 9.9], [30.0, 10.1, 9.8], [10.0]], [_window("dismissed")])
    row = {"last_good_commit_id": 1, "first_bad_commit_id": 2, "explanation": {"noise": {"verdict": "regression"}}}
    rows = [{**row, "metric": "step_ms", "direction": "regression"},
            {**row, "metric": "kernel:calls_per_step:k", "direction": "added"},
            {**row, "metric": "kernel:ms_per_step:k", "direction": "added"},
            {**row, "metric": "step_ms", "direction": "regression", "last_good_commit_id": 2,
             "first_bad_commit_id": 3}]
    kept = apply_confirmations(rows, data, [])
    assert [(r["metric"], r["first_bad_commit_id"]) for r in kept] == [
        ("kernel:calls_per_step:k", 2), ("kernel:ms_per_step:k", 2), ("step_ms", 3)]
