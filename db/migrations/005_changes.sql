-- Changes found along commit order (ingest/regress): one row per confirmed change of one metric
-- of one series (repo, engine, workload, device, variant), with what explains it and, while
-- the commits between last good and first bad are not all measured, the bisect's state.

CREATE SEQUENCE change_id_seq START 1;

CREATE TABLE changes (
    change_id           INTEGER PRIMARY KEY DEFAULT nextval('change_id_seq'),
    repo_id             INTEGER NOT NULL,
    engine              VARCHAR,
    workload_key        VARCHAR,
    device_name         VARCHAR,
    variant             VARCHAR,
    metric              VARCHAR NOT NULL,      -- tok_per_s | step_ms | copy_share | category:<c> | kernel:<name>
    direction           VARCHAR NOT NULL,      -- regression | improvement
    last_good_commit_id INTEGER NOT NULL,
    first_bad_commit_id INTEGER NOT NULL,
    last_good_run_id    INTEGER NOT NULL,
    first_bad_run_id    INTEGER NOT NULL,
    before_value        DOUBLE NOT NULL,
    after_value         DOUBLE NOT NULL,
    rel_change          DOUBLE NOT NULL,       -- (after - before) / before
    p_value             DOUBLE,
    commits_between     INTEGER NOT NULL,      -- unmeasured first-parent commits between the two
    explanation         JSON,                  -- kernels and categories that explain it
    diagnosis           JSON,                  -- sentences with their numbers
    bisect_runs         INTEGER NOT NULL DEFAULT 0,
    detected_at         TIMESTAMP NOT NULL DEFAULT current_timestamp
);
CREATE INDEX changes_series ON changes (repo_id, engine, workload_key, device_name, variant);
