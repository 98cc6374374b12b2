"""DuckDB's engine, loaded without the Python layer the `duckdb` package adds on import.

DuckDB 2.x ships its C++ engine as the top-level module `_duckdb` (with typed stubs,
`_duckdb-stubs`); `import duckdb` loads it and then the package's own Python: the relation
builder (`duckdb._relation`), data sources, expressions, and `importlib.metadata` for its
version. stepwatch's SQL needs none of that -- connections, `execute` with `?` parameters, the
fetches, `register` of NumPy columns and the exceptions are all the engine's -- and the package's
Python costs more than the engine: `python -X importtime`, this 2-core machine, idle:
`import duckdb` 206-250 ms, of which `_duckdb` 45-47 ms (ingest/BENCHMARKS.md, start-up).
A report starts in that difference.

`duckdb` here is the engine module; the classes and exceptions are the very objects the package
re-exports (`duckdb.Error is _duckdb.Error`), so code elsewhere that imports the package (the
dashboard, tests) catches the same errors and sees the same connections. What the package adds
to connections when it is imported (`con.sql`, `con.table`, `con.read_json`, ...: the relation
API) is not used in db/. One scan needs the package: DuckDB 2.x reads Arrow tables through
Python the package sets up when imported (`duckdb._sources`; without it: "Python Arrow objects
cannot be scanned"), so db/ calls `load_arrow_scans()` before handing the engine an Arrow table
(only for a record made of DataFrames). NumPy columns and DataFrames are scanned by the engine
alone. DuckDB 1.x has no `_duckdb` module: there the package is loaded.
"""

from __future__ import annotations

try:
    import _duckdb as duckdb
except ImportError:  # DuckDB 1.x: the engine lives inside the package
    import duckdb


def load_arrow_scans() -> None:
    """Have the engine scan Arrow tables (see above): loads the `duckdb` package, once."""
    import duckdb as package  # noqa: F401 -- imported for what it sets up


__all__ = ["duckdb", "load_arrow_scans"]
