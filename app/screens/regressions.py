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
    filter_changes,
    format_metric_value,
    format_rel_change,
)
from app.labels import describe_series
from app.markdown_text import Markdown, format_markdown, format_markdown_list
from app.widgets import select_in_url
from db import views
from ingest.regress.detect import ALPHA, MIN_REL_CHANGE

st.title("Regressions")
st.caption("Changes along a series' commits that a rank test on the per-step samples confirmed, with a minimum "
           "effect size, so that machine noise does not count.")
changes, series = data.load_all((views.list_changes,), (views.list_series,))
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
COMMIT_WORDS = {"regression": ("first bad", "last good"), "improvement": ("first improved", "previous")}
shown = filter_changes(changes, repo, series_id, direction, kind)
st.caption(f"{len(shown)} of {len(changes)} confirmed changes, newest first (by first bad commit).")
for change in shown.itertuples():
    with st.container(border=True):
        mark = Markdown(":red[regression]" if change.direction == "regression" else ":green[improvement]")
        st.markdown(format_markdown("**{}** {} · {} -> {} (**{}**, p = {:.2g})", describe_metric(change.metric), mark,
                                    format_metric_value(change.metric, change.before_value),
                                    format_metric_value(change.metric, change.after_value),
                                    format_rel_change(change.rel_change), change.p_value))
        date = Markdown(f"{change.first_bad_date:%Y-%m-%d %H:%M}") if pd.notna(change.first_bad_date) else "no date"
        first, last = COMMIT_WORDS[change.direction]
        st.markdown(format_markdown("{} commit {:code} {} · {} · {} ({} {:code})", first.capitalize(),
                                    change.first_bad_short_sha, change.first_bad_subject, date,
                                    change.first_bad_author or "unknown author", last, change.last_good_sha[:7]))
        st.caption(format_markdown("{} · {}", series_names[change.series_id],
                                   describe_between(change.commits_between, change.bisect_runs, last, first)))
        st.page_link("screens/compare.py", label=f"Compare the {last} and the {first} run",
                     icon=":material/compare_arrows:",
                     query_params={"a": str(change.last_good_run_id), "b": str(change.first_bad_run_id),
                                   "by": "runs"})
        if change.diagnosis:
            with st.expander("Diagnosis"):
                st.markdown(format_markdown_list(finding["text"] for finding in change.diagnosis))
