"""`python -m ingest compare A B` as real processes on a real DuckDB file: the sample bundles of the
glm5-serving-demo series (real H200 runs, two a commit: the whole-pool-cast regression at d445ae3,
its fix at bd182fd) and two of stepwatch's own commits measured once each. Each verdict is the
noise model's (ingest.regress.noise): the run is the sample, a commit pools its runs."""

import json
import shutil

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.slow  # imports 14 real bundles


@pytest.fixture(scope="module")
def samples_db(tmp_path_factory):
    from ingest.traces.categories import load_rule_chain
    from ingest.traces.samples import SAMPLE_DIR, load_samples

    root = tmp_path_factory.mktemp("compare")
    only = root / "samples"
    only.mkdir()
    for bundle in SAMPLE_DIR.iterdir():
        if bundle.is_dir() and (bundle.name.startswith("demo-") or bundle.name in (
                "b9bba77-glm5-fused-graph", "3bee539-glm5-fused-graph")):
            (only / bundle.name).symlink_to(bundle)
    shutil.copy(SAMPLE_DIR / "commits.json", only / "commits.json")
    db = root / "s.duckdb"
    assert load_samples(str(db), load_rule_chain(), only) == 14
    return db


def _compare(db, *args):
    out = run_cli("ingest", "compare", *args, "--db", str(db))
    return out, (json.loads(out.stdout) if "--json" in args and out.returncode in (0, 1) else None)


def test_the_regression_between_two_commits_pools_their_runs_and_fails_the_gate(samples_db):
    out, doc = _compare(samples_db, "05a3934", "d445ae3", "--repo", "glm5-serving-demo", "--json",
                        "--fail-on-regression")
    assert out.returncode == 1, out.stderr
    (c,) = doc["comparisons"]
    assert (c["verdict"], len(c["runs_a"]), len(c["runs_b"])) == ("regression", 2, 2)
    assert (c["spread_source"], c["spread_dof"]) == ("repeats", 6.0)  # 6 commits x 2 runs
    assert round(c["spread"], 3) == 0.028 and 8.0 < c["rel_change"] < 9.0 and c["ci_low"] > 7
    assert c["kernels"][0]["status"] == "added" and "direct_copy_kernel_cuda" in c["kernels"][0]["name"]
    assert any(k["status"] == "removed" and k["name"] == "_gather_cast_kernel" for k in c["kernels"])
    text, _ = _compare(samples_db, "bd182fd", "6806b21")  # the fix, read backwards: a regression, gate off
    assert text.returncode == 0 and "Regression: step time" in text.stdout and "2 and 2 runs" in text.stdout


def test_no_change_between_two_commits_of_one_code_path_is_not_changed(samples_db):
    out, doc = _compare(samples_db, "9317abc", "05a3934", "--json", "--fail-on-regression")
    assert out.returncode == 0, out.stderr
    (c,) = doc["comparisons"]
    # 2.8 % spread, 2 runs a side, 6 degrees of freedom: only a change over 21 % could be seen
    assert c["verdict"] == "too noisy" and round(c["min_detectable"], 2) == 0.21 and c["runs_needed"] == 9
    assert c["kernels"] == []  # within noise: no kernel "explains" a change


def test_two_runs_of_one_commit_are_a_repeat(samples_db):
    from db.store import open_db

    with open_db(samples_db, read_only=True) as store:
        a, b = (store.con.execute("SELECT r.run_id FROM runs r JOIN commits c USING (commit_id) WHERE "
                                  "starts_with(c.sha, '9317abc') ORDER BY r.run_id").fetchall())
    out, doc = _compare(samples_db, str(a[0]), str(b[0]), "--json")
    assert out.returncode == 0, out.stderr
    (c,) = doc["comparisons"]
    assert c["verdict"] == "repeat, within noise" and abs(c["rel_change"]) > 0.05  # 7.21 vs 7.88 ms: noise
    assert c["sentence"].startswith("Repeat, within noise: the same commit measured twice;")


def test_one_run_a_commit_and_no_history_is_not_enough_data(samples_db):
    out, doc = _compare(samples_db, "b9bba77", "3bee539", "--repo", "stepwatch", "--json", "--fail-on-regression")
    assert out.returncode == 0, out.stderr
    (c,) = doc["comparisons"]
    assert (c["verdict"], c["spread"], c["spread_source"], c["runs_needed"]) == ("not enough data", None, "none", 2)
    assert "run each commit 2 times" in c["sentence"]


@pytest.mark.parametrize("args, message", [
    (("99999", "1"), "A 99999: no run 99999 in this database"),
    (("1", "zz-top"), "B 'zz-top': neither a run id nor a commit sha (4 to 40 hex digits)"),
    (("abcdef0", "1"), "A abcdef0: no run measured a commit starting abcdef0"),
])
def test_bad_input_is_one_line_and_exit_2(samples_db, args, message):
    out, _ = _compare(samples_db, *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"stepwatch: error: {message}\n"


def test_run_and_backfill_take_a_repeat_count(tmp_path):
    from db.store import open_db
    from tests.helpers import git, kernels_repo

    db = tmp_path / "q.duckdb"
    out = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--device", "cpu", "--repeat", "3",
                  "--queue", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2", "3"]  # three jobs, each its own run when a worker takes it
    repo = tmp_path / "repo"
    kernels_repo(repo, "c1")
    for n in (2, 3):
        (repo / "note.txt").write_text(f"{n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"c{n}")
    shas = [git(repo, "rev-parse", f"main~{k}") for k in (2, 1, 0)]
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.demo]\npath = "{repo}"\n')
    out = run_cli("ingest", "backfill", "--repo", "demo", "--range", f"{shas[0]}..{shas[2]}", "--engine",
                  "reference", "--preset", "tiny", "--device", "cpu", "--repeat", "2", "--db", str(db),
                  "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert "x 2 repeats" in out.stderr
    with open_db(db, read_only=True) as store:
        refs = [json.loads(j["spec"])["ref"] for j in sorted(store.list_jobs(), key=lambda j: j["job_id"])
                if j["batch"] and j["batch"].startswith("backfill")]
    assert refs == [shas[1], shas[2], shas[1], shas[2]]  # rounds over the commits (A..B excludes A): interleaved
    bad = run_cli("ingest", "run", "--engine", "reference", "--device", "cpu", "--repeat", "0", "--db", str(db))
    assert bad.returncode == 2 and "--repeat: '0' must be positive" in bad.stderr
