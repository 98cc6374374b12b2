#!/usr/bin/env bash
# Install what stepwatch needs (first run only), open (or create) the embedded database, load the
# sample runs when it is empty, start a local worker for the jobs the dashboard queues, and serve
# the dashboard on http://127.0.0.1:8501 (PORT=... to change it). Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
export STEPWATCH_DB=${STEPWATCH_DB:-$PWD/stepwatch.duckdb}
port=${PORT:-8501}
.venv/bin/python -m ingest samples --db "$STEPWATCH_DB"
.venv/bin/python -m ingest worker --db "$STEPWATCH_DB" > "${STEPWATCH_DB%.duckdb}.worker.log" 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT INT TERM
echo "stepwatch: dashboard on http://127.0.0.1:$port (worker log: ${STEPWATCH_DB%.duckdb}.worker.log)" >&2
.venv/bin/python -m streamlit run app/main.py --server.address 127.0.0.1 --server.port "$port" \
    --server.headless true --browser.gatherUsageStats false
