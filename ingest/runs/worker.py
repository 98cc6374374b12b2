"""The worker: takes queued jobs one at a time, runs them on their host, imports the bundle.

While a job runs, a reporter thread writes its progress, log tail and heartbeat to the
database every few seconds and reads back whether someone asked to cancel it. A job always
ends with a status and, when it failed, an error kind and one line: a failed job is data, not
a lost run. Jobs survive their worker (survival.py): a dead worker's job is queued again (or
failed once its attempts are spent), a bundle it already wrote is imported rather than made
again, and its scratch directories are removed. SIGTERM or SIGINT stops the running engine
command and puts the job back in the queue without counting the attempt (a job whose engine
had already finished is imported first: seconds), then the worker exits with status 0. The
database is written only here (and by CLI imports), in short transactions.

Whoever queues a job runs nothing: the worker resolves the ref, asks the host to answer and, for
a reference run on device cuda, whether it has a GPU, so that a bad ref, a dead host or a
missing GPU fails the job in seconds with one line naming it (these failures are not retried:
only a dead worker's job is). A range job (spec.RangeSpec, queued by the dashboard's form) is
expanded here into one job a commit x run (expand.py), queued in the same transaction that
ends the range job as succeeded, with a note such as "queued 6 jobs (3 commits x 2 runs)"
added to its label.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from db.store import StoreError, open_db, run_tables

from ..errors import IngestError
from ..limits import MAX_ATTEMPTS
from ..traces.categories import Rule
from ..traces.importer import ImportOptions
from .bisect import plan_bisects
from .confirm import plan_confirmations
from .connect import make_host_for
from .engines.base import Checkout, EngineIO
from .engines.registry import ENGINES
from .errors import CommandCancelled, CommandTimeout, HostError, RunError, SpecError
from .expand import Expansion, expand_range
from .git import CommitInfo, describe_commit, resolve_ref
from .import_process import prepare_stoppable
from .hosts import Host, LocalHost
from .repos import ROOT, check_code_source
from .spec import Config, RangeSpec, RunSpec, SweepSpec, parse_job_spec
from .survival import (
    kept_bundle_path,
    list_work_dirs,
    make_work_dir,
    process_stamp,
    remove_scratch,
    remove_work_dirs,
    take_back_dead_jobs,
)
from .track import follow_runs

HEARTBEAT_S = 2.0
STALE_S = 60.0


class Reporter:
    """Collects a job attempt's output and progress; a thread writes them to the database with
    the heartbeat, and learns from it whether someone asked to cancel or the job was taken
    back from this attempt (its heartbeat had stopped for too long)."""

    def __init__(self, db_path: str, job: dict, echo: Callable[[str], None] | None = None,
                 worker_stop: threading.Event | None = None):
        self.db_path, self.job_id, self.echo = db_path, job["job_id"], echo
        self.holder = (job["worker"], job["attempts"])
        self.lines: list[str] = (job.get("log") or "").splitlines()  # earlier attempts' lines stay
        self.done, self.planned = 0, None
        self.cancel = threading.Event()  # someone asked, through the database
        self.lost = threading.Event()  # the job is no longer this attempt's
        self.worker_stop = worker_stop or threading.Event()  # the worker itself is stopping
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def line(self, text: str) -> None:
        self.lines.append(text)
        if self.echo:
            self.echo(text)

    def progress(self, done: int, planned: int | None) -> None:
        self.done, self.planned = done, planned

    def should_stop(self) -> bool:
        return self.cancel.is_set() or self.lost.is_set() or self.worker_stop.is_set()

    def log_text(self) -> str:
        return "\n".join(self.lines[-2000:])

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.flush()

    def flush(self) -> None:
        try:
            with open_db(self.db_path, wait_s=5) as store:
                state = store.beat_job(self.job_id, *self.holder, self.done, self.planned, self.log_text())
        except StoreError:
            return  # busy: the next beat will write
        if state == "cancel":
            self.cancel.set()
        elif state == "lost":
            self.lost.set()

    def note_scratch(self, host_name: str, path: str, repo: str | None = None) -> None:
        """Record a directory the engine made on a host, for removal should this worker die
        (with a heartbeat: the log so far is written before the engine's command starts)."""
        entry = {"host": host_name, "path": path, "repo": repo}
        try:
            with open_db(self.db_path) as store:
                store.add_job_scratch(self.job_id, *self.holder, entry)
                store.beat_job(self.job_id, *self.holder, self.done, self.planned, self.log_text())
        except StoreError as e:
            self.line(f"job {self.job_id}: {path} on host {host_name} is not noted for removal: {e}")

    def __enter__(self) -> "Reporter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _resolve_commit(spec: RunSpec, config: Config, host: Host) -> tuple[str, str | None, CommitInfo | None]:
    """(repo name, repo path on the host, the commit) for a spec; reference runs without a repo
    measure this checkout at HEAD (or at `ref`). The spec's code must come from a checkout the
    config names (repos.check_code_source: a job row of an older stepwatch, or one written by hand,
    is refused here too)."""
    check_code_source(spec, config)
    if spec.engine == "import":
        return spec.repo or "default", None, None
    if spec.repo and (spec.repo_path or spec.repo in config.repos):
        path = spec.repo_path or config.repos[spec.repo].path
        return spec.repo, path, resolve_ref(host, path, spec.ref or "HEAD")
    if spec.engine == "reference" and isinstance(host, LocalHost) and (ROOT / ".git").exists():
        name = spec.repo or "stepwatch"
        if spec.ref is None:
            return name, None, describe_commit(host, str(ROOT), "HEAD")
        return name, str(ROOT), resolve_ref(host, str(ROOT), spec.ref)
    if spec.ref is not None:
        raise SpecError(f"spec.repo: {spec.repo!r} is not in the config's [repos], so ref {spec.ref!r} "
                        f"cannot be checked out on host {spec.host}")
    return spec.repo or "stepwatch", None, None


def check_runnable(spec: RunSpec, config: Config) -> CommitInfo | None:
    """What can be known before a spec runs: its host answers, its ref names a commit, and its
    engine's check passes (a reference run on device cuda has a GPU there). Raises SpecError or
    HostError; returns the commit it will measure (None if it has none)."""
    host = make_host_for(config, spec.host)
    host.check()
    commit = _resolve_commit(spec, config, host)[2]
    ENGINES[spec.engine].check(spec, config, host)
    return commit


def run_spec(spec: RunSpec, config: Config, reporter: Reporter, work_dir: Path) -> tuple[Path, str, CommitInfo | None]:
    """Run the spec's engine (ingest/runs/engines/base.py); return (bundle or trace path, repo
    name, commit). The host must answer, the ref resolve and the engine's check pass first."""
    host = make_host_for(config, spec.host)
    host.check()
    repo, repo_path, commit = _resolve_commit(spec, config, host)
    engine = ENGINES[spec.engine]
    engine.check(spec, config, host)
    # a reference run without a repo (or at HEAD) measures this checkout as it is
    own_code = spec.engine == "reference" and not (commit and repo_path and spec.ref not in (None, "HEAD"))
    checkout = Checkout(commit.sha if commit else None, None if own_code else repo_path)
    io = EngineIO(on_line=reporter.line, on_progress=reporter.progress, should_stop=reporter.should_stop,
                  on_scratch=lambda path, repo=None: reporter.note_scratch(spec.host, path, repo))
    return engine.run(spec, config, host, checkout, work_dir, io), repo, commit


def run_sweep_spec(sweep: SweepSpec, config: Config, reporter: Reporter,
                   work: Path) -> tuple[Path, dict[int, str], str, CommitInfo | None]:
    """Run an in-process sweep (one engine process for every point: engines/base.py `run_sweep`);
    return (the sweep's directory, {point: why it has no result}, repo name, commit). The
    directory holds one bundle a point that has a result, `point-NNN` (engines/base.py)."""
    first = sweep.points[0]
    host = make_host_for(config, first.host)
    host.check()
    repo, repo_path, commit = _resolve_commit(first, config, host)
    engine = ENGINES[first.engine]
    if engine.run_sweep is None:
        raise SpecError(f"spec.engine {first.engine!r}: runs no sweep in one process; queue one job a point")
    for point in sweep.points:
        engine.check(point, config, host)
    checkout = Checkout(commit.sha if commit else None, repo_path)
    io = EngineIO(on_line=reporter.line, on_progress=reporter.progress, should_stop=reporter.should_stop,
                  on_scratch=lambda path, repo=None: reporter.note_scratch(first.host, path, repo))
    directory, missing = engine.run_sweep(sweep, config, host, checkout, work, io)
    return directory, missing, repo, commit


def follow_changes(db_path: str, run_ids: list[int], config: Config, say: Callable[[str], None]) -> None:
    """Re-detect changes in the series of new runs (each series once), queue the interleaved
    re-runs that confirm a suspected change (confirm.py; never for a confirmation's own runs) and
    bisect runs of confirmed ones; a failure here is said, it does not fail the job that produced
    a good run."""
    try:
        for row in follow_runs(db_path, run_ids):  # no connection held while it detects
            if row["metric"] in ("tok_per_s", "step_ms"):
                say(f"change: {row['repo']} {row['variant'] or 'no variant'}: {row['metric']} {row['direction']} "
                    f"{row['rel_change']:+.1%} (p={row['p_value']:.2g}), {row['commits_between']} unmeasured commits "
                    "between")
        plan_confirmations(db_path, config, run_ids, say)
        plan_bisects(db_path, config, say)  # git runs with no connection open
    except Exception as e:  # noqa: BLE001
        say(f"change tracking failed: {type(e).__name__}: {e}")


def keep_bundle(db_path: str, job_id: int, bundle: Path, work: Path) -> Path:
    """Move a job's bundle beside the database (<db>.bundles/job-N), where runs.source_path
    will point. The work directory lies inside <db>.bundles, so this is one rename: job-N
    appears whole or not at all, and a job-N directory always holds a finished engine run.
    An attempt finds job-N already there only when another attempt holds the job now (an
    attempt that finds it at its start imports it): it is left alone, this result dropped."""
    target = kept_bundle_path(db_path, job_id)
    if not bundle.resolve().is_relative_to(work.resolve()):  # an engine that left it elsewhere
        bundle = Path(shutil.copytree(bundle, work / "incoming"))
    if target.exists():
        raise RunError(f"another attempt already kept its bundle at {target}; this result is dropped")
    os.rename(bundle, target)
    return target


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: succeeded, failed or cancelled (final); queued (its worker was
    stopped and it goes back to the queue); lost (taken back from this attempt: nothing written).
    A range job succeeds with the jobs to queue in its place (`expansion`)."""

    status: str
    run_id: int | None = None
    kind: str | None = None
    error: str | None = None
    expansion: Expansion | None = None


def _bundle_for(db_path: str, job_id: int, spec: RunSpec, config: Config, reporter: Reporter,
                work: Path) -> tuple[Path, str, CommitInfo | None]:
    """The bundle to import, its repo and commit: a complete bundle an earlier attempt left, or
    the engine's (kept beside the database, so the run's trace stays downloadable)."""
    kept = kept_bundle_path(db_path, job_id)
    if spec.engine != "import" and kept.is_dir():
        reporter.line(f"job {job_id}: an earlier attempt left a complete bundle at {kept}: "
                      "importing it instead of running the engine again")
        repo, _, commit = _resolve_commit(spec, config, make_host_for(config, spec.host))
        return kept, repo, commit
    bundle, repo, commit = run_spec(spec, config, reporter, work)
    if spec.engine != "import":
        bundle = keep_bundle(db_path, job_id, bundle, work)
    return bundle, repo, commit


def _import(db_path: str, job_id: int, spec: RunSpec, rules: list[Rule], bundle: Path, repo: str,
            commit: CommitInfo | None, reporter: Reporter) -> int:
    """Import the bundle as the job's run (at most one run a job: Store.insert_run); its id. The
    reading stops on a cancel, the worker's SIGTERM or the job's timeout_s (CommandCancelled,
    CommandTimeout), leaving nothing behind; nothing is written until the record is whole."""
    # in a process of its own, so that a cancel, SIGTERM or the job's timeout_s stop it (import_process.py)
    record = prepare_stoppable(bundle, rules, ImportOptions(
        repo=repo, commit=commit.sha if commit else spec.ref,
        variant=spec.variant if spec.engine != "reference" else None, job_id=job_id,
        sweep_id=spec.sweep_id, sweep_point=spec.sweep_point),
        reporter.should_stop, spec.timeout_s, reporter.line)
    tables = run_tables(record)  # before the file is held
    with open_db(db_path) as store:
        if commit is not None:  # before the run: a job with a run has its commit's facts
            store.record_commit(repo, commit.sha, commit.committed_at, commit.author, commit.subject, commit.seq)
        run_id, created = store.insert_run(record, tables)
    reporter.line(f"job {job_id}: {'imported as' if created else 'already imported as'} run {run_id}")
    return run_id


def _attempt(db_path: str, job: dict, config: Config, rules: list[Rule], reporter: Reporter,
             work: Path) -> Outcome:
    """Run the job once; its own failures become the outcome, never an exception."""
    job_id = job["job_id"]
    try:
        spec = parse_job_spec(json.loads(job["spec"]), config)
        if isinstance(spec, RangeSpec):
            reporter.line(f"job {job_id}: attempt {job['attempts']}: expanding {spec.commits or 'HEAD'} of "
                          f"{spec.repo or 'stepwatch'} on host {spec.host}")
            expansion = expand_range(spec, config)
            reporter.line(f"job {job_id}: {expansion.describe()}")
            return Outcome("succeeded", expansion=expansion)
        reporter.line(f"job {job_id}: attempt {job['attempts']}: {spec.describe()}")
        if isinstance(spec, SweepSpec):
            return run_sweep_job(db_path, job_id, spec, config, rules, reporter, work)
        bundle, repo, commit = _bundle_for(db_path, job_id, spec, config, reporter, work)
        return finish_run(db_path, job_id, spec, config, rules, bundle, repo, commit, reporter)
    except Exception as e:  # noqa: BLE001 - every failure of the job becomes its outcome
        return outcome_of(e, reporter)


def finish_run(db_path: str, job_id: int, spec: RunSpec, config: Config, rules: list[Rule], bundle: Path,
               repo: str, commit: CommitInfo | None, reporter: Reporter, follow: bool = True) -> Outcome:
    """Import a run's kept bundle and (with `follow`) follow its series' changes: the part of a
    job only the process that writes the database does (here, or the fleet's worker after a Ray
    task, which follows the changes of many runs at once)."""
    run_id = _import(db_path, job_id, spec, rules, bundle, repo, commit, reporter)
    if follow and commit is not None:
        follow_changes(db_path, [run_id], config, reporter.line)
    return Outcome("succeeded", run_id)


def point_bundle_name(point: int) -> str:
    """The directory of a sweep point's bundle inside its sweep's directory."""
    return f"point-{point:03d}"


def run_sweep_job(db_path: str, job_id: int, sweep: SweepSpec, config: Config, rules: list[Rule],
                  reporter: Reporter, work: Path) -> Outcome:
    """An in-process sweep job: one engine process for every point (an earlier attempt's kept
    directory instead, if it left one), then every point with a result imported as its own run
    (at most one run a job and point), then their series' changes followed. The job succeeds when
    every point has its run; points without a result fail it ("sweep-incomplete", naming them and
    why) after the others are imported: a point SGLang skipped is data, the others are kept."""
    kept = kept_bundle_path(db_path, job_id)
    if kept.is_dir():
        reporter.line(f"job {job_id}: an earlier attempt left the sweep's bundles at {kept}: importing them "
                      "instead of running the engine again")
        repo, _, commit = _resolve_commit(sweep.points[0], config, make_host_for(config, sweep.points[0].host))
        missing_file = kept / "missing.json"
        missing = {int(k): v for k, v in json.loads(missing_file.read_text()).items()} if missing_file.is_file() else {}
    else:
        directory, missing, repo, commit = run_sweep_spec(sweep, config, reporter, work)
        (directory / "missing.json").write_text(json.dumps({str(k): v for k, v in missing.items()}))
        kept = keep_bundle(db_path, job_id, directory, work)
    run_ids = []
    for point in sweep.points:
        bundle = kept / point_bundle_name(point.sweep_point)
        if point.sweep_point in missing or not bundle.is_dir():
            continue
        run_ids.append(_import(db_path, job_id, point, rules, bundle, repo, commit, reporter))
    if commit is not None and run_ids:
        follow_changes(db_path, run_ids, config, reporter.line)
    lost = [p for p in sweep.points
            if p.sweep_point in missing or not (kept / point_bundle_name(p.sweep_point)).is_dir()]
    imported = (f"{len(run_ids)} of {len(sweep.points)} points imported"
                + (f" as runs {', '.join(map(str, run_ids))}" if run_ids else ""))
    reporter.line(f"job {job_id}: sweep {sweep.sweep_id}: {imported}")
    if lost:
        why = "; ".join(f"point {p.sweep_point + 1} ({_describe_point(p)}): "
                        f"{missing.get(p.sweep_point, 'no bundle')}" for p in lost)
        return Outcome("failed", run_ids[0] if run_ids else None, "sweep-incomplete", f"{imported}; {why}")
    return Outcome("succeeded", run_ids[0])


def _describe_point(point: RunSpec) -> str:
    w = point.workload
    if point.engine == "reference":
        return f"bs {w.batch_size}" + (f", context {w.context}" if w.context else "")
    return f"bs {w.batch_size}, input {w.input_len}, output {w.output_len}"


def outcome_of(error: Exception, reporter) -> Outcome:
    """How a job ends when its attempt raised `error` (`reporter`: its cancel and lost flags,
    and where a bug's traceback goes)."""
    if isinstance(error, CommandCancelled):
        if reporter.cancel.is_set():
            return Outcome("cancelled", None, "cancelled", "cancelled while running")
        return Outcome("lost" if reporter.lost.is_set() else "queued")
    if isinstance(error, CommandTimeout):
        return Outcome("failed", None, "timeout", str(error))
    if isinstance(error, SpecError):
        return Outcome("failed", None, "bad-spec", str(error))
    if isinstance(error, HostError):
        return Outcome("failed", None, "host-unreachable", str(error))
    if isinstance(error, RunError):
        return Outcome("failed", None, getattr(error, "kind", None) or "engine-error", str(error))
    if isinstance(error, IngestError):
        return Outcome("failed", None, "bad-result", str(error))
    # a bug of ours: keep the traceback in the job's log
    reporter.line("".join(traceback.format_exception(error)))
    return Outcome("failed", None, "internal-error", f"{type(error).__name__}: {error}")


def record_outcome(db_path: str, job_id: int, reporter: Reporter, outcome: Outcome) -> str:
    """Write how the attempt ended, only while the attempt still holds the job; return the
    status written, or 'lost' when the job had been taken back from the attempt."""
    worker, attempt = reporter.holder
    say = reporter.echo or (lambda text: None)
    if outcome.status == "lost":
        say(f"job {job_id}: taken back from {worker} (its heartbeat had stopped): nothing written")
        return "lost"
    if outcome.error:
        reporter.line(f"job {job_id}: {outcome.status}: {outcome.error}")
    with open_db(db_path) as store:
        store.beat_job(job_id, worker, attempt, reporter.done, reporter.planned, reporter.log_text())
        if outcome.status == "queued":
            note = (f"job {job_id}: requeued: its worker {worker} was stopped (SIGTERM/SIGINT); "
                    "the attempt does not count")
            written = store.release_job(job_id, worker, attempt, "queued", note, count_attempt=False) is not None
            say(note)
        elif outcome.expansion is not None:
            written = _queue_expansion(store, job_id, reporter, outcome.expansion, say)
        else:
            written = store.finish_job(job_id, outcome.status, run_id=outcome.run_id, error_kind=outcome.kind,
                                       error=(outcome.error or "")[:500] or None, log=reporter.log_text(),
                                       holder=(worker, attempt))
    if not written:
        say(f"job {job_id}: taken back from {worker} before it ended ({outcome.status}): nothing written")
        return "lost"
    return outcome.status


def _queue_expansion(store, job_id: int, reporter: Reporter, expansion: Expansion,
                     say: Callable[[str], None]) -> bool:
    """Queue a range job's run jobs, record their commits and end it as succeeded, at once
    (Store.finish_expanding_job); returns whether the attempt still held the job."""
    ids = store.finish_expanding_job(
        job_id, reporter.holder, expansion.list_jobs(), expansion.batch,
        note=f": {expansion.describe()}", log=reporter.log_text(),
        commits=[(expansion.repo, c.sha, c.committed_at, c.author, c.subject, c.seq) for c in expansion.commits])
    if ids is not None:
        say(f"job {job_id}: queued jobs {ids[0]}..{ids[-1]}")
    return ids is not None


def execute_job(db_path: str, job: dict, config: Config, rules: list[Rule],
                echo: Callable[[str], None] | None = None,
                worker_stop: threading.Event | None = None) -> tuple[str, int | None]:
    """Run one claimed job (an attempt: the row claim_job returned) to its end; returns (status,
    run_id). Never raises for the job's own failures: they are written to the job. Status
    'queued': the worker was stopped and the job put back; 'lost': the job was taken back from
    this attempt, which wrote nothing."""
    work = make_work_dir(db_path, job["job_id"], job["attempts"])
    try:
        with Reporter(db_path, job, echo, worker_stop) as reporter:
            outcome = _attempt(db_path, job, config, rules, reporter, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    status = record_outcome(db_path, job["job_id"], reporter, outcome)
    return status, outcome.run_id if status == "succeeded" else None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: the running job's command stops, the loop ends."""
    stopping = threading.Event()

    def stop(signum, frame):  # noqa: ARG001
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    return stopping


def poll_queue(db_path: str, config: Config, me: str, stale_s: float, max_attempts: int,
          say: Callable[[str], None]) -> dict | None:
    """One look at the queue: take back dead workers' jobs, remove leftover work directories
    and scratch, claim the oldest queued job (None if there is none)."""
    listed = list_work_dirs(db_path)  # before reading which attempts run (survival.py says why)
    with open_db(db_path) as store:
        running = store.list_running_jobs(stale_s)
        taken = take_back_dead_jobs(store, db_path, running, max_attempts)
        job = store.claim_job(me, worker_proc=process_stamp())
    taken_ids = {back.job_id for back, _ in taken}
    remove_work_dirs(listed, {(r["job_id"], r["attempts"]) for r in running if r["job_id"] not in taken_ids})
    for back, scratch in taken:
        say(back.line)
        remove_scratch(config, back.job_id, scratch, say)
    return job


def run_worker(db_path: str, config: Config, rules: list[Rule], *, poll_s: float = 1.0,
               stale_s: float = STALE_S, max_attempts: int = MAX_ATTEMPTS, exit_when_idle: bool = False,
               echo: Callable[[str], None] | None = print) -> int:
    """Take jobs until stopped; return how many it ran. Every poll first takes back the jobs of
    dead workers (a job gets `max_attempts` attempts) and removes leftovers (survival.py).
    SIGTERM/SIGINT stop the running job's command and requeue the job, then the loop ends."""
    stopping = stop_on_signals()
    say = echo or (lambda text: None)
    me = worker_name()
    done = 0
    while not stopping.is_set():
        try:
            job = poll_queue(db_path, config, me, stale_s, max_attempts, say)
        except StoreError as e:
            say(f"worker: {e}; retrying")
            time.sleep(poll_s)
            continue
        if job is None:
            if exit_when_idle:
                break
            stopping.wait(poll_s)
            continue
        say(f"job {job['job_id']}: started by {me} (attempt {job['attempts']})")
        status, run_id = execute_job(db_path, job, config, rules, echo, stopping)
        if status != "lost":  # a lost attempt has said so
            say(f"job {job['job_id']}: {status}" + (f", run {run_id}" if run_id else ""))
        done += 1
    return done
