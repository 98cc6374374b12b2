"""Confirmed step changes in one series along commit order.

A series is a list of points in commit order, each holding the per-step samples of one run (20
step times in ms, tok/s per step, or a single value such as calls per step). Changes are found in
two stages:

1. Candidates: `ruptures` Pelt (model "l2", min_size 1, so a change at the last point can be
   found) over the per-point medians, standardised by the noise of one point's median, with a
   penalty of `penalty_factor * log(n)`.
2. Confirmation: each candidate is tested against its neighbouring candidates' segments: the
   pooled samples before and after must differ by a two-sided Mann-Whitney rank test
   (p < `alpha`), and the medians by at least `min_rel_change` (relative) and by at least
   `noise_multiple` standard errors (run-to-run noise of a point's median, scaled to the two
   segments' point counts). A candidate that fails is dropped, its two segments are merged and
   the others are tested again, until every remaining one passes.

The noise of a point's median is estimated twice: from each run's own samples, and from the
differences between successive runs (which also sees run-to-run noise that samples inside one
run cannot). When runs differ clearly more than their samples say, the between-run estimate
rules and the multiple grows with its uncertainty (a t quantile), since the pooled rank test
then overstates the evidence. Series whose samples are all positive are analysed as logs, so
noise proportional to the level is one noise level.

Pure functions over plain numbers; its false-positive rate on flat noisy series and the detection
rate of planted steps are measured by `python -m ingest.studies.detect_study`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import ruptures as rpt
from scipy.stats import f as f_dist
from scipy.stats import mannwhitneyu, norm
from scipy.stats import t as student_t

from . import RegressError

_MAD_TO_SIGMA = 1.4826  # sigma of normal data per median absolute deviation
_MEDIAN_SE = 1.2533  # standard error of a sample median, in units of sigma / sqrt(k)
_SCALE_FLOOR = 1e-6  # noise floor: relative (log values), or this fraction of the largest |median|
_MIN_VARIANCE_RATIO = 9.0  # runs vary more than their samples say: variance ratio above this and F's 1 % point
TWO_POINT_MIN_REL_CHANGE = 0.10  # the smallest change confirmed from two points alone
_MAX_T_FACTOR = 2.0  # the t quantile is capped at this many times noise_multiple (few points)
_KEEP_DIFFS = 0.8  # share of successive differences (the smallest) that estimate run-to-run noise
_HALF_NORMAL_MEDIAN = 0.6745  # median of |N(0, 1)|
STEP_SIGMAS = 6.0  # a successive difference this many robust standard deviations out is a step, not noise


@dataclass(frozen=True)
class Point:
    """One run along commit order: its commit (sha or label) and its per-step samples."""

    commit: str
    samples: tuple[float, ...]

    def __post_init__(self):
        raw = self.samples
        values = (raw,) if np.isscalar(raw) else tuple(raw)
        try:
            values = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            raise RegressError(f"point {self.commit!r}: samples must be numbers, got {raw!r}") from None
        object.__setattr__(self, "samples", values)


@dataclass(frozen=True)
class Change:
    """A confirmed change: positions are indices into the points as given."""

    last_good: int
    first_bad: int
    last_good_commit: str
    first_bad_commit: str
    before_median: float  # median of the per-point medians of the segment before
    after_median: float
    rel_change: float  # (after - before) / |before|; +-inf when before is 0
    direction: str  # "regression" or "improvement"
    p_value: float  # two-sided Mann-Whitney over the pooled samples (0.0 when both sides are constant)
    points_before: int  # points in the segment before (back to the previous change)
    points_after: int
    samples_before: int  # pooled samples in the segment before
    samples_after: int
    last_good_samples: int  # samples of the last good point itself
    first_bad_samples: int
    noise: float  # standard deviation of one point's median: of its log (~ relative) when log_scale
    noise_source: str  # "within" (the runs' samples), "between" (successive runs) or "floor"
    log_scale: bool  # every sample was positive and the series was analysed as log values

    @property
    def is_regression(self) -> bool:
        return self.direction == "regression"


@dataclass(frozen=True)
class _Test:
    cut: int  # index into the kept points of the first point after the change
    before: float
    after: float
    rel: float
    p: float
    passed: bool


def _as_arrays(points: Sequence[Point]) -> tuple[list[int], list[np.ndarray]]:
    """Indices of the points that have finite samples, and those samples."""
    kept, sets = [], []
    for i, p in enumerate(points):
        if not isinstance(p, Point):
            raise RegressError(f"point {i}: expected a Point(commit, samples), got {type(p).__name__}")
        s = np.asarray(p.samples, dtype=float)
        s = s[np.isfinite(s)]
        if s.size:
            kept.append(i)
            sets.append(s)
    return kept, sets


def _spread(s: np.ndarray) -> float:
    """Standard deviation of one run's samples: robust (MAD) from 10 samples, plain below."""
    if s.size >= 10:
        return _MAD_TO_SIGMA * float(np.median(np.abs(s - np.median(s))))
    return float(np.std(s, ddof=1))


@dataclass(frozen=True)
class Noise:
    """Standard deviation of one point's median, where it comes from, and the multiple of it
    that a change must exceed (a t quantile when the estimate rests on few points)."""

    sigma: float
    source: str  # "within" (the runs' own samples), "between" (successive runs) or "floor"
    dof: float  # degrees of freedom of the estimate (inf for the floor)
    multiple: float


def _within_noise(sample_sets: Sequence[np.ndarray]) -> tuple[float, float] | None:
    """Each run's sample spread over sqrt(samples), times 1.25 (a median's standard error);
    their root mean square over runs, and the degrees of freedom of all runs together."""
    runs = [s for s in sample_sets if s.size >= 2]
    if not runs:
        return None
    per_run = [_MEDIAN_SE * _spread(s) / math.sqrt(s.size) for s in runs]
    return math.sqrt(float(np.mean(np.square(per_run)))), float(sum(s.size - 1 for s in runs))


def _between_noise(medians: np.ndarray) -> tuple[float, float] | None:
    """Spread of successive differences of the medians over sqrt(2): the root mean square of
    the smallest 80 % of |differences| (so that a few steps do not count as noise), corrected
    for the trimming. Its degrees of freedom, 0.47 per difference less 0.4, are fitted to the
    spread of log(estimate) on simulated normal series of 4 to 60 points.

    More steps than the trim drops are set aside first: a difference beyond STEP_SIGMAS robust
    standard deviations (from the median |difference|, which steps at fewer than half the
    differences cannot move) is a change, not noise. When there are more of those than the trim
    leaves out (and at least 3 differences remain), the estimate is the root mean square of the
    remaining ones, with their count's degrees of freedom; otherwise the trimmed estimate above
    stands as it was. Without this a short series with a regression and its fix (2 of 5
    differences steps) read the steps as noise and confirmed neither, even at 10x."""
    if medians.size < 4:
        return None
    d = np.sort(np.abs(np.diff(medians)))
    kept = max(1, int(_KEEP_DIFFS * d.size))
    robust = float(np.median(d)) / _HALF_NORMAL_MEDIAN
    calm = d[d <= STEP_SIGMAS * robust]
    if robust > 0 and 3 <= calm.size < kept:
        return math.sqrt(float(np.mean(calm ** 2)) / 2), max(0.5, 0.47 * calm.size - 0.4)
    fraction = kept / d.size
    variance = 1.0
    if fraction < 1:
        cut = norm.ppf(0.5 + fraction / 2)
        variance = 1 - 2 * cut * norm.pdf(cut) / fraction
    sigma = math.sqrt(float(np.mean(d[:kept] ** 2)) / variance / 2)
    return sigma, max(0.5, 0.47 * d.size - 0.4)


def estimate_noise(medians: np.ndarray, sample_sets: Sequence[np.ndarray], noise_multiple: float = 3.5,
                   floor: float | None = None) -> Noise:
    """Run-to-run noise of one point's median, from the runs' own samples or from successive
    runs, whichever is larger.

    The between-run estimate takes over when its variance is more than 9 times the within-run
    one and above the F test's 1 % point (runs differ by more than their samples say, so
    pooled samples overstate the evidence), or when runs have single samples; the multiple a
    change must exceed is then the t quantile matching `noise_multiple` standard deviations for
    the estimate's degrees of freedom, capped at twice `noise_multiple`. Floored at `floor`
    (default 1e-6 of the largest |median|) so that constant series stay finite."""
    medians = np.asarray(medians, dtype=float)
    within = _within_noise(sample_sets)
    between = _between_noise(medians)
    scale = float(np.max(np.abs(medians))) if medians.size else 0.0
    floor = Noise(max(_SCALE_FLOOR * scale if floor is None else floor, 1e-300), "floor", math.inf, noise_multiple)
    if between is not None and (within is None or within[0] == 0 or (between[0] / within[0]) ** 2 > max(
            _MIN_VARIANCE_RATIO, f_dist.ppf(0.99, between[1], within[1]))):
        multiple = min(float(student_t.ppf(norm.cdf(noise_multiple), between[1])), _MAX_T_FACTOR * noise_multiple)
        best = Noise(between[0], "between", between[1], multiple)
    else:
        estimates = []
        if within is not None:
            estimates.append(Noise(within[0], "within", within[1], noise_multiple))
        if between is not None:
            estimates.append(Noise(between[0], "between", between[1], noise_multiple))
        best = max(estimates, key=lambda x: x.sigma, default=floor)
    return best if best.sigma > floor.sigma else floor


def _find_candidates(medians: np.ndarray, sigma: float, penalty_factor: float) -> list[int]:
    """Pelt change points over the standardised medians: first indices of new segments."""
    n = medians.size
    z = ((medians - np.median(medians)) / sigma).reshape(-1, 1)
    algo = rpt.Pelt(model="l2", min_size=1, jump=1).fit(z)
    return [int(b) for b in algo.predict(pen=penalty_factor * max(math.log(n), 1.0))[:-1]]


def _relative(before: float, after: float) -> float:
    delta = after - before
    if before != 0:
        return delta / abs(before)
    return 0.0 if delta == 0 else math.copysign(math.inf, delta)


def _test_cut(cut: int, lo: int, hi: int, medians: np.ndarray, sets: list[np.ndarray], noise: Noise,
              alpha: float, min_rel_change: float, log_scale: bool) -> _Test:
    """Rank test and effect size between points [lo, cut) and [cut, hi)."""
    before_w = float(np.median(medians[lo:cut]))
    after_w = float(np.median(medians[cut:hi]))
    before, after = (math.exp(before_w), math.exp(after_w)) if log_scale else (before_w, after_w)
    rel = _relative(before, after)
    a = np.concatenate(sets[lo:cut])
    b = np.concatenate(sets[cut:hi])
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        # constant on both sides (a counter such as calls per step): a rank test has nothing to
        # rank, the change is exact when there is more than one value to go on
        p = 0.0 if a[0] != b[0] and a.size + b.size >= 3 else 1.0
    else:
        p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
        p = 1.0 if math.isnan(p) else p
    standard_error = noise.sigma * math.sqrt(1 / (cut - lo) + 1 / (hi - cut))
    passed = (p < alpha and abs(rel) >= min_rel_change
              and abs(after_w - before_w) >= noise.multiple * standard_error)
    return _Test(cut, before, after, rel, p, passed)


def _confirm(cuts: list[int], medians: np.ndarray, sets: list[np.ndarray], noise: Noise, alpha: float,
             min_rel_change: float, log_scale: bool) -> list[_Test]:
    """Drop the weakest failing candidate and test the rest again until all pass."""
    cuts = sorted(cuts)
    n = medians.size
    while True:
        bounds = [0, *cuts, n]
        tests = [_test_cut(c, bounds[k], bounds[k + 2], medians, sets, noise, alpha, min_rel_change, log_scale)
                 for k, c in enumerate(cuts)]
        failing = [t for t in tests if not t.passed]
        if not failing:
            return tests
        weakest = max(failing, key=lambda t: (t.p, -abs(t.rel)))
        cuts.remove(weakest.cut)


ALPHA = 0.01  # a change is confirmed when the rank test's p is below this ...
# ... and the medians differ by at least this much (relative). 1 %, from the floor study on real H200
# runs (ingest/regress/BENCHMARKS.md "The floor"): at 1 % a +2.4 % change is confirmed at the right
# commit in 80.5 / 91 / 71 % of resampled histories (1 / 2 / 3 runs a commit; 0 % at 3 %) with no false
# alarm in 1,800 A/A histories of one session and across two; at 0.5 % 2 % of the H200's single-run
# A/A histories raise one. On a noisy host the floor never binds: the series' own spread decides.
MIN_REL_CHANGE = 0.01


def detect_changes(points: Sequence[Point], *, higher_is_better: bool, alpha: float = ALPHA,
                   min_rel_change: float = MIN_REL_CHANGE, noise_multiple: float = 3.5,
                   penalty_factor: float = 3.0) -> list[Change]:
    """Confirmed changes in a series of points along commit order, oldest first.

    `higher_is_better`: True for tok/s, False for step ms, copy share, a kernel's ms per step.
    Points without any finite sample are skipped (a change around them names the nearest
    measured points). A kernel that is absent from a run should be given as 0, not left out.
    Fewer than two measured points give no changes.

    When every sample is positive the search and the noise work on log values, so that noise
    proportional to the level (a 3x slower step is 3x noisier in ms) is one noise level; with
    zeros or negatives (calls per step of a kernel that comes and goes) on the values as given."""
    if not 0 < alpha < 1:
        raise RegressError(f"alpha {alpha}: must be between 0 and 1")
    if min_rel_change < 0 or noise_multiple < 0 or penalty_factor <= 0:
        raise RegressError("min_rel_change and noise_multiple must be >= 0, penalty_factor > 0")
    kept, sets = _as_arrays(points)
    if len(kept) < 2:
        return []
    if len(kept) == 2:
        # two runs say nothing about how much runs differ from one occasion to the next (a
        # machine's load, clocks, another host): ask for a change no such drift makes
        min_rel_change = max(min_rel_change, TWO_POINT_MIN_REL_CHANGE)
    log_scale = all(bool(np.all(s > 0)) for s in sets)
    if log_scale:
        sets = [np.log(s) for s in sets]
    medians = np.array([np.median(s) for s in sets])
    noise = estimate_noise(medians, sets, noise_multiple, floor=_SCALE_FLOOR if log_scale else None)
    cuts = _find_candidates(medians, noise.sigma, penalty_factor)
    tests = _confirm(cuts, medians, sets, noise, alpha, min_rel_change, log_scale)
    bounds = [0, *(t.cut for t in tests), len(kept)]
    changes = []
    for k, t in enumerate(tests):
        lo, hi = bounds[k], bounds[k + 2]
        worse = t.after < t.before if higher_is_better else t.after > t.before
        good, bad = kept[t.cut - 1], kept[t.cut]
        changes.append(Change(
            last_good=good, first_bad=bad,
            last_good_commit=points[good].commit, first_bad_commit=points[bad].commit,
            before_median=t.before, after_median=t.after, rel_change=t.rel,
            direction="regression" if worse else "improvement", p_value=t.p,
            points_before=t.cut - lo, points_after=hi - t.cut,
            samples_before=int(sum(s.size for s in sets[lo:t.cut])),
            samples_after=int(sum(s.size for s in sets[t.cut:hi])),
            last_good_samples=int(sets[t.cut - 1].size), first_bad_samples=int(sets[t.cut].size),
            noise=noise.sigma, noise_source=noise.source, log_scale=log_scale,
        ))
    return changes
