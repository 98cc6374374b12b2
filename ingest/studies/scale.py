"""Benchmark: the import command as a user types it, on traces of ~50, ~178 and ~535 MB built from
the real H200 capture kept in ingest/studies/benchmark_data/, each timed against `json.load` of the same
file in the same run. Not a test: it prints a table, ratios and the slope per 100 MB.

    .venv/bin/python -m ingest.studies.scale [--mb 50,178,535] [--repeat 3] [--keep]
    .venv/bin/python -m ingest.studies.scale --ranks 8 [--rank-steps 30] [--repeat 3]

The second form (issue 14: the ranks of a directory read at once) writes a directory of 8
per-rank traces of the capture's 30 steps (~162 MB of JSON, 10.5 MB gzipped, each; the capture
with a `distributedInfo` rank in its header, named `...-TP-<rank>.trace.json.gz`), checks that
every rank's figures are the capture's and identical whether the ranks are read at once or rank
after rank, then times `python -m ingest import DIR` against the import of one of its files
alone, and with STEPWATCH_READ_PROCESSES=1 (everything in one process), each a whole command with
its peak PSS summed over all its processes; the directory is deleted at the end.

Building a larger trace (`build_scaled_trace`). The capture holds 30 profiled steps. Every event
is given to a step: a host event (op, Python frame, runtime call, annotation) to the step whose
ProfilerStep#N span started last at or before it (events before the first step go to the first),
a GPU event and a flow arrow to the step of the runtime call that launched it (through the
correlation id), a GPU copy of ProfilerStep#N to step N. A trace of S steps is then copy 0 of
steps 1..30, copy 1 of steps 1..30, ... and a last, partial copy of steps 1..(S mod 30). Copy c
is the original shifted: timestamps by c periods (the whole capture's span, rounded up, plus a
millisecond, so copies never overlap), correlation and flow ids, External ids, Ev Idx and Python
ids by c times (their largest value + 1), and ProfilerStep#N renamed ProfilerStep#(N + 30c); so
every repeated step is a new, valid step. Each event's text is kept byte for byte except those
numbers (Kineto's layout and every arg stay); the header, the trailing keys, the metadata events
and the profiler's own span appear once. Only integer parts change: no float is rounded.

What its import must answer is derivable: each GPU kernel's calls and total time are the sums,
over the steps written, of its calls and time in the source step, which for whole copies is
(copies) x torch's key_averages() of the capture (`expected_kernels`, checked against
key_averages.json in the run).

Measuring. Each contender is a whole command in a fresh process, started from here and timed
here (wall clock from spawn to exit, the interpreter's start and imports included):
`python -m ingest import TRACE --db DB` (DB made beforehand, as imports usually find one) and
`python -c "json.load(gzip.open(TRACE))"`. Runs alternate contenders; the median of each is kept,
and each ratio is of medians from the same run. Memory comes from separate, untimed runs, in
which a thread here polls /proc/PID/smaps_rollup of the command and all its descendants every
5 ms and keeps the peak of their summed PSS (proportional set size: a page shared by the importer
and its forked helper counts half to each, so the sum is the memory the command really holds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from isal import igzip

from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, analyse_files, find_traces, prepare_import
from ingest.traces.rank_pool import json_sizes, rank_workers

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "ingest" / "studies" / "benchmark_data" / "big-glm5-fullpool-30steps"
GPU_CATS = (b"kernel", b"gpu_memcpy", b"gpu_memset")
# numbers shifted in each copy: (key as written, which id space it belongs to)
_NUMBER = re.compile(rb'"(ts|correlation|External id|Ev Idx|Python id|Python parent id|id)": (\d+)'
                     rb'|(ProfilerStep#)(\d+)')
_SPACE = {b"ts": "ts", b"correlation": "corr", b"id": "corr", b"External id": "ext", b"Ev Idx": "ev",
          b"Python id": "py", b"Python parent id": "py", b"ProfilerStep#": "step"}


class _Args(msgspec.Struct):
    correlation: int | None = None


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    id: int | str | None = None
    args: _Args = msgspec.field(default_factory=_Args)


class _Parsed(msgspec.Struct):
    traceEvents: list[_Event]


class _Raws(msgspec.Struct):
    traceEvents: list[msgspec.Raw]


@dataclass(frozen=True)
class Source:
    """The capture, cut into per-event templates, with each event's step."""

    head: bytes  # the file up to and including `"traceEvents": [` and the whitespace after it
    tail: bytes  # from the end of the last event to the end of the file
    separator: bytes  # between two events, as the file writes it
    literals: list[list[bytes]]  # per event: the text around its shifted numbers
    numbers: list[list[tuple[str, int]]]  # per event: (id space, value) of each shifted number
    owner: np.ndarray  # step index (0-based) of each event, -1: written once (metadata, profiler span)
    steps: int
    shift: dict  # id space -> what one copy adds
    kernel_name: list  # GPU events: name, else None
    kernel_dur_us: np.ndarray  # GPU events' durations (0 elsewhere)
    json_bytes: int  # the capture's size


def read_source(path: Path = CAPTURE / "trace.json.gz") -> Source:
    with igzip.open(path, "rb") as f:
        data = f.read()
    events = msgspec.json.decode(data, type=_Parsed).traceEvents
    raws = msgspec.json.decode(data, type=_Raws).traceEvents
    first, last = bytes(raws[0]), bytes(raws[-1])
    head_end = data.index(first)
    tail_start = data.rindex(last) + len(last)
    second_at = data.index(bytes(raws[1]), head_end + len(first))
    separator = data[head_end + len(first) : second_at]
    marks = sorted((e.ts, int(e.name.split("#")[1])) for e in events
                   if e.cat == "user_annotation" and e.name.startswith("ProfilerStep#"))
    starts = np.array([ts for ts, _ in marks])
    first_step = marks[0][1]
    ts = np.array([e.ts for e in events])
    owner = np.clip(np.searchsorted(starts, ts, "right") - 1, 0, len(starts) - 1)
    launch_owner = {}
    for i, e in enumerate(events):
        if e.cat in ("cuda_runtime", "cuda_driver") and e.args.correlation not in (None, -1):  # -1: absent
            launch_owner[e.args.correlation] = owner[i]
    kernel_name: list = [None] * len(events)
    kernel_dur = np.zeros(len(events))
    for i, e in enumerate(events):
        cat = e.cat.encode()
        if cat in GPU_CATS and e.ph == "X":
            owner[i] = launch_owner.get(e.args.correlation, owner[i])
            kernel_name[i], kernel_dur[i] = e.name, e.dur
        elif e.ph in ("s", "f") and isinstance(e.id, int) and e.id in launch_owner:
            owner[i] = launch_owner[e.id]
        elif e.cat == "gpu_user_annotation" and e.name.startswith("ProfilerStep#"):
            owner[i] = int(e.name.split("#")[1]) - first_step
        if e.ph in ("M", "i") or e.cat == "Trace":
            owner[i] = -1
    literals, numbers = [], []
    top = {"corr": 0, "ext": 0, "ev": 0, "py": 0}
    for raw in raws:
        text = bytes(raw)
        lits, nums, at = [], [], 0
        for m in _NUMBER.finditer(text):
            key, digits = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            space = _SPACE[key]
            start = m.start(2) if m.group(1) else m.start(4)
            lits.append(text[at:start])
            value = int(digits)
            nums.append((space, value))
            if space in top:
                top[space] = max(top[space], value)
            at = m.end()
        lits.append(text[at:])
        literals.append(lits)
        numbers.append(nums)
    ends = ts + np.array([e.dur for e in events])
    span_us = float(ends.max() - ts.min())
    shift = {k: v + 1 for k, v in top.items()}
    shift["ts"] = int(np.ceil(span_us)) + 1000
    shift["step"] = len(starts)
    return Source(data[:head_end], data[tail_start:], separator, literals, numbers, owner, len(starts), shift,
                  kernel_name, kernel_dur, len(data))


def build_scaled_trace(src: Source, steps: int, out: Path) -> dict:
    """Write a trace of `steps` profiled steps to `out` (.json.gz); return its expected kernel
    figures {name: [calls, total_us]}."""
    copies, partial = divmod(steps, src.steps)
    plan = [src.steps] * copies + ([partial] if partial else [])
    with igzip.open(out, "wb", compresslevel=1) as f:
        f.write(src.head)
        first = True
        for c, upto in enumerate(plan):
            delta = {k: v * c for k, v in src.shift.items()}
            keep = np.flatnonzero((src.owner < upto) & ((src.owner >= 0) | (c == 0)))
            parts = []
            for i in keep.tolist():
                lits, nums = src.literals[i], src.numbers[i]
                pieces = [lits[0]]
                for (space, value), lit in zip(nums, lits[1:]):
                    pieces.append(b"%d" % (value + delta[space]))
                    pieces.append(lit)
                parts.append(b"".join(pieces))
            if parts:
                f.write((b"" if first else src.separator) + src.separator.join(parts))
                first = False
        f.write(src.tail)
    return expected_kernels(src, plan)


def expected_kernels(src: Source, plan: list[int]) -> dict:
    """{kernel name: [calls, total_us]} of a trace written with `plan` (steps of each copy)."""
    out: dict = {}
    gpu = np.flatnonzero(np.array([n is not None for n in src.kernel_name]))
    for upto in plan:
        for i in gpu[src.owner[gpu] < upto].tolist():
            row = out.setdefault(src.kernel_name[i], [0, 0.0])
            row[0] += 1
            row[1] += float(src.kernel_dur_us[i])
    return out


# -- measuring -------------------------------------------------------------------------------

def _tree(root: int) -> list[int]:
    """root and every process descended from it."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_command(argv: list[str], poll_memory: bool = False, cwd: Path = ROOT, env: dict | None = None) -> dict:
    """Run argv to its end: wall seconds, and (poll_memory) the peak summed PSS of its tree and
    the most processes it had at once."""
    peak = {"pss_mb": 0.0, "processes": 1}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env} if env else None)
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            pids = _tree(proc.pid)
            peak["pss_mb"] = max(peak["pss_mb"], sum(_pss_mb(p) for p in pids))
            peak["processes"] = max(peak["processes"], len(pids))
            done.wait(0.005)

    watcher = threading.Thread(target=poll) if poll_memory else None
    if watcher:
        watcher.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    if watcher:
        watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    return {"seconds": seconds, **peak}


def _kernel_deviation(stats, expected: dict, where: str) -> float:
    """Each kernel's calls and total time (summed by name) against `expected` {name: (calls,
    total_us)}: raises on other names or calls; the largest relative deviation of a total."""
    if hasattr(stats, "to_dicts"):  # an import's columnar table (ingest/traces/table.py)
        stats = stats.to_pandas()
    got = stats.groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"))
    if set(got.index) != set(expected):
        raise AssertionError(f"{where}: kernel names differ from the expected ones")
    worst = 0.0
    for name, row in got.iterrows():
        calls, total = expected[name]
        if row.calls != calls:
            raise AssertionError(f"{where}: {name[:60]}: {row.calls} calls, expected {calls}")
        worst = max(worst, abs(row.total_us - total) / max(total, 1e-12))
    return worst


def check_figures(trace: Path, expected: dict) -> tuple[int, float]:
    """Import `trace` in this process (untimed) and compare each kernel's calls and total time
    with `expected`: (kernels compared, largest relative deviation of a total)."""
    stats = prepare_import(trace, load_rule_chain(), ImportOptions()).kernel_stats
    worst = _kernel_deviation(stats, expected, str(trace))
    if worst > 1e-9:
        raise AssertionError(f"{trace}: a kernel's total time deviates by {worst:.2e}")
    return len(expected), worst


def _make_db(path: str, tree: Path) -> None:
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r}); "
                    f"from db.store import open_db; open_db({path!r}).close()"], check=True, cwd=tree)


JSON_LOAD = "import gzip, json, sys; json.load(gzip.open(sys.argv[1]))"


# -- a directory of per-rank traces (issue 14: ranks read at once) ---------------------------

def as_rank(src: Source, rank: int, world: int) -> Source:
    """The capture as rank `rank` of `world` would write it: with torch's `distributedInfo` key
    first in its header (the rest byte for byte)."""
    brace = src.head.index(b"{") + 1
    info = b'\n  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d},' % (rank, world)
    return dataclasses.replace(src, head=src.head[:brace] + info + src.head[brace:])


def build_rank_directory(src: Source, ranks: int, steps: int, out: Path) -> tuple[list[Path], dict]:
    """Write `ranks` traces of `steps` steps each to directory `out`, named as SGLang's server
    names per-rank traces (`...-TP-<rank>.trace.json.gz`); (the files, every rank's expected kernel
    figures {name: [calls, total_us]}, the same for each rank)."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"scaled-{steps}steps-TP-{rank}.trace.json.gz" for rank in range(ranks)]
    first = as_rank(src, 0, ranks)
    expected = build_scaled_trace(first, steps, files[0])
    body = igzip.decompress(files[0].read_bytes())[len(first.head):]
    for rank, path in enumerate(files[1:], 1):  # the same events after another rank's header
        path.write_bytes(igzip.compress(as_rank(src, rank, ranks).head + body, compresslevel=1))
    return files, expected


def check_rank_figures(directory: Path, expected: dict) -> dict:
    """Import `directory` in this process (untimed), as the command does (ranks read at once)
    and rank after rank in this process: every rank's figures must be identical both ways, and
    each kernel's calls and total time must equal `expected`."""
    import pandas as pd

    files, _, _ = find_traces(directory)
    rules = load_rule_chain()
    workers = rank_workers(json_sizes(files))
    at_once = analyse_files(files, rules, None)
    in_turn = analyse_files(files, rules, None, workers=1)
    worst = 0.0
    for a, b in zip(at_once, in_turn, strict=True):
        if a.rank != b.rank or a.notes != b.notes or a.steps != b.steps:
            raise AssertionError(f"rank {a.rank}: read at once and in turn differ")
        for table in ("kernel_stats", "step_table", "step_categories"):
            pd.testing.assert_frame_equal(getattr(a, table).to_pandas(), getattr(b, table).to_pandas())
        for arr in ("comm_start_us", "comm_end_us", "comm_step"):
            if not np.array_equal(getattr(a, arr), getattr(b, arr)):
                raise AssertionError(f"rank {a.rank}: {arr} differs")
        worst = max(worst, _kernel_deviation(a.kernel_stats, expected, f"rank {a.rank}"))
    if worst > 1e-9:
        raise AssertionError(f"a kernel's total time deviates by {worst:.2e}")
    return {"ranks": [f.rank for f in at_once], "workers": workers, "kernels": len(expected),
            "largest_deviation": worst}


def rank_benchmark(src: Source, work: Path, trees: dict[str, Path], ranks: int, steps: int, repeat: int,
                   check: bool) -> dict:
    """Time `python -m ingest import DIR` (DIR: `ranks` per-rank traces of `steps` steps) against
    the import of one of its files alone, each a whole command from here; with
    STEPWATCH_READ_PROCESSES=1 too (every rank in one process: what one core does)."""
    need = 2 * ranks * src.json_bytes // 10  # the traces gzipped (~16x) with room to spare
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(f"{work}: {free / 1e9:.1f} GB free, the rank traces need ~{need / 1e9:.1f} GB")
    directory = work / f"ranks-{ranks}x{steps}"
    files, expected = build_rank_directory(src, ranks, steps, directory)
    with igzip.open(files[0], "rb") as f:
        rank_json_mb = sum(len(b) for b in iter(lambda: f.read(1 << 24), b"")) / 1e6
    result = {"ranks": ranks, "steps": steps, "rank_json_mb": rank_json_mb,
              "stored_mb": sum(f.stat().st_size for f in files) / 1e6, "cpus": len(os.sched_getaffinity(0)),
              "checked": None, "contenders": {}}
    if check:
        expected_path = work / "expected-ranks.json"
        expected_path.write_text(json.dumps(expected))
        out = subprocess.run([sys.executable, "-m", "ingest.studies.scale", "--check-ranks", str(directory),
                              str(expected_path)], cwd=list(trees.values())[-1], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"figures of {directory} are not the expected ones: {out.stderr[-2000:]}")
        result["checked"] = json.loads(out.stdout.strip().splitlines()[-1])
        expected_path.unlink()
    contenders = {}
    for name, tree in trees.items():
        contenders[f"{name}: one rank's file alone"] = (tree, files[0], None)
        contenders[f"{name}: the directory of {ranks} ranks"] = (tree, directory, None)
    last = list(trees)[-1]
    contenders[f"{last}: the directory, STEPWATCH_READ_PROCESSES=1"] = (
        trees[last], directory, {"STEPWATCH_READ_PROCESSES": "1"})
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    try:
        for i in range(repeat):  # in turn, so that a busy moment hits every contender alike
            for name, (tree, path, env) in contenders.items():
                db = str(work / f"ranks-{i}.duckdb")
                _make_db(db, tree)
                load = os.getloadavg()[0]
                r = run_command([sys.executable, "-m", "ingest", "import", str(path), "--db", db], cwd=tree, env=env)
                runs[name].append({**r, "load": load})
                _remove_db(db)
        for name, (tree, path, env) in contenders.items():
            db = str(work / "ranks-mem.duckdb")
            _make_db(db, tree)
            mem = run_command([sys.executable, "-m", "ingest", "import", str(path), "--db", db], cwd=tree, env=env,
                              poll_memory=True)
            _remove_db(db)
            seconds = statistics.median(r["seconds"] for r in runs[name])
            n = ranks if path == directory else 1
            contenders_row = {"seconds": seconds, "per_rank_s": seconds / n, "files": n,
                              "runs": [round(r["seconds"], 2) for r in runs[name]],
                              "load": [round(r["load"], 1) for r in runs[name]],
                              "pss_mb": mem["pss_mb"], "processes": mem["processes"]}
            result["contenders"][name] = contenders_row
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def _remove_db(db: str) -> None:
    for f in Path(db).parent.glob(Path(db).name + "*"):
        f.unlink()


def print_rank_table(result: dict) -> None:
    ranks = result["ranks"]
    print(f"\n{ranks} per-rank traces of {result['rank_json_mb']:.1f} MB of JSON each "
          f"({result['stored_mb']:.1f} MB gzipped in all), {result['cpus']} CPUs; checked: {result['checked']}\n")
    alone = {name.split(":")[0]: r["seconds"] for name, r in result["contenders"].items() if "alone" in name}
    print("| command | files | wall s (median) | s per rank | one file alone / s per rank | "
          "peak PSS MB, all processes | load (1 min) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in result["contenders"].items():
        speed = alone[name.split(":")[0]] / r["per_rank_s"]
        print(f"| {name} | {r['files']} | {r['seconds']:.2f} ({', '.join(map(str, r['runs']))}) | "
              f"{r['per_rank_s']:.2f} | {speed:.2f}x | {r['pss_mb']:.0f} ({r['processes']} proc.) | "
              f"{min(r['load']):.1f}-{max(r['load']):.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", default=None, help="sizes of JSON to build, in MB (comma-separated; default 50,178,535)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each contender; the median is kept")
    p.add_argument("--dir", default=None, help="where to write the traces (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the traces (under --dir)")
    p.add_argument("--no-check", action="store_true", help="skip the untimed exactness check")
    p.add_argument("--tree", action="append", metavar="NAME=DIR",
                   help="also run the command from this source tree (e.g. `git archive` of another commit); "
                        "repeatable; default: this checkout alone")
    p.add_argument("--ranks", type=int, default=0, metavar="N",
                   help="time a directory of N per-rank traces (of --rank-steps steps each) against one of them "
                        "alone; without --mb, only that")
    p.add_argument("--rank-steps", type=int, default=30, help="steps of each rank's trace (30: ~162 MB of JSON)")
    p.add_argument("--check", nargs=2, metavar=("TRACE", "EXPECTED_JSON"), help=argparse.SUPPRESS)
    p.add_argument("--check-ranks", nargs=2, metavar=("DIR", "EXPECTED_JSON"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.check:
        kernels, worst = check_figures(Path(args.check[0]), json.loads(Path(args.check[1]).read_text()))
        print(json.dumps({"kernels": kernels, "largest_deviation": worst}))
        return
    if args.check_ranks:
        directory, expected = Path(args.check_ranks[0]), json.loads(Path(args.check_ranks[1]).read_text())
        print(json.dumps(check_rank_figures(directory, expected)))
        return
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this checkout": str(ROOT)}
    trees = {name: Path(d).resolve() for name, d in trees.items()}
    if args.mb is None:
        args.mb = "" if args.ranks else "50,178,535"
    sizes = [float(x) for x in args.mb.split(",") if x]
    work = Path(args.dir or tempfile.mkdtemp(prefix="stepwatch-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    src = read_source()
    if args.ranks:
        try:
            print(f"machine load before: {os.getloadavg()}", flush=True)
            result = rank_benchmark(src, work, trees, args.ranks, args.rank_steps, args.repeat, not args.no_check)
            print(json.dumps(result), flush=True)
            print_rank_table(result)
            print(f"\nmachine load after: {os.getloadavg()}")
        finally:
            if not sizes and not args.keep and not args.dir:
                shutil.rmtree(work, ignore_errors=True)
        if not sizes:
            return
    key_avg = {r["name"]: r for r in json.loads((CAPTURE / "key_averages.json").read_text())}
    one = expected_kernels(src, [src.steps])
    ka_ok = all(key_avg[n]["count"] == c and abs(key_avg[n]["self_device_time_total_us"] - t) <= 1e-9 * t
                for n, (c, t) in one.items())
    print(f"one copy's expected kernels equal key_averages.json: {ka_ok} ({len(one)} kernels)")
    mb_per_step = src.json_bytes / 1e6 / src.steps
    rows = []
    try:
        for size in sizes:
            steps = max(1, round(size / mb_per_step))
            trace = work / f"scaled-{steps}steps.trace.json.gz"
            expected = build_scaled_trace(src, steps, trace)
            with igzip.open(trace, "rb") as f:
                json_mb = sum(len(b) for b in iter(lambda: f.read(1 << 24), b"")) / 1e6
            checked = None
            if not args.no_check:
                expected_path = work / f"expected-{steps}.json"
                expected_path.write_text(json.dumps(expected))
                tree = list(trees.values())[-1]
                out = subprocess.run([sys.executable, "-m", "ingest.studies.scale", "--check", str(trace),
                                      str(expected_path)], cwd=tree, capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"figures of {trace} differ from the expected ones: {out.stderr[-2000:]}")
                checked = json.loads(out.stdout.strip().splitlines()[-1])
                expected_path.unlink()
            runs: dict[str, list[dict]] = {name: [] for name in trees}
            base = []
            for i in range(args.repeat):
                for name, tree in trees.items():
                    db = str(work / f"bench-{steps}-{name}-{i}.duckdb")
                    _make_db(db, tree)
                    runs[name].append(run_command(
                        [sys.executable, "-m", "ingest", "import", str(trace), "--db", db], cwd=tree))
                base.append(run_command([sys.executable, "-c", JSON_LOAD, str(trace)]))
            t_base = statistics.median(r["seconds"] for r in base)
            base_mem = run_command([sys.executable, "-c", JSON_LOAD, str(trace)], poll_memory=True)
            row = {"steps": steps, "json_mb": json_mb, "json_load_s": t_base, "json_load_pss_mb": base_mem["pss_mb"],
                   "json_runs": [round(r["seconds"], 2) for r in base], "checked": checked, "trees": {}}
            for name, tree in trees.items():
                db = str(work / f"bench-{steps}-{name}-mem.duckdb")
                _make_db(db, tree)
                mem = run_command([sys.executable, "-m", "ingest", "import", str(trace), "--db", db],
                                  poll_memory=True, cwd=tree)
                t = statistics.median(r["seconds"] for r in runs[name])
                row["trees"][name] = {"import_s": t, "ratio": t_base / t, "pss_mb": mem["pss_mb"],
                                      "processes": mem["processes"],
                                      "runs": [round(r["seconds"], 2) for r in runs[name]]}
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
            if not args.keep:
                trace.unlink()
            for f in work.glob(f"bench-{steps}-*"):
                f.unlink()
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.repeat} runs each, median; machine load at the end: {os.getloadavg()[0]:.1f}\n")
    print("| trace | json.load s (peak PSS MB) | command | ingest import s | ratio | peak PSS MB, all processes |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        for name, t in r["trees"].items():
            print(f"| {r['json_mb']:.0f} MB, {r['steps']} steps "
                  f"| {r['json_load_s']:.2f} ({r['json_load_pss_mb']:.0f}) | "
                  f"{name} | {t['import_s']:.2f} | {t['ratio']:.1f}x | {t['pss_mb']:.0f} ({t['processes']} proc.) |")
    for name in trees:
        if len(rows) >= 2:
            print(f"\n{name}: slope of the import (s per 100 MB of JSON) between sizes, and overall:")
            for a, b in zip(rows, rows[1:]):
                ta, tb = a["trees"][name]["import_s"], b["trees"][name]["import_s"]
                slope = (tb - ta) / (b['json_mb'] - a['json_mb']) * 100
                print(f"  {a['json_mb']:.0f} -> {b['json_mb']:.0f} MB: {slope:.3f}")
            for r in rows:
                print(f"  {r['json_mb']:.0f} MB: {r['trees'][name]['import_s'] / r['json_mb'] * 100:.3f} overall")

if __name__ == "__main__":
    main()
