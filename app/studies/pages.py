"""Benchmark: the dashboard's queries and pages on a large database. Not a test: it prints
figures, kept in app/BENCHMARKS.md.

    .venv/bin/python -m app.studies.pages [--runs-scale 1] [--browser] [--keep PATH]

It writes a temporary DuckDB file through the real migrations and fills it with plain SQL over
generated rows: 2 repositories x 500 commits x 2 variants x 5 workloads = 10,000 runs (every
hundredth without a commit), 200 kernels each (2,000,000 kernel rows), 10 steps of 8 categories
each, and 2,000 jobs. Then, for each page, it times the db.views calls that page makes on a
cold cache, each in its own read-only connection as app/data.py runs them (open + query +
close), against `SELECT count(*) FROM kernel_stats` as a baseline in the same run; then each
page's whole script through AppTest (cold and warm cache); and with --browser, the time until
each page's last element is visible in headless chromium (a fresh page load, cold and warm).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from db import views
from db.store import open_db

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = ["gemm", "attention", "cast", "memcpy", "moe", "norm", "elementwise", "communication"]
SERIES = "repo1\tsglang\tNVIDIA H200"

# the generated rows, as plain SQL over range(); each statement takes its sizes as ? parameters
_GENERATE = [
    ("repos", "INSERT INTO repos (repo_id, name) SELECT r, 'repo' || r FROM range(1, ? + 1) t(r)", ("repos",)),
    ("commits",
     "INSERT INTO commits (commit_id, repo_id, sha, committed_at, author, subject, seq)"
     " SELECT (r - 1) * ? + s, r, md5('c' || r || '-' || s) || left(md5('d' || s), 8),"
     "  TIMESTAMP '2026-01-01' + to_hours(s::BIGINT), 'author ' || (s % 7),"
     "  'subject of commit ' || s || ' in repo ' || r, s"
     " FROM range(1, ? + 1) a(r), range(1, ? + 1) b(s)", ("commits", "repos", "commits")),
    ("runs",
     "INSERT INTO runs (run_id, content_hash, repo_id, commit_id, variant, engine, workload, device_name,"
     " peak_gbps, ranks, steps, step_method, step_ms_median, tok_per_s, layers, copy_share, gpu_busy_share,"
     " kernel_us_total, kernels_from_cpu_ops, source_path, workload_key, batch_size, timing_ms_median,"
     " timing_ms_p10, timing_ms_p90)"
     " SELECT id, md5('run' || id), c.repo_id, CASE WHEN id % 100 = 0 THEN NULL ELSE c.commit_id END,"
     "  CASE WHEN v = 0 THEN 'unpatched' ELSE 'patched' END, 'sglang',"
     "  '{\"model_path\": \"glm5\", \"batch_size\": ' || (1 << w) || ', \"tp\": 8}', 'NVIDIA H200', 4800, 1, ?,"
     "  'graph-launch', 95 - 60 * v + w + (id % 13) * 0.1, 1000.0 * (1 << w) / (90 - 60 * v + w),"
     "  78, 0.69 - 0.6 * v, 0.95, 1e6, false, '/data/bench/run' || id,"
     "  '{\"batch_size\": ' || (1 << w) || ', \"model_path\": \"glm5\", \"tp\": 8}', 1 << w,"
     "  90 - 60 * v + w + (id % 13) * 0.1, 89 - 60 * v + w, 92 - 60 * v + w"
     " FROM (SELECT ((commit_id - 1) * 2 + v) * ? + w + 1 AS id, commit_id, v, w"
     "       FROM commits, range(2) a(v), range(?) b(w)) g JOIN commits c USING (commit_id)"
     " ORDER BY id", ("steps", "workloads", "workloads")),
    ("kernel_stats",
     "INSERT INTO kernel_stats (run_id, rank, name, category, launcher, source, calls, calls_per_step, total_us,"
     " mean_us, median_us, p90_us, min_us, max_us, ms_per_step, share, bytes_per_call, gbps, peak_fraction)"
     " SELECT run_id, 0, 'void at::native::some_templated_kernel<' || k || ', float, 128>(long, char*)',"
     "  ?[1 + k % 8], 'aten::op' || (k % 20), 'model.py(' || (100 + k) || '): forward',"
     "  780, 78, 780 * (1 + k % 17) * 3.0, (1 + k % 17) * 3.0, (1 + k % 17) * 3.0, (1 + k % 17) * 3.3,"
     "  (1 + k % 17) * 2.9, (1 + k % 17) * 3.9, 78 * (1 + k % 17) * 3.0 / 1000, (1 + k % 17) / 1800.0,"
     "  CASE WHEN k % 8 IN (2, 3) THEN 1e6 END, CASE WHEN k % 8 IN (2, 3) THEN 3000.0 END,"
     "  CASE WHEN k % 8 IN (2, 3) THEN 0.625 END"
     " FROM runs, range(?) t(k) ORDER BY run_id, k", ("category_list", "kernels")),
    ("steps",
     "INSERT INTO steps (run_id, rank, step, wall_us, gpu_busy_us, kernel_us)"
     " SELECT run_id, 0, s, 95000 + s, 90000, 90000 FROM runs, range(?) t(s) ORDER BY run_id, s", ("steps",)),
    ("step_categories",
     "INSERT INTO step_categories (run_id, rank, step, category, dur_us)"
     " SELECT run_id, 0, s, ?[1 + c], 10000 + 1000 * c FROM runs, range(?) t(s), range(8) u(c)"
     " ORDER BY run_id, s, c", ("category_list", "steps")),
    ("jobs",
     "INSERT INTO jobs (job_id, spec, label, status, run_id, steps_done, steps_planned, log, finished_at,"
     " started_at, heartbeat_at, batch)"
     " SELECT j, '{}', 'sglang glm5 job ' || j, CASE WHEN j > ? - 20 THEN 'queued' WHEN j > ? - 25 THEN"
     "  'running' ELSE 'succeeded' END, CASE WHEN j <= ? - 25 THEN j END, 5, 30, repeat('log line\n', 200),"
     "  current_timestamp, current_timestamp, current_timestamp, 'bench'"
     " FROM range(1, ? + 1) t(j)", ("jobs", "jobs", "jobs", "jobs")),
]


def generate(path: Path, *, repos: int = 2, commits: int = 500, workloads: int = 5, kernels: int = 200,
             steps: int = 10, jobs: int = 2000) -> dict[str, int]:
    sizes = {"repos": repos, "commits": commits, "workloads": workloads, "kernels": kernels, "steps": steps,
             "jobs": jobs, "category_list": CATEGORIES}
    with open_db(path) as store:
        for _, sql, params in _GENERATE:
            store.con.execute(sql, [sizes[p] for p in params])
        store.con.execute("CHECKPOINT")
        return store.count_rows()


def _time_ms(fn, repeat: int) -> tuple[float, float]:
    """(median, fastest) of `repeat` timings in ms: on a shared machine the fastest is the cost
    without interference, the median what a page meets."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), min(times)


def _page_batches(store) -> tuple[dict[str, list[list[tuple]]], dict[str, str]]:
    """Each page's db.views calls on its first load, in the batches (one connection each) that
    the page makes them in, and the page's URL with those arguments."""
    series = views.list_series(store).iloc[0]
    series_args = (series.repo, series.engine, series.device, series.workload_id)
    trend = views.get_trend(store, *series_args)
    run_a, run_b = int(trend["run_id"].iloc[-3]), int(trend["run_id"].iloc[-1])
    batches = {
        "trends": [[(views.count_runs,), (views.list_series,), (views.list_runs_without_commit,)],
                   [(views.get_trend, *series_args, 100)]],
        "trends (all)": [[(views.count_runs,), (views.list_series,), (views.list_runs_without_commit,)],
                         [(views.get_trend, *series_args, None)]],
        "run": [[(views.list_recent_runs,), (views.get_run_detail, run_b)]],
        "compare": [[(views.get_comparison, run_a, run_b)]],
        "compare (no URL)": [[(views.get_comparison, None, None)]],
        "run_benchmark": [[(views.list_jobs,)]],
    }
    urls = {"trends": ("trends", "/"), "trends (all)": ("trends", "/?last=all"), "run": ("run", f"/run?run={run_b}"),
            "compare": ("compare", f"/compare?a={run_a}&b={run_b}"), "compare (no URL)": ("compare", "/compare"),
            "run_benchmark": ("run_benchmark", "/run_benchmark")}
    return batches, urls


def _run_batch(db: Path, batch: list[tuple]) -> None:
    with open_db(db, read_only=True) as store:
        for view, *args in batch:
            view(store, *args)


def time_queries(db: Path, repeat: int) -> dict:
    """Each query alone (in an open connection), and each page's batches as the app runs them
    on a cold cache (open + queries + close per batch); medians and fastest of `repeat`."""
    with open_db(db, read_only=True) as store:
        batches, urls = _page_batches(store)
        baseline, _ = _time_ms(lambda: store.con.execute("SELECT count(*) FROM kernel_stats").fetchall(), repeat)
    connect, connect_min = _time_ms(lambda: open_db(db, read_only=True).close(), repeat)
    print(f"\nbaseline SELECT count(*) FROM kernel_stats: {baseline:.2f} ms; open + close a read-only "
          f"connection: {connect:.2f} ms (fastest {connect_min:.2f}); medians of {repeat}")
    print(f"{'page':<17} {'query':<28} {'ms':>8} {'x base':>8} {'fastest':>8}")
    for page, page_batches in batches.items():
        for batch in page_batches:
            with open_db(db, read_only=True) as store:
                for view, *args in batch:
                    ms, fastest = _time_ms(lambda: view(store, *args), repeat)
                    print(f"{page:<17} {view.__name__:<28} {ms:8.2f} {ms / baseline:8.1f} {fastest:8.2f}")
        each = [_time_ms(lambda: _run_batch(db, batch), repeat) for batch in page_batches]
        print(f"{page:<17} {len(page_batches)} connection(s), all queries: {sum(m for m, _ in each):.2f} ms "
              f"(fastest {sum(f for _, f in each):.2f})")
    return urls


def time_pages_apptest(db: Path, urls: dict) -> dict:
    """Each page's whole script (queries, frames, charts) through AppTest: cold, then warm cache."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["STEPWATCH_DB"] = str(db)
    out = {}
    for page, (screen, url) in urls.items():
        params = dict(p.split("=") for p in url.partition("?")[2].split("&") if p)
        times = []
        for _ in ("cold", "warm"):
            if not times:
                st.cache_data.clear()
            at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
            at.switch_page(f"screens/{screen}.py")
            for key, value in params.items():
                at.query_params[key] = value
            t0 = time.perf_counter()
            at.run()
            times.append((time.perf_counter() - t0) * 1000)
            assert not at.exception, at.exception
        out[page] = tuple(times)
        print(f"AppTest {page:<17} cold {times[0]:8.1f} ms   warm {times[1]:8.1f} ms")
    return out


# a page is interactive when its last section is shown and its first chart has drawn its marks
_LAST_ELEMENT = {"trends": "Runs without a commit", "run": "Trace", "compare": "Kernels that changed",
                 "run_benchmark": "Finished jobs"}
_HAS_CHART = {"trends", "run", "compare"}
_CHART_MARK = ('[data-testid="stVegaLiteChart"] svg [role="graphics-symbol"], '
               '[data-testid="stVegaLiteChart"] canvas')  # Vega draws large charts on a canvas


def time_pages_browser(db: Path, urls: dict) -> dict:
    """Fresh page loads in headless chromium until the page's last section is visible."""
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "STEPWATCH_DB": str(db)}
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
                            "--server.port", str(port), "--server.address", "127.0.0.1",
                            "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {}
    try:
        import urllib.request

        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
        with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
            context = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium",
                                                           headless=True, args=args,
                                                           viewport={"width": 1500, "height": 1100})
            page = context.new_page()
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/run?run=1")  # the frontend's files fetched once (run 1 is not timed)
            page.get_by_text("Trace", exact=True).wait_for(timeout=60_000)
            print(f"browser first start (frontend files, run 1) {(time.perf_counter() - t0) * 1000:8.1f} ms")
            for name, (screen, url) in urls.items():
                times = []
                for _ in ("cold", "warm"):
                    t0 = time.perf_counter()
                    page.goto(f"http://127.0.0.1:{port}{url}")
                    page.get_by_text(_LAST_ELEMENT[screen], exact=True).first.wait_for(timeout=60_000)
                    if screen in _HAS_CHART:
                        page.locator(_CHART_MARK).first.wait_for(timeout=60_000)
                    times.append((time.perf_counter() - t0) * 1000)
                out[name] = tuple(times)
                print(f"browser {name:<17} cold {times[0]:8.1f} ms   warm {times[1]:8.1f} ms")
            context.close()
    finally:
        app.terminate()
        app.wait(timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.studies.pages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15, help="timings per query (median and fastest kept)")
    parser.add_argument("--browser", action="store_true", help="also time page loads in headless chromium")
    parser.add_argument("--keep", metavar="PATH", help="write the database here and keep it")
    args = parser.parse_args(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-") as tmp:
        db = Path(args.keep) if args.keep else Path(tmp) / "bench.duckdb"
        if not db.exists():
            t0 = time.perf_counter()
            counts = generate(db)
            print(f"generated {counts} in {time.perf_counter() - t0:.1f} s "
                  f"({db.stat().st_size / 2**20:.0f} MiB)")
        urls = time_queries(db, args.repeat)
        time_pages_apptest(db, urls)
        if args.browser:
            time_pages_browser(db, urls)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
