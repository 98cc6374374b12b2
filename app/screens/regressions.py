"""Regressions: the confirmed changes of every series (found by `ingest.runs.track` after each
job), newest first by first bad commit, each with its commit, its size, the commits still to
bisect, a link to its comparison and its diagnosis. The filters live in the URL."""

import pandas as pd
import streamlit as st

from app import data
from app.changes import (
    DIRECTIONS,
    KINDS,
    describe_between,
    describe_metric,
    describe_evidence,
    describe_status,
    filter_changes,
    format_metric_value,
    group_events,
    format_rel_change,
)
from app.labels import describe_series
from app.markdown_text import Markdown, format_markdown, format_markdown_list
from app.widgets import select_in_url
from db import views
from ingest.regress.detect import ALPHA, MIN_REL_CHANGE
from ingest.regress.noise import name_verdict

st.title("Regressions")
st.caption("Change points along a series' commits, one card each with every metric and kernel that moved there. "
           "The run is the sample: a change is confirmed only beyond the run-to-run spread of its own series.")
changes, series, dismissed = data.load_all((views.list_changes,), (views.list_series,),
                                           (views.list_dismissed_confirmations,))


def _reruns(n, host) -> str:
    return f"{int(n)} interleaved re-run{'s' if int(n) != 1 else ''} on {host}"


def describe_confirmation(change) -> str:
    """How the card's change was confirmed, or why it is only suspected: its window's interleaved
    re-runs (ingest/runs/confirm.py), else the series' own spread, else what stops a verdict."""
    state = change.confirm_state if isinstance(change.confirm_state, str) else None
    if change.direction in ("added", "removed") and state != "dismissed":
        return "Exact: a kernel's calls per step need no re-run."
    if state == "confirmed":
        return f"Confirmed by {_reruns(change.confirm_reruns, change.confirm_host)}."
    if state == "queued":
        return f"Suspected: {_reruns(change.confirm_reruns, change.confirm_host)} queued to confirm it."
    if state == "failed":
        return f"Suspected: its {_reruns(change.confirm_reruns, change.confirm_host)} gave no verdict (failed jobs)."
    if state == "dismissed":
        what = name_verdict(change.confirm_verdict)
        return (f"Its speed change was not confirmed by re-runs: {what} "
                f"({_reruns(change.confirm_reruns, change.confirm_host)}).")
    if change.status == "confirmed":
        return f"Confirmed against the run-to-run spread of its series (from its {change.noise_source})."
    if not isinstance(change.first_bad_spec_engine, str) or change.first_bad_spec_engine == "import":
        return "Suspected: imported runs cannot be re-run: run them with a spec to confirm."
    return "Suspected: not re-run yet (the worker re-runs both commits interleaved after a job of its series)."


def _show_dismissed() -> None:
    """The suspected changes that their re-runs did not confirm: one line each."""
    if dismissed.empty:
        return
    st.subheader("Not confirmed by re-runs")
    for d in dismissed.itertuples():
        what = name_verdict(d.verdict)
        st.caption(format_markdown("{} {} · {:code} -> {:code} {} · not confirmed by re-runs: {} ({})", d.repo,
                                   d.variant or "—", d.last_good_sha[:7], d.first_bad_sha[:7], d.first_bad_subject,
                                   what, _reruns(d.reruns, d.host)))


if changes.empty:
    checked = series[series["commits"] >= 2]
    if checked.empty:
        st.info("No confirmed change yet: changes are looked for once a series has runs at two or more commits, "
                "and none has yet.")
    else:
        workloads, variants = len(checked), sum(len(v) for v in checked["variants"])
        st.info(f"No confirmed change: {workloads} workload{'s' if workloads > 1 else ''} measured at two or more "
                f"commits (up to {int(checked['commits'].max())}), {variants} variant{'s' if variants > 1 else ''}: "
                f"each variant's series was checked after each run, and none moved beyond its noise (a rank test "
                f"at p < {ALPHA:g} on the per-step samples and a change of at least {MIN_REL_CHANGE * 100:.0f} %)."
                + (f" Some runs have only {int(checked['fewest_samples'].min())} step sample"
                   f"{'s' if checked['fewest_samples'].min() > 1 else ''}: too few for the test to confirm a change "
                   "at that level; profile more steps (or time steps without the profiler) for a verdict."
                   if checked["fewest_samples"].min() < 5 else ""))
    _show_dismissed()
    st.stop()

series_names = {r.series_id: f"{describe_series(r.repo, r.engine, r.device, r.workload_key)} · {r.variant or '—'}"
                for r in changes.drop_duplicates("series_id").itertuples()}
cols = st.columns([1, 3, 1.4, 1.6])
with cols[0]:
    repo = select_in_url("Repository", ["all", *changes["repo"].unique()], "repo")
with cols[1]:
    in_repo = changes if repo == "all" else changes[changes["repo"] == repo]
    series_id = select_in_url("Series", ["all", *in_repo["series_id"].unique()], "series",
                              format_func=lambda s: "all" if s == "all" else series_names[s])
with cols[2]:
    direction = select_in_url("Direction", list(DIRECTIONS), "direction", format_func=DIRECTIONS.get)
with cols[3]:
    kind = select_in_url("Metric", list(KINDS), "kind", format_func=KINDS.get)

# a change's first commit and the last one before it: "bad" and "good" only for a regression
COMMIT_WORDS = {"regression": ("first bad", "last good"), "improvement": ("first improved", "previous"),
                "added": ("first", "previous"), "removed": ("first", "previous")}
shown = filter_changes(changes, repo, series_id, direction, kind)
# the filters pick events (any of their changes passing); a card shows all of its event's changes
picked = set(shown["change_id"])
events = [e for e in group_events(filter_changes(changes, repo, series_id, "all", "all"))
          if any(r.change_id in picked for r in e["rows"])]
confirmed = int((shown["status"] == "confirmed").sum())
st.caption(f"{len(events)} event{'s' if len(events) != 1 else ''} ({len(shown)} of {len(changes)} changes: "
           f"{confirmed} confirmed, {len(shown) - confirmed} suspected), newest first (by first bad commit). "
           "A change is confirmed when it clears the run-to-run spread of its own series (repeated runs, else "
           "its history); without one it is only suspected.")


def _line(row) -> Markdown:
    return format_markdown("**{}** {} · {} -> {} (**{}**, {})", describe_metric(row.metric), Markdown(describe_status(row)),
                           format_metric_value(row.metric, row.before_value),
                           format_metric_value(row.metric, row.after_value), format_rel_change(row.rel_change),
                           describe_evidence(row))


for event in events:
    change = event["head"]
    with st.container(border=True):
        st.markdown(_line(change))
        date = Markdown(f"{change.first_bad_date:%Y-%m-%d %H:%M}") if pd.notna(change.first_bad_date) else "no date"
        first, last = COMMIT_WORDS[change.direction]
        st.markdown(format_markdown("{} commit {:code} {} · {} · {} ({} {:code})", first.capitalize(),
                                    change.first_bad_short_sha, change.first_bad_subject, date,
                                    change.first_bad_author or "unknown author", last, change.last_good_sha[:7]))
        st.caption(format_markdown("{} · {}", series_names[change.series_id],
                                   describe_between(change.commits_between, change.bisect_runs, last, first)))
        st.caption(describe_confirmation(change))
        if event["metrics"] or event["kernels"]:
            st.markdown(Markdown("\n".join(f"- {_line(r)}" for r in event["metrics"] + event["kernels"])))
        st.page_link("screens/compare.py", label=f"Compare the {last} and the {first} run",
                     icon=":material/compare_arrows:",
                     query_params={"a": str(change.last_good_run_id), "b": str(change.first_bad_run_id),
                                   "by": "runs"})
        diagnosis = next((r.diagnosis for r in event["rows"] if r.diagnosis), None)
        if diagnosis:
            with st.expander("Diagnosis"):
                st.markdown(format_markdown_list(finding["text"] for finding in diagnosis))

_show_dismissed()
