"""The dashboard's pure parts: chart builders (through chart.to_dict()), labels, the kernel
filter, trace files for Perfetto, and the form's plan of jobs. Frames come from db.views on the
fixture database, so the charts are checked on the data they will draw."""

import ast
import hashlib
import math
import subprocess

import pandas as pd
import pytest
from scipy.stats import ttest_ind_from_stats

from app import charts
from app.job_form import FormInput, plan_jobs
from app.labels import describe_workload, format_change, format_percent, label_commit
from app.tables import filter_rows
from app.traces import list_trace_files
from db import views
from db.store import open_db
from ingest.runs.errors import SpecError
from ingest.runs.spec import Config
from tests.dashboard_fixture import SAMPLES, find_run_id


@pytest.fixture(scope="module")
def frames(dashboard_db):
    a = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    b = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    with open_db(dashboard_db, read_only=True) as store:
        return {"trend": views.get_trend(store, "stepwatch", "reference", "NVIDIA H200", "b0e35bdd9a"),
                "breakdown": views.get_step_breakdown(store, a), "means": views.get_category_means(store, a),
                "diff": views.get_category_diff(store, a, b),
                "matrix": views.get_variant_matrix(store, find_run_id(dashboard_db, "b9bba77-glm5-fused-graph"), b),
                "a": a, "b": b}


def test_trend_chart_three_panels_on_one_commit_axis(frames):
    spec = charts.trend_chart(frames["trend"]).to_dict()
    tok, share, step = spec["vconcat"]
    # one quantitative commit axis (the commit's place in first-parent order), shared by the
    # panels and labelled by short sha; the tok/s panel carries the zoom (scales bound to x)
    for panel in (tok, share, step):
        assert {layer["encoding"]["x"]["field"] for layer in panel["layer"]} == {"commit_order"}
        assert all(layer["encoding"]["color"]["field"] == "variant" for layer in panel["layer"])
    assert spec["resolve"]["scale"]["x"] == "shared"
    axis = step["layer"][1]["encoding"]["x"]["axis"]
    assert axis["labelExpr"] == "['', 'b9bba77', '3bee539', '3cf1671'][datum.value] || ''"
    assert step["layer"][1]["encoding"]["x"]["scale"]["domain"] == [0.5, 3.5]
    assert tok["layer"][1]["encoding"]["x"]["axis"]["labels"] is False  # only the bottom panel is labelled
    band, interval, line, points = tok["layer"]
    assert (band["mark"]["type"], band["encoding"]["y"]["field"], band["encoding"]["y2"]["field"]) == (
        "rule", "tok_per_s_low", "tok_per_s_high")
    # the line goes through each commit's pooled value; one run a commit and no history: no interval
    assert line["encoding"]["y"]["field"] == "level" and "aggregate" not in line["encoding"]["y"]
    assert (interval["encoding"]["y"]["field"], interval["encoding"]["y2"]["field"]) == ("low", "high")
    pick, zoom = spec["params"]  # Altair lifts a compound chart's selections to the top, naming their view
    assert (pick["name"], pick["select"]["fields"], pick["select"]["on"], pick["views"]) == (
        charts.PICK_RUN, ["run_id"], "click", [points["name"]])
    assert (zoom["name"], zoom["bind"], zoom["select"]["encodings"], zoom["views"]) == (
        "zoom", "scales", ["x"], [points["name"]])
    assert [layer["encoding"]["y"]["field"] for layer in share["layer"]] == ["copy_share", "copy_share"]
    assert step["layer"][0]["encoding"]["y"]["field"] == "step_ms_p10"
    assert share["layer"][0]["encoding"]["y"]["aggregate"] == "mean"  # copy share: no pooled level
    assert {t["title"] for t in points["encoding"]["tooltip"]} >= {"date", "author", "subject", "commit"}
    data = next(iter(spec["datasets"].values()))
    assert len(data) == 9 and {row["variant"] for row in data} == {"full-pool-cast", "fused", "gather-then-cast"}


def test_a_commits_pooled_value_is_the_geometric_mean_of_its_runs_with_its_interval():
    # two variants; "a" measured twice at each of 3 commits (its repeats: the spread), "b" once a commit
    step = {("a", 1): [10.0, 10.4], ("a", 2): [10.2, 9.9], ("a", 3): [20.0, 20.8], ("b", 1): [5.0], ("b", 2): [5.1],
            ("b", 3): [5.2]}
    runs = [(v, c, ms) for (v, c), values in step.items() for ms in values]
    rows = [{"run_id": i, "variant": v, "commit_order": c, "sha": f"s{c}", "short_sha": f"s{c}", "subject": "",
             "author": "", "committed_at": pd.Timestamp("2026-12-01"), "step_ms": ms, "tok_per_s": 1000 / ms,
             "tok_per_s_low": None, "tok_per_s_high": None, "step_ms_p10": None, "step_ms_p90": None,
             "copy_share": 0.1, "gpu_busy_share": 0.9} for i, (v, c, ms) in enumerate(runs)]
    trend = pd.DataFrame(rows)
    pooled = charts.pool_commits(trend).set_index(["variant", "commit_order", "metric"])
    pairs = [[math.log(x) for x in step[("a", c)]] for c in (1, 2, 3)]  # the pooled within-commit sd of log
    sigma = math.sqrt(sum((x - sum(p) / 2) ** 2 for p in pairs for x in p) / 3)
    half = 3.182446 * sigma / math.sqrt(2)  # t(0.975, 3 dof) * sigma / sqrt(runs)
    a3 = pooled.loc[("a", 3, "step_ms")]
    assert a3["runs"] == 2 and a3["level"] == pytest.approx(math.sqrt(20.0 * 20.8))
    assert (a3["low"], a3["high"]) == (pytest.approx(math.sqrt(20.0 * 20.8) * math.exp(-half)),
                                       pytest.approx(math.sqrt(20.0 * 20.8) * math.exp(half)))
    assert pooled.loc[("a", 3, "tok_per_s")]["level"] == pytest.approx(1000 / math.sqrt(20.0 * 20.8))
    assert a3["spread"] == f"{100 * sigma:.1f} % from 3 repeated runs (pooled within commits)"
    b2 = pooled.loc[("b", 2, "step_ms")]  # one run a commit, 2 differences of history: no spread, no interval
    assert b2["level"] == pytest.approx(5.1) and pd.isna(b2["low"]) and pd.isna(b2["high"])
    # the chart draws them: the step panel's line through the levels, its interval bars where known
    spec = charts.trend_chart(trend).to_dict()
    step_panel = spec["vconcat"][2]
    interval, line = step_panel["layer"][1], step_panel["layer"][2]
    drawn = spec["datasets"][line["data"]["name"]]
    assert {(r["variant"], r["commit_order"]): round(r["level"], 6) for r in drawn} == {
        (v, c): round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 6) for (v, c), xs in step.items()}
    assert interval["transform"] == [{"filter": "isValid(datum.low)"}] and interval["mark"]["strokeWidth"] == 9
    relative = charts.trend_chart(trend, mode="baseline").to_dict()
    rel = relative["datasets"][relative["vconcat"][2]["layer"][2]["data"]["name"]]
    a_first = (10.0 + 10.4) / 2  # each variant's mean at its first commit, as the runs' baseline
    assert {r["commit_order"]: round(r["level"], 6) for r in rel if r["variant"] == "a"}[3] == round(
        math.sqrt(20.0 * 20.8) / a_first - 1, 6)


def test_step_breakdown_and_means_use_one_colour_per_category(frames):
    stacked = charts.step_breakdown_chart(frames["breakdown"]).to_dict()
    scale = stacked["encoding"]["color"]["scale"]
    assert scale["domain"] == ["cast", "gemm", "attention", "norm", "elementwise", "idle"]
    assert scale["range"][0] == charts.CATEGORY_COLOURS["cast"]
    assert (stacked["mark"]["type"], stacked["encoding"]["y"]["aggregate"]) == ("bar", "sum")
    means = charts.category_mean_chart(frames["means"]).to_dict()
    assert means["encoding"]["y"]["sort"] == "-x"
    assert means["encoding"]["color"]["scale"]["domain"] == scale["domain"]


def test_the_change_chart_shows_each_change_from_zero_with_its_value(frames):
    # without the workload's run-to-run spread no category is called changed (the noise model:
    # two runs' steps cannot tell a change), and the label says why
    unknown = charts.change_rows(frames["diff"])
    assert unknown["noise"][1:].all() and not unknown["noise"][0]
    assert all(label.endswith(" (not enough data)") for label in unknown["label"][1:])
    # a spread known and negligible: the verdict is the profiled steps' own test
    rows = charts.change_rows(frames["diff"], 1e-9)
    assert rows["part"].tolist() == ["step", "cast", "gemm", "elementwise", "idle", "norm", "attention"]
    assert rows["kind"].tolist() == ["total", "faster", "faster", "faster", "faster", "slower", "slower"]
    assert rows.iloc[0].delta_ms == pytest.approx(rows["delta_ms"][1:].sum())  # the step's change is the sum
    assert rows.iloc[1].delta_ms == pytest.approx(8.244011 - 75.471389, abs=1e-5)  # the cast kernel went away
    assert rows.iloc[1].label == "-67.227 ms" and rows.iloc[-1].label.startswith("+0.0")
    # each category carries the 95 % interval of its change over the two profiled steps a side;
    # the cast kernel's 67 ms is far outside its noise, and a change whose interval holds 0 says so
    cast = rows.iloc[1]
    assert cast.low < cast.delta_ms < cast.high < 0 and not cast.noise
    assert pd.isna(rows.iloc[0].low)  # the step itself: its verdict is the headline's
    # the kernels' rule (p < 0.01 by Welch's test, recomputed here with SciPy, and at least 3 %)
    diff = frames["diff"].set_index("category")
    for r in rows.iloc[1:].itertuples():
        d = diff.loc[r.part]
        p = ttest_ind_from_stats(d.b_ms_per_step, d.b_sd_ms, d.b_steps, d.a_ms_per_step, d.a_sd_ms, d.a_steps,
                                 equal_var=False).pvalue
        changed = p < 0.01 and abs(d.b_ms_per_step / d.a_ms_per_step - 1) >= 0.03
        assert r.noise == (not changed), (r.part, p)
        assert r.label.endswith(" (noise)") == r.noise
        assert r.low <= r.delta_ms <= r.high
        if r.noise is False:
            assert not r.low <= 0 <= r.high  # a change's interval never holds 0
    bars, whiskers, text = charts.change_chart(rows).to_dict()["layer"]
    assert bars["encoding"]["x"]["field"] == "delta_ms" and "scale" not in bars["encoding"]["x"]  # from zero
    assert bars["encoding"]["y"]["sort"] == rows["part"].tolist()
    assert "noise" in bars["encoding"]["color"]["scale"]["domain"]
    assert (whiskers["encoding"]["x"]["field"], whiskers["encoding"]["x2"]["field"]) == ("low", "high")
    assert text["encoding"]["text"]["field"] == "label"


def test_a_category_change_inside_the_run_to_run_spread_is_noise_as_a_kernels_would_be(frames):
    """The bars take the verdict the kernel table takes: with the workload's run-to-run spread
    known, a change smaller than 3.5 x sqrt 2 of it is within noise even when the two runs'
    steps alone would call it a change (the gemm bar was solid while its kernels read noise)."""
    alone = charts.change_rows(frames["diff"], 1e-9).set_index("part")  # a negligible spread: the steps alone
    spread = 0.028  # the samples' measured spread (db.views.get_run_spread: 2.8 %)
    wide = charts.change_rows(frames["diff"], spread).set_index("part")
    bound = math.expm1(3.5 * math.sqrt(2) * spread)  # 14.7 %
    diff = frames["diff"].set_index("category")
    flipped = 0
    for part in diff.index:
        rel = abs(diff.loc[part, "b_ms_per_step"] / diff.loc[part, "a_ms_per_step"] - 1)
        if not alone.loc[part, "noise"] and rel < bound * 0.99:
            assert wide.loc[part, "noise"], part
            flipped += 1
        if rel > bound * 1.01:
            assert wide.loc[part, "noise"] == alone.loc[part, "noise"], part
        # the spread widens the interval, never narrows it
        assert wide.loc[part, "low"] <= alone.loc[part, "low"] and wide.loc[part, "high"] >= alone.loc[part, "high"]
    assert not wide.loc["cast", "noise"]  # the cast's -89 % is far beyond any spread
    assert flipped >= 1  # the fixture holds such a category (else this test would prove nothing)


def test_variant_chart_has_a_bar_per_variant_and_commit(frames):
    spec = charts.variant_chart(frames["matrix"], "A b9bba77", "B 3bee539").to_dict()
    data = next(iter(spec["datasets"].values()))
    assert len(data) == 6 and spec["encoding"]["yOffset"]["sort"] == ["A b9bba77", "B 3bee539"]


def test_labels():
    key = ('{"active_rows": 2049, "batch_size": 1, "context": 2048, "cuda_graph": true, "device": "cuda",'
           ' "preset": "glm5", "tp": 1}')
    assert describe_workload(key) == "glm5 · batch 1 · context 2048 · CUDA graph"
    assert describe_workload('{"model_path": "/m/GLM-5-NVFP4", "batch_size": 8, "tp": 8, "cuda_graph": false}') \
        == "GLM-5-NVFP4 · batch 8 · TP 8 · eager"
    assert describe_workload(None) == describe_workload(float("nan")) == "no workload recorded"
    assert label_commit("3bee539", "kernels: whole-row gather-cast (512+64 tiles)", 20) == \
        "3bee539 kernels: whole-row …"
    # from doubling on, a factor ("9.6x", not "+860.0 %"); below, a percent
    assert (format_change(13.4938, 129.5358), format_change(0, 1), format_change(None, 1)) == ("9.6x", "—", "—")
    assert (format_change(100, 199), format_change(100, 200), format_change(129.5, 13.49)) == (
        "+99.0 %", "2.0x", "-89.6 %")
    assert (format_percent(0.9057895), format_percent(None)) == ("90.6 %", "—")


def test_filter_rows_is_plain_text_and_case_insensitive():
    table = pd.DataFrame({"name": ["nvjet_a", "cast[x]", None], "launcher": ["aten::mm", "aten::copy_", "x"]})
    assert filter_rows(table, "NVJET", ["name", "launcher"])["name"].tolist() == ["nvjet_a"]
    assert filter_rows(table, "[x]", ["name"])["name"].tolist() == ["cast[x]"]
    assert filter_rows(table, "copy", ["name", "launcher"])["name"].tolist() == ["cast[x]"]
    assert len(filter_rows(table, "  ", ["name"])) == 3


def test_trace_files_for_perfetto(tmp_path):
    bundle = (SAMPLES / "3bee539-glm5-fused-graph").resolve()
    trace = bundle / "trace.json.gz"
    size, sha256 = trace.stat().st_size, hashlib.sha256(trace.read_bytes()).hexdigest()
    found, gone = list_trace_files(str(bundle), [{"name": "trace.json.gz", "bytes": size, "sha256": sha256}])
    assert [(t.path, t.size_bytes, t.sha256) for t in found] == [(trace, size, sha256)] and gone == []
    assert list_trace_files(str(bundle), None)[0] == []  # nothing recorded at import: nothing served
    assert list_trace_files(str(tmp_path), [{"name": "gone.json", "bytes": 1, "sha256": "0" * 64}]) == (
        [], [f"gone.json is no longer in {tmp_path}"])


def test_form_plans_one_job_per_variant_and_mode():
    plan = plan_jobs(FormInput("reference", variants=("fused", "full-pool-cast"), cuda_graph=(False, True),
                               workload={"preset": "tiny", "profile_steps": 2, "context": None}), Config())
    assert [(s.workload.kv, s.workload.cuda_graph) for s in plan.specs] == [
        ("fused", False), ("fused", True), ("full-pool-cast", False), ("full-pool-cast", True)]
    assert {(s.engine, s.device, s.workload.preset, s.workload.profile_steps, s.ref) for s in plan.specs} == {
        ("reference", "cpu", "tiny", 2, None)}


def test_form_repeats_each_job_in_rounds_and_a_range_lists_its_runs_that_many_times():
    form = FormInput("reference", variants=("fused", "full-pool-cast"), repeat=3,
                     workload={"preset": "tiny", "profile_steps": 2})
    plan = plan_jobs(form, Config())
    assert [s.workload.kv for s in plan.specs] == ["fused", "full-pool-cast"] * 3  # A B A B A B
    assert len(plan.jobs) == 6 and plan.batch == "form reference HEAD x 3 repeats"
    ranged = plan_jobs(FormInput("reference", variants=("fused",), repeat=2, commits="HEAD~2..HEAD",
                                 workload={"preset": "tiny"}), Config())
    assert [r["workload"]["kv"] for r in ranged.expand.runs] == ["fused", "fused"]  # 2 jobs a commit
    assert ranged.jobs[0][1].startswith("reference tiny fused x 2 repeats stepwatch@HEAD~2..HEAD")


@pytest.mark.parametrize("form, reason", [
    (FormInput("reference", variants=("fused",), workload={"preset": "huge"}), "spec.workload.preset: 'huge'"),
    (FormInput("reference", variants=("fused",), host="gpu1", workload={"preset": "tiny"}), "host 'gpu1'"),
    (FormInput("sglang", variants=("unpatched",), workload={"model_path": "m"}), "spec.repo: the sglang engine"),
    (FormInput("import", path="/no/such/trace.json"), "spec.path: /no/such/trace.json: no such file"),
    (FormInput("reference", variants=("fused",), repeat=0), "repeat: 0: must be a whole number from 1 to 30"),
    (FormInput("reference", variants=("fused",), repeat=31), "repeat: 31: must be a whole number from 1 to 30"),
    (FormInput("import", path="/no/such/trace.json", repeat=2), "repeat: 2: an import reads one trace once"),
])
def test_form_refuses_with_the_first_bad_field(form, reason):
    with pytest.raises(SpecError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        plan_jobs(form, Config())


def test_trend_chart_marks_the_first_bad_commit_of_each_change(dashboard_db):
    with open_db(dashboard_db, read_only=True) as store:
        series = ("kv-regression-demo", "reference", "NVIDIA H200", "b0e35bdd9a")
        trend, changes = views.get_trend(store, *series), views.list_series_changes(store, *series)
    spec = charts.trend_chart(trend, changes).to_dict()
    tok, share, step = spec["vconcat"]
    assert len(share["layer"]) == 2  # no copy-share change: no marker
    for panel, value in ((tok, 13.62), (step, 73.418)):
        rule, diamond = panel["layer"][:2]  # under the points, which stay clickable
        assert (rule["mark"]["type"], rule["mark"]["strokeDash"], diamond["mark"]["shape"]) == ("rule", [6, 3],
                                                                                               "diamond")
        assert rule["encoding"]["x"]["field"] == "commit_order" and "y" not in rule["encoding"]
        assert rule["encoding"]["color"] == {"condition": {"test": "(datum.direction === 'regression')",
                                                           "value": charts.REGRESSION_COLOUR},
                                             "value": charts.IMPROVEMENT_COLOUR}
        assert diamond["encoding"]["y"]["field"] == "after_value"
        (row,) = _data_of(spec, rule)
        assert row["commit_label"] == "9f8e7d6 decode: switch the KV strat…" and row["direction"] == "regression"
        assert round(row["after_value"], 2 if panel is tok else 3) == value
    assert _data_of(spec, tok["layer"][1])[0]["change"] == "tok/s -89.9 % (135.44 tok/s -> 13.62 tok/s)"
    assert [t["field"] for t in tok["layer"][1]["encoding"]["tooltip"]] == [
        "direction", "change", "variant", "commit_label", "commits_between", "p_value"]


def _data_of(spec: dict, layer: dict) -> list[dict]:
    return spec["datasets"][layer["data"]["name"]]  # Altair moves inline data to the top


def test_rank_balance_splits_each_ranks_step():
    # the figures of a TP=2 run: rank 0 spends most of its communication time waiting for rank 1
    stats = pd.DataFrame({"rank": [0, 1], "step_ms_median": [10.0, 10.0], "busy_ms_median": [9.5, 9.8],
                          "comm_ms_median": [4.8, 0.6], "wait_ms_median": [4.2, 0.0],
                          "last_arrivals": [1, 59], "collectives": [60, 60]})
    parts = charts.rank_balance_parts(stats)
    got = {(r.rank, r.part): round(r.ms, 6) for r in parts.itertuples()}
    assert got == {("rank 0", "compute"): 4.7, ("rank 0", "communication"): 0.6,
                   ("rank 0", "waiting for the last rank"): 4.2, ("rank 0", "idle"): 0.5,
                   ("rank 1", "compute"): 9.2, ("rank 1", "communication"): 0.6,
                   ("rank 1", "waiting for the last rank"): 0.0, ("rank 1", "idle"): 0.2}
    spec = charts.rank_balance_chart(parts).to_dict()
    assert spec["encoding"]["x"]["stack"] == "zero" and spec["encoding"]["y"]["field"] == "rank"
    assert spec["encoding"]["color"]["scale"]["domain"][2] == "waiting for the last rank"


def test_the_perfetto_button_carries_the_trace_and_no_markup_from_the_data():
    import base64
    import re as regex

    from app.perfetto import PERFETTO_URL, perfetto_button_html

    trace = (SAMPLES / "demo-d445ae3-1-glm5-graph" / "trace.json.gz").read_bytes()
    page = perfetto_button_html(trace, 'stepwatch </script><img src="http://127.0.0.1:9/x">', "run1-x.json.gz")
    payload = regex.search(r'const b64 = "([A-Za-z0-9+/=]*)";', page).group(1)
    assert base64.b64decode(payload) == trace
    assert page.count("</script>") == 1 and "<img" not in page  # the title cannot close the script
    assert f'"url": "{PERFETTO_URL}"' in page and 'ui.postMessage("PING", args.url)' in page


def test_a_hundred_commits_are_labelled_by_short_sha_without_overlap(frames):
    # this repository's last 100 first-parent commits under the fixture's runs (one run each):
    # the axis names each by its 7-character sha and drops labels that would overlap
    log = subprocess.run(["git", "log", "--first-parent", "-100", "--format=%H\t%s"], capture_output=True,
                         text=True, check=True, cwd=SAMPLES.parent.parent).stdout.splitlines()
    run = frames["trend"].iloc[0]
    trend = pd.DataFrame([{**run.to_dict(), "sha": sha, "short_sha": sha[:7], "subject": subject,
                           "commit_order": len(log) - i, "run_id": 1000 + i}
                          for i, (sha, subject) in enumerate(line.split("\t", 1) for line in log)])
    spec = charts.trend_chart(trend).to_dict()
    axis = spec["vconcat"][2]["layer"][1]["encoding"]["x"]["axis"]
    labels = ast.literal_eval(axis["labelExpr"].split("[datum.value]")[0])  # the label list, as a literal
    assert len(labels) == len(log) + 1 and all(len(label) == 7 for label in labels[1:])
    assert labels[-1] == log[0][:7] and axis["labelOverlap"] == "greedy"
