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
# the sweep's step ms as the bundles timed them (medians of 20 CUDA-graph replays; sweep/README.md)
CTX_1K = {1: (87.345, 7.335), 4: (88.925, 9.035), 16: (91.333, 11.441), 32: (95.738, 15.624), 128: (131.984, 50.143)}


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):
    """The sweep's bundles alone (app/sample_data/sweeps), loaded as `ingest samples` loads them."""
    root = tmp_path_factory.mktemp("sweep")
    only = root / "samples"
    only.mkdir()
    (only / "sweeps").symlink_to(SAMPLE_DIR / "sweeps")
    shutil.copy(SAMPLE_DIR / "commits.json", only / "commits.json")
    db = root / "sweep.duckdb"
    assert load_samples(str(db), load_rule_chain(), only) == 17
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
                                                                      SWEEP_SHA, 17)
    assert list(row.batch_sizes) == [1, 4, 16, 32, 128] and list(row.contexts) == [1024, 4096]
    assert list(row.variants) == ["full-pool-cast", "fused"]
    assert len(runs) == 17 and runs["workload_id"].nunique() == 9  # a point is a series: 5 at 1K, 4 at 4K
    at_1k = runs[runs["context"] == 1024].set_index(["batch_size", "variant"])["step_ms"]
    for bs, (whole, fused) in CTX_1K.items():
        assert at_1k[(bs, "full-pool-cast")] == pytest.approx(whole, abs=1e-3)
        assert at_1k[(bs, "fused")] == pytest.approx(fused, abs=1e-3)


def test_a_point_is_judged_by_the_noise_model_and_one_run_a_point_is_not_enough_data(sweep):
    listing, runs = sweep
    assert pick_default_context(runs, SWEEP_SHA) == 1024  # 10 points against 7 at 4K
    points = pool_points(runs)
    assert pick_baseline(points[points["context"] == 1024]) == "full-pool-cast"
    verdicts = judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast").set_index("batch_size")
    assert list(verdicts.index) == [1, 4, 16, 32, 128]
    for bs, (whole, fused) in CTX_1K.items():
        assert verdicts.loc[bs, "speedup"] == pytest.approx(whole / fused, rel=1e-4)
    assert verdicts.loc[32, "speedup"] == pytest.approx(6.1275, abs=1e-3)
    assert set(verdicts["verdict"]) == {"not enough data"} and verdicts["speedup_low"].isna().all()
    assert verdicts.loc[32, "copy_share"] == pytest.approx(0.0966, abs=1e-3)  # fused: the gather-cast, 9.7 %
    assert verdicts.loc[32, "baseline_copy_share"] == pytest.approx(0.8416, abs=1e-3)  # the whole-pool cast
    # the per-token step time: 95.74 ms for 32 tokens
    at = points[(points["context"] == 1024) & (points["batch_size"] == 32)].set_index("variant")
    assert at.loc["full-pool-cast", "ms_per_token"] == pytest.approx(95.738 / 32, abs=1e-3)


def test_the_sentence_on_the_real_sweep(sweep):
    _, runs = sweep
    text = describe_sweep(judge_points(runs, SWEEP_SHA, 1024, "full-pool-cast"), 1024, "0bc00a5")
    assert text == ("fused measured 11.9x faster than full-pool-cast at bs 1, 9.8x at bs 4, 8.0x at bs 16, 6.1x at "
                    "bs 32 and 2.6x at bs 128 (context 1K, at 0bc00a5); not enough data for a verdict at any point: "
                    "one run a point, so the run-to-run spread is unknown (repeat a point to know it).")
    assert describe_sweep(judge_points(runs, SWEEP_SHA, 4096, "full-pool-cast"), 4096, "0bc00a5").startswith(
        "fused measured 11.3x faster than full-pool-cast at bs 1, 6.4x at bs 4 and 3.8x at bs 16 (context 4K")
    assert label_context(4096) == "4K" and label_context(1000) == "1000"


def _with_repeats(runs: pd.DataFrame, ratios: dict[int, list[float]]) -> pd.DataFrame:
    """The real sweep with extra runs of some points: each given ratio a run of both variants at
    that point, its step ms the real one times the ratio (SYNTHETIC repeats: the sample has none
    yet; the ratios are of the size of the glm5 A/A runs' spread, 0.2-3 %)."""
    extra, next_id = [], int(runs["run_id"].max()) + 1
    for bs, factors in ratios.items():
        for factor in factors:
            for _, r in runs[(runs["context"] == 1024) & (runs["batch_size"] == bs)].iterrows():
                extra.append({**r.to_dict(), "run_id": next_id, "step_ms": r["step_ms"] * factor,
                              "tok_per_s": r["tok_per_s"] / factor})
                next_id += 1
    return pd.concat([runs, pd.DataFrame(extra)], ignore_index=True)


def test_with_repeats_a_point_gets_an_interval_and_a_verdict_and_the_sentence_says_which(sweep):
    _, runs = sweep
    repeated = _with_repeats(runs, {32: [1.004, 0.997], 1: [1.002, 0.999]})
    verdicts = judge_points(repeated, SWEEP_SHA, 1024, "full-pool-cast").set_index("batch_size")
    assert verdicts.loc[32, "verdict"] == "improvement" and (verdicts.loc[32, ["baseline_runs", "runs"]] == 3).all()
    low, high = verdicts.loc[32, "speedup_low"], verdicts.loc[32, "speedup_high"]
    assert low < verdicts.loc[32, "speedup"] < high and 5.9 < low and high < 6.4
    assert verdicts.loc[4, "verdict"] == "not enough data"
    assert describe_sweep(verdicts.reset_index(), 1024, "0bc00a5") == (
        "fused is 11.9x faster than full-pool-cast at bs 1 and 6.1x at bs 32 (context 1K, at 0bc00a5); not enough "
        "data at bs 4, 16 and 128 (measured 9.8x faster at bs 4, 8.0x at bs 16 and 2.6x at bs 128; no repeated "
        "runs there).")


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
    assert row["tok_per_s"] == pytest.approx(2048.10, abs=0.01) and row["ms_per_token"] == pytest.approx(0.48826,
                                                                                                      abs=1e-4)
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
    assert "6.1x at bs 32" in sentence and sentence.startswith("**fused measured 11.9x faster than full-pool-cast")
    table = at.dataframe[0].value.set_index("batch_size")
    assert table.loc[32, "speedup"] == pytest.approx(6.1275, abs=1e-3)
    assert table.loc[32, "verdict"] == "not enough data" and table.loc[32, "interval"] == "— (no spread)"
    assert table.loc[32, "copy_share"] == pytest.approx(9.66, abs=0.01)  # percent on screen
    assert table.loc[32, "baseline_run"].startswith("run?run=") and table.loc[32, "run"].startswith("run?run=")
    with open_db(sweep_db, read_only=True) as store:
        step = store.con.execute("SELECT timing_ms_median FROM runs WHERE run_id = ?",
                                 [int(table.loc[32, "run"].split("=")[1])]).fetchone()[0]
    assert step == pytest.approx(15.624, abs=1e-3)  # the link opens the fused bs-32 run itself


def test_the_page_keeps_its_state_in_the_url_and_says_what_it_ignores(sweep_db, open_page):
    at = open_page(sweep_db, "sweep", context="4096", baseline="fused")
    assert not at.exception
    [sentence] = [m.value for m in at.markdown if "at 0bc00a5" in m.value]
    # against fused, the whole-pool cast is the slower one, at bs 1-32 of context 4K (bs 32 has no fused run)
    assert sentence.startswith("**full-pool-cast measured 11.3x slower than fused at bs 1, 6.4x at bs 4 and 3.8x at "
                               "bs 16 (context 4K")
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16]
    at = open_page(sweep_db, "sweep", context="2048", variants="gather-then-cast")
    assert [w.value for w in at.warning] == ["`?context=2048` matches no context here: showing 1K (1024 tokens) "
                                             "instead.", "`?variants=gather-then-cast` matches no variant here: "
                                             "ignored."]
    assert at.query_params["variants"] == ["full-pool-cast", "fused"]


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
    assert load_samples(str(db), load_rule_chain(), only) == 17
    at = open_page(db, "sweep")
    assert at.query_params["commit"] == later and at.query_params["vs"] == ""  # the newest commit first
    at = open_page(db, "sweep", vs=SWEEP_SHA)
    assert not at.exception
    sentences = [m.value for m in at.markdown if "faster" in m.value]
    assert len(sentences) == 2
    assert sentences[0].startswith("**fused measured 6.1x faster than full-pool-cast at bs 32 and 2.6x at bs 128 "
                                   "(context 1K, at b53f772)")
    assert sentences[1].startswith("**fused measured 11.9x faster than full-pool-cast at bs 1, 9.8x at bs 4 and 8.0x "
                                   "at bs 16 (context 1K, at 0bc00a5)")
    assert [t.value["batch_size"].tolist() for t in at.dataframe] == [[32, 128], [1, 4, 16]]


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
    assert list(row.spec_sweep_ids) == ["h200-1k"] and row.runs == 17  # one sweep: spec and imported runs
    at = open_page(db, "sweep", sweep="h200-1k")
    assert not at.exception and not at.warning
    assert at.query_params["sweep"] == row.sweep_id and at.query_params["commit"] == SWEEP_SHA
    assert "Runs of sweep spec h200-1k are among these points." in [c.value for c in at.caption]
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16, 32, 128]
    at = open_page(db, "sweep", sweep="h200-1k", context="4096")  # the imported 4K points, without the id
    assert at.dataframe[0].value["batch_size"].tolist() == [1, 4, 16]


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
    archives = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kernels" / "results").glob("*-h200-sweep*/sweep.tar*"))
    assert archives == sorted(a for s in listing for a in s["archives"]), "unpack the new sweep archive (README)"
    done = subprocess.run([sys.executable, "-m", "ingest", "samples", "--db", ":memory:"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "loaded 43 sample runs" in done.stderr, done.stderr
