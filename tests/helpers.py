"""Helpers shared by the tests: running the CLI as a user would, and hashing files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
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


def wait_for(predicate, what: str, timeout_s: float = 300.0):
    """predicate()'s first truthy value, polled every 0.1 s; an AssertionError naming `what` after
    timeout_s (generous: a loaded 2-core machine is slow, and a wait ends as soon as it can)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
