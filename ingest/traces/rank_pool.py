"""The ranks of a directory read at once: each rank in a process of its own, a few at a time.

A TP=8 capture is eight traces. Read rank after rank, one import uses the machine's cores only
as far as one trace's split read does (two processes, ingest/traces/trace_read.py). Here the importer
forks one reader per rank, at most `rank_workers()` in flight: no more than the CPUs it may run
on (each reader reads its file in one process, so readers never compete with helpers of their
own), and no more than the memory it has room for. A reader reads and analyses its rank and
sends back only that rank's figures (`RankFigures`: a few tables and arrays, kilobytes), never
the columns of its trace, and exits; so memory is bounded by the readers in flight times one
rank's, not by the number of ranks. Results are put back in file order whatever order the
readers finish in.

Errors are the sequential read's: when a rank's file is bad, no further rank is started, the
readers of later files are stopped, earlier ones finish, and the error of the first bad file in
file order is raised (the one a rank-after-rank read would have met first). A reader that dies
(killed, out of memory) or fails in an unexpected way is not an answer: its file, and every
file not yet started, is read in this process, rank after rank, which raises the real error.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import IngestError, TraceError
from .trace_read import SPLIT_MIN_BYTES, _die_with_parent, _uncompressed_size

T = TypeVar("T")

# A reader's own memory (beyond the pages it shares with the importer it was forked from), as
# measured for one process reading and analysing the 162 MB H200 capture: ~65 MB private at its
# peak (ingest/BENCHMARKS.md). Estimated with a margin as a base plus a share of its JSON bytes.
READER_BASE_BYTES = 32 << 20
READER_BYTES_PER_JSON_BYTE = 0.4
# the share of the memory the system has available that the readers in flight may take
MEMORY_SHARE = 0.5
# Below this much JSON in all the files together, ranks are read one after another here: forking
# readers and sending figures back costs more than it saves (a TP=2 capture of 2.5 MB: 0.08 s
# rank after rank, 0.11 s in two readers). The split read's threshold, for the same reason.
PARALLEL_MIN_JSON_BYTES = SPLIT_MIN_BYTES


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reader_bytes(json_bytes: int) -> int:
    """Estimated peak memory of one reader of a trace of `json_bytes` (uncompressed)."""
    return READER_BASE_BYTES + int(READER_BYTES_PER_JSON_BYTE * json_bytes)


def rank_workers(json_sizes: list[int], cpus: int | None = None, available: int | None = None) -> int:
    """How many ranks to read at once: 1 (rank after rank, in this process) for a single file,
    under PARALLEL_MIN_JSON_BYTES in all, off Linux (fork), or with STEPWATCH_READ_PROCESSES=1;
    else at most one per CPU this process may run on, one per file, and as many readers of the
    largest file as fit in MEMORY_SHARE of the available memory."""
    if len(json_sizes) < 2 or os.environ.get("STEPWATCH_READ_PROCESSES", "2") == "1":
        return 1
    if sum(json_sizes) < PARALLEL_MIN_JSON_BYTES:
        return 1
    if not sys.platform.startswith("linux"):
        return 1
    if cpus is None:
        cpus = len(os.sched_getaffinity(0))
    if available is None:
        available = available_memory()
    workers = min(cpus, len(json_sizes))
    if available is not None:
        workers = min(workers, int(MEMORY_SHARE * available) // reader_bytes(max(json_sizes)))
    return max(1, workers)


def _reader_main(index: int, work: Callable[[int], T], conn, parent: int) -> None:
    """A reader process: work(index) and its result (or what went wrong) sent back."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the importer stops its readers itself
    try:
        payload = ("ok", work(index))
    except TraceError as e:
        payload = ("trace", (e.path, e.problem))
    except IngestError as e:
        payload = ("ingest", str(e))
    except BaseException:  # noqa: BLE001 - said again by this file's read in the importer
        payload = ("crash", traceback.format_exc())
    send_payload(conn, payload)


def send_payload(conn, payload: tuple) -> None:
    """A child process's last word: payload on conn, or ('crash', traceback) when it does not pickle;
    nothing when the parent is gone (a reader here, the worker's import process)."""
    try:
        try:
            conn.send(payload)
        except OSError:  # the parent is gone
            return
        except BaseException:  # noqa: BLE001 - a result that does not pickle: a bug, said there
            conn.send(("crash", traceback.format_exc()))
        conn.close()
    except OSError:
        pass


def _as_error(kind: str, detail) -> IngestError:
    return TraceError(*detail) if kind == "trace" else IngestError(detail)


def map_in_processes(count: int, work: Callable[[int], T], workers: int,
                     on_done: Callable[[int], None] | None = None) -> list[T]:
    """[work(0), ..., work(count - 1)], each in a forked process, at most `workers` at a time,
    started in index order; on_done(i) once result i is in hand. See the module's doc for errors."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("fork")
    results: dict[int, T] = {}
    failures: dict[int, IngestError] = {}
    redo: list[int] = []  # readers that died or crashed: their files are read here
    running: dict = {}  # connection -> (index, process)
    upcoming = iter(range(count))
    started = 0
    parent = os.getpid()

    def start(index: int) -> None:
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_reader_main, args=(index, work, sender, parent), name=f"stepwatch-rank-{index}")
        with warnings.catch_warnings():
            # Python 3.12 warns when a process with threads forks: the reader runs only the
            # trace reader and the analysis, never code that waits on the other threads' locks
            warnings.simplefilter("ignore", DeprecationWarning)
            proc.start()
        sender.close()
        running[receiver] = (index, proc)

    def stop(conn) -> None:
        index, proc = running.pop(conn)
        conn.close()
        if proc.is_alive():
            proc.terminate()
        proc.join()
        proc.close()

    try:
        while True:
            while len(running) < workers and not failures and not redo and started < count:
                start(next(upcoming))
                started += 1
            if not running:
                break
            for conn in wait(list(running)):
                if conn not in running:  # stopped below, for an earlier file's error
                    continue
                index, _ = running[conn]
                try:
                    kind, detail = conn.recv()
                except Exception:  # noqa: BLE001 - EOF (it died), or what does not unpickle
                    kind, detail = "died", None
                stop(conn)
                if kind == "ok":
                    results[index] = detail
                    if on_done is not None:
                        on_done(index)
                elif kind in ("trace", "ingest"):
                    failures[index] = _as_error(kind, detail)
                    # a later file's error or result no longer matters: the first bad file wins
                    for later in [c for c, (i, _) in running.items() if i > index]:
                        stop(later)
                else:
                    redo.append(index)
    finally:
        for conn in list(running):
            stop(conn)
    first_failure = min(failures, default=count)
    # what a reader could not say, and what was never started, read here in file order; an
    # error met here comes before any later file's
    for index in sorted(redo) + list(range(started, count)):
        if index < first_failure:
            results[index] = work(index)
            if on_done is not None:
                on_done(index)
    if failures:
        raise failures[first_failure]
    return [results[i] for i in range(count)]


def json_sizes(files: list[Path]) -> list[int]:
    """Each file's size as JSON (a .json.gz's from its gzip trailer)."""
    return [_uncompressed_size(Path(f)) for f in files]
