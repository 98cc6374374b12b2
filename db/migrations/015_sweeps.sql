-- Sweeps (ingest/runs/spec.py SweepSpec): one spec with lists of batch sizes, input/output lengths
-- (and, for the reference engine, contexts) is one run a combination, each of its own series, tied
-- together by the sweep's id. A sweep's jobs carry it too (one job a point for the reference engine,
-- one job for SGLang's one-batch benchmark, which runs every point in one process).
-- The one-batch benchmark's JSONL figures of the run's point (bench_one_batch.py
-- latency_test_run_once's measurement_results), and the peak GPU memory where the engine reports it;
-- NULL where the engine reports no such figure.
ALTER TABLE runs ADD COLUMN sweep_id VARCHAR;             -- the sweep the run is a point of, NULL for none
ALTER TABLE runs ADD COLUMN sweep_point INTEGER;          -- its index among the sweep's points (0-based)
ALTER TABLE runs ADD COLUMN prefill_ms DOUBLE;            -- JSONL prefill_latency (s) x 1000
ALTER TABLE runs ADD COLUMN prefill_tok_per_s DOUBLE;     -- JSONL prefill_throughput
ALTER TABLE runs ADD COLUMN decode_ms_median DOUBLE;      -- JSONL median_decode_latency (s) x 1000
ALTER TABLE runs ADD COLUMN decode_tok_per_s_median DOUBLE;  -- JSONL median_decode_throughput
ALTER TABLE runs ADD COLUMN total_latency_ms DOUBLE;      -- JSONL total_latency (s) x 1000
ALTER TABLE runs ADD COLUMN peak_gpu_mem_bytes BIGINT;    -- the engine's peak GPU memory, where it reports one
ALTER TABLE jobs ADD COLUMN sweep_id VARCHAR;             -- the spec's sweep_id: a sweep's jobs found together
