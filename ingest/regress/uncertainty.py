"""Is the difference between two runs more than their noise? The verdict every delta between
two runs carries on the dashboard (Compare's headline, its step-time and tok/s tiles).

Samples are each run's step times in ms (db.views.get_step_samples: the steps a bundle timed
without the profiler, else the profiled steps' wall times). For runs A and B:

    rel     median(B) / median(A) - 1: the change of step time (tok/s moves the other way:
            1 / (1 + rel) - 1 at a fixed batch)
    ci      a 95 % interval of rel: percentile bootstrap of the ratio of medians, each run's
            samples resampled independently (BOOTSTRAP draws, a fixed seed: the same samples
            always give the same interval)
    p       two-sided Mann-Whitney U test of A's samples against B's (scipy)
    verdict "changed"          p < alpha and |rel| >= min_rel_change
            "within noise"     otherwise, when the samples could have shown a change
            "not enough data"  when even two samples that do not overlap at all could not
                               reach p < alpha (the smallest two-sided p of the rank test is
                               2 / C(n_a + n_b, n_a): 0.1 for 3 and 3 steps, 0.67 for 2 and 1)

alpha and min_rel_change are change detection's (ingest.regress.detect.ALPHA, MIN_REL_CHANGE),
so a pair of runs is called "changed" on Compare by the same rule a series' change is
confirmed by on Regressions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from .detect import ALPHA, MIN_REL_CHANGE

BOOTSTRAP = 4000  # resamples for the interval
LEVEL = 0.95  # the interval's coverage
CHANGED, WITHIN_NOISE, NOT_ENOUGH = "changed", "within noise", "not enough data"


@dataclass(frozen=True)
class Verdict:
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    rel: float | None  # median(B) / median(A) - 1
    ci_low: float | None  # LEVEL interval of rel
    ci_high: float | None
    p: float | None
    verdict: str  # CHANGED, WITHIN_NOISE or NOT_ENOUGH


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p a rank test of n_a against n_b samples can give (no overlap)."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def compare_samples(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA,
                    min_rel_change: float = MIN_REL_CHANGE) -> Verdict:
    """The verdict on B against A (see the module docstring); non-finite or non-positive
    samples are left out."""
    xa = np.array([v for v in a if v is not None and math.isfinite(v) and v > 0], dtype=float)
    xb = np.array([v for v in b if v is not None and math.isfinite(v) and v > 0], dtype=float)
    n_a, n_b = int(xa.size), int(xb.size)
    if n_a == 0 or n_b == 0:
        return Verdict(n_a, n_b, None, None, None, None, None, None, NOT_ENOUGH)
    med_a, med_b = float(np.median(xa)), float(np.median(xb))
    rel = med_b / med_a - 1.0
    rng = np.random.default_rng(0)
    boot_a = np.median(xa[rng.integers(0, n_a, size=(BOOTSTRAP, n_a))], axis=1)
    boot_b = np.median(xb[rng.integers(0, n_b, size=(BOOTSTRAP, n_b))], axis=1)
    tail = (1.0 - LEVEL) / 2 * 100
    low, high = (float(v) for v in np.percentile(boot_b / boot_a - 1.0, [tail, 100 - tail]))
    if np.ptp(xa) == 0 and np.ptp(xb) == 0:
        p = 1.0 if med_a == med_b else smallest_p(n_a, n_b)
    else:
        p = float(mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    if smallest_p(n_a, n_b) >= alpha:
        verdict = NOT_ENOUGH
    elif p < alpha and abs(rel) >= min_rel_change:
        verdict = CHANGED
    else:
        verdict = WITHIN_NOISE
    return Verdict(n_a, n_b, med_a, med_b, rel, low, high, p, verdict)


def fewest_steps(alpha: float = ALPHA) -> int:
    """The fewest steps per run (the same for both) at which a change can be shown at all."""
    n = 1
    while smallest_p(n, n) >= alpha:
        n += 1
    return n
