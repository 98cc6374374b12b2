"""Helpers shared by the tests: running the CLI as a user would, and hashing files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TRACES = DATA / "traces"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m <args>` from the repository root, capturing output."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
