"""Batch work yields the CPU to pages: heavy phases that hold no database run at a lower priority.

Pages (the dashboard's reads) are interactive; reading and analysing a trace and detecting
changes are batch work worth seconds of CPU. With a worker and four imports on the 2-core
machine, pages waited for the CPU more than for the database (db/BENCHMARKS.md: page reads
p50 365 ms against 69 ms on the idle machine).

On Linux nice is a property of the thread: raising it needs no privilege, lowering it again
would, and a process forked from a thread (the trace reader's helper) inherits its value. A
holder of the database at low priority would make every page wait behind it for the CPU it
cannot get (whole processes niced gave page reads p50 85 ms but p99 684 ms, all of it waiting
for niced writers), so only work that holds no database runs lowered:

- `run_as_batch(fn, ...)`: fn in a new thread whose nice is raised by BATCH_NICE; for work
  that may run outside the main thread (change detection).
- `DatabaseThread()` then `lower_this_thread()`: a command whose main thread does the heavy
  work (an import: the `--rules` regex time limit needs SIGALRM, which only the main thread
  receives) first starts a thread at its own priority for the database, then lowers itself,
  and hands each unit of database work to that thread (`db_thread(fn, ...)`).

STEPWATCH_BATCH_NICE=0 turns all of it off; where setpriority is refused the work just runs.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
BATCH_NICE = int(os.environ.get("STEPWATCH_BATCH_NICE", "10"))


def lower_this_thread() -> None:
    """Raise the calling thread's nice by BATCH_NICE (for good: it cannot be lowered back)."""
    if BATCH_NICE <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BATCH_NICE))
    except (OSError, AttributeError):
        pass


def run_as_batch(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) at batch priority; its result, or its exception raised here."""
    if BATCH_NICE <= 0:
        return fn(*args, **kwargs)
    outcome: dict = {}

    def body() -> None:
        lower_this_thread()
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=body, name="stepwatch-batch", daemon=True)  # Ctrl-C still ends the process
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class DatabaseThread:
    """One thread kept at the priority the process had when it was made, for database work."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepwatch-db")
        self._pool.submit(int).result()  # start it now, before the caller lowers itself

    def __call__(self, fn: Callable[..., T], *args, **kwargs) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> "DatabaseThread":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
