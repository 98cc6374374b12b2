"""`python -m ingest`. An import is batch work from its first instruction: a thread for its
database work starts at the process's priority, then the main thread lowers itself before the
heavy modules load (ingest/priority.py).

A report ends without the interpreter's teardown: it only reads, and by the time `main` returns
its database file is detached and closed and its output written; flushing the output and
`os._exit` then saves the 40-60 ms that freeing every module and DuckDB's instance took here
(ingest/BENCHMARKS.md, start-up). Every other command exits normally (a worker's or an import's
threads, helpers and atexit handlers have work to finish)."""

import os
import sys

db_thread = None
if sys.argv[1:2] == ["import"]:
    from .priority import DatabaseThread, lower_this_thread

    db_thread = DatabaseThread()
    lower_this_thread()

from .cli import main  # noqa: E402 -- after the priority is set

code = main(db_thread=db_thread)
if sys.argv[1:2] == ["report"]:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to tell it
        pass
    os._exit(code)
sys.exit(code)
