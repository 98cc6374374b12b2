"""Benchmark: the dashboard's queries and pages on a large database. Not a test: it prints
figures, kept in app/BENCHMARKS.md.

    .venv/bin/python -m app.studies.pages [--scale 1] [--queries-only] [--browser] [--keep PATH]

It writes a temporary DuckDB file (db.studies.synthetic: 10,000 runs, 2,000,000 kernel rows,
2,000 jobs; --scale K makes each repository's history K times as long: 10,000 K runs and
2,000,000 K kernel rows, each series K times as many runs). Then, for each page, it times the db.views calls that page makes on a cold cache,
each in its own read-only connection as app/data.py runs them (open + query + close), against
`SELECT count(*) FROM kernel_stats` as a baseline in the same run; then each
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
from db.studies.synthetic import count_kernel_rows, generate

ROOT = Path(__file__).resolve().parents[2]
SERIES = "repo1\tsglang\tNVIDIA H200"


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
    last_100 = tuple(views.get_trend(store, *series_args, 100)["run_id"].tolist())

    def trends(last, shown) -> list[list[tuple]]:  # app/screens/trends.py's three load_all batches
        return [[(views.count_runs,), (views.list_series,), (views.list_runs_without_commit,)],
                [(views.get_trend, *series_args, last), (views.list_series_changes, *series_args)],
                [(views.list_trend_breakdowns, shown), (views.get_run_spread, shown[0])]]

    batches = {
        "trends": trends(100, last_100),
        "trends (all)": trends(None, tuple(trend["run_id"].tolist())),
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
        baseline, _ = _time_ms(lambda: count_kernel_rows(store), repeat)
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
    parser.add_argument("--scale", type=int, default=1, metavar="K",
                        help="K times the commits of each repository (K x 10,000 runs; default 1)")
    parser.add_argument("--queries-only", action="store_true", help="time the queries only (no AppTest)")
    args = parser.parse_args(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-") as tmp:
        db = Path(args.keep) if args.keep else Path(tmp) / "bench.duckdb"
        if not db.exists():
            t0 = time.perf_counter()
            counts = generate(db, commits=500 * args.scale)
            print(f"generated {counts} in {time.perf_counter() - t0:.1f} s "
                  f"({db.stat().st_size / 2**20:.0f} MiB)")
        urls = time_queries(db, args.repeat)
        if not args.queries_only:
            time_pages_apptest(db, urls)
        if args.browser:
            time_pages_browser(db, urls)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
