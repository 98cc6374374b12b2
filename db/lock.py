"""Who may open the database file now: one writer at a time, and a waiting page before the next writer.

DuckDB lets one process write a file only while no other process has it open, and refuses a
connection otherwise. Waiting by retrying the connection with back-off (as open_db did alone)
lets a page oversleep a writer's release by up to the back-off cap and lose every race to
the next writer: with a worker and four imports writing, a page waited 1.5 s at p99.

Two advisory locks (flock) on files beside the database order the processes instead:

- L, `<db>.lock`: a reader holds it shared and a writer exclusive, for as long as its
  connection is open; so DuckDB's own lock never refuses a stepwatch process.
- R, `<db>.lock-readers`: a reader holds it shared from the moment it asks until it holds L.
  A writer must hold R exclusive to take L, and lets R go as soon as it holds L.

While a reader waits, no writer can start: the reader waits for at most the one write in
progress. A writer that has waited `WRITER_PATIENCE_S` keeps R once it has it, so new readers
queue behind it and a stream of readers cannot starve it. Waiting polls with LOCK_NB every
`POLL_S` (a blocking flock cannot time out); past the caller's deadline it gives up, and the
caller says the database is busy.

Within one thread a second open of the same file (a view opening the database while the
caller holds it) reuses the hold instead of waiting for itself. Where the lock files cannot
be created (a read-only directory, `:memory:`), or with STEPWATCH_DB_LOCKS=0 (a filesystem
whose flock misbehaves; db/load_benchmark.py's baseline), nothing is locked and DuckDB's own refusal
and the caller's retries are all there is. Processes that do not take these locks (older
stepwatch versions, other tools) are still kept out by DuckDB's lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

POLL_S = 0.002
WRITER_PATIENCE_S = 1.0

_held = threading.local()  # path -> depth of this thread's holds
_OPEN_FDS: set[int] = set()  # every lock file this process holds, for _after_fork


def _after_fork() -> None:
    """A forked child (the trace reader's helper) must not keep its parent's holds: an flock
    belongs to the open file, which the child shares until it closes its copy."""
    for fd in list(_OPEN_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN_FDS.clear()
    _held.__dict__.clear()


os.register_at_fork(after_in_child=_after_fork)


class LockTimeout(Exception):
    """The lock was not free before the deadline."""


def _open_lock_file(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return None


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class DbLock:
    """A hold on database `path`'s locks: shared for a reader, exclusive for a writer."""

    def __init__(self, path: str, write: bool, deadline: float):
        self.key = os.path.realpath(path)
        self.fds: list[int] = []
        depth = getattr(_held, "depth", None)
        if depth is None:
            depth = _held.depth = {}
        if depth.get(self.key):
            depth[self.key] += 1
            return
        if path != ":memory:" and os.environ.get("STEPWATCH_DB_LOCKS", "1") != "0":
            self._acquire(path, write, deadline)
        depth[self.key] = 1

    def _acquire(self, path: str, write: bool, deadline: float) -> None:
        main, readers = _open_lock_file(path + ".lock"), _open_lock_file(path + ".lock-readers")
        if main is None or readers is None:
            for fd in (main, readers):
                if fd is not None:
                    os.close(fd)
            return
        try:
            (self._take_writer if write else self._take_reader)(main, readers, deadline)
        except BaseException:
            os.close(main)
            raise
        finally:
            os.close(readers)  # closing drops R, whichever way it went
        self.fds = [main]
        _OPEN_FDS.add(main)

    @staticmethod
    def _take_reader(main: int, readers: int, deadline: float) -> None:
        while not _try(readers, fcntl.LOCK_SH):  # a writer holds R only to take L, or when it has waited long
            _wait(deadline)
        while not _try(main, fcntl.LOCK_SH):  # the write in progress
            _wait(deadline)

    @staticmethod
    def _take_writer(main: int, readers: int, deadline: float) -> None:
        patient_until = time.monotonic() + WRITER_PATIENCE_S
        while True:
            if _try(readers, fcntl.LOCK_EX):
                if _try(main, fcntl.LOCK_EX):
                    return
                if time.monotonic() < patient_until:
                    fcntl.flock(readers, fcntl.LOCK_UN)  # let waiting readers go first
            _wait(deadline)

    def release(self) -> None:
        depth = _held.depth
        depth[self.key] -= 1
        if depth[self.key]:
            return
        del depth[self.key]
        for fd in self.fds:
            _OPEN_FDS.discard(fd)
            os.close(fd)  # closing drops the flock
        self.fds = []


def _wait(deadline: float) -> None:
    if time.monotonic() >= deadline:
        raise LockTimeout
    time.sleep(POLL_S)
