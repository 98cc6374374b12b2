"""Run: one run's figures, where its step time goes, its kernels, its job's log and its trace."""

import streamlit as st

from app import charts, data, roofline
from app.kpis import COPY_CATEGORIES, label_step_tile, select_rank_figures, show_rank_balance, show_run_kpis
from app.labels import describe_graph_attribution, describe_run, describe_workload
from app.markdown_text import escape_markdown_keeping_code, format_findings, format_markdown, format_pattern_findings
from app.tables import RUN_URL, build_kernel_table, filter_rows, kernel_columns
from app.trace_panel import show_traces
from app.widgets import quote_url_value, read_int_param, select_in_url
from db import views

st.title("Run")
asked = read_int_param("run")
recent, detail, default = data.load_all((views.list_recent_runs,), (views.get_run_detail, asked),
                                        (views.find_default_run, roofline.ROOFLINE_MIN_COVERAGE))
if recent.empty:
    st.info("No runs yet. Start one on the Run a benchmark page, or import a trace with "
            "`python -m ingest import PATH`.")
    st.stop()
labels = {str(r.run_id): describe_run(r.run_id, r.short_sha, r.variant, r.workload_key) for r in recent.itertuples()}
for extra in (asked, default["run_id"]):
    if extra is not None and str(extra) not in labels:
        labels = {str(extra): f"run {extra}", **labels}
run_id = int(select_in_url("Run", list(labels), "run", format_func=labels.get, default=str(default["run_id"])))
if asked is None and run_id == default["run_id"]:  # ids are ints: nothing here needs escaping
    newest = default["newest_run_id"]
    why = ("the newest run whose kernels have measured rates (a roofline, and TB/s and TFLOP/s in the kernel table)"
           if default["rated"] else "the newest run")
    st.caption(f"No run in the address: this is run {run_id}, {why}"
               + ("." if newest == run_id else f"; the newest run of all is [run {newest}]({RUN_URL.format(newest)})."))
if run_id != asked:
    detail = data.load(views.get_run_detail, run_id)
if detail is None:
    st.warning(f"There is no run {run_id} in this database.")
    st.markdown(f"Open [run {default['run_id']}]({RUN_URL.format(default['run_id'])}) ("
                + ("the newest run with measured rates" if default["rated"] else "the newest run")
                + "), or pick a run above; Trends shows every series' runs.")
    st.stop()
run = detail["run"]
commit = f"{run['sha'][:7]} {run['subject'] or ''}" if run["sha"] else "no commit"
st.caption(format_markdown(
    "{repo} · {commit} · variant {variant} · {engine} · {device} · {workload} · {steps} profiled steps ({method}) · "
    "imported {at:%Y-%m-%d %H:%M}", repo=run["repo"] or "no repo", commit=commit, variant=run["variant"] or "—",
    engine=run["engine"] or "—",
    device=run["device"] or ("no GPU kernels" if run["kernels_from_cpu_ops"] else "GPU not named in the trace"),
    workload=describe_workload(run["workload_key"]), steps=run["steps"], method=run["step_method"],
    at=run["imported_at"]))

ranks, first_rank = detail["ranks"], detail["rank"]
if len(ranks) > 1:
    rank = int(select_in_url("Rank", [str(r) for r in ranks], "rank", default=str(first_rank)))
    if rank != detail["rank"]:
        detail = data.load(views.get_run_detail, run_id, rank)
elif st.query_params.get("rank") not in (None, str(first_rank)):
    st.warning(format_markdown("{:code}: this run has one rank, {}, shown below.",
                               quote_url_value("rank", st.query_params["rank"]), first_rank))
    st.query_params.pop("rank")
rank = detail["rank"]
tiles = run if rank == first_rank else select_rank_figures(
    run, rank, data.load(views.get_rank_figures, run_id, rank, list(COPY_CATEGORIES)))
show_run_kpis(tiles, step_label=label_step_tile(tiles))
if len(ranks) == 1 and ranks[0] != 0:
    st.caption(format_markdown("The trace of rank {} (of a multi-GPU job: its other ranks were not imported).",
                               ranks[0]))
if len(ranks) > 1:
    st.caption(format_markdown("The checks and the diagnosis are rank {}'s, the run's first; the Ranks section below "
                               "has each rank's figures side by side.", first_rank))
checks = run["consistency"] or {"checks": []}
if checks.get("marked"):
    st.warning("**These figures disagree.** " + " ".join(
        escape_markdown_keeping_code(c["text"]) for c in checks["checks"] if c["status"] == "marked"),
        icon=":material/warning:")
for check in (c for c in checks["checks"] if c["status"] == "note"):
    st.caption(escape_markdown_keeping_code(check["text"]))
if run["kernels_from_cpu_ops"]:
    st.info("This trace has no GPU kernels (a CPU-only run; or a GPU run profiled without its kernels, which a "
            "note then says), so the CPU operators stand in for kernels below, and GPU busy share does not apply.")
elif run["kernel_rows"] == 0:
    st.info("This run recorded no kernels, so there is no breakdown to show.")

if run["diagnosis"]:
    st.subheader("Diagnosis")
    st.markdown(format_findings(run["diagnosis"]))
    st.caption("Worked out at import from the kernels that take most of the step (on the first rank).")

patterns = run["patterns"] or {"findings": [], "not_evaluated": []}
if patterns["findings"]:
    st.subheader("Patterns")
    st.markdown(format_pattern_findings(patterns["findings"]))
if patterns["not_evaluated"]:
    st.caption(format_markdown("Not evaluated: {}.", "; ".join(f"{n['pattern']}: {n['why']}"
                                                               for n in patterns["not_evaluated"])))
if patterns["findings"] or patterns["not_evaluated"]:
    st.caption("Rules of the pattern catalog (`ingest/regress/patterns.toml`, and `--patterns FILE` at import) "
               "checked at import on the first rank; the time at stake first.")

for note in run["notes"]:
    st.caption(format_markdown("Note: {}", note))

if len(ranks) > 1:
    show_rank_balance(detail["rank_stats"])
breakdown, means, kernels, job = detail["breakdown"], detail["means"], detail["kernels"], detail["job"]

st.subheader("Where the step time goes")
if not breakdown.empty:
    left, right = st.columns([3, 2])
    left.altair_chart(charts.step_breakdown_chart(breakdown))
    right.altair_chart(charts.category_mean_chart(means))
    timed = ("Profiled steps can run slower than the Step ms tile above, which was timed without the profiler."
             if tiles["timing_ms_median"] is not None else
             "The Step ms tile above is these profiled steps' median: the run has no timing without the profiler.")
    st.caption("Kernel time per category in each profiled step; a step lasts from its first kernel's start "
               "to its last kernel's end, and idle is the part of it in which no kernel ran. " + timed)

st.subheader("Kernels")
attribution = run["graph_attribution"]
if attribution:
    st.info(escape_markdown_keeping_code(describe_graph_attribution(attribution)), icon=":material/account_tree:")
needle = st.text_input("Filter kernels", placeholder="name, category, launcher op or source line")
shown = filter_rows(kernels, needle, ["name", "category", "launcher", "source", "graph_op", "graph_source"])
st.caption(f"{len(shown)} of {len(kernels)} kernels, the most time first; click a column to sort.")
columns = kernel_columns(attribution["method"] if attribution else None)
st.dataframe(build_kernel_table(shown), hide_index=True, column_config=columns, column_order=list(columns))

st.subheader("Roofline")
missing = roofline.explain_missing(kernels, run["roofline"])
if missing:
    st.caption(missing)
else:
    points = roofline.roofline_points(kernels)
    st.altair_chart(charts.roofline_chart(points, roofline.roof_lines(run["roofline"], points),
                                          roofline.bandwidth_roofs(run["roofline"])))
    st.caption(roofline.describe_roofs(run["roofline"]))

if job is not None:
    with st.expander(format_markdown("Log of job {} ({}): {}", job["job_id"], job["status"], job["label"])):
        st.code(job["log"] or "(no output)", language=None)

st.subheader("Trace")
show_traces(run_id, run, rank)
