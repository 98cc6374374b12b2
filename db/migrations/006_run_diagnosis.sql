-- The run's diagnosis (ingest/regress/diagnose.py), written when the run is imported: a list of
-- {kind, text, numbers, kernel} for the kernels that take most of the step.
ALTER TABLE runs ADD COLUMN diagnosis JSON;
