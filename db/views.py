"""Every query the dashboard makes. Each function takes an open Store, carries its SQL inline with
`?` parameters, and returns a DataFrame or a dict of plain values (what the app caches).

Trend series: runs that measured a commit, grouped by repository, engine, GPU and workload key
(the workload without its variant and run-length fields). The key is long JSON, so pages name a
series by `workload_id`, the first 10 hex digits of its md5. Missing repo, engine or GPU names
are the empty string here, so that a series can be named by plain values in a URL. How a series
is named and matched is db.series' (one definition); one run's row and kernels are db.store's.
Change tracking reads its series and changes here too (list_series, get_series_of_run,
list_changes).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .series import (STEP_MS, SERIES_KEY, in_series_sql, same_series_sql, series_columns_sql, series_id_sql,
                     series_names_sql)
from .store import Store
from .sweeps import get_sweep_runs, list_sweeps  # noqa: F401 (the sweep page's reads, app.data loads views by name)

_SERIES_NAMES = series_columns_sql("r", "p")
def _one(store: Store, sql: str, params: list) -> dict[str, Any] | None:
    cur = store.con.execute(sql, params)
    row = cur.fetchone()
    return dict(zip([d[0] for d in cur.description], row)) if row else None


# -- counts and series ---------------------------------------------------------------------
def count_runs(store: Store) -> dict[str, int]:
    """Runs in all, runs that measured a commit, and jobs in the queue's history."""
    return _one(store, "SELECT (SELECT count(*) FROM runs) AS runs,"
                       " (SELECT count(*) FROM runs WHERE commit_id IS NOT NULL) AS runs_with_commit,"
                       " (SELECT count(*) FROM jobs) AS jobs", [])


def list_series(store: Store, repo: str | None = None) -> pd.DataFrame:
    """One row per trend series (runs with a commit; of one repository, or of all), the one with
    the most runs first: its names, batch size, workload key ('' for none), runs, commits
    measured, variants ('' for none) and the fewest step samples a run of it has (its steps timed
    without the profiler, else its profiled steps)."""
    # grouped by the coalesced columns first, then named: db.series' md5 once a series, not once a run
    # (at 100,000 runs the per-run md5 was most of this query); md5(key) is a function of the key, so
    # the groups are the same
    return store.con.execute(
        "SELECT repo, engine, device, batch_size, workload_id, workload_key, runs, commits, variants, fewest_samples"
        f" FROM (SELECT {series_columns_sql('g', 'g')}, g.* EXCLUDE (name, engine) FROM ("
        "  SELECT coalesce(p.name, '') AS name, coalesce(r.engine, '') AS engine,"
        "   coalesce(r.device_name, '') AS device_name, coalesce(r.workload_key, '') AS workload_key, r.batch_size,"
        "   count(*) AS runs, count(DISTINCT r.commit_id) AS commits,"
        "   list(DISTINCT coalesce(r.variant, '') ORDER BY coalesce(r.variant, '')) AS variants,"
        "   min(coalesce(json_array_length(r.manifest->'$.timing.step_ms'), r.steps)) AS fewest_samples"
        "  FROM runs r LEFT JOIN repos p ON p.repo_id = r.repo_id"
        "  WHERE r.commit_id IS NOT NULL AND (? IS NULL OR p.name = ?) GROUP BY ALL) g)"
        " ORDER BY runs DESC, repo, engine, device, workload_id",
        [repo, repo],
    ).df()


def get_trend(store: Store, repo: str, engine: str, device: str, workload_id: str,
              last_commits: int | None = None) -> pd.DataFrame:
    """Every run of one series with its commit's facts, in commit order (first-parent `seq`,
    then commit date), of the last `last_commits` commits measured (all when None). The tok/s
    band is the untimed step spread: tok/s at the p90 and the p10 step time."""
    # the series' commits are ranked once each (a window over its distinct commits, not over its runs
    # with a count(DISTINCT) beside it: 27 -> 14 ms at 10,000 runs a series, app/BENCHMARKS.md)
    return store.con.execute(
        "WITH sr AS (SELECT r.* FROM runs r LEFT JOIN repos p ON p.repo_id = r.repo_id"
        f"  WHERE r.commit_id IS NOT NULL AND {in_series_sql('r', 'p')}),"
        " ranked AS (SELECT c.*, row_number() OVER (ORDER BY c.seq NULLS LAST, c.committed_at NULLS LAST, c.sha)"
        "  AS commit_order FROM commits c WHERE c.commit_id IN (SELECT commit_id FROM sr)),"
        " shown AS (SELECT * FROM ranked WHERE ? IS NULL OR commit_order > (SELECT count(*) FROM ranked) - ?)"
        " SELECT r.run_id, coalesce(r.variant, '') AS variant, c.sha, left(c.sha, 7) AS short_sha,"
        "  coalesce(c.subject, '') AS subject, coalesce(c.author, '') AS author, c.committed_at, c.seq,"
        "  c.commit_order, r.tok_per_s,"
        "  r.tok_per_s * r.timing_ms_median / r.timing_ms_p90 AS tok_per_s_low,"
        "  r.tok_per_s * r.timing_ms_median / r.timing_ms_p10 AS tok_per_s_high,"
        f"  {STEP_MS} AS step_ms, r.timing_ms_p10 AS step_ms_p10, r.timing_ms_p90 AS step_ms_p90,"
        "  r.copy_share, r.gpu_busy_share, r.imported_at"
        " FROM sr r JOIN shown c ON c.commit_id = r.commit_id"
        " ORDER BY c.commit_order, variant, run_id",
        [repo, engine, device, workload_id, last_commits, last_commits],
    ).df()


def list_trend_breakdowns(store: Store, run_ids: list[int], top_kernels: int = 12) -> list[str]:
    """What a trend can also plot for these runs (rank 0): 'category:<c>' for every category they
    ran, then 'kernel:<name>' for the kernels with the most time (summed over the runs)."""
    ids = [int(r) for r in run_ids]
    cats = store.con.execute("SELECT DISTINCT category FROM step_categories WHERE list_contains(?, run_id)"
                             " AND rank = 0 ORDER BY category", [ids]).fetchall()
    kernels = store.con.execute("SELECT name FROM kernel_stats WHERE list_contains(?, run_id) AND rank = 0"
                                " GROUP BY name ORDER BY sum(total_us) DESC, name LIMIT ?",
                                [ids, top_kernels]).fetchall()
    return [f"category:{c}" for (c,) in cats] + [f"kernel:{k}" for (k,) in kernels]


def get_trend_breakdown(store: Store, run_ids: list[int], what: str) -> pd.DataFrame:
    """(run_id, ms_per_step) of one category ('category:<c>': its mean ms per profiled step,
    absent steps as 0) or one kernel ('kernel:<name>': its ms per step, summed over launchers
    and source lines; 0 in a run without it), rank 0, for each of the runs."""
    ids = [int(r) for r in run_ids]
    kind, _, name = what.partition(":")
    if kind == "category":
        sql = ("SELECT s.run_id, coalesce(sum(c.dur_us), 0) / 1000.0 / any_value(n.steps) AS ms_per_step"
               " FROM (SELECT unnest(?) AS run_id) s"
               " JOIN (SELECT run_id, count(*) AS steps FROM steps WHERE rank = 0 GROUP BY run_id) n USING (run_id)"
               " LEFT JOIN step_categories c ON c.run_id = s.run_id AND c.rank = 0 AND c.category = ?"
               " GROUP BY s.run_id ORDER BY s.run_id")
    elif kind == "kernel":
        sql = ("SELECT s.run_id, coalesce(sum(k.ms_per_step), 0) AS ms_per_step FROM (SELECT unnest(?) AS run_id) s"
               " LEFT JOIN kernel_stats k ON k.run_id = s.run_id AND k.rank = 0 AND k.name = ?"
               " GROUP BY s.run_id ORDER BY s.run_id")
    else:
        raise ValueError(f"trend breakdown {what!r}: expected 'category:<name>' or 'kernel:<name>'")
    return store.con.execute(sql, [ids, name]).df()


def get_series_of_run(store: Store, run_id: int | None) -> dict[str, Any] | None:
    """The series a run belongs to, named as list_series names it (repo, engine, device,
    workload_id), with its workload key and the run's variant ('' for none); None for a run
    without a commit (or no such run)."""
    if run_id is None:
        return None
    return _one(store, f"SELECT {_SERIES_NAMES}, coalesce(r.workload_key, '') AS workload_key,"
                       " coalesce(r.variant, '') AS variant FROM runs r LEFT JOIN repos p ON p.repo_id = r.repo_id"
                       " WHERE r.run_id = ? AND r.commit_id IS NOT NULL", [run_id])


def get_trend_of_run(store: Store, run_id: int | None) -> pd.DataFrame | None:
    """get_trend of the series the run belongs to; None for a run without a commit."""
    series = get_series_of_run(store, run_id)
    if series is None:
        return None
    return get_trend(store, series["repo"], series["engine"], series["device"], series["workload_id"])


def pick_run_at(trend: pd.DataFrame, sha: str, variant: str) -> int | None:
    """The run a series shows for a commit and variant (the newest import of it): what a
    comparison of two commits compares. Works on get_trend's frame."""
    rows = trend[(trend["sha"] == sha) & (trend["variant"] == variant)]
    return None if rows.empty else int(rows.sort_values(["imported_at", "run_id"]).iloc[-1]["run_id"])


def find_default_comparison(store: Store, series: pd.DataFrame | None = None,
                            trend: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """What Compare shows with nothing asked: the last two commits of the series with the most
    runs (its first variant measured at both), else the two newest runs; None with fewer than
    two runs. `series` (list_series) and `trend` (get_trend of its first series) are read here
    unless given (get_comparison reads them once for the page)."""
    series = list_series(store) if series is None else series
    if not series.empty:
        top = series.iloc[0]
        if trend is None:
            trend = get_trend(store, top.repo, top.engine, top.device, top.workload_id)
        shas = trend.drop_duplicates("sha")["sha"].tolist()
        if len(shas) >= 2:
            at_both = sorted(set(trend.loc[trend["sha"] == shas[-2], "variant"])
                             & set(trend.loc[trend["sha"] == shas[-1], "variant"]))
            if at_both:
                return {"by": "commits", "a": pick_run_at(trend, shas[-2], at_both[0]),
                        "b": pick_run_at(trend, shas[-1], at_both[0])}
    newest = [r for (r,) in store.con.execute("SELECT run_id FROM runs ORDER BY run_id DESC LIMIT 2").fetchall()]
    return {"by": "runs", "a": newest[1], "b": newest[0]} if len(newest) == 2 else None


def list_runs_without_commit(store: Store, limit: int = 200) -> pd.DataFrame:
    """Plain trace imports: runs that no commit was given for, newest first."""
    return store.con.execute(
        "SELECT r.run_id, r.imported_at, r.source_path, coalesce(r.engine, '') AS engine,"
        " coalesce(r.variant, '') AS variant, coalesce(r.device_name, '') AS device, r.steps,"
        f" r.tok_per_s, {STEP_MS} AS step_ms, r.copy_share, r.kernels_from_cpu_ops"
        " FROM runs r WHERE r.commit_id IS NULL ORDER BY r.run_id DESC LIMIT ?",
        [limit],
    ).df()


def list_recent_runs(store: Store, limit: int = 500) -> pd.DataFrame:
    """The newest runs, for pickers: id, commit, variant, and what they measured."""
    return store.con.execute(
        "SELECT r.run_id, coalesce(left(c.sha, 7), '') AS short_sha, coalesce(r.variant, '') AS variant,"
        " coalesce(r.engine, '') AS engine, coalesce(r.device_name, '') AS device, r.workload_key,"
        f" r.tok_per_s, {STEP_MS} AS step_ms"
        # the newest runs first, then their commits (not every run joined, then cut)
        " FROM (SELECT run_id, commit_id, variant, engine, device_name, workload_key, tok_per_s, timing_ms_median,"
        "  step_ms_median FROM runs ORDER BY run_id DESC LIMIT ?) r"
        " LEFT JOIN commits c ON c.commit_id = r.commit_id ORDER BY r.run_id DESC",
        [limit],
    ).df()


def find_default_run(store: Store, min_rated_share: float) -> dict[str, Any] | None:
    """The run the Run page opens on without a run in its URL: {run_id, newest_run_id, rated}.
    The newest run (highest id) whose first rank's kernels with a modelled byte or FLOP rate take
    at least `min_rated_share` of its kernel time (`rated` True: a roofline to draw, rates in the
    kernel table), else the newest run of all (`rated` False). None when there are no runs."""
    newest = store.con.execute("SELECT max(run_id) FROM runs").fetchone()[0]
    if newest is None:
        return None
    rated = store.con.execute(
        "WITH first_rank AS (SELECT run_id, min(rank) AS rank FROM kernel_stats GROUP BY run_id)"
        " SELECT k.run_id FROM kernel_stats k JOIN first_rank f ON f.run_id = k.run_id AND f.rank = k.rank"
        " GROUP BY k.run_id"
        " HAVING sum(k.share) FILTER (WHERE k.tbps > 0 OR k.tflops > 0) >= ?"
        " ORDER BY k.run_id DESC LIMIT 1", [min_rated_share]).fetchone()
    return {"run_id": rated[0] if rated else newest, "newest_run_id": newest, "rated": rated is not None}


# -- one run (its row, ranks and kernel table: Store.get_run, list_ranks, list_kernels) ------
def get_step_breakdown(store: Store, run_id: int, rank: int = 0) -> pd.DataFrame:
    """Kernel time per category in each profiled step (ms), plus `idle`: the step's wall time
    in which no kernel ran (GPU idle; for a CPU-only trace, time outside the top-level ops)."""
    return store.con.execute(
        "SELECT step, category, dur_us / 1000.0 AS ms FROM step_categories WHERE run_id = ? AND rank = ?"
        " UNION ALL"
        " SELECT step, 'idle' AS category, greatest(wall_us - coalesce(gpu_busy_us, kernel_us), 0) / 1000.0"
        " FROM steps WHERE run_id = ? AND rank = ?"
        " ORDER BY step, category",
        [run_id, rank, run_id, rank],
    ).df()


def get_category_means(store: Store, run_id: int, rank: int = 0) -> pd.DataFrame:
    """Mean ms per step of each category (a category missing from a step counts as 0 there),
    with `idle` as in get_step_breakdown; largest first. `sd_ms` is the standard deviation over
    the steps (absent steps as 0; NULL under two steps), `steps` their count."""
    return store.con.execute(
        "WITH n AS (SELECT count(*) AS steps FROM steps WHERE run_id = ? AND rank = ?),"
        " parts AS ("
        "  SELECT category, dur_us FROM step_categories WHERE run_id = ? AND rank = ?"
        "  UNION ALL SELECT 'idle', greatest(wall_us - coalesce(gpu_busy_us, kernel_us), 0)"
        "  FROM steps WHERE run_id = ? AND rank = ?),"
        " sums AS (SELECT category, sum(dur_us) / 1000.0 AS s, sum((dur_us / 1000.0) ^ 2) AS ss,"
        "  any_value(n.steps) AS steps FROM parts, n GROUP BY category)"
        " SELECT category, s / steps AS ms_per_step,"
        "  CASE WHEN steps >= 2 THEN sqrt(greatest(ss - s * s / steps, 0) / (steps - 1)) END AS sd_ms, steps"
        " FROM sums ORDER BY ms_per_step DESC, category",
        [run_id, rank, run_id, rank, run_id, rank],
    ).df()


def get_rank_figures(store: Store, run_id: int, rank: int, copy_categories: list[str]) -> dict[str, Any]:
    """One rank's own headline figures, as the run's row has them for its first rank: the median
    profiled step (`step_ms_median`), the share of step wall time in which a kernel ran
    (`gpu_busy_share`, None without GPU timing) and the `copy_categories`' share of all kernel time
    (`copy_share`, None without kernels)."""
    step_ms, busy = store.con.execute(
        "SELECT median(wall_us) / 1e3, sum(gpu_busy_us) / nullif(sum(wall_us), 0)"
        " FROM steps WHERE run_id = ? AND rank = ?", [run_id, rank]).fetchone()
    (copy,) = store.con.execute(
        "SELECT coalesce(sum(total_us) FILTER (WHERE list_contains(?, category)), 0) / nullif(sum(total_us), 0)"
        " FROM kernel_stats WHERE run_id = ? AND rank = ?", [list(copy_categories), run_id, rank]).fetchone()
    return {"step_ms_median": step_ms, "gpu_busy_share": busy, "copy_share": copy}


def get_job(store: Store, job_id: int | None) -> dict[str, Any] | None:
    """A job with its log (the last 64 KB of its output); None when there is no such job (or no
    job id: a run imported without one)."""
    return None if job_id is None else store.get_job(job_id, with_log=True)


def get_run_detail(store: Store, run_id: int | None, rank: int | None = None) -> dict[str, Any] | None:
    """Everything the Run page shows of one run and rank (by default its first: the only rank
    of a single trace, whatever its number), in one go: the overview, its ranks and their
    figures, the step breakdown and category means, the kernel table and the job that made it."""
    run = store.get_run(run_id)
    if run is None:
        return None
    ranks = store.list_ranks(run_id)
    if rank is None or rank not in ranks:
        rank = ranks[0] if ranks else 0
    return {"run": run, "ranks": ranks, "rank": rank, "rank_stats": store.list_rank_stats(run_id),
            "breakdown": get_step_breakdown(store, run_id, rank), "means": get_category_means(store, run_id, rank),
            "kernels": store.list_kernels(run_id, rank), "job": get_job(store, run["job_id"])}


# -- two runs ------------------------------------------------------------------------------
def get_variant_matrix(store: Store, run_a: int, run_b: int) -> pd.DataFrame:
    """Every variant of run A's series at run A's commit and run B's commit: the newest run of
    each variant at each commit, with tok/s, step ms and copy share side by side. Empty when a
    run has no commit."""
    return store.con.execute(
        f"WITH anchor AS (SELECT {SERIES_KEY} FROM runs WHERE run_id = ?),"
        " pair AS (SELECT (SELECT commit_id FROM runs WHERE run_id = ?) AS a, (SELECT commit_id FROM runs"
        "   WHERE run_id = ?) AS b),"
        " picked AS ("
        "  SELECT r.commit_id, coalesce(r.variant, '') AS variant, r.run_id, r.tok_per_s,"
        f"  {STEP_MS} AS step_ms, r.copy_share,"
        "   row_number() OVER (PARTITION BY r.commit_id, coalesce(r.variant, '')"
        "                      ORDER BY r.imported_at DESC, r.run_id DESC) AS newest"
        "  FROM runs r, anchor s, pair"
        f"  WHERE {same_series_sql('r', 's')} AND r.commit_id IN (pair.a, pair.b))"
        " SELECT variant,"
        "  max(run_id) FILTER (WHERE commit_id = pair.a) AS a_run_id,"
        "  max(run_id) FILTER (WHERE commit_id = pair.b) AS b_run_id,"
        "  max(tok_per_s) FILTER (WHERE commit_id = pair.a) AS a_tok_per_s,"
        "  max(tok_per_s) FILTER (WHERE commit_id = pair.b) AS b_tok_per_s,"
        "  max(step_ms) FILTER (WHERE commit_id = pair.a) AS a_step_ms,"
        "  max(step_ms) FILTER (WHERE commit_id = pair.b) AS b_step_ms,"
        "  max(copy_share) FILTER (WHERE commit_id = pair.a) AS a_copy_share,"
        "  max(copy_share) FILTER (WHERE commit_id = pair.b) AS b_copy_share"
        " FROM picked, pair WHERE newest = 1 GROUP BY variant ORDER BY variant",
        [run_a, run_a, run_b],
    ).df()


def get_category_diff(store: Store, run_a: int, run_b: int, rank_a: int = 0, rank_b: int = 0) -> pd.DataFrame:
    """Mean ms per step of each category in both runs (rank_a of run A, rank_b of run B) and the
    change (b - a), the largest change first, with each side's step-to-step sd_ms and steps. The
    categories' sums are the two runs' step times (idle included)."""
    a = get_category_means(store, run_a, rank_a).rename(columns={"ms_per_step": "a_ms_per_step", "sd_ms": "a_sd_ms",
                                                                  "steps": "a_steps"})
    b = get_category_means(store, run_b, rank_b).rename(columns={"ms_per_step": "b_ms_per_step", "sd_ms": "b_sd_ms",
                                                                  "steps": "b_steps"})
    out = a.merge(b, on="category", how="outer").fillna({"a_ms_per_step": 0.0, "b_ms_per_step": 0.0,
                                                          "a_sd_ms": 0.0, "b_sd_ms": 0.0})
    for side in ("a", "b"):  # a category absent from a run: 0 in each of its steps
        out[f"{side}_steps"] = out[f"{side}_steps"].fillna(out[f"{side}_steps"].max())
    out["delta_ms_per_step"] = out["b_ms_per_step"] - out["a_ms_per_step"]
    order = out["delta_ms_per_step"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)


def get_kernel_diff(store: Store, run_a: int, run_b: int, rank_a: int = 0, rank_b: int = 0) -> pd.DataFrame:
    """Kernels of two runs (rank_a of A, rank_b of B) matched by name and launcher op (summed over
    source lines): `change`
    is added, removed or both (whether a kernel in both changed is a verdict against noise:
    app/changes.classify_kernel_diff), with calls/step, ms/step, their step-to-step sd and share
    on each side, and its achieved TFLOP/s, TB/s and `roof_fraction` (the larger of its compute and
    bandwidth fractions: how close it runs to the roof that binds it; NULL unless every source
    line has them), sorted by |change in ms per step|."""
    # a kernel's rows of several source lines are summed; their step-to-step spreads are added
    # as independent (the root of the summed variances): an approximation, said in the page.
    # Rates over source lines are their FLOPs (bytes) over their time: weighted by total_us.
    def rate(column: str) -> str:
        return (f"CASE WHEN count({column}) = count(*) THEN sum({column} * total_us) / nullif(sum(total_us), 0) END")
    side = ("SELECT name, launcher, any_value(category) AS category, sum(calls_per_step) AS calls_per_step,"
            "   sum(ms_per_step) AS ms_per_step, sum(share) AS share, sqrt(sum(ms_per_step_sd ^ 2)) AS sd,"
            f"   {rate('tflops')} AS tflops, {rate('tbps')} AS tbps,"
            f"   {rate('greatest(compute_fraction, bandwidth_fraction)')} AS roof_fraction"
            "  FROM kernel_stats WHERE run_id = ? AND rank = ? GROUP BY name, launcher")
    return store.con.execute(
        f"WITH a AS ({side}), b AS ({side}),"
        " j AS (SELECT coalesce(a.name, b.name) AS name, coalesce(a.launcher, b.launcher) AS launcher,"
        "   coalesce(b.category, a.category) AS category,"
        "   a.calls_per_step AS a_calls_per_step, b.calls_per_step AS b_calls_per_step,"
        "   a.ms_per_step AS a_ms_per_step, b.ms_per_step AS b_ms_per_step, a.share AS a_share, b.share AS b_share,"
        "   a.sd AS a_ms_per_step_sd, b.sd AS b_ms_per_step_sd, a.tflops AS a_tflops, b.tflops AS b_tflops,"
        "   a.tbps AS a_tbps, b.tbps AS b_tbps, a.roof_fraction AS a_roof_fraction, b.roof_fraction AS b_roof_fraction,"
        "   (SELECT steps FROM runs WHERE run_id = ?) AS a_steps, (SELECT steps FROM runs WHERE run_id = ?) AS b_steps,"
        "   coalesce(b.ms_per_step, 0) - coalesce(a.ms_per_step, 0) AS delta_ms_per_step"
        "  FROM a FULL OUTER JOIN b ON a.name = b.name AND a.launcher = b.launcher)"
        " SELECT CASE WHEN a_ms_per_step IS NULL THEN 'added' WHEN b_ms_per_step IS NULL THEN 'removed'"
        "   ELSE 'both' END AS change, *"
        " FROM j ORDER BY abs(delta_ms_per_step) DESC, name, launcher",
        [run_a, rank_a, run_b, rank_b, run_a, run_b],
    ).df()


def get_run_spread(store: Store, run_id: int | None) -> dict[str, Any]:
    """How much runs of the same code differ, for the workload of this run: the pooled standard
    deviation of log(run step ms) within each (commit, variant) measured more than once, over
    the run's repository, engine, GPU and workload. {"spread": float or None (no repeated runs),
    "pairs": repeated runs it rests on (runs beyond the first of each group), "groups": groups}."""
    row = store.con.execute(
        f"WITH anchor AS (SELECT {SERIES_KEY} FROM runs WHERE run_id = ?),"
        f" x AS (SELECT r.commit_id, coalesce(r.variant, '') AS variant, ln({STEP_MS}) AS v"
        f"  FROM runs r, anchor s WHERE r.commit_id IS NOT NULL AND {same_series_sql('r', 's')} AND {STEP_MS} > 0),"
        " g AS (SELECT count(*) AS n, var_samp(v) * (count(*) - 1) AS ss FROM x"
        "  GROUP BY commit_id, variant HAVING count(*) >= 2)"
        " SELECT sum(greatest(ss, 0)), sum(n - 1), count(*) FROM g", [run_id]).fetchone()
    ss, pairs, groups = row if row else (None, None, 0)
    if not pairs:
        return {"spread": None, "pairs": 0, "groups": 0}
    return {"spread": float(ss / pairs) ** 0.5, "pairs": int(pairs), "groups": int(groups)}


def list_series_values(store: Store, run_id: int | None) -> pd.DataFrame:
    """Every run of the series of `run_id` (its repository, engine, GPU and workload; every
    variant), one row a run, in commit order: run_id, commit_id, sha, variant ('' for none),
    step_ms (the run's value: its timed steps' median, else its profiled steps'), tok_per_s.
    What the noise model (ingest.regress.noise) pools and estimates the run-to-run spread from.
    Empty for a run without a commit."""
    return store.con.execute(
        f"WITH anchor AS (SELECT {SERIES_KEY} FROM runs WHERE run_id = ? AND commit_id IS NOT NULL)"
        " SELECT r.run_id, r.commit_id, c.sha, coalesce(r.variant, '') AS variant,"
        f" {STEP_MS} AS step_ms, r.tok_per_s"
        " FROM runs r JOIN commits c ON c.commit_id = r.commit_id, anchor s"
        f" WHERE {same_series_sql('r', 's')}"
        " ORDER BY c.seq NULLS LAST, c.committed_at NULLS LAST, c.sha, r.run_id", [run_id]).df()


def list_runs_at_commit(store: Store, ref: str, repo: str | None = None) -> pd.DataFrame:
    """The runs of the commits whose sha starts with `ref` (lower case hex; of repository `repo`,
    or of any): run_id, sha, repo, variant ('' for none), `series` (one variant of a series:
    db.series.series_id_sql), step_ms. What `ingest compare` pools for a commit."""
    return store.con.execute(
        "SELECT r.run_id, c.sha, p.name AS repo, coalesce(r.variant, '') AS variant,"
        f" {series_id_sql('r', 'p')} AS series, {STEP_MS} AS step_ms"
        " FROM runs r JOIN commits c ON c.commit_id = r.commit_id JOIN repos p ON p.repo_id = r.repo_id"
        " WHERE starts_with(c.sha, ?) AND (? IS NULL OR p.name = ?) ORDER BY r.run_id", [ref, repo, repo]).df()


def list_repo_runs(store: Store, repo: str) -> list[tuple]:
    """(run_id, sha, step_ms, variant, series) of every run of a repository's commits, in commit
    order: what the A/A study (ingest.studies.aa_study) pairs up."""
    return store.con.execute(
        f"SELECT r.run_id, c.sha, {STEP_MS} AS step_ms, coalesce(r.variant, ''), {series_id_sql('r', 'p')}"
        " FROM runs r JOIN commits c USING (commit_id) JOIN repos p ON p.repo_id = r.repo_id WHERE p.name = ?"
        " ORDER BY c.seq, r.run_id", [repo]).fetchall()


def get_run_series_id(store: Store, run_id: int) -> dict[str, Any] | None:
    """A run's sha (None without a commit), variant, `series` (as list_runs_at_commit names it;
    None without a commit) and step_ms; None for no such run."""
    return _one(store, f"SELECT c.sha, coalesce(r.variant, '') AS variant, CASE WHEN r.commit_id IS NULL THEN NULL"
                       f" ELSE {series_id_sql('r', 'p')} END AS series, {STEP_MS} AS step_ms"
                       " FROM runs r LEFT JOIN commits c ON c.commit_id = r.commit_id"
                       " LEFT JOIN repos p ON p.repo_id = r.repo_id WHERE r.run_id = ?", [run_id])


def get_step_samples(store: Store, run_id: int | None) -> dict[str, Any]:
    """A run's step times in ms, what its Step ms tile is the median of: {"ms": [...], "source":
    "timed" (the steps a bundle timed without the profiler) or "profiled" (the profiled steps'
    wall times, first rank)}; empty for no run."""
    if run_id is None:
        return {"ms": [], "source": None}
    row = store.con.execute("SELECT manifest->>'$.timing.step_ms' FROM runs WHERE run_id = ?", [run_id]).fetchone()
    timed = json.loads(row[0]) if row and row[0] else None
    if isinstance(timed, list) and timed and all(isinstance(v, (int, float)) for v in timed):
        return {"ms": [float(v) for v in timed], "source": "timed"}
    walls = store.con.execute(
        "SELECT wall_us / 1000.0 FROM steps WHERE run_id = ? AND rank = (SELECT min(rank) FROM steps WHERE run_id = ?)"
        " ORDER BY step", [run_id, run_id]).fetchall()
    return {"ms": [w for (w,) in walls], "source": "profiled"}


def get_comparison(store: Store, run_a: int | None, run_b: int | None) -> dict[str, Any] | None:
    """Everything the Compare page shows of two runs, in one go (with either missing, those of
    find_default_comparison): both overviews (None for a missing run), every variant at both
    commits, run A's series (its trend, and its runs' values for the noise model, taken from
    the trend), the list of series, the step-time change, the kernel diff, both runs' kernel
    tables (for their diagnosis), their step samples and the changes found at run B's commit.
    Each series-wide frame is read once. None when the database has fewer than two runs."""
    by = None
    series = list_series(store)
    top_trend = None
    if run_a is None or run_b is None:
        if not series.empty:
            top = series.iloc[0]
            top_trend = get_trend(store, top.repo, top.engine, top.device, top.workload_id)
        default = find_default_comparison(store, series, top_trend)
        if default is None:
            return None
        run_a, run_b, by = default["a"], default["b"], default["by"]
    matrix = get_variant_matrix(store, run_a, run_b)
    # each run's first rank (a single trace of rank 1 has no rank 0), as the Run page shows it
    rank_a, rank_b = (next(iter(store.list_ranks(r)), 0) for r in (run_a, run_b))
    if top_trend is not None and by == "commits":  # the default pair is of the top series: its trend is read
        trend = top_trend
    else:
        trend = get_trend_of_run(store, run_a)
    both = store.list_runs([run_a, run_b])  # one query for both overviews
    return {"run_a": run_a, "run_b": run_b, "by": by, "a": both.get(run_a), "b": both.get(run_b),
            "matrix": matrix, "trend": trend, "series": series,
            "diff": get_category_diff(store, run_a, run_b, rank_a, rank_b),
            "kernels": get_kernel_diff(store, run_a, run_b, rank_a, rank_b),
            "kernels_a": store.list_kernels(run_a, rank_a), "kernels_b": store.list_kernels(run_b, rank_b),
            "samples_a": get_step_samples(store, run_a), "samples_b": get_step_samples(store, run_b),
            "series_values": list_series_values_of_trend(trend),
            "changes": list_changes_at_commit_of_run(store, run_b)}


def list_series_values_of_trend(trend: pd.DataFrame | None) -> pd.DataFrame:
    """list_series_values' frame from the series' get_trend frame (the same runs: one series,
    every variant), in commit order, `commit_id` being the trend's commit_order: what Compare
    pools, without reading the series' runs a second time. Empty for no trend (a run without
    a commit)."""
    columns = ["run_id", "commit_id", "sha", "variant", "step_ms", "tok_per_s"]
    if trend is None or trend.empty:
        return pd.DataFrame(columns=columns)
    return (trend.sort_values(["commit_order", "run_id"], kind="stable")
            .assign(commit_id=trend["commit_order"])[columns].reset_index(drop=True))


# -- confirmed changes (written by ingest.runs.track) -------------------------------------
# one change with its series' names and both commits' facts; `series_id` names the series
# (repo, engine, GPU, workload key, variant) for URLs
_, _CHANGE_ENGINE, _CHANGE_DEVICE, _CHANGE_WORKLOAD_ID = series_names_sql("ch", "p")  # the repo: never NULL
_CHANGES = (
    f"SELECT ch.change_id, p.name AS repo, {_CHANGE_ENGINE} AS engine, {_CHANGE_DEVICE} AS device,"
    f" ch.workload_key, {_CHANGE_WORKLOAD_ID} AS workload_id, coalesce(ch.variant, '') AS variant,"
    f" {series_id_sql('ch', 'p')} AS series_id,"
    " ch.metric, ch.direction, ch.before_value, ch.after_value, ch.rel_change, ch.p_value,"
    # how the noise model (ingest.regress.noise) judged it: confirmed, or suspected (no spread to
    # judge against, or stored before the model judged changes)
    " CASE WHEN ch.explanation->>'$.noise.verdict' IN ('regression', 'improvement') THEN 'confirmed'"
    "  ELSE 'suspected' END AS status, ch.explanation->>'$.noise.verdict' AS noise_verdict,"
    " TRY_CAST(ch.explanation->>'$.noise.spread' AS DOUBLE) AS noise_spread,"
    " ch.explanation->>'$.noise.spread_source' AS noise_source,"
    " TRY_CAST(ch.explanation->>'$.noise.runs_before' AS INTEGER) AS runs_before,"
    " TRY_CAST(ch.explanation->>'$.noise.runs_after' AS INTEGER) AS runs_after,"
    " ch.commits_between, ch.bisect_runs, ch.diagnosis,"
    " g.sha AS last_good_sha, b.sha AS first_bad_sha, left(b.sha, 7) AS first_bad_short_sha,"
    " coalesce(b.subject, '') AS first_bad_subject, b.committed_at AS first_bad_date,"
    " coalesce(b.author, '') AS first_bad_author, b.seq AS first_bad_seq,"
    " ch.last_good_run_id, ch.first_bad_run_id, ch.last_good_commit_id, ch.first_bad_commit_id, ch.detected_at,"
    # its window's interleaved re-runs (ingest/runs/confirm.py), if any, and whether its first bad
    # run came from a spec the worker can run again (NULL: imported)
    " cf.state AS confirm_state, cf.reruns AS confirm_reruns, cf.host AS confirm_host, cf.verdict AS confirm_verdict,"
    " (SELECT j.spec->>'$.engine' FROM runs fr JOIN jobs j ON j.job_id = fr.job_id"
    "  WHERE fr.run_id = ch.first_bad_run_id) AS first_bad_spec_engine"
    " FROM changes ch JOIN repos p ON p.repo_id = ch.repo_id"
    " JOIN commits g ON g.commit_id = ch.last_good_commit_id JOIN commits b ON b.commit_id = ch.first_bad_commit_id"
    " LEFT JOIN confirmations cf ON cf.repo_id = ch.repo_id AND cf.engine IS NOT DISTINCT FROM ch.engine"
    "  AND cf.workload_key IS NOT DISTINCT FROM ch.workload_key AND cf.device_name IS NOT DISTINCT FROM ch.device_name"
    "  AND cf.variant IS NOT DISTINCT FROM ch.variant AND cf.last_good_commit_id = ch.last_good_commit_id"
    "  AND cf.first_bad_commit_id = ch.first_bad_commit_id"
)
_NEWEST_FIRST = " ORDER BY b.seq DESC NULLS LAST, b.committed_at DESC NULLS LAST, ch.change_id DESC"


def _with_diagnosis(changes: pd.DataFrame) -> pd.DataFrame:
    """The diagnosis JSON text as a list of {kind, text, numbers, kernel} (empty when none)."""
    changes["diagnosis"] = [json.loads(d) or [] if isinstance(d, str) and d else [] for d in changes["diagnosis"]]
    return changes


def list_changes(store: Store, limit: int = 1000) -> pd.DataFrame:
    """Every confirmed change (up to `limit`), newest first (by the first bad commit's
    first-parent order), with its series' names, both commits' facts and its diagnosis."""
    return _with_diagnosis(store.con.execute(_CHANGES + _NEWEST_FIRST + " LIMIT ?", [limit]).df())


_, _CONFIRM_ENGINE, _CONFIRM_DEVICE, _ = series_names_sql("cf", "p")


def list_dismissed_confirmations(store: Store, limit: int = 100) -> pd.DataFrame:
    """Suspected changes that their interleaved re-runs did not confirm (ingest/runs/confirm.py),
    newest first: series names, both commits, the re-runs, the host and the noise model's verdict."""
    return store.con.execute(
        f"SELECT cf.confirmation_id, p.name AS repo, {_CONFIRM_ENGINE} AS engine,"
        f" {_CONFIRM_DEVICE} AS device, coalesce(cf.variant, '') AS variant,"
        " g.sha AS last_good_sha, b.sha AS first_bad_sha, coalesce(b.subject, '') AS first_bad_subject,"
        " cf.reruns, cf.host, cf.verdict, cf.summary, cf.judged_at"
        " FROM confirmations cf JOIN repos p ON p.repo_id = cf.repo_id"
        " JOIN commits g ON g.commit_id = cf.last_good_commit_id JOIN commits b ON b.commit_id = cf.first_bad_commit_id"
        " WHERE cf.state = 'dismissed' ORDER BY cf.judged_at DESC, cf.confirmation_id DESC LIMIT ?", [limit]).df()


def list_series_changes(store: Store, repo: str, engine: str, device: str, workload_id: str) -> pd.DataFrame:
    """The confirmed tok/s, step ms and copy-share changes of one trend series (any variant):
    what the trend chart marks."""
    return _with_diagnosis(store.con.execute(
        _CHANGES + f" WHERE {in_series_sql('ch', 'p')} AND ch.metric IN ('tok_per_s', 'step_ms', 'copy_share')"
        + _NEWEST_FIRST,
        [repo, engine, device, workload_id]).df())


def list_changes_at_commit_of_run(store: Store, run_id: int | None) -> pd.DataFrame:
    """The confirmed changes whose first bad commit is this run's commit (in its repository)."""
    return _with_diagnosis(store.con.execute(
        _CHANGES + " WHERE ch.first_bad_commit_id = (SELECT commit_id FROM runs WHERE run_id = ?)" + _NEWEST_FIRST,
        [run_id]).df())


# -- the job queue -------------------------------------------------------------------------
def list_jobs(store: Store, limit: int = 50, log_tail_chars: int = 2000) -> list[dict[str, Any]]:
    """The newest jobs, with the end of each one's log, its run's tok/s when it made one, and
    the seconds since it was queued and since its worker last reported (as the database's
    clock counts them, the clock that wrote those times)."""
    cur = store.con.execute(
        "SELECT j.job_id, j.label, j.status, j.error_kind, j.error, j.queued_at, j.started_at,"
        " j.finished_at, j.heartbeat_at, j.worker, j.steps_done, j.steps_planned, j.cancel_requested,"
        " j.run_id, j.batch, right(j.log, ?) AS log_tail, r.tok_per_s,"
        " date_diff('second', j.queued_at, current_timestamp::TIMESTAMP) AS queued_s,"
        " date_diff('second', j.heartbeat_at, current_timestamp::TIMESTAMP) AS heartbeat_s"
        " FROM jobs j LEFT JOIN runs r ON r.run_id = j.run_id ORDER BY j.job_id DESC LIMIT ?",
        [log_tail_chars, limit],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
