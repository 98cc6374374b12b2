"""What the command line needs of the database before it loads DuckDB or pandas: the default
file and the error every database failure is reported as (db.store re-exports both)."""

import os

DEFAULT_DB = os.environ.get("STEPWATCH_DB", "stepwatch.duckdb")


class StoreError(Exception):
    """The database file cannot be opened or used; the message names the file."""
