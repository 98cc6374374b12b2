"""Measurement and study code of ingest/: benchmarks of the trace reader (`reader`, `scale`,
`startup`) and the change detector's study (`detect_study`). Their figures are kept in the
BENCHMARKS.md files; they are run by hand (`python -m ingest.studies.<name>`), never by the runtime,
and nothing outside studies imports them. May import anything in ingest, db and kernels.
"""
