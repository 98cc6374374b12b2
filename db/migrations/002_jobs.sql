-- The job queue: benchmark runs waiting, running and done. A worker claims one job at a time,
-- reports progress and a heartbeat, and ends it with a status; a job whose worker stopped
-- beating is failed by the next worker that looks ("worker died").

CREATE SEQUENCE job_id_seq START 1;

CREATE TABLE jobs (
    job_id           INTEGER PRIMARY KEY DEFAULT nextval('job_id_seq'),
    spec             JSON NOT NULL,          -- a run spec (ingest/runs/spec.py), checked when queued
    label            VARCHAR NOT NULL,       -- one line for people
    status           VARCHAR NOT NULL DEFAULT 'queued',  -- queued|running|succeeded|failed|cancelled
    error_kind       VARCHAR,                -- e.g. patch-failed, timeout, worker-died, engine-error
    error            VARCHAR,                -- one line
    queued_at        TIMESTAMP NOT NULL DEFAULT current_timestamp,
    started_at       TIMESTAMP,
    finished_at      TIMESTAMP,
    heartbeat_at     TIMESTAMP,
    worker           VARCHAR,                -- host:pid of the worker that took it
    steps_done       INTEGER NOT NULL DEFAULT 0,
    steps_planned    INTEGER,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    run_id           INTEGER,                -- the run it produced
    log              VARCHAR NOT NULL DEFAULT '',   -- the last 64 KB of its output
    batch            VARCHAR                 -- jobs queued together (a backfill, a form submit)
);
CREATE INDEX jobs_status ON jobs (status);
