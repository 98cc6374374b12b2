-- Jobs survive their worker (ingest/runs/survival.py): how many times a worker took a job,
-- which process took it (so that a worker on the same machine can tell at once that it is
-- gone), and the scratch directories its current attempt made on hosts (removed when a dead
-- worker's job is taken back). DuckDB cannot add a NOT NULL column to a table with an index,
-- so `attempts` gets a default and its values here.
ALTER TABLE jobs ADD COLUMN attempts INTEGER DEFAULT 0;  -- times a worker took it; a stop by SIGTERM gives its attempt back
ALTER TABLE jobs ADD COLUMN worker_proc VARCHAR;         -- '<boot id>/<pid namespace>/<start ticks>' of the worker process (Linux), else NULL
ALTER TABLE jobs ADD COLUMN scratch VARCHAR;             -- one JSON object a line, {"host", "path", "repo"}: what the current attempt made
UPDATE jobs SET attempts = CASE WHEN status = 'queued' THEN 0 ELSE 1 END;
