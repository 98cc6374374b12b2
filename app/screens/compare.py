"""Compare: two commits (or two runs) of one workload side by side: their figures, every variant
at both commits, the step-time change by category and the kernels that changed. The URL holds
the two runs (?a=&b=), so a comparison can be shared; the pickers only rewrite the URL."""

import pandas as pd
import streamlit as st

from app import charts, data
from app.changes import (KERNEL_KINDS, classify_kernel_diff, describe_bars_against_verdict, describe_event_line,
                         describe_run_verdict, group_events, judge_sides, pool_run)
from app.diagnosis import diagnose_pair, is_patch_pair
from app.kpis import show_run_kpis
from app.labels import describe_run, describe_series, format_change, label_commit
from app.markdown_text import Markdown, format_markdown, format_markdown_list
from app.tables import (KERNEL_DIFF_ORDER, as_percent, filter_rows, kernel_diff_columns, link_runs,
                        variant_matrix_columns)
from app.widgets import read_int_param
from db import views
from ingest.regress import RegressError
from ingest.regress.diagnose import shorten_kernel_name
from ingest.regress.detect import ALPHA, MIN_REL_CHANGE
from ingest.regress.noise import step_floor

st.title("Compare")
asked_a, asked_b = read_int_param("a"), read_int_param("b")
if (asked_a is None) != (asked_b is None):
    st.warning(format_markdown("Comparing needs two runs, {:code} and {:code}; only {:code} was given: showing the "
                               "default comparison (the last two commits of the newest series) instead.",
                               "?a=", "?b=", "?a=" if asked_b is None else "?b="))
elif asked_a is not None and asked_a == asked_b:
    st.warning(f"A and B are the same run ({asked_a}): every difference below is zero. Pick another run for B.")
comparison = data.load(views.get_comparison, asked_a, asked_b)
if comparison is None:
    st.info("Comparing needs two runs; this database has fewer. Start some on the Run a benchmark page.")
    st.stop()
run_a, run_b, a, b = comparison["run_a"], comparison["run_b"], comparison["a"], comparison["b"]
matrix, trend, series, diff, kernels = (comparison[k] for k in ("matrix", "trend", "series", "diff", "kernels"))
if a is None or b is None:
    st.warning(f"There is no run {run_a if a is None else run_b} in this database.")
    st.stop()

by = st.radio("Compare", ["two commits", "two runs"], horizontal=True, key="compare_by",
              index=0 if (st.query_params.get("by") or comparison["by"]) != "runs" and a["sha"] else 1,
              label_visibility="collapsed")
if by == "two commits" and series.empty:
    st.info("No run has measured a commit yet, so there are no commits to compare: compare two runs instead.")
    st.stop()
if by == "two commits":
    ids = [f"{r.repo}\t{r.engine}\t{r.device}\t{r.workload_id}" for r in series.itertuples()]
    names = dict(zip(ids, (describe_series(r.repo, r.engine, r.device, r.workload_key) for r in series.itertuples())))
    mine = f"{a['repo']}\t{a['engine']}\t{a['device']}\t{a['workload_id']}"
    picked = st.selectbox("Workload", ids, index=ids.index(mine) if mine in ids else 0, format_func=names.get,
                          key="compare_series")
    if picked != mine or trend is None:
        trend = data.load(views.get_trend, *picked.split("\t"))
    commits = trend.drop_duplicates("sha")
    if len(commits) < 2:
        st.info("This workload was measured at one commit only: pick another workload, or compare two runs.")
        st.stop()
    shas = commits["sha"].tolist()
    commit_names = dict(zip(shas, (label_commit(s, t, 70) for s, t in zip(commits["short_sha"], commits["subject"]))))
    left, right = st.columns(2)
    sha_a = left.selectbox("Commit A (before)", shas, format_func=commit_names.get, key="compare_sha_a",
                           index=shas.index(a["sha"]) if a["sha"] in shas else len(shas) - 2)
    sha_b = right.selectbox("Commit B (after)", shas, format_func=commit_names.get, key="compare_sha_b",
                            index=shas.index(b["sha"]) if b["sha"] in shas else len(shas) - 1)
    at_a, at_b = (set(trend.loc[trend["sha"] == s, "variant"]) for s in (sha_a, sha_b))
    variants = sorted(at_a & at_b) or sorted(at_a | at_b)
    variant = st.selectbox("Variant shown in detail", variants, key="compare_variant",
                           index=variants.index(a["variant"]) if a["variant"] in variants else 0)
    chosen = (views.pick_run_at(trend, sha_a, variant), views.pick_run_at(trend, sha_b, variant))
else:
    recent = data.load(views.list_recent_runs)
    labels = {int(r.run_id): describe_run(r.run_id, r.short_sha, r.variant, r.workload_key)
              for r in recent.itertuples()}
    for run in (a, b):
        labels.setdefault(run["run_id"], describe_run(run["run_id"], (run["sha"] or "")[:7], run["variant"],
                                                      run["workload_key"]))
    ids = list(labels)
    left, right = st.columns(2)
    chosen = (left.selectbox("Run A (before)", ids, format_func=labels.get, key="compare_run_a",
                             index=ids.index(run_a)),
              right.selectbox("Run B (after)", ids, format_func=labels.get, key="compare_run_b",
                              index=ids.index(run_b)))
if None in chosen:
    st.info(format_markdown("{} was not measured at both commits, so there is nothing to compare.", variant))
    st.stop()
wanted = {"a": str(chosen[0]), "b": str(chosen[1]), "by": "commits" if by == "two commits" else "runs"}
if wanted != {k: st.query_params.get(k) for k in wanted}:
    st.query_params.update(wanted)
    if chosen != (run_a, run_b):
        st.rerun()

# (a trace imported on its own records no workload: its workload_id names the empty key, so two such
# runs would look alike)
same_work = (a["workload_key"] is not None and b["workload_key"] is not None and a["workload_id"] == b["workload_id"]
             and a["device"] == b["device"])
if not matrix.empty and a["sha"] and b["sha"] and a["sha"] != b["sha"] and same_work:
    st.subheader("Every variant at both commits")
    name_a, name_b = a["sha"][:7], b["sha"][:7]
    values = comparison["series_values"]

    def variant_verdict(variant, x, y) -> str:
        if pd.isna(x) or pd.isna(y):
            return "—"
        at = values[values["variant"] == variant]  # every run of the variant at each commit: pooled
        runs_a = at.loc[at["sha"] == a["sha"], "run_id"].tolist()
        runs_b = at.loc[at["sha"] == b["sha"], "run_id"].tolist()
        return judge_sides(values, variant, runs_a, runs_b, None, None, same_commit=False).verdict

    verdicts = [variant_verdict(v, x, y) for v, x, y in zip(matrix["variant"], matrix["a_run_id"], matrix["b_run_id"])]
    table = matrix.assign(change=[format_change(x, y) for x, y in zip(matrix["a_tok_per_s"], matrix["b_tok_per_s"])],
                          verdict=verdicts, run_a=link_runs(matrix["a_run_id"]), run_b=link_runs(matrix["b_run_id"]))
    st.dataframe(as_percent(table), hide_index=True, column_order=[
        "variant", "a_tok_per_s", "b_tok_per_s", "change", "verdict", "a_step_ms", "b_step_ms", "a_copy_share",
        "b_copy_share", "run_a", "run_b"], column_config=variant_matrix_columns(name_a, name_b))
    st.caption("verdict: the step-time change of each variant, all its runs at each commit pooled, against the "
               "run-to-run spread of its own series, by the rule of the headline below; a variant measured at one "
               "commit only shows —.")
    st.altair_chart(charts.variant_chart(matrix, f"A {name_a}", f"B {name_b}"))
if a["workload_key"] is None or b["workload_key"] is None:
    st.warning("Run A or run B has no workload recorded (a trace imported on its own): stepwatch cannot tell "
               "whether they ran the same work on the same GPU, so their differences need not be the code's.")
elif not same_work:
    st.warning("Runs A and B measured different workloads or GPUs, so their differences are not only the code's.")

samples_a, samples_b = comparison["samples_a"], comparison["samples_b"]
values = comparison["series_values"]
if by == "two commits":  # a commit pools all its runs of the variant
    runs_a, runs_b = ([int(r) for r in values.loc[(values["sha"] == run["sha"]) & (values["variant"] == (
        run["variant"] or "")), "run_id"]] for run in (a, b))
else:
    runs_a, runs_b = [a["run_id"]], [b["run_id"]]
floors = [f for f in (step_floor(samples_a["ms"]), step_floor(samples_b["ms"])) if f is not None]
verdict = judge_sides(values, a["variant"], runs_a, runs_b, a["step_ms"], b["step_ms"], floor=max(floors, default=None),
                      same_commit=bool(a["sha"]) and a["sha"] == b["sha"] and a["variant"] == b["variant"] and same_work)
spread = {"spread": verdict.spread.sigma}
# one basis: the tiles' tok/s and step ms and the diagnosis' headline are the verdict's values (a
# commit's runs pooled, each run's timed steps, else its profiled ones), not run A's and B's alone
shown_a, shown_b = pool_run(a, verdict.value_a), pool_run(b, verdict.value_b)
for name, run, base in (("A", shown_a, None), ("B", shown_b, shown_a)):
    title = describe_run(run["run_id"], (run["sha"] or "")[:7], run["variant"], run["workload_key"])
    st.markdown(format_markdown("**{}** · [{}](run?run={})", name, title, run["run_id"]))
    show_run_kpis(run, base, verdict.verdict if base else None)
if verdict.n_a + verdict.n_b > 2:
    st.caption(f"Decode tok/s and Step ms: the geometric mean of each side's runs ({verdict.n_a} and {verdict.n_b}), "
               "as the verdict below pools them; the copy and busy shares are the two runs' own.")
st.markdown(describe_run_verdict(verdict, samples_a["source"], samples_b["source"]))

st.subheader("Diagnosis")
if not verdict.changed:  # the diagnosis explains whatever moved; say that it does not count as a change
    st.caption(f"The step-time verdict is \"{verdict.verdict}\": what follows explains the differences there are, "
               "not a change.")
try:
    st.markdown(format_markdown_list(diagnose_pair(shown_a, shown_b, comparison["kernels_a"], comparison["kernels_b"])))
except RegressError as e:
    st.caption(format_markdown("No diagnosis for these two runs: {}", e))
st.caption(("B is A patched: the same workload at the same commit with another variant." if is_patch_pair(a, b)
            else "From A to B: the headline change and the kernels that explain most of it."))
for event in group_events(comparison["changes"]):  # one change point, one line (its metrics and kernels in it)
    st.markdown(describe_event_line(event))

st.subheader("What changed in the step time")
st.altair_chart(charts.change_chart(charts.change_rows(diff, spread["spread"])))
disagree = describe_bars_against_verdict(float(diff["delta_ms_per_step"].sum()), verdict, samples_a["source"])
if disagree:
    st.caption(disagree)
st.caption(format_markdown(
    "Change of the mean ms per profiled step, by category (red: slower, green: faster; pale with its 95 % interval: "
    "within noise, by the rule the kernels below are judged by), from run A's {:,.3f} ms to run B's {:,.3f} ms; idle "
    "is step time in which no kernel ran. Profiled steps run slower than Step ms above.",
    float(diff["a_ms_per_step"].sum()), float(diff["b_ms_per_step"].sum())))

st.subheader("Kernels that changed")
kernels = classify_kernel_diff(kernels, spread["spread"])
kinds = st.multiselect("Show", KERNEL_KINDS, default=["added", "removed", "changed"])
needle = st.text_input("Filter kernels", placeholder="name, category or launcher op", key="compare_filter")
shown = filter_rows(kernels[kernels["change"].isin(kinds)], needle, ["name", "category", "launcher"])
counts = kernels["change"].value_counts()
st.caption(format_markdown(
    "{} of {} kernels (matched by name and launcher op) shown, the largest change in ms per step first: "
    "{} added, {} removed, {} changed beyond their noise, {} within noise, {} not enough data (too few profiled "
    "steps, or no run-to-run spread of this workload to judge them against). A kernel changed when its calls per step did, or when its ms per step moved by at least {:g} % at "
    "p < {:g} (Welch's test over the profiled steps; source lines summed as independent){}.",
    len(shown), len(kernels), *(int(counts.get(k, 0)) for k in KERNEL_KINDS), MIN_REL_CHANGE * 100, ALPHA,
    Markdown(f" and beyond the {spread['spread'] * 100:.1f} % run-to-run spread" if spread["spread"] is not None
             else "")))
shown = shown.assign(interval=[f"{lo * 100:+.1f} to {hi * 100:+.1f} %" if pd.notna(lo) else None
                               for lo, hi in zip(shown["ci_low"], shown["ci_high"])],
                     short_name=[shorten_kernel_name(n) for n in shown["name"]],
                     delta_pct=[100 * d / a if a else None for d, a in zip(shown["delta_ms_per_step"],
                                                                           shown["a_ms_per_step"])])
st.dataframe(as_percent(shown), hide_index=True, column_order=KERNEL_DIFF_ORDER, column_config=kernel_diff_columns())
