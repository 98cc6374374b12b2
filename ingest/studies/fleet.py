"""Throughput of the fleet worker: jobs per hour through Ray's scheduling, the bundles' transfer
and the single writer's imports, with an engine that only waits.

    .venv/bin/python -m ingest.studies.fleet [--jobs 2000] [--sleep-s 3] [--gpus 64] [--cpus N]

Queues `--jobs` reference-engine jobs on device cuda (each asks Ray for one GPU) at `--jobs / 2`
commits of a synthetic repository, two variants each, then runs `ingest.runs.fleet.run_fleet_worker`
in this process against a local Ray cluster declaring `--gpus` logical GPUs. Each task is the
stand-in below instead of the real engine: it waits `--sleep-s` seconds (a GPU benchmark's place)
and returns a real bundle of the H200 (tests/data/bundles/tiny-fused-eager-nostack: 52 KB, with
its workload's `seed` set to the job id, so every run is new to the database). Everything else is
the real path: a fresh Ray process per task (max_calls=1), the relay, tar bytes back, the kept
bundle, the import, change detection on the commit's series, the job's record.

`--writer-only` measures the writer alone, no Ray: 40 unique copies of the bundle imported in turn
(read and analyse, then write, as the worker does), and the detection of their 20-commit series.

It prints: the wall time and runs per hour end to end, what the writer spent per run (claim,
import + detection + record, heartbeats, relay), and the writer's ceiling (3600 / the writer's
seconds per run): how many runs per hour one writer can take in whatever the fleet's size. The
issue's bar: >= 38,400 runs/hour (10x a 64-GPU fleet at one run per GPU-minute). Not a test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, astuple
from pathlib import Path

from db.store import open_db, run_tables
from ingest.runs.fleet import pack_bundle, run_fleet_worker
from ingest.runs.git import CommitInfo
from ingest.runs.spec import Config, RunSpec, Workload
from ingest.runs.track import follow_runs
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "tests" / "data" / "bundles" / "tiny-fused-eager-nostack"
REPO = "fleet-bench"
SLEEP_ENV, BUNDLE_ENV = "STEPWATCH_STANDIN_SLEEP_S", "STEPWATCH_STANDIN_BUNDLE"  # inherited by the cluster


def _sha(i: int) -> str:
    return f"{i:040x}"


def _commit(i: int) -> CommitInfo:
    """The synthetic repository's i-th commit (seq i, a second apart)."""
    return CommitInfo(_sha(i), f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00", "bench", f"c{i}", i)


def _unique_copy(source: Path, into: Path, n: int) -> Path:
    """A copy of the bundle at `into` whose trace has the same events in a gzip member stamped
    `n` (n > 0): a content hash of its own, so it imports as a new run."""
    bundle = Path(shutil.copytree(source, into))
    trace = bundle / "trace.json.gz"
    trace.write_bytes(gzip.compress(gzip.decompress(trace.read_bytes()), mtime=n))
    return bundle


def stand_in_task(relay, job_id: int, spec_json: str, config: Config) -> dict:
    """In a Ray task: wait like a benchmark, return a real bundle made unique by the job id."""
    relay.started_on.remote(job_id, os.getpid())
    time.sleep(float(os.environ.get(SLEEP_ENV, "3")))
    spec = json.loads(spec_json)
    work = Path(tempfile.mkdtemp(prefix=f"stepwatch-standin-{job_id}-"))
    try:
        bundle = _unique_copy(Path(os.environ[BUNDLE_ENV]), work / "bundle", job_id)
        manifest = json.loads((bundle / "manifest.json").read_text())
        manifest["workload"]["seed"] = job_id
        manifest["workload"]["kv"] = manifest["variant"] = spec["workload"]["kv"]
        manifest["commit"] = spec["ref"]
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        return {"status": "ok", "bundle": pack_bundle(bundle), "repo": REPO, "commit": _commit(int(spec["ref"], 16))}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def queue_jobs(db: str, jobs: int) -> None:
    commits = max(1, jobs // 2)
    with open_db(db) as store:
        for i in range(1, commits + 1):
            store.record_commit(REPO, *astuple(_commit(i)))
        for n in range(jobs):
            kv = ("fused", "full-pool-cast")[n % 2]
            spec = RunSpec("reference", Workload(preset="tiny", kv=kv), device="cuda", repo=REPO,
                           ref=_sha(n // 2 % commits + 1))
            store.enqueue_job(spec.to_json(), spec.describe(), "fleet benchmark")


def measure_writer(runs: int = 40) -> dict:
    """The one writer's cost per run without Ray: median ms to read and analyse a bundle, and to
    write it (commit and run), then one detection of the series they form."""
    rules = load_rule_chain()
    with tempfile.TemporaryDirectory(prefix="stepwatch-writer-") as work:
        db = str(Path(work) / "w.duckdb")
        prepare, write, run_ids = [], [], []
        for i in range(runs):
            bundle = _unique_copy(BUNDLE, Path(work) / f"b{i}", i + 1)
            t0 = time.perf_counter()
            record = prepare_import(bundle, rules, ImportOptions(repo=REPO, commit=_sha(i // 2 + 1)))
            tables = run_tables(record)
            t1 = time.perf_counter()
            with open_db(db) as store:
                store.record_commit(REPO, *astuple(_commit(i // 2 + 1)))
                run_ids.append(store.insert_run(record, tables)[0])
            prepare.append(t1 - t0)
            write.append(time.perf_counter() - t1)
        t0 = time.perf_counter()
        follow_runs(db, run_ids[-1:])
        detect = time.perf_counter() - t0
    return {"runs": runs, "read_and_analyse_ms": round(statistics.median(prepare) * 1e3, 1),
            "write_ms": round(statistics.median(write) * 1e3, 1), "detect_one_series_s": round(detect, 2),
            "imports_per_hour": round(3600 / (statistics.median(prepare) + statistics.median(write)))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--sleep-s", type=float, default=3.0)
    p.add_argument("--gpus", type=int, default=64, help="logical GPUs the local cluster declares")
    p.add_argument("--cpus", type=int, default=None, help="logical CPUs (default: --gpus, one a task)")
    p.add_argument("--max-in-flight", type=int, default=None)
    p.add_argument("--writer-only", action="store_true", help="the writer's cost per run alone, no Ray")
    args = p.parse_args(argv)
    if args.writer_only:
        print(json.dumps(measure_writer(), indent=1))
        return 0
    os.environ[SLEEP_ENV], os.environ[BUNDLE_ENV] = str(args.sleep_s), str(BUNDLE)  # (the task's code is a copy)
    with tempfile.TemporaryDirectory(prefix="stepwatch-fleet-") as work:
        db = str(Path(work) / "fleet.duckdb")
        queue_jobs(db, args.jobs)
        started = time.perf_counter()
        stats = run_fleet_worker(db, Config(), load_rule_chain(), "local", exit_when_idle=True, poll_s=0.2,
                                 max_in_flight=args.max_in_flight, num_gpus=args.gpus,
                                 num_cpus=args.cpus or args.gpus, echo=None, task=stand_in_task)
        wall = time.perf_counter() - started
        with open_db(db, read_only=True) as store:
            statuses = {s: store.count_jobs_in_batch("fleet benchmark", (s,))
                        for s in ("succeeded", "failed", "cancelled", "queued", "running")}
            runs = store.count_rows()["runs"]
    per_run = {k: v / max(stats.imported, 1) for k, v in asdict(stats).items() if k.endswith("_s")}
    writer_s = sum(per_run.values())
    out = {"jobs": args.jobs, "sleep_s": args.sleep_s, "gpus": args.gpus, "wall_s": round(wall, 2),
           "statuses": {k: v for k, v in statuses.items() if v}, "runs": runs,
           "runs_per_hour": round(stats.imported / wall * 3600),
           "fleet_bound_per_hour": round(3600 / args.sleep_s * min(args.gpus, args.max_in_flight or args.gpus)),
           "writer_ms_per_run": {k: round(v * 1e3, 1) for k, v in per_run.items()},
           "writer_ceiling_per_hour": round(3600 / writer_s) if writer_s else None,
           "stats": asdict(stats)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
