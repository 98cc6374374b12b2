-- What groups runs into one trend series, and the untimed step-time spread a bundle measured.
ALTER TABLE runs ADD COLUMN workload_key VARCHAR;   -- the workload without variant or run-length fields
ALTER TABLE runs ADD COLUMN batch_size INTEGER;
ALTER TABLE runs ADD COLUMN timing_ms_median DOUBLE; -- step time measured without the profiler
ALTER TABLE runs ADD COLUMN timing_ms_p10 DOUBLE;
ALTER TABLE runs ADD COLUMN timing_ms_p90 DOUBLE;
ALTER TABLE runs ADD COLUMN job_id INTEGER;          -- the job that produced it, if any
