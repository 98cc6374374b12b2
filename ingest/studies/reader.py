"""Benchmark: import of one large trace, timed side by side in one run against `json.load` of
the same file and against Holistic Trace Analysis (HTA). Not a test: it prints ratios.

    .venv/bin/python -m ingest.studies.reader TRACE.json.gz [--hta-python /path/to/venv/bin/python]

Each contender runs in a fresh Python process that reports its own wall time (after its
imports) and peak RSS (ru_maxrss), so one's memory cannot flatter another. stepwatch runs twice:
as it ships (a large trace is decoded by two processes) and with STEPWATCH_READ_PROCESSES=1 (one
process), the baseline for what the second process buys. The helper process's memory is
reported on its own: its peak RSS, and (from an untimed run that polls /proc) its peak private
memory, the part it does not share with the main process it was forked from. HTA runs under the
interpreter given by --hta-python (it is not a stepwatch dependency; install it in its own venv:
`python3 -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_REPORT = """
import json, resource, sys, time
def report(t0, **extra):
    print(json.dumps({"seconds": time.perf_counter() - t0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "helper_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                      **extra}))
"""

STEPWATCH = """
sys.path.insert(0, {root!r})
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from db.store import open_db
rules = load_rule_chain()
open_db({db!r}).close()  # an existing database, as imports usually find it (schema made, not timed)
t0 = time.perf_counter()
record = prepare_import({trace!r}, rules, ImportOptions())
with open_db({db!r}) as store:
    run_id, _ = store.insert_run(record)
k = record.kernel_stats
k = k.to_pandas() if hasattr(k, "to_dicts") else k  # a tree before issue 14: a DataFrame
report(t0, kernels=int(k["calls"].sum()), steps=record.steps, top=k.iloc[0]["name"][:60],
       top_calls=int(k.iloc[0]["calls"]))
"""

# Untimed: import once while a thread polls the helper's /proc/PID/smaps_rollup every 2 ms.
HELPER_MEMORY = """
import os, threading
sys.path.insert(0, {root!r})
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
peak = {{"private_mb": 0.0, "pss_mb": 0.0, "samples": 0}}
done = threading.Event()
def poll():
    me = str(os.getpid())
    while not done.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1] != me:
                    continue
                kb = {{}}
                for line in open(f"/proc/{{pid}}/smaps_rollup"):
                    parts = line.split()
                    if len(parts) == 3:
                        kb[parts[0].rstrip(":")] = int(parts[1])
            except (OSError, IndexError):
                continue
            peak["samples"] += 1
            peak["private_mb"] = max(peak["private_mb"], (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024)
            peak["pss_mb"] = max(peak["pss_mb"], kb["Pss"] / 1024)
        done.wait(0.002)
watcher = threading.Thread(target=poll)
watcher.start()
t0 = time.perf_counter()
prepare_import({trace!r}, load_rule_chain(), ImportOptions())
done.set()
watcher.join()
report(t0, **peak)
"""

JSON_LOAD = """
import gzip
t0 = time.perf_counter()
with gzip.open({trace!r}) as f:
    body = json.load(f)
report(t0, events=len(body["traceEvents"]))
"""

HTA = """
import logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
analyzer = TraceAnalysis(trace_dir={trace_dir!r})
kernel_type_df, kernel_df = analyzer.get_gpu_kernel_breakdown(visualize=False)
cast = kernel_df[kernel_df["name"].str.contains("LoadWithCast", regex=False)]
report(t0, kernel_types=kernel_type_df.to_dict(orient="records")[:4],
       cast_sum_us=float(cast["sum (us)"].sum()) if len(cast) else None)
"""


def run_contender(python: str, code: str, env: dict | None = None) -> dict:
    out = subprocess.run([python, "-c", _REPORT + code], capture_output=True, text=True, timeout=1800,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--hta-python", help="interpreter with holistictraceanalysis installed")
    p.add_argument("--repeat", type=int, default=3, help="runs of each contender; the median is kept")
    args = p.parse_args()
    trace = str(Path(args.trace).resolve())
    size_mb = os.path.getsize(trace) / 1e6
    results: dict[str, list[dict]] = {"stepwatch import": [], "stepwatch import, one process": [],
                                      "json.load": [], "HTA": []}
    with tempfile.TemporaryDirectory() as tmp:
        hta_dir = Path(tmp, "hta")
        hta_dir.mkdir()
        os.symlink(trace, hta_dir / "rank-0.trace.json.gz")
        for i in range(args.repeat):
            db = str(Path(tmp, f"bench{i}.duckdb"))
            results["stepwatch import"].append(
                run_contender(sys.executable, STEPWATCH.format(root=str(ROOT), trace=trace, db=db)))
            results["stepwatch import, one process"].append(run_contender(
                sys.executable, STEPWATCH.format(root=str(ROOT), trace=trace, db=db + ".one"),
                env={"STEPWATCH_READ_PROCESSES": "1"}))
            results["json.load"].append(run_contender(sys.executable, JSON_LOAD.format(trace=trace)))
            if args.hta_python:
                results["HTA"].append(run_contender(args.hta_python, HTA.format(trace_dir=str(hta_dir))))
        shutil.rmtree(hta_dir)
        helper = run_contender(sys.executable, HELPER_MEMORY.format(root=str(ROOT), trace=trace))

    def median(rows: list[dict], key: str) -> float | None:
        vals = sorted(r[key] for r in rows if key in r)
        return vals[len(vals) // 2] if vals else None

    ours = median(results["stepwatch import"], "seconds")
    print(f"trace: {Path(trace).name} ({size_mb:.1f} MB on disk), {args.repeat} runs each, median\n")
    print("| contender | seconds | peak RSS MB | stepwatch is faster by |")
    print("| --- | ---: | ---: | ---: |")
    for name, rows in results.items():
        if not rows:
            print(f"| {name} | not run | | |")
            continue
        if any("error" in r for r in rows):
            print(f"| {name} | error: {next(r['error'] for r in rows if 'error' in r)} | | |")
            continue
        secs, rss = median(rows, "seconds"), median(rows, "peak_rss_mb")
        ratio = "-" if name == "stepwatch import" else f"{secs / ours:.1f}x"
        print(f"| {name} | {secs:.2f} | {rss:.0f} | {ratio} |")
    if "error" in helper:
        print(f"\nhelper memory: error: {helper['error']}")
    else:
        rss = median(results["stepwatch import"], "helper_peak_rss_mb")
        print(f"\nhelper process: peak RSS {rss:.0f} MB (counting pages shared with the main process); "
              f"polled {helper['samples']} times: peak private {helper['private_mb']:.0f} MB, "
              f"peak PSS {helper['pss_mb']:.0f} MB")
    print("\nstepwatch:", {k: v for k, v in results["stepwatch import"][0].items() if k not in ("seconds", "peak_rss_mb")})
    if results["HTA"] and "error" not in results["HTA"][0]:
        print("HTA:", {k: v for k, v in results["HTA"][0].items() if k not in ("seconds", "peak_rss_mb")})


if __name__ == "__main__":
    main()
