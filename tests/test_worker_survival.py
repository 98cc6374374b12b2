"""Jobs survive their worker (ingest/runs/survival.py): real `ingest worker` processes killed
with SIGKILL, stopped with SIGTERM or paused with SIGSTOP while a reference job (tiny preset,
CPU) runs, on a real DuckDB file. What each test waits for is an event (a job's state in the
database, a line of output), never a number of seconds; every wait is bounded generously so a
loaded two-core machine passes too.

Two tests start from the state a worker leaves when it dies after writing its bundle (or after
importing it): the job is claimed through the Store by a real process that has exited, and the
bundle (one captured on an H200, tests/data/bundles) is where keep_bundle puts it. Dying at
exactly that instant with a real kill would be a race, not a test."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from db.store import StoreError, open_db
from ingest.runs.survival import kept_bundle_path, work_root
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from tests.helpers import DATA, ROOT, run_cli, wait_for, write_ssh_config

pytestmark = pytest.mark.slow  # real workers killed, stopped and paused mid-job

TINY = ["--engine", "reference", "--preset", "tiny", "--kv", "full-pool-cast", "--device", "cpu",
        "--profile-steps", "2"]
BUNDLE = DATA / "bundles" / "tiny-full-pool-cast-eager-nostack"  # measured on an H200: not this CPU
OTHER_BUNDLE = DATA / "bundles" / "tiny-fused-eager-nostack"
WAIT_S = 300


class Worker:
    """A real `ingest worker` process; its output lines are collected as they come."""

    def __init__(self, db: Path, *flags: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--poll-s", "0.1",
                                      *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.name = f"{socket.gethostname()}:{self.proc.pid}"
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def exit_code(self) -> int:
        code = self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=30)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.exit_code()


def _queue(db: Path, *flags: str) -> int:
    result = run_cli("ingest", "run", *TINY, "--db", str(db), "--queue", *flags)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])


def _job(db: Path, job_id: int) -> dict:
    with open_db(db, read_only=True, wait_s=WAIT_S) as store:
        job = store.get_job(job_id)
        job["scratch"] = store.con.execute("SELECT scratch FROM jobs WHERE job_id = ?", [job_id]).fetchone()[0]
        return job


def _runs_of(db: Path, job_id: int) -> list[int]:
    with open_db(db, read_only=True, wait_s=WAIT_S) as store:
        return [r for (r,) in store.con.execute("SELECT run_id FROM runs WHERE job_id = ? ORDER BY run_id",
                                                [job_id]).fetchall()]


def _engine_started(db: Path, job_id: int) -> Path | None:
    """The engine's scratch directory once the running job has noted it (the engine has begun)."""
    job = _job(db, job_id)
    if job["status"] != "running" or not job["scratch"]:
        return None
    return Path(json.loads(job["scratch"].splitlines()[0])["path"])


def _processes_naming(path: Path) -> list[int]:
    """Live processes whose command line names `path` (the engine's command writes there)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process, None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], fields[19]


@pytest.fixture
def frozen():
    """Processes a test froze (pid, start time); any still there at the end are killed (the
    start time tells them from a later process that got the same pid)."""
    frozen: list[tuple[int, str]] = []
    yield frozen
    for pid, start in frozen:
        if (_stat(pid) or ("", ""))[1] == start:
            os.kill(pid, signal.SIGKILL)


def _freeze(pid: int, frozen: list[tuple[int, str]]) -> None:
    start = _stat(pid)[1]
    os.kill(pid, signal.SIGSTOP)
    frozen.append((pid, start))


def _kill_mid_job(db: Path, frozen: list) -> tuple[int, str, Path, Path, int]:
    """Queue a job, let a worker start its engine command, kill -9 the worker. The command is
    frozen (SIGSTOP) first: left alone it would die at its next line of output, on the closed
    pipe, and the test would race it. Returns the job, the dead worker's name, the engine's
    scratch directory, the attempt's work directory and the command's pid."""
    job_id = _queue(db)
    worker = Worker(db)
    try:
        scratch = wait_for(lambda: _engine_started(db, job_id), "the engine to start")
        command = wait_for(lambda: _processes_naming(scratch), "the engine's command")[0]
        _freeze(command, frozen)
    finally:
        worker.stop()  # SIGKILL: no chance to clean up
    work = work_root(str(db)) / f"job-{job_id}.1"
    assert scratch.is_dir() and work.is_dir() and _processes_naming(scratch) == [command]  # left behind
    return job_id, worker.name, scratch, work, command


def _freeze_all(path: Path, frozen: list) -> None:
    """SIGSTOP every process naming `path`, until a look finds none that still runs."""
    while True:
        running = [pid for pid in _processes_naming(path) if (_stat(pid) or ("Z",))[0] not in ("T", "t", "Z")]
        if not running:
            return
        for pid in running:
            try:
                _freeze(pid, frozen)
            except (TypeError, ProcessLookupError):  # it ended meanwhile
                continue


def _claim_as_dead_worker(db: Path, job_id: int) -> str:
    """Claim a job as a worker that has since died: a real process takes its own stamp and exits."""
    proc = subprocess.run([sys.executable, "-c", "import os; from ingest.runs.survival import process_stamp; "
                           "print(os.getpid(), process_stamp())"], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=WAIT_S)
    pid, stamp = proc.stdout.split()
    name = f"{socket.gethostname()}:{pid}"
    with open_db(db) as store:
        assert store.claim_job(name, job_id, worker_proc=stamp)["attempts"] == 1
    return name


def _worker_until_idle(db: Path, *flags: str) -> subprocess.CompletedProcess:
    result = run_cli("ingest", "worker", "--db", str(db), "--exit-when-idle", "--poll-s", "0.1", *flags)
    assert result.returncode == 0, result.stderr
    return result


def _manifest_tok_per_s(bundle: Path) -> float:
    return json.loads((bundle / "manifest.json").read_text())["timing"]["tok_per_s"]


def test_a_killed_workers_job_is_requeued_and_imported_once(tmp_path, frozen):
    db = tmp_path / "s.duckdb"
    job_id, dead, scratch, work, command = _kill_mid_job(db, frozen)
    result = _worker_until_idle(db)
    assert (f"job {job_id}: requeued after attempt 1 of 2: its worker {dead} died (its process is gone); "
            "it will run again") in result.stdout
    assert f"job {job_id}: stopped process group {command}, still running in {scratch}" in result.stdout
    assert f"job {job_id}: removed {scratch} on host local" in result.stdout
    job = _job(db, job_id)
    assert (job["status"], job["attempts"], job["error_kind"]) == ("succeeded", 2, None)
    assert _runs_of(db, job_id) == [job["run_id"]]
    log = job["log"]
    assert log.index("attempt 1:") < log.index("requeued after attempt 1 of 2") < log.index("attempt 2:")
    with open_db(db, read_only=True) as store:
        assert store.get_run(job["run_id"])["source_path"] == str(kept_bundle_path(str(db), job_id))
    assert not scratch.exists() and not work.exists() and not _processes_naming(scratch)
    assert list(work_root(str(db)).iterdir()) == []


def test_a_dead_workers_job_fails_once_its_attempts_are_spent(tmp_path, frozen):
    db = tmp_path / "s.duckdb"
    job_id, dead, scratch, work, command = _kill_mid_job(db, frozen)
    result = _worker_until_idle(db, "--max-attempts", "1")
    error = f"its worker {dead} died (its process is gone) on attempt 1 of 1"
    assert f"job {job_id}: failed: worker-died: {error}" in result.stdout
    assert "started by" not in result.stdout  # nothing ran again
    assert f"job {job_id}: stopped process group {command}, still running in {scratch}" in result.stdout
    job = _job(db, job_id)
    assert (job["status"], job["error_kind"], job["error"], job["attempts"]) == ("failed", "worker-died", error, 1)
    assert job["run_id"] is None and _runs_of(db, job_id) == []
    # the dead worker's temporary directories and its engine command: gone once the next worker has looked
    assert not scratch.exists() and not work.exists() and not _processes_naming(scratch)
    assert list(work_root(str(db)).iterdir()) == []


def test_a_complete_bundle_of_a_dead_attempt_is_imported_not_made_again(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = _queue(db)
    dead = _claim_as_dead_worker(db, job_id)
    kept = kept_bundle_path(str(db), job_id)
    shutil.copytree(BUNDLE, kept)  # as keep_bundle left it, before the import that never came
    result = _worker_until_idle(db)
    assert (f"job {job_id}: requeued after attempt 1 of 2: its worker {dead} died (its process is gone); "
            "its complete bundle will be imported") in result.stdout
    job = _job(db, job_id)
    assert (job["status"], job["attempts"]) == ("succeeded", 2)
    assert (f"job {job_id}: an earlier attempt left a complete bundle at {kept}: importing it instead of "
            "running the engine again") in job["log"]
    assert "progress:" not in job["log"] and job["scratch"] is None  # no engine ran, none made a directory
    assert _runs_of(db, job_id) == [job["run_id"]]
    with open_db(db, read_only=True) as store:
        run = store.get_run(job["run_id"])
    assert run["tok_per_s"] == _manifest_tok_per_s(BUNDLE)  # the H200's figures, not this CPU's
    assert "H200" in run["device"] and run["source_path"] == str(kept)


def test_a_run_imported_before_the_worker_died_finishes_the_job(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = _queue(db)
    dead = _claim_as_dead_worker(db, job_id)
    kept = kept_bundle_path(str(db), job_id)
    shutil.copytree(BUNDLE, kept)
    rules = load_rule_chain()
    with open_db(db) as store:  # the import happened; the worker died before it finished the job
        run_id, created = store.insert_run(prepare_import(kept, rules, ImportOptions(job_id=job_id)))
    assert created
    result = _worker_until_idle(db)
    assert (f"job {job_id}: succeeded: its worker {dead} died (its process is gone) after importing run {run_id}"
            in result.stdout)
    assert "started by" not in result.stdout
    job = _job(db, job_id)
    assert (job["status"], job["run_id"], job["attempts"]) == ("succeeded", run_id, 1)
    # never a second run for one job, even from another trace
    with open_db(db) as store:
        assert store.insert_run(prepare_import(OTHER_BUNDLE, rules, ImportOptions(job_id=job_id))) == (run_id, False)
    assert _runs_of(db, job_id) == [run_id]


def test_sigterm_requeues_the_running_job_and_the_worker_exits_0(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = _queue(db)
    worker = Worker(db)
    try:
        scratch = wait_for(lambda: _engine_started(db, job_id), "the engine to start")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.exit_code() == 0, worker.output()
    finally:
        worker.stop()
    assert (f"job {job_id}: requeued: its worker {worker.name} was stopped (SIGTERM/SIGINT); "
            "the attempt does not count") in worker.output()
    job = _job(db, job_id)
    assert (job["status"], job["attempts"], job["worker"], job["run_id"]) == ("queued", 0, None, None)
    assert _runs_of(db, job_id) == []
    assert not scratch.exists() and not _processes_naming(scratch)  # its command stopped, its files removed
    assert list(work_root(str(db)).iterdir()) == []
    result = _worker_until_idle(db)  # the requeued job runs, as its first counted attempt
    job = _job(db, job_id)
    assert (job["status"], job["attempts"]) == ("succeeded", 1), result.stdout
    assert _runs_of(db, job_id) == [job["run_id"]]


def _pause(worker: Worker, db: Path) -> None:
    """SIGSTOP the worker at a moment it does not hold the database (a paused holder would
    keep every other process out)."""
    while True:
        worker.proc.send_signal(signal.SIGSTOP)
        try:
            with open_db(db, wait_s=2):
                return
        except StoreError:
            worker.proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)


def test_a_worker_given_up_for_dead_writes_nothing_when_it_wakes(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = _queue(db)
    first = Worker(db)
    try:
        wait_for(lambda: _engine_started(db, job_id), "the engine to start")
        _pause(first, db)
        with open_db(db) as store:  # its heartbeat is as old as after five minutes' pause
            store.con.execute("UPDATE jobs SET heartbeat_at = heartbeat_at - INTERVAL 5 MINUTE WHERE job_id = ?",
                              [job_id])
        result = _worker_until_idle(db)
        assert f"job {job_id}: requeued after attempt 1 of 2: its worker {first.name} died (no heartbeat for 3" \
            in result.stdout
        done = _job(db, job_id)
        assert (done["status"], done["attempts"]) == ("succeeded", 2)
        first.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: f"job {job_id}: taken back from {first.name}" in first.output(),
                  "the first worker to find its job taken back")
        first.proc.send_signal(signal.SIGTERM)
        assert first.exit_code() == 0, first.output()
    finally:
        first.proc.send_signal(signal.SIGCONT)
        first.stop()
    job = _job(db, job_id)
    assert {k: job[k] for k in ("status", "attempts", "run_id", "worker", "log")} == \
        {k: done[k] for k in ("status", "attempts", "run_id", "worker", "log")}
    assert _runs_of(db, job_id) == [done["run_id"]]
    with open_db(db, read_only=True) as store:
        run = store.get_run(done["run_id"])
    kept = kept_bundle_path(str(db), job_id)
    assert run["tok_per_s"] == _manifest_tok_per_s(kept)  # the kept bundle is the imported run's
    assert not (work_root(str(db)) / f"job-{job_id}.1").exists()


def test_a_killed_workers_scratch_on_an_ssh_host_is_removed(tmp_path, sshd, frozen):
    db = tmp_path / "s.duckdb"
    config = write_ssh_config(tmp_path, sshd)  # the host "loop": this machine through a real sshd
    remote = tmp_path / "remote"
    job_id = _queue(db, "--host", "loop", "--config", config)
    worker = Worker(db, "--config", config)
    try:
        scratch = wait_for(lambda: _engine_started(db, job_id), "the engine to start on the host")
    finally:
        worker.stop()
    # what runs on the host for the dead worker is frozen: the test decides when it ends
    _freeze_all(scratch, frozen)
    assert scratch.parent == remote and scratch.is_dir()
    result = _worker_until_idle(db, "--config", config, "--max-attempts", "1")
    assert f"job {job_id}: removed {scratch} on host loop" in result.stdout
    assert list(remote.iterdir()) == []  # nothing of the dead worker's is left on the host
    job = _job(db, job_id)
    assert (job["status"], job["error_kind"]) == ("failed", "worker-died")
