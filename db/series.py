"""Queries behind change detection: runs grouped into series along commit order, their per-step
samples and kernel rows, and the changes found in them. Functions take a db.store.Store."""

from __future__ import annotations

import json

import pandas as pd

SERIES_COLUMNS = ["repo", "engine", "workload_key", "device_name", "variant"]


def list_series(store, repo: str | None = None) -> pd.DataFrame:
    """Every (repo, engine, workload, device, variant) with runs at known commits."""
    return store.con.execute(
        "SELECT p.name AS repo, r.engine, r.workload_key, r.device_name, r.variant, count(*) AS runs"
        " FROM runs r JOIN repos p USING (repo_id) WHERE r.commit_id IS NOT NULL AND (? IS NULL OR p.name = ?)"
        " GROUP BY ALL ORDER BY ALL", [repo, repo]).df()


def load_points(store, repo: str, engine, workload_key, device_name, variant,
                seq_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """The series' runs in commit order (first-parent seq, then date): one row per run, with
    the untimed step samples from its manifest (`step_ms_samples`, a list, may be empty)."""
    lo, hi = seq_range if seq_range else (None, None)
    engine, workload_key, device_name, variant = (None if pd.isna(v) else v
                                                  for v in (engine, workload_key, device_name, variant))
    frame = store.con.execute(
        "SELECT r.run_id, c.commit_id, c.sha, c.seq, c.committed_at, c.author, c.subject,"
        " r.tok_per_s, coalesce(r.timing_ms_median, r.step_ms_median) AS step_ms, r.copy_share,"
        " r.batch_size, r.layers, r.job_id, r.manifest->>'$.timing.step_ms' AS samples_json"
        " FROM runs r JOIN commits c USING (commit_id) JOIN repos p ON p.repo_id = r.repo_id"
        " WHERE p.name = ? AND r.engine IS NOT DISTINCT FROM ? AND r.workload_key IS NOT DISTINCT FROM ?"
        " AND r.device_name IS NOT DISTINCT FROM ? AND r.variant IS NOT DISTINCT FROM ?"
        " AND (? IS NULL OR c.seq >= ?) AND (? IS NULL OR c.seq <= ?)"
        " ORDER BY c.seq NULLS LAST, c.committed_at, r.run_id",
        [repo, engine, workload_key, device_name, variant, lo, lo, hi, hi]).df()
    frame["step_ms_samples"] = [json.loads(s) if isinstance(s, str) and s else [] for s in frame.pop("samples_json")]
    return frame


def load_step_categories(store, run_ids: list[int]) -> pd.DataFrame:
    """Per run and profiled step: wall time and time per category (rank 0)."""
    return store.con.execute(
        "SELECT s.run_id, s.step, s.wall_us, s.kernel_us, c.category, coalesce(c.dur_us, 0) AS dur_us"
        " FROM steps s LEFT JOIN step_categories c USING (run_id, rank, step)"
        " WHERE s.rank = 0 AND list_contains(?, s.run_id) ORDER BY s.run_id, s.step",
        [list(map(int, run_ids))]).df()


def load_runs_facts(store, run_ids: list[int]) -> dict[int, dict]:
    """Store.get_run of each run plus its manifest, timing median and batch size, in two
    queries whatever the number of runs (a series read holds the file: one query per run made
    that hold grow with the series)."""
    runs = store.get_runs(run_ids)
    rows = store.con.execute("SELECT run_id, manifest, timing_ms_median, batch_size FROM runs"
                             " WHERE list_contains(?, run_id)", [list(map(int, run_ids))]).fetchall()
    for run_id, manifest, timing, batch in rows:
        run = runs[run_id]
        run["manifest"] = json.loads(manifest) if manifest else None
        run["timing_ms_median"], run["batch_size"] = timing, batch
    return runs


def replace_changes(store, repo: str, series: dict, rows: list[dict]) -> list[int]:
    """Replace a series' stored changes by `rows` (one transaction); returns their ids."""
    con = store.con
    repo_id = store._ensure_repo(repo)
    key = [repo_id, series["engine"], series["workload_key"], series["device_name"], series["variant"]]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "DELETE FROM changes WHERE repo_id = ? AND engine IS NOT DISTINCT FROM ?"
            " AND workload_key IS NOT DISTINCT FROM ? AND device_name IS NOT DISTINCT FROM ?"
            " AND variant IS NOT DISTINCT FROM ?", key)
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


def list_changes(store, repo: str | None = None, limit: int = 200) -> pd.DataFrame:
    """Newest first (by the first bad commit's order), with both commits' facts."""
    return store.con.execute(
        "SELECT ch.change_id, p.name AS repo, ch.engine, ch.workload_key, ch.device_name, ch.variant,"
        " ch.metric, ch.direction, ch.before_value, ch.after_value, ch.rel_change, ch.p_value,"
        " ch.commits_between, ch.bisect_runs, ch.explanation, ch.diagnosis,"
        " g.sha AS last_good_sha, b.sha AS first_bad_sha, b.subject AS first_bad_subject,"
        " b.committed_at AS first_bad_date, b.author AS first_bad_author, b.seq AS first_bad_seq,"
        " ch.last_good_run_id, ch.first_bad_run_id, ch.detected_at"
        " FROM changes ch JOIN repos p USING (repo_id)"
        " JOIN commits g ON g.commit_id = ch.last_good_commit_id JOIN commits b ON b.commit_id = ch.first_bad_commit_id"
        " WHERE ? IS NULL OR p.name = ? ORDER BY b.seq DESC NULLS LAST, ch.change_id DESC LIMIT ?",
        [repo, repo, limit]).df()
