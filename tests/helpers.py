"""Helpers shared by the tests: running the CLI as a user would, hashing files, waiting for a
state, comparing a run's kernels with torch's key_averages(), the config of a host reached
through the test sshd, and plain-Python arithmetic on a trace's JSON (its steps' kernels, their
busy time) that tests check stepwatch's figures against."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TRACES = DATA / "traces"


def git(repo: Path, *args: str) -> str:
    """`git -C repo args...` with a fixed author, its output stripped (tests' own repositories)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def kernels_repo(path: Path, message: str) -> Path:
    """A git repository at `path` holding this checkout's kernels/ in one commit (`message`), on
    branch main: what the reference engine measures at the commits a test then adds."""
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__", "results"))
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)
    return path / "kernels" / "workload.py"


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


def write_ssh_config(tmp_path: Path, sshd: dict[str, str], port: int | None = None) -> str:
    """A config file naming the host "loop": this machine through the test sshd (the `sshd`
    fixture's settings), its workdir tmp_path/remote (made here); `port` replaces the sshd's."""
    workdir = tmp_path / "remote"
    workdir.mkdir()
    path = tmp_path / "stepwatch.toml"
    path.write_text(
        f'[hosts.loop]\nssh = "{sshd["STEPWATCH_TEST_SSH_USER"]}@127.0.0.1"\n'
        f'port = {port or sshd["STEPWATCH_TEST_SSH_PORT"]}\nidentity_file = "{sshd["STEPWATCH_TEST_SSH_KEY"]}"\n'
        f'python = "{sys.executable}"\nworkdir = "{workdir}"\n'
        f'ssh_options = ["UserKnownHostsFile={sshd["STEPWATCH_TEST_SSH_KNOWN_HOSTS"]}"]\n')
    return str(path)


def torch_kernel_rows(key_averages: Path, trace_path: Path) -> dict[str, dict]:
    """key_averages rows that are GPU activities of the trace (their names occur as kernels)."""
    body = json.loads(gzip.decompress(trace_path.read_bytes()))
    gpu = {e["name"] for e in body["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    return {r["name"]: r for r in json.loads(key_averages.read_text()) if r["name"] in gpu}


def assert_matches_torch(kernel_stats, expected: dict[str, dict]) -> None:
    """A run's kernel calls and time, per kernel name, are torch's key_averages() rows' (0.5 %)."""
    if hasattr(kernel_stats, "to_dicts"):  # an import's table (ingest/traces/table.py)
        kernel_stats = kernel_stats.to_pandas()
    got = kernel_stats.groupby("name").agg(calls=("calls", "sum"), total_us=("total_us", "sum"))
    assert set(got.index) == set(expected)
    for name, row in got.iterrows():
        assert row.calls == expected[name]["count"], name
        assert row.total_us == pytest.approx(expected[name]["self_device_time_total_us"], rel=5e-3), name


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def trace_events(path: Path) -> list[dict]:
    """A trace's events, read with the json module (.json or .json.gz)."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["traceEvents"]


def union_us(intervals) -> float:
    """Length of the union of (start, end) intervals."""
    busy, reach = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def span_step_kernels(path: Path, prefix: str = "step[DECODE") -> list[list[dict]]:
    """Per step span (Kineto's GPU copy of each `step[DECODE ...]` span, in time order), the GPU
    activities that start inside it."""
    events = trace_events(path)
    kernels = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    spans = sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith(prefix)),
                   key=lambda e: e["ts"])
    return [[k for k in kernels if s["ts"] <= k["ts"] < s["ts"] + s["dur"]] for s in spans]


def bundle_step_kernels(bundle: Path) -> list[list[dict]]:
    """A bundle's profiled steps as stepwatch reads them: its GPU activities in time order, split
    into `profiled_steps` equal runs (the first ones one longer when they do not divide)."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    kernels = sorted((e for e in trace_events(bundle / manifest["traces"][0]) if e.get("cat") in GPU_CATEGORIES),
                     key=lambda e: e["ts"])
    size, extra = divmod(len(kernels), manifest["profiled_steps"])
    steps, at = [], 0
    for i in range(manifest["profiled_steps"]):
        steps.append(kernels[at: at + size + (i < extra)])
        at += len(steps[-1])
    return steps


def step_extent_us(kernels: list[dict]) -> float:
    return max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)


def step_busy_us(kernels: list[dict]) -> float:
    return union_us((k["ts"], k["ts"] + k["dur"]) for k in kernels)
