"""The verdict on two runs' step times (ingest.regress.uncertainty): real numbers from the H200
sample bundles (20 untimed steps each) and constructed cases whose answer is known."""

import json
import math
from pathlib import Path

from ingest.regress.uncertainty import (CHANGED, NOT_ENOUGH, WITHIN_NOISE, compare_samples, fewest_steps,
                                        smallest_p)

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
    small = compare_samples(base, [x * 1.02 for x in base])  # clearly different, but under 3 %
    assert small.verdict == WITHIN_NOISE and small.p < 0.01 and round(small.rel, 3) == 0.02


def test_bad_samples_are_left_out_and_the_interval_is_reproducible():
    a = [10.0, float("nan"), 10.1, -1.0, 10.2, 0.0, 10.3, 10.4, float("inf")]
    b = [11.0, 11.1, 11.2, 11.3, 11.4]
    v = compare_samples(a, b)
    assert (v.n_a, v.n_b) == (5, 5) and v.verdict == CHANGED
    assert compare_samples(a, b) == v  # the same samples, the same interval
