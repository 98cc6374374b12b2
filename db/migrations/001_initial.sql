-- stepwatch schema, version 1: repositories, commits, runs and their per-step, per-kernel figures.
-- No FOREIGN KEY clauses: DuckDB refuses updates of rows that foreign keys point at, and the
-- commit order (seq) is updated as history is learnt. db/store.py keeps the references whole.

CREATE SEQUENCE repo_id_seq START 1;
CREATE SEQUENCE commit_id_seq START 1;
CREATE SEQUENCE run_id_seq START 1;

CREATE TABLE repos (
    repo_id   INTEGER PRIMARY KEY DEFAULT nextval('repo_id_seq'),
    name      VARCHAR NOT NULL UNIQUE,
    url       VARCHAR
);

CREATE TABLE commits (
    commit_id    INTEGER PRIMARY KEY DEFAULT nextval('commit_id_seq'),
    repo_id      INTEGER NOT NULL,
    sha          VARCHAR NOT NULL,          -- as given (a full sha once resolved)
    committed_at TIMESTAMP,
    author       VARCHAR,
    subject      VARCHAR,
    seq          INTEGER,                   -- first-parent order along the repo's history
    UNIQUE (repo_id, sha)
);

CREATE TABLE runs (
    run_id          INTEGER PRIMARY KEY DEFAULT nextval('run_id_seq'),
    content_hash    VARCHAR NOT NULL UNIQUE,  -- blake2b of the trace bytes (and manifest)
    repo_id         INTEGER,
    commit_id       INTEGER,
    variant         VARCHAR,
    engine          VARCHAR,
    workload        JSON,                     -- the run's parameters (from a bundle manifest)
    device_name     VARCHAR,
    peak_gbps       DOUBLE,
    ranks           INTEGER NOT NULL,
    steps           INTEGER NOT NULL,
    step_method     VARCHAR NOT NULL,         -- profiler-step | span | graph-launch | given
    step_ms_median  DOUBLE,
    tok_per_s       DOUBLE,
    layers          INTEGER,
    copy_share      DOUBLE,                   -- (cast + memcpy) kernel time / all kernel time
    gpu_busy_share  DOUBLE,
    kernel_us_total DOUBLE NOT NULL,
    kernels_from_cpu_ops BOOLEAN NOT NULL,    -- a CPU-only trace: CPU ops stand for kernels
    source_path     VARCHAR NOT NULL,
    manifest        JSON,
    imported_at     TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE steps (
    run_id      INTEGER NOT NULL,
    rank        INTEGER NOT NULL,
    step        INTEGER NOT NULL,
    wall_us     DOUBLE NOT NULL,
    gpu_busy_us DOUBLE,
    kernel_us   DOUBLE NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);

CREATE TABLE step_categories (
    run_id   INTEGER NOT NULL,
    rank     INTEGER NOT NULL,
    step     INTEGER NOT NULL,
    category VARCHAR NOT NULL,
    dur_us   DOUBLE NOT NULL,
    PRIMARY KEY (run_id, rank, step, category)
);

CREATE TABLE kernel_stats (
    run_id         INTEGER NOT NULL,
    rank           INTEGER NOT NULL,
    name           VARCHAR NOT NULL,
    category       VARCHAR NOT NULL,
    launcher       VARCHAR NOT NULL,   -- '' when unknown
    source         VARCHAR NOT NULL,   -- '' when the trace has no Python frames
    calls          BIGINT NOT NULL,
    calls_per_step DOUBLE NOT NULL,
    total_us       DOUBLE NOT NULL,
    mean_us        DOUBLE NOT NULL,
    median_us      DOUBLE NOT NULL,
    p90_us         DOUBLE NOT NULL,
    min_us         DOUBLE NOT NULL,
    max_us         DOUBLE NOT NULL,
    ms_per_step    DOUBLE NOT NULL,
    share          DOUBLE,
    bytes_per_call DOUBLE,
    gbps           DOUBLE,
    peak_fraction  DOUBLE
);
CREATE INDEX kernel_stats_run ON kernel_stats (run_id);
CREATE INDEX runs_commit ON runs (commit_id);
