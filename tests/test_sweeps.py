"""Sweeps: one spec listing batch sizes / lengths is one run a combination, each of its own series,
tied by a sweep id (ingest/runs/spec.py SweepSpec, migration 015).

- spec parsing: the lists, their order (SGLang's itertools.product order), the limits and bad input
  (one line naming the field, exit 2 from `ingest run`, the database unchanged);
- SGLang's one-batch benchmark given the lists in ONE process, against the stand-in
  (tests/standins/make_fake_sglang.py: SGLang cannot be installed here, FACTS.md section 4), every
  combination imported as its own run with the JSONL's figures, through the real worker;
- the reference engine's sweep (tiny preset, CPU, 3 batch sizes): queued by `ingest run`, one job a
  point, each run by the real worker in its own process.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from db.store import open_db
from ingest.cli import main
from ingest.limits import MAX_SWEEP_POINTS, MAX_SWEEP_VALUES
from ingest.runs.engines.sglang import build_one_batch_argv, match_sweep_records, BenchFlags
from ingest.runs.errors import SpecError
from ingest.runs.spec import (Config, HostConfig, RepoConfig, SweepSpec, parse_any_spec, parse_job_spec,
                              parse_rerun_spec, parse_spec)
from ingest.runs.survival import kept_bundle_path, process_stamp
from ingest.runs.worker import execute_job, worker_name
from ingest.traces.categories import load_rule_chain
from tests.standins.make_fake_sglang import make_fake_sglang, write_model_config


def _reference(**workload) -> dict:
    return {"engine": "reference", "workload": {"preset": "tiny", **workload}}


# --- spec parsing -------------------------------------------------------------------------------

def test_lists_make_one_point_a_combination_in_sglangs_loop_order():
    config = Config(repos={"fake": RepoConfig("fake", "/x")})
    body = {"engine": "sglang", "repo": "fake", "ref": "main",
            "workload": {"model_path": "/m", "batch_size": [1, 8, 32], "input_len": [1024, 4096], "output_len": 16}}
    sweep = parse_any_spec(body, config)
    assert isinstance(sweep, SweepSpec) and sweep.in_one_process
    # one_batch.py latency_test: itertools.product(batch_size, input_len, output_len), batch size outermost
    assert [(p.workload.batch_size, p.workload.input_len, p.workload.output_len) for p in sweep.points] == [
        (1, 1024, 16), (1, 4096, 16), (8, 1024, 16), (8, 4096, 16), (32, 1024, 16), (32, 4096, 16)]
    assert [p.sweep_point for p in sweep.points] == list(range(6))
    assert {p.sweep_id for p in sweep.points} == {sweep.sweep_id} and sweep.sweep_id.startswith("sweep-")
    jobs = sweep.list_jobs()
    assert len(jobs) == 1 and "of 6 points (batch_size 1, 8, 32 x input_len 1024, 4096)" in jobs[0][1]
    again = parse_job_spec(json.loads(jobs[0][0]), config)  # what the worker reads back: the same sweep
    assert again == sweep


def test_a_reference_sweep_is_one_job_a_point_with_its_own_series_fields():
    sweep = parse_any_spec(_reference(batch_size=[1, 4, 16], context=[64, 128]))
    assert not sweep.in_one_process
    assert [(p.workload.batch_size, p.workload.context) for p in sweep.points] == [
        (1, 64), (1, 128), (4, 64), (4, 128), (16, 64), (16, 128)]
    jobs = sweep.list_jobs()
    assert len(jobs) == 6 and "point 3 of 6 (bs 4 ctx 64)" in jobs[2][1]
    point = parse_job_spec(json.loads(jobs[2][0]))
    assert (point.workload.batch_size, point.sweep_id, point.sweep_point) == (4, sweep.sweep_id, 2)
    rerun = parse_rerun_spec(json.loads(jobs[2][0]), 2)  # a confirmation re-runs the point, outside the sweep
    assert (rerun.workload.batch_size, rerun.sweep_id, rerun.sweep_point) == (4, None, None)


def test_a_sweep_job_re_runs_the_runs_own_point():
    config = Config(repos={"fake": RepoConfig("fake", "/x")})
    body = {"engine": "sglang", "repo": "fake", "ref": "main", "sweep_id": "sweep-abc",
            "workload": {"model_path": "/m", "batch_size": [1, 8], "input_len": [64, 128]}}
    rerun = parse_rerun_spec(body, 3, config)
    assert (rerun.workload.batch_size, rerun.workload.input_len, rerun.sweep_id) == (8, 128, None)
    with pytest.raises(SpecError, match=r"spec.sweep_point: 4 is not a point of sweep sweep-abc \(4 points\)"):
        parse_rerun_spec(body, 4, config)


def test_a_spec_without_lists_is_the_run_spec_it_always_was():
    spec = parse_any_spec(_reference(batch_size=4))
    assert spec == parse_spec(_reference(batch_size=4))
    assert "sweep" not in spec.to_json()  # queued jobs of no sweep keep their JSON


@pytest.mark.parametrize("workload, line", [
    ({"batch_size": [1, 4, 4, 16]}, "spec.workload.batch_size: 4 given more than once: each value once"),
    ({"batch_size": []}, "spec.workload.batch_size: an empty list: give at least one value"),
    ({"batch_size": [1, 0]}, "spec.workload.batch_size: must be a positive integer, got 0"),
    ({"batch_size": [1, "8"]}, "spec.workload.batch_size: must be a positive integer, got '8'"),
    ({"batch_size": [1, 5000]}, "spec.workload.batch_size: must be at most 4,096 (WORKLOAD_MAXIMA), got 5,000"),
    ({"batch_size": list(range(1, MAX_SWEEP_VALUES + 2))},
     f"spec.workload.batch_size: {MAX_SWEEP_VALUES + 1} values, more than MAX_SWEEP_VALUES ({MAX_SWEEP_VALUES}"),
    ({"batch_size": list(range(1, 10)), "context": list(range(1, 9))},
     f"spec.workload: 9 x 8 = 72 combinations, more than MAX_SWEEP_POINTS ({MAX_SWEEP_POINTS}"),
    ({"input_len": [256, 512]}, "spec.workload.input_len: a list makes a sweep, and the reference engine reads "
                                "batch_size and context"),
    ({"tp": [1, 2]}, "spec.workload.tp: a list makes a sweep"),
])
def test_bad_sweeps_are_refused_naming_the_field(workload, line):
    with pytest.raises(SpecError) as e:
        parse_any_spec(_reference(**workload))
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_list_where_one_run_is_expected_is_refused():
    with pytest.raises(SpecError, match=r"^spec.workload.batch_size: a list makes a sweep"):
        parse_spec(_reference(batch_size=[1, 2]))


def test_sglang_sweeps_lengths_but_not_the_reference_context():
    config = Config(repos={"fake": RepoConfig("fake", "/x")})
    with pytest.raises(SpecError, match=r"^spec.workload.context: a list makes a sweep, and the sglang engine sweeps "
                                        r"batch_size, input_len, output_len"):
        parse_any_spec({"engine": "sglang", "repo": "fake", "ref": "main",
                        "workload": {"model_path": "/m", "context": [1, 2]}}, config)


def test_bad_sweep_from_ingest_run_is_one_line_exit_2_and_leaves_the_database(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert main(["run", "--db", str(db), "--queue", "--engine", "reference", "--preset", "tiny",
                 "--batch-size", "1", "4", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spec.workload.batch_size: 4 given more than once" in err[0]
    assert not db.exists()  # refused before any database was opened
    spec = tmp_path / "sweep.toml"
    spec.write_text('engine = "reference"\n[workload]\npreset = "tiny"\nbatch_size = [1, 2]\n'
                    f'context = {list(range(1, 40))}\n')
    assert main(["run", "--db", str(db), "--queue", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"39 values, more than MAX_SWEEP_VALUES ({MAX_SWEEP_VALUES}" in err[0]
    assert not db.exists()


def test_ingest_run_queues_a_reference_sweep_as_jobs_of_one_sweep(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert main(["run", "--db", str(db), "--queue", "--engine", "reference", "--preset", "tiny",
                 "--batch-size", "1", "2", "4", "--profile-steps", "2"]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    with open_db(db, read_only=True) as store:
        jobs = [store.get_job(i) for i in ids]
    assert len(jobs) == 3 and len({j["sweep_id"] for j in jobs}) == 1 and jobs[0]["sweep_id"].startswith("sweep-")
    assert [json.loads(j["spec"])["workload"]["batch_size"] for j in jobs] == [1, 2, 4]
    assert [j["label"].split(" · ")[1] for j in jobs] == [f"sweep {jobs[0]['sweep_id']} point {i} of 3 (bs {b})"
                                                          for i, b in ((1, 1), (2, 2), (3, 4))]


# --- SGLang's one-batch benchmark: the lists in one process -------------------------------------

def test_one_batch_argv_takes_the_lists_and_starts_profiling_where_the_shortest_output_fits():
    config = Config(repos={"fake": RepoConfig("fake", "/x")})
    sweep = parse_any_spec({"engine": "sglang", "repo": "fake", "ref": "main",
                            "workload": {"model_path": "/m", "batch_size": [1, 8, 32], "input_len": [1024, 4096],
                                         "output_len": [8, 64], "profile_steps": 3}}, config)
    argv = build_one_batch_argv("py", "sglang.benchmark.one_batch", sweep.points[0].workload, result_file="r.jsonl",
                                run_name="x", profile_prefix="p", flags=BenchFlags(), axes=dict(sweep.axes))
    at = argv.index("--batch-size")
    assert argv[at:at + 9] == ["--batch-size", "1", "8", "32", "--input-len", "1024", "4096", "--output-len", "8"]
    assert argv[at + 9] == "64"
    # output 8: 7 decode steps, 3 profiled from step min(4, 7 - 3) = 4; output 64 would start at 32
    assert argv[argv.index("--profile-start-step") + 1] == "4"


def test_sweep_records_are_matched_by_their_shape_not_their_position():
    records = [{"batch_size": 1, "input_len": 16, "output_len": 8, "median_decode_latency": 0.1},
               {"batch_size": 4, "input_len": 16, "output_len": 8, "median_decode_latency": 0.2}]
    # point 1 (bs 2) was skipped by the benchmark: no record; point 2 gets bs 4's
    assert match_sweep_records(records, [(1, 16, 8), (2, 16, 8), (4, 16, 8)]) == {0: records[0], 2: records[1]}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """A stand-in SGLang checkout (SGLang cannot be installed here, FACTS.md section 4) and its config."""
    root = tmp_path_factory.mktemp("fake-sglang")
    made = make_fake_sglang(root / "sglang")
    model = write_model_config(root / "model", layers=2)
    config = Config(hosts={"local": HostConfig("local", python=sys.executable)},
                    repos={"fake": RepoConfig("fake", str(made.path))})
    return made, model, config


def _run_job(db: Path, spec_json: str, label: str, config: Config) -> dict:
    with open_db(db) as store:
        job_id = store.enqueue_job(spec_json, label)
        job = store.claim_job(worker_name(), job_id, worker_proc=process_stamp())
    execute_job(str(db), job, config, load_rule_chain())
    with open_db(db, read_only=True) as store:
        return store.get_job(job_id)


def _sweep_runs(db: Path, sweep_id: str) -> list[dict]:
    with open_db(db, read_only=True) as store:
        cur = store.con.execute(
            "SELECT run_id, job_id, sweep_point, batch_size, workload_key, tok_per_s, step_ms_median, prefill_ms,"
            " prefill_tok_per_s, decode_ms_median, decode_tok_per_s_median, total_latency_ms, peak_gpu_mem_bytes,"
            " json_extract_string(manifest, '$.traces[0]') AS trace, json_extract(manifest, '$.extra.result') AS"
            " result FROM runs WHERE sweep_id = ? ORDER BY sweep_point", [sweep_id])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def test_sglang_sweep_runs_in_one_process_and_every_combination_is_a_run(fake, tmp_path):
    made, model, config = fake
    sweep = parse_any_spec({"engine": "sglang", "repo": "fake", "ref": made.current_sha, "timeout_s": 900,
                            "workload": {"model_path": str(model), "load_format": "dummy", "batch_size": [1, 4],
                                         "input_len": [16, 32], "output_len": 8, "profile_steps": 2}}, config)
    (spec_json, label), = sweep.list_jobs()
    db = tmp_path / "s.duckdb"
    job = _run_job(db, spec_json, label, config)
    assert (job["status"], job["error"]) == ("succeeded", None), job["log"][-3000:]
    assert job["sweep_id"] == sweep.sweep_id
    # ONE benchmark process: it loads the model and warms up once, then runs the four combinations
    assert job["log"].count("Warmup ...") == 1 and job["log"].count("max_total_num_tokens=") == 1
    assert job["log"].count("Prefill. latency") == 5  # the warm-up's and one a combination
    runs = _sweep_runs(db, sweep.sweep_id)
    shapes = [(1, 16), (1, 32), (4, 16), (4, 32)]
    assert [r["sweep_point"] for r in runs] == [0, 1, 2, 3] and {r["job_id"] for r in runs} == {job["job_id"]}
    assert job["run_id"] == runs[0]["run_id"]
    assert [r["trace"] for r in runs] == [f"stepwatch_batch{bs}_input{il}_output8_decode.trace.json.gz"
                                         for bs, il in shapes]
    assert [r["batch_size"] for r in runs] == [1, 1, 4, 4]
    assert len({r["workload_key"] for r in runs}) == 4  # each combination its own series
    for run, (bs, il) in zip(runs, shapes):
        result = json.loads(run["result"])  # the point's own JSONL record, kept as its figures
        assert (result["batch_size"], result["input_len"], result["output_len"]) == (bs, il, 8)
        assert run["prefill_ms"] == pytest.approx(result["prefill_latency"] * 1000)
        assert run["prefill_tok_per_s"] == pytest.approx(result["prefill_throughput"])
        assert run["decode_ms_median"] == pytest.approx(result["median_decode_latency"] * 1000)
        assert run["decode_tok_per_s_median"] == pytest.approx(result["median_decode_throughput"])
        assert run["total_latency_ms"] == pytest.approx(result["total_latency"] * 1000)
        assert run["tok_per_s"] == pytest.approx(result["median_decode_throughput"])
        assert run["prefill_tok_per_s"] == pytest.approx(bs * il / result["prefill_latency"])
        assert run["peak_gpu_mem_bytes"] is None  # sglang 0.5.23's one-batch JSONL reports no memory
    with open_db(db, read_only=True) as store:
        assert store.list_job_run_ids(job["job_id"]) == [r["run_id"] for r in runs]
    # a later attempt of the job (its worker died after keeping the bundles) imports them, runs nothing
    again = tmp_path / "again.duckdb"
    shutil.copytree(kept_bundle_path(str(db), job["job_id"]), kept_bundle_path(str(again), job["job_id"]))
    retried = _run_job(again, spec_json, label, config)
    assert retried["status"] == "succeeded" and "left the sweep's bundles" in retried["log"]
    assert "Warmup ..." not in retried["log"]
    assert [r["trace"] for r in _sweep_runs(again, sweep.sweep_id)] == [r["trace"] for r in runs]


def test_sglang_sweep_points_the_benchmark_skips_fail_the_job_after_the_others_are_imported(fake, tmp_path):
    """sglang 0.5.23 skips a combination whose batch does not fit the pool (one_batch.py
    latency_test_run_once: `skipping (bs, il, ol) due to max batch size limit`, no record, no trace):
    the stand-in's pool of --max-total-tokens 512 holds 512 // (16 + 8) = 21 requests, so bs 32 is skipped."""
    made, model, config = fake
    sweep = parse_any_spec({"engine": "sglang", "repo": "fake", "ref": made.current_sha, "timeout_s": 900,
                            "workload": {"model_path": str(model), "load_format": "dummy", "batch_size": [2, 32],
                                         "input_len": 16, "output_len": 8, "profile_steps": 2,
                                         "extra_args": ["--max-total-tokens=512"]}}, config)
    (spec_json, label), = sweep.list_jobs()
    db = tmp_path / "s.duckdb"
    job = _run_job(db, spec_json, label, config)
    runs = _sweep_runs(db, sweep.sweep_id)
    assert [(r["sweep_point"], r["batch_size"]) for r in runs] == [(0, 2)]
    assert (job["status"], job["error_kind"], job["run_id"]) == ("failed", "sweep-incomplete", runs[0]["run_id"])
    assert job["error"] == (f"1 of 2 points imported as runs {runs[0]['run_id']}; point 2 (bs 32, input 16, output 8): "
                            "SGLang skipped it: over the model's max batch size for these lengths (its log: "
                            "'skipping (32, 16, 8) due to max batch size limit')")


# --- the reference engine: one job a point, each its own process -------------------------------

@pytest.mark.slow
def test_reference_sweep_runs_each_point_through_the_worker(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert main(["run", "--db", str(db), "--engine", "reference", "--preset", "tiny", "--device", "cpu",
                 "--batch-size", "1", "2", "4", "--profile-steps", "2"]) == 0
    run_ids = [int(x) for x in capsys.readouterr().out.split()]
    assert len(run_ids) == 3
    with open_db(db, read_only=True) as store:
        rows = store.con.execute(
            "SELECT r.run_id, r.sweep_id, r.sweep_point, r.batch_size, r.workload_key, r.job_id, j.sweep_id,"
            " json_extract(r.manifest, '$.workload.batch_size') FROM runs r JOIN jobs j USING (job_id)"
            " ORDER BY r.run_id").fetchall()
    assert [r[0] for r in rows] == run_ids
    sweep_id = rows[0][1]
    assert sweep_id.startswith("sweep-") and {(r[1], r[6]) for r in rows} == {(sweep_id, sweep_id)}
    assert [(r[2], r[3], int(r[7])) for r in rows] == [(0, 1, 1), (1, 2, 2), (2, 4, 4)]
    assert len({r[4] for r in rows}) == 3 and len({r[5] for r in rows}) == 3  # own series, own job each


# --- the Run a benchmark form --------------------------------------------------------------------

def _submit(at, **fields):
    """Fill the form's fields (by widget key) and press Queue."""
    for key, value in fields.items():
        if key == "profile_steps":
            at.number_input(key=key).set_value(value)
        else:
            at.text_input(key=key).input(value)
    at.button(key="FormSubmitter:run_spec-Queue").click()
    return at.run()


def _all_jobs(db: Path) -> list[dict]:
    with open_db(db, read_only=True) as store:
        return store.list_jobs()


@pytest.mark.slow
@pytest.mark.parametrize("batch_sizes, line", [
    ("1, x", "Not queued: batch sizes: 'x' is not a whole number (one value, or several separated by commas: 1, 4, 16)"),
    ("1, 4, 4", "Not queued: spec.workload.batch_size: 4 given more than once: each value once"),
    ("1, 5000", "Not queued: spec.workload.batch_size: must be at most 4,096 (WORKLOAD_MAXIMA), got 5,000"),
])
def test_the_form_refuses_a_bad_sweep_naming_the_field(writable_db, open_page, batch_sizes, line):
    before = _all_jobs(writable_db)
    at = _submit(open_page(writable_db, "run_benchmark"), batch_sizes=batch_sizes)
    assert not at.exception
    assert at.error[0].value.startswith(line)
    assert _all_jobs(writable_db) == before


@pytest.mark.slow
def test_the_form_queues_a_reference_sweep_that_the_worker_runs_end_to_end(writable_db, open_page):
    """Reference engine, tiny preset, CPU, 3 batch sizes: one job a point (each its own process, as
    any reference run), the cards saying which point of the sweep each is, every point run by the
    worker's execute_job into a run of the sweep."""
    before = {j["job_id"] for j in _all_jobs(writable_db)}
    at = _submit(open_page(writable_db, "run_benchmark"), batch_sizes="1, 2, 4", profile_steps=2)
    assert not at.exception
    new = sorted(j["job_id"] for j in _all_jobs(writable_db) if j["job_id"] not in before)
    assert len(new) == 3
    with open_db(writable_db, read_only=True) as store:
        jobs = [store.get_job(i) for i in new]
    sweep_id = jobs[0]["sweep_id"]
    assert sweep_id.startswith("sweep-") and {j["sweep_id"] for j in jobs} == {sweep_id}
    assert at.success[0].value.startswith(f"Queued 3 jobs ({', '.join(map(str, new))}): reference tiny "
                                          f"full-pool-cast on local/cpu · sweep {sweep_id} point 1 of 3 (bs 1)")
    assert at.success[0].value.endswith(" and 2 more; 1 sweep of 3 points (batch_size 1, 2, 4), one job a point")
    cards = [m.value for m in at.markdown if m.value.startswith(f"**Job {new[0]}**")]
    assert cards and "point 1 of 3 (bs 1)" in cards[0]
    config = Config()
    for job_id in new:
        with open_db(writable_db) as store:
            job = store.claim_job(worker_name(), job_id, worker_proc=process_stamp())
        status, _ = execute_job(str(writable_db), job, config, load_rule_chain())
        assert status == "succeeded"
    with open_db(writable_db, read_only=True) as store:
        rows = store.con.execute("SELECT sweep_point, batch_size, job_id FROM runs WHERE sweep_id = ?"
                                 " ORDER BY sweep_point", [sweep_id]).fetchall()
    assert rows == [(0, 1, new[0]), (1, 2, new[1]), (2, 4, new[2])]


def test_the_reference_engines_peak_gpu_memory_is_kept_on_its_run(tmp_path):
    """Two real H200 bundles of a batch-size sweep (tests/data/h200/README.md, tiny-peak-memory):
    kernels.bench's torch.cuda.max_memory_allocated, imported into runs.peak_gpu_mem_bytes."""
    from tests.helpers import ROOT

    db = tmp_path / "s.duckdb"
    peaks = {}
    for bs, expected in ((1, 62_178_304), (16, 66_723_328)):
        bundle = ROOT / "tests" / "data" / "h200" / "tiny-peak-memory" / f"bundle-bs{bs}"
        assert main(["import", str(bundle), "--db", str(db)]) == 0
        with open_db(db, read_only=True) as store:
            peaks[bs] = store.con.execute("SELECT peak_gpu_mem_bytes, prefill_ms FROM runs WHERE batch_size = ?",
                                          [bs]).fetchone()
        assert peaks[bs] == (expected, None)  # the reference engine has no prefill figure


def test_backfill_makes_one_sweep_a_commit(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert main(["backfill", "--db", str(db), "--repo", "stepwatch", "--range", "HEAD~2..HEAD", "--variants",
                 "unpatched", "--engine", "reference", "--preset", "tiny", "--batch-size", "1", "2"]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    with open_db(db, read_only=True) as store:
        jobs = [store.get_job(i) for i in ids]
    specs = [json.loads(j["spec"]) for j in jobs]
    assert [(s["workload"]["batch_size"], s["sweep_point"]) for s in specs] == [(1, 0), (2, 1), (1, 0), (2, 1)]
    assert specs[0]["ref"] == specs[1]["ref"] != specs[2]["ref"] == specs[3]["ref"]
    assert jobs[0]["sweep_id"] == jobs[1]["sweep_id"] != jobs[2]["sweep_id"] == jobs[3]["sweep_id"]
    assert main(["backfill", "--db", str(db), "--repo", "stepwatch", "--range", "HEAD~2..HEAD", "--variants",
                 "unpatched", "--engine", "reference", "--preset", "tiny", "--batch-size", "2", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spec.workload.batch_size: 2 given more than once" in err[0]
    with open_db(db, read_only=True) as store:
        assert len(store.list_jobs()) == 4  # nothing more queued


def test_a_range_job_expands_each_run_body_into_a_sweep_of_its_own():
    from ingest.runs.expand import expand_range
    from ingest.runs.spec import RangeSpec

    body = _reference(batch_size=[1, 4])
    expansion = expand_range(RangeSpec(commits="", repo="", runs=(body, body)), Config())
    jobs = expansion.list_jobs()
    assert len(jobs) == 4 and expansion.describe() == "queued 4 jobs (1 ref x 2 runs, 2 of them sweeps)"
    ids = [json.loads(spec_json)["sweep_id"] for spec_json, _ in jobs]
    assert ids[0] == ids[1] != ids[2] == ids[3]  # a repeat of a sweep is a sweep of its own


def test_a_dead_workers_sweep_job_with_some_points_imported_is_requeued_not_succeeded(tmp_path):
    """A one-process sweep job whose worker died after importing some of its points must run again
    (its next attempt imports the rest from the kept bundles); a point job (one run) with its run is done."""
    with open_db(tmp_path / "s.duckdb") as store:
        sweep_job = store.enqueue_job(json.dumps({"sweep_id": "sweep-1", "workload": {"batch_size": [1, 2]}}), "a")
        point_job = store.enqueue_job(json.dumps({"sweep_id": "sweep-1", "sweep_point": 0}), "b")
        plain_job = store.enqueue_job(json.dumps({"engine": "reference"}), "c")
        for job_id in (sweep_job, point_job, plain_job):
            store.claim_job("w", job_id)
        store.con.execute("INSERT INTO runs (content_hash, ranks, steps, step_method, kernel_us_total,"
                          " kernels_from_cpu_ops, source_path, job_id) SELECT 'h' || x, 1, 1, 'given', 0, false, '/', x"
                          " FROM range(1, 4) t(x)")
        imported = {r["job_id"]: r["imported_run_id"] for r in store.list_running_jobs(60)}
    assert imported == {sweep_job: None, point_job: 2, plain_job: 3}
