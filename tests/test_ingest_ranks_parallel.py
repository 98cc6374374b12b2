"""The ranks of a directory read at once (ingest/traces/rank_pool.py): each rank in a forked reader of its
own, at most as many at a time as the CPUs and the memory allow, with exactly the figures of the
rank-after-rank read, in rank order; a bad rank file is named as the sequential read names it.
Checked on the real TP=2 captures from the H200s and on a directory of four ranks built from a
real capture (ingest/scale_benchmark.py: known figures), through the command as a user runs it."""

from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pandas as pd
import pytest

from ingest.errors import TraceError
from ingest.studies.scale import build_rank_directory, read_source
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import analyse_files, find_traces
from ingest.traces.rank_pool import (
    MEMORY_SHARE,
    PARALLEL_MIN_JSON_BYTES,
    json_sizes,
    map_in_processes,
    rank_workers,
    reader_bytes,
)
from tests.helpers import DATA, assert_matches_torch, run_cli, torch_kernel_rows

RULES = load_rule_chain()
CAPTURE = DATA / "bundles" / "tiny-fused-eager-stack" / "trace.json.gz"


def assert_same_figures(a, b) -> None:
    assert [f.rank for f in a] == [f.rank for f in b]
    for x, y in zip(a, b, strict=True):
        assert (x.path, x.steps, x.step_method, x.notes) == (y.path, y.steps, y.step_method, y.notes)
        assert (x.kernel_us_total, x.copy_share, x.step_ms_median, x.gpu_busy_share) == \
            (y.kernel_us_total, y.copy_share, y.step_ms_median, y.gpu_busy_share)
        for table in ("kernel_stats", "step_table", "step_categories"):
            pd.testing.assert_frame_equal(getattr(x, table).to_pandas(), getattr(y, table).to_pandas())
        for arr in ("comm_start_us", "comm_end_us", "comm_step"):
            assert np.array_equal(getattr(x, arr), getattr(y, arr))


@pytest.mark.parametrize("capture", ["tp2", "tp2-straggler"])
def test_the_real_tp2_captures_read_at_once_equal_rank_after_rank_and_torch(capture):
    files, _, _ = find_traces(DATA / "h200" / capture)
    assert [f.name for f in files] == [f"stepwatch-tp2-TP-{r}-DECODE.trace.json.gz" for r in (0, 1)]
    at_once = analyse_files(files, RULES, None, workers=2)
    in_turn = analyse_files(files, RULES, None, workers=1)
    assert_same_figures(at_once, in_turn)
    assert [f.rank for f in at_once] == [0, 1] and all(f.steps == 3 for f in at_once)
    for f, path in zip(at_once, files):
        expected = torch_kernel_rows(DATA / "h200" / capture / f"key_averages-TP-{f.rank}.json", path)
        assert_matches_torch(f.kernel_stats, expected)
    # 2.5 MB of JSON: under the threshold, a plain import reads it rank after rank
    assert sum(json_sizes(files)) < PARALLEL_MIN_JSON_BYTES and rank_workers(json_sizes(files)) == 1


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory):
    """Four ranks of 15 steps (5 copies of the capture's 3), ~5 MB of JSON each, 20.5 MB in all."""
    out = tmp_path_factory.mktemp("ranks")
    files, expected = build_rank_directory(read_source(CAPTURE), 4, 15, out)
    return out, files, expected


@pytest.mark.slow
def test_a_generated_directory_is_read_at_once_with_the_expected_figures(rank_dir):
    directory, files, expected = rank_dir
    sizes = json_sizes(files)
    assert sizes == [5_132_971] * 4 and sum(sizes) > PARALLEL_MIN_JSON_BYTES
    assert rank_workers(sizes) == min(len(os.sched_getaffinity(0)), 4)
    found, _, _ = find_traces(directory)
    at_once = analyse_files(found, RULES, None, workers=2)
    assert_same_figures(at_once, analyse_files(found, RULES, None, workers=1))
    assert [f.rank for f in at_once] == [0, 1, 2, 3]  # from each header's distributedInfo
    assert len(expected) == 13
    for f in at_once:
        got = f.kernel_stats.to_pandas().groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"))
        assert set(got.index) == set(expected)
        for name, row in got.iterrows():
            assert row.calls == expected[name][0], name
            assert row.total_us == pytest.approx(expected[name][1], rel=1e-9), name
        assert f.steps == 15 and f.step_method == "profiler-step"


def _report(db, rank) -> dict:
    out = run_cli("ingest", "report", "1", "--db", str(db), "--json", "--rank", str(rank))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_the_command_gives_the_same_run_reading_ranks_at_once_or_in_one_process(rank_dir, tmp_path):
    directory, files, expected = rank_dir
    at_once = run_cli("ingest", "import", str(directory), "--db", str(tmp_path / "a.duckdb"))
    in_turn = run_cli("ingest", "import", str(directory), "--db", str(tmp_path / "b.duckdb"),
                      env={"STEPWATCH_READ_PROCESSES": "1"})
    assert at_once.returncode == in_turn.returncode == 0, at_once.stderr + in_turn.stderr
    assert at_once.stdout == in_turn.stdout == "1\n"
    assert at_once.stderr == in_turn.stderr == "imported run 1: 15 steps (profiler-step), 52 kernel rows\n"
    for rank in range(4):
        a, b = _report(tmp_path / "a.duckdb", rank), _report(tmp_path / "b.duckdb", rank)
        assert a == b
        assert a["run"]["ranks"] == 4 and a["run"]["rank"] == rank and a["run"]["steps"] == 15
        assert {k["name"]: k["calls"] for k in a["kernels"]} == {n: c for n, (c, _) in expected.items()}


def _break(path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3] if how == "truncate" else b"")


@pytest.mark.slow
def test_a_bad_rank_file_is_named_and_the_first_bad_file_wins(rank_dir, tmp_path):
    _, files, _ = rank_dir
    directory = tmp_path / "ranks"
    directory.mkdir()
    copies = []
    for f in files:
        copies.append(directory / f.name)
        copies[-1].write_bytes(f.read_bytes())
    # rank 1 fails late (a gzip cut at two thirds), rank 2 at once (an empty file): the rank-after-rank
    # read meets rank 1 first, and so must the read at once, whichever reader fails first
    _break(copies[1], "truncate")
    _break(copies[2], "empty")
    found, _, _ = find_traces(directory)
    for workers in (2, 1):
        with pytest.raises(TraceError) as e:
            analyse_files(found, RULES, None, workers=workers)
        assert e.value.path == str(copies[1]) and "compressed data is truncated or corrupt" in e.value.problem
    assert multiprocessing.active_children() == []  # every reader stopped and joined
    for env in ({}, {"STEPWATCH_READ_PROCESSES": "1"}):
        db = tmp_path / f"bad{len(env)}.duckdb"
        out = run_cli("ingest", "import", str(directory), "--db", str(db), env=env)
        assert out.returncode == 2 and out.stdout == ""
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"stepwatch: error: {copies[1]}: compressed data is truncated")
    # only the empty file left bad: it is the one named
    copies[1].write_bytes(files[1].read_bytes())
    with pytest.raises(TraceError) as e:
        analyse_files(found, RULES, None, workers=2)
    assert e.value.path == str(copies[2]) and e.value.problem == "is empty"


def test_readers_in_flight_never_exceed_the_workers_and_results_keep_their_order():
    ctx = multiprocessing.get_context("fork")
    in_flight = ctx.Value("i", 0)
    most = ctx.Value("i", 0)
    pair = ctx.Barrier(2, timeout=300)  # two readers must run at once to pass it: a pool of one would break it

    def work(index: int) -> tuple[int, int]:
        with in_flight.get_lock():
            in_flight.value += 1
            most.value = max(most.value, in_flight.value)
        pair.wait()
        with in_flight.get_lock():
            in_flight.value -= 1
        return index * index, os.getpid()

    done = []
    results = map_in_processes(6, work, 2, on_done=done.append)
    assert [r for r, _ in results] == [0, 1, 4, 9, 16, 25]
    pids = {pid for _, pid in results}
    assert len(pids) == 6 and os.getpid() not in pids  # each index in a fresh process
    assert most.value == 2 and sorted(done) == list(range(6))
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("failure", ["killed", "unpicklable result"])
def test_a_reader_that_dies_or_cannot_answer_is_read_again_here(failure):
    parent = os.getpid()

    def work(index: int):
        here = os.getpid() == parent
        if index == 1 and not here:
            if failure == "killed":
                os._exit(9)  # as the out-of-memory killer would
            return index, here, lambda: None  # a result that pickle refuses
        return index, here

    results = map_in_processes(4, work, 2)
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert results[0][1] is False and results[1][1] is True  # rank 1 read again in this process
    assert multiprocessing.active_children() == []


def test_readers_in_flight_are_bounded_by_cpus_and_memory(monkeypatch):
    rank = 162_484_771  # JSON bytes of the 162 MB H200 capture
    assert reader_bytes(rank) == (32 << 20) + int(0.4 * rank) == 98_548_340
    assert rank_workers([rank] * 8, cpus=2, available=16 << 30) == 2
    assert rank_workers([rank] * 8, cpus=16, available=16 << 30) == 8
    assert rank_workers([rank] * 3, cpus=16, available=16 << 30) == 3
    # 1 GiB available: half of it holds 5 readers of 98.5 MB
    assert MEMORY_SHARE == 0.5 and rank_workers([rank] * 8, cpus=16, available=1 << 30) == 5
    assert rank_workers([rank] * 8, cpus=16, available=100 << 20) == 1  # no room for two: in turn, here
    # the largest file decides: one 4 GB rank among small ones
    assert rank_workers([rank] * 7 + [4_000_000_000], cpus=16, available=4 << 30) == 1
    assert rank_workers([rank], cpus=16, available=16 << 30) == 1
    assert rank_workers([1 << 20] * 8, cpus=16, available=16 << 30) == 1  # 8 MB in all: not worth forking
    monkeypatch.setenv("STEPWATCH_READ_PROCESSES", "1")
    assert rank_workers([rank] * 8, cpus=16, available=16 << 30) == 1
