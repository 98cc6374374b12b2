"""Benchmark: where the import of a large trace spends its CPU, and the least time two cores
could take for that work -- the measured reason behind issue 14's targets. Not a test: it prints
a table for ingest/BENCHMARKS.md.

    .venv/bin/python -m ingest.studies.floor TRACE.json.gz [TRACE.json.gz ...] [--repeat 3]

Build the traces first (`python -m ingest.studies.scale --mb 178,535 --repeat 1 --keep --dir D`).
For each trace, in one run, alternating, medians of `--repeat`:

- `json.load`: `python -c "json.load(gzip.open(TRACE))"`, the issue's baseline, a whole command;
- the import: `python -m ingest import TRACE --db DB` (DB made beforehand), a whole command: its
  wall time and the CPU time of it and its helper (user + system, from wait4 of the process;
  the helper is its child, reaped before it exits);
- the parts, each in a fresh process, CPU time of one core (time.process_time):
  `start` (a process that starts the interpreter and loads the import command's modules:
  ingest.commands, the reader, the analysis, DuckDB's engine; its whole CPU time), `inflate` (isal's igzip, the whole file in 1 MB reads), `parse`
  (msgspec decoding every piece into a struct with no fields: the JSON parsed and checked, no
  object made per event: what a decoder cannot go below), `decode` (the reader's typed events,
  as it decodes them), `code` (the reader's columns from those events, `_Columns.add`: the
  per-event work done in Python), `analyse` (analyse_trace) and `write` (insert_run into a fresh
  database file, the DuckDB instance included).

From those: `one-core work` = start + inflate + decode + code + analyse + write, and `two-core
bound` = (start + 2 x inflate + decode + code) / 2 + analyse + write: the import as it runs (its
reader's helper starts while the command loads its modules, `trace_read.start_early`; each of the
two processes inflates the whole file; the events are shared) with perfect overlap on two cores,
and the analysis and the write after the read, on one. `if the coding were free` drops `code`:
the bound of a compiled per-event coder. The issue's targets are json.load / 8 (179 MB) and json.load / 10 (537 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Each part in a fresh process; it prints {"cpu_s": ...}. The trace's pieces are cut as the reader
# cuts them (trace_read._scan), so every part sees the same events.
_PART = r"""
import json, sys, time
part, path, db = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.process_time()
if part == "start":  # (its CPU is the whole process's: the interpreter's start included)
    import ingest.commands, ingest.traces.importer, ingest.traces.analyse, db.engine  # noqa
    print(json.dumps({}))
    sys.exit()
from pathlib import Path
import msgspec
from isal import igzip
from ingest.traces import trace_read as tr
if part == "inflate":
    t0 = time.process_time()
    with igzip.open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    print(json.dumps({"cpu_s": time.process_time() - t0}))
    sys.exit()
class Nothing(msgspec.Struct):
    pass
parse_only = msgspec.json.Decoder(list[Nothing])
pieces = {"n": 0}
spent = {"parse": 0.0, "decode": 0.0, "code": 0.0}
cols = tr._Columns(Path(path), tr.DEFAULT_LIMITS)
def on_piece(number, buf, start, end):
    pieces["n"] += 1
    t = time.process_time()
    if part == "parse":
        tr._decode_in_place(buf, start, end, parse_only.decode)
        spent["parse"] += time.process_time() - t
        return True
    events = tr._decode_in_place(buf, start, end, tr._DECODER.decode)
    t1 = time.process_time()
    spent["decode"] += t1 - t
    if part in ("code", "analyse", "write"):
        cols.add(events, number)
        spent["code"] += time.process_time() - t1
    return True
def on_last(number, text):
    events = tr._DECODER.decode(text)
    if part in ("code", "analyse", "write"):
        cols.add(events, number)
header = tr._scan(Path(path), tr.CHUNK_BYTES, on_piece, on_last)
out = {"pieces": pieces["n"], "cpu_s": spent.get(part, 0.0)}
if part in ("analyse", "write"):
    from ingest.traces.analyse import analyse_trace
    from ingest.traces.categories import load_rule_chain
    trace = tr._finish(cols, Path(path), header)
    rules = load_rule_chain()
    t = time.process_time()
    figures = analyse_trace(trace, rules)
    out["cpu_s"] = time.process_time() - t
    if part == "write":
        from ingest.traces.importer import ImportOptions, build_record, hash_traces
        from db.store import open_db, run_tables
        record = build_record(Path(path), [Path(path)], [figures], None, ImportOptions(), hash_traces([Path(path)]))
        tables = run_tables(record)
        t = time.process_time()
        w = time.perf_counter()
        with open_db(db) as store:
            store.insert_run(record, tables)
        out["cpu_s"], out["wall_s"] = time.process_time() - t, time.perf_counter() - w
print(json.dumps(out))
"""

PARTS = ("start", "inflate", "parse", "decode", "code", "analyse", "write")


def _command(argv: list[str], cwd: Path = ROOT) -> dict:
    """Wall time of a whole command and the CPU of it and its reaped children."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "out": out.decode()}


def measure(trace: Path, repeat: int, work: Path) -> dict:
    py = sys.executable
    runs: dict[str, list] = {"json_load": [], "import_wall": [], "import_cpu": [], **{p: [] for p in PARTS}}
    for i in range(repeat):
        runs["json_load"].append(_command([py, "-c", "import gzip, json, sys; json.load(gzip.open(sys.argv[1]))",
                                           str(trace)])["wall_s"])
        db = work / f"import-{i}.duckdb"
        _command([py, "-m", "ingest", "samples", "--db", str(db)])  # a database that exists, as imports find one
        done = _command([py, "-m", "ingest", "import", str(trace), "--db", str(db)])
        runs["import_wall"].append(done["wall_s"])
        runs["import_cpu"].append(done["cpu_s"])
        for part in PARTS:
            part_db = work / f"part-{i}-{part}.duckdb"
            done = _command([py, "-c", _PART, part, str(trace), str(part_db)])
            figures = json.loads(done["out"].strip().splitlines()[-1])
            runs[part].append(done["cpu_s"] if part == "start" else figures["cpu_s"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    one_core = sum(med[p] for p in ("start", "inflate", "decode", "code", "analyse", "write"))
    two_core = (med["start"] + 2 * med["inflate"] + med["decode"] + med["code"]) / 2 + med["analyse"] + med["write"]
    free_code = two_core - med["code"] / 2
    mb = _json_mb(trace)
    return {"trace": trace.name, "json_mb": mb, "median": med, "runs": runs, "one_core_s": one_core,
            "two_core_bound_s": two_core, "bound_if_coding_free_s": free_code}


def _json_mb(trace: Path) -> float:
    from isal import igzip

    n = 0
    with igzip.open(trace, "rb") as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n / 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.floor", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="stepwatch-floor-") as work:
        for trace in args.traces:
            result = measure(trace, args.repeat, Path(work))
            results.append(result)
            print(json.dumps(result), flush=True)
    print(f"\n{args.repeat} runs of each, medians; CPU seconds of one core for the parts\n")
    print("| trace | json.load s | target s | import s (CPU s) | start | inflate | parse | decode | code | analyse "
          "| write | one core | two-core bound | if the coding were free |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        m = r["median"]
        target = m["json_load"] / (8 if r["json_mb"] < 300 else 10)
        print(f"| {r['json_mb']:.0f} MB | {m['json_load']:.2f} | {target:.2f} | {m['import_wall']:.2f} "
              f"({m['import_cpu']:.2f}) | " + " | ".join(f"{m[p]:.2f}" for p in PARTS)
              + f" | {r['one_core_s']:.2f} | {r['two_core_bound_s']:.2f} | {r['bound_if_coding_free_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
