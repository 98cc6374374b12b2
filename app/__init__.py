"""stepwatch app: the Streamlit + Altair dashboard (main.py builds the navigation; screens/ holds
one short file per page; data.py reads through db.views; charts.py and tables.py are pure builders).

May import: db, app, and only I/O-free pieces elsewhere: ingest.regress (verdicts, diagnosis
sentences), ingest.runs.spec and ingest.runs.errors (parsing a run spec), kernels.names (preset
names). It runs no process, opens no socket and touches no git repository: the form queues jobs
and the worker (ingest.runs.worker) does the rest. Only app/ imports streamlit.
"""
