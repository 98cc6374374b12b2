"""A large synthetic database, for the dashboard's benchmark (app/studies/pages.py; figures in
app/BENCHMARKS.md): written through the real migrations, then filled with plain SQL over
generated rows, `range()` and its sizes as ? parameters. By default 2 repositories x 500 commits
x 2 variants x 5 workloads = 10,000 runs (every hundredth without a commit), 200 kernels each
(2,000,000 kernel rows), 10 steps of 8 categories each, and 2,000 jobs."""

from __future__ import annotations

from pathlib import Path

from db.store import Store, open_db

CATEGORIES = ["gemm", "attention", "cast", "memcpy", "moe", "norm", "elementwise", "communication"]

# the generated rows, as plain SQL over range(); each statement takes its sizes as ? parameters
_GENERATE = [
    ("repos", "INSERT INTO repos (repo_id, name) SELECT r, 'repo' || r FROM range(1, ? + 1) t(r)", ("repos",)),
    ("commits",
     "INSERT INTO commits (commit_id, repo_id, sha, committed_at, author, subject, seq)"
     " SELECT (r - 1) * ? + s, r, md5('c' || r || '-' || s) || left(md5('d' || s), 8),"
     "  TIMESTAMP '2026-01-01' + to_hours(s::BIGINT), 'author ' || (s % 7),"
     "  'subject of commit ' || s || ' in repo ' || r, s"
     " FROM range(1, ? + 1) a(r), range(1, ? + 1) b(s)", ("commits", "repos", "commits")),
    ("runs",
     "INSERT INTO runs (run_id, content_hash, repo_id, commit_id, variant, engine, workload, device_name,"
     " peak_gbps, ranks, steps, step_method, step_ms_median, tok_per_s, layers, copy_share, gpu_busy_share,"
     " kernel_us_total, kernels_from_cpu_ops, source_path, workload_key, batch_size, timing_ms_median,"
     " timing_ms_p10, timing_ms_p90)"
     " SELECT id, md5('run' || id), c.repo_id, CASE WHEN id % 100 = 0 THEN NULL ELSE c.commit_id END,"
     "  CASE WHEN v = 0 THEN 'unpatched' ELSE 'patched' END, 'sglang',"
     "  '{\"model_path\": \"glm5\", \"batch_size\": ' || (1 << w) || ', \"tp\": 8}', 'NVIDIA H200', 4800, 1, ?,"
     "  'graph-launch', 95 - 60 * v + w + (id % 13) * 0.1, 1000.0 * (1 << w) / (90 - 60 * v + w),"
     "  78, 0.69 - 0.6 * v, 0.95, 1e6, false, '/data/bench/run' || id,"
     "  '{\"batch_size\": ' || (1 << w) || ', \"model_path\": \"glm5\", \"tp\": 8}', 1 << w,"
     "  90 - 60 * v + w + (id % 13) * 0.1, 89 - 60 * v + w, 92 - 60 * v + w"
     " FROM (SELECT ((commit_id - 1) * 2 + v) * ? + w + 1 AS id, commit_id, v, w"
     "       FROM commits, range(2) a(v), range(?) b(w)) g JOIN commits c USING (commit_id)"
     " ORDER BY id", ("steps", "workloads", "workloads")),
    ("kernel_stats",
     "INSERT INTO kernel_stats (run_id, rank, name, category, launcher, source, calls, calls_per_step, total_us,"
     " mean_us, median_us, p90_us, min_us, max_us, ms_per_step, share, bytes_per_call, gbps, peak_fraction)"
     " SELECT run_id, 0, 'void at::native::some_templated_kernel<' || k || ', float, 128>(long, char*)',"
     "  ?[1 + k % 8], 'aten::op' || (k % 20), 'model.py(' || (100 + k) || '): forward',"
     "  780, 78, 780 * (1 + k % 17) * 3.0, (1 + k % 17) * 3.0, (1 + k % 17) * 3.0, (1 + k % 17) * 3.3,"
     "  (1 + k % 17) * 2.9, (1 + k % 17) * 3.9, 78 * (1 + k % 17) * 3.0 / 1000, (1 + k % 17) / 1800.0,"
     "  CASE WHEN k % 8 IN (2, 3) THEN 1e6 END, CASE WHEN k % 8 IN (2, 3) THEN 3000.0 END,"
     "  CASE WHEN k % 8 IN (2, 3) THEN 0.625 END"
     " FROM runs, range(?) t(k) ORDER BY run_id, k", ("category_list", "kernels")),
    ("steps",
     "INSERT INTO steps (run_id, rank, step, wall_us, gpu_busy_us, kernel_us)"
     " SELECT run_id, 0, s, 95000 + s, 90000, 90000 FROM runs, range(?) t(s) ORDER BY run_id, s", ("steps",)),
    ("step_categories",
     "INSERT INTO step_categories (run_id, rank, step, category, dur_us)"
     " SELECT run_id, 0, s, ?[1 + c], 10000 + 1000 * c FROM runs, range(?) t(s), range(8) u(c)"
     " ORDER BY run_id, s, c", ("category_list", "steps")),
    ("jobs",
     "INSERT INTO jobs (job_id, spec, label, status, run_id, steps_done, steps_planned, log, finished_at,"
     " started_at, heartbeat_at, batch)"
     " SELECT j, '{}', 'sglang glm5 job ' || j, CASE WHEN j > ? - 20 THEN 'queued' WHEN j > ? - 25 THEN"
     "  'running' ELSE 'succeeded' END, CASE WHEN j <= ? - 25 THEN j END, 5, 30, repeat('log line\n', 200),"
     "  current_timestamp, current_timestamp, current_timestamp, 'bench'"
     " FROM range(1, ? + 1) t(j)", ("jobs", "jobs", "jobs", "jobs")),
]


def generate(path: Path, *, repos: int = 2, commits: int = 500, workloads: int = 5, kernels: int = 200,
             steps: int = 10, jobs: int = 2000) -> dict[str, int]:
    """Write the database at `path` (a new file); returns its tables' row counts (Store.count_rows)."""
    sizes = {"repos": repos, "commits": commits, "workloads": workloads, "kernels": kernels, "steps": steps,
             "jobs": jobs, "category_list": CATEGORIES}
    with open_db(path) as store:
        for _, sql, params in _GENERATE:
            store.con.execute(sql, [sizes[p] for p in params])
        store.con.execute("CHECKPOINT")
        return store.count_rows()


def count_kernel_rows(store: Store) -> int:
    """`SELECT count(*) FROM kernel_stats`: the benchmark's baseline, the cheapest query over the
    biggest table, timed in the same run as the pages' queries."""
    return store.con.execute("SELECT count(*) FROM kernel_stats").fetchone()[0]
