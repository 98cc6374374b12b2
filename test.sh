#!/usr/bin/env bash
# Install what the tests need (first run only) and run them: ./test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
