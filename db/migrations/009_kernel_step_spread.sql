-- A kernel's spread from step to step: the standard deviation over the profiled steps of its ms
-- in each step (steps where it did not run count 0), so that Compare can tell a kernel's change
-- from its noise (ingest/regress/uncertainty.py compare_means). NULL for runs imported before.
ALTER TABLE kernel_stats ADD COLUMN ms_per_step_sd DOUBLE;
