"""A run's series, in one place: the SQL that names it and matches rows to it, and what change
tracking reads and writes along one series. Functions take a db.store.Store.

A series is the runs that measured a commit with one repository, engine, GPU and workload key
(the workload without its variant and run-length fields). Trends draws one line per variant of
it; change tracking follows each variant on its own. Pages name a series by plain values, so
that a URL can hold them: a missing engine or GPU is '', and the long workload key is named by
its workload id, the first 10 hex digits of its md5. The changes table keeps a missing name as
NULL, as the runs table does (`stored_series`).

Every query that picks a series' runs or changes builds its condition from the fragments below
(db.views for the pages, this module for the tracker), so there is one definition of a series.
This module loads neither pandas nor NumPy (db.store reads `STEP_MS` from it).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # frames come from DuckDB's .df()
    import pandas as pd

# what a run's "step ms" is: the step time measured without the profiler when the bundle has
# it (tok/s comes from the same timing), else the median profiled step
STEP_MS = "coalesce(r.timing_ms_median, r.step_ms_median)"

# the columns of a run (or a change) that say which series it belongs to
_SERIES_COLUMNS = ("repo_id", "engine", "device_name", "workload_key")
SERIES_KEY = ", ".join(_SERIES_COLUMNS)


def series_names_sql(row: str, repo: str) -> list[str]:
    """SQL expressions of the names a page gives the series of `row` (a run or a change; `repo`
    the alias of its repos row): repository, engine, GPU and workload id, missing names as ''."""
    return [f"coalesce({repo}.name, '')", f"coalesce({row}.engine, '')", f"coalesce({row}.device_name, '')",
            f"left(md5(coalesce({row}.workload_key, '')), 10)"]


def series_columns_sql(row: str, repo: str) -> str:
    """SQL: series_names_sql as the columns repo, engine, device and workload_id."""
    return ", ".join(f"{sql} AS {name}" for sql, name in zip(series_names_sql(row, repo),
                                                            ("repo", "engine", "device", "workload_id")))


def in_series_sql(row: str, repo: str, variant: bool = False) -> str:
    """SQL: `row` is in the series named by ? parameters (repo, engine, device, workload id, and
    with `variant` the variant, '' for none), as series_names_sql names it."""
    names = series_names_sql(row, repo) + ([f"coalesce({row}.variant, '')"] if variant else [])
    return " AND ".join(f"{name} = ?" for name in names)


def same_series_sql(a: str, b: str) -> str:
    """SQL: runs `a` and `b` are in one series (a missing name matches a missing name)."""
    return " AND ".join(f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in _SERIES_COLUMNS)


def series_id_sql(row: str, repo: str) -> str:
    """SQL: a name for one variant of a series in a URL (Regressions' `?series=`): 10 hex digits
    of the md5 of its repository, engine, GPU, workload key and variant."""
    return (f"left(md5(concat_ws('|', {repo}.name, coalesce({row}.engine, ''), coalesce({row}.device_name, ''),"
            f" coalesce({row}.workload_key, ''), coalesce({row}.variant, ''))), 10)")


def series_params(series: dict) -> list:
    """The ? parameters of in_series_sql(..., variant=True) for a series named as pages name it
    (db.views.list_series' columns, one variant)."""
    return [series["repo"], series["engine"], series["device"], series["workload_id"], series["variant"]]


def stored_series(series: dict) -> dict:
    """A series as the changes table keeps it (repo, engine, workload_key, device_name, variant;
    NULL, not '', where a name is missing), from one named as pages name it. Engines, variants
    and repositories are labels, never empty; a GPU's name is the trace's (a trace that names
    its GPU '' has its changes stored with no GPU name, NULL, as it is shown). A frame's missing
    value (NaN) is NULL too."""
    return {"repo": series["repo"], "engine": _stored(series["engine"]),
            "workload_key": _stored(series["workload_key"]), "device_name": _stored(series["device"]),
            "variant": _stored(series["variant"])}


def _stored(name) -> str | None:
    return name if isinstance(name, str) and name else None


def count_series_commits(store, run_id: int) -> int:
    """How many commits the series of a run (its variant) has runs at, this run's included; 0 for a
    run without a commit. Change tracking compares commits (ingest/runs/track.py needs two), so an
    importer asks this before it loads the detector."""
    names = series_names_sql("r", "p") + ["coalesce(r.variant, '')"]
    same = " AND ".join(f"{a} = {b}" for a, b in zip(names, series_names_sql("o", "q") + ["coalesce(o.variant, '')"]))
    return store.con.execute(
        "SELECT count(DISTINCT o.commit_id) FROM runs r JOIN repos p ON p.repo_id = r.repo_id,"
        " runs o JOIN repos q ON q.repo_id = o.repo_id"
        f" WHERE r.run_id = ? AND r.commit_id IS NOT NULL AND o.commit_id IS NOT NULL AND {same}",
        [run_id]).fetchone()[0]


def list_series_runs(store, series: dict, seq_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """The runs of one variant of a series (named as pages name it) in commit order (first-parent
    seq, then date): one row per run, with the untimed step samples from its manifest
    (`step_ms_samples`, a list, may be empty)."""
    lo, hi = seq_range if seq_range else (None, None)
    frame = store.con.execute(
        "SELECT r.run_id, c.commit_id, c.sha, c.seq, c.committed_at, c.author, c.subject,"
        f" r.tok_per_s, {STEP_MS} AS step_ms, r.copy_share,"
        " r.batch_size, r.layers, r.job_id, r.manifest->>'$.timing.step_ms' AS samples_json,"
        # the engine of the spec the run came from (NULL: imported, not run by a job): can it be re-run?
        " (SELECT j.spec->>'$.engine' FROM jobs j WHERE j.job_id = r.job_id) AS job_engine"
        " FROM runs r JOIN commits c USING (commit_id) JOIN repos p ON p.repo_id = r.repo_id"
        f" WHERE {in_series_sql('r', 'p', variant=True)}"
        " AND (? IS NULL OR c.seq >= ?) AND (? IS NULL OR c.seq <= ?)"
        " ORDER BY c.seq NULLS LAST, c.committed_at, r.run_id",
        series_params(series) + [lo, lo, hi, hi]).df()
    frame["step_ms_samples"] = [json.loads(s) if isinstance(s, str) and s else [] for s in frame.pop("samples_json")]
    return frame


def list_step_categories(store, run_ids: list[int]) -> pd.DataFrame:
    """Per run and profiled step (rank 0): wall time, kernel time and time per category."""
    return store.con.execute(
        "SELECT s.run_id, s.step, s.wall_us, s.kernel_us, c.category, coalesce(c.dur_us, 0) AS dur_us"
        " FROM steps s LEFT JOIN step_categories c USING (run_id, rank, step)"
        " WHERE s.rank = 0 AND list_contains(?, s.run_id) ORDER BY s.run_id, s.step",
        [list(map(int, run_ids))]).df()


def replace_changes(store, series: dict, rows: list[dict]) -> list[int]:
    """Replace the stored changes of one variant of a series (named as pages name it) by `rows`,
    in one transaction; returns their ids."""
    con = store.con
    stored = stored_series(series)
    key = [store._ensure_repo(stored["repo"]), stored["engine"], stored["workload_key"], stored["device_name"],
           stored["variant"]]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "DELETE FROM changes WHERE change_id IN (SELECT ch.change_id FROM changes ch"
            f" JOIN repos p ON p.repo_id = ch.repo_id WHERE {in_series_sql('ch', 'p', variant=True)})",
            series_params(series))
        ids = []
        for r in rows:
            ids.append(con.execute(
                "INSERT INTO changes (repo_id, engine, workload_key, device_name, variant, metric, direction,"
                " last_good_commit_id, first_bad_commit_id, last_good_run_id, first_bad_run_id, before_value,"
                " after_value, rel_change, p_value, commits_between, explanation, diagnosis, bisect_runs)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING change_id",
                key + [r["metric"], r["direction"], r["last_good_commit_id"], r["first_bad_commit_id"],
                       r["last_good_run_id"], r["first_bad_run_id"], r["before_value"], r["after_value"],
                       r["rel_change"], r["p_value"], r["commits_between"], json.dumps(r.get("explanation")),
                       json.dumps(r.get("diagnosis")), r.get("bisect_runs", 0)]).fetchone()[0])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return ids


# -- re-runs that confirm (ingest/runs/confirm.py; migration 014) -------------------------------
_CONFIRMATION_FIELDS = ("confirmation_id", "last_good_commit_id", "first_bad_commit_id", "host", "batch", "reruns",
                        "state", "verdict", "summary", "pending")


def list_confirmations(store, series: dict) -> list[dict]:
    """The confirmations of one variant of a series (named as pages name it), oldest first, each
    with `pending`: its re-run jobs still to come (queued, or running without a run imported yet:
    the job whose run is being followed counts as in)."""
    rows = store.con.execute(
        "SELECT cf.confirmation_id, cf.last_good_commit_id, cf.first_bad_commit_id, cf.host, cf.batch, cf.reruns,"
        " cf.state, cf.verdict, cf.summary,"
        " (SELECT count(*) FROM jobs j WHERE j.batch = cf.batch AND (j.status = 'queued' OR (j.status = 'running'"
        "   AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.job_id)))) AS pending"
        " FROM confirmations cf JOIN repos p ON p.repo_id = cf.repo_id"
        f" WHERE {in_series_sql('cf', 'p', variant=True)} ORDER BY cf.confirmation_id",
        series_params(series)).fetchall()
    return [dict(zip(_CONFIRMATION_FIELDS, row)) for row in rows]


def queue_confirmation(store, series: dict, last_good_commit_id: int, first_bad_commit_id: int, host: str,
                       batch: str, jobs: list[tuple[str, str]]) -> list[int] | None:
    """Record the confirmation of one window (series, last good, first bad commit) and queue its
    re-run jobs ((spec JSON, label) each, in this order, in batch `batch`), in one transaction;
    None when the window already has one (a window is re-run once, ever)."""
    stored = stored_series(series)
    con = store.con
    con.execute("BEGIN TRANSACTION")
    try:
        key = [store._ensure_repo(stored["repo"]), stored["engine"], stored["workload_key"], stored["device_name"],
               stored["variant"]]
        exists = con.execute(
            "SELECT 1 FROM confirmations WHERE repo_id = ? AND engine IS NOT DISTINCT FROM ?"
            " AND workload_key IS NOT DISTINCT FROM ? AND device_name IS NOT DISTINCT FROM ?"
            " AND variant IS NOT DISTINCT FROM ? AND last_good_commit_id = ? AND first_bad_commit_id = ?",
            key + [last_good_commit_id, first_bad_commit_id]).fetchone()
        if exists:
            con.execute("ROLLBACK")
            return None
        con.execute(
            "INSERT INTO confirmations (repo_id, engine, workload_key, device_name, variant, last_good_commit_id,"
            " first_bad_commit_id, host, batch, reruns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            key + [last_good_commit_id, first_bad_commit_id, host, batch, len(jobs)])
        ids = [store.enqueue_job(spec_json, label, batch) for spec_json, label in jobs]
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return ids


def record_confirmation_verdict(store, confirmation_id: int, state: str, verdict: str | None,
                                summary: str | None) -> None:
    """Write how a confirmation's re-runs came out: confirmed, dismissed or failed."""
    if state not in ("confirmed", "dismissed", "failed"):
        raise ValueError(f"record_confirmation_verdict: state {state!r}")
    store.con.execute(
        "UPDATE confirmations SET state = ?, verdict = ?, summary = ?, judged_at = current_timestamp"
        " WHERE confirmation_id = ?", [state, verdict, summary, confirmation_id])


def list_job_batches_of_runs(store, run_ids: list[int]) -> dict[int, str | None]:
    """The batch of the job each run came from (None: no job, or a job without a batch)."""
    rows = store.con.execute("SELECT r.run_id, j.batch FROM runs r LEFT JOIN jobs j USING (job_id)"
                             " WHERE list_contains(?, r.run_id)", [list(map(int, run_ids))]).fetchall()
    return {int(run_id): batch for run_id, batch in rows}
