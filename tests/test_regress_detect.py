"""Change detection on synthetic series with planted steps and seeded noise: exactly the planted
changes, at exactly the planted points, and nothing on flat series (the false-positive rate is
measured over 500 seeded series; ingest/regress/BENCHMARKS.md keeps the full study)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import ROOT

from ingest.regress import RegressError
from ingest.regress.detect import MIN_REL_CHANGE, Point, detect_changes
from ingest.runs.track import judge_changes
from ingest.studies.detect_study import make_series, measure_detection_rate, measure_false_positive_rate, run_study


def make_points(seed: int, length: int, samples: int, noise: float, steps=(), base: float = 100.0,
                run_noise: float = 0.0) -> list[Point]:
    """detect.make_series with its own seeded generator."""
    return make_series(np.random.default_rng(seed), length, samples, noise, run_noise, steps, base)


def found(points, higher_is_better=False, **kw):
    return [(c.first_bad, c.direction) for c in detect_changes(points, higher_is_better=higher_is_better, **kw)]


SEEDS = range(10)

# (name, length, samples per point, sample noise, [(first bad point, relative step)], higher is better,
#  expected [(first bad, direction)])
PLANTED = [
    ("14 % step ms regression in the middle", 20, 10, 0.02, [(12, 0.14)], False, [(12, "regression")]),
    ("5 % step at 1 % noise", 30, 20, 0.01, [(15, 0.05)], False, [(15, "regression")]),
    ("tok/s up 3x (improvement)", 12, 5, 0.03, [(7, 2.0)], True, [(7, "improvement")]),
    ("tok/s down to a third (regression)", 12, 5, 0.03, [(4, -2 / 3)], True, [(4, "regression")]),
    ("step at the first point", 15, 10, 0.02, [(1, 0.10)], False, [(1, "regression")]),
    ("step at the last point", 15, 10, 0.02, [(14, 0.10)], False, [(14, "regression")]),
    ("3x step at the last point of a short series", 4, 5, 0.02, [(3, 2.0)], False, [(3, "regression")]),
    ("two regressions", 30, 10, 0.02, [(10, 0.10), (20, 0.15)], False, [(10, "regression"), (20, "regression")]),
    ("an improvement then a regression (tok/s)", 24, 10, 0.02, [(6, 0.20), (14, -0.25)], True,
     [(6, "improvement"), (14, "regression")]),
    ("an improvement then a regression (step ms)", 24, 10, 0.02, [(6, -0.15), (14, 0.20)], False,
     [(6, "improvement"), (14, "regression")]),
    ("2 samples per point", 20, 2, 0.01, [(9, 0.08)], False, [(9, "regression")]),
    ("3 samples per point, 5 % noise, 20 % step", 20, 3, 0.05, [(11, 0.20)], False, [(11, "regression")]),
    ("one sample per point", 30, 1, 0.01, [(15, 0.10)], False, [(15, "regression")]),
    ("two points, many samples", 2, 20, 0.01, [(1, 0.15)], False, [(1, "regression")]),
    # two runs alone cannot tell a 5 % change from occasion-to-occasion drift: not confirmed
    ("two points, a 5 % step", 2, 20, 0.01, [(1, 0.05)], False, []),
]


@pytest.mark.parametrize("name,length,samples,noise,steps,higher,want", PLANTED, ids=[p[0] for p in PLANTED])
@pytest.mark.parametrize("seed", SEEDS)
def test_finds_exactly_the_planted_changes(name, length, samples, noise, steps, higher, want, seed):
    points = make_points(seed, length, samples, noise, steps)
    assert found(points, higher) == want


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("length,samples,noise", [(5, 3, 0.05), (20, 3, 0.05), (60, 20, 0.01), (40, 1, 0.02),
                                                  (2, 20, 0.03), (3, 5, 0.05)])
def test_flat_noisy_series_has_no_change(length, samples, noise, seed):
    assert found(make_points(seed, length, samples, noise)) == []


def test_change_carries_positions_medians_size_confidence_and_counts():
    points = make_points(3, 20, 10, 0.01, [(12, 0.14)])
    [c] = detect_changes(points, higher_is_better=False)
    assert (c.last_good, c.first_bad) == (11, 12)
    assert (c.last_good_commit, c.first_bad_commit) == ("c11", "c12")
    assert c.before_median == pytest.approx(100, rel=0.01)
    assert c.after_median == pytest.approx(114, rel=0.01)
    assert c.rel_change == pytest.approx(0.14, abs=0.01)
    assert c.direction == "regression" and c.is_regression
    assert c.p_value < 1e-10
    assert (c.points_before, c.points_after) == (12, 8)
    assert (c.samples_before, c.samples_after) == (120, 80)
    assert (c.last_good_samples, c.first_bad_samples) == (10, 10)
    # all samples positive: analysed as logs, so the noise is relative: a point's median has
    # 1 % over sqrt(10) samples, times 1.25 (from the samples or from successive runs, whichever
    # came out larger)
    assert c.log_scale
    assert 0.002 < c.noise < 0.008 and c.noise_source in ("within", "between")


def test_higher_is_better_flips_the_direction():
    points = make_points(0, 20, 10, 0.01, [(10, -0.10)])
    assert found(points, higher_is_better=True) == [(10, "regression")]
    assert found(points, higher_is_better=False) == [(10, "improvement")]


def test_segments_between_changes_are_tested_against_their_neighbours():
    points = make_points(1, 30, 10, 0.01, [(10, 0.10), (20, 0.15)])
    first, second = detect_changes(points, higher_is_better=False)
    assert (first.points_before, first.points_after) == (10, 10)
    assert (second.points_before, second.points_after) == (10, 10)
    assert second.before_median == pytest.approx(110, rel=0.01)


def test_small_steps_and_samples_that_differ_by_little_are_not_changes():
    # a real shift of half the minimum effect (0.5 %), highly significant to the rank test, is below it
    points = make_points(0, 20, 20, 0.0005, [(10, MIN_REL_CHANGE / 2)])
    assert found(points) == []
    assert found(points, min_rel_change=MIN_REL_CHANGE / 4) == [(10, "regression")]


def test_run_to_run_noise_is_not_a_change():
    # runs that differ by 2 % while their own samples agree to 0.2 %: the pooled rank test alone
    # would confirm almost anything; the between-run noise estimate keeps it quiet
    for seed in range(20):
        points = make_points(seed, 20, 10, 0.002, run_noise=0.02)
        assert found(points) == [], seed
    [c] = detect_changes(make_points(0, 20, 10, 0.002, [(10, 0.2)], run_noise=0.02), higher_is_better=False)
    assert c.first_bad == 10 and c.noise_source == "between"


def test_points_without_finite_samples_are_skipped():
    points = make_points(0, 20, 10, 0.01, [(10, 0.10)])
    points[5] = Point("c05", [math.nan, math.nan])
    points[9] = Point("c09", [])
    points[3] = Point("c03", [float("inf"), 100.0, 100.5])
    [c] = detect_changes(points, higher_is_better=False)
    assert (c.last_good, c.first_bad) == (8, 10)  # 9 has no samples: the last good measured point is 8
    assert c.last_good_commit == "c08"


def test_too_few_points_give_no_change():
    assert detect_changes([], higher_is_better=True) == []
    assert detect_changes([Point("a", [1.0, 2.0])], higher_is_better=True) == []
    assert detect_changes([Point("a", [math.nan]), Point("b", [5.0])], higher_is_better=True) == []


def test_constant_series_and_all_equal_samples():
    assert found([Point(f"c{i}", [75.0] * 5) for i in range(10)]) == []
    assert found([Point(f"c{i}", 78.0) for i in range(10)]) == []
    # two points, one value each: nothing to go on
    assert found([Point("a", 1.0), Point("b", 2.0)]) == []


def test_a_counter_that_jumps_is_an_exact_change():
    # calls per step of the cast kernel: absent (0) for 5 commits, then once per layer
    points = [Point(f"c{i}", 0.0) for i in range(5)] + [Point(f"c{i}", 78.0) for i in range(5, 8)]
    [c] = detect_changes(points, higher_is_better=False)
    assert (c.last_good, c.first_bad, c.direction) == (4, 5, "regression")
    assert c.rel_change == math.inf and c.p_value == 0.0 and not c.log_scale
    # at the last point too
    points = [Point(f"c{i}", 0.0) for i in range(5)] + [Point("c5", 78.0)]
    assert found(points) == [(5, "regression")]
    # 78 -> 78.3 is 0.4 %: below the detector's minimum effect (a tracked count whose runs agree is judged
    # exactly, without it: ingest.runs.track.find_count_changes)
    assert found([Point(f"c{i}", 78.0) for i in range(5)] + [Point(f"c{i}", 78.3) for i in range(5, 8)]) == []


def test_an_outlier_sample_inside_a_run_does_not_move_its_point():
    points = make_points(0, 12, 10, 0.01)
    points[6] = Point("c06", [*points[6].samples[:-1], 500.0])
    assert found(points) == []


def test_samples_are_numbers():
    assert Point("a", 5).samples == (5.0,)
    assert Point("a", np.array([1, 2])).samples == (1.0, 2.0)
    with pytest.raises(RegressError, match="'a'.*numbers"):
        Point("a", ["fast"])
    with pytest.raises(RegressError, match="alpha"):
        detect_changes([Point("a", 1.0)] * 3, higher_is_better=True, alpha=1.5)
    with pytest.raises(RegressError, match="point 1"):
        detect_changes([Point("a", 1.0), (2.0,)], higher_is_better=True)


@pytest.mark.slow
def test_false_positive_rate_on_500_flat_series_is_below_one_percent():
    # lengths 5-60, sample noise 1-5 %, 3-20 samples per point
    result = measure_false_positive_rate(n_series=500, seed=0)
    assert result.n_series == 500
    assert result.flagged_rate < 0.01


@pytest.mark.slow
def test_false_positive_rate_with_run_to_run_noise_is_below_one_percent():
    result = measure_false_positive_rate(n_series=500, seed=1, noise_levels=(0.002,), run_noise=0.02)
    assert result.flagged_rate < 0.01


@pytest.mark.slow
def test_detection_rate_of_clear_steps():
    assert measure_detection_rate(0.20, n_series=200, seed=2, noise_levels=(0.01,)).exact_rate > 0.95
    assert measure_detection_rate(0.10, n_series=200, seed=2, noise_levels=(0.01,), lengths=(20, 40)).exact_rate > 0.95


@pytest.mark.slow
def test_study_prints_its_tables():
    text = run_study(n_series=5)
    assert "| points | samples per point | sample noise | run-to-run noise | series | flagged | rate |" in text
    assert "| 5 % step | 10 % step | 20 % step |" in text


def _timings(bundle: str) -> list[float]:
    """The 20 untimed step times (ms) of a real H200 run, from its bundle manifest."""
    return json.loads((ROOT / "app" / "sample_data" / bundle / "manifest.json").read_text())["timing"]["step_ms"]


def test_real_h200_timings_across_three_commits_have_no_change():
    # glm5 full-pool-cast under CUDA graphs at three stepwatch commits: 72.6, 74.1, 74.1 ms (+2 %)
    points = [Point(c, _timings(f"{c}-glm5-full-pool-cast-graph")) for c in ("b9bba77", "3bee539", "3cf1671")]
    assert found(points, min_rel_change=0.03) == []  # under the old 3 % floor
    assert found(points) == [(1, "regression")]  # the detector's candidate at the 1 % floor ...
    values = [[float(np.median(p.samples))] for p in points]
    # ... which one run a commit gives no spread to judge: under SUSPECT_MIN_REL_CHANGE (3 %) not even suspected
    assert judge_changes("step_ms", False, points, values) == []


def test_real_h200_timings_a_commit_that_brings_the_whole_pool_cast_back():
    # the fused KV strategy at three commits, then a (pretend) fourth commit whose runs cast the
    # whole pool again: the real full-pool-cast timings of the last commit
    points = [Point(c, _timings(f"{c}-glm5-fused-graph")) for c in ("b9bba77", "3bee539", "3cf1671")]
    points.append(Point("bad", _timings("3cf1671-glm5-full-pool-cast-graph")))
    [c] = detect_changes(points, higher_is_better=False)
    assert (c.last_good_commit, c.first_bad_commit, c.direction) == ("3cf1671", "bad", "regression")
    assert c.after_median / c.before_median == pytest.approx(74.13 / 7.72, rel=0.01)
    assert (c.samples_before, c.samples_after) == (60, 20)


DEMO = ["9317abc", "05a3934", "d445ae3", "6806b21", "bd182fd", "d396647"]  # glm5-serving-demo, commit order


def test_real_h200_regression_and_its_fix_in_six_commits_are_both_confirmed():
    # kernels/studies/demo_series.py on the H200: the fused path (7.2-7.9 ms), the whole-pool cast at
    # d445ae3 and 6806b21 (74 ms), gather-then-cast at bd182fd (8.0 ms), fused again; two runs a
    # commit pooled. Two of the five successive differences are the steps: the trimmed between-run
    # noise used to read them as noise and confirm neither (found nothing at all, at 10x)
    points = [Point(c, _timings(f"demo-{c}-1-glm5-graph") + _timings(f"demo-{c}-2-glm5-graph")) for c in DEMO]
    changes = detect_changes(points, higher_is_better=False)
    assert [(c.last_good_commit, c.first_bad_commit, c.direction) for c in changes] == [
        ("05a3934", "d445ae3", "regression"), ("6806b21", "bd182fd", "improvement")]
    assert changes[0].after_median / changes[0].before_median == pytest.approx(9.8, rel=0.03)
    assert changes[0].noise_source == "between" and changes[0].noise < 0.02  # the calm differences' ~1 %


def test_the_step_rejection_leaves_one_step_series_to_the_trimmed_estimate():
    # one step in five points: the trim already leaves it out, and the estimate is the trimmed one
    rng = np.random.default_rng(3)
    medians = np.log(np.array([100.0, 101.0, 99.5, 150.0, 150.8]))
    sets = [m + 0.001 * rng.standard_normal(5) for m in medians]
    from ingest.regress.detect import _between_noise, estimate_noise

    sigma, dof = _between_noise(medians)
    assert dof == pytest.approx(0.47 * 4 - 0.4)  # all four differences' degrees of freedom: the old estimate
    assert estimate_noise(medians, sets).source == "between"
