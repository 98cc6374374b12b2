-- What a reader of a run's figures must know (how steps were found, kernels between steps,
-- names read with repaired bytes, ...), and one row per rank of a run: the medians over its
-- profiled steps of its step time, busy and communication time, and of how long it waited in
-- collectives for the last rank (medians: a rank's first profiled step often holds one long
-- wait for a rank whose profiler started later).
ALTER TABLE runs ADD COLUMN notes JSON;            -- a list of sentences, NULL when none

CREATE TABLE rank_stats (
    run_id           INTEGER NOT NULL,
    rank             INTEGER NOT NULL,
    device_name      VARCHAR,
    steps            INTEGER NOT NULL,
    step_ms_median   DOUBLE,
    busy_ms_median   DOUBLE,           -- union of kernel intervals (NULL in a CPU-only trace)
    comm_ms_median   DOUBLE NOT NULL,  -- communication kernels' time
    wait_ms_median   DOUBLE,           -- of that, waiting for the last rank to arrive (NULL: not known)
    last_arrivals    INTEGER,      -- collectives this rank reached last
    collectives      INTEGER NOT NULL,
    between_steps_ms DOUBLE NOT NULL,  -- kernels launched outside every step
    PRIMARY KEY (run_id, rank)
);
