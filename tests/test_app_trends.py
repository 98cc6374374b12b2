"""The Trends page (AppTest) on the fixture database: the glm5 CUDA-graph series by default,
filters from the URL, the runs without a commit listed apart."""

import json

import pytest

from tests.dashboard_fixture import find_run_id

pytestmark = pytest.mark.slow  # AppTest pages


def _chart_spec(at) -> dict:
    charts = at.get("vega_lite_chart")
    assert len(charts) == 1
    return json.loads(charts[0].proto.spec)


def _values(at, label: str) -> dict:
    return {s.label: s.value for s in at.selectbox}[label]


def test_default_series_is_the_one_with_most_runs(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends")
    assert not at.exception
    assert {s.label: s.value for s in at.selectbox} == {
        "Repository": "stepwatch", "Engine": "reference", "GPU": "NVIDIA H200", "Batch size": "1",
        "Workload": "b0e35bdd9a", "Commits shown": "100", "Axes": "linear", "Also plot": ""}
    assert at.markdown[0].value.startswith("**glm5 · batch 1 · context 2048 · CUDA graph** — 9 runs at 3 commits")
    assert dict(at.query_params) == {"repo": "stepwatch", "engine": "reference", "gpu": "NVIDIA H200",
                                     "batch": "1", "workload": "b0e35bdd9a", "last": "100", "scale": "linear",
                                     "also": ""}
    spec = _chart_spec(at)
    tok, share, step = spec["vconcat"]
    assert tok["layer"][2]["encoding"]["y"]["title"] == "tok/s"
    assert step["layer"][2]["encoding"]["x"]["axis"]["labelExpr"].startswith("['', 'b9bba77', '3bee539', '3cf1671']")
    # no commit of these series was measured twice: the spread is unknown, and the page says so
    assert any(c.value.startswith("Run-to-run spread unknown: no commit of this workload was measured twice")
               for c in at.caption)

    runs = at.dataframe[0].value
    assert len(runs) == 9
    cast = runs[(runs["short_sha"] == "3bee539") & (runs["variant"] == "full-pool-cast")].iloc[0]
    assert round(cast.tok_per_s, 2) == 13.49 and round(cast.copy_share, 1) == 90.6  # percent, as the tile prints it
    assert cast.open == f"run?run={find_run_id(dashboard_db, '3bee539-glm5-full-pool-cast-graph')}"

    link = at.get("page_link")[0]
    assert link.proto.label == "Compare the last two commits"


def test_runs_without_a_commit_are_listed_apart(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends")
    loose = at.dataframe[1].value
    assert loose["source_path"].str.endswith("cpu_small.trace.json").tolist() == [True]
    assert loose["open"].tolist() == [f"run?run={find_run_id(dashboard_db, 'cpu_small.trace.json')}"]


def test_filters_come_from_the_url(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends", workload="05058f210a")  # glm5 eager: one commit, three KV strategies
    assert not at.exception
    assert _values(at, "Workload") == "05058f210a"
    assert at.markdown[0].value.startswith("**glm5 · batch 1 · context 2048 · eager** — 3 runs at 1 commit,")
    assert sorted(at.dataframe[0].value["tok_per_s"].round(2)) == [13.32, 35.83, 44.29]
    assert not at.get("page_link")  # one commit: nothing to compare along the series


def test_changing_a_filter_updates_the_url(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends")
    at.selectbox(key="url_workload").select("05058f210a").run()
    assert at.query_params["workload"] == "05058f210a"
    assert len(at.dataframe[0].value) == 3


def test_only_the_last_commits_are_drawn(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends", last="30")
    assert len(at.dataframe[0].value) == 9  # all three commits are within the last 30
    spec = _chart_spec(at)
    assert spec["vconcat"][2]["layer"][0]["encoding"]["x"]["scale"]["domain"] == [0.5, 3.5]  # three commits


def test_a_series_with_a_confirmed_change_marks_it(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends", repo="kv-regression-demo")
    assert not at.exception
    assert at.markdown[0].value.startswith("**glm5 · batch 1 · context 2048 · CUDA graph** — 2 runs at 2 commits")
    tok, share, step = _chart_spec(at)["vconcat"]
    assert [layer["mark"]["type"] for layer in tok["layer"]][:2] == ["rule", "point"]
    assert [layer["mark"]["type"] for layer in step["layer"]][:2] == ["rule", "point"]
    assert any(c.value.startswith("Dashed rules mark the first bad commit of each confirmed change")
               for c in at.caption)


def test_a_series_without_a_change_has_no_marker(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends")
    tok = _chart_spec(at)["vconcat"][0]
    assert len(tok["layer"]) == 4 and not any(c.value.startswith("Dashed rules") for c in at.caption)


_ONE_RUN_OF_THE_PAGE = """
import sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=180)
at.run()  # Trends is the default page
assert not at.exception, at.exception
print(at.selectbox[0].value)
"""


def test_the_page_waits_for_writers_once(dashboard_db, tmp_path):
    """Its second reads (the chosen series' trend) depend on its first (the series): both run in one
    read-only hold of the file (app/data.py reading()), so a page waits behind at most one writer
    per rerun instead of two. Counted from db/store.py's hold log, in a process of its own (the
    log is switched on by its environment variable at import)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    log = tmp_path / "holds.log"
    env = {**os.environ, "STEPWATCH_DB": str(dashboard_db), "STEPWATCH_DB_HOLD_LOG": str(log),
           "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", _ONE_RUN_OF_THE_PAGE, str(root / "app" / "main.py")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "stepwatch"  # the series were read and a series chosen
    holds = [line.split() for line in log.read_text().splitlines()]
    assert [(mode, where.rsplit(":", 1)[-1]) for _, mode, _, where in holds] == [("read", "reading")]


def test_a_filter_that_matches_nothing_is_a_notice(dashboard_db, open_page):
    at = open_page(dashboard_db, "trends", gpu="NVIDIA B300", last="7")
    assert not at.exception
    assert [w.value for w in at.warning] == [
        "`?gpu=NVIDIA B300` matches no gpu here: showing NVIDIA H200 instead.",
        "`?last=7` matches no commits shown here: showing last 100 instead."]
    assert (at.query_params["gpu"], at.query_params["last"]) == ("NVIDIA H200", "100")


def test_log_axes_from_the_url(dashboard_db, open_page):
    linear = _chart_spec(open_page(dashboard_db, "trends"))
    at = open_page(dashboard_db, "trends", scale="log")
    assert not at.exception
    tok, share, step = _chart_spec(at)["vconcat"]
    assert tok["layer"][1]["encoding"]["y"]["scale"] == {"type": "log", "zero": False}
    assert step["layer"][2]["encoding"]["y"]["scale"] == {"type": "log", "zero": False}
    assert share["layer"][1]["encoding"]["y"]["scale"]["type"] == "linear"  # a share stays linear
    assert linear["vconcat"][0]["layer"][1]["encoding"]["y"]["scale"] == {"type": "linear"}
    assert any(c.value.startswith("Each point is one run, its thin error bar tok/s and step ms at the 10th and 90th "
                                  "percentile") and "each commit's pooled value" in c.value for c in at.caption)


def test_series_without_a_gpu_name_are_labelled_as_such(writable_db, open_page, tmp_path):
    from ingest.cli import main
    from tests.dashboard_fixture import CPU_TRACE

    trace = tmp_path / "cpu.trace.json"  # another file than the fixture's own import of it (runs are by content)
    trace.write_bytes(CPU_TRACE.read_bytes() + b"\n")
    assert main(["import", str(trace), "--db", str(writable_db), "--repo", "stepwatch", "--commit", "c0ffee1"]) == 0
    at = open_page(writable_db, "trends")
    engines = at.selectbox(key="url_engine")
    engines.select_index(engines.options.index("not recorded")).run()  # the plain trace import's engine
    assert not at.exception
    assert at.selectbox(key="url_gpu").options == ["none recorded (CPU runs, or traces without GPU properties)"]


def test_a_series_of_runs_without_a_variant_says_so(tmp_path, open_page):
    # two real H100 traces of TraceLens imported as two commits, with no --variant
    from ingest.cli import main
    from tests.helpers import DATA

    db = tmp_path / "novariant.duckdb"
    for name, commit in (("tracelens__h100__gaunernst_bert-small-uncased__1016001.json.gz", "c1"),
                         ("tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "c2")):
        assert main(["import", str(DATA / "wild" / name), "--db", str(db), "--repo", "demo", "--commit", commit]) == 0
    at = open_page(db, "trends")
    assert not at.exception
    assert any(m.value.endswith("2 runs at 2 commits, variants: none given") for m in at.markdown)
