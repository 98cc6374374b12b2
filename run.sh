#!/usr/bin/env bash
# Install what stepwatch needs (first run only), then run the reference decode workload on this
# machine's CPU, import its trace into the embedded database and print the step breakdown.
# (The Streamlit dashboard that will serve the same database is the [dashboard] issue.)
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
export STEPWATCH_DB=${STEPWATCH_DB:-stepwatch.duckdb}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bundle=$(.venv/bin/python -m kernels.bench --preset tiny --kv full-pool-cast --device cpu --steps 3 --out "$out/bundle" | tail -n 1)
run_id=$(.venv/bin/python -m ingest import "$bundle" | tail -n 1)
.venv/bin/python -m ingest report "$run_id"
