"""Sweep: what a variant buys at every batch size. tok/s and per-token step time against batch size
(log axes), one line per variant, at a commit and a context; per point the speed-up against the
baseline variant with its interval, verdict and copy shares, and a link to each run. A second
commit puts its sweep beside the first. The URL holds the sweep, commit(s), context, baseline
and variants shown; the pickers only rewrite it. A sweep is what the runs say (db.sweeps)."""

import json

import pandas as pd
import streamlit as st

from app import charts, data
from app.labels import describe_workload, label_commit
from app.markdown_text import format_markdown
from app.sweeps import (at_context, describe_sweep, describe_sweep_workload, find_sweep_of_spec, judge_points,
                        label_context, pick_baseline, pick_default_context, pool_points)
from app.tables import link_runs
from app.widgets import select_in_url
from db import views


def choose_sweep(listing: pd.DataFrame):
    """The pickers (each kept in the URL): the sweep, its commit, a second commit or none."""
    cols = st.columns([2.6, 1.7, 1.7])
    first = listing.drop_duplicates("sweep_id")
    names = {r.sweep_id: f"{describe_workload(_family(r.workload_key))} — {r.engine or 'unknown engine'} on "
             f"{r.device or 'unknown GPU'} ({r.repo})" for r in first.itertuples()}
    with cols[0]:
        sweep_id = select_in_url("Sweep", list(names), "sweep", format_func=names.get)
    mine = listing[listing["sweep_id"] == sweep_id]
    labels = {r.sha: f"{label_commit(r.short_sha, r.subject, 40)} ({r.runs} runs)" for r in mine.itertuples()}
    with cols[1]:
        sha = select_in_url("Commit", list(labels), "commit", format_func=labels.get)
    with cols[2]:
        other = select_in_url("Beside it", ["", *[s for s in labels if s != sha]], "vs", default="",
                              format_func=lambda s: labels[s] if s else "no second commit")
    return sweep_id, [sha] + ([other] if other else [])


def _family(workload_key: str) -> str:
    return json.dumps(describe_sweep_workload(workload_key), sort_keys=True)


def _ratio(x: float) -> str:
    """6.114x, 11.47x: four digits, so that a tight interval's ends differ."""
    return f"{x:.3f}x" if x < 10 else f"{x:.2f}x"


def show_side(runs: pd.DataFrame, points: pd.DataFrame, sha: str, context, baseline: str, variants: list[str],
              width: int, per_row: int) -> None:
    """One commit's sweep: its sentence, the table of speed-ups, the charts."""
    short = sha[:7]
    verdicts = judge_points(runs[runs["variant"].isin(variants)], sha, context, baseline)
    st.markdown(format_markdown("**{}**", describe_sweep(verdicts, context, short)))
    table = verdicts.assign(
        interval=[f"{_ratio(lo)} to {_ratio(hi)}" if pd.notna(lo) and pd.notna(hi) else "— (no spread)"
                  for lo, hi in zip(verdicts["speedup_low"], verdicts["speedup_high"])],
        baseline_copy_share=verdicts["baseline_copy_share"] * 100, copy_share=verdicts["copy_share"] * 100,
        baseline_run=link_runs(verdicts["baseline_run_id"]), run=link_runs(verdicts["run_id"]))
    order = ["batch_size"] + (["variant"] if table["variant"].nunique() > 1 else []) + [
        "baseline_step_ms", "step_ms", "speedup", "interval", "verdict", "baseline_copy_share", "copy_share",
        "baseline_run", "run"]
    one = table["variant"].iloc[0] if len(table) else "variant"
    link = r"run\?run=(\d+)"
    st.dataframe(table, hide_index=True, column_order=order, column_config={
        "batch_size": st.column_config.NumberColumn("bs", format="%d", width="small"),
        "baseline_step_ms": st.column_config.NumberColumn(f"{baseline} ms", format="%.2f"),
        "step_ms": st.column_config.NumberColumn(f"{one} ms" if table["variant"].nunique() <= 1 else "variant ms",
                                                 format="%.2f"),
        "speedup": st.column_config.NumberColumn("speed-up", format="%.2fx"),
        "interval": "95 % interval", "verdict": "verdict",
        "baseline_copy_share": st.column_config.NumberColumn("copy (base)", format="%.1f %%"),
        "copy_share": st.column_config.NumberColumn("copy", format="%.1f %%"),
        "baseline_run": st.column_config.LinkColumn("base run", display_text=link, width="small"),
        "run": st.column_config.LinkColumn("run", display_text=link, width="small")})
    shown = points[(points["sha"] == sha) & at_context(points, context) & points["variant"].isin(variants)]
    event = st.altair_chart(charts.sweep_chart(shown, verdicts, panel_width=width, per_row=per_row),
                            on_select="rerun", key=f"sweep_chart_{short}")
    picked = (event.selection.get(charts.PICK_POINT) or []) if event else []
    if picked and "run_id" in picked[0]:
        st.switch_page("screens/run.py", query_params={"run": str(picked[0]["run_id"])})


st.title("Sweep")
listing = data.load(views.list_sweeps)
if listing.empty:
    st.info("No sweep yet: a sweep is runs of one workload at one commit that differ only in batch size (and "
            "context). Queue one on the Run a benchmark page, or load the samples (`python -m ingest samples`).")
    st.stop()
asked_sweep = st.query_params.get("sweep")
spec = find_sweep_of_spec(listing, asked_sweep) if asked_sweep not in set(listing["sweep_id"]) else None
if spec is not None:  # ?sweep= a sweep spec's id (runs.sweep_id, as the job list names it): its sweep and commit
    st.query_params["sweep"], st.query_params["commit"] = spec
sweep_id, shas = choose_sweep(listing)
runs = data.load(views.get_sweep_runs, sweep_id)
points = pool_points(runs)
contexts = sorted({c for c in runs.loc[runs["sha"].isin(shas), "context"].dropna().astype(int)})
controls = st.columns([1, 1.4, 2.6])
with controls[0]:
    default = pick_default_context(runs, shas[0])
    context = select_in_url("Context", [str(c) for c in contexts], "context",
                            default=str(int(default)) if pd.notna(default) else None,
                            format_func=lambda c: f"{label_context(int(c))} ({c} tokens)")
context = int(context) if context is not None else None
at = points[points["sha"].isin(shas) & at_context(points, context)]
all_variants = sorted(at["variant"].unique())
with controls[1]:
    baseline = select_in_url("Baseline", all_variants, "baseline", default=pick_baseline(at[at["sha"] == shas[0]]))
if baseline is None:
    st.info("No run of this sweep at this commit and context.")
    st.stop()
with controls[2]:
    in_url = st.query_params.get_all("variants")
    unknown = [v for v in in_url if v not in all_variants]
    if unknown:
        st.warning(format_markdown("{:code} matches no variant here: ignored.", "?variants=" + ",".join(unknown)))
    asked = [v for v in in_url if v in all_variants] or all_variants
    variants = st.multiselect("Variants", all_variants, default=asked, key="sweep_variants")
    variants = sorted(set(variants) | {baseline})
    st.query_params["variants"] = variants

sides = st.columns(len(shas)) if len(shas) > 1 else [st.container()]
for side, sha in zip(sides, shas):
    with side:
        if len(shas) > 1:
            st.caption(label_commit(sha[:7], runs.loc[runs["sha"] == sha, "subject"].iloc[0], 60))
        show_side(runs, points, sha, context, baseline, variants, *((115, 2) if len(shas) > 1 else (190, 3)))
specs = sorted({s for ids in listing.loc[(listing["sweep_id"] == sweep_id) & listing["sha"].isin(shas),
                                         "spec_sweep_ids"] for s in ids})
if specs:
    st.caption(format_markdown("Runs of sweep spec {} are among these points.", ", ".join(specs)))
st.caption("Each point pools its runs (the geometric mean of their step ms, as verdicts pool a commit). Speed-up: "
           "the baseline's step time over the variant's at the same batch size and commit; its interval and verdict "
           "follow the rule of Compare (a run is the sample, the spread from the baseline's own repeated runs at "
           "that point; one run a point is not enough data). Copy: the share of kernel time in casts and copies. "
           "Click a point of the tok/s chart, or a run link, to open the run.")
