"""A worker's import that can be stopped: `prepare_import` in a process of its own.

The import of a job's bundle reads and analyses traces (ingest/traces/importer.py) in Python
and C code that checks no flag, and it may start helper processes of its own (the split read's
helper, the rank pool's readers). Run in the worker, it could not be stopped. So the worker
forks a child that runs `prepare_import` and sends the record back through a pipe, and waits
on that pipe a poll at a time: a cancel (`ingest cancel`, seen by the job's heartbeat), the
worker's SIGTERM/SIGINT or the job's `timeout_s` ends the child and everything it started at
once (SIGKILL to its process group: it leads a group of its own, its helpers join it), within
a poll of being asked. Nothing is left behind: the child writes no file (the database is
written by the worker, after the record is back), its helpers die with it (and by their
parent-death signal should the worker itself be killed), and the shared memory and semaphores
of a split read are unlinked when they are made (multiprocessing's fork context).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from db.store import RunRecord

from ..errors import IngestError
from ..traces.categories import Rule
from ..traces.importer import ImportOptions, prepare_import
from ..traces.rank_pool import send_payload
from ..traces.trace_read import _die_with_parent
from .errors import CommandCancelled, CommandTimeout, RunError

# how often the worker looks whether the import must stop: the delay between a cancel's
# heartbeat (worker.HEARTBEAT_S) or a SIGTERM and the end of the import
POLL_S = 0.2


def _child_main(path: Path, rules: list[Rule], opts: ImportOptions, conn, parents_end, parent: int) -> None:
    """The import's process: leads a process group (its helpers join it), dies with the worker,
    sends back ('ok', record), ('ingest', message) for bad input or ('crash', traceback)."""
    try:
        os.setpgid(0, 0)
    except OSError:  # the worker has made it a group leader already
        pass
    _die_with_parent(parent)
    parents_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the worker stops it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the worker's own handler is inherited by fork)
    try:
        payload = ("ok", prepare_import(path, rules, opts))
    except IngestError as e:
        payload = ("ingest", str(e))
    except BaseException:  # noqa: BLE001 - a bug: its traceback goes to the job's log
        payload = ("crash", traceback.format_exc())
    send_payload(conn, payload)


def _end(proc) -> None:
    """Kill the import's process group (the child and its helpers) and reap the child."""
    if proc.is_alive():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # not (yet) a group leader: the child alone
            proc.kill()
    proc.join()
    proc.close()


def prepare_stoppable(path: Path, rules: list[Rule], opts: ImportOptions, should_stop: Callable[[], bool],
                      timeout_s: float, log: Callable[[str], None]) -> RunRecord:
    """prepare_import(path, rules, opts) in a child process. Raises what the import raises (an
    IngestError with its message), CommandCancelled when should_stop() turns true, CommandTimeout
    past timeout_s, RunError when the child dies; a bug's traceback goes to `log` first."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(path, rules, opts, sender, receiver, os.getpid()),
                       name="stepwatch-import")
    with warnings.catch_warnings():
        # Python 3.12 warns when a process with threads (the heartbeat's) forks: the child runs
        # only the reader and the analysis, never code that waits on the other threads' locks
        warnings.simplefilter("ignore", DeprecationWarning)
        proc.start()
    sender.close()
    try:
        os.setpgid(proc.pid, proc.pid)  # here too, so that a kill right after the start reaches its group
    except OSError:
        pass
    deadline = time.monotonic() + timeout_s
    try:
        while not receiver.poll(POLL_S):
            if should_stop():
                raise CommandCancelled(f"the import of {path} was stopped")
            if time.monotonic() > deadline:
                raise CommandTimeout(f"the import of {path} ran past the job's timeout_s of {timeout_s:g} s "
                                     "and was stopped")
            if not proc.is_alive() and not receiver.poll(0):
                break
        try:
            kind, detail = receiver.recv()
        except (EOFError, OSError):
            proc.join()
            raise RunError(f"the import of {path} died (exit code {proc.exitcode}: "
                           f"{'a signal' if (proc.exitcode or 0) < 0 else 'no answer'})") from None
    finally:
        receiver.close()
        _end(proc)
    if kind == "ok":
        return detail
    if kind == "ingest":
        raise IngestError(detail)
    log(detail)
    raise RuntimeError(f"the import of {path} failed in its process: {detail.strip().splitlines()[-1]}")
