"""Run a benchmark: a form that queues run specs as jobs (a range as one job that a worker expands),
and the queue's live state, where a job that failed (a bad ref, a dead host) shows within seconds."""

import os

import pandas as pd
import streamlit as st

from app import data, spec_inputs
from app.job_form import describe_range_job, describe_sweeps, plan_jobs
from app.markdown_text import format_markdown
from app.tables import as_percent, link_runs, run_columns
from db import views
from ingest.runs.errors import RunError
from ingest.runs.spec import load_config


def _why(kind, error) -> str:
    """A finished job's error cell: "kind: message", or empty for a job that did not fail (its
    fields are NULL, which pandas gives as NaN once any job in the table has an error)."""
    kind = kind if isinstance(kind, str) else ""
    error = error if isinstance(error, str) else ""
    return f"{kind}: {error}" if kind and error else kind or error


st.title("Run a benchmark")
st.caption("Queue runs for a worker (`python -m ingest worker`); each finished run appears on the other pages.")
try:
    config = load_config(os.environ.get("STEPWATCH_CONFIG"))
except RunError as e:
    st.warning(format_markdown("The config file cannot be used, so only this machine is offered: {}", e))
    config = load_config(None)

engines = {"reference": "reference workload", "sglang": "SGLang server", "import": "import a trace"}
engine = st.radio("Engine", list(engines), format_func=engines.get, horizontal=True, key="engine")
with st.form("run_spec"):
    form = {"reference": spec_inputs.ask_reference, "sglang": spec_inputs.ask_sglang,
            "import": spec_inputs.ask_import}[engine](config)
    submitted = st.form_submit_button("Queue", type="primary", icon=":material/play_arrow:")

if submitted:
    try:
        plan = plan_jobs(form, config)
    except RunError as e:
        st.error(format_markdown("Not queued: {}", e))
    else:
        ids, problem = data.write(lambda store: [store.enqueue_job(spec_json, label, plan.batch)
                                                 for spec_json, label in plan.jobs])
        if problem:
            st.warning(format_markdown("Not queued: {}", problem))
        elif plan.expand is not None:
            st.success(format_markdown("Queued job {}: {}; {} (below).", ids[0], plan.jobs[0][1],
                                       describe_range_job(plan)))
        else:
            st.success(format_markdown("Queued {} job{} ({}): {}{}{}", len(ids), "s" if len(ids) > 1 else "",
                                       ", ".join(map(str, ids)), plan.jobs[0][1],
                                       f" and {len(ids) - 1} more" if len(ids) > 1 else "", describe_sweeps(plan)))


SHOWN_ACTIVE = 20


def cancel(job_id: int) -> None:
    status, problem = data.write(lambda store: store.request_cancel(job_id))
    st.session_state["cancel_note"] = problem or format_markdown("Job {}: {}", job_id, (
        "asked to stop; the worker ends it within seconds." if status == "running" else f"{status}."))


@st.fragment(run_every="2s")
def show_jobs() -> None:
    jobs = data.load_fresh(views.list_jobs)
    if "cancel_note" in st.session_state:
        st.info(st.session_state.pop("cancel_note"))
    if not jobs:
        st.caption("No jobs yet.")
        return
    active = [j for j in jobs if j["status"] in ("queued", "running")]
    if active and all(j["status"] == "queued" for j in active) and max(j["queued_s"] for j in active) > 30:
        st.warning("Jobs have waited for more than 30 s and none is running: is a worker started? "
                   "Start one with `python -m ingest worker`.")
    for job in active[:SHOWN_ACTIVE]:
        with st.container(border=True):
            st.markdown(format_markdown("**Job {}** · {} · {}", job["job_id"], job["status"], job["label"]))
            if job["status"] == "running":
                done, planned = job["steps_done"], job["steps_planned"]
                st.progress(min(done / planned, 1.0) if planned else 0.0,
                            text=f"{done} of {planned or '?'} steps · last report {job['heartbeat_s']} s ago"
                                 + (" · cancel requested" if job["cancel_requested"] else ""))
                if job["log_tail"]:
                    st.code("\n".join(job["log_tail"].splitlines()[-8:]), language=None)
            st.button("Cancel", key=f"cancel_{job['job_id']}", disabled=job["cancel_requested"], on_click=cancel,
                      args=(job["job_id"],))
    if len(active) > SHOWN_ACTIVE:
        st.caption(f"… and {len(active) - SHOWN_ACTIVE} more waiting.")

    done = pd.DataFrame([j for j in jobs if j["status"] not in ("queued", "running")])
    if not done.empty:
        st.markdown("**Finished jobs**")
        for job in done.head(3).itertuples():
            if job.status == "failed":
                st.error(format_markdown("Job {} failed ({}): {}. Its log is below.", job.job_id, job.error_kind,
                                         job.error))
        table = done.assign(open=link_runs(done["run_id"]),
                            why=[_why(k, e) for k, e in zip(done["error_kind"], done["error"])])
        st.dataframe(as_percent(table), hide_index=True, column_order=["job_id", "status", "label", "open", "tok_per_s",
                                                           "why", "finished_at"],
                     column_config={**run_columns(), "job_id": "job", "why": "error", "finished_at":
                                    st.column_config.DatetimeColumn("finished", format="YYYY-MM-DD HH:mm:ss")})
        statuses = dict(zip(done["job_id"], done["status"]))
        picked = st.selectbox("Show the log of job", list(statuses), index=None, key="log_job",
                              format_func=lambda j: f"{j} ({statuses[j]})")
        if picked is not None:
            st.code(data.load_fresh(views.get_job, int(picked))["log"] or "(no output)", language=None)


st.subheader("Jobs")
show_jobs()
