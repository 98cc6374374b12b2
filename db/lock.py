"""Who may open the database file now: one writer at a time, served in a fair queue.

DuckDB lets one process write a file only while no other process has it open, and refuses a
connection otherwise. Waiting by retrying the connection with back-off (as open_db did alone)
lets a page oversleep a writer's release and lose every race to the next writer: with a
worker and four imports writing, a page waited 1.5 s at p99. Ordering the processes by racing
for a second flock (this module before issue 29) bounded the usual wait to one write, but a
page that lost the race to writers past their patience waited behind two or three: 515-1,642
ms, once or twice a minute (db/BENCHMARKS.md). So waiters now take tickets and are served in
ticket order, with readers batched:

- Exclusion is L, `<db>.lock`: a reader holds it shared and a writer exclusive (flock), for
  as long as its connection is open; so DuckDB's own lock never refuses a stepwatch process.
- The queue is the directory `<db>.lock-queue/`. Its counter `ticket` (8 bytes, changed only
  under its own flock) hands out 1, 2, 3, ... A waiter makes its entry, a file it holds
  flocked (exclusive) from before the file is named until it leaves the queue: made under a
  temporary name, locked, then renamed `<ticket>.r` or `<ticket>.w` under the counter's lock
  with the number just drawn. A reader leaves the queue once it holds L; a writer when it
  lets L go. An entry whose flock is free belongs to a process that has gone (the kernel
  drops a process's flocks when it dies, however it dies): it is not waited for, and whoever
  finds it removes it.
- A writer (ticket w) waits until every writer with a lower ticket has left: writers are
  served in the order they asked. It is then the head and arms: draws a second number A,
  writes it into its entry, and waits until every reader entry below A is gone (those
  readers hold L shared by then, or have died); then it takes L exclusive as soon as they
  let go.
- A reader (ticket r) waits until no armed writer with A < r is in the queue, then takes L
  shared. Readers that ask while readers are being served, or while a writer waits behind a
  write that is not yet its turn, go at once.

What that guarantees:
- One writer at a time (L), and while a writer holds L it is the armed head, so readers
  that ask during a write wait for that write alone: the next writer arms only when it has
  left, with an A above their tickets.
- A reader waits for at most one writer: the write in progress, or the armed writer that is
  waiting for older readers to finish (their reads, then its write). Never two writes.
- No writer starves: readers that ask after it armed wait for it, and the readers before
  it are finitely many; writers behind it wait their turn in ticket order.
- A waiter killed while queued (kill -9 included) stops blocking the moment it dies: its
  entry's flock is gone with it. A holder that dies drops L the same way.
- Deadlines are honoured: every wait polls with LOCK_NB every `POLL_S` (a blocking flock
  cannot time out) and gives up past the caller's deadline, its entry removed; the caller
  says the database is busy.

One look at the queue suffices for each wait: what a waiter waits for can only leave, never
arrive. Tickets are drawn, entries named and writers armed under the counter's lock, so an
entry below a waiter's number, or an A below it, exists before the waiter looks; the
writer or reader entries it finds below its number then only leave. A waiter therefore scans
the directory once per phase and then polls only the flocks of the entries it found.

Within one thread a second open of the same file (a view opening the database while the
caller holds it) reuses the hold instead of waiting for itself. Where the lock files cannot
be created (a read-only directory, `:memory:`), or with STEPWATCH_DB_LOCKS=0 (a filesystem
whose flock misbehaves; db/studies/load.py's baseline), nothing is locked and DuckDB's own
refusal and the caller's retries are all there is. Processes that do not take these locks
(older stepwatch versions, other tools) are still kept out by DuckDB's lock; an older
stepwatch that takes only L is still excluded by L, though not served in turn. A process
killed between making its entry and naming it (a few system calls) leaves a temporary file
nothing waits for; one older than `STALE_TEMP_S` is removed by the next writer that arms.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import threading
import time
from typing import NamedTuple

POLL_S = 0.002  # how often a waiter looks again at the flock it waits for
STALE_TEMP_S = 60.0  # an unnamed entry this old belongs to a process killed while making it
QUEUE_SUFFIX = ".lock-queue"
WAIT_LOG = os.environ.get("STEPWATCH_DB_WAIT_LOG")  # a file: one line per wait (db/studies/load.py reads it)

_held = threading.local()  # path -> depth of this thread's holds
_OPEN_FDS: set[int] = set()  # every lock or queue file this process holds, for _after_fork
_TEMP_NAMES = itertools.count(1)
_ENTRY = re.compile(r"^(\d{20})\.([rw])$")


def _after_fork() -> None:
    """A forked child (the trace reader's helper) must not keep its parent's holds or queue
    places: an flock belongs to the open file, which the child shares until it closes its copy."""
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


def _open_fd(path: str, flags: int = os.O_RDONLY) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC)
    _OPEN_FDS.add(fd)
    return fd


def _close_fd(fd: int) -> None:
    _OPEN_FDS.discard(fd)
    os.close(fd)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _wait(deadline: float) -> None:
    if time.monotonic() >= deadline:
        raise LockTimeout
    time.sleep(POLL_S)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Queue:
    """The queue directory of one database: draw numbers, make entries, find who is ahead."""

    def __init__(self, directory: str, counter_fd: int):
        self.dir = directory
        self.counter_fd = counter_fd

    @classmethod
    def open(cls, db_path: str) -> "_Queue | None":
        directory = db_path + QUEUE_SUFFIX
        try:
            os.makedirs(directory, exist_ok=True)
            return cls(directory, _open_fd(os.path.join(directory, "ticket"), os.O_RDWR | os.O_CREAT))
        except OSError:
            return None

    def close(self) -> None:
        _close_fd(self.counter_fd)

    def _draw(self) -> int:
        """The next number (the caller holds the counter's lock)."""
        raw = os.pread(self.counter_fd, 8, 0)
        number = (int.from_bytes(raw, "little") if len(raw) == 8 else 0) + 1
        os.pwrite(self.counter_fd, number.to_bytes(8, "little"), 0)
        return number

    @contextlib.contextmanager
    def _locked_counter(self, deadline: float):
        while not _try(self.counter_fd, fcntl.LOCK_EX):  # held for a few system calls at a time
            _wait(deadline)
        try:
            yield
        finally:
            fcntl.flock(self.counter_fd, fcntl.LOCK_UN)

    def enter(self, kind: str, deadline: float) -> tuple[int, int, str]:
        """A new entry of `kind` ("r" or "w"): (ticket, its locked fd, its path)."""
        temp = os.path.join(self.dir, f"temp-{os.getpid()}-{threading.get_native_id()}-{next(_TEMP_NAMES)}")
        fd = _open_fd(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file nobody else has opened: free at once
            with self._locked_counter(deadline):
                ticket = self._draw()
                path = os.path.join(self.dir, f"{ticket:020d}.{kind}")
                os.rename(temp, path)
        except BaseException:
            _unlink_quietly(temp)
            _close_fd(fd)
            raise
        return ticket, fd, path

    def arm(self, fd: int, deadline: float) -> int:
        """Draw A for the head writer whose entry is `fd` and write it into the entry."""
        with self._locked_counter(deadline):
            armed = self._draw()
            os.pwrite(fd, str(armed).encode(), 0)
        self._remove_stale_temps()
        return armed

    def look(self, below: int, kinds: str) -> list["_Entry"]:
        return _look(self.dir, below, kinds)

    def _remove_stale_temps(self) -> None:
        now = time.time()
        for name in os.listdir(self.dir):
            if not name.startswith("temp-"):
                continue
            path = os.path.join(self.dir, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if now - os.fstat(fd).st_mtime > STALE_TEMP_S and _try(fd, fcntl.LOCK_SH):
                    _unlink_quietly(path)
            finally:
                os.close(fd)


class _Entry(NamedTuple):
    """A place in the queue as another waiter sees it, with an fd of its own to poll the flock."""
    ticket: int
    kind: str  # "r" or "w"
    armed: int | None  # a writer's A, once it is the head
    fd: int
    path: str


def _look(directory: str, below: int, kinds: str) -> list[_Entry]:
    """Live entries of `kinds` with a ticket below `below`. Entries whose owner has gone are removed."""
    found = []
    for name in os.listdir(directory):
        match = _ENTRY.match(name)
        if not match or int(match.group(1)) >= below or match.group(2) not in kinds:
            continue
        path = os.path.join(directory, name)
        try:
            fd = _open_fd(path)
        except FileNotFoundError:  # it left between the listing and now
            continue
        if _try(fd, fcntl.LOCK_SH):  # nobody holds it: its owner left or died
            _unlink_quietly(path)
            _close_fd(fd)
            continue
        raw = os.pread(fd, 32, 0).decode(errors="replace").strip()
        found.append(_Entry(int(match.group(1)), match.group(2), int(raw) if raw.isdigit() else None, fd, path))
    return found


def _wait_until_gone(entries: list[_Entry], deadline: float) -> None:
    """Poll each entry's flock until its owner has let it go (left the queue, or died: then its
    file is removed here)."""
    try:
        for entry in entries:
            while not _try(entry.fd, fcntl.LOCK_SH):
                _wait(deadline)
            _unlink_quietly(entry.path)  # already gone if it left; names are never used twice
    finally:
        for entry in entries:
            _close_fd(entry.fd)


def list_queue(db_path: str) -> list[tuple[int, str, int | None]]:
    """Who is in `db_path`'s queue now, in ticket order: (ticket, "r" or "w", A if armed). For
    tests and for a person asking why a page waits; it changes nothing but dead entries."""
    directory = str(db_path) + QUEUE_SUFFIX
    if not os.path.isdir(directory):
        return []
    entries = _look(directory, 2**63, "rw")
    for entry in entries:
        _close_fd(entry.fd)
    return sorted((e.ticket, e.kind, e.armed) for e in entries)


class DbLock:
    """A hold on database `path`'s locks: shared for a reader, exclusive for a writer."""

    def __init__(self, path: str, write: bool, deadline: float):
        self.key = os.path.realpath(path)
        self.fds: list[int] = []
        self.entry: str | None = None
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
        main = _open_lock_file(path + ".lock")
        queue = _Queue.open(path) if main is not None else None
        if main is None or queue is None:
            if main is not None:
                os.close(main)
            return
        _OPEN_FDS.add(main)
        entry_fd, entry = None, None
        t0 = time.monotonic()
        try:
            ticket, entry_fd, entry = queue.enter("w" if write else "r", deadline)
            if write:
                ahead = queue.look(ticket, "w")
                waited = [e.ticket for e in ahead]
                _wait_until_gone(ahead, deadline)  # the writers before it, in turn
                armed = queue.arm(entry_fd, deadline)
                ahead = queue.look(armed, "r")
                waited += [e.ticket for e in ahead]
                _wait_until_gone(ahead, deadline)  # the readers before it took L
                t_queue = time.monotonic()
                while not _try(main, fcntl.LOCK_EX):  # ... and let it go
                    _wait(deadline)
            else:
                writers = queue.look(ticket, "w")
                ahead = [e for e in writers if e.armed is not None and e.armed < ticket]  # at most one: the head
                for e in writers:
                    if e not in ahead:
                        _close_fd(e.fd)
                waited, armed = [e.ticket for e in ahead], None
                _wait_until_gone(ahead, deadline)
                t_queue = time.monotonic()
                while not _try(main, fcntl.LOCK_SH):  # free unless a process outside the queue holds it
                    _wait(deadline)
        except BaseException as exc:
            _close_fd(main)
            if entry is not None:
                _unlink_quietly(entry)
                _close_fd(entry_fd)
            if isinstance(exc, OSError):  # the queue's files cannot be written (a full disk): as when
                return  # the lock files cannot be created, nothing is locked (DuckDB's refusal remains)
            raise
        finally:
            queue.close()
        if WAIT_LOG:
            _log_wait(write, t0, t_queue, ticket, armed, waited)
        if write:  # a writer stays in the queue, armed, until it lets L go
            self.fds, self.entry = [main, entry_fd], entry
        else:  # a reader leaves the queue as soon as it holds L
            _unlink_quietly(entry)
            _close_fd(entry_fd)
            self.fds = [main]

    def release(self) -> None:
        depth = _held.depth
        depth[self.key] -= 1
        if depth[self.key]:
            return
        del depth[self.key]
        if self.fds:
            _close_fd(self.fds[0])  # closing drops the flock; L is free before the queue moves on
        if self.entry is not None:  # a writer's entry: the next writer may arm
            _unlink_quietly(self.entry)
            _close_fd(self.fds[1])
        self.fds, self.entry = [], None


def _log_wait(write: bool, t0: float, t_queue: float, ticket: int, armed: int | None, waited: list[int]) -> None:
    """One line: pid, thread, mode, ms in the queue, ms then for L, how many entries it waited for,
    its ticket, its A (a writer's; "-" for a reader) and the tickets it waited for ("-": none)."""
    now = time.monotonic()
    with open(WAIT_LOG, "a") as out:
        out.write(f"{os.getpid()} {threading.get_native_id()} {'write' if write else 'read'} "
                  f"{1000 * (t_queue - t0):.1f} {1000 * (now - t_queue):.1f} {len(waited)} {ticket} "
                  f"{armed if armed is not None else '-'} {','.join(map(str, waited)) or '-'}\n")
