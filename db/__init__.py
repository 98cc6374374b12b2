"""stepwatch's DuckDB store: the one place that holds SQL. See db.store for the queries.

`db.DEFAULT_DB` and `db.StoreError` load nothing heavy (db.common); `db.open_db` loads db.store
(DuckDB, pandas) when first asked for."""

from .common import DEFAULT_DB, StoreError


def __getattr__(name: str):
    if name == "open_db":
        from .store import open_db

        return open_db
    raise AttributeError(f"module 'db' has no attribute {name!r}")


__all__ = ["DEFAULT_DB", "StoreError", "open_db"]
