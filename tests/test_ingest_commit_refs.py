"""`ingest import --commit REF` resolves the ref as the form does (HEAD~1, a tag, a short sha ->
the full sha, with its date, author, subject and first-parent order) when a checkout here holds
it, so a run never hangs off an orphan short-sha commit; a ref that cannot be resolved is one
line and exit 2, the database unchanged. A real git repository made in the test."""

import subprocess
from pathlib import Path

import duckdb

import pytest

from ingest.cli import main

pytestmark = pytest.mark.slow  # git and CLI processes

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "app" / "sample_data"


def _git_repo(path: Path) -> list[str]:
    """Three commits; their full shas, oldest first."""
    path.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=path, check=True, capture_output=True, text=True)  # noqa: E731
    run("init", "-q")
    for i, who in enumerate(("Ada", "Bo", "Cy")):
        run("-c", f"user.name={who}", "-c", "user.email=x@y", "commit", "-q", "--allow-empty", "-m", f"change {i}")
    return run("log", "--reverse", "--format=%H").stdout.split()


def _rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_refs_and_short_shas_become_the_full_commit(tmp_path, capsys):
    shas = _git_repo(tmp_path / "repo")
    db = tmp_path / "s.duckdb"
    common = ["--db", str(db), "--repo", "planted", "--repo-path", str(tmp_path / "repo")]
    assert main(["import", str(SAMPLES / "3bee539-glm5-fused-graph"), *common, "--commit", "HEAD~1"]) == 0
    assert main(["import", str(SAMPLES / "3cf1671-glm5-fused-eager"), *common, "--commit", shas[1][:7]]) == 0
    assert _rows(db, "SELECT sha, subject, author, seq FROM commits") == [(shas[1], "change 1", "Bo", 2)]
    assert _rows(db, "SELECT count(*), count(DISTINCT commit_id) FROM runs") == [(2, 1)]


def test_a_ref_that_cannot_be_resolved_is_one_line(tmp_path, capsys):
    _git_repo(tmp_path / "repo")
    db = tmp_path / "s.duckdb"
    assert main(["samples", "--db", str(db)]) == 0
    before = _rows(db, "SELECT count(*) FROM runs") + _rows(db, "SELECT count(*) FROM commits")
    capsys.readouterr()
    bundle = str(SAMPLES / "3bee539-glm5-fused-graph")
    cases = {
        ("--repo", "planted", "--repo-path", str(tmp_path / "repo"), "--commit", "nosuch"):
            f"stepwatch: error: --commit 'nosuch': no such commit in --repo-path {tmp_path / 'repo'}",
        ("--repo", "other", "--commit", "HEAD~1"):
            "stepwatch: error: --commit 'HEAD~1': a ref needs a checkout to resolve it in (--repo-path); a commit "
            "kept as given must be a label: use letters, digits and ._+/@=:- (not starting with '-')",
    }
    for flags, line in cases.items():
        assert main(["import", bundle, "--db", str(db), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [line]
    assert _rows(db, "SELECT count(*) FROM runs") + _rows(db, "SELECT count(*) FROM commits") == before
