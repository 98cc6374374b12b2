"""`python -m ingest`. An import is batch work from its first instruction: a thread for its
database work starts at the process's priority, then the main thread lowers itself before the
heavy modules load (ingest/priority.py)."""

import sys

db_thread = None
if sys.argv[1:2] == ["import"]:
    from .priority import DatabaseThread, lower_this_thread

    db_thread = DatabaseThread()
    lower_this_thread()

from .cli import main  # noqa: E402 -- after the priority is set

sys.exit(main(db_thread=db_thread))
