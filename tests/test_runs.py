"""Runs on this machine with the reference engine (tiny preset, CPU): the CLI, the worker, the
job queue's states, cancellation, timeouts, a dead worker, bad specs, and commit ranges along a
real git repository. Real processes, a real DuckDB file, a real git checkout."""

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from db.store import open_db
from ingest.runs.errors import SpecError
from ingest.runs.git import list_first_parent, resolve_ref
from ingest.runs.hosts import LocalHost
from ingest.errors import IngestError
from ingest.runs.spec import Config, RepoConfig, load_config, parse_spec
from ingest.traces.importer import check_label as check_import_label
from kernels.bundle import LABEL_RULE
from tests.helpers import ROOT, git, kernels_repo, run_cli, wait_for

TINY = ["--engine", "reference", "--preset", "tiny", "--kv", "fused", "--device", "cpu", "--profile-steps", "2"]


@pytest.fixture(scope="module")
def bench_repo(tmp_path_factory) -> Path:
    """A git repository holding stepwatch's kernels/ at three commits; the middle one makes
    the tiny preset twice as deep (8 layers), as a regression would."""
    repo = tmp_path_factory.mktemp("benchrepo")
    workload = kernels_repo(repo, "first: tiny has 4 layers")
    text = workload.read_text()
    assert 'preset="tiny", layers=4,' in text
    workload.write_text(text.replace('preset="tiny", layers=4,', 'preset="tiny", layers=8,'))
    git(repo, "commit", "-q", "-am", "second: tiny has 8 layers")
    (repo / "NOTES").write_text("a commit that changes nothing measured\n")
    git(repo, "add", "NOTES")
    git(repo, "commit", "-q", "-m", "third: notes")
    return repo


@pytest.mark.slow
def test_cli_run_records_a_job_and_a_run(tmp_path):
    db = tmp_path / "s.duckdb"
    result = run_cli("ingest", "run", *TINY, "--db", str(db))
    assert result.returncode == 0, result.stderr
    run_id = int(result.stdout.strip().splitlines()[-1])
    with open_db(db, read_only=True) as store:
        job = store.list_jobs()[0]
        run = store.get_run(run_id)
        kernels = store.list_kernels(run_id)
    assert (job["status"], job["run_id"], job["steps_done"], job["steps_planned"]) == ("succeeded", run_id, 22, 22)
    assert run["variant"] == "fused" and run["steps"] == 2 and run["kernels_from_cpu_ops"]
    assert run["repo"] == "stepwatch" and len(run["sha"]) == 40  # this checkout's HEAD
    assert run["tok_per_s"] > 0 and len(kernels) > 10


@pytest.mark.slow
def test_worker_runs_queued_jobs_in_order(tmp_path):
    db = tmp_path / "s.duckdb"
    ids = [int(run_cli("ingest", "run", *TINY, "--kv", kv, "--db", str(db), "--queue").stdout.split()[-1])
           for kv in ("full-pool-cast", "fused")]
    result = run_cli("ingest", "worker", "--db", str(db), "--exit-when-idle")
    assert result.returncode == 0, result.stderr
    with open_db(db, read_only=True) as store:
        jobs = {j["job_id"]: j for j in store.list_jobs()}
        variants = [store.get_run(jobs[i]["run_id"])["variant"] for i in ids]
    assert [jobs[i]["status"] for i in ids] == ["succeeded", "succeeded"]
    assert variants == ["full-pool-cast", "fused"]
    assert jobs[ids[0]]["started_at"] < jobs[ids[1]]["started_at"]


def _start_worker(db: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--poll-s", "0.2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job(db: Path, job_id: int) -> dict:
    with open_db(db, read_only=True) as store:
        return store.get_job(job_id)


@pytest.mark.slow
def test_cancel_a_running_job_stops_it_and_writes_no_run(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = int(run_cli("ingest", "run", *TINY, "--preset", "glm5", "--db", str(db), "--queue").stdout.split()[-1])
    worker = _start_worker(db)
    try:
        wait_for(lambda: _job(db, job_id)["status"] == "running", f"job {job_id} to run", 120.0)
        assert run_cli("ingest", "cancel", str(job_id), "--db", str(db)).returncode == 0
        job = wait_for(lambda: (j := _job(db, job_id))["status"] != "running" and j, f"job {job_id} to end", 120.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert (job["status"], job["error_kind"], job["run_id"]) == ("cancelled", "cancelled", None)
    with open_db(db, read_only=True) as store:
        assert store.count_rows()["runs"] == 0


@pytest.mark.slow
def test_a_job_past_its_timeout_fails_as_timeout(tmp_path):
    db = tmp_path / "s.duckdb"
    spec = tmp_path / "slow.toml"
    spec.write_text('engine = "reference"\ndevice = "cpu"\ntimeout_s = 3\n'
                    '[workload]\npreset = "glm5"\nkv = "full-pool-cast"\n')  # glm5 on a CPU: far over 3 s
    result = run_cli("ingest", "run", str(spec), "--db", str(db))
    assert result.returncode == 2
    assert "timeout" in result.stderr and "timed out after 3 s" in result.stderr
    job = _job(db, 1)
    assert (job["status"], job["error_kind"]) == ("failed", "timeout")


@pytest.mark.slow
def test_a_dead_workers_job_is_failed_by_the_next_worker(tmp_path):
    db = tmp_path / "s.duckdb"
    job_id = int(run_cli("ingest", "run", *TINY, "--preset", "glm5", "--db", str(db), "--queue").stdout.split()[-1])
    worker = _start_worker(db)
    wait_for(lambda: _job(db, job_id)["status"] == "running", f"job {job_id} to run", 120.0)
    worker.kill()  # no chance to clean up
    worker.wait()
    # the worker ran on this machine and its process is gone: the next worker takes the job back at
    # once (no minute of heartbeat to wait); with one attempt allowed, it fails it
    result = run_cli("ingest", "worker", "--db", str(db), "--exit-when-idle", "--max-attempts", "1")
    assert (f"job {job_id}: failed: worker-died: its worker {socket.gethostname()}:{worker.pid} died "
            "(its process is gone) on attempt 1 of 1") in result.stdout
    job = _job(db, job_id)
    assert (job["status"], job["error_kind"]) == ("failed", "worker-died")


@pytest.mark.parametrize("flags,message", [
    (["--engine", "nope"], "invalid choice"),
    (["--engine", "reference", "--preset", "huge"], "spec.workload.preset: 'huge' is not one of"),
    (["--engine", "reference", "--preset", "tiny", "--kv", "magic"], "spec.workload.kv"),
    (["--engine", "reference", "--preset", "tiny", "--ref=--output=/tmp/x"], "looks like an option"),
    (["--engine", "reference", "--preset", "tiny", "--ref", "main;rm -rf ~"], "is not a git ref"),
    (["--engine", "reference", "--preset", "tiny", "--ref", "$(touch /tmp/pwned)"], "is not a git ref"),
    (["--engine", "reference", "--preset", "tiny", "--ref", "no-such-branch-xyz"], "no such commit"),
    (["--engine", "reference", "--preset", "tiny", "--host", "gpu9"], "host 'gpu9': not in the config file"),
    (["--engine", "sglang", "--model-path", "m", "--repo", "sglang", "--ref", "main"], "not in the config's [repos]"),
    (["--engine", "import", "--path", "/no/such/trace.json"], "no such file or directory"),
])
@pytest.mark.slow
def test_bad_specs_are_refused_and_nothing_runs(tmp_path, flags, message):
    db = tmp_path / "s.duckdb"
    result = run_cli("ingest", "run", *flags, "--device", "cpu", "--db", str(db))
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not Path("/tmp/pwned").exists()
    assert not db.exists()  # refused before anything was queued


@pytest.mark.slow
def test_missing_patch_file_in_config_is_refused(tmp_path):
    config = tmp_path / "stepwatch.toml"
    config.write_text('[patches.fix]\nfiles = ["missing.patch"]\n')
    result = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--config", str(config),
                     "--db", str(tmp_path / "s.duckdb"))
    assert result.returncode == 2 and "patches.fix.files" in result.stderr and "no such patch file" in result.stderr


def test_refs_resolve_to_full_shas_and_ranges_follow_first_parent(bench_repo):
    host = LocalHost()
    head = resolve_ref(host, str(bench_repo), "main")
    assert len(head.sha) == 40 and head.subject == "third: notes" and head.seq == 3 and head.author == "T"
    commits = list_first_parent(host, str(bench_repo), "main~2..main")
    assert [c.subject for c in commits] == ["second: tiny has 8 layers", "third: notes"]
    assert [c.seq for c in commits] == [2, 3]
    with pytest.raises(SpecError, match="no such commit"):
        resolve_ref(host, str(bench_repo), "v9.9")
    with pytest.raises(SpecError, match="looks like an option"):
        resolve_ref(host, str(bench_repo), "--all")


@pytest.mark.slow
def test_backfill_queues_every_commit_and_the_worker_measures_each_commits_code(tmp_path, bench_repo):
    db = tmp_path / "s.duckdb"
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.bench]\npath = "{bench_repo}"\n')  # code runs only from a repo the config names
    result = run_cli("ingest", "backfill", "--repo", "bench", "--range", "main~2..main", "--config", str(config),
                     "--engine", "reference", "--preset", "tiny", "--kv", "fused", "--device", "cpu",
                     "--profile-steps", "2", "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert "queued 2 jobs (2 commits x 1 variants)" in result.stderr
    assert run_cli("ingest", "worker", "--db", str(db), "--config", str(config), "--exit-when-idle").returncode == 0
    with open_db(db, read_only=True) as store:
        rows = store.con.execute(
            "SELECT c.seq, c.subject, r.layers, r.variant FROM runs r JOIN commits c USING (commit_id)"
            " ORDER BY c.seq").fetchall()
    assert rows == [(2, "second: tiny has 8 layers", 8, "fused"), (3, "third: notes", 8, "fused")]


def test_spec_checks_name_the_field():
    with pytest.raises(SpecError, match=r"spec.workload.batch_size: must be a positive integer"):
        parse_spec({"engine": "reference", "workload": {"preset": "tiny", "batch_size": 0}})
    with pytest.raises(SpecError, match=r"^spec.workload.profile_steps: must be at most 1,000 \(WORKLOAD_MAXIMA\), "
                                        r"got 100,000,000$"):
        parse_spec({"engine": "reference", "workload": {"preset": "tiny", "profile_steps": 100_000_000}})
    assert parse_spec({"engine": "reference", "workload": {"preset": "tiny", "profile_steps": 1000}}
                      ).workload.profile_steps == 1000
    with pytest.raises(SpecError, match=r"spec.workload.extra_args: '--x; reboot'"):
        parse_spec({"engine": "sglang", "repo": "s", "ref": "main", "workload": {"model_path": "m",
                    "extra_args": ["--x; reboot"]}}, Config(repos={"s": RepoConfig("s", "/x")}))
    spec = parse_spec({"engine": "reference", "workload": {"preset": "tiny", "kv": "fused"}})
    assert json.loads(spec.to_json())["workload"]["kv"] == "fused"


@pytest.mark.parametrize("label", ["fix/a", "org/repo@v2", "a:b", "x" * 200, "-x", "a b", "a;b", "x" * 201, ""])
def test_one_label_rule_for_a_spec_and_an_import(tmp_path, label):
    # `ingest import --variant fix/a` was accepted while a spec (and the form) refused it.
    patch = tmp_path / "p.patch"
    patch.write_text("")
    config_file = tmp_path / "c.toml"
    config_file.write_text(f"[repos.s]\npath = '/x'\n[patches]\n{json.dumps(label)} = {{ files = ['{patch}'] }}\n")
    by_import = by_config = by_spec = True
    try:
        check_import_label("variant", label)
    except IngestError:
        by_import = False
    try:
        config = load_config(config_file)
    except SpecError as e:
        by_config = False
        assert str(e).endswith(LABEL_RULE) and "patches." in str(e)
    try:
        parse_spec({"engine": "sglang", "repo": "s", "ref": "main", "variant": label, "workload": {"model_path": "m"}},
                   config if by_config else Config(repos={"s": RepoConfig("s", "/x")}, patches={label: (str(patch),)}))
    except SpecError as e:
        by_spec = False
        assert str(e).startswith("spec.variant: ") and str(e).endswith(LABEL_RULE)
    assert by_import == by_config == by_spec == (label in ("fix/a", "org/repo@v2", "a:b", "x" * 200))


@pytest.mark.parametrize("option, allowed", [
    ("ProxyCommand=touch", False), ("LocalCommand=touch", False), ("PermitLocalCommand=yes", False),
    ("KnownHostsCommand=touch", False), ("PKCS11Provider=/tmp/evil.so", False), ("ProxyJump=bastion", False),
    ("LocalForward=8080", False), ("ForwardAgent=yes", False), ("Include=/tmp/other", False),
    ("ConnectTimeout=5", True), ("StrictHostKeyChecking=accept-new", True), ("serveraliveinterval=30", True),
])
def test_ssh_options_are_an_allow_list(tmp_path, option, allowed):
    from ingest.runs.errors import SpecError
    from ingest.runs.spec import load_config

    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[hosts.gpu1]\nssh = "root@10.0.0.5"\nssh_options = ["{option}"]\n')
    if allowed:
        assert load_config(config).hosts["gpu1"].ssh_options == (option,)
    else:
        # (PKCS11Provider is refused by the Key=value pattern already: its name holds digits)
        with pytest.raises(SpecError, match="ssh_options: (.* not allowed: only options that run no command|must be)"):
            load_config(config)
