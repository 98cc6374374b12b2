"""How pages reach the database: a page reads in batches of db.views calls, each result cached
until the file changes and the uncached ones run in one short read-only connection; every
write (queueing, cancelling) is one short read-write connection. No connection outlives the
call, because DuckDB lets one process write the file only while no other process has it open,
and workers write to it all the time.

Within this process one connection is open at a time (DuckDB refuses a read-only and a
read-write connection to one file side by side in a process). A StoreError (busy database, no
file, unreadable file) is turned into a sentence here, at the page's edge, and the page stops.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import streamlit as st

from db import views
from db.store import DEFAULT_DB, Store, StoreError, open_db

from .markdown_text import Markdown, format_markdown

_ONE_CONNECTION = threading.Lock()


def find_db_path() -> str:
    return os.environ.get("STEPWATCH_DB", DEFAULT_DB)


def find_wait_s() -> float:
    """How long a page waits for a worker or an import to let go of the file."""
    return float(os.environ.get("STEPWATCH_DB_WAIT_S", "10"))


def read_file_stamp(path: str) -> tuple:
    """Changes whenever the database or its write-ahead log changes (the cache key)."""
    stamp = []
    for p in (Path(path), Path(path + ".wal")):
        try:
            st_ = p.stat()
            stamp.append((st_.st_mtime_ns, st_.st_size))
        except FileNotFoundError:
            stamp.append(None)
    return tuple(stamp)


def explain_store_error(error: Exception, path: str) -> Markdown:
    """The sentence a page shows for a database it cannot read (Markdown: the path and the
    error's text are shown as text)."""
    text = str(error).splitlines()[0]
    if isinstance(error, duckdb.Error):
        return format_markdown("The database at {} cannot be read ({}). If an older stepwatch wrote it, any write "
                               "brings its schema up to date: start the worker, or import a trace.", path, text)
    if "database busy" in text:
        return format_markdown("The database is busy: another stepwatch process (a worker or an import) has held "
                               "{} for {:g} s. Reload the page in a moment.", path, find_wait_s())
    if "no such database file" in text:
        return format_markdown("There is no database at {} yet. Start stepwatch with ./run.sh (it loads the sample "
                               "runs), or import a trace with {:code}.", path,
                               f"python -m ingest import PATH --db {path}")
    return format_markdown("The database cannot be read: {}", text)


@contextlib.contextmanager
def _connect(read_only: bool) -> Iterator[Store]:
    with _ONE_CONNECTION:
        with open_db(find_db_path(), read_only=read_only, wait_s=find_wait_s()) as store:
            yield store


class _Batch(threading.local):
    """The read-only connection of the load_all call running in this thread: opened at its first
    cache miss (a batch served from the cache opens none), closed when the call returns, or
    inside `reading()` when that block ends."""

    store: Store | None = None
    depth: int = 0

    def open_store(self, path: str) -> Store:
        if self.store is None:
            _ONE_CONNECTION.acquire()
            try:
                self.store = open_db(path, read_only=True, wait_s=find_wait_s())
            except BaseException:
                _ONE_CONNECTION.release()
                raise
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
            _ONE_CONNECTION.release()


_BATCH = _Batch()


@st.cache_data(ttl=600, max_entries=1000, show_spinner=False)
def _load_cached(view_name: str, path: str, stamp: tuple, args: tuple):
    return getattr(views, view_name)(_BATCH.open_store(path), *args)


def load_all(*calls: tuple):
    """`load_all((views.get_run_detail, 5), (views.list_recent_runs,))`: the views' results, each
    from the cache while the file is unchanged; the ones not cached share one read-only
    connection (opening one costs ~10 ms, more than most queries). On a StoreError the page
    shows why and stops."""
    path = find_db_path()
    stamp = read_file_stamp(path)
    try:
        return [_load_cached(view.__name__, path, stamp, tuple(args)) for view, *args in calls]
    except (StoreError, duckdb.Error) as e:
        st.warning(explain_store_error(e, path))
        st.stop()
    finally:
        if not _BATCH.depth:
            _BATCH.close()


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Every load_all in the block shares one read-only connection (opened at the first cache
    miss, closed when the block ends): a page whose second reads depend on its first (Trends:
    the series, then the chosen series' trend) waits for writers once, not once per read."""
    _BATCH.depth += 1
    try:
        yield
    finally:
        _BATCH.depth -= 1
        if not _BATCH.depth:
            _BATCH.close()


def load(view: Callable, *args):
    """`load(views.get_trend, repo, engine, device, workload_id)`: one view, as load_all."""
    return load_all((view, *args))[0]


def load_fresh(view: Callable, *args):
    """As `load`, but always asked of the database (for what changes without the file changing,
    such as a job's age)."""
    path = find_db_path()
    try:
        with _connect(read_only=True) as store:
            return view(store, *args)
    except (StoreError, duckdb.Error) as e:
        st.warning(explain_store_error(e, path))
        st.stop()


def write(action: Callable[[Store], object]) -> tuple[object, str | None]:
    """Run `action(store)` in one short read-write connection: (its result, None), or (None, the
    sentence saying why the database could not be written)."""
    path = find_db_path()
    try:
        with _connect(read_only=False) as store:
            return action(store), None
    except (StoreError, duckdb.Error) as e:
        return None, explain_store_error(e, path)
