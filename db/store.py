"""The DuckDB file: opening it, migrating it, writing runs, commits and jobs, and reading one
run's rows (its row, ranks, categories and kernels: what `ingest report` reads without pandas).
The pages' queries are in db.views, change tracking's in db.series.

One `Store` owns a connection. Each method carries its SQL inline with `?` parameters; values
are never formatted into SQL. Migrations are the numbered files in db/migrations, applied in
order on open and recorded in `schema_migrations`.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .attach import AttachError, attach, detach
from .common import DEFAULT_DB, StoreError
from .engine import duckdb, load_arrow_scans
from .lock import DbLock, LockTimeout
from .series import STEP_MS, series_columns_sql

if TYPE_CHECKING:  # frames come from DuckDB's .df(), which loads pandas when first called
    import pandas as pd

MIGRATIONS = Path(__file__).with_name("migrations")


@dataclass(frozen=True)
class RunRecord:
    """What one import writes: the run row's fields plus its three tables."""

    content_hash: str
    repo: str | None
    commit: str | None
    variant: str | None
    engine: str | None
    workload: dict | None
    device_name: str | None
    peak_gbps: float | None
    ranks: int
    steps: int
    step_method: str
    step_ms_median: float | None
    tok_per_s: float | None
    layers: int | None
    copy_share: float | None
    gpu_busy_share: float | None
    kernel_us_total: float
    kernels_from_cpu_ops: bool
    source_path: str
    manifest: dict | None
    # the tables: an import's columnar tables (ingest/traces/table.py; `.to_pandas()` for a frame), or
    # DataFrames in a record made by hand (tests); run_tables takes either
    step_table: Any  # rank, step, wall_us, gpu_busy_us, kernel_us
    step_categories: Any  # rank, step, category, dur_us
    kernel_stats: Any  # rank, name, category, launcher, source, calls, ...
    workload_key: str | None = None
    batch_size: int | None = None
    timing_ms_median: float | None = None
    timing_ms_p10: float | None = None
    timing_ms_p90: float | None = None
    job_id: int | None = None
    diagnosis: list | None = None
    notes: list | None = None  # sentences a reader of the figures must know (step method, anomalies)
    rank_stats: Any = None  # rank, device_name, steps, step_ms_median, busy/comm/wait ms per step, ...
    timeline: dict | None = None  # the first rank's GPU timeline figures (ingest/traces/timeline.py)
    consistency: dict | None = None  # do the figures agree (ingest/regress/consistency.py)
    patterns: dict | None = None  # the pattern catalog's findings (ingest/regress/patterns.py)
    graph_attribution: dict | None = None  # how graph kernels were attributed (ingest/traces/graph_attribution.py)
    roofline: dict | None = None  # the device ceilings the kernels' roofline fractions are of (devices.toml)
    # the traces the dashboard may serve (migration 013): their directory, resolved, and each one's
    # {"name", "bytes", "sha256"} (None: none is offered)
    trace_root: str | None = None
    trace_digests: list | None = None
    # a sweep's point (migration 015): the sweep's id and the point's index among its combinations
    sweep_id: str | None = None
    sweep_point: int | None = None
    # the engine's own figures of the point (SGLang one-batch's JSONL; migration 015), NULL where none
    prefill_ms: float | None = None
    prefill_tok_per_s: float | None = None
    decode_ms_median: float | None = None
    decode_tok_per_s_median: float | None = None
    total_latency_ms: float | None = None
    peak_gpu_mem_bytes: int | None = None


RunTables = dict  # "steps", "cats", "kernels" and maybe "ranks": each a dict of NumPy columns (or an Arrow table)
# kernel_stats' roofline columns (migration 011; ingest/traces/roofline.py), NaN stored as NULL
ROOFLINE_COLUMNS = ("flops_per_call", "model_bytes_per_call", "intensity", "tflops", "tbps", "compute_fraction",
                    "bandwidth_fraction", "bound")
# a sweep point's run columns (migration 015), written as the record holds them
SWEEP_COLUMNS = ("sweep_id", "sweep_point", "prefill_ms", "prefill_tok_per_s", "decode_ms_median",
                 "decode_tok_per_s_median", "total_latency_ms", "peak_gpu_mem_bytes")
_ROOFLINE_SELECT = ", ".join(f"CASE WHEN isnan({c}) THEN NULL ELSE {c} END" for c in ROOFLINE_COLUMNS[:-1])


def run_tables(rec: RunRecord) -> RunTables:
    """The record's tables as DuckDB scans them, for Store.insert_run: made before the file is opened.

    An import's tables (ingest/traces/table.py: `columns` and a NumPy array per name) become dicts
    of those arrays, which DuckDB scans without pandas or pyarrow (NaN and None read as NULL). A
    pandas DataFrame (a record made by a test or a study) becomes an Arrow table: DuckDB scans a
    frame column by column through pandas, ~3x slower than Arrow, and that time would be spent
    holding the file."""
    import numpy as np  # here: `ingest report` reads runs through this module without NumPy

    kernels = _columns_of(rec.kernel_stats)
    n = len(next(iter(kernels.values()), ()))
    if "ms_per_step_sd" not in kernels:  # a record made without per-step spreads (tests, old readers)
        kernels["ms_per_step_sd"] = np.full(n, np.nan)
    if "input_dtypes" not in kernels:  # ... or without input dtypes
        kernels["input_dtypes"] = np.full(n, "", dtype=object)
    for column in ("graph_op", "graph_source", "graph_layers"):  # ... or without graph attribution
        if column not in kernels:
            kernels[column] = np.full(n, "", dtype=object)
    for column in ROOFLINE_COLUMNS:  # ... or without the roofline (bound: text, the others numbers)
        if column not in kernels:
            kernels[column] = np.full(n, None, dtype=object) if column == "bound" else np.full(n, np.nan)
    tables = {"steps": _columns_of(rec.step_table), "cats": _columns_of(rec.step_categories), "kernels": kernels}
    if rec.rank_stats is not None and len(rec.rank_stats):
        tables["ranks"] = _columns_of(rec.rank_stats)
    if any(_is_frame(t) for t in (rec.kernel_stats, rec.step_table, rec.step_categories, rec.rank_stats)):
        import pyarrow as pa  # only for a record of DataFrames

        load_arrow_scans()
        tables = {name: pa.table(_arrow_columns(columns)) for name, columns in tables.items()}
    return tables


def _is_frame(table: Any) -> bool:
    """Whether a record's table is a pandas DataFrame (rather than an import's columnar table)."""
    return table is not None and type(table).__module__.startswith("pandas")


def _columns_of(table: Any) -> dict[str, Any]:
    """{column name: values} of a table with `columns` and column access (an import's Table, a DataFrame)."""
    return {str(name): table[name] for name in table.columns}


def _arrow_columns(columns: dict[str, Any]) -> dict[str, Any]:
    """DataFrame columns (or arrays) as Arrow arrays, NaN as null (as pa.Table.from_pandas reads them)."""
    import pyarrow as pa

    out = {}
    for name, values in columns.items():
        if type(values).__module__.startswith("pandas"):
            out[name] = pa.Array.from_pandas(values)
        else:
            out[name] = pa.array(values, from_pandas=True)
    return out


def _result(cursor: duckdb.DuckDBPyConnection, records: bool) -> "pd.DataFrame | list[dict]":
    """A query's rows as a DataFrame, or with `records` as dicts by column name (SQL NULL as
    None, NaN as NaN; DuckDB's integers stay integers)."""
    if not records:
        return cursor.df()
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _migration_files() -> list[tuple[int, str, Path]]:
    out = []
    for p in sorted(MIGRATIONS.glob("*.sql")):
        m = re.match(r"(\d+)_(\w+)\.sql$", p.name)
        if m:
            out.append((int(m.group(1)), m.group(2), p))
    return out


def open_db(path: str | os.PathLike = DEFAULT_DB, read_only: bool = False, wait_s: float = 30.0) -> "Store":
    """Open (creating if needed) the database and bring its schema up to date.

    DuckDB lets one process write a file at a time (and no process read it meanwhile), so
    every stepwatch process -- the app, workers, CLI imports -- holds a connection only for the
    few milliseconds of one unit of work: the file is attached to the process's DuckDB instance
    and detached on close (db/attach.py; a new instance per connection cost more than most
    queries). The order in which processes get the file is db/lock.py's (one writer at a time;
    a waiting reader before the next writer); a process that does not take those locks is
    waited for by retrying the attach with jittered back-off. Either wait ends after `wait_s`,
    and only then does "busy" reach anyone, as StoreError."""
    path = str(path)
    if read_only and not Path(path).exists():
        raise StoreError(f"{path}: no such database file")
    deadline = time.monotonic() + wait_s
    try:
        hold = DbLock(path, write=not read_only, deadline=deadline)
    except LockTimeout:
        raise StoreError(f"{path}: database busy: another process held it for {wait_s:g} s") from None
    created = not read_only and path != ":memory:" and not os.path.lexists(path)  # (under the write lock)
    try:
        cursor, key = attach(path, read_only, deadline)
    except AttachError as e:
        _remove_created(path, created)
        hold.release()
        if e.busy:
            raise StoreError(f"{path}: database busy: another process held it for {wait_s:g} s") from None
        raise StoreError(f"{path}: cannot open database ({e})") from None
    except BaseException:
        hold.release()
        raise
    store = Store(cursor, path, hold, key, read_only)
    try:
        if not read_only:
            store.migrate()
        elif store.list_pending_migrations():
            # a file a previous stepwatch wrote, read before anything opened it for writing (an
            # upgrade, then `ingest report` or the dashboard first): its schema is brought up to
            # date once by a writer, then it is read, instead of every query naming a column it lacks
            store.close()
            upgrade = open_db(path, read_only=False, wait_s=max(0.0, deadline - time.monotonic()))
            upgrade.close()
            return open_db(path, read_only=True, wait_s=max(0.0, deadline - time.monotonic()))
    except duckdb.Error as e:  # a damaged file, a foreign schema or a full disk, met by the migrations
        _close_quietly(store, path if created else None)
        raise StoreError(describe_db_error(path, e)) from None
    except BaseException:
        _close_quietly(store, path if created else None)
        raise
    return store


def _remove_created(path: str, created: bool) -> None:
    """A file this open created and could not finish (a full disk leaves 0 bytes, which every later
    open would take for a damaged database) is removed: the database is as it was, absent."""
    if not created:
        return
    for leftover in (path, path + ".wal"):
        try:
            os.unlink(leftover)
        except OSError:
            pass


def _close_quietly(store: "Store", created: str | None = None) -> None:
    """Close a store that failed on open (the error that made it fail is the one that counts), and
    remove the file when this open created it (`created`: its path)."""
    hold, store._hold = store._hold, None  # released after the removal: no other writer sees it half-made
    try:
        store.close()
    except duckdb.Error:
        pass
    finally:
        _remove_created(created or "", created is not None)
        if hold is not None:
            hold.release()


HOLD_LOG = os.environ.get("STEPWATCH_DB_HOLD_LOG")  # a file: one line per closed connection


def _log_hold(store: "Store", held_s: float) -> None:
    """Who held the database and for how long (db/load_benchmark.py reads these lines)."""
    import traceback

    caller = next((f for f in reversed(traceback.extract_stack()[:-3]) if not f.filename.endswith("store.py")), None)
    where = f"{Path(caller.filename).name}:{caller.lineno}:{caller.name}" if caller else "?"
    with open(HOLD_LOG, "a") as out:
        out.write(f"{os.getpid()} {'read' if store._read_only else 'write'} "
                  f"{1000 * held_s:.1f} {where}\n")


def describe_db_error(path: str, error: Exception) -> str:
    """One line naming the database file and what is wrong with it, for a DuckDB error met while
    using it (its first line kept: DuckDB's own words say which page or table)."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    lower = str(error).lower()
    if "no space left" in lower or "disk quota" in lower:
        what = "cannot be written: its disk is full"
    elif "read-only" in lower or "read only" in lower or "permission denied" in lower:
        what = "cannot be written: the file or its filesystem is read-only"
    elif isinstance(error, (duckdb.IOException, duckdb.SerializationException)) or "corrupt" in lower \
            or "checksum" in lower or "could not read" in lower:
        what = "is damaged (truncated or corrupt): restore it from a copy"
    elif isinstance(error, (duckdb.CatalogException, duckdb.BinderException)):
        what = "is not a stepwatch database of this version (a table or column it needs is missing)"
    else:
        what = "cannot be used"
    return f"{path}: database {what} ({type(error).__name__}: {line})"


class Store:
    """One connection to the file. Every DuckDB error met while it is open in a `with` block (a
    damaged page, a full disk, a foreign schema) leaves the block as a StoreError naming the file
    (describe_db_error): the one place where the engine's errors become the database's."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, hold: DbLock | None = None,
                 attached: str | None = None, read_only: bool = False):
        self.con = con  # a cursor of the process's DuckDB instance, USE-ing the attached file
        self.path = path
        self._hold, self._attached = hold, attached
        self._opened, self._read_only, self._closed = time.monotonic(), read_only, False
        # set when the file could not be checkpointed on close (a full disk): what was committed
        # is kept in its write-ahead log (<db>.wal), which the next open replays
        self.checkpoint_error: str | None = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.con.close()
            if self._attached is not None:
                try:
                    detach(self._attached)
                except duckdb.Error as e:
                    if "checkpoint" not in str(e).lower():
                        raise
                    # committed already: in the WAL, not yet in the file (DuckDB's own words)
                    self.checkpoint_error = describe_db_error(self.path, e)
        finally:
            if self._hold is not None:
                self._hold.release()
            if HOLD_LOG:
                _log_hold(self, time.monotonic() - self._opened)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            self.close()
        except duckdb.Error as e:
            if error is None:
                raise StoreError(describe_db_error(self.path, e)) from None
        if isinstance(error, duckdb.Error):
            raise StoreError(describe_db_error(self.path, error)) from None

    # -- schema -------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply the migrations not yet recorded; return the versions applied."""
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
            " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"
        )
        done = {v for (v,) in self.con.execute("SELECT version FROM schema_migrations").fetchall()}
        applied = []
        for version, name, path in _migration_files():
            if version in done:
                continue
            self.con.execute("BEGIN TRANSACTION")
            try:
                self.con.execute(path.read_text())
                self.con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
                self.con.execute("COMMIT")
            except Exception:
                self.con.execute("ROLLBACK")
                raise
            applied.append(version)
        return applied

    def list_pending_migrations(self) -> list[int]:
        """The migrations this database lacks. Raises StoreError for a DuckDB file that is not a
        stepwatch database (no schema_migrations table): reading it would only fail query by query,
        and its schema is not ours to change by reading it."""
        known = self.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
                                 " AND schema_name = 'main' AND table_name = 'schema_migrations'").fetchone()[0]
        if not known:
            raise StoreError(f"{self.path}: not a stepwatch database (a DuckDB file without stepwatch's "
                             "schema_migrations table)")
        done = {v for (v,) in self.con.execute("SELECT version FROM schema_migrations").fetchall()}
        return [version for version, _, _ in _migration_files() if version not in done]

    def list_schema_versions(self) -> list[int]:
        return [v for (v,) in self.con.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]

    # -- writing ------------------------------------------------------------------------
    def find_run_by_hash(self, content_hash: str) -> int | None:
        row = self.con.execute("SELECT run_id FROM runs WHERE content_hash = ?", [content_hash]).fetchone()
        return row[0] if row else None

    def _ensure_repo(self, name: str) -> int:
        found = self.con.execute("SELECT repo_id FROM repos WHERE name = ?", [name]).fetchone()
        if found:
            return found[0]
        return self.con.execute("INSERT INTO repos (name) VALUES (?) RETURNING repo_id", [name]).fetchone()[0]

    def _ensure_commit(self, repo_id: int, sha: str) -> int:
        found = self.con.execute("SELECT commit_id FROM commits WHERE repo_id = ? AND sha = ?",
                                 [repo_id, sha]).fetchone()
        if found:
            return found[0]
        return self.con.execute(
            "INSERT INTO commits (repo_id, sha) VALUES (?, ?) RETURNING commit_id", [repo_id, sha]).fetchone()[0]

    def insert_run(self, rec: RunRecord, tables: "RunTables | None" = None) -> tuple[int, bool]:
        """Write a run and its tables in one transaction. Returns (run_id, created); a run
        with the same content hash, or a second run for the same job, is not written and the
        existing run's id is returned. `tables` (run_tables(rec), made before the file is
        opened) keeps their conversion out of the time the file is held."""
        tables = tables if tables is not None else run_tables(rec)
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            existing = self.find_run_by_hash(rec.content_hash)
            if existing is None and rec.job_id is not None:
                # at most one run per job (per point of a sweep job), whatever its attempts
                existing = self.find_run_of_job(rec.job_id, rec.sweep_point)
            if existing is not None:
                con.execute("ROLLBACK")
                return existing, False
            repo_id = self._ensure_repo(rec.repo) if rec.repo else None
            commit_id = self._ensure_commit(repo_id, rec.commit) if rec.commit and repo_id is not None else None
            run_id = con.execute(
                "INSERT INTO runs (content_hash, repo_id, commit_id, variant, engine, workload,"
                " device_name, peak_gbps, ranks, steps, step_method, step_ms_median, tok_per_s,"
                " layers, copy_share, gpu_busy_share, kernel_us_total, kernels_from_cpu_ops,"
                " source_path, manifest, workload_key, batch_size, timing_ms_median, timing_ms_p10,"
                " timing_ms_p90, job_id, diagnosis, notes, timeline, consistency, patterns, graph_attribution,"
                " roofline, trace_root, trace_digests, " + ", ".join(SWEEP_COLUMNS) + ")"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?" + ", ?" * len(SWEEP_COLUMNS) + ")"
                " RETURNING run_id",
                [rec.content_hash, repo_id, commit_id, rec.variant, rec.engine,
                 json.dumps(rec.workload) if rec.workload is not None else None,
                 rec.device_name, rec.peak_gbps, rec.ranks, rec.steps, rec.step_method,
                 rec.step_ms_median, rec.tok_per_s, rec.layers, rec.copy_share, rec.gpu_busy_share,
                 rec.kernel_us_total, rec.kernels_from_cpu_ops, rec.source_path,
                 json.dumps(rec.manifest) if rec.manifest is not None else None,
                 rec.workload_key, rec.batch_size, rec.timing_ms_median, rec.timing_ms_p10,
                 rec.timing_ms_p90, rec.job_id,
                 json.dumps(rec.diagnosis) if rec.diagnosis is not None else None,
                 json.dumps(rec.notes) if rec.notes else None,
                 *(json.dumps(v) if v is not None else None
                   for v in (rec.timeline, rec.consistency, rec.patterns, rec.graph_attribution, rec.roofline)),
                 rec.trace_root, json.dumps(rec.trace_digests) if rec.trace_digests is not None else None,
                 *(getattr(rec, c) for c in SWEEP_COLUMNS)],
            ).fetchone()[0]
            for name, table in tables.items():
                con.register(f"new_{name}", table)
            try:
                con.execute(
                    "INSERT INTO steps (run_id, rank, step, wall_us, gpu_busy_us, kernel_us)"
                    " SELECT ?, rank, step, wall_us, gpu_busy_us, kernel_us FROM new_steps", [run_id]
                )
                con.execute(
                    "INSERT INTO step_categories (run_id, rank, step, category, dur_us)"
                    " SELECT ?, rank, step, category, dur_us FROM new_cats", [run_id]
                )
                con.execute(
                    "INSERT INTO kernel_stats (run_id, rank, name, category, launcher, source, calls,"
                    " calls_per_step, total_us, mean_us, median_us, p90_us, min_us, max_us, ms_per_step,"
                    " share, bytes_per_call, gbps, peak_fraction, ms_per_step_sd, input_dtypes,"
                    " graph_op, graph_source, graph_layers, " + ", ".join(ROOFLINE_COLUMNS) + ")"
                    " SELECT ?, rank, name, category, launcher, source, calls, calls_per_step,"
                    " total_us, mean_us, median_us, p90_us, min_us, max_us, ms_per_step,"
                    " CASE WHEN isnan(share) THEN NULL ELSE share END,"
                    " CASE WHEN isnan(bytes_per_call) THEN NULL ELSE bytes_per_call END,"
                    " CASE WHEN isnan(gbps) THEN NULL ELSE gbps END,"
                    " CASE WHEN isnan(peak_fraction) THEN NULL ELSE peak_fraction END,"
                    " CASE WHEN isnan(ms_per_step_sd) THEN NULL ELSE ms_per_step_sd END, input_dtypes,"
                    " graph_op, graph_source, graph_layers, " + _ROOFLINE_SELECT + ", bound"
                    " FROM new_kernels", [run_id]
                )
                if "ranks" in tables:
                    con.execute(
                        "INSERT INTO rank_stats (run_id, rank, device_name, steps, step_ms_median, busy_ms_median,"
                        " comm_ms_median, wait_ms_median, last_arrivals, collectives, between_steps_ms)"
                        " SELECT ?, rank, device_name, steps, step_ms_median, busy_ms_median,"
                        " comm_ms_median, wait_ms_median, last_arrivals, collectives, between_steps_ms"
                        " FROM new_ranks", [run_id]
                    )
            finally:
                for name in tables:
                    con.unregister(f"new_{name}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return run_id, True

    # -- reading ------------------------------------------------------------------------
    def count_rows(self) -> dict[str, int]:
        """Row counts of the data tables (used to prove a failed import wrote nothing)."""
        return {
            "runs": self.con.execute("SELECT count(*) FROM runs").fetchone()[0],
            "steps": self.con.execute("SELECT count(*) FROM steps").fetchone()[0],
            "step_categories": self.con.execute("SELECT count(*) FROM step_categories").fetchone()[0],
            "kernel_stats": self.con.execute("SELECT count(*) FROM kernel_stats").fetchone()[0],
            "repos": self.con.execute("SELECT count(*) FROM repos").fetchone()[0],
            "commits": self.con.execute("SELECT count(*) FROM commits").fetchone()[0],
            "rank_stats": self.con.execute("SELECT count(*) FROM rank_stats").fetchone()[0],
        }

    # a run's row with its commit's facts and the names of its series (missing names as '', as
    # pages name a series: db.series), its bundle's trace file names, diagnosis and notes, and what
    # the import checked (timeline figures, consistency, patterns)
    _RUN_SELECT = (
        f"SELECT r.run_id, {series_columns_sql('r', 'p')}, coalesce(r.variant, '') AS variant, r.workload,"
        " r.workload_key, c.sha, c.subject, c.author, c.committed_at, r.batch_size, r.peak_gbps, r.ranks,"
        f" r.steps, r.step_method, r.step_ms_median, r.timing_ms_median, r.timing_ms_p10, r.timing_ms_p90,"
        f" {STEP_MS} AS step_ms,"
        " r.tok_per_s, r.layers, r.copy_share, r.gpu_busy_share, r.kernel_us_total, r.kernels_from_cpu_ops,"
        " r.source_path, json_extract(r.manifest, '$.traces') AS trace_files, r.job_id, r.imported_at,"
        " r.diagnosis, r.notes, r.timeline, r.consistency, r.patterns, r.graph_attribution, r.roofline,"
        " r.trace_root, r.trace_digests, " + ", ".join(f"r.{c}" for c in SWEEP_COLUMNS) +
        " FROM runs r LEFT JOIN repos p ON p.repo_id = r.repo_id LEFT JOIN commits c ON c.commit_id = r.commit_id")

    def _count_kernel_rows(self, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each run's `kernel_rows`, in one query over the runs' ids (a correlated count in
        _RUN_SELECT was decorrelated into a count of every run's rows: 8.9 -> 6 ms a run at
        20,000,000 kernel rows, app/BENCHMARKS.md)."""
        if runs:
            counts = dict(self.con.execute(
                "SELECT run_id, count(*) FROM kernel_stats WHERE run_id IN (SELECT unnest(?)) GROUP BY run_id",
                [[int(r["run_id"]) for r in runs]]).fetchall())
            for run in runs:
                run["kernel_rows"] = int(counts.get(run["run_id"], 0))
        return runs

    @staticmethod
    def _run_rows(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
        names = [d[0] for d in cursor.description]
        runs = []
        for row in cursor.fetchall():
            run = dict(zip(names, row))
            for field, empty in (("workload", None), ("trace_files", None), ("diagnosis", []), ("notes", []),
                                 ("timeline", None), ("consistency", None), ("patterns", None),
                                 ("graph_attribution", None), ("roofline", None), ("trace_digests", None)):
                run[field] = json.loads(run[field]) if run[field] else empty
            runs.append(run)
        return runs

    def get_run(self, run_id: int | None) -> dict[str, Any] | None:
        """One run: its row (repo, engine, device and variant '' when missing; `step_ms` the
        untimed median when the bundle has one, else the profiled one), its commit's facts (sha,
        subject, author, committed_at; None without a commit), its series' `workload_id`, its
        bundle's `trace_files` (None for a plain trace), its `diagnosis` (the {kind, text,
        numbers, kernel} stored at import; [] when none was), `notes`, `kernel_rows`, and what the
        import checked: `timeline` (figures), `consistency` and `patterns` (None for runs imported
        before these were), `graph_attribution` (how its graph kernels were attributed; None
        when no mapping trace was given) and `roofline` (the device ceilings its kernels' roofline
        fractions are of; None for an unknown device), `trace_root` and `trace_digests` (the traces the
        dashboard may serve: app/traces.py; None when none was recorded). None when there is no such
        run (or no run id)."""
        if run_id is None:
            return None
        runs = self._count_kernel_rows(self._run_rows(self.con.execute(self._RUN_SELECT + " WHERE r.run_id = ?",
                                                                       [run_id])))
        return runs[0] if runs else None

    def list_runs(self, run_ids: list[int]) -> dict[int, dict[str, Any]]:
        """get_run of each run that exists, in one query: {run_id: run}."""
        cursor = self.con.execute(self._RUN_SELECT + " WHERE list_contains(?, r.run_id)", [list(map(int, run_ids))])
        return {run["run_id"]: run for run in self._count_kernel_rows(self._run_rows(cursor))}

    def list_ranks(self, run_id: int) -> list[int]:
        """The ranks the run has steps of, in order (a single trace's one rank keeps its number)."""
        return [r for (r,) in self.con.execute(
            "SELECT DISTINCT rank FROM steps WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]

    def list_rank_stats(self, run_id: int, records: bool = False) -> "pd.DataFrame | list[dict]":
        """One row per rank of the run (empty for runs imported before ranks were recorded).
        With `records`, a list of dicts (no pandas: what `ingest report` reads)."""
        return _result(self.con.execute(
            "SELECT rank, device_name, steps, step_ms_median, busy_ms_median, comm_ms_median,"
            " wait_ms_median, last_arrivals, collectives, between_steps_ms"
            " FROM rank_stats WHERE run_id = ? ORDER BY rank",
            [run_id],
        ), records)

    def list_run_categories(self, run_id: int, rank: int = 0, records: bool = False) -> "pd.DataFrame | list[dict]":
        """Per-category ms per step (kernels inside steps) and share of all kernel time, largest first."""
        return _result(self.con.execute(
            "WITH per AS (SELECT category, sum(total_us) AS total_us, sum(ms_per_step) AS ms_per_step"
            "  FROM kernel_stats WHERE run_id = ? AND rank = ? GROUP BY category)"
            " SELECT category, ms_per_step, total_us / nullif(sum(total_us) OVER (), 0) AS share"
            " FROM per ORDER BY total_us DESC, category",
            [run_id, rank],
        ), records)

    # the kernel table's columns: first those the Run page shows, in its order (app/tables.py)
    _KERNEL_COLUMNS = ("name, category, calls_per_step, mean_us, ms_per_step, share, gbps, peak_fraction,"
                       " launcher, source, calls, median_us, p90_us, bytes_per_call, total_us, min_us, max_us,"
                       " ms_per_step_sd, input_dtypes, graph_op, graph_source, graph_layers, tflops, tbps,"
                       " compute_fraction, bandwidth_fraction, bound, intensity, flops_per_call, model_bytes_per_call")

    def list_kernels(self, run_id: int, rank: int = 0, records: bool = False) -> "pd.DataFrame | list[dict]":
        """The run's kernels on one rank, the most time first: calls, time per call and per step,
        share of all kernel time, bytes per call, GB/s and fraction of peak where bytes are known
        (NULL elsewhere), the launching op and source line ('' when unknown), the step-to-step
        sd of ms per step, the launching ops' input dtypes ('' unknown, NULL before they were
        kept), and the roofline (ROOFLINE_COLUMNS: NULL where unknown). With `records`, a list of
        dicts (no pandas: what `ingest report` reads)."""
        return _result(self.con.execute(
            f"SELECT {self._KERNEL_COLUMNS} FROM kernel_stats WHERE run_id = ? AND rank = ?"
            " ORDER BY total_us DESC, name",
            [run_id, rank],
        ), records)

    def list_kernels_of_runs(self, run_ids: list[int], rank: int = 0) -> dict[int, pd.DataFrame]:
        """list_kernels of each run, in one query: {run_id: frame} (an empty frame for a run
        without kernel rows)."""
        ids = list(map(int, run_ids))
        frame = self.con.execute(
            f"SELECT run_id, {self._KERNEL_COLUMNS} FROM kernel_stats WHERE list_contains(?, run_id) AND rank = ?"
            " ORDER BY run_id, total_us DESC, name", [ids, rank]).df()
        groups = {int(k): g.drop(columns="run_id").reset_index(drop=True)
                  for k, g in frame.groupby("run_id", sort=False)}
        empty = frame.drop(columns="run_id").iloc[0:0]
        return {rid: groups.get(rid, empty.copy()) for rid in ids}

    # -- the job queue ------------------------------------------------------------------
    JOB_FIELDS = ("job_id", "spec", "label", "status", "error_kind", "error", "queued_at", "started_at",
                  "finished_at", "heartbeat_at", "worker", "steps_done", "steps_planned",
                  "cancel_requested", "run_id", "batch", "attempts", "sweep_id")
    LOG_LIMIT = 64 * 1024

    def enqueue_job(self, spec_json: str, label: str, batch: str | None = None) -> int:
        return self.con.execute(
            "INSERT INTO jobs (spec, label, batch, sweep_id) VALUES (?, ?, ?, json_extract_string(?, '$.sweep_id'))"
            " RETURNING job_id",
            [spec_json, label, batch, spec_json],
        ).fetchone()[0]

    def claim_job(self, worker: str, job_id: int | None = None, worker_proc: str | None = None) -> dict | None:
        """Take the oldest queued job, or job `job_id` if it is queued (status -> running, one
        more attempt, no scratch yet); None when there is none to take. `worker_proc` tells
        the worker's process apart from a later one with the same pid (ingest/runs/survival.py)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            row = self.con.execute(
                "SELECT job_id FROM jobs WHERE status = 'queued' AND (? IS NULL OR job_id = ?)"
                " ORDER BY job_id LIMIT 1", [job_id, job_id]).fetchone()
            if row is None:
                self.con.execute("COMMIT")
                return None
            self.con.execute(
                "UPDATE jobs SET status = 'running', worker = ?, worker_proc = ?, started_at = current_timestamp,"
                " heartbeat_at = current_timestamp, attempts = coalesce(attempts, 0) + 1, scratch = NULL"
                " WHERE job_id = ?", [worker, worker_proc, row[0]])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return self.get_job(row[0])

    def report_progress(self, job_id: int, steps_done: int | None = None, steps_planned: int | None = None,
                        log_tail: str | None = None) -> bool:
        """Record progress and a heartbeat; returns whether a cancel was requested."""
        self.con.execute(
            "UPDATE jobs SET heartbeat_at = current_timestamp,"
            " steps_done = coalesce(?, steps_done), steps_planned = coalesce(?, steps_planned),"
            " log = coalesce(right(?, ?), log) WHERE job_id = ?",
            [steps_done, steps_planned, log_tail, self.LOG_LIMIT, job_id],
        )
        row = self.con.execute("SELECT cancel_requested FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        return bool(row and row[0])

    def beat_job(self, job_id: int, worker: str, attempt: int, steps_done: int, steps_planned: int | None,
                 log_tail: str) -> str:
        """The heartbeat of attempt `attempt` by `worker`, with its progress and log: 'running',
        'cancel' (someone asked it to stop) or 'lost' (the job is no longer this attempt's: it
        was taken back as a dead worker's, and nothing was written)."""
        rows = self.con.execute(
            "UPDATE jobs SET heartbeat_at = current_timestamp, steps_done = ?,"
            " steps_planned = coalesce(?, steps_planned), log = right(?, ?)"
            " WHERE job_id = ? AND status = 'running' AND worker = ? AND attempts = ? RETURNING cancel_requested",
            [steps_done, steps_planned, log_tail, self.LOG_LIMIT, job_id, worker, attempt]).fetchall()
        return "lost" if not rows else "cancel" if rows[0][0] else "running"

    def add_job_scratch(self, job_id: int, worker: str, attempt: int, entry: dict) -> None:
        """Note a directory the attempt made on a host, so that it is removed if the worker dies."""
        self.con.execute(
            "UPDATE jobs SET scratch = coalesce(scratch, '') || ? || chr(10)"
            " WHERE job_id = ? AND status = 'running' AND worker = ? AND attempts = ?",
            [json.dumps(entry, sort_keys=True), job_id, worker, attempt])

    def finish_job(self, job_id: int, status: str, *, run_id: int | None = None, error_kind: str | None = None,
                   error: str | None = None, log: str | None = None, holder: tuple[str, int] | None = None) -> bool:
        """End a job with a final status. With `holder` (worker, attempt) only while that attempt
        still holds it; returns whether the job was written."""
        if status not in ("succeeded", "failed", "cancelled"):
            raise ValueError(f"finish_job: status {status!r}")
        worker, attempt = holder or (None, None)
        rows = self.con.execute(
            "UPDATE jobs SET status = ?, run_id = ?, error_kind = ?, error = ?,"
            " log = coalesce(right(?, ?), log), finished_at = current_timestamp WHERE job_id = ?"
            " AND (? IS NULL OR (status = 'running' AND worker = ? AND attempts = ?)) RETURNING job_id",
            [status, run_id, error_kind, error, log, self.LOG_LIMIT, job_id, worker, worker, attempt],
        ).fetchall()
        return bool(rows)

    def finish_expanding_job(self, job_id: int, holder: tuple[str, int], jobs: list[tuple[str, str]],
                             batch: str | None, *, note: str, log: str, commits: list[tuple] = ()) -> list[int] | None:
        """End a range job (ingest/runs/expand.py) as succeeded, with `note` added to its label, and
        queue the jobs it stands for ((spec JSON, label) each, in batch `batch`) with their commits
        recorded (record_commit's arguments each), in one transaction and only while attempt
        `holder` (worker, attempt) holds the job: a worker that dies on the way leaves the range
        job to be taken back with nothing queued, never half of its jobs. Returns the new job ids,
        or None when the attempt no longer held the job (and nothing was written)."""
        worker, attempt = holder
        self.con.execute("BEGIN TRANSACTION")
        try:
            held = self.con.execute(
                "UPDATE jobs SET status = 'succeeded', label = label || ?, log = right(?, ?),"
                " finished_at = current_timestamp"
                " WHERE job_id = ? AND status = 'running' AND worker = ? AND attempts = ? RETURNING job_id",
                [note, log, self.LOG_LIMIT, job_id, worker, attempt]).fetchall()
            if not held:
                self.con.execute("ROLLBACK")
                return None
            for commit in commits:
                self.record_commit(*commit)
            ids = [self.enqueue_job(spec_json, label, batch) for spec_json, label in jobs]
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return ids

    def release_job(self, job_id: int, worker: str, attempt: int, status: str, note: str, *,
                    run_id: int | None = None, error_kind: str | None = None, error: str | None = None,
                    count_attempt: bool = True) -> list[dict] | None:
        """End attempt `attempt` of `worker` otherwise than by finishing its work: back to
        'queued' (with count_attempt=False the attempt is given back: a worker stopped on purpose
        is no failure), or a final status. `note` is appended to the job's log. Returns the
        scratch the attempt noted, or None when the attempt no longer held the job."""
        if status == "queued":
            sql = ("UPDATE jobs SET status = 'queued', worker = NULL, worker_proc = NULL, started_at = NULL,"
                   " heartbeat_at = NULL, steps_done = 0, steps_planned = NULL, attempts = attempts - ?,")
            params = [0 if count_attempt else 1]
        elif status in ("succeeded", "failed", "cancelled"):
            sql = "UPDATE jobs SET status = ?, run_id = ?, error_kind = ?, error = ?, finished_at = current_timestamp,"
            params = [status, run_id, error_kind, error]
        else:
            raise ValueError(f"release_job: status {status!r}")
        rows = self.con.execute(
            sql + " log = right(log || CASE WHEN log = '' THEN '' ELSE chr(10) END || ?, ?)"
            " WHERE job_id = ? AND status = 'running' AND worker = ? AND attempts = ? RETURNING scratch",
            params + [note, self.LOG_LIMIT, job_id, worker, attempt]).fetchall()
        if not rows:
            return None
        return [json.loads(line) for line in (rows[0][0] or "").splitlines() if line]

    def list_running_jobs(self, stale_s: float) -> list[dict]:
        """Running jobs with what deciding whether their worker is alive needs: the worker and its
        process stamp, the attempt, whether the heartbeat is older than `stale_s` seconds and
        how old, whether someone asked to cancel, and the run already imported for the job (none
        for an in-process sweep job, a job with a sweep id but no one point: its attempt may have
        imported some of its points only, so it is requeued and the next imports the rest)."""
        fields = ("job_id", "worker", "worker_proc", "attempts", "stale", "heartbeat_age_s", "cancel_requested",
                  "imported_run_id")
        rows = self.con.execute(
            "SELECT job_id, worker, worker_proc, attempts,"
            " coalesce(heartbeat_at < current_timestamp - to_seconds(?), true),"
            " epoch(current_timestamp) - epoch(CAST(heartbeat_at AS TIMESTAMPTZ)), cancel_requested,"
            " CASE WHEN sweep_id IS NULL OR json_extract(spec, '$.sweep_point') IS NOT NULL"
            " THEN (SELECT min(r.run_id) FROM runs r WHERE r.job_id = jobs.job_id) END"
            " FROM jobs WHERE status = 'running' ORDER BY job_id", [stale_s]).fetchall()
        return [dict(zip(fields, row)) for row in rows]

    def get_run_sweep_point(self, run_id: int) -> int | None:
        """The run's index among its sweep's points (None: no sweep point)."""
        row = self.con.execute("SELECT sweep_point FROM runs WHERE run_id = ?", [run_id]).fetchone()
        return row[0] if row else None

    def list_job_run_ids(self, job_id: int) -> list[int]:
        """The runs of a job: one, or a sweep job's, in the order of its points."""
        return [r[0] for r in self.con.execute(
            "SELECT run_id FROM runs WHERE job_id = ? ORDER BY sweep_point NULLS FIRST, run_id", [job_id]).fetchall()]

    def find_run_of_job(self, job_id: int, sweep_point: int | None = None) -> int | None:
        """The job's run (its first); with `sweep_point`, the run of that point of a sweep job."""
        row = self.con.execute("SELECT min(run_id) FROM runs WHERE job_id = ? AND (? IS NULL OR sweep_point = ?)",
                               [job_id, sweep_point, sweep_point]).fetchone()
        return row[0] if row else None

    def request_cancel(self, job_id: int) -> str | None:
        """Cancel a queued job at once; ask a running one to stop. Returns the job's status."""
        self.con.execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = current_timestamp, error_kind = 'cancelled',"
            " error = 'cancelled before it started' WHERE job_id = ? AND status = 'queued'", [job_id])
        self.con.execute("UPDATE jobs SET cancel_requested = true WHERE job_id = ? AND status = 'running'",
                         [job_id])
        row = self.con.execute("SELECT status FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        return row[0] if row else None

    def find_jobs_by_spec(self, spec_json: str, statuses: tuple[str, ...]) -> list[int]:
        """Jobs with exactly this spec (specs are written with sorted keys) in these states."""
        return [r[0] for r in self.con.execute(
            "SELECT job_id FROM jobs WHERE CAST(spec AS VARCHAR) = ? AND list_contains(?, status) ORDER BY job_id",
            [spec_json, list(statuses)]).fetchall()]

    def count_jobs_in_batch(self, batch: str, statuses: tuple[str, ...] = ("succeeded",)) -> int:
        return self.con.execute("SELECT count(*) FROM jobs WHERE batch = ? AND list_contains(?, status)",
                                [batch, list(statuses)]).fetchone()[0]

    def get_job_spec_of_run(self, run_id: int) -> str | None:
        row = self.con.execute("SELECT j.spec FROM runs r JOIN jobs j USING (job_id) WHERE r.run_id = ?",
                               [run_id]).fetchone()
        return row[0] if row else None

    def get_job(self, job_id: int, with_log: bool = True) -> dict | None:
        fields = self.JOB_FIELDS + (("log",) if with_log else ())
        cur = self.con.execute(f"SELECT {', '.join(fields)} FROM jobs WHERE job_id = ?", [job_id])
        row = cur.fetchone()
        return dict(zip(fields, row)) if row else None

    def list_jobs(self, statuses: tuple[str, ...] | None = None, limit: int = 100) -> list[dict]:
        """Newest first, without logs."""
        cur = self.con.execute(
            f"SELECT {', '.join(self.JOB_FIELDS)} FROM jobs"
            " WHERE ? IS NULL OR list_contains(?, status) ORDER BY job_id DESC LIMIT ?",
            [None if statuses is None else list(statuses), None if statuses is None else list(statuses), limit],
        )
        return [dict(zip(self.JOB_FIELDS, row)) for row in cur.fetchall()]

    # -- commits ----------------------------------------------------------------------------
    def list_commits(self, commit_ids: list[int]) -> dict[int, dict[str, Any]]:
        """The sha and subject of each commit that exists: {commit_id: {"sha", "subject"}}."""
        rows = self.con.execute("SELECT commit_id, sha, subject FROM commits WHERE list_contains(?, commit_id)",
                                [sorted(set(map(int, commit_ids)))]).fetchall()
        return {commit_id: {"sha": sha, "subject": subject} for commit_id, sha, subject in rows}

    def record_commit(self, repo: str, sha: str, committed_at, author: str | None, subject: str | None,
                      seq: int | None = None) -> int:
        """Insert or complete a commit's facts (date, author, subject, first-parent order)."""
        repo_id = self._ensure_repo(repo)
        commit_id = self._ensure_commit(repo_id, sha)
        self.con.execute(
            "UPDATE commits SET committed_at = coalesce(?, committed_at), author = coalesce(?, author),"
            " subject = coalesce(?, subject), seq = coalesce(?, seq) WHERE commit_id = ?",
            [committed_at, author, subject, seq, commit_id],
        )
        return commit_id
