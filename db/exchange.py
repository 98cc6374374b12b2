"""History a team can share: runs moved between databases as a directory of Parquet files.

`export_history` writes one Parquet file a table and a `manifest.json` (written last, so a
directory without one is an export that did not finish):

    {"format": "stepwatch-history", "version": 1, "schema_version": 9, "repo": null,
     "tables": {"runs": {"rows": 23, "sha256": "..."}, ...}, "not_included": {...}}

`merge_history` adds such a directory to a database in one transaction; a merge of the same
directory again adds nothing. Everything about the format lives here, with a version number, as
kernels/bundle.py keeps the bundle's.

What travels (TABLES): repos, commits, runs (with their bundle references, `source_path`,
`manifest`, `trace_root` and `trace_digests`, as they were recorded: a path on the machine that
imported the run), steps,
step_categories, kernel_stats and rank_stats. What does not: `jobs` (a worker's local queue;
a run's `job_id` names a job of that queue, so it is left out and merged runs have none),
`changes` (derived: `python -m ingest merge` detects the changes of every series that the merge
touched again, as the worker does after a job), and `schema_migrations` (the manifest keeps the
schema version instead).

Identity. A repo is its name; a commit its (repo name, sha); a run its `content_hash` (the trace's
bytes). Ids are each database's own: a new repo, commit or run gets a fresh id and every child
row is re-keyed. A run already present is skipped whole (its rows here win) and counted. A commit
present on both sides keeps the facts it has (date, author, subject) and takes the ones it lacks.

First-parent order (`seq`). A commit's seq is its place on its repo's first-parent chain (`git
rev-list --first-parent --count`), a property of the commit, so two databases of one repo agree
on it for every commit both know. A commit new here takes the source's seq, a commit here without
one takes it, and a seq here is never changed. Where the two disagree on a commit both know (a
shallow clone counted from elsewhere, rewritten history, two repositories under one name), their
numberings cannot be mixed: no seq is taken from the source for that repo (its new commits come
without one and sort after the numbered ones, by date), and the merge reports the repo.

A newer format version, or a schema version newer than this stepwatch's, is refused. A
migration that adds a column to one of these tables makes a version 2 of the format; a reader
of version 2 keeps reading version 1 (tests/test_exchange.py fails until TABLES follows the
migrations). Bad input (a missing file, a changed or corrupt one, columns that do not match,
rows that name ids the export does not hold) is an ExchangeError naming the file and the field;
the transaction is rolled back and the database is left as it was.

Nothing in an export is trusted. Each file is read once, by its literal path (never as a DuckDB
pattern: a directory `glob[1]` is not its sibling `glob1`), checked against the manifest's sha256,
and merged from those bytes as Arrow tables. `check_history` checks every row before any database
is opened, as import checks what it writes (MergeChecks: the label rule, figures finite and not
negative, JSON of its type, the series key, the size limits the caller names), so a bad row leaves
the database file byte for byte as it was. A run's trace references (`trace_root`,
`trace_digests`: what the dashboard may serve) are kept only where they verify on this machine at
the merge: under a directory the caller allows, no link, each file of its recorded size and sha256
(verify_trace_files); the others arrive empty, and the run is merged without downloadable traces.
`source_path` and `manifest` travel as text, never read as paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import StoreError
from .engine import duckdb, load_arrow_scans
from .series import series_columns_sql
from .store import Store, _migration_files

FORMAT = "stepwatch-history"
VERSION = 5  # 2: runs.timeline, consistency, patterns and kernel_stats.input_dtypes (migration 010);
# 3: runs.roofline and kernel_stats' roofline columns (migration 011), runs.graph_attribution and
# kernel_stats.graph_op, graph_source, graph_layers (migration 012); 4: runs.trace_root and
# trace_digests (migration 013), kept by a merge only where the traces verify on this machine;
# 5: runs.sweep_id, sweep_point and the engine's own figures (migration 015)
READS = (1, 2, 3, 4, 5)  # versions this stepwatch merges; an older version's missing columns arrive as NULL
MANIFEST_NAME = "manifest.json"

# Each table that travels, its columns and their DuckDB types in the order of the migrations
# (001-013). JSON columns travel as JSON text (Parquet strings).
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "repos": (("repo_id", "INTEGER"), ("name", "VARCHAR"), ("url", "VARCHAR")),
    "commits": (("commit_id", "INTEGER"), ("repo_id", "INTEGER"), ("sha", "VARCHAR"), ("committed_at", "TIMESTAMP"),
                ("author", "VARCHAR"), ("subject", "VARCHAR"), ("seq", "INTEGER")),
    "runs": (("run_id", "INTEGER"), ("content_hash", "VARCHAR"), ("repo_id", "INTEGER"), ("commit_id", "INTEGER"),
             ("variant", "VARCHAR"), ("engine", "VARCHAR"), ("workload", "JSON"), ("device_name", "VARCHAR"),
             ("peak_gbps", "DOUBLE"), ("ranks", "INTEGER"), ("steps", "INTEGER"), ("step_method", "VARCHAR"),
             ("step_ms_median", "DOUBLE"), ("tok_per_s", "DOUBLE"), ("layers", "INTEGER"), ("copy_share", "DOUBLE"),
             ("gpu_busy_share", "DOUBLE"), ("kernel_us_total", "DOUBLE"), ("kernels_from_cpu_ops", "BOOLEAN"),
             ("source_path", "VARCHAR"), ("manifest", "JSON"), ("imported_at", "TIMESTAMP"),
             ("workload_key", "VARCHAR"), ("batch_size", "INTEGER"), ("timing_ms_median", "DOUBLE"),
             ("timing_ms_p10", "DOUBLE"), ("timing_ms_p90", "DOUBLE"), ("diagnosis", "JSON"), ("notes", "JSON"),
             ("timeline", "JSON"), ("consistency", "JSON"), ("patterns", "JSON"), ("roofline", "JSON"),
             ("graph_attribution", "JSON"), ("trace_root", "VARCHAR"), ("trace_digests", "JSON"),
             ("sweep_id", "VARCHAR"), ("sweep_point", "INTEGER"), ("prefill_ms", "DOUBLE"),
             ("prefill_tok_per_s", "DOUBLE"), ("decode_ms_median", "DOUBLE"), ("decode_tok_per_s_median", "DOUBLE"),
             ("total_latency_ms", "DOUBLE"), ("peak_gpu_mem_bytes", "BIGINT")),
    "steps": (("run_id", "INTEGER"), ("rank", "INTEGER"), ("step", "INTEGER"), ("wall_us", "DOUBLE"),
              ("gpu_busy_us", "DOUBLE"), ("kernel_us", "DOUBLE")),
    "step_categories": (("run_id", "INTEGER"), ("rank", "INTEGER"), ("step", "INTEGER"), ("category", "VARCHAR"),
                        ("dur_us", "DOUBLE")),
    "kernel_stats": (("run_id", "INTEGER"), ("rank", "INTEGER"), ("name", "VARCHAR"), ("category", "VARCHAR"),
                     ("launcher", "VARCHAR"), ("source", "VARCHAR"), ("calls", "BIGINT"),
                     ("calls_per_step", "DOUBLE"), ("total_us", "DOUBLE"), ("mean_us", "DOUBLE"),
                     ("median_us", "DOUBLE"), ("p90_us", "DOUBLE"), ("min_us", "DOUBLE"), ("max_us", "DOUBLE"),
                     ("ms_per_step", "DOUBLE"), ("share", "DOUBLE"), ("bytes_per_call", "DOUBLE"),
                     ("gbps", "DOUBLE"), ("peak_fraction", "DOUBLE"), ("ms_per_step_sd", "DOUBLE"),
                     ("input_dtypes", "VARCHAR"), ("flops_per_call", "DOUBLE"), ("model_bytes_per_call", "DOUBLE"),
                     ("intensity", "DOUBLE"), ("tflops", "DOUBLE"), ("tbps", "DOUBLE"), ("compute_fraction", "DOUBLE"),
                     ("bandwidth_fraction", "DOUBLE"), ("bound", "VARCHAR"), ("graph_op", "VARCHAR"),
                     ("graph_source", "VARCHAR"), ("graph_layers", "VARCHAR")),
    "rank_stats": (("run_id", "INTEGER"), ("rank", "INTEGER"), ("device_name", "VARCHAR"), ("steps", "INTEGER"),
                   ("step_ms_median", "DOUBLE"), ("busy_ms_median", "DOUBLE"), ("comm_ms_median", "DOUBLE"),
                   ("wait_ms_median", "DOUBLE"), ("last_arrivals", "INTEGER"), ("collectives", "INTEGER"),
                   ("between_steps_ms", "DOUBLE")),
}
ADDED_IN = {2: {"runs": ("timeline", "consistency", "patterns"), "kernel_stats": ("input_dtypes",)},
            3: {"runs": ("roofline", "graph_attribution"),
                "kernel_stats": ("flops_per_call", "model_bytes_per_call", "intensity", "tflops", "tbps",
                                 "compute_fraction", "bandwidth_fraction", "bound", "graph_op", "graph_source",
                                 "graph_layers")},
            4: {"runs": ("trace_root", "trace_digests")},
            5: {"runs": ("sweep_id", "sweep_point", "prefill_ms", "prefill_tok_per_s", "decode_ms_median",
                         "decode_tok_per_s_median", "total_latency_ms", "peak_gpu_mem_bytes")}}


def format_columns(table: str, version: int = VERSION) -> tuple[tuple[str, str], ...]:
    """The table's columns in an export of format `version` (TABLES less what later versions added)."""
    later = {c for v, added in ADDED_IN.items() if v > version for c in added.get(table, ())}
    return tuple(col for col in TABLES[table] if col[0] not in later)


RUN_TABLES = ("steps", "step_categories", "kernel_stats", "rank_stats")  # one run's rows, keyed by run_id
LOCAL_COLUMNS = {"runs": ("job_id",)}  # columns of these tables that stay in their database
NOT_INCLUDED = {"jobs": "a worker's local queue (and runs.job_id, which names its jobs)",
                "changes": "derived: `python -m ingest merge` detects them again for the series it touched",
                "schema_migrations": "the manifest's schema_version"}
# How a DuckDB type reads back from its Parquet column (pyarrow's names)
_PARQUET_TYPES = {"INTEGER": "int32", "BIGINT": "int64", "VARCHAR": "string", "JSON": "string",
                  "DOUBLE": "double", "BOOLEAN": "bool", "TIMESTAMP": "timestamp[us]"}
# (table, key columns) that must be unique within an export; (table, column, table it names)
_UNIQUE = (("repos", "repo_id"), ("repos", "name"), ("commits", "commit_id"), ("commits", "repo_id, sha"),
           ("runs", "run_id"), ("runs", "content_hash"))
_NAMES = (("commits", "repo_id", "repos"), ("runs", "repo_id", "repos"), ("runs", "commit_id", "commits"),
          *((table, "run_id", "runs") for table in RUN_TABLES))
_ID_OF = {"repos": "repo_id", "commits": "commit_id", "runs": "run_id"}
_SCHEMA_VERSION = max(version for version, _, _ in _migration_files())  # what open_db brings a database to


class ExchangeError(StoreError):
    """A history directory that cannot be written or merged; the message names the file and field."""


@dataclass(frozen=True)
class History:
    """A checked export directory: its manifest, and each table's Parquet file as it was read and
    checked (its bytes: what is merged is what was checked, and no path is read twice)."""

    directory: Path
    manifest: dict
    blobs: dict = field(default_factory=dict, repr=False)  # table -> the Parquet file's bytes

    def path(self, table: str) -> str:
        return str(self.directory / f"{table}.parquet")

    @property
    def version(self) -> int:
        return self.manifest["version"]


@dataclass(frozen=True)
class MergeChecks:
    """What every row of an export must be before anything is merged: what import makes sure of
    (given by the caller, ingest/commands.py, from the bundle's label rule and ingest/limits.py:
    db/ imports no other part). Each limit is named in the refusal."""

    label_pattern: str  # a repo name, commit sha, engine and variant match it whole (kernels.bundle.LABEL)
    label_rule: str  # the rule in words, for the refusal
    max_label_chars: int
    max_table_rows: int  # rows of one table of the export (MERGE_MAX_TABLE_ROWS)
    max_run_rows: int  # rows of one run in one table (MERGE_MAX_RUN_ROWS)
    max_text_chars: int  # a text field: a kernel's name, launcher, source (MERGE_MAX_TEXT_CHARS)
    max_json_chars: int  # a JSON field: a workload, notes, a diagnosis (MERGE_MAX_JSON_CHARS)
    workload_key_of: Any = None  # workload (dict) -> its series key, as import derives it; None: not checked
    trace_roots: tuple[str, ...] = ()  # directories (resolved) a merged run's traces may be offered from


@dataclass(frozen=True)
class CheckedHistory:
    """An export whose every row passed MergeChecks: its tables as Arrow tables (runs with the
    trace references that verified here, the others emptied), ready for merge_history."""

    history: History
    tables: dict  # table -> pyarrow.Table
    traces_dropped: list  # the export's ids of runs whose trace references did not verify on this machine

@dataclass
class MergeResult:
    runs_added: int = 0
    runs_present: int = 0
    repos_added: int = 0
    commits_added: int = 0
    commits_completed: int = 0  # commits here that took facts (date, author, subject, seq) they lacked
    rows_added: dict[str, int] = field(default_factory=dict)  # per table of RUN_TABLES
    traces_dropped: int = 0  # new runs whose traces do not verify here: none is offered for download
    order_kept: dict[str, int] = field(default_factory=dict)  # repo -> commits whose seq the two disagree on
    series: list[dict] = field(default_factory=list)  # series (named as pages name them, with variant) touched

    def describe(self) -> str:
        text = (f"{self.runs_added} runs added, {self.runs_present} already present; {self.commits_added} commits "
                f"added, {self.commits_completed} completed; {self.repos_added} repos added")
        if self.traces_dropped:
            text += (f"; {self.traces_dropped} runs' traces cannot be verified on this machine (not under an "
                     "[imports] root, or not the files they were): they are not offered for download")
        for repo, n in sorted(self.order_kept.items()):
            text += f"; {repo}: first-parent order kept, {n} commits' seq differ in the export (none taken)"
        return text


# -- export ---------------------------------------------------------------------------------
def _select_sql(table: str) -> str:
    """SQL: the table's travelling columns (JSON as text) of one repository (? ? : its name, or
    NULL NULL for all)."""
    columns = ", ".join(f"CAST({c} AS VARCHAR) AS {c}" if kind == "JSON" else c for c, kind in TABLES[table])
    of_repo = "(SELECT repo_id FROM repos WHERE name = ?)"
    where = {"repos": "? IS NULL OR name = ?", "commits": f"? IS NULL OR repo_id = {of_repo}",
             "runs": f"? IS NULL OR repo_id = {of_repo}"}.get(
        table, f"? IS NULL OR run_id IN (SELECT run_id FROM runs WHERE repo_id = {of_repo})")
    key = {"repos": "repo_id", "commits": "commit_id", "runs": "run_id", "kernel_stats": "run_id, rank, name"}
    return f"SELECT {columns} FROM {table} WHERE {where} ORDER BY {key.get(table, 'run_id, rank')}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_schema_current(store: Store) -> bool:
    """Whether the database has every migration this stepwatch knows (a read-only open migrates nothing)."""
    return max(store.list_schema_versions(), default=0) >= _SCHEMA_VERSION


def export_history(store: Store, out_dir: str | os.PathLike, repo: str | None = None) -> dict:
    """Write the database's history (of one repository, or all) to `out_dir`, a new or empty
    directory, in one connection (one consistent state); returns the manifest."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExchangeError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ExchangeError(f"{out}: directory is not empty; export to a new or empty directory")
    if not is_schema_current(store):
        raise ExchangeError(f"{store.path}: schema older than this stepwatch's ({_SCHEMA_VERSION}); "
                            "open it for writing once to migrate it")
    if repo is not None and not store.con.execute("SELECT 1 FROM repos WHERE name = ?", [repo]).fetchone():
        raise ExchangeError(f"{store.path}: no repository named {repo!r}")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        tables = {}
        for table in TABLES:
            path = out / f"{table}.parquet"
            written.append(path)
            rows = store.con.execute(f"COPY ({_select_sql(table)}) TO ? (FORMAT parquet)",
                                     [repo, repo, str(path)]).fetchone()[0]
            tables[table] = {"rows": int(rows), "sha256": _sha256(path)}
        manifest = {"format": FORMAT, "version": VERSION, "schema_version": max(store.list_schema_versions()),
                    "repo": repo, "tables": tables, "not_included": NOT_INCLUDED}
        _write_manifest(out, manifest)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if made:
            out.rmdir()
        raise
    return manifest


def _write_manifest(out: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".manifest.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # mkstemp makes it private; an export is meant to be shared
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out / MANIFEST_NAME)


# -- reading an export ----------------------------------------------------------------------
def _field(body: dict, key: str, kind: type, where: Path) -> Any:
    if key not in body:
        raise ExchangeError(f"{where}: field {key!r} is missing")
    value = body[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ExchangeError(f"{where}: field {key!r} has type {type(value).__name__}, expected {kind.__name__}")
    return value


def _check_parquet(path: Path, table: str, entry: dict, version: int) -> bytes:
    """The file is the one the manifest names (sha256), a Parquet file of the format's columns and
    types, with the manifest's row count; returns its bytes (read once, by its literal path)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_symlink() or not path.is_file():
        raise ExchangeError(f"{path}: missing (the manifest lists table {table!r})" if not path.exists() else
                            f"{path}: not a regular file (a link or a directory)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ExchangeError(f"{path}: cannot read ({e.strerror})") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ExchangeError(f"{path}: content differs from the manifest's sha256 (corrupt, or changed after export)")
    try:
        meta = pq.read_metadata(pa.BufferReader(data))
        schema = meta.schema.to_arrow_schema()
    except Exception as e:  # pyarrow's errors (ArrowInvalid, OSError) say what is wrong with the file
        raise ExchangeError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    got = {f.name: str(f.type) for f in schema}
    expected = dict(format_columns(table, version))
    for name, kind in expected.items():
        if name not in got:
            raise ExchangeError(f"{path}: column {name!r} is missing (format version {version})")
        if got[name] != _PARQUET_TYPES[kind]:
            raise ExchangeError(f"{path}: column {name!r} has type {got[name]}, expected "
                                f"{_PARQUET_TYPES[kind]} ({kind})")
    extra = [name for name in got if name not in expected]
    if extra:
        raise ExchangeError(f"{path}: column {extra[0]!r} is not one of table {table}'s (format version {version})")
    if meta.num_rows != entry["rows"]:
        raise ExchangeError(f"{path}: {meta.num_rows} rows, the manifest says {entry['rows']}")
    return data


def read_history(directory: str | os.PathLike) -> History:
    """Check an export directory without opening any database: its manifest (format, version,
    schema version, tables) and every Parquet file it lists."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExchangeError(f"{directory}: {'not a directory' if directory.exists() else 'no such directory'}")
    where = directory / MANIFEST_NAME
    if not where.is_file():
        raise ExchangeError(f"{where}: missing (not a finished `python -m ingest export` directory)")
    try:
        body = json.loads(where.read_bytes())
    except OSError as e:
        raise ExchangeError(f"{where}: cannot read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:
        raise ExchangeError(f"{where}: not JSON ({e})") from None
    if not isinstance(body, dict):
        raise ExchangeError(f"{where}: not a JSON object")
    if _field(body, "format", str, where) != FORMAT:
        raise ExchangeError(f"{where}: field 'format' is {body['format']!r}, expected {FORMAT!r}")
    if _field(body, "version", int, where) not in READS:
        raise ExchangeError(f"{where}: field 'version' is {body['version']}; this stepwatch reads versions "
                            f"{', '.join(map(str, READS))}")
    schema = _field(body, "schema_version", int, where)
    if schema > _SCHEMA_VERSION:
        raise ExchangeError(f"{where}: field 'schema_version' is {schema}, newer than this database's schema "
                            f"({_SCHEMA_VERSION}): it needs a newer stepwatch")
    tables = _field(body, "tables", dict, where)
    if sorted(tables) != sorted(TABLES):
        missing = sorted(set(TABLES) - set(tables))
        problem = f"lacks table {missing[0]!r}" if missing else f"has table {sorted(set(tables) - set(TABLES))[0]!r}"
        raise ExchangeError(f"{where}: field 'tables' {problem} (format version {VERSION})")
    for table in TABLES:
        entry = _field(tables, table, dict, where)
        rows, digest = _field(entry, "rows", int, where), _field(entry, "sha256", str, where)
        if rows < 0 or len(digest) != 64:
            raise ExchangeError(f"{where}: field 'tables.{table}' has a bad row count or sha256")
    blobs = {table: _check_parquet(directory / f"{table}.parquet", table, tables[table], body["version"])
             for table in TABLES}
    return History(directory, body, blobs)


# -- checking every row ------------------------------------------------------------------------
_ROW = "__row"  # each source row's number (from 1) in its file, for the refusal
_SOURCE = {table: f"src_{table}" for table in TABLES}  # the checked tables' names, as a connection sees them
# figures a row must not hold negative (or NaN, or infinite): every number of a travelling table but ids
_IDS = {"repo_id", "commit_id", "run_id"}
# JSON columns of runs and the JSON type each must have (when not NULL)
_JSON_TYPES = {"workload": "OBJECT", "manifest": "OBJECT", "timeline": "OBJECT", "consistency": "OBJECT",
               "patterns": "OBJECT", "roofline": "OBJECT", "graph_attribution": "OBJECT", "diagnosis": "ARRAY",
               "notes": "ARRAY", "trace_digests": "ARRAY"}
_LABELS = {"repos": ("name",), "commits": ("sha",), "runs": ("engine", "variant")}


def _schema_connection():
    """An in-memory database with this stepwatch's schema (the migrations), to check an export
    against the same NOT NULL columns and types without opening the file it will merge into."""
    con = duckdb.connect()
    for _, _, path in _migration_files():
        con.execute(path.read_text())
    return con


def _refuse(history: History, table: str, row: tuple, what: str) -> ExchangeError:
    """One line: the file, the row (its number in the file, and its run or id) and what is wrong."""
    number, key = row[0], row[1] if len(row) > 1 else None
    key_text = f" ({_ID_OF.get(table, 'run_id')} {key})" if key is not None else ""
    return ExchangeError(f"{history.path(table)}: row {number}{key_text}: {what}")


def _key_of(table: str) -> str:
    return _ID_OF.get(table, "run_id")


def _first(con, sql: str, params: list | None = None):
    return con.execute(sql, params or []).fetchone()


def _check_sizes(history: History, checks: MergeChecks) -> None:
    """Before any table is decoded: its rows (the manifest's, checked against the file) and each
    run's rows in it, against the named limits."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for table in TABLES:
        rows = history.manifest["tables"][table]["rows"]
        if rows > checks.max_table_rows:
            raise ExchangeError(f"{history.path(table)}: {rows:,} rows, more than a merge takes "
                                f"(MERGE_MAX_TABLE_ROWS {checks.max_table_rows:,}): export and merge fewer runs at a "
                                "time (`ingest export --repo`)")
    for table in RUN_TABLES:
        ids = pq.read_table(pa.BufferReader(history.blobs[table]), columns=["run_id"]).column("run_id")
        if len(ids) <= checks.max_run_rows:
            continue
        counts = pc.value_counts(ids)
        biggest = max(range(len(counts)), key=lambda i: counts[i]["counts"].as_py())
        run_id, n = counts[biggest]["values"].as_py(), counts[biggest]["counts"].as_py()
        if n > checks.max_run_rows:
            raise ExchangeError(f"{history.path(table)}: run_id {run_id} has {n:,} rows, more than one run may hold "
                                f"(MERGE_MAX_RUN_ROWS {checks.max_run_rows:,})")


def _load_tables(history: History) -> dict:
    """Each table as an Arrow table read from the checked bytes, with its rows' numbers; columns a
    format version lacks arrive as NULL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = {}
    for table, columns in TABLES.items():
        t = pq.read_table(pa.BufferReader(history.blobs[table]))
        for name, kind in columns:
            if name not in t.column_names:
                t = t.append_column(name, pa.nulls(len(t), type=pa.type_for_alias(_PARQUET_TYPES[kind])
                                                   if kind != "TIMESTAMP" else pa.timestamp("us")))
        tables[table] = t.select([c for c, _ in columns]).append_column(_ROW, pa.array(range(1, len(t) + 1),
                                                                                        pa.int64()))
    return tables


def _row_conditions(table: str, column: str, kind: str, checks: MergeChecks) -> list[tuple[str, list, str]]:
    """(SQL condition a bad value meets, its parameters, what is wrong) for one column's values."""
    found = []
    if kind in ("DOUBLE", "INTEGER", "BIGINT") and column not in _IDS:
        found.append((f"NOT (isfinite({column}::DOUBLE) AND {column} >= 0)", [],
                      f"field {column!r} must be a finite number, not negative"))
    if column in _LABELS.get(table, ()):
        found.append((f"NOT (regexp_full_match({column}, ?) AND length({column}) <= ?)",
                      [checks.label_pattern, checks.max_label_chars],
                      f"field {column!r}: {checks.label_rule} (at most {checks.max_label_chars} characters)"))
    elif kind == "VARCHAR":
        found.append((f"length({column}) > ?", [checks.max_text_chars],
                      f"field {column!r} is longer than MERGE_MAX_TEXT_CHARS ({checks.max_text_chars:,} characters)"))
    if kind == "JSON":
        found.append((f"length({column}) > ?", [checks.max_json_chars],
                      f"field {column!r} is longer than MERGE_MAX_JSON_CHARS ({checks.max_json_chars:,} characters)"))
        found.append((f"NOT json_valid({column})", [], f"field {column!r} is not JSON"))
        if column in _JSON_TYPES:
            found.append((f"json_type({column}::JSON) <> '{_JSON_TYPES[column]}'", [],
                          f"field {column!r} must be a JSON {_JSON_TYPES[column].lower()}"))
    return found


def _check_rows(con, history: History, checks: MergeChecks) -> None:
    """Every row as import makes it: the columns the schema keeps NOT NULL filled, labels by the
    label rule, figures finite and not negative, text and JSON within their limits, JSON fields
    of their type (a workload is an object), keys unique and every id a row names held."""
    schema = {(t, c): (kind, nullable) for t, c, kind, nullable in con.execute(
        "SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns()"
        " WHERE database_name = current_database()").fetchall()}
    for table, columns in TABLES.items():
        src, key = _SOURCE[table], _key_of(table)
        for column, kind in columns:
            if not schema[(table, column)][1]:
                row = _first(con, f"SELECT {_ROW}, {key} FROM {src} WHERE {column} IS NULL ORDER BY {_ROW} LIMIT 1")
                if row:
                    raise _refuse(history, table, row, f"field {column!r} is empty (the schema requires it)")
            for condition, params, what in _row_conditions(table, column, kind, checks):
                row = _first(con, f"SELECT {_ROW}, {key} FROM {src} WHERE {column} IS NOT NULL AND ({condition})"
                                  f" ORDER BY {_ROW} LIMIT 1", params)
                if row:
                    raise _refuse(history, table, row, what)
    _check_references(con, history)
    if checks.workload_key_of is not None:
        for number, run_id, workload, workload_key in con.execute(
                f"SELECT {_ROW}, run_id, workload, workload_key FROM {_SOURCE['runs']} ORDER BY {_ROW}").fetchall():
            expected = checks.workload_key_of(json.loads(workload)) if workload is not None else None
            if workload_key != expected:
                raise _refuse(history, "runs", (number, run_id), "field 'workload_key' is not the key of its "
                              "workload (what import derives from it, which names the run's series)")


def _check_references(con, history: History) -> None:
    """Keys unique within the export, and every id a row names held by the table it names."""
    for table, key in _UNIQUE:
        row = _first(con, f"SELECT {key} FROM {_SOURCE[table]} GROUP BY ALL HAVING count(*) > 1 LIMIT 1")
        if row:
            raise ExchangeError(f"{history.path(table)}: {key} {', '.join(map(str, row))} occurs more than once")
    for table, column, target in _NAMES:
        row = _first(con, f"SELECT s.{column} FROM {_SOURCE[table]} s WHERE s.{column} IS NOT NULL"
                          f" AND s.{column} NOT IN (SELECT {_ID_OF[target]} FROM {_SOURCE[target]}) LIMIT 1")
        if row:
            raise ExchangeError(f"{history.path(table)}: column {column!r} names {row[0]}, "
                                f"which {target}.parquet does not hold")
    row = _first(con, f"SELECT s.run_id FROM {_SOURCE['runs']} s JOIN {_SOURCE['commits']} c"
                      " ON c.commit_id = s.commit_id WHERE s.repo_id IS DISTINCT FROM c.repo_id LIMIT 1")
    if row:
        raise ExchangeError(f"{history.path('runs')}: run {row[0]}'s commit_id names a commit of another repo_id")


def _is_under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def verify_trace_files(trace_root, trace_digests, roots: tuple[str, ...]) -> bool:
    """Whether a merged run's trace references can be offered here: its directory lies under one of
    `roots` and is reached through no symbolic link, and each file it names is a plain name there,
    a regular file (no link), of the recorded size and sha256 (hashed now, on this machine)."""
    if not isinstance(trace_root, str) or not trace_digests or not os.path.isabs(trace_root):
        return False
    if os.path.realpath(trace_root) != trace_root or not _is_under(trace_root, roots):
        return False
    for entry in trace_digests:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            return False
        path = os.path.join(trace_root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.get("bytes"):
                return False
            digest = hashlib.sha256()
            for block in iter(lambda: os.read(fd, 1 << 20), b""):
                digest.update(block)
        finally:
            os.close(fd)
        if digest.hexdigest() != entry.get("sha256"):
            return False
    return True


def _keep_verified_traces(tables: dict, checks: MergeChecks) -> list[int]:
    """Empty the trace references (trace_root, trace_digests) of every run whose traces do not
    verify here (verify_trace_files); returns the export's ids of those runs. A reference that names no
    file (an export of a version before 4) stays empty and is not counted."""
    import pyarrow as pa

    runs = tables["runs"]
    roots, digests = runs.column("trace_root").to_pylist(), runs.column("trace_digests").to_pylist()
    kept = [root is not None and verify_trace_files(root, json.loads(d) if d else None, checks.trace_roots)
            for root, d in zip(roots, digests)]
    dropped = [run_id for run_id, root, keep in zip(runs.column("run_id").to_pylist(), roots, kept)
               if root is not None and not keep]
    runs = runs.set_column(runs.column_names.index("trace_root"), "trace_root",
                           pa.array([r if k else None for r, k in zip(roots, kept)], pa.string()))
    runs = runs.set_column(runs.column_names.index("trace_digests"), "trace_digests",
                           pa.array([d if k else None for d, k in zip(digests, kept)], pa.string()))
    tables["runs"] = runs
    return dropped


def check_history(history: History, checks: MergeChecks) -> CheckedHistory:
    """Check every row of a read export as import checks what it writes (MergeChecks), before any
    database is opened: the first bad row is an ExchangeError naming the file, the row and the
    field. The trace references of a run are kept only where they verify here (verify_trace_files)."""
    load_arrow_scans()
    _check_sizes(history, checks)
    tables = _load_tables(history)
    con = _schema_connection()
    try:
        for table, data in tables.items():
            con.register(_SOURCE[table], data)
        _check_rows(con, history, checks)
    except duckdb.Error as e:
        raise ExchangeError(f"{history.directory}: {str(e).splitlines()[0]}") from None
    finally:
        con.close()
    dropped = _keep_verified_traces(tables, checks)
    return CheckedHistory(history, tables, dropped)


# -- merge ----------------------------------------------------------------------------------
def merge_history(store: Store, checked: CheckedHistory) -> MergeResult:
    """Add what the export holds and this database lacks, in one transaction (read_history and
    check_history first: every row is checked before this opens a transaction, so bad input
    leaves the file as it was). Returns what was added, and the series whose changes must be
    detected again: those with a new run, or with a run at a commit that took facts it lacked."""
    load_arrow_scans()
    history = checked.history
    con = store.con
    result = MergeResult()
    current = str(history.directory)  # the file each statement reads, for its error
    for table, data in checked.tables.items():
        con.register(_SOURCE[table], data)
    con.execute("BEGIN TRANSACTION")
    try:
        current = history.path("repos")
        result.repos_added = len(con.execute(
            f"INSERT INTO repos (name, url) SELECT s.name, s.url FROM {_SOURCE['repos']} s"
            " WHERE s.name NOT IN (SELECT name FROM repos) ORDER BY s.repo_id RETURNING repo_id").fetchall())
        con.execute(f"UPDATE repos SET url = s.url FROM {_SOURCE['repos']} s"
                    " WHERE repos.name = s.name AND repos.url IS NULL AND s.url IS NOT NULL")
        current = history.path("commits")
        completed = _merge_commits(con, history, result)
        current = history.path("runs")
        run_map = _merge_runs(con, checked, result)
        for table in RUN_TABLES:
            current = history.path(table)
            names = [c for c, _ in TABLES[table]]
            result.rows_added[table] = con.execute(
                f"INSERT INTO {table} ({', '.join(names)}) SELECT m.run_id, {', '.join('s.' + c for c in names[1:])}"
                f" FROM {_SOURCE[table]} s JOIN (SELECT unnest(?::INTEGER[]) AS source_id,"
                " unnest(?::INTEGER[]) AS run_id) m ON m.source_id = s.run_id",
                [list(run_map), list(run_map.values())]).fetchone()[0]
        result.series = _touched_series(con, list(run_map.values()), completed)
        con.execute("COMMIT")
    except duckdb.Error as e:
        con.execute("ROLLBACK")
        raise ExchangeError(f"{current}: {str(e).splitlines()[0]}") from None
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        for table in checked.tables:
            con.unregister(_SOURCE[table])
    return result


# the export's commits with this database's repo ids (every repo is here once repos are merged);
# parameter: the repo ids here whose seq is not taken
_SOURCE_COMMITS = ("(SELECT t.repo_id, c.commit_id AS source_id, c.sha, c.committed_at, c.author, c.subject,"
                   " CASE WHEN list_contains(?::INTEGER[], t.repo_id) THEN NULL ELSE c.seq END AS seq"
                   f" FROM {_SOURCE['commits']} c JOIN {_SOURCE['repos']} r ON r.repo_id = c.repo_id"
                   " JOIN repos t ON t.name = r.name)")


def _merge_commits(con: duckdb.DuckDBPyConnection, history: History, result: MergeResult) -> list[int]:
    """Complete the commits both know, add the new ones; returns the ids of the commits here that
    took facts they lacked (a seq or a date moves them along their series)."""
    disagree = con.execute(
        f"SELECT p.repo_id, p.name, count(*) FROM {_SOURCE_COMMITS} s"
        " JOIN commits t ON t.repo_id = s.repo_id AND t.sha = s.sha JOIN repos p ON p.repo_id = t.repo_id"
        " WHERE s.seq <> t.seq GROUP BY ALL ORDER BY p.name", [[]]).fetchall()
    result.order_kept = {name: n for _, name, n in disagree}
    source = [[repo_id for repo_id, _, _ in disagree]]  # those repos' seqs stay this database's alone
    completed = [commit_id for (commit_id,) in con.execute(
        "UPDATE commits SET committed_at = coalesce(commits.committed_at, s.committed_at),"
        " author = coalesce(commits.author, s.author), subject = coalesce(commits.subject, s.subject),"
        " seq = coalesce(commits.seq, s.seq)"
        f" FROM {_SOURCE_COMMITS} s WHERE commits.repo_id = s.repo_id AND commits.sha = s.sha"
        " AND ((commits.committed_at IS NULL AND s.committed_at IS NOT NULL)"
        " OR (commits.author IS NULL AND s.author IS NOT NULL) OR (commits.subject IS NULL AND s.subject IS NOT NULL)"
        " OR (commits.seq IS NULL AND s.seq IS NOT NULL)) RETURNING commit_id",
        source).fetchall()]
    result.commits_completed = len(completed)
    result.commits_added = len(con.execute(
        "INSERT INTO commits (repo_id, sha, committed_at, author, subject, seq)"
        " SELECT s.repo_id, s.sha, s.committed_at, s.author, s.subject, s.seq"
        f" FROM {_SOURCE_COMMITS} s WHERE NOT EXISTS"
        " (SELECT 1 FROM commits t WHERE t.repo_id = s.repo_id AND t.sha = s.sha)"
        " ORDER BY s.source_id RETURNING commit_id", source).fetchall())
    return completed


def _merge_runs(con: duckdb.DuckDBPyConnection, checked: CheckedHistory, result: MergeResult) -> dict[int, int]:
    """Add the runs whose content hash is new here, with fresh ids in the export's order and
    their repo and commit ids here; returns {export's run id: run id here}."""
    runs = _SOURCE["runs"]
    new = [run_id for (run_id,) in con.execute(
        f"SELECT run_id FROM {runs} WHERE content_hash NOT IN (SELECT content_hash FROM runs)"
        " ORDER BY run_id").fetchall()]
    result.runs_added, result.runs_present = len(new), checked.history.manifest["tables"]["runs"]["rows"] - len(new)
    if not new:
        return {}
    result.traces_dropped = len(set(new) & set(checked.traces_dropped))
    ids = sorted(i for (i,) in con.execute("SELECT nextval('run_id_seq') FROM range(?)", [len(new)]).fetchall())
    run_map = dict(zip(new, ids))
    names = [c for c, _ in TABLES["runs"]]
    con.execute(
        f"INSERT INTO runs ({', '.join(names)})"
        f" SELECT m.run_id, s.content_hash, tr.repo_id, tc.commit_id, {', '.join('s.' + c for c in names[4:])}"
        f" FROM {runs} s JOIN (SELECT unnest(?::INTEGER[]) AS source_id, unnest(?::INTEGER[]) AS run_id) m"
        " ON m.source_id = s.run_id"
        f" LEFT JOIN {_SOURCE['repos']} sr ON sr.repo_id = s.repo_id LEFT JOIN repos tr ON tr.name = sr.name"
        f" LEFT JOIN {_SOURCE['commits']} sc ON sc.commit_id = s.commit_id"
        " LEFT JOIN commits tc ON tc.repo_id = tr.repo_id AND tc.sha = sc.sha ORDER BY m.run_id",
        [new, ids])
    return run_map


def _touched_series(con: duckdb.DuckDBPyConnection, run_ids: list[int], commit_ids: list[int]) -> list[dict]:
    """Each variant of each series with one of these runs, or a run at one of these commits,
    named as db.views.get_series_of_run names a run's."""
    cursor = con.execute(
        f"SELECT DISTINCT {series_columns_sql('r', 'p')}, coalesce(r.workload_key, '') AS workload_key,"
        " coalesce(r.variant, '') AS variant FROM runs r LEFT JOIN repos p ON p.repo_id = r.repo_id"
        " WHERE r.commit_id IS NOT NULL"
        " AND (list_contains(?::INTEGER[], r.run_id) OR list_contains(?::INTEGER[], r.commit_id))"
        " ORDER BY ALL", [run_ids, commit_ids])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]
