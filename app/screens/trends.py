"""Trends: decode tok/s, copy-kernel share and step time across commits, one line per variant."""

import streamlit as st

from app import charts, data
from app.labels import describe_workload
from app.markdown_text import format_markdown
from app.tables import as_percent, link_runs, run_columns
from app.widgets import select_in_url
from db import views
from ingest.regress.detect import MIN_REL_CHANGE
from ingest.regress.diagnose import shorten_kernel_name


def choose_series(series):
    """The selectors above the chart (each kept in the URL); the chosen repo, engine, GPU, workload,
    how many commits to show, and the workload keys of the remaining series."""
    cols = st.columns([1, 1, 1.4, 0.7, 2.6, 0.8])
    with cols[0]:
        repo = select_in_url("Repository", series["repo"].unique(), "repo", format_func=lambda v: v or "(none)")
    series = series[series["repo"] == repo]
    with cols[1]:
        engine = select_in_url("Engine", series["engine"].unique(), "engine", format_func=lambda v: v or "not recorded")
    series = series[series["engine"] == engine]
    with cols[2]:
        device = select_in_url("GPU", series["device"].unique(), "gpu", format_func=lambda v: v or NO_GPU)
    series = series[series["device"] == device]
    batches = series["batch_size"].astype("string").fillna("—")
    with cols[3]:
        batch = select_in_url("Batch size", batches.unique(), "batch")
    series = series[batches == batch]
    keys = dict(zip(series["workload_id"], series["workload_key"]))
    runs_in = dict(zip(series["workload_id"], series["runs"]))
    with cols[4]:
        workload_id = select_in_url("Workload", list(keys), "workload",
                                    format_func=lambda w: f"{describe_workload(keys[w])} ({runs_in[w]} runs)")

    with cols[5]:
        last = select_in_url("Commits shown", ["30", "100", "300", "all"], "last", default="100",
                             format_func=lambda n: "all" if n == "all" else f"last {n}")
    return repo, engine, device, workload_id, last, keys


def describe_breakdown(what: str, limit: int = 80) -> str:
    """'category cast' or 'kernel unrolled_elementwise_kernel<…>' for a list_trend_breakdowns value."""
    kind, _, name = what.partition(":")
    text = f"{kind} {shorten_kernel_name(name) if kind == 'kernel' else name} (ms/step)"
    return text if len(text) <= limit else text[:limit - 1] + "…"


NO_GPU = "none recorded (CPU runs, or traces without GPU properties)"


st.title("Trends")
st.caption("Decode throughput of each workload along a repository's first-parent history. "
           "Points are runs; click one to open it.")

with data.reading():  # one wait for writers: the series, then the chosen series' trend
    counts, series, loose = data.load_all((views.count_runs,), (views.list_series,), (views.list_runs_without_commit,))
    if counts["runs"] == 0:
        st.info("No runs yet. Start one on the Run a benchmark page, or import a trace with "
                "`python -m ingest import PATH`.")
        st.page_link("screens/run_benchmark.py", label="Run a benchmark", icon=":material/play_arrow:")
        st.stop()
    if not series.empty:
        repo, engine, device, workload_id, last, keys = choose_series(series)
        trend, changes = data.load_all((views.get_trend, repo, engine, device, workload_id,
                                        None if last == "all" else int(last)),
                                       (views.list_series_changes, repo, engine, device, workload_id))
        breakdowns, spread = data.load_all((views.list_trend_breakdowns, tuple(trend["run_id"].tolist())),
                                           (views.get_run_spread, int(trend["run_id"].iloc[0])))

if series.empty:
    st.info(f"None of the {counts['runs']} runs measured a commit, so there is no trend to draw yet. "
            "They are listed below.")
else:
    commits = trend["commit_order"].nunique()
    variants = ", ".join(sorted(v or "none given" for v in trend["variant"].unique()))  # '' is a run's missing variant
    st.markdown(format_markdown("**{}** — {} runs at {} commit{}, variants: {}", describe_workload(keys[workload_id]),
                                len(trend), commits, "s" if commits != 1 else "", variants))
    left, right = st.columns([1, 1.4])
    with left:
        scale = select_in_url("Axes", list(charts.TREND_MODES), "scale", format_func=charts.TREND_MODES.get,
                              default="linear", label_visibility="collapsed")
    with right:
        also = select_in_url("Also plot", ["", *breakdowns], "also", default="", label_visibility="collapsed",
                             format_func=lambda v: "also plot: a category or a kernel" if not v
                             else "also plot: " + describe_breakdown(v))
    extra = data.load(views.get_trend_breakdown, tuple(trend["run_id"].tolist()), also) if also else None
    event = st.altair_chart(charts.trend_chart(trend, changes, mode=scale, extra=extra,
                                               extra_title=describe_breakdown(also, 24) if also else ""),
                            on_select="rerun", key="trend_chart")
    st.caption("Each point is one run, its thin error bar tok/s and step ms at the 10th and 90th percentile of the "
               "steps it timed without the profiler (none when it timed none). The line goes through each commit's "
               "pooled value (the geometric mean of its runs, as verdicts pool them), the wide pale bar its 95 % "
               "interval from the variant's run-to-run spread (none while that is unknown). Log axes show variants "
               "of very different speeds with their changes at the same "
               "height for the same ratio. Drag or scroll the chart to zoom the commits; double-click to reset.")
    if spread["spread"] is None:
        st.caption("Run-to-run spread unknown: no commit of this workload was measured twice. Two runs of the same "
                   "code differ by more than their steps do; queue a repeat to know how much.")
    elif spread["spread"] > MIN_REL_CHANGE:
        st.warning(f"Runs of the same commit differ by {spread['spread'] * 100:.1f} % here ({spread['pairs']} "
                   f"repeated runs): more than the {MIN_REL_CHANGE * 100:.0f} % change Regressions looks for, so "
                   "small changes of this workload cannot be told from noise. Pin clocks, idle the machine, or "
                   "repeat runs.")
    else:
        st.caption(f"Run-to-run spread: runs of the same commit differ by {spread['spread'] * 100:.1f} % "
                   f"({spread['pairs']} repeated runs).")
    if not changes.empty:
        st.caption("Dashed rules mark the first bad commit of each confirmed change of this series (red: "
                   "regression, green: improvement); the Regressions page lists them with their diagnosis.")
    picked = (event.selection.get(charts.PICK_RUN) or []) if event else []
    if picked and "run_id" in picked[0]:
        st.switch_page("screens/run.py", query_params={"run": str(picked[0]["run_id"])})

    if commits >= 2:
        last_two = trend.drop_duplicates("commit_order", keep="last").tail(2)
        st.page_link("screens/compare.py", label="Compare the last two commits", icon=":material/compare_arrows:",
                     query_params={"a": str(last_two["run_id"].iloc[0]), "b": str(last_two["run_id"].iloc[1])})
    with st.expander(f"The {len(trend)} runs of this series", expanded=False):
        table = trend.assign(open=link_runs(trend["run_id"]))
        st.dataframe(as_percent(table), hide_index=True,
                     column_order=["open", "short_sha", "subject", "variant", "tok_per_s", "step_ms", "copy_share",
                                   "gpu_busy_share", "committed_at"],
                     column_config=run_columns())

st.subheader("Runs without a commit")
if loose.empty:
    st.caption("Every run in the database measured a commit.")
else:
    st.caption("Plain trace imports: no commit was given for these, so they are not on the trend.")
    st.dataframe(as_percent(loose.assign(open=link_runs(loose["run_id"]))), hide_index=True,
                 column_order=["open", "imported_at", "source_path", "engine", "variant", "device", "steps",
                               "tok_per_s", "step_ms", "copy_share"],
                 column_config=run_columns())
