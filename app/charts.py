"""Chart builders: pure functions from DataFrames (as db.views returns them) to Altair charts.
Nothing here reads the database or calls Streamlit; tests check them through `chart.to_dict()`."""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from ingest.regress.noise import estimate_spread
from ingest.regress.uncertainty import WITHIN_NOISE, compare_means

from .changes import describe_change, finite_or_none
from .labels import label_commit

# one colour per kernel category on every page; `idle` is the step's time with no kernel running
CATEGORY_COLOURS = {
    "cast": "#d62728", "memcpy": "#ff7f0e", "gemm": "#1f77b4", "attention": "#2ca02c", "moe": "#9467bd",
    "communication": "#8c564b", "norm": "#e377c2", "elementwise": "#17becf", "other": "#bcbd22",
    "idle": "#c7c7c7",
}
REGRESSION_COLOUR, IMPROVEMENT_COLOUR = "#d62728", "#2ca02c"
_NO_CHANGES = pd.DataFrame(columns=["metric", "direction", "variant", "first_bad_sha", "after_value", "p_value",
                                    "commits_between", "rel_change", "before_value"])
PICK_RUN = "pick_run"  # the trend chart's click selection: {"pick_run": [{"run_id": ...}]}


def _category_scale(categories) -> alt.Scale:
    known = [c for c in CATEGORY_COLOURS if c in set(categories)]
    extra = sorted(set(categories) - set(CATEGORY_COLOURS))
    palette = ["#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5"]
    colours = [CATEGORY_COLOURS[c] for c in known] + [palette[i % len(palette)] for i in range(len(extra))]
    return alt.Scale(domain=known + extra, range=colours)


def add_commit_labels(trend: pd.DataFrame) -> pd.DataFrame:
    """A copy of get_trend's frame with `commit_label` ('3bee539 kernels: whole-row gathe…')."""
    return trend.assign(commit_label=[label_commit(s, t, 28) for s, t in zip(trend["short_sha"], trend["subject"])])


def commit_axis_labels(runs: pd.DataFrame) -> list[str]:
    """The x axis's label of each commit_order (index 0 unused): the short sha, which stays
    readable at 100 commits (labels that would overlap are dropped; the tooltip has the subject)."""
    commits = runs.drop_duplicates("commit_order").sort_values("commit_order")
    out = [""] * (int(commits["commit_order"].max()) + 1 if len(commits) else 1)
    for order, sha in zip(commits["commit_order"], commits["short_sha"]):
        out[int(order)] = str(sha)
    return out


def change_markers(runs: pd.DataFrame, changes: pd.DataFrame) -> pd.DataFrame:
    """One row per confirmed change (list_series_changes' frame) whose first bad commit is on
    the chart (`runs`: add_commit_labels' frame), with its commit's place and label and a
    one-line summary."""
    commits = runs.drop_duplicates("sha").set_index("sha")
    shown = changes[changes["first_bad_sha"].isin(commits.index)]
    return pd.DataFrame({
        "metric": shown["metric"], "direction": shown["direction"], "variant": shown["variant"],
        "commit_order": shown["first_bad_sha"].map(commits["commit_order"]),
        "commit_label": shown["first_bad_sha"].map(commits["commit_label"]), "after_value": shown["after_value"],
        "change": [describe_change(r) for r in shown.itertuples()],
        "p_value": shown["p_value"], "commits_between": shown["commits_between"],
    })


TREND_MODES = {"linear": "linear axes", "log": "log axes (tok/s, step ms)",
               "baseline": "change against each variant's first commit shown"}
# the fields each mode's baseline divides: (field, the field whose first-commit mean is its baseline)
_RELATIVE = [("tok_per_s", "tok_per_s"), ("tok_per_s_low", "tok_per_s"), ("tok_per_s_high", "tok_per_s"),
             ("step_ms", "step_ms"), ("step_ms_p10", "step_ms"), ("step_ms_p90", "step_ms"),
             ("extra_ms", "extra_ms")]


def _first_commit_bases(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """Each field's baseline per variant: its mean at the variant's first commit shown."""
    first = runs[runs["commit_order"] == runs.groupby("variant")["commit_order"].transform("min")]
    return {field: first.groupby("variant")[field].mean() for field in {b for _, b in _RELATIVE} if field in runs}


def against_first_commit(runs: pd.DataFrame, markers: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs and markers with tok/s, step ms (and their spreads) and extra_ms as the change
    against each variant's mean at its first commit shown (0.05 = 5 % more)."""
    runs = runs.copy()
    bases = _first_commit_bases(runs)
    for field, base in _RELATIVE:
        if field in runs and base in bases:
            runs[field] = runs[field] / runs["variant"].map(bases[base]) - 1
    markers = markers.copy()
    for metric in ("tok_per_s", "step_ms"):
        mine = markers["metric"] == metric
        markers.loc[mine, "after_value"] = (markers.loc[mine, "after_value"]
                                            / markers.loc[mine, "variant"].map(bases[metric]) - 1)
    return runs, markers.dropna(subset=["after_value"])


def pooled_against_first_commit(pooled: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """pool_commits' frame with level, low and high as the change against the variant's mean at
    its first commit shown (`runs`: before against_first_commit), as against_first_commit does."""
    bases = _first_commit_bases(runs)
    pooled = pooled.copy()
    for metric in POOLED_METRICS:
        mine = pooled["metric"] == metric
        base = pooled.loc[mine, "variant"].map(bases[metric])
        for column in ("level", "low", "high"):
            pooled.loc[mine, column] = pooled.loc[mine, column] / base - 1
    return pooled


POOLED_METRICS = ("tok_per_s", "step_ms")


def pool_commits(trend: pd.DataFrame) -> pd.DataFrame:
    """Each commit's pooled value of each variant (get_trend's frame), as the noise model
    (ingest.regress.noise) pools a commit: the level is the geometric mean of its runs' values
    (exp of the mean log), its 95 % interval exp(mean log +- t95(dof) * sigma / sqrt(runs)), sigma
    the variant's between-run spread over the runs given (estimate_spread: its repeats, else its
    history; the same sigma for tok/s, which is tokens over step time). With no spread estimate
    there is no interval (low, high missing). One row per commit, variant and metric (POOLED_METRICS):
    commit_order, variant, short_sha, metric, runs, level, low, high, spread (its description)."""
    from scipy.stats import t as student_t

    rows = []
    for variant, runs in trend.sort_values(["commit_order", "run_id"]).groupby("variant", sort=True):
        commits = list(runs.groupby("commit_order", sort=True))
        spread = estimate_spread([g["step_ms"].dropna().to_numpy(dtype=float) for _, g in commits])
        t95 = float(student_t.ppf(0.975, max(spread.dof, 1.0))) if spread.sigma is not None else None
        for order, g in commits:
            for metric in POOLED_METRICS:
                x = g[metric].dropna().to_numpy(dtype=float)
                x = x[np.isfinite(x) & (x > 0)]
                if not x.size:
                    continue
                mean, n = float(np.log(x).mean()), int(x.size)
                half = t95 * spread.sigma / math.sqrt(n) if t95 is not None else None
                rows.append({"commit_order": order, "variant": variant, "short_sha": g["short_sha"].iloc[0],
                             "metric": metric, "runs": n, "level": math.exp(mean),
                             "low": math.exp(mean - half) if half is not None else None,
                             "high": math.exp(mean + half) if half is not None else None,
                             "spread": spread.describe()})
    out = pd.DataFrame(rows, columns=["commit_order", "variant", "short_sha", "metric", "runs", "level", "low", "high",
                                      "spread"])
    out[["low", "high"]] = out[["low", "high"]].astype(float)
    return out


def trend_chart(trend: pd.DataFrame, changes: pd.DataFrame | None = None, panel_width: int = 600,
                panel_height: int = 96, mode: str = "linear", extra: pd.DataFrame | None = None,
                extra_title: str = "") -> alt.VConcatChart:
    """tok/s (with the p10..p90 step spread as error bars), copy-kernel share and step ms, one
    line per variant, on one commit axis in first-parent order (the x axis is the commit's
    place, labelled by commit_axis_labels; drag or scroll to zoom it, double-click to reset).
    Each point is a run; in the tok/s and step ms panels a line goes through each commit's pooled
    value (pool_commits: the noise model's level over its runs) and a wide pale bar spans its 95 %
    interval (none without a run-to-run spread); copy share's line is the mean. Clicking a tok/s
    point selects its run. Each confirmed change of the panel's metric (`changes`:
    list_series_changes' frame) is a rule at its first bad commit with a diamond at its value
    after, red for a regression and green for an improvement, drawn under the points.

    `mode` (TREND_MODES): linear axes; log axes for tok/s and step ms (a 7 ms variant and a
    74 ms one both show their changes: equal ratios, equal heights); or each variant as the
    change against its own first commit shown. `extra` (run_id, ms_per_step; get_trend_breakdown)
    adds a fourth panel, one category's or one kernel's ms per step."""
    runs = add_commit_labels(trend)
    if extra is not None:
        runs = runs.merge(extra.rename(columns={"ms_per_step": "extra_ms"}), on="run_id", how="left")
    markers = change_markers(runs, changes) if changes is not None else change_markers(runs, _NO_CHANGES)
    relative = mode == "baseline"
    pooled = pool_commits(trend)
    if relative:
        pooled = pooled_against_first_commit(pooled, runs)
        runs, markers = against_first_commit(runs, markers)
    labels = commit_axis_labels(runs)
    label_expr = "[" + ", ".join(repr(v) for v in labels) + "][datum.value] || ''"
    pick = alt.selection_point(name=PICK_RUN, fields=["run_id"], on="click", clear="dblclick")
    zoom = alt.selection_interval(name="zoom", bind="scales", encodings=["x"])
    tooltip = [alt.Tooltip("short_sha:N", title="commit"), alt.Tooltip("subject:N", title="subject"),
               alt.Tooltip("committed_at:T", title="date", format="%Y-%m-%d %H:%M"),
               alt.Tooltip("author:N", title="author"), alt.Tooltip("variant:N", title="variant"),
               alt.Tooltip("tok_per_s:Q", title="tok/s" + (" vs first" if relative else ""),
                           format="+.1%" if relative else ",.2f"),
               alt.Tooltip("step_ms:Q", title="step ms" + (" vs first" if relative else ""),
                           format="+.1%" if relative else ",.3f"),
               alt.Tooltip("copy_share:Q", title="copy share", format=".1%"),
               alt.Tooltip("run_id:Q", title="run")]
    if extra is not None:
        tooltip.insert(-1, alt.Tooltip("extra_ms:Q", title=extra_title, format="+.1%" if relative else ",.3f"))
    value_format = "+.1%" if relative else ",.3f"
    pooled_tooltip = [alt.Tooltip("short_sha:N", title="commit"), alt.Tooltip("variant:N", title="variant"),
                      alt.Tooltip("runs:Q", title="runs pooled"),
                      alt.Tooltip("level:Q", title="pooled (geometric mean)" + (" vs first" if relative else ""),
                                  format=value_format),
                      alt.Tooltip("low:Q", title="95 % interval from", format=value_format),
                      alt.Tooltip("high:Q", title="95 % interval to", format=value_format),
                      alt.Tooltip("spread:N", title="run-to-run spread")]
    change_tooltip = [alt.Tooltip("direction:N", title="confirmed"), alt.Tooltip("change:N", title="change"),
                      alt.Tooltip("variant:N", title="variant"), alt.Tooltip("commit_label:N", title="first bad"),
                      alt.Tooltip("commits_between:Q", title="unmeasured commits before"),
                      alt.Tooltip("p_value:Q", title="p", format=".2g")]
    colour = alt.Color("variant:N", title="variant", scale=alt.Scale(scheme="tableau10"),
                       legend=alt.Legend(orient="right", labelLimit=110))
    domain = [float(runs["commit_order"].min()) - 0.5, float(runs["commit_order"].max()) + 0.5] if len(runs) else [0, 1]

    def panel(field: str, title: str, axis_format: str, spread: tuple[str, str] | None, bottom: bool,
              selectable: bool = False, ratio: bool = True) -> alt.LayerChart:
        x = alt.X("commit_order:Q", title="commit (first-parent order; drag or scroll to zoom)" if bottom else None,
                  scale=alt.Scale(domain=domain, nice=False, zero=False),
                  axis=alt.Axis(labelExpr=label_expr, labelAngle=-40, labelLimit=240, tickMinStep=1,
                                labelOverlap="greedy", grid=False) if bottom
                  else alt.Axis(labels=False, ticks=False, grid=False, tickMinStep=1))
        base = alt.Chart(runs).encode(x=x, color=colour)
        log = mode == "log" and ratio
        scale = alt.Scale(type="log" if log else "linear", zero=False if (log or relative) else alt.Undefined)
        fmt = "+.0%" if relative and ratio else axis_format
        y_axis = alt.Y(f"mean({field}):Q", title=title, scale=scale, axis=alt.Axis(format=fmt))
        line = base.mark_line(strokeWidth=2).encode(y=y_axis)
        points = base.mark_point(filled=True, size=60).encode(y=alt.Y(f"{field}:Q", scale=scale), tooltip=tooltip)
        if selectable:
            points = points.encode(size=alt.condition(pick, alt.value(100), alt.value(60))).add_params(pick, zoom)
        layers = [line, points]
        level = pooled[pooled["metric"] == field]
        if len(level):  # the line through each commit's pooled value, a wide pale bar its 95 % interval
            at = alt.Chart(level).encode(x=x, color=colour, tooltip=pooled_tooltip)
            line = at.mark_line(strokeWidth=2).encode(y=alt.Y("level:Q", title=title, scale=scale,
                                                              axis=alt.Axis(format=fmt)))
            interval = at.transform_filter("isValid(datum.low)").mark_rule(strokeWidth=9, opacity=0.3).encode(
                y=alt.Y("low:Q", scale=scale), y2=alt.Y2("high:Q"))
            layers = [interval, line, points]
        if spread is not None:
            layers.insert(0, base.mark_rule(strokeWidth=2, opacity=0.6).encode(
                y=alt.Y(f"{spread[0]}:Q", scale=scale), y2=alt.Y2(f"{spread[1]}:Q"), tooltip=tooltip))
        mine = markers[markers["metric"] == field]
        if len(mine):  # drawn first, under the runs' points, so that a click on a point still opens its run
            marked = alt.Chart(mine).encode(
                x=x, color=alt.condition(alt.datum.direction == "regression", alt.value(REGRESSION_COLOUR),
                                         alt.value(IMPROVEMENT_COLOUR)), tooltip=change_tooltip)
            layers[:0] = [marked.mark_rule(strokeDash=[6, 3], strokeWidth=2),
                          marked.mark_point(shape="diamond", filled=True, size=160).encode(
                              y=alt.Y("after_value:Q", scale=scale))]
        return alt.layer(*layers).properties(width=panel_width, height=panel_height)

    vs = " vs first" if relative else ""
    panels = [panel("tok_per_s", "tok/s" + vs, ",.1f", ("tok_per_s_low", "tok_per_s_high"), False, selectable=True),
              panel("copy_share", "copy share", ".0%", None, False, ratio=False),
              panel("step_ms", "step ms" + vs, ",.2f", ("step_ms_p10", "step_ms_p90"), extra is None)]
    if extra is not None:
        panels.append(panel("extra_ms", (extra_title[:24] + vs) or "ms/step", ",.3f", None, True))
    return alt.vconcat(*panels).resolve_scale(color="shared", x="shared")


def step_breakdown_chart(breakdown: pd.DataFrame) -> alt.Chart:
    """Stacked ms per profiled step, one colour per category (get_step_breakdown's frame)."""
    return alt.Chart(breakdown).mark_bar().encode(
        x=alt.X("step:O", title="profiled step"),
        y=alt.Y("sum(ms):Q", title="ms", stack="zero"),
        color=alt.Color("category:N", scale=_category_scale(breakdown["category"]), title="category"),
        order=alt.Order("category:N"),
        tooltip=[alt.Tooltip("step:O"), alt.Tooltip("category:N"), alt.Tooltip("ms:Q", format=",.3f")],
    ).properties(height=260)


def category_mean_chart(means: pd.DataFrame) -> alt.Chart:
    """Mean ms per step of each category, largest first (get_category_means' frame)."""
    return alt.Chart(means).mark_bar().encode(
        y=alt.Y("category:N", sort="-x", title=None),
        x=alt.X("ms_per_step:Q", title="mean ms per step"),
        color=alt.Color("category:N", scale=_category_scale(means["category"]), legend=None),
        tooltip=[alt.Tooltip("category:N"), alt.Tooltip("ms_per_step:Q", title="ms/step", format=",.3f")],
    ).properties(height=alt.Step(24))


def change_rows(diff: pd.DataFrame, spread: float | None = None) -> pd.DataFrame:
    """get_category_diff's frame as the rows of a change chart: the whole step's change first
    ("step", B - A), then each category's, largest change first; `label` is the signed ms.
    Each category present in both runs with step-to-step spreads on both sides gets the verdict
    the kernels get (compare_means: Welch's test on the profiled steps, at least MIN_REL_CHANGE (1 %), beyond the
    workload's run-to-run `spread`): `low`/`high`, its 95 % interval in ms, and `noise`, whether
    it is within noise (the label says so); with the spread unknown (None) no category can be
    called changed, as the noise model rules (ingest.regress.noise): drawn pale like noise, its
    label says "not enough data". A category new or gone is a change."""
    total = float(diff["delta_ms_per_step"].sum())
    rows = pd.DataFrame({"part": ["step"] + diff["category"].tolist(),
                         "delta_ms": [total] + diff["delta_ms_per_step"].astype(float).tolist()})
    rows["kind"] = ["total"] + ["slower" if d > 0 else "faster" if d < 0 else "same" for d in rows["delta_ms"][1:]]
    lows, highs, noise = [None], [None], [False]
    spreads = all(c in diff.columns for c in ("a_sd_ms", "b_sd_ms", "a_steps", "b_steps"))
    for r in diff.itertuples():
        known = spreads and pd.notna(r.a_steps) and pd.notna(r.b_steps)
        v = compare_means(float(r.a_ms_per_step), finite_or_none(r.a_sd_ms), int(r.a_steps), float(r.b_ms_per_step),
                          finite_or_none(r.b_sd_ms), int(r.b_steps), spread=spread) if known else None
        inside = v is not None and v.ci_low is not None
        lows.append(v.ci_low * v.median_a if inside else None)  # (compare_means: the means)
        highs.append(v.ci_high * v.median_a if inside else None)
        # without the run-to-run spread the steps of two runs cannot tell a change (ingest.regress.noise)
        noise.append(inside and (v.verdict == WITHIN_NOISE or spread is None))
    rows["low"], rows["high"] = pd.array(lows, dtype="Float64"), pd.array(highs, dtype="Float64")
    rows["noise"] = noise
    unjudged = " (not enough data)" if spread is None else " (noise)"
    rows["label"] = [f"{d:+,.3f} ms" + (unjudged if n else "") for d, n in zip(rows["delta_ms"], rows["noise"])]
    return rows


def change_chart(rows: pd.DataFrame) -> alt.LayerChart:
    """Signed bars of change_rows' ms from zero (a change of 0.01 ms is as visible as its share
    of the largest), each labelled with its value: red slower, green faster, the step grey; a
    black whisker spans each category's 95 % interval, and a change within noise is drawn pale."""
    order = rows["part"].tolist()
    rows = rows.assign(shade=[("noise" if n else k) for k, n in zip(rows["kind"], rows["noise"])],
                       low=rows["low"].astype(float), high=rows["high"].astype(float))
    base = alt.Chart(rows).encode(
        y=alt.Y("part:N", sort=order, title=None),
        tooltip=[alt.Tooltip("part:N", title="step part"),
                 alt.Tooltip("delta_ms:Q", title="change, ms", format="+,.3f"),
                 alt.Tooltip("low:Q", title="95 % interval from", format="+,.3f"),
                 alt.Tooltip("high:Q", title="95 % interval to", format="+,.3f")])
    bars = base.mark_bar(size=18).encode(
        x=alt.X("delta_ms:Q", title="change in ms per profiled step (B - A)"),
        color=alt.Color("shade:N", title=None, legend=None,
                        scale=alt.Scale(domain=["total", "slower", "faster", "same", "noise"],
                                        range=["#8c8c8c", "#d62728", "#2ca02c", "#bdbdbd", "#e0e0e0"])))
    whiskers = base.transform_filter("isValid(datum.low)").mark_rule(color="black", strokeWidth=1.5).encode(
        x="low:Q", x2="high:Q")
    text = base.mark_text(align="left", dx=4).encode(
        x=alt.value(4), text=alt.Text("label:N"))  # at the left edge: readable whatever the bar's sign
    return alt.layer(bars, whiskers, text).properties(height=alt.Step(26))


def variant_chart(matrix: pd.DataFrame, a_label: str, b_label: str) -> alt.Chart:
    """tok/s of every variant at commit A and commit B, side by side (get_variant_matrix's frame)."""
    long = pd.concat([
        pd.DataFrame({"variant": matrix["variant"], "commit": a_label, "tok_per_s": matrix["a_tok_per_s"]}),
        pd.DataFrame({"variant": matrix["variant"], "commit": b_label, "tok_per_s": matrix["b_tok_per_s"]}),
    ], ignore_index=True).dropna(subset=["tok_per_s"])
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y("variant:N", title=None),
        yOffset=alt.YOffset("commit:N", sort=[a_label, b_label]),
        x=alt.X("tok_per_s:Q", title="decode tok/s"),
        color=alt.Color("commit:N", sort=[a_label, b_label], title=None,
                        scale=alt.Scale(range=["#9ecae1", "#08519c"])),
        tooltip=[alt.Tooltip("variant:N"), alt.Tooltip("commit:N"), alt.Tooltip("tok_per_s:Q", format=",.2f")],
    ).properties(height=alt.Step(16))


def rank_balance_parts(rank_stats: pd.DataFrame) -> pd.DataFrame:
    """Store.list_rank_stats' frame as the parts of each rank's step (ms): computation (busy time
    that is not communication), communication spent moving data, communication spent waiting for
    the last rank, and idle. Waiting counts as moving data when it is unknown."""
    rows = []
    for r in rank_stats.itertuples():
        busy = r.busy_ms_median if pd.notna(r.busy_ms_median) else 0.0
        wait = r.wait_ms_median if pd.notna(r.wait_ms_median) else 0.0
        step = r.step_ms_median if pd.notna(r.step_ms_median) else busy
        comm = r.comm_ms_median
        parts = {"compute": max(busy - comm, 0.0), "communication": max(comm - wait, 0.0),
                 "waiting for the last rank": wait, "idle": max(step - busy, 0.0)}
        rows += [{"rank": f"rank {r.rank}", "part": p, "ms": ms} for p, ms in parts.items()]
    return pd.DataFrame(rows, columns=["rank", "part", "ms"])


def rank_balance_chart(parts: pd.DataFrame) -> alt.Chart:
    """One horizontal bar per rank, its step split into rank_balance_parts' parts."""
    order = ["compute", "communication", "waiting for the last rank", "idle"]
    return alt.Chart(parts).mark_bar().encode(
        y=alt.Y("rank:N", title=None, sort=None),
        x=alt.X("sum(ms):Q", title="ms per step", stack="zero"),
        color=alt.Color("part:N", title=None, sort=order,
                        scale=alt.Scale(domain=order, range=["#1f77b4", "#8c564b", "#d62728", "#c7c7c7"])),
        order=alt.Order("part_order:Q"),
        tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=",.3f")],
    ).transform_calculate(
        part_order=" + ".join(f"(datum.part == '{p}' ? {i} : 0)" for i, p in enumerate(order))
    ).properties(height=alt.Step(28))


def roofline_chart(points: pd.DataFrame, roofs: pd.DataFrame, hbm: pd.DataFrame) -> alt.VConcatChart:
    """Top, log-log: each kernel row with FLOPs at its intensity (FLOP per byte) and achieved
    TFLOP/s, sized by its share of kernel time and coloured by category, the device's roofs
    (each unit's datasheet peak solid, measured dashed: min(peak, intensity x bandwidth)), the
    kernels with the most time labelled (staggered, so that neighbours stay legible). Below: the
    kernels without FLOPs (casts, copies), whose
    only roof is bandwidth: their achieved TB/s against the HBM roofs. (app/roofline.py's frames.)"""
    tooltip = [alt.Tooltip("short_name:N", title="kernel"), alt.Tooltip("launcher:N", title="op"),
               alt.Tooltip("where:N", title="source"), alt.Tooltip("input_dtypes:N", title="input dtypes"),
               alt.Tooltip("share:Q", title="share", format=".1%"),
               alt.Tooltip("tflops:Q", title="TFLOP/s", format=",.3f"),
               alt.Tooltip("tbps:Q", title="TB/s", format=",.3f"),
               alt.Tooltip("intensity:Q", title="FLOP/byte", format=",.2f"),
               alt.Tooltip("compute_fraction:Q", title="of compute peak", format=".1%"),
               alt.Tooltip("bandwidth_fraction:Q", title="of bandwidth peak", format=".1%"),
               alt.Tooltip("bound:N", title="bound"),
               alt.Tooltip("flops_per_call:Q", title="FLOPs/call", format=",.4~s"),
               alt.Tooltip("model_bytes_per_call:Q", title="bytes/call", format=",.4~s")]
    colour = alt.Color("category:N", scale=_category_scale(points["category"]), title="category")
    size = alt.Size("share:Q", title="share of kernel time", scale=alt.Scale(range=[30, 900]),
                    legend=alt.Legend(format=".1%"))
    placed = points[~points["flat"]]
    x = alt.X("intensity:Q", title="arithmetic intensity (FLOP per byte read + written)",
              scale=alt.Scale(type="log"), axis=alt.Axis(format="~g"))
    y = alt.Y("tflops:Q", title="achieved TFLOP/s", scale=alt.Scale(type="log"), axis=alt.Axis(format="~g"))
    # the legend names only the roofs drawn (most devices have no measured ceilings)
    bases = [b for b in ("datasheet", "measured on the card") if b in set(roofs["basis"])] or ["datasheet"]
    lines = alt.Chart(roofs).mark_line(strokeWidth=1.5, color="#555").encode(
        x=x, y=y, detail="roof:N", strokeDash=alt.StrokeDash(
            "basis:N", title="roofs", scale=alt.Scale(domain=bases, range=[[1, 0], [5, 3]][:len(bases)])),
        tooltip=[alt.Tooltip("roof:N"), alt.Tooltip("peak_tflops:Q", title="peak TFLOP/s", format=",.1f"),
                 alt.Tooltip("tbps:Q", title="bandwidth TB/s", format=",.2f")])
    ends = roofs[roofs["basis"] == "datasheet"].sort_values("intensity").groupby("roof", as_index=False).last()
    names = alt.Chart(ends.assign(unit=ends["roof"].str.split(" ").str[0])).mark_text(
        align="right", dy=-6, fontSize=10, color="#555").encode(x=x, y=y, text="unit:N")
    dots = alt.Chart(placed).mark_circle(opacity=0.75, stroke="black", strokeWidth=0.5).encode(
        x=x, y=y, color=colour, size=size, tooltip=tooltip)
    named = placed[placed["label"] != ""].sort_values(["intensity", "tflops"])
    labels = [alt.Chart(named.iloc[[i]]).mark_text(align="left", dx=10, dy=15 * (i % 3 - 1), fontSize=11).encode(
        x=x, y=y, text="label:N") for i in range(len(named))]
    left = alt.layer(lines, names, dots, *labels).properties(width=560, height=330, title="kernels with FLOPs")
    flat = points[points["flat"]]
    if flat.empty:
        return alt.vconcat(left).configure_legend(orient="bottom", direction="horizontal", columns=4)
    bars = alt.Chart(flat).mark_bar().encode(
        y=alt.Y("row_name:N", sort="-x", title=None, axis=alt.Axis(labelLimit=180)),
        x=alt.X("tbps:Q", title="achieved TB/s (read + written)"), color=colour, tooltip=tooltip)
    rules = alt.Chart(hbm).mark_rule(color="#555", strokeWidth=1.5).encode(
        x="tbps:Q", strokeDash=alt.StrokeDash("roof:N", title=None, scale=alt.Scale(range=[[1, 0], [5, 3]])),
        tooltip=[alt.Tooltip("roof:N"), alt.Tooltip("tbps:Q", title="TB/s", format=",.2f")])
    values = alt.Chart(flat).mark_text(align="left", dx=4, fontSize=11).encode(
        y=alt.Y("row_name:N", sort="-x"), x="tbps:Q", text="bar_label:N")
    right = alt.layer(bars, rules, values).properties(width=560, height=alt.Step(22),
                                             title="kernels without FLOPs (casts, copies): bandwidth is their roof")
    return alt.vconcat(left, right).resolve_scale(color="shared", strokeDash="independent").configure_legend(
        orient="bottom", direction="horizontal", columns=4)


PICK_POINT = "pick_point"  # the sweep chart's click selection: {"pick_point": [{"run_id": ...}]}
SPEEDUP_COLOURS = {"improvement": IMPROVEMENT_COLOUR, "regression": REGRESSION_COLOUR, "within noise": "#7f7f7f",
                   "too noisy": "#bcbd22", "not enough data": "#9ecae1"}


def _batch_axis(title: str | None, sizes) -> alt.X:
    """Batch size on a log axis, ticks at the sizes measured."""
    values = sorted({int(b) for b in sizes})
    return alt.X("batch_size:Q", title=title, scale=alt.Scale(type="log", base=2, nice=False,
                                                              domain=[values[0] / 1.3, values[-1] * 1.3] if values
                                                              else alt.Undefined),
                 axis=alt.Axis(values=values, format="d", grid=False))


def sweep_chart(points: pd.DataFrame, verdicts: pd.DataFrame | None = None, panel_width: int = 200,
                panel_height: int = 150, per_row: int = 3) -> alt.VConcatChart:
    """tok/s and per-token step time (step ms / batch size) against batch size, both on log axes,
    one line per variant (app.sweeps.pool_points' frame, one commit and context), and with
    `verdicts` (app.sweeps.judge_points' frame) the speed-up panel (speedup_chart); `per_row`
    panels a row (3: one row; less: the speed-up under the other two). Each point is a batch
    size's runs pooled; clicking a tok/s point selects its newest run (PICK_POINT)."""
    pick = alt.selection_point(name=PICK_POINT, fields=["run_id"], on="click", clear="dblclick")
    x = _batch_axis("batch size (log)", points["batch_size"])
    colour = alt.Color("variant:N", title="variant", scale=alt.Scale(scheme="tableau10"),
                       legend=alt.Legend(orient="bottom", labelLimit=140))
    tooltip = [alt.Tooltip("variant:N", title="variant"), alt.Tooltip("batch_size:Q", title="batch size"),
               alt.Tooltip("tok_per_s:Q", title="tok/s", format=",.1f"),
               alt.Tooltip("step_ms:Q", title="step ms", format=",.2f"),
               alt.Tooltip("ms_per_token:Q", title="ms per token", format=",.3f"),
               alt.Tooltip("copy_share:Q", title="copy share", format=".1%"),
               alt.Tooltip("runs:Q", title="runs pooled"), alt.Tooltip("run_id:Q", title="run (click to open)")]
    base = alt.Chart(points).encode(x=x, color=colour)

    def panel(field: str, title: str, fmt: str, selectable: bool) -> alt.LayerChart:
        y = alt.Y(f"{field}:Q", title=title, scale=alt.Scale(type="log"), axis=alt.Axis(format=fmt))
        dots = base.mark_point(filled=True, size=70).encode(y=y, tooltip=tooltip)
        if selectable:
            dots = dots.encode(size=alt.condition(pick, alt.value(120), alt.value(70))).add_params(pick)
        return alt.layer(base.mark_line(strokeWidth=2).encode(y=y), dots).properties(width=panel_width,
                                                                                     height=panel_height)

    pair = alt.hconcat(panel("tok_per_s", "decode tok/s (log)", "~s", True),
                       panel("ms_per_token", "step ms per token (log)", "~g", False)).resolve_scale(color="shared")
    if verdicts is None:
        return alt.vconcat(pair)
    speedups = speedup_chart(verdicts, panel_width, panel_height)
    whole = alt.hconcat(pair, speedups) if per_row >= 3 else alt.vconcat(pair, speedups)
    return alt.vconcat(whole.resolve_scale(color="independent", shape="independent"))


def speedup_chart(verdicts: pd.DataFrame, panel_width: int = 260, panel_height: int = 170) -> alt.LayerChart:
    """Each variant's speed-up against the baseline per batch size (app.sweeps.judge_points' frame):
    a point per batch size coloured by its verdict, a bar its 95 % interval (none without a
    run-to-run spread), a rule at 1x (no change); log axes."""
    rows = verdicts.dropna(subset=["speedup"])
    x = _batch_axis("batch size (log)", rows["batch_size"])
    tooltip = [alt.Tooltip("variant:N", title="variant"), alt.Tooltip("batch_size:Q", title="batch size"),
               alt.Tooltip("speedup:Q", title="speed-up", format=".2f"),
               alt.Tooltip("speedup_low:Q", title="95 % interval from", format=".2f"),
               alt.Tooltip("speedup_high:Q", title="95 % interval to", format=".2f"),
               alt.Tooltip("verdict:N", title="verdict"), alt.Tooltip("spread:N", title="run-to-run spread"),
               alt.Tooltip("run_id:Q", title="run")]
    colour = alt.Color("verdict:N", title="verdict", legend=alt.Legend(orient="bottom"),
                       scale=alt.Scale(domain=list(SPEEDUP_COLOURS), range=list(SPEEDUP_COLOURS.values())))
    y = alt.Y("speedup:Q", title=f"speed-up vs {rows['baseline'].iloc[0] if len(rows) else 'baseline'} (log)",
              scale=alt.Scale(type="log"), axis=alt.Axis(format="~g"))
    base = alt.Chart(rows).encode(x=x)
    one = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[4, 3], color="#888").encode(
        y=alt.Y("speedup:Q", scale=alt.Scale(type="log")))
    interval = base.transform_filter("isValid(datum.speedup_low)").mark_rule(strokeWidth=8, opacity=0.35).encode(
        y=alt.Y("speedup_low:Q", scale=alt.Scale(type="log")), y2="speedup_high:Q", color=colour, tooltip=tooltip)
    line = base.mark_line(strokeWidth=1, color="#999").encode(y=y, detail="variant:N")
    dots = base.mark_point(filled=True, size=80).encode(y=y, color=colour, shape=alt.Shape("variant:N", legend=None),
                                                        tooltip=tooltip)
    return alt.layer(one, interval, line, dots).properties(width=panel_width, height=panel_height)
