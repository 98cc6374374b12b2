"""The reference engine on a remote host: the same spec run through a real sshd on 127.0.0.1
(started by scripts/start_sshd.sh) stages kernels/ there, runs it, and brings the bundle back
for this process to import. An unreachable host is refused before anything is queued. The sshd
is the session fixture `sshd` (tests/conftest.py)."""

import pytest

from db.store import open_db
from tests.helpers import run_cli, write_ssh_config

pytestmark = pytest.mark.slow  # the reference engine through a real sshd


def test_reference_run_over_ssh_lands_in_the_local_database(tmp_path, sshd):
    db = tmp_path / "s.duckdb"
    config = write_ssh_config(tmp_path, sshd)
    result = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--kv", "gather-then-cast",
                     "--device", "cpu", "--profile-steps", "2", "--host", "loop", "--config", config,
                     "--db", str(db))
    assert result.returncode == 0, result.stderr
    run_id = int(result.stdout.split()[-1])
    with open_db(db, read_only=True) as store:
        run = store.get_run(run_id)
        job = store.list_jobs()[0]
    assert run["variant"] == "gather-then-cast" and run["steps"] == 2 and run["layers"] == 4
    assert job["status"] == "succeeded" and "on loop/cpu" in job["label"]
    assert list((tmp_path / "remote").iterdir()) == []  # the remote scratch space was cleaned up


def test_an_unreachable_host_is_refused_before_queueing(tmp_path, sshd):
    db = tmp_path / "s.duckdb"
    config = write_ssh_config(tmp_path, sshd, port=1)  # nothing listens on port 1
    result = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--device", "cpu",
                     "--host", "loop", "--config", config, "--db", str(db))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "host loop" in lines[0] and "unreachable" in lines[0]
    assert not db.exists()
