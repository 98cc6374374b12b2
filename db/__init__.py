"""stepwatch's DuckDB store: the one place that holds SQL. `db.store` opens the file (one writer,
readers beside it: db.lock, db.attach), applies the numbered migrations and writes; `db.views` and
`db.series` are the pages' and the trackers' named reads.

May import: nothing from app/, ingest/ or kernels/ (DuckDB, pandas and the standard library).
`db.DEFAULT_DB` and `db.StoreError` load nothing heavy (db.common); `db.store.open_db` loads DuckDB."""

from .common import DEFAULT_DB, StoreError

__all__ = ["DEFAULT_DB", "StoreError"]
