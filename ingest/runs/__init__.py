"""Running benchmarks: specs, engines (reference, sglang, import), hosts (local, SSH), the job
queue's worker, and what follows a run (its series' changes, bisect jobs). Results travel as
bundles (kernels/bundle.py); only the process that imports a bundle writes the database.

May import: db, kernels.bundle, kernels.names, ingest.traces (the import), ingest.regress,
ingest.errors, ingest.limits, ingest.priority. app/ may import only `spec` and `errors` from here
(parsing, no I/O).
"""
