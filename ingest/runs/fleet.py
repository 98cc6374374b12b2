"""The fleet worker: queued jobs run as Ray tasks across a cluster; this process alone writes.

`ingest worker --ray ADDRESS` runs `run_fleet_worker`. It keeps up to `max_in_flight` jobs
running at once (default: the cluster's GPUs, or its CPUs when it has none):

1. Claim a queued job as the local worker does (`poll_queue`: dead workers' jobs taken back
   first). A range job (git only) and an import job (a path on this machine) run here, as
   before; so does a job whose earlier attempt left its bundle kept beside the database.
2. Any other job is submitted as one Ray task (`_run_remote`) with the resources its spec needs
   (`task_resources`: a GPU per tensor-parallel rank for GPU runs, none for CPU runs unless
   `gpus_per_run` says so; one CPU; `max_calls=1`, so every run gets a fresh process, as a
   benchmark should). The task runs the same engine code as a local run (`worker.run_spec`: the
   host is "local", i.e. the Ray node; the worktree at the commit, patches, benchmark,
   profiler), packs the bundle directory as tar bytes and returns them with the commit it
   measured: no shared filesystem is needed.
3. While tasks run, their log lines and step progress flow back through one actor (`_Relay`):
   each task hands its new lines over and learns whether to stop once per RELAY_S; this
   process drains the actor and writes every in-flight job's heartbeat in one database visit
   per HEARTBEAT_S.
4. A finished task's bytes are unpacked into the job's work directory, kept as
   `<db>.bundles/job-N` (one rename) and imported here (`worker.finish_run`), so DuckDB keeps
   its single writer and a job has at most one run (Store.insert_run). Change detection, which
   re-reads a run's whole series, runs every FOLLOW_S for the series that new runs joined, each
   series once (`track.follow_runs`), then bisects are planned; never more than FOLLOW_SHARE of
   the worker's time: with many runs a minute, one detection per run would make the writer's work
   grow with the square of the series' length, and detection would starve the imports.

Cancel: the job's heartbeat reads "cancel"; the task is told through the actor, its engine stops
its command (the process group) and the job ends cancelled with no run; a task that has not
ended CANCEL_GRACE_S later is killed (`ray.cancel(force=True)`). A task whose process or node
dies is retried once by Ray (`RAY_RETRIES`); a second loss fails the job with kind
"worker-lost" and Ray's reason. Nothing is imported from a task that did not return its
bundle, so a lost task never leaves a half run. SIGTERM/SIGINT: every task is told to stop, the
jobs go back to the queue without counting the attempt (as the local worker does), and the
process exits. Scratch a task makes on its node (its work directory, the engine's
`stepwatch-ref-*` / `stepwatch-sglang-*` directory with a git worktree) is removed by the task
when it ends; a task whose process is killed never gets there, so each one is also noted to the
relay as it is made (node, process, path, repository), and when a task's process is known dead
-- Ray starts it again, or its last attempt is lost or force-killed -- this process runs a
zero-CPU task pinned to that node (`_remove_scratch_here`) that removes them and prunes the
repository's worktrees. A node that dies takes its scratch with it.

What a node needs: Python with requirements.txt installed, the repositories of the config's
[repos] at the same paths (a worktree is made from them), and patch files at the config's
paths. stepwatch's own code travels with every task (Ray's `py_modules`: ingest/, db/, kernels/).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from db.store import StoreError, open_db

from ..limits import MAX_ATTEMPTS
from ..traces.categories import Rule
from .repos import ROOT
from .spec import Config, RangeSpec, RunSpec, SweepSpec, parse_job_spec
from .survival import kept_bundle_path, make_work_dir, stop_local_commands
from .worker import (
    HEARTBEAT_S,
    STALE_S,
    Outcome,
    Reporter,
    execute_job,
    finish_run,
    follow_changes,
    keep_bundle,
    outcome_of,
    poll_queue,
    record_outcome,
    run_spec,
    stop_on_signals,
    worker_name,
)

RELAY_S = 1.0  # how often a task hands over its lines and asks whether to stop (and the worker reads them)
FOLLOW_S = 5.0  # how often (at most) the worker detects the changes of the series that new runs joined
FOLLOW_SHARE = 0.25  # ... and never more than this share of its time: after a detection round of d
# seconds the next waits at least d * (1 / FOLLOW_SHARE - 1), so imports keep the rest as the fleet grows
CANCEL_GRACE_S = 30.0  # a told task that has not ended by then is killed
RAY_RETRIES = 1  # Ray runs a task again once when its process or node dies
MAX_BUNDLE_BYTES = 1 << 30  # a result bundle larger than this is refused (traces are tens of MB)


# ----------------------------------------------------------------------------- the task's side


@ray.remote
class _Relay:
    """Lines, progress and stop requests between the tasks and the worker (one actor)."""

    def __init__(self) -> None:
        self.lines: dict[int, list[str]] = {}
        self.progress: dict[int, tuple[int, int | None]] = {}
        self.started: dict[int, list[int]] = {}
        self.scratch: dict[int, list[dict]] = {}
        self.stop: dict[int, str] = {}

    def hand_over(self, job_id: int, lines: list[str], progress: tuple[int, int | None] | None) -> str | None:
        """A task's new lines and progress; returns why it must stop ("cancel", "lost", "stop") or None."""
        if lines:
            self.lines.setdefault(job_id, []).extend(lines)
        if progress is not None:
            self.progress[job_id] = progress
        return self.stop.get(job_id)

    def started_on(self, job_id: int, pid: int) -> None:
        self.started.setdefault(job_id, []).append(pid)

    def scratch_made(self, job_id: int, entry: dict) -> None:
        """A directory a task made on its node: {"node", "pid", "path", "repo"} (see the module's doc)."""
        self.scratch.setdefault(job_id, []).append(entry)

    def tell(self, job_id: int, why: str) -> None:
        self.stop[job_id] = why

    def drain(self) -> dict:
        out = {"lines": self.lines, "progress": self.progress, "started": self.started, "scratch": self.scratch}
        self.lines, self.progress, self.started, self.scratch = {}, {}, {}, {}
        return out


class _TaskIO:
    """What run_spec's reporter is inside a task: lines and progress buffered and handed to the
    relay by a thread every RELAY_S, which also learns whether to stop."""

    def __init__(self, relay, job_id: int):
        self.relay, self.job_id = relay, job_id
        self.cancel, self.lost, self.told = threading.Event(), threading.Event(), threading.Event()
        self._lines: list[str] = []
        self._progress: tuple[int, int | None] | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def line(self, text: str) -> None:
        with self._lock:
            self._lines.append(text)

    def progress(self, done: int, planned: int | None) -> None:
        with self._lock:
            self._progress = (done, planned)

    def should_stop(self) -> bool:
        return self.told.is_set()

    def note_scratch(self, host_name: str, path: str, repo: str | None = None) -> None:
        self.line(f"job {self.job_id}: scratch {path} on the Ray node (removed by the engine when it ends)")
        _note_scratch(self.relay, self.job_id, path, repo)

    def flush(self) -> None:
        with self._lock:
            lines, progress, self._lines, self._progress = self._lines, self._progress, [], None
        why = ray.get(self.relay.hand_over.remote(self.job_id, lines, progress))
        if why and not self.told.is_set():
            if why == "cancel":
                self.cancel.set()
            elif why == "lost":
                self.lost.set()
            self.told.set()  # "stop": neither flag, so the run ends as "queued" (outcome_of)

    def _loop(self) -> None:
        while not self._done.wait(RELAY_S):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the worker went away: the task ends with its run
                pass

    def __enter__(self) -> "_TaskIO":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.flush()


def pack_bundle(bundle: Path) -> bytes:
    """A bundle directory (or one trace file) as uncompressed tar bytes (traces are gzipped
    already), refused past MAX_BUNDLE_BYTES."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(bundle, arcname=bundle.name)
    if buf.tell() > MAX_BUNDLE_BYTES:
        raise ValueError(f"the result bundle is {buf.tell() / 2**20:,.0f} MB, over the limit of "
                         f"{MAX_BUNDLE_BYTES / 2**20:,.0f} MB")
    return buf.getvalue()


def unpack_bundle(data: bytes, into: Path) -> Path:
    """The inverse of pack_bundle, into `into` (regular files and directories only, nothing
    outside it: tarfile's "data" filter)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        names = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(names) != 1:
            raise ValueError(f"a result holds {len(names)} top-level entries, not one bundle")
        tar.extractall(into, filter="data")
    return into / names.pop()


def _note_scratch(relay, job_id: int, path: str, repo: str | None) -> None:
    """Tell the relay about a directory this task made on its node, for removal should the task's
    process be killed before it removes the directory itself."""
    relay.scratch_made.remote(job_id, {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                                       "path": str(path), "repo": repo})


def _remove_scratch_here(entries: list[dict]) -> list[str]:
    """On the node that made them: stop the dead task's commands that still run there (a benchmark
    runs in a process group of its own, so the task's kill -9 did not reach it: it ran on and
    wrote into the directories removed here), remove its scratch directories (only names that
    stepwatch's mkdtemp gives) and prune the git worktrees they held from their repositories;
    returns the directories that were there."""
    removed = []
    for entry in entries:
        path = Path(entry["path"])
        if not path.name.startswith("stepwatch-"):
            continue
        stop_local_commands(str(path))  # as the local worker does for a dead attempt (survival.py)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        if entry.get("repo"):
            subprocess.run(["git", "-C", entry["repo"], "worktree", "prune"], capture_output=True, timeout=120,
                           check=False)
    return removed


_REMOVE_SCRATCH = ray.remote(num_cpus=0, max_retries=0)(_remove_scratch_here)
REMOVE_SCRATCH_TIMEOUT_S = 60.0


def _run_remote(relay, job_id: int, spec_json: str, config: Config) -> dict:
    """One job's engine run, in a Ray task: {"status": "ok", "bundle": tar bytes, "repo", "commit"}
    or {"status", "kind", "error"} for a run that failed, was cancelled or must be requeued."""
    relay.started_on.remote(job_id, os.getpid())
    spec = parse_job_spec(json.loads(spec_json), config)
    work = Path(tempfile.mkdtemp(prefix=f"stepwatch-job{job_id}-"))
    _note_scratch(relay, job_id, str(work), None)
    try:
        with _TaskIO(relay, job_id) as task_io:
            task_io.line(f"job {job_id}: running on Ray node {ray.get_runtime_context().get_node_id()[:12]} "
                         f"(pid {os.getpid()})")
            try:
                bundle, repo, commit = run_spec(spec, config, task_io, work)
                data = pack_bundle(bundle)
            except Exception as e:  # noqa: BLE001 - the outcome travels back as data
                out = outcome_of(e, task_io)
                return {"status": out.status, "kind": out.kind, "error": out.error}
        return {"status": "ok", "bundle": data, "repo": repo, "commit": commit}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------- the worker's side


def task_resources(spec: RunSpec, gpus_per_run: float | None = None) -> dict:
    """What a run's Ray task asks for: GPUs (one per tensor-parallel rank on device cuda, none on
    cpu, or `gpus_per_run` for every run) and one CPU; Ray runs it again once if its process or
    node dies. (Every task gets a fresh process: `_run_remote` is declared with max_calls=1.)"""
    if gpus_per_run is not None:
        gpus = gpus_per_run
    elif spec.device == "cuda":
        gpus = spec.workload.tp if spec.engine == "sglang" else 1
    else:
        gpus = 0
    return {"num_gpus": gpus, "num_cpus": 1, "max_retries": RAY_RETRIES}


@dataclass
class _InFlight:
    job: dict
    spec: RunSpec
    reporter: Reporter
    ref: "ray.ObjectRef"
    told_at: float | None = None
    pids: list[int] = field(default_factory=list)
    scratch: list[dict] = field(default_factory=list)  # what its task's processes made (see the module's doc)


def connect(address: str, *, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join the Ray cluster at `address` ("local": start one on this machine, 127.0.0.1 only),
    with usage reporting and the dashboard off; stepwatch's code travels with every task."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU runs keep the GPUs they see
    modules = [str(ROOT / name) for name in ("ingest", "db", "kernels")]
    runtime_env = {"py_modules": modules, "excludes": ["__pycache__", "*.pyc", "results/", "benchmark_data/"]}
    if address == "local":
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env=runtime_env, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)


def cluster_slots() -> int:
    """How many runs the cluster can hold at once: its GPUs, or its CPUs when it has none."""
    res = ray.cluster_resources()
    return max(1, int(res.get("GPU", 0)) or int(res.get("CPU", 1)))


def _beat_all(db_path: str, flights: dict[int, _InFlight]) -> None:
    """Every in-flight job's heartbeat in one visit; a job someone cancelled or took back gets
    its reporter's flag set."""
    if not flights:
        return
    try:
        with open_db(db_path, wait_s=5) as store:
            for f in flights.values():
                r = f.reporter
                state = store.beat_job(r.job_id, *r.holder, r.done, r.planned, r.log_text())
                if state == "cancel":
                    r.cancel.set()
                elif state == "lost":
                    r.lost.set()
    except StoreError:
        return  # busy: the next beat writes


def _remove_scratch(f: _InFlight, dead: set[int] | None = None) -> None:
    """Remove the scratch that `f`'s dead task processes (`dead`; None: all of them) made, on
    the nodes they ran on (`_remove_scratch_here`), and say so in the job's log."""
    job_id = f.job["job_id"]
    entries = [e for e in f.scratch if dead is None or e["pid"] in dead]
    f.scratch = [e for e in f.scratch if e not in entries]
    by_node: dict[str, list[dict]] = {}
    for entry in entries:
        by_node.setdefault(entry["node"], []).append(entry)
    for node, group in by_node.items():
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        try:
            removed = ray.get(_REMOVE_SCRATCH.options(scheduling_strategy=strategy).remote(group),
                              timeout=REMOVE_SCRATCH_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the node is gone (its scratch with it) or does not answer
            f.reporter.line(f"job {job_id}: cannot remove the scratch of its lost task on Ray node {node[:12]} "
                            f"({type(e).__name__})")
            continue
        for path in removed:
            f.reporter.line(f"job {job_id}: removed {path} on Ray node {node[:12]}, left by its lost task")


def _relay_in(relay, flights: dict[int, _InFlight]) -> None:
    news = ray.get(relay.drain.remote())
    for job_id, entries in news["scratch"].items():
        if job_id in flights:
            flights[job_id].scratch.extend(entries)
    for job_id, lines in news["lines"].items():
        if job_id in flights:
            for text in lines:
                flights[job_id].reporter.line(text)
    for job_id, (done, planned) in news["progress"].items():
        if job_id in flights:
            flights[job_id].reporter.progress(done, planned)
    for job_id, pids in news["started"].items():
        if job_id in flights:
            f = flights[job_id]
            for pid in pids:
                if f.pids:
                    f.reporter.line(f"job {job_id}: its Ray task's process {f.pids[-1]} died; Ray runs it again "
                                    f"(pid {pid})")
                    _remove_scratch(f, dead=set(f.pids))
                f.pids.append(pid)


def _finish(db_path: str, config: Config, rules: list[Rule], f: _InFlight,
            say: Callable[[str], None]) -> tuple[str, int | None]:
    """Take in a task's result: import its bundle (succeeded) or write how it ended. Returns the
    status written and the new run's id when its changes are to be followed (it has a commit)."""
    job_id, reporter = f.job["job_id"], f.reporter
    try:
        result = ray.get(f.ref)
    except ray.exceptions.TaskCancelledError:  # withdrawn before it started, or killed
        result = {"status": "told"}
        _remove_scratch(f)  # a killed task removed nothing itself
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ActorDiedError,
            ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError, ray.exceptions.RaySystemError) as e:
        result = {"status": "failed", "kind": "worker-lost",
                  "error": f"its Ray task was lost ({type(e).__name__}: {str(e).splitlines()[0][:300]})"}
        _remove_scratch(f)
    except ray.exceptions.RayTaskError as e:  # our task raised past its own handler: a bug
        reporter.line(str(e))
        result = {"status": "failed", "kind": "internal-error", "error": str(e).splitlines()[0][:300]}
    if result["status"] == "ok":
        work = make_work_dir(db_path, job_id, f.job["attempts"])
        try:
            bundle = keep_bundle(db_path, job_id, unpack_bundle(result["bundle"], work), work)
            outcome = finish_run(db_path, job_id, f.spec, config, rules, bundle, result["repo"], result["commit"],
                                 reporter, follow=False)  # changes: many runs' at once (follow_changes)
        except Exception as e:  # noqa: BLE001
            outcome = outcome_of(e, reporter)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    elif result["status"] == "told" or (result["status"] == "cancelled" and not reporter.cancel.is_set()):
        # it stopped because it was told: a cancel, the job taken back, or this worker stopping
        outcome = (Outcome("cancelled", None, "cancelled", "cancelled while running") if reporter.cancel.is_set()
                   else Outcome("lost" if reporter.lost.is_set() else "queued"))
    else:
        outcome = Outcome(result["status"], None, result.get("kind"), result.get("error"))
    status = record_outcome(db_path, job_id, reporter, outcome)
    if status != "lost":
        say(f"job {job_id}: {status}" + (f", run {outcome.run_id}" if outcome.run_id else ""))
    if status == "succeeded" and result.get("commit") is not None:
        return status, outcome.run_id
    return status, None


@dataclass
class FleetStats:
    """Where the worker's own time went (seconds), for `ingest/studies/fleet.py`: the one process
    that writes is the fleet's ceiling, so its busy time per run bounds the runs per hour."""

    ended: int = 0
    imported: int = 0
    claim_s: float = 0.0  # poll_queue: take back dead jobs, claim one
    finish_s: float = 0.0  # unpack, keep, import, record: per task that returned
    follow_s: float = 0.0  # change detection of the series new runs joined, and bisect planning
    beat_s: float = 0.0  # the in-flight jobs' heartbeats
    relay_s: float = 0.0  # draining the relay's lines
    submit_s: float = 0.0


def run_fleet_worker(db_path: str, config: Config, rules: list[Rule], address: str, *, poll_s: float = 1.0,
                     max_in_flight: int | None = None, gpus_per_run: float | None = None,
                     stale_s: float = STALE_S, max_attempts: int = MAX_ATTEMPTS, exit_when_idle: bool = False,
                     echo: Callable[[str], None] | None = print, num_cpus: int | None = None,
                     num_gpus: int | None = None, task: Callable | None = None) -> FleetStats:
    """Take jobs and run them on the Ray cluster at `address` until stopped (or, with
    `exit_when_idle`, until the queue is empty and nothing runs); return what it did. `task`
    replaces `_run_remote` as what runs on a node (ingest/studies/fleet.py's stand-in engine)."""
    stopping = stop_on_signals()
    say = echo or (lambda text: None)
    connect(address, num_cpus=num_cpus, num_gpus=num_gpus)
    slots = max_in_flight or cluster_slots()
    me = worker_name()
    say(f"worker {me}: Ray cluster {address}, {ray.cluster_resources().get('GPU', 0):g} GPUs, "
        f"{ray.cluster_resources().get('CPU', 0):g} CPUs: up to {slots} runs at once")
    remote = ray.remote(max_calls=1)(task or _run_remote)  # a fresh process for every run
    relay = _Relay.remote()
    flights: dict[int, _InFlight] = {}
    stats = FleetStats()
    last_beat = last_relay = 0.0
    next_follow = 0.0
    to_follow: list[int] = []  # new runs whose series' changes are not detected yet

    def timed(key: str, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            setattr(stats, key, getattr(stats, key) + time.perf_counter() - t)

    try:
        while True:
            if stopping.is_set():
                for f in flights.values():
                    if f.told_at is None:
                        _tell(relay, f, "stop")
            idle = True
            while not stopping.is_set() and len(flights) < slots:
                try:
                    job = timed("claim_s", poll_queue, db_path, config, me, stale_s, max_attempts, say)
                except StoreError as e:
                    say(f"worker: {e}; retrying")
                    break
                if job is None:
                    break
                idle = False
                say(f"job {job['job_id']}: started by {me} (attempt {job['attempts']})")
                spec = _spec_to_submit(job, config, db_path)
                if spec is None:  # a range, an import, or a kept bundle: here, as the local worker does
                    status, run_id = execute_job(db_path, job, config, rules, echo, stopping)
                    if status != "lost":
                        say(f"job {job['job_id']}: {status}" + (f", run {run_id}" if run_id else ""))
                    stats.ended += 1
                    stats.imported += status == "succeeded"
                    continue
                reporter = Reporter(db_path, job, echo)
                reporter.line(f"job {job['job_id']}: attempt {job['attempts']}: {spec.describe()} "
                              f"(a Ray task: {task_resources(spec, gpus_per_run)['num_gpus']:g} GPUs)")
                ref = timed("submit_s", remote.options(**task_resources(spec, gpus_per_run)).remote,
                            relay, job["job_id"], job["spec"], config)
                flights[job["job_id"]] = _InFlight(job, spec, reporter, ref)
            if not flights:
                if to_follow:
                    timed("follow_s", follow_changes, db_path, to_follow, config, say)
                    to_follow = []
                    continue  # the detection may have queued bisect jobs: look at the queue again
                if stopping.is_set() or (exit_when_idle and idle):
                    break
                stopping.wait(poll_s)
                continue
            refs = {f.ref: job_id for job_id, f in flights.items()}
            done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=min(poll_s, HEARTBEAT_S / 2))
            now = time.monotonic()
            if done or now - last_relay >= RELAY_S:  # a task hands over its last lines before it returns
                timed("relay_s", _relay_in, relay, flights)
                last_relay = now
            for ref in done:
                f = flights.pop(refs[ref])
                status, followed = timed("finish_s", _finish, db_path, config, rules, f, say)
                stats.ended += 1
                stats.imported += status == "succeeded"
                if followed is not None:
                    to_follow.append(followed)
            if to_follow and (now >= next_follow or not flights):
                took = time.perf_counter()
                timed("follow_s", follow_changes, db_path, to_follow, config, say)
                took = time.perf_counter() - took
                to_follow, next_follow = [], time.monotonic() + max(FOLLOW_S, took * (1 / FOLLOW_SHARE - 1))
            if now - last_beat >= HEARTBEAT_S:
                timed("beat_s", _beat_all, db_path, flights)
                last_beat = now
            for f in flights.values():
                r = f.reporter
                if f.told_at is None and (r.cancel.is_set() or r.lost.is_set()):
                    _tell(relay, f, "cancel" if r.cancel.is_set() else "lost")
                elif f.told_at is not None and now - f.told_at > CANCEL_GRACE_S:
                    ray.cancel(f.ref, force=True)
                    f.told_at = float("inf")  # killed once
    finally:
        for f in flights.values():  # an exception of ours: no task outlives the worker
            ray.cancel(f.ref, force=True)
        ray.shutdown()
    return stats


def _tell(relay, f: _InFlight, why: str) -> None:
    """Ask a task to stop (`why`: cancel, lost or stop). A task not started yet (no process has
    reported) is also withdrawn from Ray's queue; a running one stops its engine's command
    itself (force-killing it could leave that command's process group running)."""
    relay.tell.remote(f.job["job_id"], why)
    if not f.pids:
        ray.cancel(f.ref)
    f.told_at = time.monotonic()


def _spec_to_submit(job: dict, config: Config, db_path: str) -> RunSpec | None:
    """The job's spec when it runs as a Ray task; None when it runs here (a range job, an import
    job, an in-process sweep, a job whose kept bundle an earlier attempt left, or a spec that does not parse: the
    local path fails it with its line)."""
    try:
        spec = parse_job_spec(json.loads(job["spec"]), config)
    except Exception:  # noqa: BLE001 - execute_job says what is wrong with it
        return None
    if isinstance(spec, (RangeSpec, SweepSpec)) or spec.engine == "import" \
            or kept_bundle_path(db_path, job["job_id"]).is_dir():
        return None
    return spec

