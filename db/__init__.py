"""stepwatch's DuckDB store: the one place that holds SQL. See db.store for the queries."""

from .store import DEFAULT_DB, StoreError, open_db

__all__ = ["DEFAULT_DB", "StoreError", "open_db"]
