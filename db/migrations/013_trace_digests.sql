-- The trace files the dashboard may serve for a run (app/traces.py), recorded at import: the
-- directory they lie in, resolved (trace_root), and each file's name in it, size and sha256
-- (trace_digests: JSON [{"name", "bytes", "sha256"}], in rank order). The Run page offers a file
-- only while it is still there, inside trace_root, reached through no symbolic link, with that
-- content. NULL for runs imported before, and for merged runs whose traces could not be verified
-- on this machine (db/exchange.py): their traces are not offered.
ALTER TABLE runs ADD COLUMN trace_root VARCHAR;
ALTER TABLE runs ADD COLUMN trace_digests JSON;
