"""The dashboard's pure parts: chart builders (through chart.to_dict()), labels, the kernel
filter, trace files for Perfetto, and the form's plan of jobs. Frames come from db.views on the
fixture database, so the charts are checked on the data they will draw."""

import subprocess

import pandas as pd
import pytest

from app import charts
from app.job_form import FormInput, plan_jobs
from app.labels import describe_workload, format_change, format_percent, label_commit
from app.tables import filter_rows
from app.traces import list_trace_files
from db import views
from db.store import open_db
from ingest.runs.errors import SpecError
from ingest.runs.spec import Config
from tests.test_app_fixtures import SAMPLES, dashboard_db, find_run_id  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def frames(dashboard_db):  # noqa: F811
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
    order = ["b9bba77 kernels: reference MLA deco…", "3bee539 kernels: whole-row gather-c…",
             "3cf1671 kernels: time gather kernel…"]
    for panel in (tok, share, step):
        assert [layer["encoding"]["x"]["sort"] for layer in panel["layer"]] == [order] * len(panel["layer"])
        assert all(layer["encoding"]["color"]["field"] == "variant" for layer in panel["layer"])
    band, line, points = tok["layer"]
    assert (band["mark"]["type"], band["encoding"]["y"]["field"], band["encoding"]["y2"]["field"]) == (
        "rule", "tok_per_s_low", "tok_per_s_high")
    assert (line["encoding"]["y"]["field"], line["encoding"]["y"]["aggregate"]) == ("tok_per_s", "mean")
    pick = spec["params"][0]  # Altair lifts a compound chart's selection to the top, naming its view
    assert (pick["name"], pick["select"]["fields"], pick["select"]["on"], pick["views"]) == (
        charts.PICK_RUN, ["run_id"], "click", [points["name"]])
    assert [layer["encoding"]["y"]["field"] for layer in share["layer"]] == ["copy_share", "copy_share"]
    assert step["layer"][0]["encoding"]["y"]["field"] == "step_ms_p10"
    assert {t["title"] for t in points["encoding"]["tooltip"]} >= {"date", "author", "subject", "commit"}
    data = next(iter(spec["datasets"].values()))
    assert len(data) == 9 and {row["variant"] for row in data} == {"full-pool-cast", "fused", "gather-then-cast"}


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
    rows = charts.change_rows(frames["diff"])
    assert rows["part"].tolist() == ["step", "cast", "gemm", "elementwise", "idle", "norm", "attention"]
    assert rows["kind"].tolist() == ["total", "faster", "faster", "faster", "faster", "slower", "slower"]
    assert rows.iloc[0].delta_ms == pytest.approx(rows["delta_ms"][1:].sum())  # the step's change is the sum
    assert rows.iloc[1].delta_ms == pytest.approx(8.244011 - 75.471389, abs=1e-5)  # the cast kernel went away
    assert rows.iloc[1].label == "-67.227 ms" and rows.iloc[-1].label.startswith("+0.0")
    bars, text = charts.change_chart(rows).to_dict()["layer"]
    assert bars["encoding"]["x"]["field"] == "delta_ms" and "scale" not in bars["encoding"]["x"]  # from zero
    assert bars["encoding"]["y"]["sort"] == rows["part"].tolist()
    assert text["encoding"]["text"]["field"] == "label"


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
    assert (format_change(13.4938, 129.5358), format_change(0, 1), format_change(None, 1)) == ("+860.0 %", "—", "—")
    assert (format_percent(0.9057895), format_percent(None)) == ("90.6 %", "—")


def test_filter_rows_is_plain_text_and_case_insensitive():
    table = pd.DataFrame({"name": ["nvjet_a", "cast[x]", None], "launcher": ["aten::mm", "aten::copy_", "x"]})
    assert filter_rows(table, "NVJET", ["name", "launcher"])["name"].tolist() == ["nvjet_a"]
    assert filter_rows(table, "[x]", ["name"])["name"].tolist() == ["cast[x]"]
    assert filter_rows(table, "copy", ["name", "launcher"])["name"].tolist() == ["cast[x]"]
    assert len(filter_rows(table, "  ", ["name"])) == 3


def test_trace_files_for_perfetto(tmp_path):
    bundle = SAMPLES / "3bee539-glm5-fused-graph"
    assert list_trace_files(str(bundle), ["trace.json.gz"]) == [bundle / "trace.json.gz"]
    assert list_trace_files(str(bundle), None) == [bundle / "trace.json.gz"]  # manifest and key averages left out
    assert list_trace_files(str(tmp_path / "gone.json"), None) == []


def test_form_plans_one_job_per_variant_and_mode():
    plan = plan_jobs(FormInput("reference", variants=("fused", "full-pool-cast"), cuda_graph=(False, True),
                               workload={"preset": "tiny", "profile_steps": 2, "context": None}), Config())
    assert [(s.workload.kv, s.workload.cuda_graph) for s in plan.specs] == [
        ("fused", False), ("fused", True), ("full-pool-cast", False), ("full-pool-cast", True)]
    assert {(s.engine, s.device, s.workload.preset, s.workload.profile_steps, s.ref) for s in plan.specs} == {
        ("reference", "cpu", "tiny", 2, None)}


@pytest.mark.parametrize("form, reason", [
    (FormInput("reference", variants=("fused",), workload={"preset": "huge"}), "spec.workload.preset: 'huge'"),
    (FormInput("reference", variants=("fused",), host="gpu1", workload={"preset": "tiny"}), "host 'gpu1'"),
    (FormInput("sglang", variants=("unpatched",), workload={"model_path": "m"}), "spec.repo: the sglang engine"),
    (FormInput("import", path="/no/such/trace.json"), "spec.path: /no/such/trace.json: no such file"),
])
def test_form_refuses_with_the_first_bad_field(form, reason):
    with pytest.raises(SpecError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        plan_jobs(form, Config())


def test_form_takes_a_checkout_path_as_the_repo(tmp_path):
    checkout = tmp_path / "sglang-fork"
    checkout.mkdir()
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@e"]
    form = FormInput("reference", repo=str(checkout), commits="v1.2", variants=("fused",), workload={"preset": "tiny"})
    with pytest.raises(SpecError, match="not a git checkout|no such commit"):  # checked before anything is queued
        plan_jobs(form, Config())
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run([*git, "tag", "v1.2"], check=True)
    spec = plan_jobs(form, Config()).specs[0]
    assert (spec.repo, spec.repo_path, spec.ref, spec.workload.kv) == ("sglang-fork", str(checkout), "v1.2", "fused")


def test_trend_chart_marks_the_first_bad_commit_of_each_change(dashboard_db):  # noqa: F811
    with open_db(dashboard_db, read_only=True) as store:
        series = ("kv-regression-demo", "reference", "NVIDIA H200", "b0e35bdd9a")
        trend, changes = views.get_trend(store, *series), views.list_series_changes(store, *series)
    spec = charts.trend_chart(trend, changes).to_dict()
    tok, share, step = spec["vconcat"]
    assert len(share["layer"]) == 2  # no copy-share change: no marker
    for panel, value in ((tok, 13.62), (step, 73.418)):
        rule, diamond = panel["layer"][-2:]
        assert (rule["mark"]["type"], rule["mark"]["strokeDash"], diamond["mark"]["shape"]) == ("rule", [6, 3],
                                                                                               "diamond")
        assert rule["encoding"]["x"]["field"] == "commit_label" and "y" not in rule["encoding"]
        assert rule["encoding"]["color"] == {"condition": {"test": "(datum.direction === 'regression')",
                                                           "value": charts.REGRESSION_COLOUR},
                                             "value": charts.IMPROVEMENT_COLOUR}
        assert diamond["encoding"]["y"]["field"] == "after_value"
        (row,) = _data_of(spec, rule)
        assert row["commit_label"] == "9f8e7d6 decode: switch the KV strat…" and row["direction"] == "regression"
        assert round(row["after_value"], 2 if panel is tok else 3) == value
    assert _data_of(spec, tok["layer"][-1])[0]["change"] == "tok/s -89.9 % (135.44 tok/s -> 13.62 tok/s)"
    assert [t["field"] for t in tok["layer"][-1]["encoding"]["tooltip"]] == [
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
