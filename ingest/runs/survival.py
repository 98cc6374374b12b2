"""Jobs survive their worker: a dead worker's job is taken back, its leftovers removed.

A worker holds a job as one attempt: claiming it sets status 'running', the worker's name
(`host:pid`), a stamp of its process and `attempts + 1`; every write it makes afterwards (its
heartbeat, scratch notes, the final status) is conditional on that (worker, attempt) still
holding the job, so a worker that was wrongly given up on (stopped for a minute, say) can
never overwrite the attempt that replaced it: its heartbeat answers 'lost' and it stops.

Dead or alive. Every poll, each worker looks at the running jobs:
- A worker on this machine is dead at once when its process is gone. The stamp is
  '<boot id>/<pid namespace>/<start time in clock ticks>' from /proc; a pid that exists but
  started at another time (the pid was reused) or is a zombie is gone too. The verdict is
  given only when this process shares the stamp's boot and pid namespace, since a pid means
  nothing across them (containers with the same host name); otherwise, and off Linux, it falls
  to the heartbeat.
- Any worker is dead when its heartbeat (every 2 s) is older than `stale_s` (60 s).

Taking back (Store.release_job, a compare-and-set on the attempt, so two workers never both
take back the same attempt): a job whose run was already imported (runs.job_id) succeeded
with that run; a job someone asked to cancel is cancelled; otherwise it is queued again while
attempts < max_attempts (default 2: one retry), else failed as 'worker-died' with one line.
Each outcome appends a line saying why to the job's log.

A bundle already written is not lost. The engine's result lands in the job's work
directory, which lies inside `<db>.bundles/`, and is moved to `<db>.bundles/job-N` with one
rename, so job-N exists whole or not at all: a job-N directory means a finished engine run.
A later attempt that finds it imports it instead of running the engine again; a job failed
as worker-died says where its bundle is kept; an attempt that finds job-N made while it ran
(by the attempt that replaced it) leaves it alone. A run is imported at most once per job:
Store.insert_run returns the job's existing run instead of writing a second.

Leftovers. Work directories are `<db>.bundles/.work/job-N.A` (job N, attempt A), so any
worker can tell whose they are: on each poll it lists them first, then reads which attempts
still run, and removes the others (listing first means a directory made after the read was
made by an attempt the read saw running). Directories an attempt makes on hosts (the
engines' `stepwatch-ref-*` / `stepwatch-sglang-*` with their git worktrees, locally or over
SSH) are noted in the job's `scratch` as soon as they exist; taking the job back removes
them and prunes the worktrees from their repository.

The engine command of a killed worker runs on until its next line of output fails on the
closed pipe, and a silent one (a model loading) would share the machine, and its GPU, with
the job's next attempt. On this machine, taking the job back first kills the process groups
led by a command that works in the attempt's scratch directory (an argument or its working
directory lies in it: a unique mkdtemp name, so nothing else matches; hosts.run_process starts
every command as a group leader). On an SSH host the command is left to the closed pipe. Also
not covered: a directory made in the instant between its creation and its note.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .connect import make_host
from .errors import RunError
from .hosts import LocalHost
from .spec import Config

_WORK_NAME = re.compile(r"^job-(\d+)\.(\d+)$")


# -- where a job's files live --------------------------------------------------------------------

def bundles_dir(db_path: str) -> Path:
    db = Path(db_path).resolve()
    return db.parent / f"{db.stem}.bundles"


def kept_bundle_path(db_path: str, job_id: int) -> Path:
    return bundles_dir(db_path) / f"job-{job_id}"


def work_root(db_path: str) -> Path:
    return bundles_dir(db_path) / ".work"


def make_work_dir(db_path: str, job_id: int, attempt: int) -> Path:
    """The attempt's empty work directory (a leftover of the same name can only be stale)."""
    work = work_root(db_path) / f"job-{job_id}.{attempt}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def list_work_dirs(db_path: str) -> dict[tuple[int, int], Path]:
    """(job, attempt) -> directory, for every work directory there is now."""
    root = work_root(db_path)
    found = {}
    for entry in (root.iterdir() if root.is_dir() else ()):
        m = _WORK_NAME.match(entry.name)
        if m:
            found[int(m.group(1)), int(m.group(2))] = entry
    return found


def remove_work_dirs(listed: dict[tuple[int, int], Path], running: set[tuple[int, int]]) -> list[Path]:
    """Remove the listed work directories of attempts that are not running; return them."""
    gone = [path for key, path in sorted(listed.items()) if key not in running]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


# -- is a worker's process alive ---------------------------------------------------------------

def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of a process from /proc, None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], fields[19]


def process_stamp(pid: int | None = None) -> str | None:
    """'<boot id>/<pid namespace>/<start ticks>' of a process (this one by default), None
    where /proc does not say (not Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    stat = _proc_stat(pid or os.getpid())
    return f"{boot}/{namespace}/{stat[1]}" if stat else None


def worker_is_gone(worker: str | None, stamp: str | None) -> bool:
    """True only when sure: the worker ran on this machine, in this boot and pid namespace,
    and no live process has its pid and start time."""
    host, _, pid = (worker or "").rpartition(":")
    mine = process_stamp()
    if not stamp or not mine or host != socket.gethostname() or not pid.isdigit() or stamp.count("/") != 2:
        return False
    boot, namespace, start = stamp.split("/")
    if [boot, namespace] != mine.split("/")[:2]:
        return False
    stat = _proc_stat(int(pid))
    return stat is None or stat[0] in ("Z", "X") or stat[1] != start


# -- taking a dead worker's job back -----------------------------------------------------------

@dataclass(frozen=True)
class TakeBack:
    """What becomes of a dead worker's attempt: the job's new status and the line that says why."""

    job_id: int
    status: str  # queued | succeeded | cancelled | failed
    line: str  # for the job's log and the worker's output
    run_id: int | None = None
    error_kind: str | None = None
    error: str | None = None


def why_dead(row: dict, gone: bool) -> str | None:
    """Why a running job's worker counts as dead, or None while it may be alive."""
    if gone:
        return "its process is gone"
    if row["stale"]:
        age = row["heartbeat_age_s"]
        return f"no heartbeat for {age:.0f} s" if age is not None else "no heartbeat"
    return None


def decide(row: dict, why: str, max_attempts: int, kept: Path | None) -> TakeBack:
    """The take-back of one dead attempt (a pure function of the job's row)."""
    job_id, attempt, worker = row["job_id"], row["attempts"], row["worker"]
    died = f"its worker {worker} died ({why})"
    if row["imported_run_id"] is not None:
        run_id = row["imported_run_id"]
        return TakeBack(job_id, "succeeded", f"job {job_id}: succeeded: {died} after importing run {run_id}",
                        run_id=run_id)
    if row["cancel_requested"]:
        return TakeBack(job_id, "cancelled", f"job {job_id}: cancelled: {died} while a cancel was asked",
                        error_kind="cancelled", error=f"cancelled while running; {died}")
    if attempt < max_attempts:
        then = "its complete bundle will be imported" if kept else "it will run again"
        return TakeBack(job_id, "queued", f"job {job_id}: requeued after attempt {attempt} of {max_attempts}: "
                                          f"{died}; {then}")
    error = f"{died} on attempt {attempt} of {max_attempts}"
    if kept:
        error += f"; its bundle is kept at {kept} (`ingest import` it)"
    return TakeBack(job_id, "failed", f"job {job_id}: failed: worker-died: {error}", error_kind="worker-died",
                    error=error)


def take_back_dead_jobs(store, db_path: str, running: list[dict], max_attempts: int) -> list[tuple[TakeBack, list]]:
    """Take back every running job whose worker is dead; return each take-back with the
    scratch its attempt noted. A job another worker took back first is left to it."""
    taken = []
    for row in running:
        why = why_dead(row, worker_is_gone(row["worker"], row["worker_proc"]))
        if why is None:
            continue
        kept = kept_bundle_path(db_path, row["job_id"])
        back = decide(row, why, max_attempts, kept if kept.is_dir() else None)
        scratch = store.release_job(back.job_id, row["worker"], row["attempts"], back.status, back.line,
                                    run_id=back.run_id, error_kind=back.error_kind, error=back.error)
        if scratch is not None:
            taken.append((back, scratch))
    return taken


def _under(candidate: str, path: str) -> bool:
    return candidate == path or candidate.startswith(f"{path}/")


def _works_in(proc: Path, path: str) -> bool:
    """Whether a process has an argument or its working directory in `path`."""
    args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
    return any(_under(arg, path) for arg in args) or _under(os.readlink(proc / "cwd"), path)


def stop_local_commands(path: str, wait_s: float = 5.0) -> list[int]:
    """Kill the process groups of this user's commands on this machine that work in `path`
    (a dead attempt's scratch directory: an argument or the working directory lies in it) and
    lead their group, as hosts.run_process starts every command; wait until they are gone.
    Returns the groups killed."""
    groups = set()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        try:
            pid = int(entry.name) if entry.name.isdigit() else 0
            if pid and os.getpgid(pid) == pid and entry.stat().st_uid == os.getuid() and _works_in(entry, path):
                groups.add(pid)
        except OSError:
            continue
    groups.discard(os.getpgrp())
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while any((_proc_stat(g) or ("Z",))[0] not in ("Z", "X") for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(groups)


def remove_scratch(config: Config, job_id: int, scratch: list[dict], say: Callable[[str], None]) -> None:
    """Stop a dead attempt's commands on this machine, remove the directories it made on its
    hosts and prune its git worktrees; a host that cannot be reached is named in one line."""
    for entry in scratch:
        host_name, path, repo = entry.get("host"), str(entry.get("path")), entry.get("repo")
        if not Path(path).name.startswith("stepwatch-"):  # only what an engine's mkdtemp made
            say(f"job {job_id}: not removing {path} on host {host_name}: not a stepwatch scratch directory")
            continue
        try:
            host = make_host(config.host(host_name))
            if isinstance(host, LocalHost):
                for group in stop_local_commands(path):
                    say(f"job {job_id}: stopped process group {group}, still running in {path}")
            host.rmtree(path)
            if repo:
                host.run(["git", "-C", repo, "worktree", "prune"], check=False, timeout_s=120)
            say(f"job {job_id}: removed {path} on host {host_name}")
        except RunError as e:
            say(f"job {job_id}: cannot remove {path} on host {host_name}: {e}")
