"""The worker: takes queued jobs one at a time, runs them on their host, imports the bundle.

While a job runs, a reporter thread writes its progress, log tail and heartbeat to the
database every few seconds and reads back whether someone asked to cancel it. A job always
ends with a status and, when it failed, an error kind and one line: a failed job is data, not
a lost run. A job whose worker died is failed by the next worker that looks (stale heartbeat).
The database is written only here (and by CLI imports), in short transactions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from db.store import StoreError, open_db

from ..categories import Rule
from ..errors import IngestError
from ..importer import ImportOptions, prepare_import
from .engines.reference import run_reference
from .errors import CommandCancelled, CommandTimeout, HostError, RunError, SpecError
from .git import CommitInfo, describe_commit, resolve_ref
from .hosts import Host, LocalHost, make_host
from .repos import ROOT
from .spec import Config, RunSpec, parse_spec

HEARTBEAT_S = 2.0
STALE_S = 60.0


def make_host_for(config: Config, name: str) -> Host:
    return make_host(config.host(name))


class Reporter:
    """Collects a job's output and progress; a thread writes them to the database."""

    def __init__(self, db_path: str, job_id: int, echo: Callable[[str], None] | None = None,
                 worker_stop: threading.Event | None = None):
        self.db_path, self.job_id, self.echo = db_path, job_id, echo
        self.lines: list[str] = []
        self.done, self.planned = 0, None
        self.cancel = threading.Event()  # someone asked, through the database
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
        return self.cancel.is_set() or self.worker_stop.is_set()

    def log_text(self) -> str:
        return "\n".join(self.lines[-2000:])

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.flush()

    def flush(self) -> None:
        try:
            with open_db(self.db_path, wait_s=5) as store:
                if store.report_progress(self.job_id, self.done, self.planned, self.log_text()):
                    self.cancel.set()
        except StoreError:
            pass  # busy: the next beat will write

    def __enter__(self) -> "Reporter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _resolve_commit(spec: RunSpec, config: Config, host: Host) -> tuple[str, str | None, CommitInfo | None]:
    """(repo name, repo path on the host, the commit) for a spec; reference runs without a repo
    measure this checkout at HEAD (or at `ref`)."""
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
    """What can be known before a spec is queued: its host answers and its ref names a commit.
    Raises SpecError or HostError; returns the commit it will measure (None if it has none)."""
    host = make_host_for(config, spec.host)
    host.check()
    return _resolve_commit(spec, config, host)[2]


def run_spec(spec: RunSpec, config: Config, reporter: Reporter, work_dir: Path) -> tuple[Path, str, CommitInfo | None]:
    """Run the spec's engine; return (bundle or trace path, repo name, commit)."""
    host = make_host_for(config, spec.host)
    host.check()
    repo, repo_path, commit = _resolve_commit(spec, config, host)
    common = dict(work_dir_local=work_dir, on_line=reporter.line, should_stop=reporter.should_stop,
                  on_progress=reporter.progress)
    if spec.engine == "import":
        return Path(spec.path), repo, None
    if spec.engine == "reference":
        sha = commit.sha if commit else None
        worktree_repo = repo_path if (commit and repo_path and spec.ref not in (None, "HEAD")) else None
        return run_reference(spec, config, host, sha=sha, repo_path=worktree_repo, **common), repo, commit
    from .engines.sglang import run_sglang

    return run_sglang(spec, config, host, sha=commit.sha, **common), repo, commit


def _follow_changes(db_path: str, run_id: int, config: Config, say: Callable[[str], None]) -> None:
    """Re-detect changes in the run's series and queue bisect runs; a failure here is logged,
    it does not fail the job that produced a good run."""
    from ..regress.bisect import plan_bisects
    from ..regress.track import follow_run

    try:
        series, found = follow_run(db_path, run_id)  # no connection held while it detects
        if series is None:
            return
        for row in found:
            if row["metric"] in ("tok_per_s", "step_ms"):
                say(f"change: {row['metric']} {row['direction']} {row['rel_change']:+.1%} "
                    f"(p={row['p_value']:.2g}), {row['commits_between']} unmeasured commits between")
        with open_db(db_path) as store:
            plan_bisects(store, config, say)
    except Exception as e:  # noqa: BLE001
        say(f"change tracking failed: {type(e).__name__}: {e}")


def keep_bundle(db_path: str, job_id: int, bundle: Path) -> Path:
    """Move a job's bundle beside the database (<db>.bundles/job-N), where runs.source_path
    will point; the temporary work directory is removed after the job."""
    db = Path(db_path).resolve()
    target = db.parent / f"{db.stem}.bundles" / f"job-{job_id}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    shutil.move(str(bundle), target)
    return target


def execute_job(db_path: str, job: dict, config: Config, rules: list[Rule],
                echo: Callable[[str], None] | None = None,
                worker_stop: threading.Event | None = None) -> tuple[str, int | None]:
    """Run one claimed job to its end; returns (status, run_id). Never raises for the job's
    own failures: they are written to the job."""
    job_id = job["job_id"]
    status, run_id, kind, error = "failed", None, None, None
    with Reporter(db_path, job_id, echo, worker_stop) as reporter, tempfile.TemporaryDirectory(prefix="stepwatch-job-") as work:
        try:
            spec = parse_spec(json.loads(job["spec"]), config)
            reporter.line(f"job {job_id}: {spec.describe()}")
            bundle, repo, commit = run_spec(spec, config, reporter, Path(work))
            if spec.engine != "import":  # keep it, so the run's trace stays downloadable
                bundle = keep_bundle(db_path, job_id, bundle)
            record = prepare_import(bundle, rules, ImportOptions(
                repo=repo, commit=commit.sha if commit else spec.ref,
                variant=spec.variant if spec.engine != "reference" else None, job_id=job_id))
            with open_db(db_path) as store:
                run_id, created = store.insert_run(record)
                if commit is not None:
                    store.record_commit(repo, commit.sha, commit.committed_at, commit.author, commit.subject,
                                        commit.seq)
            reporter.line(f"job {job_id}: {'imported as' if created else 'same trace as'} run {run_id}")
            status = "succeeded"
            if commit is not None:
                _follow_changes(db_path, run_id, config, reporter.line)
        except CommandCancelled:
            if reporter.cancel.is_set():
                status, kind, error = "cancelled", "cancelled", "cancelled while running"
            else:
                kind, error = "worker-stopped", "its worker was stopped while it ran"
        except CommandTimeout as e:
            kind, error = "timeout", str(e)
        except SpecError as e:
            kind, error = "bad-spec", str(e)
        except HostError as e:
            kind, error = "host-unreachable", str(e)
        except RunError as e:
            kind, error = getattr(e, "kind", None) or "engine-error", str(e)
        except IngestError as e:
            kind, error = "bad-result", str(e)
        except Exception as e:  # a bug of ours: keep the traceback in the job's log
            reporter.line(traceback.format_exc())
            kind, error = "internal-error", f"{type(e).__name__}: {e}"
        if error:
            reporter.line(f"job {job_id}: {status}: {error}")
    with open_db(db_path) as store:
        store.report_progress(job_id, reporter.done, reporter.planned)
        store.finish_job(job_id, status, run_id=run_id, error_kind=kind, error=(error or "")[:500] or None,
                         log=reporter.log_text())
    return status, run_id


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_worker(db_path: str, config: Config, rules: list[Rule], *, poll_s: float = 1.0,
               stale_s: float = STALE_S, exit_when_idle: bool = False,
               echo: Callable[[str], None] | None = print) -> int:
    """Take jobs until stopped (SIGTERM/SIGINT end the loop after the current job is cancelled)."""
    stopping = threading.Event()

    def stop(signum, frame):  # noqa: ARG001
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    me = worker_name()
    done = 0
    while not stopping.is_set():
        try:
            with open_db(db_path) as store:
                for dead in store.fail_abandoned_jobs(stale_s):
                    echo and echo(f"job {dead}: failed (its worker stopped beating)")
                job = store.claim_job(me)
        except StoreError as e:
            echo and echo(f"worker: {e}; retrying")
            time.sleep(poll_s)
            continue
        if job is None:
            if exit_when_idle:
                break
            stopping.wait(poll_s)
            continue
        echo and echo(f"job {job['job_id']}: started by {me}")
        status, run_id = execute_job(db_path, job, config, rules, echo, stopping)
        echo and echo(f"job {job['job_id']}: {status}" + (f", run {run_id}" if run_id else ""))
        done += 1
    return done
