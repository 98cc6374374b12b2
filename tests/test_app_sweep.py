"""The sweep view: db.sweeps finds sweeps in the data, app.sweeps pools and judges each point and
says it in one sentence, app.charts draws it, and the Sweep page shows it (AppTest), all on the
sample database `python -m ingest samples` builds (its H200 sweep: glm5 under CUDA graphs, pool
600K, whole-pool cast and fused at bs 1, 4, 16, 32, 128 x context 1K, and bs 1-32 x 4K in part;
one run a point, app/sample_data/README.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from app import charts
from app.sweeps import describe_sweep, judge_points, label_context, pick_baseline, pick_default_context, pool_points
from db import views
from db.store import open_db
from ingest.traces.categories import load_rule_chain
from ingest.traces.samples import SAMPLE_DIR, load_samples
from tests.helpers import ROOT

SWEEP_SHA = "0bc00a53763a0f575240787fcb04cd2e73075a06"
# the sweep's step ms at context 1K (medians of 20 CUDA-graph replays; kernels/results/2026-12-02-h200-sweep-2/
# README.md), each point's runs pooled (geometric mean): (full-pool-cast, fused, gather-then-cast)
CTX_1K = {1: (87.363, 7.365, 7.607), 4: (88.925, 9.035, 9.687), 16: (91.333, 11.441, 13.854),
          32: (95.774, 15.642, 20.241), 128: (132.026, 50.169, 69.232)}
RUNS_1K = {1: 3, 4: 1, 16: 1, 32: 3, 128: 3}  # runs of full-pool-cast and fused at each batch size


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):
    """The sweep's bundles alone (app/sample_data/sweeps), loaded as `ingest samples` loads them."""
    root = tmp_path_factory.mktemp("sweep")
    only = root / "samples"
    only.mkdir()
    (only / "sweeps").symlink_to(SAMPLE_DIR / "sweeps")
    shutil.copy(SAMPLE_DIR / "commits.json", only / "commits.json")
    db = root / "sweep.duckdb"
    assert load_samples(str(db), load_rule_chain(), only) == 37
    return db


@pytest.fixture(scope="module")
def sweep(sweep_db):
    with open_db(sweep_db, read_only=True) as store:
        listing = views.list_sweeps(store)
        runs = views.get_sweep_runs(store, listing["sweep_id"].iloc[0])
    return listing, runs


def test_the_sample_sweep_is_found_from_its_workloads_alone(sweep):
    listing, runs = sweep
    [row] = listing.itertuples()  # one sweep: the bs-1 series of the other samples are no sweep
    assert (row.repo, row.engine, row.device, row.sha, row.runs) == ("stepwatch", "reference", "NVIDIA H200",
                                                                      SWEEP_SHA, 37)
    assert list(row.batch_sizes) == [1, 4, 16, 32, 128] and list(row.contexts) == [1024, 4096]
    assert list(row.variants) == ["full-pool-cast", "fused", "gather-then-cast"] and list(row.spec_sweep_ids) == []
    assert len(runs) == 37 and runs["workload_id"].nunique() == 10  # a point is a series: 5 at 1K, 5 at 4K
    points = pool_points(runs)
    at_1k = points[points["context"] == 1024].set_index(["batch_size", "variant"])
    for bs, figures in CTX_1K.items():
        for variant, step_ms in zip(("full-pool-cast", "fused", "gather-then-cast"), figures):
            assert at_1k.loc[(bs, variant), "step_ms"] == pytest.approx(step_ms, abs=1e-3)
        assert at_1k.loc[(bs, "fused"), "runs"] == RUNS_1K[bs]
    # the per-token step time: 95.77 ms for 32 tokens
    assert at_1k.loc[(32, "full-pool-cast"), "ms_per_token"] == pytest.approx(95.774 / 32, abs=1e-3)


def test_a_point_is_judged_by_the_noise_model_on_its_repeats(sweep):
    listing, runs = sweep
    assert pick_default_context(runs, SWEEP_SHA) == 1024  # 15 points against 10 at 4K
    points = pool_points(runs)
    assert pick_baseline(points[points["context"] == 1024]) == "full-pool-cast"
    verdicts = judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast").set_index(["variant", "batch_size"])
    assert list(verdicts.index) == [(v, bs) for v in ("fused", "gather-then-cast") for bs in CTX_1K]
    for bs, (whole, fused, gathered) in CTX_1K.items():
        assert verdicts.loc[("fused", bs), "speedup"] == pytest.approx(whole / fused, rel=1e-3)
        assert verdicts.loc[("gather-then-cast", bs), "speedup"] == pytest.approx(whole / gathered, rel=1e-3)
    # three runs a side at bs 1, 32 and 128: the baseline's repeats give the spread, a verdict and an interval
    bs32 = verdicts.loc[("fused", 32)]
    assert bs32["verdict"] == "improvement" and (bs32["baseline_runs"], bs32["runs"]) == (3, 3)
    assert 6.10 < bs32["speedup_low"] < bs32["speedup"] < bs32["speedup_high"] < 6.15
    assert bs32["spread"] == "0.0 % from 2 repeated runs (pooled within commits)"
    assert verdicts.loc[("gather-then-cast", 32), "verdict"] == "improvement"  # 3 runs against 1
    # one run a point at bs 4 and 16: no spread, not enough data, whatever the ratio
    assert set(verdicts.loc[[("fused", 4), ("fused", 16)], "verdict"]) == {"not enough data"}
    assert verdicts.loc[("fused", 4), ["speedup_low", "speedup_high"]].isna().all()
    assert bs32["copy_share"] == pytest.approx(0.0967, abs=1e-3)  # fused: the gather-cast, 9.7 %
    assert bs32["baseline_copy_share"] == pytest.approx(0.8415, abs=1e-3)  # the whole-pool cast


def test_the_sentence_on_the_real_sweep(sweep):
    _, runs = sweep
    text = describe_sweep(judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast"), 1024, "0bc00a5")
    assert text == (
        "fused is 11.9x faster than full-pool-cast at bs 1, 6.1x at bs 32 and 2.6x at bs 128 (context 1K, at "
        "0bc00a5); not enough data at bs 4 and 16 (measured 9.8x faster at bs 4 and 8.0x at bs 16; no repeated runs "
        "there). gather-then-cast is 11.5x faster than full-pool-cast at bs 1, 4.7x at bs 32 and 1.9x at bs 128 "
        "(context 1K, at 0bc00a5); not enough data at bs 4 and 16 (measured 9.2x faster at bs 4 and 6.6x at bs 16; "
        "no repeated runs there).")
    assert describe_sweep(judge_points(runs, SWEEP_SHA, 4096, "full-pool-cast"), 4096, "0bc00a5") == (
        "fused measured 11.3x faster than full-pool-cast at bs 1, 6.4x at bs 4, 3.8x at bs 16, 2.6x at bs 32 and 1.8x "
        "at bs 128 (context 4K, at 0bc00a5); not enough data for a verdict at any point: one run a point, so the "
        "run-to-run spread is unknown (repeat a point to know it).")
    assert label_context(4096) == "4K" and label_context(1000) == "1000"


def test_a_patch_that_buys_nothing_at_a_point_reads_within_noise():
    # one point, the baseline measured three times (spread 0.3 %), the variant 0.5 % faster: below the floor
    runs = pd.DataFrame({"run_id": [1, 2, 3, 4, 5, 6], "commit_id": 1, "sha": "a" * 40, "context": 1024,
                         "batch_size": 64, "workload_id": "w", "variant": ["base"] * 3 + ["patch"] * 3,
                         "step_ms": [100.0, 100.3, 99.8, 99.5, 99.6, 99.4], "copy_share": 0.1})
    v = judge_points(runs, "a" * 40, 1024, "base")
    assert v["verdict"].tolist() == ["within noise"]
    assert describe_sweep(v, 1024, "aaaaaaa") == ("patch is not faster or slower than base beyond noise at any "
                                                  "batch size (context 1K, at aaaaaaa); within noise at bs 64.")


def test_the_sweep_chart_draws_both_figures_on_log_axes_and_the_speedups_by_verdict(sweep):
    _, runs = sweep
    points = pool_points(runs)
    points = points[points["context"] == 1024]
    spec = charts.sweep_chart(points, judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast")).to_dict()
    [whole] = spec["vconcat"]
    pair, speedups = whole["hconcat"]
    tok, per_token = pair["hconcat"]
    for panel, field in ((tok, "tok_per_s"), (per_token, "ms_per_token")):
        line, dots = panel["layer"]
        assert line["mark"]["type"] == "line" and dots["mark"]["type"] == "point"
        assert dots["encoding"]["y"]["field"] == field and dots["encoding"]["y"]["scale"]["type"] == "log"
        assert dots["encoding"]["x"]["scale"]["type"] == "log"
        assert dots["encoding"]["x"]["axis"]["values"] == [1, 4, 16, 32, 128]
        assert dots["encoding"]["color"]["field"] == "variant"
    [pick] = spec["params"]  # a click on a tok/s point selects its run, which the page opens
    assert pick["name"] == charts.PICK_POINT and pick["views"] == [tok["layer"][1]["name"]]
    data = pd.DataFrame(spec["datasets"][pair["data"]["name"]])
    row = data[(data["batch_size"] == 32) & (data["variant"] == "fused")].iloc[0]
    assert row["runs"] == 3 and row["tok_per_s"] == pytest.approx(2045.81, abs=0.01)  # three runs pooled
    assert row["ms_per_token"] == pytest.approx(15.6417 / 32, abs=1e-4)
    rule, interval, _, dots = speedups["layer"]
    assert spec["datasets"][rule["data"]["name"]] == [{"speedup": 1.0}]  # the no-change line
    assert interval["encoding"]["y"]["field"] == "speedup_low"
    assert interval["encoding"]["y2"]["field"] == "speedup_high"
    assert dots["encoding"]["color"]["field"] == "verdict"
    assert dots["encoding"]["color"]["scale"]["range"][-1] == charts.SPEEDUP_COLOURS["not enough data"]
    two_rows = charts.sweep_chart(points, judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast"), per_row=2).to_dict()
    first, second = two_rows["vconcat"][0]["vconcat"]  # two commits side by side: the speed-ups under the pair
    assert len(first["hconcat"]) == 2 and [layer["mark"]["type"] for layer in second["layer"]] == [
        "rule", "rule", "line", "point"]


def test_the_sweep_page_answers_bs_32_on_top(sweep_db, open_page):
    at = open_page(sweep_db, "sweep")
    assert not at.exception
    assert at.query_params["context"] == "1024" and at.query_params["baseline"] == "full-pool-cast"
    assert at.query_params["commit"] == SWEEP_SHA
    [sentence] = [m.value for m in at.markdown if "faster" in m.value]
    assert sentence.startswith("**fused is 11.9x faster than full-pool-cast at bs 1, 6.1x at bs 32 and 2.6x at bs 128")
    table = at.dataframe[0].value
    assert table["variant"].tolist() == ["fused"] * 5 + ["gather-then-cast"] * 5  # fused's bs 32: the 4th row
    row = table.set_index(["variant", "batch_size"]).loc[("fused", 32)]
    assert row["speedup"] == pytest.approx(6.1230, abs=1e-3)
    assert row["verdict"] == "improvement" and row["interval"] == "6.114x to 6.132x"
    assert row["copy_share"] == pytest.approx(9.67, abs=0.01)  # percent on screen
    assert row["baseline_run"].startswith("run?run=") and row["run"].startswith("run?run=")
    with open_db(sweep_db, read_only=True) as store:
        kv, bs = store.con.execute("SELECT variant, batch_size FROM runs WHERE run_id = ?",
                                   [int(row["run"].split("=")[1])]).fetchone()
    assert (kv, bs) == ("fused", 32)  # the link opens a fused bs-32 run (the newest of its three)


def test_the_page_keeps_its_state_in_the_url_and_says_what_it_ignores(sweep_db, open_page):
    at = open_page(sweep_db, "sweep", context="4096", baseline="fused")
    assert not at.exception
    [sentence] = [m.value for m in at.markdown if "at 0bc00a5" in m.value]
    # against fused, the whole-pool cast is the slower one, at every batch size of context 4K (one run each)
    assert sentence.startswith("**full-pool-cast measured 11.3x slower than fused at bs 1, 6.4x at bs 4, 3.8x at "
                               "bs 16, 2.6x at bs 32 and 1.8x at bs 128 (context 4K")
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16, 32, 128]
    at = open_page(sweep_db, "sweep", variants="fused")  # one variant beside the baseline
    assert at.dataframe[0].value["variant"].tolist() == ["fused"] * 5
    assert at.query_params["variants"] == ["full-pool-cast", "fused"]
    at = open_page(sweep_db, "sweep", context="2048", variants="no-such-variant")
    assert [w.value for w in at.warning] == ["`?context=2048` matches no context here: showing 1K (1024 tokens) "
                                             "instead.", "`?variants=no-such-variant` matches no variant here: "
                                             "ignored."]
    assert at.query_params["variants"] == ["full-pool-cast", "fused", "gather-then-cast"]


def test_two_commits_side_by_side(tmp_path, open_page):
    # the real sweep's bundles split over two commits (a test layout: bs 1-16 at 0bc00a5, bs 32 and 128
    # at b53f772), so that each commit has a sweep of the same workload
    only = tmp_path / "samples"
    (only / "sweeps" / "low").mkdir(parents=True)
    (only / "sweeps" / "high").mkdir()
    source = SAMPLE_DIR / "sweeps" / "h200-2026-12-02"
    for bundle in source.iterdir():
        bs = int(bundle.name.split("-bs")[1].split("-")[0])
        (only / "sweeps" / ("low" if bs <= 16 else "high") / bundle.name).symlink_to(bundle)
    later = "b53f772a" + "0" * 32
    (only / "sweeps" / "sweeps.json").write_text(json.dumps({"sweeps": [
        {"dir": "low", "repo": "stepwatch", "commit": SWEEP_SHA, "archives": []},
        {"dir": "high", "repo": "stepwatch", "commit": later, "archives": []}]}))
    facts = json.loads((SAMPLE_DIR / "commits.json").read_text())
    facts["repos"][0]["commits"].append({"sha": later, "committed_at": "2026-12-02T06:43:31+00:00", "author": "x",
                                         "subject": "a later commit", "seq": 231})
    (only / "commits.json").write_text(json.dumps(facts))
    db = tmp_path / "two.duckdb"
    assert load_samples(str(db), load_rule_chain(), only) == 37
    at = open_page(db, "sweep")
    assert at.query_params["commit"] == later and at.query_params["vs"] == ""  # the newest commit first
    at = open_page(db, "sweep", vs=SWEEP_SHA)
    assert not at.exception
    sentences = [m.value for m in at.markdown if "faster" in m.value]
    assert len(sentences) == 2
    assert sentences[0].startswith("**fused is 6.1x faster than full-pool-cast at bs 32 and 2.6x at bs 128 "
                                   "(context 1K, at b53f772)")
    assert sentences[1].startswith("**fused is 11.9x faster than full-pool-cast at bs 1 (context 1K, at 0bc00a5); not "
                                   "enough data at bs 4 and 16 (measured 9.8x faster at bs 4 and 8.0x at bs 16")
    assert [t.value["batch_size"].tolist() for t in at.dataframe] == [[32, 128] * 2, [1, 4, 16] * 2]


def test_a_sweep_specs_id_opens_its_sweep_and_imported_runs_join_it(tmp_path, open_page):
    # the 1K points as the runs of one sweep spec (runs.sweep_id, migration 015: the record a sweep job's
    # import makes, its id set here on the real bundles' records), the 4K points imported without one
    import dataclasses

    from ingest.traces.importer import ImportOptions, prepare_import

    db = tmp_path / "spec.duckdb"
    options = ImportOptions(repo="stepwatch", commit=SWEEP_SHA)
    bundles = sorted((SAMPLE_DIR / "sweeps" / "h200-2026-12-02").iterdir())
    with open_db(db) as store:
        for i, bundle in enumerate(bundles):
            record = prepare_import(bundle, load_rule_chain(), options)
            if "-ctx1024" in bundle.name:
                record = dataclasses.replace(record, sweep_id="h200-1k", sweep_point=i)
            store.insert_run(record)
        store.record_commit("stepwatch", SWEEP_SHA, "2026-12-02T03:47:35+00:00", "x", "the sweep", 230)
        [row] = views.list_sweeps(store).itertuples()
    assert list(row.spec_sweep_ids) == ["h200-1k"] and row.runs == 37  # one sweep: spec and imported runs
    at = open_page(db, "sweep", sweep="h200-1k")
    assert not at.exception and not at.warning
    assert at.query_params["sweep"] == row.sweep_id and at.query_params["commit"] == SWEEP_SHA
    assert "Runs of sweep spec h200-1k are among these points." in [c.value for c in at.caption]
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16, 32, 128] * 2
    at = open_page(db, "sweep", sweep="h200-1k", context="4096")  # the imported 4K points, without the id
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16, 32, 128]


def test_a_database_without_a_sweep_says_what_one_is(tmp_path, open_page):
    from ingest.traces.importer import ImportOptions, prepare_import

    db = tmp_path / "one.duckdb"
    record = prepare_import(SAMPLE_DIR / "fe3ea75-glm5-fused-graph", load_rule_chain(), ImportOptions())
    with open_db(db) as store:
        store.insert_run(record)
    at = open_page(db, "sweep")
    assert not at.exception
    assert at.info[0].value.startswith("No sweep yet: a sweep is runs of one workload at one commit that differ only "
                                       "in batch size")


@pytest.mark.slow
def test_ingest_samples_loads_the_sweep_and_every_bundle_of_its_archives():
    """The sweep folder holds exactly the bundles its archives (kernels/results/..., sweeps.json)
    hold that ran (rc 0 in the archive's sweep.json): a second archive beside the first is loaded
    once it is unpacked into the folder and named in sweeps.json."""
    listing = json.loads((SAMPLE_DIR / "sweeps" / "sweeps.json").read_text())["sweeps"]
    for sweep in listing:
        have = sorted(p.name for p in (SAMPLE_DIR / "sweeps" / sweep["dir"]).iterdir())
        want = []
        for archive in sweep["archives"]:
            ran = json.loads((ROOT / archive).with_name("sweep.json").read_text())["runs"]
            want += [r["bundle"] for r in ran if r["rc"] == 0]
        assert have == sorted(want)
    results = ROOT / "kernels" / "results"
    archives = sorted(str(p.relative_to(ROOT)) for p in results.glob("*-h200-sweep*/**/sweep.tar*"))
    assert archives == sorted(a for s in listing for a in s["archives"]), "unpack the new sweep archive (README)"
    done = subprocess.run([sys.executable, "-m", "ingest", "samples", "--db", ":memory:"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "loaded 63 sample runs" in done.stderr, done.stderr
