-- Graph-kernel attribution (ingest/traces/graph_attribution.py): a CUDA-graph run imported with a
-- graph-off mapping trace of the same workload. On the run, how its replayed kernels were attributed
-- (JSON: method, mapping file, kernels, matched, unmatched, time_share, steps_aligned, steps_refused,
-- layer_frame); NULL when no mapping was given. On a kernel row, the op, Python line and layers
-- ("0-77") its graph kernels' twins in the mapping trace had, kept apart from `launcher` and
-- `source` (what this trace itself says: cudaGraphLaunch); '' where none, NULL for runs imported before.
ALTER TABLE runs ADD COLUMN graph_attribution JSON;
ALTER TABLE kernel_stats ADD COLUMN graph_op VARCHAR;
ALTER TABLE kernel_stats ADD COLUMN graph_source VARCHAR;
ALTER TABLE kernel_stats ADD COLUMN graph_layers VARCHAR;
