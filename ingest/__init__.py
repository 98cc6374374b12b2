"""stepwatch ingest: the side that writes results. Three parts, as equals, and the command line:

- `ingest.traces`: read torch.profiler traces (one file, a directory of ranks, a bundle) into
  per-step, per-kernel figures and import them (trace_read -> nesting -> analyse -> importer).
- `ingest.runs`: run decode benchmarks (specs, engines, hosts local and SSH, the job queue's
  worker), follow each run's series and bisect what changed.
- `ingest.regress`: find and explain regressions; pure functions, no database, no I/O.
- `ingest.cli`, `ingest.commands`, `ingest.report`: `python -m ingest ...`.

Shared leaves: `ingest.errors` (exceptions), `ingest.limits` (named limits), `ingest.priority`.
Measurement and study code lives in `ingest.studies`, which nothing at run time imports.

May import: db, kernels (bundle and names only, outside the command line and studies). The rule
for each part is in its docstring and enforced by tests/test_layers.py.
"""
