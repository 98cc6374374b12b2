"""Confirmed changes as the dashboard shows them (db.views.list_changes' frame): a metric key as
words, before -> after in the metric's unit, the change in percent, the commits between, and the
page's filters. Pure functions, no Streamlit."""

from __future__ import annotations

import math

import pandas as pd

from ingest.regress.detect import ALPHA, MIN_REL_CHANGE

# kernel names are shortened as the diagnosis sentences shorten them (a pure function of a string)
from ingest.regress.diagnose import shorten_kernel_name
from ingest.regress.uncertainty import CHANGED, NOISE_MULTIPLE, NOT_ENOUGH, compare_means, fewest_steps, spread_bound

from .labels import format_percent, format_rel
from .markdown_text import format_markdown

KINDS = {"speed": "speed (tok/s, step ms)", "structure": "structure (kernel calls per step)", "all": "all metrics"}
DIRECTIONS = {"all": "regressions and improvements", "regression": "regressions", "improvement": "improvements"}
_PLAIN = {"tok_per_s": "tok/s", "step_ms": "step ms", "copy_share": "copy-kernel share"}
_KERNEL_FIELDS = {"ms_per_step": "ms per step", "calls_per_step": "calls per step"}


def describe_metric(metric: str) -> str:
    """'tok_per_s' -> 'tok/s'; 'category:cast' -> 'cast ms per step';
    'kernel:calls_per_step:<name>\\x1f<launcher>\\x1f<source>' ->
    'calls per step of unrolled_elementwise_kernel<direct_copy_kernel_cuda> (kernels/workload.py(194): _fetch_kv)'."""
    if metric in _PLAIN:
        return _PLAIN[metric]
    if metric.startswith("category:"):
        return f"{metric.removeprefix('category:')} ms per step"
    if metric.startswith("kernel:"):
        field, _, key = metric.removeprefix("kernel:").partition(":")
        name, _, rest = key.partition("\x1f")
        launcher, _, source = rest.partition("\x1f")
        where = source or launcher
        return f"{_KERNEL_FIELDS.get(field, field)} of {shorten_kernel_name(name)}" + (f" ({where})" if where else "")
    return metric


def kind_of_metric(metric: str) -> str:
    """'speed' (tok/s, step ms), 'structure' (a kernel's calls per step) or 'other'."""
    if metric in ("tok_per_s", "step_ms"):
        return "speed"
    return "structure" if metric.startswith("kernel:calls_per_step:") else "other"


def format_metric_value(metric: str, value: float) -> str:
    if metric == "tok_per_s":
        return f"{value:,.2f} tok/s"
    if metric == "copy_share":
        return format_percent(value)
    if metric.startswith("kernel:calls_per_step:"):
        return f"{value:,.1f} calls/step"
    return f"{value:,.3f} ms"  # step ms, a category's or a kernel's ms per step


def format_rel_change(rel_change: float) -> str:
    """'-89.9 %' or '9.8x'; a kernel that appears (from 0) is 'new'."""
    return "new (0 before)" if math.isinf(rel_change) else format_rel(rel_change)


def describe_between(commits_between: int, bisect_runs: int, last: str = "last good", first: str = "first bad") -> str:
    """The unmeasured commits between the change's last commit before it (`last`: "last good" for a
    regression) and its first commit (`first`), and the bisect."""
    if commits_between == 0 and bisect_runs == 0:
        return f"No unmeasured commit between the {last} and the {first} commit."
    text = (f"{commits_between} unmeasured commit{'s' if commits_between != 1 else ''} between the {last} "
            f"and the {first} commit")
    return text + f"; bisecting: {bisect_runs} run{'s' if bisect_runs != 1 else ''} so far."


def filter_changes(changes: pd.DataFrame, repo: str, series_id: str, direction: str, kind: str) -> pd.DataFrame:
    """The changes the page's filters keep ('all' keeps everything for that filter)."""
    keep = pd.Series(True, index=changes.index)
    if repo != "all":
        keep &= changes["repo"] == repo
    if series_id != "all":
        keep &= changes["series_id"] == series_id
    if direction != "all":
        keep &= changes["direction"] == direction
    if kind != "all":
        keep &= changes["metric"].map(kind_of_metric) == kind
    return changes[keep]


def describe_change(row) -> str:
    """'tok/s -89.9 % (135.44 tok/s -> 13.62 tok/s)': a change in one line (a list_changes row)."""
    before, after = (format_metric_value(row.metric, v) for v in (row.before_value, row.after_value))
    return f"{describe_metric(row.metric)} {format_rel_change(row.rel_change)} ({before} -> {after})"


def describe_verdict(v, source_a: str | None, source_b: str | None):
    """The pair's step-time verdict as one Markdown sentence: the change with its interval,
    the sample counts and the rank test's p, and what the verdict means."""
    kinds = source_a if source_a == source_b else f"{source_a or 'no'} and {source_b or 'no'}"
    steps = f"{v.n_a} and {v.n_b} {kinds} steps"
    if v.verdict == NOT_ENOUGH:
        return format_markdown("**Not enough data**: {} cannot show a change at p < {:g} (a rank test needs at "
                               "least {} steps a run), so the differences below are single measurements.",
                               steps, ALPHA, fewest_steps())
    head = "Changed" if v.verdict == CHANGED else "Within noise"
    if v.beyond_spread is False:
        need = math.expm1(spread_bound(v.spread)) * 100
        tail = (f", short of a change: runs of the same code differ by {v.spread * 100:.1f} % here (the spread of "
                f"{v.spread_pairs} repeated {'run' if v.spread_pairs == 1 else 'runs'} of this workload), so a change "
                f"between two runs must pass {need:.0f} % ({NOISE_MULTIPLE:g} standard errors, as Regressions asks)")
    elif v.verdict != CHANGED:
        tail = (f", short of a change (p < {ALPHA:g} and at least {MIN_REL_CHANGE * 100:.0f} %, the rule Regressions "
                "confirms changes by)")
    else:
        tail = ""
    spread = (f" Run-to-run spread: {v.spread * 100:.1f} % ({v.spread_pairs} repeated "
              f"{'run' if v.spread_pairs == 1 else 'runs'}), in the interval." if v.spread is not None else
              " Run-to-run spread unknown: no commit of this workload was measured twice, so the interval and the "
              "verdict rest on each run's own steps, which agree more than two runs do; repeat a run to know.")
    mixed = (" A's and B's steps were timed differently (with and without the profiler), so part of the difference "
             "may be the profiler's." if source_a != source_b else "")
    return format_markdown("**{}**: step time {} (95 % interval {} to {}; {}; rank test p = {:.2g}){}; tok/s {}.{}{}",
                           head, format_rel(v.rel), format_rel(v.ci_low), format_rel(v.ci_high), steps, v.p, tail,
                           format_rel(1 / (1 + v.rel) - 1), spread, mixed)


KERNEL_KINDS = ["added", "removed", "changed", "within noise", "not enough data"]


def classify_kernel_diff(diff: pd.DataFrame, spread: float | None) -> pd.DataFrame:
    """The kernel diff (db.views.get_kernel_diff) with its `change` column decided against noise:
    added and removed as they are; a kernel whose calls per step changed is `changed` (a count,
    exact); otherwise compare_means' verdict on its ms per step (Welch's test on the profiled
    steps, at least 3 %, beyond the run-to-run `spread` where known). Adds `p` and the 95 %
    interval of the relative change (`ci_low`, `ci_high`)."""
    kinds, ps, lows, highs = [], [], [], []
    for r in diff.itertuples():
        p = low = high = None
        if r.change in ("added", "removed"):
            kind = r.change
        elif r.a_calls_per_step != r.b_calls_per_step:
            kind = CHANGED
        else:
            v = compare_means(r.a_ms_per_step, finite_or_none(r.a_ms_per_step_sd), int(r.a_steps), r.b_ms_per_step,
                              finite_or_none(r.b_ms_per_step_sd), int(r.b_steps), spread=spread)
            kind, p, low, high = v.verdict, v.p, v.ci_low, v.ci_high
        kinds.append(kind)
        ps.append(p)
        lows.append(low)
        highs.append(high)
    return diff.assign(change=kinds, p=ps, ci_low=lows, ci_high=highs)


def finite_or_none(x) -> float | None:
    """A number as a float; None for None or NaN (a spread a kernel row or a category lacks)."""
    return float(x) if x is not None and not pd.isna(x) else None
