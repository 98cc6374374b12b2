-- What the import checks about a run, written when it is imported (NULL for runs imported before):
-- the GPU timeline's figures of its first rank (ingest/traces/timeline.py: streams, busy, exposed
-- communication, host syncs inside steps), whether its figures agree with one another and with
-- its measured tok/s (ingest/regress/consistency.py), and the pattern catalog's findings
-- (ingest/regress/patterns.py, patterns.toml).
ALTER TABLE runs ADD COLUMN timeline JSON;
ALTER TABLE runs ADD COLUMN consistency JSON;
ALTER TABLE runs ADD COLUMN patterns JSON;

-- A kernel row's launching ops' tensor input dtypes as torch names them ("bfloat16", "float32",
-- "bfloat16, float8_e4m3fn" for an op with two; distinct ones of several ops joined by " | "), ''
-- when unknown (no record_shapes, a CUDA-graph replay); NULL for runs imported before.
ALTER TABLE kernel_stats ADD COLUMN input_dtypes VARCHAR;
