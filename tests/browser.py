"""The browser tests' pieces: Debian's headless chromium (driven by Playwright) and the dashboard
served as ./run.sh serves it. Where chromium is not installed the tests that need it skip, except
in CI (CI=true), where a missing browser fails: .ci/run installs it with scripts/install_browser.sh."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def need_browser():
    missing = None
    if not CHROMIUM.exists():
        missing = f"Debian's chromium is not installed at {CHROMIUM} (scripts/install_browser.sh installs it)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is not installed (requirements.txt)"
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI needs the browser test: {missing}")
    if missing:
        pytest.skip(missing)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_streamlit(env: dict, port: int) -> subprocess.Popen:
    """The dashboard as ./run.sh serves it, on 127.0.0.1:port, headless, no usage stats."""
    return subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"streamlit exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


@contextlib.contextmanager
def serve_dashboard(env: dict):
    """`streamlit run app/main.py` with `env` on a free port, healthy: yields its base URL; stopped after
    (terminate, then kill after 20 s)."""
    port = free_port()
    app = start_streamlit(env, port)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 300, app)
        yield f"http://127.0.0.1:{port}"
    finally:
        app.terminate()
        try:
            app.wait(timeout=20)
        except subprocess.TimeoutExpired:
            app.kill()
