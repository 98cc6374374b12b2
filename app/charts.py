"""Chart builders: pure functions from DataFrames (as db.views returns them) to Altair charts.
Nothing here reads the database or calls Streamlit; tests check them through `chart.to_dict()`."""

from __future__ import annotations

import altair as alt
import pandas as pd

from .changes import describe_change
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


def change_markers(runs: pd.DataFrame, changes: pd.DataFrame) -> pd.DataFrame:
    """One row per confirmed change (list_series_changes' frame) whose first bad commit is on
    the chart (`runs`: add_commit_labels' frame), with its commit label and a one-line summary."""
    labels = runs.drop_duplicates("sha").set_index("sha")["commit_label"]
    shown = changes[changes["first_bad_sha"].isin(labels.index)]
    return pd.DataFrame({
        "metric": shown["metric"], "direction": shown["direction"], "variant": shown["variant"],
        "commit_label": shown["first_bad_sha"].map(labels), "after_value": shown["after_value"],
        "change": [describe_change(r) for r in shown.itertuples()],
        "p_value": shown["p_value"], "commits_between": shown["commits_between"],
    })


def trend_chart(trend: pd.DataFrame, changes: pd.DataFrame | None = None, panel_width: int = 860,
                panel_height: int = 170, log_scale: bool = False) -> alt.VConcatChart:
    """tok/s (with the p10..p90 step spread as error bars), copy-kernel share and step ms, one
    line per variant, on one commit axis in first-parent order. Each point is a run; a line
    goes through the mean of a commit's runs. Clicking a tok/s point selects its run. Each
    confirmed change of the panel's metric (`changes`: list_series_changes' frame) is a rule at
    its first bad commit with a diamond at its value after, red for a regression and green for
    an improvement. `log_scale`: tok/s and step ms on log axes, so that a 7 ms variant and a
    74 ms one both show their changes (equal ratios, equal heights)."""
    runs = add_commit_labels(trend)
    order = runs.drop_duplicates("commit_order").sort_values("commit_order")["commit_label"].tolist()
    markers = change_markers(runs, changes) if changes is not None else change_markers(runs, _NO_CHANGES)
    pick = alt.selection_point(name=PICK_RUN, fields=["run_id"], on="click", clear="dblclick")
    tooltip = [alt.Tooltip("short_sha:N", title="commit"), alt.Tooltip("subject:N", title="subject"),
               alt.Tooltip("committed_at:T", title="date", format="%Y-%m-%d %H:%M"),
               alt.Tooltip("author:N", title="author"), alt.Tooltip("variant:N", title="variant"),
               alt.Tooltip("tok_per_s:Q", title="tok/s", format=",.2f"),
               alt.Tooltip("step_ms:Q", title="step ms", format=",.3f"),
               alt.Tooltip("copy_share:Q", title="copy share", format=".1%"),
               alt.Tooltip("run_id:Q", title="run")]
    change_tooltip = [alt.Tooltip("direction:N", title="confirmed"), alt.Tooltip("change:N", title="change"),
                      alt.Tooltip("variant:N", title="variant"), alt.Tooltip("commit_label:N", title="first bad"),
                      alt.Tooltip("commits_between:Q", title="unmeasured commits before"),
                      alt.Tooltip("p_value:Q", title="p", format=".2g")]
    colour = alt.Color("variant:N", title="variant", scale=alt.Scale(scheme="tableau10"),
                       legend=alt.Legend(orient="top"))

    def panel(field: str, title: str, axis_format: str, spread: tuple[str, str] | None, bottom: bool,
              selectable: bool = False) -> alt.LayerChart:
        x = alt.X("commit_label:N", sort=order, title="commit (first-parent order)" if bottom else None,
                  axis=alt.Axis(labelAngle=-40, labelLimit=240) if bottom else alt.Axis(labels=False, ticks=False))
        base = alt.Chart(runs).encode(x=x, color=colour)
        scale = alt.Scale(type="log" if log_scale and field != "copy_share" else "linear",
                          zero=False if log_scale else alt.Undefined)
        line = base.mark_line(strokeWidth=2).encode(y=alt.Y(f"mean({field}):Q", title=title, scale=scale,
                                                            axis=alt.Axis(format=axis_format)))
        points = base.mark_point(filled=True, size=70).encode(y=alt.Y(f"{field}:Q", scale=scale), tooltip=tooltip)
        if selectable:
            points = points.encode(size=alt.condition(pick, alt.value(110), alt.value(70))).add_params(pick)
        layers = [line, points]
        if spread is not None:
            layers.insert(0, base.mark_rule(strokeWidth=2, opacity=0.6).encode(
                y=alt.Y(f"{spread[0]}:Q", scale=scale), y2=alt.Y2(f"{spread[1]}:Q"), tooltip=tooltip))
        mine = markers[markers["metric"] == field]
        if len(mine):
            marked = alt.Chart(mine).encode(
                x=x, color=alt.condition(alt.datum.direction == "regression", alt.value(REGRESSION_COLOUR),
                                         alt.value(IMPROVEMENT_COLOUR)), tooltip=change_tooltip)
            layers += [marked.mark_rule(strokeDash=[6, 3], strokeWidth=2),
                       marked.mark_point(shape="diamond", filled=True, size=140).encode(
                           y=alt.Y("after_value:Q", scale=scale))]
        return alt.layer(*layers).properties(width=panel_width, height=panel_height)

    return alt.vconcat(
        panel("tok_per_s", "decode tok/s", ",.1f", ("tok_per_s_low", "tok_per_s_high"), False, selectable=True),
        panel("copy_share", "copy-kernel share", ".0%", None, False),
        panel("step_ms", "step ms", ",.2f", ("step_ms_p10", "step_ms_p90"), True),
    ).resolve_scale(color="shared")


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


def change_rows(diff: pd.DataFrame) -> pd.DataFrame:
    """get_category_diff's frame as the rows of a change chart: the whole step's change first
    ("step", B - A), then each category's, largest change first; `label` is the signed ms."""
    total = float(diff["delta_ms_per_step"].sum())
    rows = pd.DataFrame({"part": ["step"] + diff["category"].tolist(),
                         "delta_ms": [total] + diff["delta_ms_per_step"].astype(float).tolist()})
    rows["kind"] = ["total"] + ["slower" if d > 0 else "faster" if d < 0 else "same" for d in rows["delta_ms"][1:]]
    rows["label"] = [f"{d:+,.3f} ms" for d in rows["delta_ms"]]
    return rows


def change_chart(rows: pd.DataFrame) -> alt.LayerChart:
    """Signed bars of change_rows' ms from zero (a change of 0.01 ms is as visible as its share
    of the largest), each labelled with its value: red slower, green faster, the step grey."""
    order = rows["part"].tolist()
    base = alt.Chart(rows).encode(
        y=alt.Y("part:N", sort=order, title=None),
        tooltip=[alt.Tooltip("part:N", title="step part"),
                 alt.Tooltip("delta_ms:Q", title="change, ms", format="+,.3f")])
    bars = base.mark_bar(size=18).encode(
        x=alt.X("delta_ms:Q", title="change in ms per profiled step (B - A)"),
        color=alt.Color("kind:N", title=None, legend=None,
                        scale=alt.Scale(domain=["total", "slower", "faster", "same"],
                                        range=["#8c8c8c", "#d62728", "#2ca02c", "#bdbdbd"])))
    text = base.mark_text(align="left", dx=4).encode(
        x=alt.value(4), text=alt.Text("label:N"))  # at the left edge: readable whatever the bar's sign
    return alt.layer(bars, text).properties(height=alt.Step(26))


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
    """get_rank_stats' frame as the parts of each rank's step (ms): computation (busy time that is
    not communication), communication spent moving data, communication spent waiting for the
    last rank, and idle. Waiting counts as moving data when it is unknown."""
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
