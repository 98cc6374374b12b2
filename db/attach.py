"""One DuckDB instance per process; the database file attached to it for each unit of work.

Creating a DuckDB instance (what `duckdb.connect(path)` does) costs 20-40 ms on the 2-core
machine with DuckDB 2.0 -- more than most of a page's queries -- while attaching a file to an
instance that exists costs ~4 ms (db/BENCHMARKS.md). stepwatch may not keep the file attached
between units of work (other processes write it), so each `attach` runs

    ATTACH '<file>' AS sw_<n> [(READ_ONLY)]; USE sw_<n>      -- in a cursor of the instance

and `detach` runs `USE memory; DETACH sw_<n>` (DETACH checkpoints and lets the file go, so
another process can open it at once). Unqualified table names in every query resolve to the
attached file because USE is per cursor.

DuckDB refuses to attach one file twice in one instance when either attachment is writable,
so the file's attachment is shared within the process: a reader reuses a writable
attachment; a writer waits (up to its deadline) for the process's read-only attachment to
go. A file that another process holds is retried with jittered back-off, as before
(callers: db/store.py open_db, which first takes db/lock.py's locks).
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from dataclasses import dataclass

from .engine import duckdb

_STATE = threading.Condition()
_INSTANCE: list[duckdb.DuckDBPyConnection] = []
_NAMES = itertools.count(1)
_ORPHANED: list[duckdb.DuckDBPyConnection] = []  # a forked child's copy of its parent's instance


class AttachError(Exception):
    """Why the file could not be attached: `busy` (held elsewhere past the deadline) or a DuckDB line."""

    def __init__(self, line: str, busy: bool = False):
        super().__init__(line)
        self.busy = busy


@dataclass
class _Attachment:
    alias: str
    read_only: bool
    users: int


_ATTACHED: dict[str, _Attachment] = {}


def _after_fork() -> None:
    """A forked child starts without the parent's instance (its threads did not come along)."""
    global _STATE
    _STATE = threading.Condition()  # another thread may have held it at the fork
    _ORPHANED.extend(_INSTANCE)  # never freed here: closing it would join threads the child lacks
    _INSTANCE.clear()
    _ATTACHED.clear()


os.register_at_fork(after_in_child=_after_fork)


def _instance() -> duckdb.DuckDBPyConnection:
    if not _INSTANCE:
        _INSTANCE.append(duckdb.connect(":memory:"))
    return _INSTANCE[0]


def _is_lock_conflict(error: Exception) -> bool:
    text = str(error).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def attach(path: str, read_only: bool, deadline: float) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A cursor whose USE is the attached file, and the key to give back to `detach`."""
    key = os.path.realpath(path)
    with _STATE:
        while key in _ATTACHED and _ATTACHED[key].read_only and not read_only:
            if not _STATE.wait(timeout=max(0.0, deadline - time.monotonic())):
                raise AttachError("busy", busy=True)
        att = _ATTACHED.get(key)
        if att is None:
            att = _Attachment(f"sw_{next(_NAMES)}", read_only, 0)
            _attach_file(path, att, deadline)
            _ATTACHED[key] = att
        att.users += 1
        cursor = _instance().cursor()
    try:
        cursor.execute(f"USE {att.alias}")
    except BaseException:
        cursor.close()
        detach(key)
        raise
    return cursor, key


def _attach_file(path: str, att: _Attachment, deadline: float) -> None:
    sql = f"ATTACH {_sql_string(path)} AS {att.alias}" + (" (READ_ONLY)" if att.read_only else "")
    delay = 0.005
    while True:
        try:
            _instance().execute(sql)
            return
        except duckdb.Error as e:
            if not _is_lock_conflict(e):
                raise AttachError(str(e).splitlines()[0]) from None
            if time.monotonic() >= deadline:
                raise AttachError("busy", busy=True) from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)


def detach(key: str) -> None:
    """One user fewer; the last one detaches the file (DuckDB checkpoints it and lets it go)."""
    with _STATE:
        att = _ATTACHED[key]
        att.users -= 1
        if att.users:
            return
        del _ATTACHED[key]
        try:
            _instance().execute(f"DETACH {att.alias}")
        finally:
            _STATE.notify_all()
