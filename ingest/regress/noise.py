"""The one noise model every verdict of stepwatch rests on: is B different from A by more than
runs of the same code differ? Pure functions: arrays in, a typed verdict out.

The run is the sample. Steps of one run share its host load, clocks, placement and allocation,
so their spread says little about the next run (pseudo-replication, Kalibera & Jones 2013);
the level whose variance dominates is the run, and that is where evidence is counted.

    run value    one number per run: the median of its timed steps (a bundle's untimed
                 steps), else of its profiled steps (`run_value`). Analysed as log(value), so
                 noise proportional to the level is one noise level and changes are ratios.
    a side       a commit pools all its runs (or a run id stands alone): its level is the
                 mean of its runs' log values, n = its number of runs.
    spread       sigma, the standard deviation of log(run value) between runs of the same
                 code (`estimate_spread`), from the first of:
                 1. "repeats": the pooled within-commit variance over the series' commits
                    with >= 2 runs (sum of squared deviations over sum of (runs - 1)); needs
                    >= MIN_SPREAD_DOF degrees of freedom;
                 2. "history": the series' own run-to-run differences where no change is
                    confirmed (conbench's lookback): consecutive commits' levels, each
                    difference divided by sqrt(1/n_i + 1/n_j) so that each has sd sigma (for
                    single runs: / sqrt(2)), differences across a known change left out; sigma is their
                    median absolute deviation * 1.4826 (robust: a few unconfirmed steps do
                    not count as noise); needs >= MIN_HISTORY_DIFFS differences;
                 3. none: the verdict is "not enough data: run each commit N times"
                    (N = `runs_needed_for_spread`), never "changed".
                 The steps within a run only floor it: sigma >= 1.2533 * sd(log steps) /
                 sqrt(steps) (a median's standard error), the least a run's own value varies.
    the test     d = level(B) - level(A), se = sigma * sqrt(1/n_a + 1/n_b); B changed when
                 |d| >= k * se and |exp(d) - 1| >= MIN_REL_CHANGE, where k is the t quantile
                 of the estimate's degrees of freedom matching NOISE_MULTIPLE normal standard
                 errors (one-sided p 2.3e-4), capped at 2 * NOISE_MULTIPLE. The interval:
                 exp(d +- t95 * se) - 1.
    verdicts     "regression" / "improvement" (changed, by the metric's direction);
                 "repeat, within noise": A and B measured the same sha, so their difference
                 is noise by construction (shown as such, never a change);
                 "too noisy": not changed, and the smallest change this test could see
                 (exp(k * se) - 1, `min_detectable`) is above TOO_NOISY_REL: the page says
                 "too noisy to judge changes under X %" and how many runs a commit would help;
                 "below the floor": beyond the noise (|d| >= k * se) but smaller than
                 MIN_REL_CHANGE: real, most likely, and too small to be called a change (the
                 sentence names the floor: "below the 1 % floor"), never "within noise";
                 "within noise": not changed, and a change of TOO_NOISY_REL would have shown;
                 "not enough data": no spread estimate, or a side with no run.

A count (a kernel's calls per step) is exact: equal values on each side that differ are a
change with spread 0 ("exact"), whatever the runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .detect import MIN_REL_CHANGE

NOISE_MULTIPLE = 3.5  # a change clears this many standard errors of the run-to-run noise (detection's)
MIN_SPREAD_DOF = 2  # repeats give a spread from this many degrees of freedom (runs beyond the first of a commit)
MIN_HISTORY_DIFFS = 5  # the lookback needs this many run-to-run differences (6 commits without a change)
TOO_NOISY_REL = 0.10  # a verdict that could not have seen a 10 % change says "too noisy"
_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = 1.2533
_Z95 = 1.959964

REGRESSION, IMPROVEMENT = "regression", "improvement"
WITHIN_NOISE, REPEAT, TOO_NOISY, NOT_ENOUGH = "within noise", "repeat, within noise", "too noisy", "not enough data"
BELOW_FLOOR = "below the floor"
REPEATS, HISTORY, EXACT, NONE = "repeats", "history", "exact", "none"


@dataclass(frozen=True)
class Spread:
    """sigma: sd of log(run value) between runs of the same code (None: no estimate); where it
    came from (REPEATS, HISTORY, EXACT or NONE); the degrees of freedom it rests on (repeated
    runs, or history differences); `floor`: the within-run floor it was held above (or None)."""

    sigma: float | None
    source: str
    dof: float
    floor: float | None = None
    floored: bool = False

    def describe(self) -> str:
        """'4.1 % from 3 repeated runs' / '... from 18 run-to-run differences of its history'."""
        if self.sigma is None:
            return "unknown: no commit was measured twice and the series' history is too short"
        if self.source == EXACT:
            return "0 (a count: exact)"
        what = (f"{self.dof:g} repeated run{'s' if self.dof != 1 else ''} (pooled within commits)"
                if self.source == REPEATS else f"{self.dof:g} run-to-run differences of the series' history")
        floor = " (held at the floor of the runs' own steps)" if self.floored else ""
        return f"{100 * self.sigma:.1f} % from {what}{floor}"


@dataclass(frozen=True)
class Verdict:
    verdict: str  # REGRESSION, IMPROVEMENT, BELOW_FLOOR, WITHIN_NOISE, REPEAT, TOO_NOISY or NOT_ENOUGH
    rel: float | None  # exp(level B - level A) - 1: B's value against A's
    ci_low: float | None
    ci_high: float | None
    n_a: int  # runs per side
    n_b: int
    value_a: float | None  # geometric mean of each side's run values
    value_b: float | None
    spread: Spread
    min_detectable: float | None  # the smallest relative change this comparison could call changed
    runs_needed: int | None  # runs per commit that would give a spread, or bring min_detectable under TOO_NOISY_REL
    z: float | None = None  # |d| / se
    threshold: float | None = None  # k
    floor_rel: float = MIN_REL_CHANGE  # the smallest relative change called a change (the judge's min_rel_change)

    @property
    def changed(self) -> bool:
        return self.verdict in (REGRESSION, IMPROVEMENT)

    def describe(self, what: str = "step time") -> str:
        """One plain sentence: the verdict, the change with its interval, runs per side, the spread."""
        runs = f"{self.n_a} and {self.n_b} run{'s' if self.n_a + self.n_b != 2 else ''}"
        if self.rel is None:
            return f"Not enough data: {runs} (a side without a measured run)."
        change = f"{what} {100 * self.rel:+.1f} %"
        if self.ci_low is not None:
            change += f" (95 % interval {100 * self.ci_low:+.1f} to {100 * self.ci_high:+.1f} %)"
        spread = f"run-to-run spread {self.spread.describe()}"
        if self.verdict == NOT_ENOUGH:
            return (f"Not enough data: {change}, {runs}; {spread}; run each commit {self.runs_needed} times "
                    "(or let stepwatch re-run it) to know whether it changed.")
        if self.verdict == REPEAT:
            return f"Repeat, within noise: the same commit measured twice; {change} is noise ({runs}; {spread})."
        if self.verdict == TOO_NOISY:
            help_ = f"; {self.runs_needed} runs a commit would do" if self.runs_needed else ""
            return (f"Too noisy to judge changes under {100 * self.min_detectable:.0f} %: {change}, {runs}; {spread}"
                    f"{help_} (or a quieter host).")
        if self.verdict == BELOW_FLOOR:
            floor = format_floor(self.floor_rel)
            return (f"Below the {floor} floor: {change}, {runs}; {spread}; beyond the run-to-run noise "
                    f"({self.z:.1f} standard errors, {self.threshold:.1f} needed) but smaller than the {floor} "
                    "that stepwatch calls a change.")
        head = {REGRESSION: "Regression", IMPROVEMENT: "Improvement", WITHIN_NOISE: "Within noise"}[self.verdict]
        return (f"{head}: {change}, {runs}; {spread}; a change must clear {100 * self.min_detectable:.1f} % here "
                f"({self.threshold:.1f} standard errors).")


def format_floor(floor_rel: float = MIN_REL_CHANGE) -> str:
    """The floor as the pages say it: 0.01 -> '1 %', 0.005 -> '0.5 %'."""
    return f"{100 * floor_rel:g} %"


def name_verdict(verdict: str | None, floor_rel: float = MIN_REL_CHANGE) -> str:
    """A verdict that is not a change, in the words of a card or a line: "too noisy", "below the
    1 % floor", "within noise" (a stored verdict string, e.g. a dismissed confirmation's)."""
    if verdict == TOO_NOISY:
        return "too noisy"
    if verdict == BELOW_FLOOR:
        return f"below the {format_floor(floor_rel)} floor"
    return verdict if verdict in (REPEAT, NOT_ENOUGH, REGRESSION, IMPROVEMENT) else WITHIN_NOISE


def run_value(timed_ms: Sequence[float] | None, profiled_ms: Sequence[float] | None) -> float | None:
    """A run's value: the median of its timed steps, else of its profiled steps (positive, finite)."""
    for samples in (timed_ms, profiled_ms):
        x = _positive(samples)
        if x.size:
            return float(np.median(x))
    return None


def step_floor(samples_ms: Sequence[float] | None) -> float | None:
    """The least a run's value varies from its own steps: a median's standard error of log(steps)."""
    x = _positive(samples_ms)
    if x.size < 2:
        return None
    return _MEDIAN_SE * float(np.std(np.log(x), ddof=1)) / math.sqrt(x.size)


def _positive(samples) -> np.ndarray:
    if samples is None:
        return np.empty(0)
    x = np.asarray([v for v in samples if v is not None], dtype=float)
    return x[np.isfinite(x) & (x > 0)]


def estimate_spread(values_by_commit: Sequence[Sequence[float]], breaks: Sequence[int] = (),
                    floor: float | None = None) -> Spread:
    """The series' between-run spread (see the module docstring) from its run values per commit,
    in commit order. `breaks`: indices of commits that start a confirmed change (the difference
    into them is left out of the history); `floor`: the within-run floor (step_floor)."""
    logs = [np.log(_positive(v)) for v in values_by_commit]
    groups = [x for x in logs if x.size >= 2]
    dof = float(sum(x.size - 1 for x in groups))
    sigma, source = None, NONE
    if dof >= MIN_SPREAD_DOF:
        ss = sum(float(np.sum((x - x.mean()) ** 2)) for x in groups)
        sigma, source = math.sqrt(ss / dof), REPEATS
    else:
        levels = [(i, float(x.mean()), x.size) for i, x in enumerate(logs) if x.size]
        cut = set(breaks)
        diffs = [(m2 - m1) / math.sqrt(1 / n1 + 1 / n2) for (i1, m1, n1), (i2, m2, n2) in zip(levels, levels[1:])
                 if not any(i1 < b <= i2 for b in cut)]
        if len(diffs) >= MIN_HISTORY_DIFFS:
            d = np.asarray(diffs)
            sigma, source, dof = _MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))), HISTORY, float(d.size)
    if sigma is None:
        return Spread(None, NONE, 0.0, floor)
    if floor is not None and floor > sigma:
        return Spread(floor, source, dof, floor, True)
    return Spread(sigma, source, dof, floor)


def _threshold(dof: float) -> float:
    """k: the t quantile matching NOISE_MULTIPLE normal standard errors, capped at twice it."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    if not math.isfinite(dof):
        return NOISE_MULTIPLE
    return min(float(student_t.ppf(norm.cdf(NOISE_MULTIPLE), max(dof, 1.0))), 2 * NOISE_MULTIPLE)


def _t95(dof: float) -> float:
    from scipy.stats import t as student_t

    return _Z95 if not math.isfinite(dof) else float(student_t.ppf(0.975, max(dof, 1.0)))


def runs_needed_for_spread() -> int:
    """Runs per commit with which two commits alone give a spread: MIN_SPREAD_DOF dof between them."""
    return 1 + math.ceil(MIN_SPREAD_DOF / 2)


def runs_needed_for(sigma: float, dof: float, target_rel: float = TOO_NOISY_REL, most: int = 50) -> int | None:
    """The fewest runs per commit (both sides) with which a change of `target_rel` clears the test."""
    k = _threshold(dof)
    for n in range(1, most + 1):
        if k * sigma * math.sqrt(2 / n) <= math.log1p(target_rel):
            return n
    return None


def judge(a: Sequence[float], b: Sequence[float], spread: Spread, *, higher_is_better: bool = False,
          same_commit: bool = False, min_rel_change: float = MIN_REL_CHANGE) -> Verdict:
    """The verdict on B against A: `a`, `b` the run values of each side (one per run), `spread`
    the series' (estimate_spread). `same_commit`: both sides measured one sha (a repeat)."""
    xa, xb = _positive(a), _positive(b)
    n_a, n_b = int(xa.size), int(xb.size)
    if not n_a or not n_b:
        return Verdict(NOT_ENOUGH, None, None, None, n_a, n_b, None, None, spread, None, runs_needed_for_spread())
    la, lb = float(np.mean(np.log(xa))), float(np.mean(np.log(xb)))
    d = lb - la
    rel = math.expm1(d)
    va, vb = math.exp(la), math.exp(lb)
    sigma = spread.sigma
    if sigma is None:
        return Verdict(NOT_ENOUGH, rel, None, None, n_a, n_b, va, vb, spread, None, runs_needed_for_spread())
    se = sigma * math.sqrt(1 / n_a + 1 / n_b)
    k = _threshold(spread.dof)
    half = _t95(spread.dof) * se
    low, high = math.expm1(d - half), math.expm1(d + half)
    mdc = max(math.expm1(k * se), min_rel_change)
    z = abs(d) / se if se > 0 else (math.inf if d else 0.0)
    changed = z >= k and abs(rel) >= min_rel_change
    needed = runs_needed_for(sigma, spread.dof) if sigma > 0 else None
    if same_commit:
        verdict = REPEAT
    elif changed:
        verdict = (IMPROVEMENT if (d > 0) == higher_is_better else REGRESSION)
    elif z >= k and d != 0:  # beyond the noise, under the floor
        verdict = BELOW_FLOOR
    elif mdc > TOO_NOISY_REL:
        verdict = TOO_NOISY
    else:
        verdict = WITHIN_NOISE
    return Verdict(verdict, rel, low, high, n_a, n_b, va, vb, spread, mdc, needed, z, k, min_rel_change)


def judge_counts(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = False) -> Verdict:
    """A count's verdict (a kernel's calls per step, exact): changed when each side's runs agree
    and the sides differ; otherwise the run-level model with the count's own repeats."""
    xa = np.asarray([v for v in a if v is not None and math.isfinite(v)], dtype=float)
    xb = np.asarray([v for v in b if v is not None and math.isfinite(v)], dtype=float)
    exact = Spread(0.0, EXACT, math.inf)
    if not xa.size or not xb.size:
        return Verdict(NOT_ENOUGH, None, None, None, int(xa.size), int(xb.size), None, None, exact, None, None)
    if np.ptp(xa) == 0 and np.ptp(xb) == 0:
        va, vb = float(xa[0]), float(xb[0])
        rel = (vb / va - 1.0) if va else (0.0 if vb == va else math.inf)
        verdict = WITHIN_NOISE if va == vb else (IMPROVEMENT if (vb > va) == higher_is_better else REGRESSION)
        return Verdict(verdict, rel, rel, rel, int(xa.size), int(xb.size), va, vb, exact, 0.0, None, None, None)
    return judge(xa, xb, estimate_spread([xa, xb]), higher_is_better=higher_is_better)


def judge_in_series(series: Sequence[tuple[str, float]], a: Sequence[float], b: Sequence[float], *,
                    same_commit: bool = False, higher_is_better: bool = False, floor: float | None = None,
                    breaks: Sequence[int] = ()) -> Verdict:
    """judge() with the spread of a series given as (commit, run value) pairs in commit order
    (runs of one commit next to each other): the pages' and `ingest compare`'s entry point."""
    by_commit: list[list[float]] = []
    last = object()
    for commit, value in series:
        if commit != last:
            by_commit.append([])
            last = commit
        by_commit[-1].append(value)
    return judge(a, b, estimate_spread(by_commit, breaks, floor), higher_is_better=higher_is_better,
                 same_commit=same_commit)
