"""Benchmark: what proving a run's trace is its own (app/traces.py) costs the Run page. Not a test:
it prints figures, kept in app/BENCHMARKS.md.

    .venv/bin/python -m app.studies.trace_check [--repeat 5]

It imports two real bundles with the real command line into a temporary database: the tiny
preset's (a 60 KB trace) and the 30-step glm5 bundle of ingest/studies/benchmark_data with its
trace stored uncompressed (a large trace file, ~170 MB). Then it times the Run page of each through
AppTest, once the app's modules and cached queries are loaded: the large trace's first view (its
sha256 not yet known: the file is hashed) and the views after it (a stat per file), against the
tiny trace's page as the baseline in the same run; and,
alone, app.traces.list_trace_files on the large file, cold and warm, against hashlib's sha256 of
the same bytes read in one go.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app import traces
from db.store import open_db

ROOT = Path(__file__).resolve().parents[2]
BIG = ROOT / "ingest" / "studies" / "benchmark_data" / "big-glm5-fullpool-30steps"
TINY = ROOT / "tests" / "data" / "bundles" / "tiny-fused-eager-nostack"


def _import(db: Path, path: Path) -> int:
    done = subprocess.run([sys.executable, "-m", "ingest", "import", str(path), "--db", str(db)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def _big_bundle(where: Path) -> Path:
    """The glm5 bundle with its trace uncompressed: the same run, a large file to hash."""
    bundle = where / "big"
    bundle.mkdir()
    for name in ("key_averages.json",):
        shutil.copy(BIG / name, bundle / name)
    with gzip.open(BIG / "trace.json.gz") as src, open(bundle / "trace.json", "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    manifest = json.loads((BIG / "manifest.json").read_text())
    manifest["traces"] = ["trace.json"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def _page_s(db: Path, run_id: int):
    """A function that runs the Run page of `run_id` once in AppTest; its seconds."""
    from streamlit.testing.v1 import AppTest

    os.environ["STEPWATCH_DB"] = str(db)

    def once() -> float:
        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=600)
        at.switch_page("screens/run.py")
        at.query_params["run"] = str(run_id)
        t0 = time.perf_counter()
        at.run()
        seconds = time.perf_counter() - t0
        assert not at.exception and at.get("download_button"), "the page offers no trace"
        return seconds

    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        db = tmp / "s.duckdb"
        tiny_id = _import(db, Path(shutil.copytree(TINY, tmp / "tiny")))
        big_id = _import(db, _big_bundle(tmp))
        with open_db(db, read_only=True) as store:
            big = store.get_run(big_id)
        size_mb = big["trace_digests"][0]["bytes"] / 1e6

        t0 = time.perf_counter()
        with open(Path(big["trace_root"]) / "trace.json", "rb") as f:
            hashlib.sha256(f.read()).hexdigest()
        sha_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        found, _ = traces.list_trace_files(big["trace_root"], big["trace_digests"])
        cold_s = time.perf_counter() - t0
        assert found, "the large trace does not verify"
        warm = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            traces.list_trace_files(big["trace_root"], big["trace_digests"])
            warm.append(time.perf_counter() - t0)
        print(f"large trace {size_mb:.0f} MB: sha256 alone {sha_s:.2f} s; list_trace_files cold {cold_s:.2f} s "
              f"({cold_s / sha_s:.2f}x), warm {statistics.median(warm) * 1e3:.2f} ms")

        big_page, tiny_page = _page_s(db, big_id), _page_s(db, tiny_id)
        big_page(), tiny_page()  # untimed: the app's modules and its cached queries, as a running server has them
        cold = []
        for _ in range(args.repeat):
            traces._cached_sha256.cache_clear()  # the file's first view: its sha256 not yet known
            cold.append(big_page())
        warm = [big_page() for _ in range(args.repeat)]
        base = [tiny_page() for _ in range(args.repeat)]
        cold_s, warm_s, base_s = (statistics.median(t) for t in (cold, warm, base))
        print(f"Run page (AppTest), median of {args.repeat}: tiny trace {base_s:.2f} s (baseline); large trace, "
              f"its first view {cold_s:.2f} s ({cold_s / base_s:.2f}x), every view after {warm_s:.2f} s "
              f"({warm_s / base_s:.2f}x); first minus after {cold_s - warm_s:.2f} s")


if __name__ == "__main__":
    main()
