"""Run: one run's figures, where its step time goes, its kernels, its job's log and its trace."""

import streamlit as st
import streamlit.components.v1 as components

from app import charts, data, roofline
from app.kpis import show_rank_balance, show_run_kpis
from app.labels import describe_graph_attribution, describe_run, describe_workload
from app.markdown_text import escape_markdown_keeping_code, format_findings, format_markdown, format_pattern_findings
from app.perfetto import PERFETTO_INLINE_MB, perfetto_button_html
from app.tables import as_percent, filter_rows, kernel_columns
from app.traces import TraceGone, download_name, list_trace_files, read_bytes_later, read_verified_bytes
from app.widgets import quote_url_value, read_int_param, select_in_url
from db import views

st.title("Run")
asked = read_int_param("run")
recent, detail = data.load_all((views.list_recent_runs,), (views.get_run_detail, asked))
if recent.empty:
    st.info("No runs yet. Start one on the Run a benchmark page, or import a trace with "
            "`python -m ingest import PATH`.")
    st.stop()
labels = {str(r.run_id): describe_run(r.run_id, r.short_sha, r.variant, r.workload_key) for r in recent.itertuples()}
if asked is not None and str(asked) not in labels:
    labels = {str(asked): f"run {asked}", **labels}
run_id = int(select_in_url("Run", list(labels), "run", format_func=labels.get))
if run_id != asked:
    detail = data.load(views.get_run_detail, run_id)
if detail is None:
    st.warning(f"There is no run {run_id} in this database.")
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

show_run_kpis(run)
if len(detail["ranks"]) == 1 and detail["ranks"][0] != 0:
    st.caption(format_markdown("The trace of rank {} (of a multi-GPU job: its other ranks were not imported).",
                               detail["ranks"][0]))
if len(detail["ranks"]) > 1:
    st.caption(format_markdown("These figures, the checks and the diagnosis are rank {}'s, the run's first; the Ranks "
                               "section below has each rank's, and its kernels.", detail["ranks"][0]))
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

ranks = detail["ranks"]
if len(ranks) > 1:
    show_rank_balance(detail["rank_stats"])
    rank = int(select_in_url("Rank", [str(r) for r in ranks], "rank", default=str(detail["rank"])))
    if rank != detail["rank"]:
        detail = data.load(views.get_run_detail, run_id, rank)
elif st.query_params.get("rank") not in (None, str(detail["rank"])):
    st.warning(format_markdown("{:code}: this run has one rank, {}, shown below.",
                               quote_url_value("rank", st.query_params["rank"]), detail["rank"]))
    st.query_params.pop("rank")
breakdown, means, kernels, job = detail["breakdown"], detail["means"], detail["kernels"], detail["job"]

st.subheader("Where the step time goes")
if not breakdown.empty:
    left, right = st.columns([3, 2])
    left.altair_chart(charts.step_breakdown_chart(breakdown))
    right.altair_chart(charts.category_mean_chart(means))
    timed = ("Profiled steps can run slower than the Step ms above, which was timed without the profiler."
             if run["timing_ms_median"] is not None else
             "The Step ms above is these profiled steps' median: the run has no timing without the profiler.")
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
st.dataframe(as_percent(shown), hide_index=True, column_config=columns, column_order=list(columns))

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
traces, gone = list_trace_files(run["trace_root"], run["trace_digests"])
for why in gone:
    st.caption(format_markdown("Trace no longer available: {}.", why))
for trace in traces:
    name = download_name(run_id, run["sha"], run["variant"], trace.name)
    st.download_button(format_markdown("Download {}", name), read_bytes_later(trace), file_name=name,
                       mime="application/octet-stream", icon=":material/download:", key=f"trace_{trace.path}")
    if trace.size_bytes <= PERFETTO_INLINE_MB << 20:
        try:
            components.html(perfetto_button_html(read_verified_bytes(trace), f"stepwatch {name}", name), height=46)
        except TraceGone as e:
            st.caption(format_markdown("Trace no longer available: {}.", e))
if traces:
    st.caption(f"Open in Perfetto sends the trace from this page to ui.perfetto.dev in a new tab (your browser "
               f"to Perfetto's page, nothing uploaded; traces up to {PERFETTO_INLINE_MB} MB); or open the "
               "downloaded file there (Open trace file) to see each step's kernels on a timeline.")
