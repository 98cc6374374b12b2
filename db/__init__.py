"""stepwatch's DuckDB store: the one place that holds SQL. See db.store for the queries.

`db.DEFAULT_DB` and `db.StoreError` load nothing heavy (db.common); `db.store.open_db` loads
DuckDB."""

from .common import DEFAULT_DB, StoreError

__all__ = ["DEFAULT_DB", "StoreError"]
