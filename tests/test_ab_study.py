"""The A/B study's pure helpers (ingest/studies/ab_study.py) on the real H200 bank it ships with
(ingest/studies/benchmark_data/ab-h200-2026-12-02: 42 runs of kernels.bench glm5, each its own process)."""

from __future__ import annotations

import numpy as np
import pytest

from ingest.studies import ab_study


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    return ab_study.load_bank(ab_study.unpack_bank(tmp_path_factory.mktemp("ab")))


def test_bank_holds_the_measured_changes(bank):
    assert {c: len(r) for c, r in bank.items()} == {"base": 14, "layers80": 8, "layers82": 7, "layers86": 7,
                                                    "wholepool": 6}
    sizes = ab_study.measured_changes(bank)
    assert sizes["layers80"][1] == pytest.approx(0.024, abs=0.003)
    assert sizes["layers82"][1] == pytest.approx(0.052, abs=0.003)
    assert sizes["layers86"][1] == pytest.approx(0.100, abs=0.003)
    assert 9.9 < 1 + sizes["wholepool"][1] < 10.1  # about 10x, not 3x
    assert all(len(r.steps_ms) == 20 and r.value_ms == pytest.approx(np.median(r.steps_ms)) for r in bank["base"])


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_draw_history_takes_each_run_once_in_its_segment(bank, repeats):
    history = ab_study.draw_history(bank, "layers82", repeats, np.random.default_rng(repeats))
    before, after = ab_study.BEFORE[repeats], ab_study.AFTER[repeats]
    assert [len(runs) for runs in history] == [repeats] * (before + after)
    names = [run.bundle for runs in history for run in runs]
    assert len(set(names)) == len(names)
    assert {run.config for runs in history[:before] for run in runs} == {"base"}
    assert {run.config for runs in history[before:] for run in runs} == {"layers82"}


def _fixed_history(bank, change, before=5, after=3):
    return [[run] for run in bank["base"][:before]] + [[run] for run in bank[change][:after]]


def test_stepwatch_confirms_a_ten_per_cent_change_at_its_commit(bank):
    out = ab_study.judge_stepwatch(_fixed_history(bank, "layers86"), first_bad=5)
    assert out["right"] and out["elsewhere"] == 0
    assert out["source"] == "history" and 0.08 < out["rel"] < 0.12
    assert out["ci"][0] < out["rel"] < out["ci"][1]


def test_stepwatch_confirms_a_two_per_cent_change_with_its_one_per_cent_floor_not_with_three(bank):
    history = _fixed_history(bank, "layers80")  # +2.4 %: 80 layers' work instead of 78, real H200 runs
    out = ab_study.judge_stepwatch(history, first_bad=5)
    assert out["right"] and out["elsewhere"] == 0 and out["suspected"] == 0 and 0.015 < out["rel"] < 0.035
    assert ab_study.judge_at_floor(history, 5, 0.01) == {"right": True, "elsewhere": 0}
    assert ab_study.judge_at_floor(history, 5, 0.03) == {"right": False, "elsewhere": 0}  # the old floor hid it
    # the runs' 0.3 % spread holds it: the smallest change the noise model could call here is under 2.4 %
    what_if = ab_study.judge_stepwatch_floor(history, 5, 0.01)
    assert what_if["right"] and what_if["elsewhere"] == 0 and 0.01 <= what_if["min_detectable"] < 0.024


def test_lookback_flags_the_first_commit_beyond_five_sd():
    flat = [[1.0 + 0.001 * (i % 3)] for i in range(5)]
    assert ab_study.judge_lookback(flat + [[1.05], [1.05]], first_bad=5) == {"right": True, "elsewhere": 0}
    assert ab_study.judge_lookback(flat + [[1.001], [1.002]], first_bad=5) == {"right": False, "elsewhere": 0}
    # a control history (first_bad -1): every flagged commit is a false alarm
    assert ab_study.judge_lookback(flat + [[1.05]], first_bad=-1) == {"right": False, "elsewhere": 1}


def test_check_rows_read_from_a_real_check_report():
    """`ingest check`'s Markdown from the study's end-to-end run (kept in results/e2e.jsonl)."""
    import json

    kept = ab_study.DATA / "results" / "e2e.jsonl"
    histories = {h["history"]: h for h in map(json.loads, kept.read_text().splitlines())}
    rows = ab_study.read_check_rows(histories["ab-layers82-r1"]["check"])
    assert [(r["metric"], r["change"]) for r in rows] == [("tok_per_s", "-4.8% (regression)")]
    assert histories["ab-layers82-r1"]["first_bad"].startswith(rows[0]["first_bad"]) and len(rows[0]["first_bad"]) == 12
    assert rows[0]["evidence"].startswith("confirmed (5 vs 3 runs")
    assert ab_study.read_check_rows(histories["ab-layers80-r1"]["check"]) == []
    table = ab_study.format_e2e(kept)
    assert "| ab-layers86-r3 | 5 x 3 | 15 (58) | exit 1, yes; 0; 0 |" in table
    assert "| ab-layers80-r2 | 8 x 2 | 16 (60) | exit 0, no; 1; 0 |" in table
