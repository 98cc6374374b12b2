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

Run-to-run spread. A run's steps agree with each other more than two runs of the same code do
(measured on the H200: two runs of one commit, 20 timed steps each within 0.2 %, had medians
7.21 and 7.88 ms), so samples alone overstate the evidence of a difference between two runs.
Where the series has repeated runs (several runs of one commit: db.views.get_run_spread gives
`spread`, the pooled standard deviation of log(run median) within commits), the verdict also
needs |log(1 + rel)| >= NOISE_MULTIPLE * sqrt(2) * spread, as detection asks a change to clear
NOISE_MULTIPLE standard errors of two points, and the interval is widened by the run-to-run
term (added in quadrature on the log scale). Without repeats the spread is unknown and the
verdict says so (`spread` None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from .detect import ALPHA, MIN_REL_CHANGE

NOISE_MULTIPLE = 3.5  # detect_changes' default: a change clears this many standard errors of the run-to-run noise
_Z95 = 1.959964  # two-sided 95 % normal quantile

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
    spread: float | None = None  # run-to-run standard deviation of log(run median); None: unknown
    spread_pairs: int = 0  # repeated runs it rests on (runs beyond the first at a commit)
    beyond_spread: bool | None = None  # |log(1 + rel)| clears NOISE_MULTIPLE * sqrt(2) * spread (None: unknown)


def spread_bound(spread: float) -> float:
    """The log change two single runs must clear when runs of the same code differ by `spread`
    (sd of log run time): NOISE_MULTIPLE standard errors of a difference of two runs."""
    return NOISE_MULTIPLE * math.sqrt(2) * spread


def _decide(p: float, rel: float, beyond: bool | None, alpha: float, min_rel_change: float) -> str:
    """The rule every verdict here follows (detection's): p < alpha, at least min_rel_change, and
    beyond the run-to-run spread where it is known (`beyond` None: unknown)."""
    return CHANGED if p < alpha and abs(rel) >= min_rel_change and beyond is not False else WITHIN_NOISE


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p a rank test of n_a against n_b samples can give (no overlap)."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def compare_samples(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA,
                    min_rel_change: float = MIN_REL_CHANGE, spread: float | None = None,
                    spread_pairs: int = 0) -> Verdict:
    """The verdict on B against A (see the module docstring); non-finite or non-positive
    samples are left out. `spread`: run-to-run standard deviation of log(run median) of this
    workload (db.views.get_run_spread), resting on `spread_pairs` repeated runs; None if unknown."""
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
    beyond = None
    if spread is not None and math.isfinite(spread) and spread >= 0 and rel > -1:
        # widen the interval by the run-to-run term, in quadrature on the log scale
        centre = math.log1p(rel)
        half = [centre - math.log1p(low), math.log1p(high) - centre]
        run_half = _Z95 * math.sqrt(2) * spread
        low = math.expm1(centre - math.hypot(half[0], run_half))
        high = math.expm1(centre + math.hypot(half[1], run_half))
        beyond = abs(centre) >= spread_bound(spread)
    else:
        spread = None
    verdict = NOT_ENOUGH if smallest_p(n_a, n_b) >= alpha else _decide(p, rel, beyond, alpha, min_rel_change)
    return Verdict(n_a, n_b, med_a, med_b, rel, low, high, p, verdict, spread, spread_pairs if spread is not None
                   else 0, beyond)


def fewest_steps(alpha: float = ALPHA) -> int:
    """The fewest steps per run (the same for both) at which a change can be shown at all."""
    n = 1
    while smallest_p(n, n) >= alpha:
        n += 1
    return n


def compare_means(mean_a: float, sd_a: float | None, n_a: int, mean_b: float, sd_b: float | None, n_b: int, *,
                  alpha: float = ALPHA, min_rel_change: float = MIN_REL_CHANGE,
                  spread: float | None = None) -> Verdict:
    """The verdict on one kernel's ms per step, B against A, from each run's mean over its n
    profiled steps and the steps' standard deviation (kernel_stats.ms_per_step_sd): Welch's t
    test (the kernel tables keep these summaries, not every step's value), a 95 % interval of
    the relative change (delta method on the difference of means), and the same rule as
    compare_samples: p < alpha, |rel| >= min_rel_change and, where the workload's run-to-run
    `spread` is known, beyond NOISE_MULTIPLE * sqrt(2) of it. Not enough data with fewer than
    two steps on a side, a spread missing, or a kernel absent from A (rel has no base)."""
    if (n_a < 2 or n_b < 2 or sd_a is None or sd_b is None or not all(map(math.isfinite, (sd_a, sd_b)))
            or not mean_a > 0 or not math.isfinite(mean_b)):
        return Verdict(n_a, n_b, mean_a, mean_b, None, None, None, None, NOT_ENOUGH)
    rel = mean_b / mean_a - 1.0
    d_low, d_high, p = welch_interval(mean_a, sd_a, n_a, mean_b, sd_b, n_b)
    half = (d_high - d_low) / 2 / mean_a
    low, high = rel - half, rel + half
    beyond = None
    if spread is not None and math.isfinite(spread) and rel > -1:
        run_half = _Z95 * math.sqrt(2) * spread * (1 + rel)
        low, high = rel - math.hypot(half, run_half), rel + math.hypot(half, run_half)
        beyond = abs(math.log1p(rel)) >= spread_bound(spread)
    else:
        spread = None
    return Verdict(n_a, n_b, mean_a, mean_b, rel, low, high, p, _decide(p, rel, beyond, alpha, min_rel_change),
                   spread, 0, beyond)


def welch_interval(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int
                   ) -> tuple[float, float, float]:
    """(low, high, p): the LEVEL interval of mean_b - mean_a and Welch's two-sided p, from two
    samples' means, standard deviations and sizes (each n >= 2)."""
    from scipy.stats import t as student_t

    delta = mean_b - mean_a
    va, vb = sd_a * sd_a / n_a, sd_b * sd_b / n_b
    se = math.sqrt(va + vb)
    if se == 0:
        return delta, delta, (1.0 if delta == 0 else 0.0)
    dof = (va + vb) ** 2 / ((va * va / (n_a - 1) if va else 0.0) + (vb * vb / (n_b - 1) if vb else 0.0))
    p = float(2 * student_t.sf(abs(delta) / se, dof))
    half = float(student_t.ppf(0.5 + LEVEL / 2, max(dof, 1.0))) * se
    return delta - half, delta + half, p
