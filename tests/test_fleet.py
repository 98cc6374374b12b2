"""The fleet worker (`ingest worker --ray`) on a real local Ray cluster: the worker starts it
(`--ray local`: ray.init on this machine with logical GPUs declared, the dashboard and usage
reporting off) and runs the reference engine (tiny preset, CPU) in Ray tasks, one fresh process a
run, while it alone writes the DuckDB file. Real processes, a real git repository of 8 commits,
real Ray; nothing of the project is patched.

(A cluster started apart with `ray start --head` cannot be joined here: Ray turns 127.0.0.1 into
the machine's other address, which this sandbox does not let a process connect to; the code path
is the same ray.init with an address.)"""

import io
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from db.store import open_db
from ingest.runs.confirm import is_confirmation_batch
from ingest.runs.fleet import pack_bundle, task_resources, unpack_bundle
from ingest.runs.spec import RunSpec, Workload
from tests.helpers import ROOT, git, kernels_repo, run_cli, wait_for

TINY = ["--engine", "reference", "--preset", "tiny", "--device", "cpu", "--profile-steps", "2"]
RAY_LOCAL = ["--ray", "local", "--ray-cpus", "4", "--ray-gpus", "4", "--gpus-per-run", "1"]


@pytest.fixture(scope="module")
def eight_commits(tmp_path_factory) -> Path:
    """stepwatch's kernels/ at 9 commits; the 5th makes the tiny preset 8 layers deep instead of 4."""
    repo = tmp_path_factory.mktemp("fleetrepo")
    workload = kernels_repo(repo, "c0")
    for i in range(1, 9):
        if i == 5:
            text = workload.read_text()
            assert 'preset="tiny", layers=4,' in text
            workload.write_text(text.replace('preset="tiny", layers=4,', 'preset="tiny", layers=8,'))
        else:
            (repo / f"NOTE{i}").write_text(f"{i}\n")
            git(repo, "add", f"NOTE{i}")
        git(repo, "commit", "-q", "-am", f"c{i}")
    return repo


def _config(db: Path, **repos: Path) -> Path:
    """The config beside `db` naming the repositories a test measures (code runs only from repositories
    a config names: tests/test_hardening_doors.py); the worker reads the same file."""
    config = db.parent / "fleet.toml"
    config.write_text("".join(f'[repos.{name}]\npath = "{path}"\n' for name, path in repos.items()))
    return config


def _worker(db: Path, *more: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), *RAY_LOCAL,
                             "--config", str(db.parent / "fleet.toml"), *more],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job(db: Path, job_id: int) -> dict:
    with open_db(db, read_only=True) as store:
        return store.get_job(job_id)


def _queue_a_long_run(db: Path) -> int:
    """One job of this checkout's HEAD, 400 profiled steps of the tiny preset (over a minute on CPU)."""
    config = _config(db, here=ROOT)
    queued = run_cli("ingest", "backfill", "--repo", "here", "--config", str(config), "--range", "HEAD~1..HEAD",
                     "--engine", "reference",
                     "--preset", "tiny", "--device", "cpu", "--profile-steps", "400", "--kv", "fused", "--db", str(db))
    assert queued.returncode == 0, queued.stderr
    return int(queued.stdout.split()[0])


def _listening_ports() -> set[int]:
    """Ports something on this machine listens on (TCP, IPv4 and IPv6), from /proc/net."""
    ports = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if re.search(r"\b(raylet|gcs_server)\b", line)]


@pytest.mark.slow
def test_a_backfill_of_8_commits_x_2_variants_runs_in_parallel_tasks_and_each_run_is_imported_once(
        tmp_path, eight_commits):
    db = tmp_path / "f.duckdb"
    for kv in ("fused", "full-pool-cast"):
        queued = run_cli("ingest", "backfill", "--repo", "eight", "--config", str(_config(db, eight=eight_commits)),
                         "--range", "main~8..main", *TINY,
                         "--kv", kv, "--db", str(db))
        assert queued.returncode == 0, queued.stderr
        assert "queued 8 jobs (8 commits x 1 variants)" in queued.stderr
    worker = _worker(db, "--exit-when-idle")
    out, _ = worker.communicate(timeout=1500)
    assert worker.returncode == 0, out[-3000:]
    assert "up to 4 runs at once" in out
    with open_db(db, read_only=True) as store:
        # the backfill's jobs; c5's real change (4 -> 8 layers) may be suspected on single runs under load and
        # then re-run interleaved to confirm it (ingest/runs/confirm.py): those re-runs are not the backfill's
        every_job = store.list_jobs()
        jobs = [j for j in every_job if not is_confirmation_batch(j["batch"])]
        ids = sorted(j["job_id"] for j in jobs)
        runs = [r for r in store.con.execute(
            "SELECT r.job_id, c.subject, r.layers, r.workload->>'kv' FROM runs r JOIN commits c USING (commit_id)"
            " ORDER BY r.job_id").fetchall() if r[0] in ids]
        spans = [s[1:] for s in store.con.execute(
            "SELECT job_id, started_at, finished_at FROM jobs ORDER BY started_at").fetchall() if s[0] in ids]
    assert len(every_job) - len(jobs) in (0, 4, 8)  # CONFIRM_PAIRS x 2 re-runs of each variant's window, if any
    assert len(jobs) == 16 and {j["status"] for j in jobs} == {"succeeded"}, [(j["job_id"], j["error"]) for j in jobs]
    assert len(runs) == 16 and sorted(r[0] for r in runs) == sorted(j["job_id"] for j in jobs)  # one run a job
    for job_id, subject, layers, kv in runs:  # each run measured its own commit's code
        assert layers == (8 if int(subject[1:]) >= 5 else 4), (job_id, subject, layers)
    assert sorted(kv for *_, kv in runs) == ["full-pool-cast"] * 8 + ["fused"] * 8
    # tasks ran at once: some job started before an earlier-started one finished
    assert any(spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1))
    logs = [_job(db, j["job_id"])["log"] for j in jobs]
    pids = {re.search(r"running on Ray node \w+ \(pid (\d+)\)", log).group(1) for log in logs}
    assert len(pids) == 16  # a fresh process for every run (max_calls=1)
    assert _ray_processes() == []  # the cluster the worker started is gone with it


@pytest.mark.slow
def test_cancel_stops_a_running_task_and_writes_no_run(tmp_path):
    db = tmp_path / "c.duckdb"
    job_id = _queue_a_long_run(db)
    worker = _worker(db, "--exit-when-idle")
    try:
        wait_for(lambda: "running on Ray node" in (_job(db, job_id)["log"] or ""), "the task to start", 600)
        assert 8265 not in _listening_ports()  # Ray's dashboard is off
        assert run_cli("ingest", "cancel", str(job_id), "--db", str(db)).returncode == 0
        out, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()
    job = _job(db, job_id)
    assert worker.returncode == 0, out[-3000:]
    assert (job["status"], job["error_kind"], job["run_id"]) == ("cancelled", "cancelled", None), job["error"]
    with open_db(db, read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert not re.search(r"kernels\.bench.*--profile-steps 400", subprocess.run(
        ["ps", "-eo", "args"], capture_output=True, text=True).stdout)  # its benchmark was stopped


@pytest.mark.slow
def test_a_killed_task_process_is_run_again_once_then_the_job_fails_with_the_reason(tmp_path):
    """Each attempt is killed once its engine has made its scratch directory (a worktree of this
    checkout in it): a killed process removes nothing itself, so the worker removes what each dead
    attempt made, on its node, and prunes the worktrees from this checkout."""
    db = tmp_path / "k.duckdb"
    job_id = _queue_a_long_run(db)
    started = re.compile(r"running on Ray node \w+ \(pid (\d+)\)")
    scratch = re.compile(r"scratch (\S+) on the Ray node")
    worker = _worker(db, "--exit-when-idle")
    try:
        first = int(wait_for(lambda: started.findall(_job(db, job_id)["log"] or ""), "the task to start", 600)[0])
        wait_for(lambda: len(scratch.findall(_job(db, job_id)["log"] or "")) == 1, "its scratch", 600)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: [int(p) for p in started.findall(_job(db, job_id)["log"] or "") if int(p) != first],
                          "Ray to run the task again", 600)[0]
        wait_for(lambda: len(scratch.findall(_job(db, job_id)["log"] or "")) == 2, "the second scratch", 600)
        os.kill(second, signal.SIGKILL)
        out, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()
    job = _job(db, job_id)
    assert worker.returncode == 0, out[-3000:]
    assert (job["status"], job["error_kind"], job["run_id"]) == ("failed", "worker-lost", None)
    assert job["error"].startswith("its Ray task was lost (") and f"process {first} died" in job["log"]
    with open_db(db, read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    made = scratch.findall(job["log"])
    assert len(made) == 2 and all(Path(p).name.startswith("stepwatch-ref-") for p in made), made
    assert not any(Path(p).exists() for p in made), made
    for path in made:  # each attempt's engine directory, and the task's own work directory
        assert f"removed {path} on Ray node" in job["log"] and "left by its lost task" in job["log"]
    assert len(re.findall(r"removed \S*stepwatch-job\S* on Ray node", job["log"])) == 2
    worktrees = git(ROOT, "worktree", "list", "--porcelain")
    assert not any(p in worktrees for p in made), worktrees
    # the benchmark each killed task had started (its own process group: the kill -9 missed it) is
    # stopped too: no process works in a dead attempt's directories (b4995d3 left it running)
    assert not _working_in(made), _working_in(made)


def _working_in(paths: list[str]) -> list[str]:
    """Live processes whose working directory or an argument lies in one of `paths`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if any(a.startswith(p) for p in paths for a in [*args, cwd]):
            found.append(f"{proc.name}: {' '.join(args)[:200]}")
    return found


def test_a_run_asks_ray_for_a_gpu_per_tensor_parallel_rank():
    assert task_resources(RunSpec("reference", device="cuda"))["num_gpus"] == 1
    assert task_resources(RunSpec("sglang", Workload(model_path="/m", tp=4), device="cuda"))["num_gpus"] == 4
    assert task_resources(RunSpec("reference", device="cpu"))["num_gpus"] == 0
    assert task_resources(RunSpec("reference", device="cpu"), gpus_per_run=1)["num_gpus"] == 1
    assert task_resources(RunSpec("reference"))["max_retries"] == 1


def test_a_bundle_travels_as_tar_bytes_and_nothing_lands_outside_its_directory(tmp_path):
    bundle = tmp_path / "out" / "bundle"
    (bundle / "traces").mkdir(parents=True)
    (bundle / "manifest.json").write_text('{"x": 1}')
    (bundle / "traces" / "a.trace.json.gz").write_bytes(os.urandom(1000))
    back = unpack_bundle(pack_bundle(bundle), tmp_path / "in")
    assert back == tmp_path / "in" / "bundle"
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*")) == [
        "manifest.json", "traces", "traces/a.trace.json.gz"]
    assert (back / "traces" / "a.trace.json.gz").read_bytes() == (bundle / "traces" / "a.trace.json.gz").read_bytes()
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("bundle/../../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack_bundle(evil.read_bytes(), tmp_path / "in2")
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("argv, message", [
    (["--ray", "a;b"], "'a;b' is not a Ray address"),
    (["--ray-cpus", "4"], "--max-in-flight, --gpus-per-run, --ray-cpus and --ray-gpus need --ray"),
    (["--ray", "10.0.0.1:6379", "--ray-gpus", "8"], "--ray-cpus and --ray-gpus declare a cluster that --ray local"),
])
def test_bad_worker_options_are_one_line_and_exit_2(tmp_path, argv, message):
    done = run_cli("ingest", "worker", "--db", str(tmp_path / "w.duckdb"), "--exit-when-idle", *argv)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "w.duckdb").exists()
