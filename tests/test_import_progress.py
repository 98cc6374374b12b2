"""The import's progress bar (ingest/traces/progress.py): the real command run on a pseudo-terminal draws
one bar on stderr with the bytes read and the events decoded, of every rank of a directory
together; run on a pipe, or when it ends before the threshold, it writes nothing but its result.
The threshold (PROGRESS_AFTER_S, 2 s) is set through STEPWATCH_PROGRESS_AFTER_S: 0 to draw from
the first moment, an hour for an import that must stay silent, so nothing here depends on time."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

import pytest

from ingest.limits import PROGRESS_AFTER_S
from ingest.studies.scale import CAPTURE, build_rank_directory, read_source
from ingest.traces.progress import Progress, ReadMeter, describe
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA, ROOT, run_cli

BAR = re.compile(r"^import \[([#.]{20})\] ([\d.,]+)/([\d.,]+) (B|KB|MB|GB) read, ([\d,]+) events"
                 r"(?:, (\d+)/(\d+) ranks)?$")
SCALE = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def run_on_terminal(*args: str, env: dict) -> tuple[int, str, str]:
    """`python -m ARGS` with its stderr on a pseudo-terminal: (exit code, stdout, what the
    terminal received)."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env={**os.environ, **env})
    os.close(slave)
    received = bytearray()
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every process that had the terminal has closed it
                break
            if not data:
                break
            received += data
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, out, received.decode()


def bar_states(terminal: str) -> list[tuple]:
    """Every state of the bar the terminal showed: (done, planned, unit, events, ranks done, ranks)."""
    states = []
    for segment in re.split(r"[\r\n]", terminal):
        m = BAR.match(segment.rstrip())
        if m:
            ranks = (int(m.group(6)), int(m.group(7))) if m.group(6) else (None, None)
            states.append((float(m.group(2).replace(",", "")), float(m.group(3).replace(",", "")), m.group(4),
                           int(m.group(5).replace(",", "")), *ranks))
    return states


def assert_grows(states: list[tuple]) -> None:
    for before, after in zip(states, states[1:]):
        assert after[0] >= before[0] and after[3] >= before[3] and after[1] == before[1]


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory):
    """Four ranks of 15 steps built from a real capture: 20.5 MB of JSON, read by two readers."""
    out = tmp_path_factory.mktemp("ranks")
    files, _ = build_rank_directory(read_source(DATA / "bundles" / "tiny-fused-eager-stack" / "trace.json.gz"),
                                    4, 15, out)
    return out, files


@pytest.mark.slow
def test_one_bar_for_all_the_ranks_of_a_directory(rank_dir, tmp_path):
    directory, files = rank_dir
    events = sum(read_trace(f).events_seen for f in files)
    stored = sum(f.stat().st_size for f in files)
    code, out, terminal = run_on_terminal("ingest", "import", str(directory), "--db", str(tmp_path / "t.duckdb"),
                                          env={"STEPWATCH_PROGRESS_AFTER_S": "0"})
    assert code == 0 and out == "1\n", terminal
    states = bar_states(terminal)
    assert states, terminal
    assert_grows(states)
    done, planned, unit, seen, ranks_done, ranks = states[-1]  # the bar's last state stays on screen
    assert done == planned == round(stored / SCALE[unit], 1)
    assert seen == events == 4 * 16_446  # every event of the four ranks, once
    assert (ranks_done, ranks) == (4, 4)
    # then the result, on a line of its own
    assert terminal.rstrip().endswith("\nimported run 1: 15 steps (profiler-step), 52 kernel rows")
    assert terminal.count("imported run 1") == 1

    # the same import on a pipe: no bar, no carriage return, only the result
    piped = run_cli("ingest", "import", str(directory), "--db", str(tmp_path / "p.duckdb"),
                    env={"STEPWATCH_PROGRESS_AFTER_S": "0"})
    assert piped.returncode == 0 and piped.stdout == "1\n"
    assert piped.stderr == "imported run 1: 15 steps (profiler-step), 52 kernel rows\n"


@pytest.mark.slow
def test_a_split_read_counts_the_helpers_events_too(tmp_path):
    # the 162 MB H200 capture (10.5 MB gzipped): read by two processes, the helper's events counted apart
    trace = CAPTURE / "trace.json.gz"
    code, out, terminal = run_on_terminal("ingest", "import", str(trace), "--db", str(tmp_path / "t.duckdb"),
                                          env={"STEPWATCH_PROGRESS_AFTER_S": "0"})
    assert code == 0 and out == "1\n", terminal
    states = bar_states(terminal)
    assert_grows(states)
    done, planned, unit, seen, ranks_done, ranks = states[-1]
    assert (done, planned, unit) == (10.5, 10.5, "MB") and trace.stat().st_size == 10_486_352
    assert seen == 465_930  # every event of the trace, decoded by either process, once
    assert ranks is None  # one file: no rank count


@pytest.mark.slow
def test_an_import_shorter_than_the_threshold_draws_nothing(tmp_path):
    assert PROGRESS_AFTER_S == 2.0
    code, out, terminal = run_on_terminal("ingest", "import", str(DATA / "h200" / "tp2"), "--db",
                                          str(tmp_path / "t.duckdb"), env={"STEPWATCH_PROGRESS_AFTER_S": "3600"})
    assert code == 0 and out == "1\n"
    assert terminal.replace("\r\n", "\n") == "imported run 1: 3 steps (span), 14 kernel rows\n"


@pytest.mark.slow
def test_an_error_after_the_bar_starts_on_its_own_line(rank_dir, tmp_path):
    _, files = rank_dir
    directory = tmp_path / "ranks"
    directory.mkdir()
    for f in files:
        (directory / f.name).write_bytes(f.read_bytes())
    bad = directory / files[2].name
    bad.write_bytes(bad.read_bytes()[:-1000])
    code, out, terminal = run_on_terminal("ingest", "import", str(directory), "--db", str(tmp_path / "t.duckdb"),
                                          env={"STEPWATCH_PROGRESS_AFTER_S": "0"})
    assert code == 2 and out == ""
    lines = terminal.replace("\r\n", "\n").split("\n")
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(f"stepwatch: error: {bad}: compressed data is truncated")
    assert bar_states(terminal)  # the bar was drawn before the error


def test_the_bar_text_and_its_redraw():
    class Terminal:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    meter = ReadMeter([DATA / "h200" / "tp2" / f"stepwatch-tp2-TP-{r}-DECODE.trace.json.gz" for r in (0, 1)])
    assert meter.sizes == [79_163, 89_532]
    slot = meter.slot(1)
    slot.read(40_000)
    slot.decoded(1_234)
    slot.for_helper().decoded(1_000)
    slot.for_helper().read(89_532)  # a helper reports no bytes
    totals = meter.totals()
    assert describe(totals) == "40.0/168.7 KB read, 2,234 events, 0/2 ranks"
    meter.finished(1)
    assert describe(meter.totals()) == "89.5/168.7 KB read, 2,234 events, 1/2 ranks"
    term = Terminal()
    bar = Progress("import", term, width=20)
    bar.update(40_000, 168_695, count="a longer text than the next")
    bar.update(168_695, 168_695, count="short")
    bar.close()
    assert term.text == ("\rimport [####................] a longer text than the next"
                         "\rimport [####################] short" + " " * 22 + "\n")


@pytest.mark.slow
def test_one_step_is_said_in_the_singular(tmp_path):
    """#34 item 7: 'imported run 28: 1 steps'. kineto's 2020 resnet50 trace has one profiled step."""
    trace = DATA / "wild" / "kineto__2020__resnet50_num_workers_0__worker0.pt.trace.json.gz"
    result = subprocess.run([sys.executable, "-m", "ingest", "import", str(trace), "--db", str(tmp_path / "t.duckdb")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"imported run 1: 1 step \([a-z-]+\), \d+ kernel rows\n", result.stderr), result.stderr
