"""The verdict on two runs' step times (ingest.regress.uncertainty): real numbers from the H200
sample bundles (20 untimed steps each) and constructed cases whose answer is known."""

import json
import math
from pathlib import Path

import pytest

from ingest.regress.uncertainty import CHANGED, NOT_ENOUGH, WITHIN_NOISE, compare_samples, fewest_steps, smallest_p

SAMPLES = Path(__file__).resolve().parent.parent / "app" / "sample_data"


def _timed(bundle: str) -> list[float]:
    return json.loads((SAMPLES / bundle / "manifest.json").read_text())["timing"]["step_ms"]


def test_the_same_workload_at_two_commits_is_within_noise():
    a, b = _timed("b9bba77-glm5-fused-graph"), _timed("3bee539-glm5-fused-graph")
    v = compare_samples(a, b)
    assert (v.n_a, v.n_b, v.verdict) == (20, 20, WITHIN_NOISE)
    assert round(v.rel, 4) == 0.0031 and v.ci_low < v.rel < v.ci_high  # +0.3 %: measurable, below 3 %
    assert 0.01 < v.p < 0.05


def test_the_patch_is_a_change_with_a_tight_interval():
    v = compare_samples(_timed("3bee539-glm5-full-pool-cast-graph"), _timed("3bee539-glm5-fused-graph"))
    assert v.verdict == CHANGED and round(v.rel, 3) == -0.896
    assert v.ci_high - v.ci_low < 0.002 and v.p < 1e-7


def test_too_few_steps_cannot_show_anything():
    assert smallest_p(3, 3) == 0.1 and smallest_p(2, 1) == 2 / 3 and smallest_p(0, 5) == 1.0
    assert fewest_steps() == 5  # 2 / C(10, 5) = 0.0079 < 0.01; 2 / C(8, 4) = 0.029
    v = compare_samples([10.0, 10.1, 10.2], [20.0, 20.1, 20.2])  # twice as slow, but three steps each
    assert v.verdict == NOT_ENOUGH and round(v.rel, 3) == 0.990 and math.isclose(v.p, 0.1)
    assert compare_samples([], [1.0]).verdict == NOT_ENOUGH


def test_a_large_shift_is_changed_and_a_small_one_within_noise_even_when_significant():
    base = [10.0 + 0.01 * i for i in range(20)]
    assert compare_samples(base, [x * 1.10 for x in base]).verdict == CHANGED
    tight = [10.0 + 0.001 * i for i in range(20)]
    small = compare_samples(tight, [x * 1.005 for x in tight])  # clearly different, but under the 1 % floor
    assert small.verdict == WITHIN_NOISE and small.p < 0.01 and round(small.rel, 4) == 0.005


def test_bad_samples_are_left_out_and_the_interval_is_reproducible():
    a = [10.0, float("nan"), 10.1, -1.0, 10.2, 0.0, 10.3, 10.4, float("inf")]
    b = [11.0, 11.1, 11.2, 11.3, 11.4]
    v = compare_samples(a, b)
    assert (v.n_a, v.n_b) == (5, 5) and v.verdict == CHANGED
    assert compare_samples(a, b) == v  # the same samples, the same interval


def test_two_runs_of_one_commit_are_within_noise_once_the_run_to_run_spread_is_known():
    # kernels/studies/demo_series.py on the H200: two runs of the same commit, 20 timed steps each, whose
    # medians differ by 9 % while each run's steps agree to 0.2 %. On their steps alone they are
    # "changed" (that is what the samples say); the workload's repeated runs give a 2.8 % run-to-run
    # spread (db.views.get_run_spread over the demo series), and with it they are within noise
    a, b = _timed("demo-9317abc-1-glm5-graph"), _timed("demo-9317abc-2-glm5-graph")
    alone = compare_samples(a, b)
    assert alone.verdict == CHANGED and 0.08 < alone.rel < 0.10 and alone.p < 1e-6 and alone.spread is None
    v = compare_samples(a, b, spread=0.0282, spread_pairs=6)
    assert v.verdict == WITHIN_NOISE and v.beyond_spread is False and v.spread_pairs == 6
    assert v.rel == alone.rel and v.ci_low < alone.ci_low < alone.ci_high < v.ci_high  # the interval widens
    need = math.expm1(3.5 * math.sqrt(2) * 0.0282)
    assert 0.14 < need < 0.15 and abs(v.rel) < need
    # the whole-pool cast against the fused path clears any such spread
    big = compare_samples(_timed("demo-05a3934-1-glm5-graph"), _timed("demo-d445ae3-1-glm5-graph"), spread=0.0282,
                          spread_pairs=6)
    assert big.verdict == CHANGED and big.beyond_spread is True and big.ci_low > 7


def test_kernel_means_follow_welchs_test():
    from scipy.stats import ttest_ind_from_stats

    from ingest.regress.uncertainty import compare_means, welch_interval

    v = compare_means(1.0, 0.02, 5, 1.10, 0.03, 4)
    ref = ttest_ind_from_stats(1.10, 0.03, 4, 1.0, 0.02, 5, equal_var=False)
    assert v.p == pytest.approx(ref.pvalue, rel=1e-9) and v.verdict == CHANGED and v.rel == pytest.approx(0.10)
    low, high, p = welch_interval(1.0, 0.02, 5, 1.10, 0.03, 4)
    assert low < 0.10 < high and p == v.p and v.ci_low == pytest.approx(low) and v.ci_high == pytest.approx(high)
    # 0.5 % at any p is under the 1 % a change needs; one step a side is not enough data
    assert compare_means(1.0, 0.0001, 20, 1.005, 0.0001, 20).verdict == WITHIN_NOISE
    assert compare_means(1.0, 0.02, 1, 2.0, 0.02, 5).verdict == NOT_ENOUGH
    assert compare_means(1.0, None, 5, 2.0, 0.02, 5).verdict == NOT_ENOUGH
    # a known run-to-run spread of 5 % leaves a 10 % kernel change within noise
    assert compare_means(1.0, 0.02, 5, 1.10, 0.03, 4, spread=0.05).verdict == WITHIN_NOISE
