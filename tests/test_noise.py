"""The one noise model (ingest.regress.noise): seeded synthetic run values whose answer is known.
Every verdict here is exact: the run is the sample, a commit pools its runs, and the spread is
the series' own (repeats, else history), never the steps of one run."""

import math

import numpy as np
import pytest

from ingest.regress.detect import MIN_REL_CHANGE
from ingest.regress.noise import (BELOW_FLOOR, EXACT, HISTORY, IMPROVEMENT, NONE, NOT_ENOUGH, REGRESSION, REPEAT,
                                  REPEATS, TOO_NOISY, WITHIN_NOISE, Spread, estimate_spread, format_floor, judge,
                                  judge_counts, name_verdict, run_value, runs_needed_for, runs_needed_for_spread,
                                  step_floor)


def _runs(rng, level, n, sigma):
    return list(level * np.exp(rng.normal(0, sigma, n)))


def test_a_run_is_its_own_step_median_timed_steps_first():
    assert run_value([10.0, 12.0, 11.0], [30.0, 31.0]) == 11.0
    assert run_value([], [30.0, 32.0, 31.0]) == 31.0
    assert run_value(None, [float("nan"), -1.0]) is None


def test_same_sha_pair_is_a_repeat_whatever_its_difference():
    rng = np.random.default_rng(1)
    spread = estimate_spread([_runs(rng, 10, 3, 0.05), _runs(rng, 10, 3, 0.05)])
    v = judge([10.0], [14.2], spread, same_commit=True)  # +42 %: the same code, so it is noise
    assert v.verdict == REPEAT and not v.changed and round(v.rel, 3) == 0.42


def test_two_runs_of_one_commit_each_with_no_history_is_not_enough_data():
    spread = estimate_spread([[10.0], [14.2]])
    assert (spread.sigma, spread.source) == (None, NONE)
    v = judge([10.0], [14.2], spread)
    assert v.verdict == NOT_ENOUGH and v.runs_needed == 2 == runs_needed_for_spread()
    assert "run each commit 2 times" in v.describe()


def test_a_3x_change_with_repeats_is_a_regression_and_tok_per_s_an_improvement_the_other_way():
    rng = np.random.default_rng(2)
    a, b = _runs(rng, 10, 3, 0.05), _runs(rng, 30, 3, 0.05)
    spread = estimate_spread([a, b])
    assert spread.source == REPEATS and spread.dof == 4
    v = judge(a, b, spread)
    assert v.verdict == REGRESSION and 1.5 < v.rel < 2.5 and v.ci_low > 1.0
    assert judge([1 / x for x in a], [1 / x for x in b], spread, higher_is_better=True).verdict == REGRESSION
    assert judge(b, a, spread).verdict == IMPROVEMENT


def test_repeats_that_agree_judge_a_small_real_change_and_call_noise_within_noise():
    rng = np.random.default_rng(3)
    a, b = _runs(rng, 10, 4, 0.005), _runs(rng, 10.6, 4, 0.005)  # +6 % with 0.5 % noise
    spread = estimate_spread([a, b])
    assert judge(a, b, spread).verdict == REGRESSION
    same = _runs(rng, 10, 4, 0.005)
    assert judge(a, same, estimate_spread([a, same])).verdict == WITHIN_NOISE


def test_a_change_beyond_the_noise_but_under_the_floor_says_below_the_floor_not_within_noise():
    rng = np.random.default_rng(11)
    a = _runs(rng, 10, 4, 0.0005)  # runs agree to 0.05 %: half the floor is ~20 standard errors
    b = [x * (1 + MIN_REL_CHANGE / 2) for x in _runs(rng, 10, 4, 0.0005)]
    spread = estimate_spread([a, b])
    v = judge(a, b, spread)
    assert v.verdict == BELOW_FLOOR and not v.changed and v.z > v.threshold
    assert abs(v.rel - MIN_REL_CHANGE / 2) < 0.1 * MIN_REL_CHANGE and v.ci_low > 0  # real: its interval excludes 0
    text = v.describe()
    assert text.startswith(f"Below the {format_floor()} floor: step time +") and "within noise" not in text.lower()
    assert name_verdict(v.verdict) == f"below the {format_floor()} floor"  # Regressions' word for it
    assert name_verdict(TOO_NOISY) == "too noisy" and name_verdict(WITHIN_NOISE) == "within noise"
    # twice the floor, the same noise: a regression; the same difference under noise 100x larger: within noise
    c = [x * (1 + 2 * MIN_REL_CHANGE) for x in a]
    assert judge(a, c, estimate_spread([a, c])).verdict == REGRESSION
    noisy = Spread(0.05, REPEATS, 20.0)
    assert judge(a, b, noisy).verdict in (WITHIN_NOISE, TOO_NOISY)
    # a repeat stays a repeat, whatever its difference
    assert judge(a, b, spread, same_commit=True).verdict == REPEAT


def test_a_noisy_series_says_too_noisy_and_how_many_runs_would_help():
    rng = np.random.default_rng(4)
    a, b = _runs(rng, 10, 2, 0.08), _runs(rng, 10, 2, 0.08)
    spread = estimate_spread([a, b])
    v = judge(a, b, spread)
    assert v.verdict == TOO_NOISY and v.min_detectable > 0.10
    assert v.runs_needed == runs_needed_for(spread.sigma, spread.dof) and v.runs_needed > 2
    assert f"Too noisy to judge changes under {100 * v.min_detectable:.0f} %" in v.describe()


def test_history_gives_the_spread_without_repeats_and_a_confirmed_change_is_left_out():
    rng = np.random.default_rng(5)
    values = [[v] for v in _runs(rng, 10, 12, 0.02)] + [[v] for v in _runs(rng, 20, 12, 0.02)]
    with_step = estimate_spread(values)  # one 2x step among 23 differences: the MAD ignores it
    assert with_step.source == HISTORY and with_step.dof == 23 and 0.01 < with_step.sigma < 0.04
    without = estimate_spread(values, breaks=[12])
    assert without.dof == 22 and 0.01 < without.sigma < 0.04
    v = judge(values[11], values[12], without)  # the 2x step between two single runs
    assert v.verdict == REGRESSION
    assert judge(values[3], values[4], without).verdict in (WITHIN_NOISE, TOO_NOISY)
    assert estimate_spread(values[:5]).source == NONE  # 4 differences: too short a history


def test_the_steps_of_a_run_are_only_the_floor():
    steps = list(np.linspace(9.0, 11.0, 20))
    floor = step_floor(steps)
    assert 0.01 < floor < 0.05
    spread = estimate_spread([[10.0, 10.0001], [10.0, 10.0001]], floor=floor)
    assert spread.floored and spread.sigma == floor
    assert estimate_spread([[10.0], [11.0]], floor=floor).sigma is None  # a floor alone is no estimate


def test_a_count_is_exact():
    v = judge_counts([0.0, 0.0], [4.0])
    assert v.verdict == REGRESSION and v.spread.source == EXACT and v.rel == math.inf
    assert judge_counts([4.0], [4.0]).verdict == WITHIN_NOISE


def test_no_run_on_a_side_is_not_enough_data():
    v = judge([], [1.0], Spread(0.02, REPEATS, 5))
    assert v.verdict == NOT_ENOUGH and v.rel is None


@pytest.mark.parametrize("seed", range(5))
def test_a_a_pairs_on_a_seeded_series_are_never_changed(seed):
    rng = np.random.default_rng(100 + seed)
    values = [_runs(rng, 10, 2 if i % 5 == 0 else 1, 0.04) for i in range(25)]
    spread = estimate_spread(values)
    verdicts = {judge(values[i], values[j], spread).verdict for i in range(25) for j in range(i + 1, 25)}
    assert not verdicts & {REGRESSION, IMPROVEMENT}
