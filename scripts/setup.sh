#!/usr/bin/env bash
# Create .venv and install requirements.txt into it; a second call with unchanged requirements
# does nothing. Used by run.sh, test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.requirements.sha
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "stepwatch: installing requirements.txt into .venv (first run, or the requirements changed)" >&2
"$PY" -m venv .venv
# pip's own lines about each package as progress (its warnings and errors go to stderr whole)
set +e
.venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt \
  | grep --line-buffered -E '^(Collecting|Installing|Successfully)' >&2
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "stepwatch: error: pip could not install requirements.txt (exit $status; its messages are above)" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "stepwatch: requirements installed" >&2
