"""Reading traces: torch.profiler JSON (plain or gzip, one file or one per rank, or a bundle) into
per-step, per-kernel figures, exact against torch's `key_averages()`, and their import.

A chain of pure stages over arrays: `trace_read` (stream the file, keep typed columns) ->
`nesting` (what runs inside what) -> `analyse` (link launches, assign steps, categories, shapes,
aggregate; `timeline`: busy time, exposed communication, host syncs inside steps) -> `importer`
(one record per run, ranks read at once by `rank_pool`, checked for consistency and patterns,
stored by db).

May import: db, kernels.bundle, kernels.names, ingest.regress (diagnosis sentences, consistency,
patterns), ingest.errors,
ingest.limits, ingest.priority. Not ingest.runs, not app.
"""
