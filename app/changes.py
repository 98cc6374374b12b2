"""Confirmed changes as the dashboard shows them (db.views.list_changes' frame): a metric key as
words, before -> after in the metric's unit, the change in percent, the commits between, and the
page's filters. Pure functions, no Streamlit."""

from __future__ import annotations

import math

import pandas as pd

from ingest.regress.detect import ALPHA, MIN_REL_CHANGE

# kernel names are shortened as the diagnosis sentences shorten them (a pure function of a string)
from ingest.regress.diagnose import shorten_kernel_name
from ingest.regress.noise import judge_in_series, runs_needed_for_spread
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


_HEADLINE_ORDER = ("tok_per_s", "step_ms", "copy_share")


def group_events(changes: pd.DataFrame) -> list[dict]:
    """One event per change point: the changes of one variant of a series at one (last good,
    first bad) commit pair, grouped into one card. {"head": the headline row (tok/s, else step
    ms, else copy share, else the first), "metrics": the other confirmed or suspected rows of
    tok/s, step ms, copy share and categories (a category only when confirmed: one within its own
    series' noise is not listed), "kernels": the kernel rows (added / removed kernels whatever the
    rest; a kernel's ms or calls per step only when confirmed), "rows": all of them}. Events in
    the frame's order (list_changes: newest first)."""
    events: dict[tuple, list] = {}
    for row in changes.itertuples():
        events.setdefault((row.series_id, row.last_good_sha, row.first_bad_sha), []).append(row)
    out = []
    for rows in events.values():
        order = sorted(rows, key=lambda r: (_HEADLINE_ORDER.index(r.metric) if r.metric in _HEADLINE_ORDER else 9))
        head = order[0]
        metrics = [r for r in order[1:] if not r.metric.startswith("kernel:")
                   and (r.metric in _HEADLINE_ORDER or r.status == "confirmed")]
        kernels = [r for r in order if r.metric.startswith("kernel:") and r is not head
                   and (r.direction in ("added", "removed") or r.status == "confirmed")]
        # a kernel that appears is one fact: its ms and calls per step rows name it once
        seen, unique = set(), []
        for r in kernels:
            key = (r.metric.split(":", 2)[2], r.direction) if r.direction in ("added", "removed") else r.metric
            if key not in seen:
                seen.add(key)
                unique.append(r)
        out.append({"head": head, "metrics": metrics, "kernels": unique, "rows": rows})
    return out


def describe_status(row) -> str:
    """':red[regression]', ':green[improvement]', ':orange[suspected regression]', ':blue[kernel added]'."""
    if row.direction in ("added", "removed"):
        return f":blue[kernel {row.direction}]"
    color = "red" if row.direction == "regression" else "green"
    if row.status == "confirmed":
        return f":{color}[{row.direction}]"
    return f":orange[suspected {row.direction}]"


def describe_evidence(row) -> str:
    """How the noise model judged a change, in a few words: 'confirmed: 3 and 3 runs, spread 2.1 %
    from repeats' / 'not enough data: 1 and 1 run, no run-to-run spread: run each commit 2 times'."""
    runs = (f"{int(row.runs_before)} and {int(row.runs_after)} run{'s' if row.runs_before + row.runs_after != 2 else ''}"
            if pd.notna(row.runs_before) and pd.notna(row.runs_after) else "runs unknown")
    if row.direction in ("added", "removed"):
        return f"exact: {runs}"
    if row.status == "confirmed":
        spread = (f"spread {100 * row.noise_spread:.1f} % from its {row.noise_source}" if pd.notna(row.noise_spread)
                  else "exact")
        return f"confirmed: {runs}, {spread}"
    if row.noise_verdict is None or (isinstance(row.noise_verdict, float) and pd.isna(row.noise_verdict)):
        return "suspected: found before the noise model judged changes; re-run change tracking"
    return f"suspected, not enough data: {runs}, no run-to-run spread: run each commit {runs_needed_for_spread()} times"


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


def describe_run_verdict(v, source_a: str | None, source_b: str | None):
    """The noise model's verdict (ingest.regress.noise.Verdict) as one Markdown sentence, its
    head in bold ("**Regression**: step time +6.1 % (95 % interval ...), 3 and 3 runs; ...")."""
    head, _, rest = v.describe("step time").partition(": ")
    mixed = (" A's and B's steps were timed differently (with and without the profiler), so part of the difference "
             "may be the profiler's." if source_a != source_b else "")
    tok = f" tok/s {format_rel(1 / (1 + v.rel) - 1)}." if v.rel is not None else ""
    return format_markdown("**{}**: {}{}{}", head, rest, tok, mixed)


def judge_sides(values: pd.DataFrame, variant: str | None, runs_a: list[int], runs_b: list[int],
                fallback_a: float | None, fallback_b: float | None, *, same_commit: bool,
                floor: float | None = None):
    """The noise model's step-time verdict on the runs of side B against side A, the spread
    the series' own (db.views.list_series_values, this variant's runs); a run outside the
    series (no commit) counts with its own value (`fallback_a`, `fallback_b`)."""
    rows = values[values["variant"] == (variant or "")] if len(values) else values
    series = list(zip(rows["commit_id"], rows["step_ms"])) if len(rows) else []
    by_run = dict(zip(rows["run_id"], rows["step_ms"])) if len(rows) else {}
    a = [by_run[r] for r in runs_a if r in by_run] or ([fallback_a] if fallback_a else [])
    b = [by_run[r] for r in runs_b if r in by_run] or ([fallback_b] if fallback_b else [])
    return judge_in_series(series, a, b, same_commit=same_commit, floor=floor)


KERNEL_KINDS = ["added", "removed", "changed", "within noise", "not enough data"]


def classify_kernel_diff(diff: pd.DataFrame, spread: float | None) -> pd.DataFrame:
    """The kernel diff (db.views.get_kernel_diff) with its `change` column decided against noise:
    added and removed as they are; a kernel whose calls per step changed is `changed` (a count,
    exact); with the workload's run-to-run `spread` unknown, "not enough data" (the noise model's
    rule: steps within a run are no evidence of a change between runs); otherwise compare_means'
    verdict on its ms per step (Welch's test on the profiled steps, at least MIN_REL_CHANGE (1 %), beyond the
    run-to-run `spread`: the step time's, a kernel's own series is not read here). Adds `p` and the 95 %
    interval of the relative change (`ci_low`, `ci_high`)."""
    kinds, ps, lows, highs = [], [], [], []
    for r in diff.itertuples():
        p = low = high = None
        if r.change in ("added", "removed"):
            kind = r.change
        elif r.a_calls_per_step != r.b_calls_per_step:
            kind = CHANGED
        elif spread is None:  # the steps of two runs alone cannot tell a change (ingest.regress.noise)
            kind = NOT_ENOUGH
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


def kernel_of_metric(metric: str) -> str:
    """The kernel a 'kernel:<field>:<name>\\x1f<launcher>\\x1f<source>' metric names, shortened
    as the diagnosis shortens it ('' for a metric of no kernel)."""
    if not metric.startswith("kernel:"):
        return ""
    return shorten_kernel_name(metric.removeprefix("kernel:").partition(":")[2].partition("\x1f")[0])


def describe_event_line(event: dict):
    """One change point (a group_events item) as one Markdown line: 'Confirmed at d445ae3 in
    demo (default): **tok/s -89.8 % (132.31 tok/s -> 13.52 tok/s)**; also step ms 9.8x, cast ms
    per step 166.1x (confirmed: 4 and 4 runs, ...); kernels added `a`, removed `b` (exact: 4 and 6
    runs) · [all changes](regressions)'. An event of kernels only (calls per step) leads with them."""
    head = event["head"]
    kernels = ([head] if head.metric.startswith("kernel:") else []) + list(event["kernels"])
    also = [f"{describe_metric(r.metric)} {format_rel_change(r.rel_change)}" for r in event["metrics"]]
    parts = []
    for direction in ("added", "removed"):
        names = list(dict.fromkeys(kernel_of_metric(r.metric) for r in kernels if r.direction == direction))
        if names:
            parts.append(format_markdown(f"{direction} " + ", ".join(["{:code}"] * len(names)), *names))
    moved = [f"{describe_metric(r.metric)} {format_rel_change(r.rel_change)}" for r in kernels
             if r.direction not in ("added", "removed")]
    lead = (format_markdown("**{}**", describe_change(head)) if not head.metric.startswith("kernel:")
            else format_markdown(""))
    line = format_markdown("{} at {} in {} ({}): ", "Confirmed" if head.status == "confirmed" else "Suspected",
                           head.first_bad_short_sha, head.repo, head.variant or "no variant") + lead
    if also:
        line += format_markdown("; also {}", ", ".join(also))
    if not head.metric.startswith("kernel:"):
        line += format_markdown(" ({})", describe_evidence(head))
    if parts or moved:
        line += ("; kernels " if lead else "kernels ") + ", ".join([*parts, *(format_markdown("{}", m) for m in moved)])
        line += format_markdown(" ({})", describe_evidence(kernels[0]))
    return line + " · [all changes](regressions)"


def pool_run(run: dict, step_ms: float | None) -> dict:
    """A run's overview (Store.get_run) with its step ms replaced by a side's pooled value (the
    verdict's geometric mean of the side's runs) and its tok/s with it (tok/s is tokens over step
    time: scaled by the run's step ms over the pooled one). The run as it is when either is missing."""
    if step_ms is None or not run.get("step_ms"):
        return run
    tok = run.get("tok_per_s")
    return {**run, "step_ms": step_ms, "tok_per_s": tok * run["step_ms"] / step_ms if tok else tok}


def describe_bars_against_verdict(profiled_delta_ms: float, verdict, source: str | None) -> str | None:
    """The one sentence Compare says when the category bars (the profiled steps of run A and run
    B, summed) and the step-time verdict (ingest.regress.noise: each side's runs pooled, their
    timed steps, else profiled) move in opposite directions; None when they agree (or either is 0)."""
    if not verdict.rel or not profiled_delta_ms or (profiled_delta_ms > 0) == (verdict.rel > 0):
        return None
    basis = "timed without the profiler" if source == "timed" else "profiled"
    runs = f"{verdict.n_a} and {verdict.n_b} run{'s' if verdict.n_a + verdict.n_b != 2 else ''}"
    return (f"The bars and the verdict disagree in sign because they measure different steps: the bars are run A's and "
            f"run B's profiled steps ({profiled_delta_ms:+,.3f} ms a step), the verdict the steps {basis} of {runs} "
            f"({100 * verdict.rel:+.1f} %); the verdict's \"{verdict.verdict}\" is the one that counts, the bars say "
            "where the time went.")
