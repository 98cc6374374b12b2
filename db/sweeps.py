"""Sweeps, as the data defines them: at one commit, the runs of one repository, engine and GPU
whose workloads are the same except for the batch size and the context (input length) form a
sweep; each (batch size, context) is a point, each variant a line. A run needs no sweep id to be
part of one: imported runs, runs of a sweep spec and single runs that happen to line up are
sweeps alike. Runs of a sweep spec also carry its id (runs.sweep_id, migration 015): list_sweeps
names the spec sweeps among a sweep's runs, so that a spec's id finds its sweep (app.sweeps.find_sweep_of_spec).

A sweep's workload, its `family key`, is the run's workload key (the workload without its variant
and run-length fields: db.series) with the fields that vary along a sweep (SWEEP_FIELDS) taken
out; pages name a sweep by `sweep_id`, the first 10 hex digits of the md5 of its repository,
engine, GPU and family key (one short value for a URL, as series are named by workload_id). A
point's runs are one series (db.series: one workload key), so the noise model's spread of a point
is its own series'.
"""

from __future__ import annotations

import pandas as pd

from .series import STEP_MS, series_names_sql
from .store import Store

SWEEP_FIELDS = ("active_rows", "batch_size", "context", "input_len")  # what varies along a sweep
# the workload key (json.dumps, sorted keys, ", " and ": " separators) without SWEEP_FIELDS
_FAMILY_KEY = ("regexp_replace(coalesce(r.workload_key, ''), '\"(" + "|".join(SWEEP_FIELDS)
               + ")\": [^,}]*(, )?', '', 'g')")
_CONTEXT = "try_cast(coalesce(r.workload->>'$.context', r.workload->>'$.input_len') AS BIGINT)"
_NAMES = series_names_sql("r", "p")[:3]  # repo, engine, device as pages name them
_SWEEP_ID = f"left(md5(concat_ws('|', {', '.join(_NAMES)}, {_FAMILY_KEY})), 10)"


def list_sweeps(store: Store) -> pd.DataFrame:
    """One row per sweep at a commit (runs with a commit and a batch size, at least two batch sizes
    at one commit): repo, engine, device, sweep_id, workload_key (one point's), sha, short_sha, subject, seq,
    committed_at, runs, batch_sizes, contexts, variants and spec_sweep_ids (the sweep specs' ids its
runs carry, runs.sweep_id; sorted lists, empty for imported runs). The newest commit first,
    then the sweep with the most runs."""
    return store.con.execute(
        "SELECT repo, engine, device, sweep_id, any_value(workload_key) AS workload_key, sha,"
        " left(sha, 7) AS short_sha,"
        " coalesce(subject, '') AS subject, seq, committed_at, count(*) AS runs,"
        " list(DISTINCT batch_size ORDER BY batch_size) AS batch_sizes,"
        " coalesce(list(DISTINCT context ORDER BY context) FILTER (WHERE context IS NOT NULL), []) AS contexts,"
        " list(DISTINCT variant ORDER BY variant) AS variants,"
        " coalesce(list(DISTINCT spec_sweep_id ORDER BY spec_sweep_id) FILTER (WHERE spec_sweep_id IS NOT NULL), [])"
        "  AS spec_sweep_ids"
        f" FROM (SELECT {_NAMES[0]} AS repo, {_NAMES[1]} AS engine, {_NAMES[2]} AS device,"
        f"  {_FAMILY_KEY} AS family_key, {_SWEEP_ID} AS sweep_id, r.workload_key, c.sha, c.subject, c.seq,"
        "  c.committed_at, r.batch_size,"
        f"  {_CONTEXT} AS context, coalesce(r.variant, '') AS variant, r.sweep_id AS spec_sweep_id"
        "  FROM runs r JOIN commits c ON c.commit_id = r.commit_id LEFT JOIN repos p ON p.repo_id = r.repo_id"
        "  WHERE r.batch_size IS NOT NULL)"
        " GROUP BY repo, engine, device, family_key, sweep_id, sha, subject, seq, committed_at"
        " HAVING count(DISTINCT batch_size) >= 2"
        " ORDER BY seq DESC NULLS LAST, committed_at DESC NULLS LAST, runs DESC, sha, sweep_id",
    ).df()


def get_sweep_runs(store: Store, sweep_id: str) -> pd.DataFrame:
    """Every run of one sweep's workload (named as list_sweeps names it) at every commit, one row a
    run in commit order (first-parent seq, then date), runs of a commit together: run_id,
    commit_id, sha, short_sha, subject, commit_order, variant ('' for none), batch_size, context,
    workload_id (the point's series, as db.series names it), step_ms (the run's value: its timed
    steps' median, else its profiled steps'), tok_per_s and copy_share. Every commit, not only the
    sweep's: a point's run-to-run spread is its series' (ingest.regress.noise)."""
    return store.con.execute(
        "SELECT r.run_id, r.commit_id, c.sha, left(c.sha, 7) AS short_sha, coalesce(c.subject, '') AS subject,"
        "  dense_rank() OVER (ORDER BY c.seq NULLS LAST, c.committed_at NULLS LAST, c.sha) AS commit_order,"
        f"  coalesce(r.variant, '') AS variant, r.batch_size, {_CONTEXT} AS context,"
        f"  {series_names_sql('r', 'p')[3]} AS workload_id, {STEP_MS} AS step_ms, r.tok_per_s, r.copy_share"
        " FROM runs r JOIN commits c ON c.commit_id = r.commit_id LEFT JOIN repos p ON p.repo_id = r.repo_id"
        f" WHERE r.batch_size IS NOT NULL AND {_SWEEP_ID} = ?"
        " ORDER BY commit_order, r.run_id",
        [sweep_id],
    ).df()

