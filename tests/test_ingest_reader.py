"""The trace reader's cutting and its two-process (split) read.

A trace is cut into pieces at `},{` boundaries; a large one is decoded by two processes, each
taking every other piece. Whatever the piece size and however many processes read it, the
columns must be the same, errors must name the same event, and no helper process may be left
behind. The 162 MB H200 capture kept for the benchmark is read both ways here too.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import multiprocessing
import os
import time

import numpy as np
import pytest

from ingest import cli
from ingest.errors import TraceError
from ingest.limits import DEFAULT_LIMITS
from ingest.traces import trace_read
from ingest.traces.analyse import K, analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA, ROOT, TRACES

BUNDLES = DATA / "bundles"
SMALL = [BUNDLES / p.name / "trace.json.gz" for p in sorted(BUNDLES.iterdir())] + [TRACES / "cpu_small.trace.json"]
BIG = ROOT / "ingest" / "studies" / "benchmark_data" / "big-glm5-fullpool-30steps"
# by default a large trace is split only where there are two CPUs to run the two processes
DEFAULT_PROCESSES = 2 if len(os.sched_getaffinity(0)) >= 2 else 1


def _columns(trace) -> dict:
    """The trace's columns with codes replaced by what they stand for (code order may differ)."""
    names = np.asarray(trace.names, dtype=object)
    threads = np.array([repr(t) for t in trace.threads] + ["?"], dtype=object)
    shapes = np.array([repr(s) for s in trace.shapes] + ["none"], dtype=object)
    return {"kind": trace.kind, "name": names[trace.name_id], "ts": trace.ts_us, "dur": trace.dur_us,
            "thread": threads[trace.thread_id], "correlation": trace.correlation,
            "external_id": trace.external_id, "shape": shapes[trace.shape_id]}


def assert_same(a, b) -> None:
    ca, cb = _columns(a), _columns(b)
    for key in ca:
        assert np.array_equal(ca[key], cb[key]), key
    assert a.header == b.header
    assert a.events_seen == b.events_seen


def synthetic_trace(steps: int, odd_names: bool = False) -> dict:
    """A Kineto-shaped trace: per step a ProfilerStep, ops with recorded shapes, launches,
    kernels, Python frames, flow events and a string pid, as torch writes them."""
    events = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}}]
    t = 1000.0
    corr = 1
    for step in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 7, "tid": 7,
                       "ts": t, "dur": 500.0, "args": {"External id": corr}})
        for layer in range(8):
            op = "aten::copy_" if layer % 2 else "aten::mm"
            if odd_names:
                op += f'}},{{"ph": "X"}}, {{layer {layer}'
            ts = t + 1 + layer * 60
            events.append({"ph": "X", "cat": "python_function", "name": f"model.py({10 + layer}): forward",
                           "pid": 7, "tid": 7, "ts": ts, "dur": 55.0, "args": {"Python id": layer}})
            events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 7, "tid": 7, "ts": ts + 1, "dur": 50.0,
                           "args": {"External id": corr, "Input Dims": [[64, 128 + layer], [128 + layer, 64]],
                                    "Input type": ["c10::BFloat16", "float"], "Concrete Inputs": ["", ""]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                           "ts": ts + 2, "dur": 5.0, "args": {"correlation": corr, "External id": corr}})
            events.append({"ph": "s", "id": corr, "pid": 7, "tid": 7, "ts": ts + 2, "cat": "ac2g", "name": "ac2g"})
            events.append({"ph": "X", "cat": "kernel", "name": f"kernel_{layer % 3}", "pid": 0, "tid": 7,
                           "ts": ts + 10, "dur": 20.0 + step * 0.001 + layer,
                           "args": {"correlation": corr, "External id": corr, "stream": 7}})
            corr += 1
        t += 600
    events.append({"ph": "i", "s": "g", "name": "Iteration Start", "pid": "Traces", "tid": "PyTorch", "ts": 999.0})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": events,
            "traceName": "synthetic"}


def write_trace(path, body: dict, compress: bool = True):
    text = json.dumps(body, indent=1).encode()
    path.write_bytes(gzip.compress(text, compresslevel=1) if compress else text)
    return path


def test_piece_size_does_not_change_the_columns():
    for path in SMALL:
        whole = read_trace(path, split=False)
        pieces = read_trace(path, split=False, chunk_bytes=2048)
        assert whole.events_seen > 200, path
        assert_same(whole, pieces)


@pytest.mark.slow
def test_two_processes_read_the_same_columns_as_one():
    for path in SMALL:
        one = read_trace(path, split=False)
        two = read_trace(path, split=True, chunk_bytes=2048)
        assert (one.processes, two.processes) == (1, 2), path
        assert_same(one, two)
        assert analyse_trace(one, load_rule_chain()).kernel_stats.to_pandas().equals(
            analyse_trace(two, load_rule_chain()).kernel_stats.to_pandas()), path


def test_a_cut_inside_a_string_is_moved_and_the_split_read_falls_back(tmp_path):
    """Op names holding `},{` make the last boundary of most pieces fall inside a string: the
    one-process reader extends such a piece; the split read, which does not check its cuts,
    hands the file to the one-process reader."""
    path = write_trace(tmp_path / "odd.json", synthetic_trace(20, odd_names=True), compress=False)
    body = json.loads(path.read_text())
    want = sorted(e["name"] for e in body["traceEvents"] if e.get("cat") == "cpu_op")
    assert '},{"ph": "X"}, {layer 1' in want[0]
    small = read_trace(path, split=False, chunk_bytes=1024)
    got = sorted(np.asarray(small.names, dtype=object)[small.name_id[small.kind == K["cpu_op"]]])
    assert got == want
    assert_same(read_trace(path, split=False), small)
    two = read_trace(path, split=True, chunk_bytes=1024)
    assert two.processes == 1
    assert_same(small, two)


def test_a_wrong_type_deep_in_a_split_read_names_the_event(tmp_path):
    body = synthetic_trace(60)
    index = len(body["traceEvents"]) * 3 // 4
    body["traceEvents"][index]["ts"] = "soon"
    path = write_trace(tmp_path / "bad.json.gz", body)
    messages = []
    for split in (False, True):
        with pytest.raises(TraceError) as e:
            read_trace(path, split=split, chunk_bytes=4096)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert f"traceEvents[{index}] field 'ts'" in messages[0] and "bad.json.gz" in messages[0]


def test_a_truncated_gzip_gives_the_same_error_either_way(tmp_path):
    data = gzip.compress(json.dumps(synthetic_trace(60), indent=1).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    messages = []
    for split in (False, True):
        with pytest.raises(TraceError) as e:
            read_trace(path, split=split, chunk_bytes=4096)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "truncated" in messages[0]


def test_no_helper_process_is_left_behind(tmp_path):
    good = write_trace(tmp_path / "good.json.gz", synthetic_trace(30))
    bad_body = synthetic_trace(30)
    bad_body["traceEvents"][-5]["dur"] = [1]
    bad = write_trace(tmp_path / "bad.json.gz", bad_body)
    assert read_trace(good, split=True, chunk_bytes=4096).processes == 2
    with pytest.raises(TraceError):
        read_trace(bad, split=True, chunk_bytes=4096)
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_only_a_large_trace_is_split_by_default(tmp_path, monkeypatch):
    small = write_trace(tmp_path / "small.json.gz", synthetic_trace(10))
    large = write_trace(tmp_path / "large.json.gz", synthetic_trace(2000))  # 18 MB of JSON, 1 MB gzipped
    assert len(gzip.decompress(large.read_bytes())) > 16 << 20
    assert read_trace(small).processes == 1
    split = read_trace(large)
    assert split.processes == DEFAULT_PROCESSES
    monkeypatch.setenv("STEPWATCH_READ_PROCESSES", "1")
    one = read_trace(large)
    assert one.processes == 1
    assert_same(one, split)
    assert len(one) == 2000 * (1 + 8 * 4)  # ProfilerStep + per layer frame, op, launch, kernel


@pytest.mark.slow
def test_a_helper_started_early_reads_ahead_and_the_read_takes_it_over(tmp_path):
    """`start_early` (what `ingest import` calls once its command line is parsed) forks the
    helper before the read: it decodes pieces on its own meanwhile, the read takes it over, and
    the columns are those of a one-process read. A helper no read took is ended by
    `stop_early`; one started with other limits is ended and replaced by the read."""
    large = write_trace(tmp_path / "large.json.gz", synthetic_trace(2000))  # 18 MB of JSON
    one = read_trace(large, split=False)
    if DEFAULT_PROCESSES == 1:
        assert not trace_read.start_early(large)  # one CPU: nothing to split
        return
    assert trace_read.start_early(large) and not trace_read.start_early(large)  # one per file
    claims = trace_read._EARLY[os.path.realpath(large)].claims
    deadline = time.monotonic() + 60
    while claims.helper_events.value == 0 and time.monotonic() < deadline:  # it reads on its own
        time.sleep(0.01)
    assert claims.helper_events.value > 0 and len(multiprocessing.active_children()) == 1
    early = read_trace(large)
    assert early.processes == 2 and trace_read._EARLY == {}
    assert_same(one, early)
    assert multiprocessing.active_children() == []

    assert trace_read.start_early(large)  # no read takes it: the import failed first
    trace_read.stop_early()
    assert trace_read._EARLY == {} and multiprocessing.active_children() == []

    other = dataclasses.replace(DEFAULT_LIMITS, max_events=10**7)
    assert trace_read.start_early(large, limits=other)
    again = read_trace(large)  # the default limits: the early helper is not this read's
    assert again.processes == 2 and trace_read._EARLY == {} and multiprocessing.active_children() == []
    assert_same(one, again)
    small = write_trace(tmp_path / "small.json.gz", synthetic_trace(10))
    assert not trace_read.start_early(small) and not trace_read.start_early(tmp_path)  # small; a directory


@pytest.mark.slow
def test_an_import_that_fails_before_its_read_leaves_no_helper(tmp_path):
    large = write_trace(tmp_path / "large.json.gz", synthetic_trace(2000))
    db = tmp_path / "s.duckdb"
    assert cli.main(["import", str(large), "--db", str(db), "--variant", "bad label!"]) == 2
    assert multiprocessing.active_children() == [] and trace_read._EARLY == {} and not db.exists()
    assert cli.main(["import", str(large), "--db", str(db)]) == 0
    assert multiprocessing.active_children() == [] and trace_read._EARLY == {}


@pytest.fixture(scope="module")
def big_h200_trace():
    return read_trace(BIG / "trace.json.gz")


@pytest.mark.slow
def test_the_162_mb_h200_capture_read_by_two_processes_matches_key_averages(big_h200_trace):
    trace = big_h200_trace
    assert trace.processes == DEFAULT_PROCESSES and trace.events_seen == 465_930
    assert_same(trace, read_trace(BIG / "trace.json.gz", split=False))
    gpu = np.isin(trace.kind, [K["kernel"], K["gpu_memcpy"], K["gpu_memset"]])
    gpu_names = {trace.names[i] for i in np.unique(trace.name_id[gpu])}
    expected = {r["name"]: r for r in json.loads((BIG / "key_averages.json").read_text()) if r["name"] in gpu_names}
    stats = analyse_trace(trace, load_rule_chain()).kernel_stats.to_pandas()
    got = stats.groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"))
    assert set(got.index) == set(expected) and len(expected) >= 10
    for kernel, row in got.iterrows():
        assert row.calls == expected[kernel]["count"], kernel
        assert row.total_us == pytest.approx(expected[kernel]["self_device_time_total_us"], rel=1e-9), kernel
    cast = stats.iloc[0]
    assert "LoadWithCast" in cast["name"] and cast["calls"] == 2340 and cast["calls_per_step"] == 78
