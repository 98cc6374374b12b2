"""The sglang 0.5.23 wheel, whose Python sources the patch and flag tests read: downloaded once
with pip into ~/.cache/stepwatch/ (or $STEPWATCH_CACHE), or taken from $STEPWATCH_SGLANG_WHEEL.
tests/conftest.py's session fixture `sglang_wheel` calls fetch_sglang_wheel(): without a network
the tests that need it skip; any other download failure fails them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

SGLANG_VERSION = "0.5.23"

# pip's messages when no index can be reached (DNS, refused or reset connections, proxies).
_OFFLINE = re.compile(
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known"
    r"|Failed to establish a new connection|Connection refused|Connection reset|ConnectTimeout"
    r"|ReadTimeout|timed out|NewConnectionError|ProxyError|No route to host"
    r"|nodename nor servname|getaddrinfo failed",
    re.IGNORECASE,
)


def cache_dir() -> Path:
    return Path(os.environ.get("STEPWATCH_CACHE", Path.home() / ".cache" / "stepwatch"))


def find_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob(f"sglang-{SGLANG_VERSION}-*.whl")) if folder.is_dir() else []
    return wheels[0] if wheels else None


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                                capture_output=True, text=True).stdout
        match = re.search(r"index-url='([^']+)'", listed)
        url = match.group(1) if match else "https://pypi.org/simple"
    return url


def index_reachable() -> bool:
    """Whether a TCP connection to pip's index opens (pip may report an unreachable index
    only as 'No matching distribution found')."""
    url = urllib.parse.urlsplit(index_url())
    if url.scheme == "file" or not url.hostname:
        return True
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=10).close()
        return True
    except OSError:
        return False


def fetch_sglang_wheel() -> Path:
    """The wheel's path: $STEPWATCH_SGLANG_WHEEL, the cached one, or one downloaded now; skips the
    calling test when the package index cannot be reached, fails it on any other problem."""
    explicit = os.environ.get("STEPWATCH_SGLANG_WHEEL")
    if explicit:
        return Path(explicit)
    cache = cache_dir()
    wheel = find_wheel(cache)
    if wheel is not None:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    # The one wheel published for 0.5.23 (CPython 3.11, manylinux x86_64), whatever runs the test.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
           "--implementation", "cp", "--abi", "cp311", "-d", str(cache), f"sglang=={SGLANG_VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download sglang=={SGLANG_VERSION} timed out: network too slow or unreachable")
    output = proc.stdout + proc.stderr
    wheel = find_wheel(cache)
    if proc.returncode == 0 and wheel is not None:
        return wheel
    offline = _OFFLINE.search(output)
    if offline or not index_reachable():
        reason = offline.group(0) if offline else f"cannot connect to {index_url()}"
        pytest.skip(f"cannot download sglang=={SGLANG_VERSION}: network unreachable ({reason})")
    pytest.fail(f"pip download sglang=={SGLANG_VERSION} failed (exit {proc.returncode}):\n"
                f"{output[-3000:]}")
