-- Re-runs that confirm (ingest/runs/confirm.py): a suspected change of a series whose runs came
-- from a spec gets its last good and first bad commit re-run interleaved (A B A B ...) on the
-- spec's host, as jobs in batch `batch`; once they are in, change tracking judges the change from
-- all the runs of the two commits pooled (ingest.regress.noise.judge) and writes the outcome
-- here. One row a window (series, last good, first bad commit), ever: a window is re-run once.

CREATE SEQUENCE confirmation_id_seq START 1;

CREATE TABLE confirmations (
    confirmation_id     INTEGER PRIMARY KEY DEFAULT nextval('confirmation_id_seq'),
    repo_id             INTEGER NOT NULL,
    engine              VARCHAR,
    workload_key        VARCHAR,
    device_name         VARCHAR,
    variant             VARCHAR,
    last_good_commit_id INTEGER NOT NULL,
    first_bad_commit_id INTEGER NOT NULL,
    host                VARCHAR NOT NULL,      -- where the re-runs run: the spec's host
    batch               VARCHAR NOT NULL,      -- the re-run jobs' batch ("confirm <hash>")
    reruns              INTEGER NOT NULL,      -- jobs queued: 2 x pairs, A B A B ...
    state               VARCHAR NOT NULL DEFAULT 'queued',  -- queued | confirmed | dismissed | failed
    verdict             VARCHAR,               -- the noise model's verdict on the pooled runs
    summary             VARCHAR,               -- its sentence (noise.Verdict.describe)
    queued_at           TIMESTAMP NOT NULL DEFAULT current_timestamp,
    judged_at           TIMESTAMP
);
CREATE INDEX confirmations_series ON confirmations (repo_id, engine, workload_key, device_name, variant);
