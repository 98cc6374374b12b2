"""Pages under writers: how long a page waits for the database while a worker and imports write.

    .venv/bin/python -m db.studies.load                 # 60 s: a worker, 4 import loops, 1 page reader
    .venv/bin/python -m db.studies.load --seconds 20 --imports 2 --json result.json
    .venv/bin/python -m db.studies.load --cpu-load 2       # the same beside 2 busy-looping processes

Not a test (it takes a minute and its figures depend on the machine); results go to
db/BENCHMARKS.md. Everything is a real process on one real DuckDB file, as in production:

1. A database is made as the dashboard's first start makes it (`ingest samples`), and reference
   jobs (tiny preset, CPU) are queued for `ingest worker`, which runs them one after another
   for the whole window: engine subprocess, profiler, import, change tracking, heartbeats.
2. `--imports` threads each run `python -m ingest import COPY --db DB --repo bench --commit SHA`
   back to back, as users and CI scripts do. Each COPY is a sample bundle whose trace.json.gz
   differs from the original only in the gzip header's mtime field, so every import is a new
   run (runs are identified by their traces' bytes) with the same figures; each gets its own
   commit, so change tracking follows every one.
3. A reader process (`--reader`, started by the benchmark) reads as the pages do, once every
   `--read-every-s`: Trends (count_runs, list_series, list_runs_without_commit, then the biggest
   series' get_trend and list_series_changes, in one read-only connection, as the page reads
   them through app/data.py's reading()) and Run (list_recent_runs + get_run_detail of the
   newest run, one connection), in turn.
   A read's latency runs from asking for the connection to closing it: the wait for writers is
   the point. It writes one latency per line.
4. When the window ends, queued jobs are cancelled, the worker finishes its current job and
   exits, the import loops finish their current import, and the reader stops. Reads from the
   window's end on are the study's own wind-down (its cancel of every queued job is one write
   hold of many statements on a starved CPU, and it logs no hold or wait): they are counted
   apart ("after") and left out of the window's figures.
5. `--cpu-load N` starts N processes that only spin (`while True: pass`, at normal priority)
   once the idle reads are done, before the writers, and kills them (by their handles) when the
   writers have finished: a competing CPU load beside the whole mix, as another user's job on
   the same machine would be. The reader reports a read's wait for the file and its queries'
   time apart, so a tail that is CPU starvation reads as query time, not as waiting.
   `--own-sessions` starts the reader, and the spinners, each in a session of its own, as a
   dashboard service and another user's job are: a kernel with autogroup
   (/proc/sys/kernel/sched_autogroup_enabled) shares the CPU between sessions first, then
   between the threads of each.
6. Bookkeeping: every import must print `imported run N` with a new N, every job that
   succeeded must name a new run, and the runs table must hold exactly the sample runs plus
   those: any other count is a lost or duplicated run, reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from db import views
from db.store import open_db

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "app" / "sample_data"
PAGE_P99_TARGET_MS = 300.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ingest", *args]


def _copy_bundle(src: Path, dst: Path, serial: int) -> Path:
    """A copy of bundle `src` whose trace bytes differ only in the gzip header's mtime."""
    shutil.copytree(src, dst)
    trace = dst / "trace.json.gz"
    data = bytearray(trace.read_bytes())
    data[4:8] = (0x5A000000 + serial).to_bytes(4, "little")  # MTIME: not part of the content or CRC
    trace.write_bytes(bytes(data))
    return dst


def _import_loop(db: str, work: Path, bundles: list[Path], loop: int, deadline: float,
                 out: list[dict], lock: threading.Lock) -> None:
    serial = 0
    while time.monotonic() < deadline:
        serial += 1
        src = bundles[(loop + serial) % len(bundles)]
        copy = _copy_bundle(src, work / f"import-{loop}-{serial}", loop * 100_000 + serial)
        sha = secrets.token_hex(20)
        t0 = time.monotonic()
        proc = subprocess.run(_cli("import", str(copy), "--db", db, "--repo", "bench", "--commit", sha),
                              cwd=ROOT, capture_output=True, text=True)
        found = re.search(r"^imported run (\d+)", proc.stderr, re.M)
        with lock:
            out.append({"loop": loop, "rc": proc.returncode, "s": time.monotonic() - t0,
                        "run_id": int(found.group(1)) if found else None,
                        "error": proc.stderr.strip().splitlines()[-1] if proc.returncode else None})
        shutil.rmtree(copy, ignore_errors=True)


READS = ("trends", "run")
IDLE_READS = 20


def reader_main(db: str, out_path: str, stop_path: str, every_s: float) -> None:
    """The page-like reader (a separate process, as the Streamlit server is)."""
    waited = [0.0]

    def open_timed(*args, **kwargs):  # the page's open, timed apart: waiting for writers is in here
        t0 = time.perf_counter()
        try:
            return open_db(*args, **kwargs)
        finally:
            waited[0] += time.perf_counter() - t0

    def trends() -> None:  # one connection, as the page reads (app/data.py reading())
        with open_timed(db, read_only=True, wait_s=120) as store:
            views.count_runs(store)
            series = views.list_series(store)
            views.list_runs_without_commit(store)
            if len(series):
                top = series.iloc[0]
                views.get_trend(store, top["repo"], top["engine"], top["device"], top["workload_id"], 100)
                views.list_series_changes(store, top["repo"], top["engine"], top["device"], top["workload_id"])

    def run() -> None:
        with open_timed(db, read_only=True, wait_s=120) as store:
            recent = views.list_recent_runs(store)
            if len(recent):
                views.get_run_detail(store, int(recent.iloc[0]["run_id"]))

    pages = {"trends": trends, "run": run}
    go_path, end_path = stop_path + ".go", stop_path + ".end"
    with open(out_path, "w") as out:
        n = 0
        while not os.path.exists(stop_path):
            page = READS[n % len(READS)]
            phase = "after" if os.path.exists(end_path) else "load" if os.path.exists(go_path) else "idle"
            waited[0], t0 = 0.0, time.perf_counter()
            pages[page]()
            out.write(f"{phase} {page} {1000 * (time.perf_counter() - t0):.3f} {1000 * waited[0]:.3f}\n")
            out.flush()
            n += 1
            time.sleep(every_s)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _queue_jobs(db: str, n: int) -> list[int]:
    ids = []
    for kv in ("full-pool-cast", "gather-then-cast", "fused") * (n // 3 + 1):
        if len(ids) == n:
            break
        proc = subprocess.run(_cli("run", "--engine", "reference", "--preset", "tiny", "--kv", kv, "--device", "cpu",
                                   "--profile-steps", "2", "--db", db, "--queue"),
                              cwd=ROOT, capture_output=True, text=True, check=True)
        ids.append(int(proc.stdout.split()[-1]))
    return ids


SPIN = "while True: pass"
SPIN_GROUP = "import os, sys\nfor _ in range(int(sys.argv[1]) - 1):\n    if os.fork() == 0:\n        break\n" + SPIN


def _start_cpu_load(n: int, own_session: bool) -> list[subprocess.Popen]:
    """n processes that spin at normal priority until killed (the competing CPU load); with
    own_session, one process that forks the others in a session of their own (another user's job)."""
    if own_session and n:
        return [subprocess.Popen([sys.executable, "-c", SPIN_GROUP, str(n)], stdin=subprocess.DEVNULL,
                                 start_new_session=True)]
    return [subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL) for _ in range(n)]


def _stop_cpu_load(spinners: list[subprocess.Popen]) -> None:
    for proc in spinners:
        try:
            os.killpg(proc.pid, 9) if os.getpgid(proc.pid) == proc.pid else proc.kill()  # a session: its group
        except ProcessLookupError:
            pass
    for proc in spinners:
        proc.wait()


def run_benchmark(seconds: float, imports: int, read_every_s: float, jobs: int, cpu_load: int = 0,
                  own_sessions: bool = False, keep_logs: str | None = None) -> dict:
    """The study's figures; with keep_logs, a path prefix for its raw logs (holds, waits, latencies)."""
    work = Path(tempfile.mkdtemp(prefix="stepwatch-load-"))
    db = str(work / "load.duckdb")
    holds, waits = work / "holds.log", work / "waits.log"
    spinners: list[subprocess.Popen] = []
    try:
        subprocess.run(_cli("samples", "--db", db), cwd=ROOT, capture_output=True, text=True, check=True)
        with open_db(db, read_only=True) as store:
            sample_runs = store.count_rows()["runs"]
        job_ids = _queue_jobs(db, jobs)
        bundles = sorted(p for p in SAMPLES.iterdir() if (p / "manifest.json").exists())
        stop, latencies = work / "stop", work / "latencies.txt"
        os.environ["STEPWATCH_DB_HOLD_LOG"] = str(holds)  # every process below logs its holds (db/store.py)
        os.environ["STEPWATCH_DB_WAIT_LOG"] = str(waits)  # ... and its waits in db/lock.py's queue
        reader = subprocess.Popen([sys.executable, "-m", "db.studies.load", "--reader", db, str(latencies),
                                   str(stop), str(read_every_s)], cwd=ROOT, start_new_session=own_sessions)
        while latencies.exists() is False or len(latencies.read_text().splitlines()) < IDLE_READS:
            time.sleep(0.1)  # the reader's baseline: the same reads with no writer
        Path(str(stop) + ".go").touch()
        spinners.extend(_start_cpu_load(cpu_load, own_sessions))
        worker = subprocess.Popen(_cli("worker", "--db", db, "--poll-s", "0.5", "--exit-when-idle"), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t0 = time.monotonic()
        deadline = t0 + seconds
        results: list[dict] = []
        lock = threading.Lock()
        loops = [threading.Thread(target=_import_loop, args=(db, work, bundles, i, deadline, results, lock))
                 for i in range(imports)]
        for t in loops:
            t.start()
        while time.monotonic() < deadline:
            time.sleep(0.5)
        Path(str(stop) + ".end").touch()  # reads from here on are the study's wind-down, not the mix
        with open_db(db, wait_s=120) as store:  # the window is over: no new job starts
            for job in job_ids:
                store.request_cancel(job)
        for t in loops:
            t.join()
        worker_out, _ = worker.communicate(timeout=600)
        writers_s = time.monotonic() - t0
        load_average = os.getloadavg()[0]
        stop.touch()
        reader.wait(timeout=600)
        _stop_cpu_load(spinners)
        spinners.clear()
        rows = [line.split() for line in latencies.read_text().splitlines()]
        with open_db(db, read_only=True) as store:
            runs = store.count_rows()["runs"]
            job_rows = [store.get_job(j, with_log=False) for j in job_ids]
            dup_hashes = store.con.execute(
                "SELECT count(*) FROM (SELECT content_hash FROM runs GROUP BY 1 HAVING count(*) > 1)").fetchone()[0]
        result = _summarise(rows, results, job_rows, runs, sample_runs, dup_hashes, seconds, writers_s, imports,
                            worker.returncode, worker_out)
        result["holds"] = _summarise_holds(holds)
        result["waits"] = _summarise_waits(waits, reader.pid)
        result["cpu_load"], result["load_average"], result["own_sessions"] = cpu_load, load_average, own_sessions
        return result
    finally:
        _stop_cpu_load(spinners)  # also when the window failed: no spinner outlives the study
        for log in (holds, waits, work / "latencies.txt") if keep_logs else ():
            if log.exists():
                shutil.copy(log, f"{keep_logs}.{log.name}")
        os.environ.pop("STEPWATCH_DB_HOLD_LOG", None)
        os.environ.pop("STEPWATCH_DB_WAIT_LOG", None)
        shutil.rmtree(work, ignore_errors=True)


def _summarise_holds(log: Path) -> list[dict]:
    """Who held the file while the window ran, longest first: (mode, call site) -> count, p50, max."""
    sites: dict[tuple[str, str], list[float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        _, mode, ms, where = line.split(" ", 3)
        sites.setdefault((mode, where.split(":", 1)[0] + ":" + where.rsplit(":", 1)[-1]), []).append(float(ms))
    rows = [{"mode": mode, "site": site, "count": len(v), "p50_ms": _percentile(v, 50), "max_ms": max(v)}
            for (mode, site), v in sites.items()]
    return sorted(rows, key=lambda r: -r["max_ms"])


def _summarise_waits(log: Path, reader_pid: int) -> dict:
    """The page's and the writers' waits in db/lock.py's queue (its idle reads included: they wait
    for nobody): ms in the queue, ms then for L, and how many entries each waited for."""
    groups: dict[str, list[tuple[float, float, int]]] = {"page": [], "writers": []}
    for line in log.read_text().splitlines() if log.exists() else []:  # db/lock.py _log_wait
        pid, _, mode, queue_ms, lock_ms, waited_for = line.split()[:6]
        who = "page" if int(pid) == reader_pid and mode == "read" else "writers" if mode == "write" else "other"
        groups.setdefault(who, []).append((float(queue_ms), float(lock_ms), int(waited_for)))
    out = {}
    for who, rows in groups.items():
        if not rows:
            continue
        total = [q + lk for q, lk, _ in rows]
        out[who] = {"count": len(rows), "p50_ms": _percentile(total, 50), "p99_ms": _percentile(total, 99),
                    "max_ms": max(total), "lock_max_ms": max(lk for _, lk, _ in rows),
                    "waited_for": {str(n): sum(1 for *_, k in rows if k == n) for n in sorted({k for *_, k in rows})}}
    return out


def _summarise(rows, results, job_rows, runs, sample_runs, dup_hashes, seconds, writers_s, imports,
               worker_rc, worker_out) -> dict:
    idle = [float(v) for phase, _, v, _ in rows if phase == "idle"]
    ms = [float(v) for phase, _, v, _ in rows if phase == "load"]
    opening = [float(w) for phase, _, _, w in rows if phase == "load"]
    querying = [float(v) - float(w) for phase, _, v, w in rows if phase == "load"]
    by_page = {page: [float(v) for phase, p, v, _ in rows if p == page and phase == "load"] for page in READS}
    ok_imports = [r for r in results if r["rc"] == 0 and r["run_id"] is not None]
    succeeded = [j for j in job_rows if j["status"] == "succeeded"]
    new_ids = [r["run_id"] for r in ok_imports] + [j["run_id"] for j in succeeded]
    expected = sample_runs + len(set(new_ids))
    return {
        "seconds": seconds, "writers_s": round(writers_s, 1), "import_loops": imports,
        "idle_reads": len(idle), "idle_p50_ms": _percentile(idle, 50), "idle_max_ms": max(idle),
        "after_window_reads": sum(phase == "after" for phase, *_ in rows),
        "locks": os.environ.get("STEPWATCH_DB_LOCKS", "1") != "0",
        "reads": len(ms), "p50_ms": _percentile(ms, 50), "p90_ms": _percentile(ms, 90),
        "p99_ms": _percentile(ms, 99), "max_ms": max(ms),
        "open_p50_ms": _percentile(opening, 50), "open_p99_ms": _percentile(opening, 99),
        "open_max_ms": max(opening),
        "query_p50_ms": _percentile(querying, 50), "query_p99_ms": _percentile(querying, 99),
        "query_max_ms": max(querying),
        "over_300_ms": sum(v > PAGE_P99_TARGET_MS for v in ms), "over_1_s": sum(v > 1000 for v in ms),
        "by_page": {p: {"reads": len(v), "p50_ms": _percentile(v, 50), "p99_ms": _percentile(v, 99),
                        "max_ms": max(v)} for p, v in by_page.items() if v},
        "imports": len(results), "imports_failed": [r["error"] for r in results if r["rc"] != 0],
        "import_s_median": statistics.median(r["s"] for r in results) if results else None,
        "jobs_succeeded": len(succeeded),
        "jobs_other": {j["job_id"]: j["status"] for j in job_rows if j["status"] not in ("succeeded", "cancelled")},
        "runs": runs, "runs_expected": expected,
        "lost": max(0, expected - runs), "extra": max(0, runs - expected),
        "duplicate_run_ids": len(new_ids) - len(set(new_ids)), "duplicate_hashes": dup_hashes,
        "worker_rc": worker_rc, "worker_errors": [ln for ln in worker_out.splitlines() if "error" in ln.lower()][:5],
    }


def _print(result: dict) -> None:
    print(f"window {result['seconds']:g} s (writers done after {result['writers_s']} s), "
          f"{result['import_loops']} import loops + a worker + {result['cpu_load']} spinning processes"
          f"{' (reader and spinners each in a session of their own)' if result['own_sessions'] else ''}; "
          f"load average {result['load_average']:.1f} at the end")
    print(f"locks (db/lock.py): {'on' if result['locks'] else 'off (STEPWATCH_DB_LOCKS=0)'}; the same reads "
          f"with no writer: {result['idle_reads']}, p50 {result['idle_p50_ms']:.0f} ms, "
          f"max {result['idle_max_ms']:.0f} ms")
    print(f"page reads: {result['reads']}, p50 {result['p50_ms']:.0f} ms, p90 {result['p90_ms']:.0f} ms, "
          f"p99 {result['p99_ms']:.0f} ms, max {result['max_ms']:.0f} ms; over 300 ms: {result['over_300_ms']}, "
          f"over 1 s: {result['over_1_s']}")
    print(f"  of which opening (waiting for writers, attaching): p50 {result['open_p50_ms']:.0f} ms, "
          f"p99 {result['open_p99_ms']:.0f} ms, max {result['open_max_ms']:.0f} ms")
    print(f"  of which the queries (after opening): p50 {result['query_p50_ms']:.0f} ms, "
          f"p99 {result['query_p99_ms']:.0f} ms, max {result['query_max_ms']:.0f} ms")
    for page, s in result["by_page"].items():
        print(f"  {page}: {s['reads']} reads, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, "
              f"max {s['max_ms']:.0f} ms")
    print(f"imports: {result['imports']} (failed: {len(result['imports_failed'])}), median "
          f"{result['import_s_median']:.2f} s each; jobs succeeded: {result['jobs_succeeded']}")
    print(f"runs: {result['runs']} of {result['runs_expected']} expected; lost {result['lost']}, "
          f"extra {result['extra']}, duplicated ids {result['duplicate_run_ids']}, duplicated traces "
          f"{result['duplicate_hashes']}")
    for err in result["imports_failed"][:5] + result["worker_errors"]:
        print(f"  error: {err}")
    for who, w in result["waits"].items():
        print(f"  {who}'s waits in the queue: {w['count']}, p50 {w['p50_ms']:.0f} ms, p99 {w['p99_ms']:.0f} ms, "
              f"max {w['max_ms']:.0f} ms (of it for L at most {w['lock_max_ms']:.0f}); entries waited for: "
              + ", ".join(f"{n}: {c}" for n, c in w["waited_for"].items()))
    print("longest holds of the file (mode, file:function, count, p50, max ms):")
    for h in result["holds"][:8]:
        print(f"  {h['mode']} {h['site']}: {h['count']}, {h['p50_ms']:.0f}, {h['max_ms']:.0f}")
    print(f"page p99 <= {PAGE_P99_TARGET_MS:.0f} ms: {'met' if result['p99_ms'] <= PAGE_P99_TARGET_MS else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--reader"]:
        reader_main(argv[1], argv[2], argv[3], float(argv[4]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m db.studies.load", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the writers write (default 60)")
    ap.add_argument("--imports", type=int, default=4, help="parallel import loops (default 4)")
    ap.add_argument("--jobs", type=int, default=60, help="reference jobs queued for the worker (default 60)")
    ap.add_argument("--read-every-s", type=float, default=0.1, help="the reader's pause between page reads")
    ap.add_argument("--cpu-load", type=int, default=0, metavar="N",
                    help="N processes spinning at normal priority beside the mix for the window (default 0)")
    ap.add_argument("--own-sessions", action="store_true",
                    help="the reader, and the competing load, each in a session of its own (a dashboard service and "
                         "another user's job): a kernel with autogroup shares the CPU between sessions")
    ap.add_argument("--json", help="also write the figures to this file (X.json), and the raw logs beside it "
                                   "(X.SETTING.holds.log, .waits.log, .latencies.txt)")
    ap.add_argument("--baseline", action="store_true",
                    help="first run the same load without db/lock.py's ordering and without batch priority "
                         "(STEPWATCH_DB_LOCKS=0 STEPWATCH_BATCH_NICE=0), then as configured")
    args = ap.parse_args(argv)
    settings = [("baseline", {"STEPWATCH_DB_LOCKS": "0", "STEPWATCH_BATCH_NICE": "0"})] if args.baseline else []
    settings.append(("as configured", {}))
    results, ok = {}, True
    for label, env in settings:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            keep = f"{args.json.removesuffix('.json')}.{label.replace(' ', '-')}" if args.json else None
            result = run_benchmark(args.seconds, args.imports, args.read_every_s, args.jobs, args.cpu_load,
                                   args.own_sessions, keep)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        result["batch_nice"] = env.get("STEPWATCH_BATCH_NICE", os.environ.get("STEPWATCH_BATCH_NICE", "10"))
        print(f"== {label} (batch nice {result['batch_nice']})")
        _print(result)
        results[label] = result
        ok = ok and result["lost"] == result["extra"] == result["duplicate_run_ids"] == 0
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
