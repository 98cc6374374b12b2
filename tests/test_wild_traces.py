"""The conformance corpus: real profiler traces from other projects (tests/data/wild/, see its
SOURCES.md) and our own captures, imported as a user would, through the CLI.

Every trace must import, and the report's per-kernel calls and total time must equal an
independent count taken straight from the JSON (tests/wild_reference.py), both with no --rank
(a single file of any rank shows its own kernels) and with --rank <the file's rank>. A trace with
no step markers imports as one `whole-trace` step. A file that is not a profiler trace is refused
with exit code 2 and one line naming it, and the database stays exactly as it was.

The reference itself is checked against torch's key_averages() on our own captures.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingest.cli import main
from tests.helpers import DATA, TRACES, file_digest
from tests.wild_reference import Reference, find_rank, load_trace, reference_of

WILD = DATA / "wild"
MANIFEST = json.loads((WILD / "manifest.json").read_text())["files"]
WILD_TRACES = [r for r in MANIFEST if r["expect"] == "trace"]
REFUSED = [r for r in MANIFEST if r["expect"] == "refuse"]
STEP_METHODS = {"profiler-step", "span", "graph-launch", "whole-trace", "given"}
MAX_STORED_BYTES = 120_000


@dataclass(frozen=True)
class Case:
    """A trace to import: the path given to `import` (a file or a bundle), the trace file the
    reference reads, the file's rank, and torch's key_averages() rows when we have them."""

    id: str
    import_path: Path
    trace_file: Path
    rank: int
    key_averages: Path | None = None


def _own_cases() -> list[Case]:
    bundles = sorted(p for p in (DATA / "bundles").iterdir() if p.is_dir())
    cases = [Case(f"own:{b.name}", b, b / "trace.json.gz", 0, b / "key_averages.json") for b in bundles]
    cases.append(Case("own:cpu_small", TRACES / "cpu_small.trace.json", TRACES / "cpu_small.trace.json", 0,
                      TRACES / "cpu_small.key_averages.json"))
    return cases


OWN = _own_cases()
CASES = [Case(r["file"], WILD / r["file"], WILD / r["file"], r["rank"]) for r in WILD_TRACES] + OWN


@functools.cache
def _reference(trace_file: Path) -> Reference:
    return reference_of(trace_file)


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the CLI's main, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report_of(tmp_path_factory):
    """report_of(case, rank_flag) -> the report as JSON: each trace imported once, into a fresh
    database, and each report asked for once."""
    runs: dict[str, tuple[str, str]] = {}
    reports: dict[tuple[str, bool], dict] = {}

    def report(case: Case, rank_flag: bool) -> dict:
        if case.id not in runs:
            db = str(tmp_path_factory.mktemp("wild") / "runs.duckdb")
            code, out, err = _run_cli(["import", str(case.import_path), "--db", db])
            assert code == 0, f"import refused: {err.strip()}"
            runs[case.id] = (db, out.strip().splitlines()[-1])
        if (case.id, rank_flag) not in reports:
            db, run_id = runs[case.id]
            flag = ["--rank", str(case.rank)] if rank_flag else []
            code, out, err = _run_cli(["report", run_id, "--db", db, "--json", *flag])
            assert code == 0, f"report failed: {err.strip()}"
            reports[case.id, rank_flag] = json.loads(out)
        return reports[case.id, rank_flag]

    return report


def _kernels_by_name(report: dict) -> dict[str, tuple[int, float]]:
    """(calls, total_us) per kernel name, summed over the rows (one per launcher and source)."""
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for k in report["kernels"]:
        calls[k["name"]] += k["calls"]
        total[k["name"]] += k["total_us"]
    return {n: (calls[n], total[n]) for n in calls}


def _short(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


# -- the corpus itself ----------------------------------------------------------------------------

def test_corpus_is_large_varied_and_small():
    sources = {r["source"] for r in WILD_TRACES}
    assert len(WILD_TRACES) >= 25 and len(sources) >= 3, (len(WILD_TRACES), sources)
    assert len(REFUSED) >= 3
    stored = {p.name for p in WILD.iterdir() if p.is_file()} - {"make_corpus.py", "manifest.json", "SOURCES.md"}
    assert stored == {r["file"] for r in MANIFEST}
    sizes = {r["file"]: (WILD / r["file"]).stat().st_size for r in MANIFEST}
    assert all(size <= MAX_STORED_BYTES for size in sizes.values()), {f: s for f, s in sizes.items()
                                                                     if s > MAX_STORED_BYTES}
    assert sum(sizes.values()) < 20e6
    sources_md = (WILD / "SOURCES.md").read_text()
    for r in MANIFEST:
        assert r["stored_bytes"] == sizes[r["file"]], r["file"]
        assert f"`{r['file']}`" in sources_md, r["file"]
        assert r["licence"] in ("MIT", "BSD-3-Clause") and (WILD / r["licence_file"]).is_file(), r["file"]
        assert "Copyright" in (WILD / r["licence_file"]).read_text(), r["licence_file"]


@pytest.mark.parametrize("row", WILD_TRACES, ids=lambda r: r["file"])
def test_manifest_rank_is_the_reference_rank(row):
    path = WILD / row["file"]
    assert find_rank(path, load_trace(path)) == row["rank"]


# -- the reference against torch ----------------------------------------------------------------

@pytest.mark.parametrize("case", OWN, ids=lambda c: c.id)
def test_reference_agrees_with_key_averages(case):
    ref = _reference(case.trace_file)
    rows = {r["name"]: r for r in json.loads(case.key_averages.read_text())}
    self_time = "self_cpu_time_total_us" if ref.cpu_only else "self_device_time_total_us"
    assert len(ref.kernels) >= 12
    for name, count in ref.kernels.items():
        assert rows[name]["count"] == count.calls, name
        assert count.total_us == pytest.approx(rows[name][self_time], rel=1e-6), name


# -- importing every trace ----------------------------------------------------------------------

@pytest.mark.parametrize("rank_flag", [False, True], ids=["no-rank-flag", "rank-flag"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.slow
def test_kernels_match_the_reference(report_of, case, rank_flag):
    ref = _reference(case.trace_file)
    assert ref.rank == case.rank
    assert ref.kernels, "the reference finds no kernels and no CPU ops"
    report = report_of(case, rank_flag)
    got = _kernels_by_name(report)
    want = ref.kernels
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, (
        f"rank {ref.rank}: the report has {len(got)} kernel names, the reference {len(want)}; "
        f"missing {[_short(n) for n in missing[:3]]}, unexpected {[_short(n) for n in extra[:3]]}")
    for name, count in want.items():
        calls, total_us = got[name]
        assert calls == count.calls, f"{_short(name)}: {calls} calls, the reference counts {count.calls}"
        assert total_us == pytest.approx(count.total_us, rel=1e-6), f"{_short(name)}: total_us"
    assert report["run"]["kernels_from_cpu_ops"] == ref.cpu_only
    assert report["categories"], "kernels but no categories"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.slow
def test_steps(report_of, case):
    run = report_of(case, True)["run"]
    assert run["steps"] >= 1
    assert run["step_method"] in STEP_METHODS
    if not _reference(case.trace_file).has_step_markers:  # no ProfilerStep#N, no step[...], no graph launch
        assert (run["step_method"], run["steps"]) == ("whole-trace", 1)


# -- files that are not profiler traces ---------------------------------------------------------

@pytest.fixture(scope="module")
def used_db(tmp_path_factory):
    """A database that already holds one run."""
    db = tmp_path_factory.mktemp("used") / "runs.duckdb"
    code, _, err = _run_cli(["import", str(TRACES / "cpu_small.trace.json"), "--db", str(db)])
    assert code == 0, err
    return db


@pytest.mark.parametrize("row", REFUSED, ids=lambda r: r["file"])
def test_not_a_trace_is_refused_in_one_line(row, used_db, tmp_path):
    path = WILD / row["file"]
    fresh = tmp_path / "fresh.duckdb"
    code, out, err = _run_cli(["import", str(path), "--db", str(fresh)])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and row["file"] in lines[0], err
    assert not fresh.exists()

    before = file_digest(used_db)
    code, _, _ = _run_cli(["import", str(path), "--db", str(used_db)])
    assert code == 2
    assert file_digest(used_db) == before


TEXT_TID_TRACES = ["kineto__resnet50_profiler_api_num_workers_0__worker0.pt.trace.json.gz",
                   "kineto__resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
                   "kineto__2020__resnet50_num_workers_0__worker0.pt.trace.json.gz"]


def _bare_launches_in_json(path: Path) -> tuple[int, int]:
    """(kernels linked to a launch, those whose launch no CPU op encloses on its thread), counted straight
    from the JSON: ProfilerStep#N is a step marker, not an op (torch before 1.11 wrote it as one)."""
    body = load_trace(path)
    events = body["traceEvents"] if isinstance(body, dict) else body
    ops = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("Operator", "cpu_op") and not e["name"].startswith("ProfilerStep"):
            ops[(e["pid"], str(e["tid"]))].append((e["ts"], e["ts"] + e["dur"]))
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X" and
                e.get("cat") in ("Runtime", "cuda_runtime") and "correlation" in e.get("args", {})}
    linked = bare = 0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("Kernel", "kernel", "Memcpy", "gpu_memcpy", "Memset",
                                                        "gpu_memset"):
            continue
        launch = launches.get(e.get("args", {}).get("correlation"))
        if launch is None:
            continue
        linked += 1
        ts = launch["ts"]
        bare += not any(lo <= ts <= hi for lo, hi in ops[(launch["pid"], str(launch["tid"]))])
    return linked, bare


@pytest.mark.parametrize("name", TEXT_TID_TRACES)
def test_a_thread_id_written_as_text_is_one_thread(name):
    """torch 1.8 wrote thread ids as text ("1890023232"). The reader parsed such an id as a number in
    pieces without other text ids and kept it as text in the others, so one thread got two codes, and
    the launches on one could not find their ops on the other: 287 of 858 kernels of the first trace
    were shown as launched by `cudaLaunchKernel` (no op), against 11 in the JSON."""
    from ingest.traces.analyse import link_kernels
    from ingest.traces.trace_read import read_trace

    trace = read_trace(str(WILD / name))
    as_text = [(str(pid), str(tid)) for pid, tid in trace.threads]
    assert len(set(as_text)) == len(as_text), trace.threads
    kernels = link_kernels(trace)
    linked, bare = _bare_launches_in_json(WILD / name)
    assert int((kernels.launcher != "").sum()) == linked
    assert int(kernels.bare_launch.sum()) == bare < linked / 10


def test_kernels_launched_outside_every_op_are_said_in_a_note():
    """#34 item 8: with no CPU op around a launch the launcher is the runtime call's name, which read as
    if `cudaLaunchKernel` were an op (100 % of a trace's kernel time). astrasim's Megatron trace records
    no CPU ops: all of its time is launched bare; the 2021 kineto trace has ops around all but 11 of its
    858 launches (under BARE_LAUNCH_NOTE_SHARE): no note."""
    from ingest.traces.analyse import BARE_LAUNCH_NOTE_SHARE, analyse_trace
    from ingest.traces.categories import load_rule_chain
    from ingest.traces.trace_read import read_trace

    rules = load_rule_chain()
    bare = analyse_trace(read_trace(str(WILD / "astrasim__megatron-tp8__megatron_kineto_0.json.gz")), rules)
    (note,) = [n for n in bare.notes if "no recorded CPU op" in n]
    assert note.startswith("100.0 % of kernel time (777 kernels) was launched with no recorded CPU op around the "
                           "launch: their launcher is the runtime call (cudaLaunchKernel (486), "), note
    assert BARE_LAUNCH_NOTE_SHARE == 0.10
    covered = analyse_trace(read_trace(str(WILD / TEXT_TID_TRACES[0])), rules)
    assert not [n for n in covered.notes if "no recorded CPU op" in n], covered.notes


def _as_layouts(source: Path, tmp: Path, with_kernels: bool) -> tuple[Path, Path]:
    """The ops (and kernels) of a real trace written twice: as torch <= 1.7's autograd profiler wrote a
    trace (`export_chrome_trace` in torch/autograd/profiler.py, v1.7.0: a bare array, no `cat`, ops under
    pid "CPU functions", kernels under pid "CUDA functions" with the device as tid, flow arrows "s"/"f"
    between them), and as Kineto writes the same events (cat cpu_op / kernel). Generated here: no
    torch <= 1.7 installs on Python 3.11, and no such trace is in the corpus; the events are real."""
    events = load_trace(source)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "Operator"
           and not e["name"].startswith("ProfilerStep")]  # torch.profiler's step marker came with 1.8
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "Kernel"] if with_kernels else []
    legacy, modern = [], []
    for flow, e in enumerate(ops):
        legacy.append({"name": e["name"], "ph": "X", "ts": e["ts"], "dur": e["dur"], "tid": int(e["tid"]),
                       "pid": "CPU functions", "args": {}})
        modern.append({"cat": "cpu_op", "name": e["name"], "ph": "X", "ts": e["ts"], "dur": e["dur"],
                       "tid": int(e["tid"]), "pid": 1, "args": {}})
    for flow, k in enumerate(kernels):
        legacy += [{"name": k["name"], "ph": "s", "ts": k["ts"], "tid": 0, "pid": "CPU functions", "id": flow,
                    "cat": "cpu_to_cuda", "args": {}},
                   {"name": k["name"], "ph": "f", "ts": k["ts"], "tid": 0, "pid": "CUDA functions", "id": flow,
                    "cat": "cpu_to_cuda", "args": {}},
                   {"name": k["name"], "ph": "X", "ts": k["ts"], "dur": k["dur"], "tid": 0, "pid": "CUDA functions",
                    "args": {}}]
        modern.append({"cat": "kernel", "name": k["name"], "ph": "X", "ts": k["ts"], "dur": k["dur"], "tid": 7,
                       "pid": 0, "args": {}})
    paths = tmp / "legacy.json", tmp / "modern.json"
    paths[0].write_text(json.dumps(legacy))
    paths[1].write_text(json.dumps({"traceEvents": modern}))
    return paths


@pytest.mark.parametrize("with_kernels", [False, True], ids=["cpu-only", "use_cuda"])
def test_a_torch_1_7_autograd_profiler_export_reads_as_its_events_do_in_kinetos_layout(tmp_path, with_kernels):
    """#34 item 8: such a trace (a bare array, no `cat` on any event) was refused as having 'no GPU kernels
    and no CPU ops to measure'. Now its ops (and kernels) read by pid, with the same figures as the
    same events in Kineto's layout: the kernel table, the steps, the kernel time."""
    from ingest.traces.analyse import analyse_trace
    from ingest.traces.categories import load_rule_chain
    from ingest.traces.trace_read import read_trace

    rules = load_rule_chain()
    legacy, modern = (analyse_trace(read_trace(str(p)), rules)
                      for p in _as_layouts(WILD / TEXT_TID_TRACES[0], tmp_path, with_kernels))
    assert legacy.kernels_from_cpu_ops is modern.kernels_from_cpu_ops is (not with_kernels)
    assert (legacy.steps, legacy.step_method) == (modern.steps, modern.step_method) == (1, "whole-trace")
    assert legacy.kernel_us_total == pytest.approx(modern.kernel_us_total, rel=1e-12)
    want = sorted(zip(modern.kernel_stats["name"], modern.kernel_stats["calls"], modern.kernel_stats["total_us"]))
    got = sorted(zip(legacy.kernel_stats["name"], legacy.kernel_stats["calls"], legacy.kernel_stats["total_us"]))
    assert got == want and len(got) > 20
