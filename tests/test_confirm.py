"""Re-runs that confirm (issue 30, ingest/runs/confirm.py): a suspected change of runs the worker
can make again gets its last good and first bad commit re-run interleaved (A B A B) on the spec's
host, and is then confirmed or dismissed from all the runs pooled; imported runs stay suspected and
their card says why. Real worker processes, git, DuckDB and the reference engine (tiny preset,
CPU, one thread); the Regressions page through AppTest.

The changes are made by the code of the test's own repository (a copy of kernels/):
- confirmed: the second commit switches the fused KV path back to casting the whole pool (the
  bisect test's change): on this machine the tiny preset's step goes from about 7 to 70 ms, a
  change far beyond the 20-30 % that runs of the same code differ by here (ingest/regress/BENCHMARKS.md);
- dismissed: both commits hold the same code, whose decode step waits PLANTED_STEP_SLEEP_S
  seconds (0 when unset); the first bad commit's first run is made by a worker with 0.3 s set, a
  run disturbed as a host's burst of load disturbs one, deterministically. Its re-runs, without
  it, show the runs of both commits alike."""

import json

import pandas as pd
import pytest

from db.store import open_db
from db.views import list_changes
from ingest.limits import CONFIRM_PAIRS
from ingest.runs.survival import kept_bundle_path
from tests.helpers import git, kernels_repo, run_cli

pytestmark = pytest.mark.slow  # a worker with real runs

RUN_STEP = '        """Run one decode step (replaying the graph in CUDA-graph mode); return its output."""\n'
FUSED = "return gather_cast_fp8_to_bf16(pool, s.rows, s.n_active, out=self._kv_rows)"
WHOLE_POOL = "return pool.view(FP8).to(BF16)[s.rows]  # back to casting the whole pool"
SLEEP_FROM_ENV = ('        __import__("time").sleep(float(__import__("os").environ.get("PLANTED_STEP_SLEEP_S", "0")))'
                  '  # 0 unless a test disturbs a run\n')
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # steadier timings on a busy 2-core machine


def _two_commits(path, first_line: str | None, whole_pool: bool) -> list[str]:
    """A repository of kernels/ at two commits: the first may add a line to the decode step, the
    second switches the fused KV path to the whole-pool cast, or adds only a note."""
    workload = kernels_repo(path, "c1")
    text = workload.read_text()
    assert RUN_STEP in text
    if first_line:
        workload.write_text(text.replace(RUN_STEP, RUN_STEP + first_line))
        git(path, "commit", "-q", "-am", "c1: decode step")
    if whole_pool:
        assert FUSED in workload.read_text()
        workload.write_text(workload.read_text().replace(FUSED, WHOLE_POOL))
    else:
        (path / "note.txt").write_text("nothing but a note\n")
        git(path, "add", "-A")
    subject = ": fused KV path casts the whole pool again" if whole_pool else ": a note"
    git(path, "commit", "-q", "-am", "c2" + subject)
    return [git(path, "rev-parse", "main~1"), git(path, "rev-parse", "main")]


def _queue(db, config, sha):
    queued = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--kv", "fused", "--device", "cpu",
                     "--profile-steps", "2", "--repo", "planted", "--config", str(config), "--ref", sha,
                     "--db", str(db), "--queue")
    assert queued.returncode == 0, queued.stderr


def _work(db, config, env=None):
    worker = run_cli("ingest", "worker", "--db", str(db), "--config", str(config), "--exit-when-idle",
                     env={**ONE_THREAD, **(env or {})})
    assert worker.returncode == 0, worker.stdout + worker.stderr
    return worker.stdout


def _read(db):
    with open_db(db, read_only=True) as store:
        jobs = sorted(store.list_jobs(), key=lambda j: j["job_id"])
        confirmations = store.con.execute(
            "SELECT cf.state, cf.verdict, cf.host, cf.reruns, cf.batch, g.sha, b.sha FROM confirmations cf"
            " JOIN commits g ON g.commit_id = cf.last_good_commit_id"
            " JOIN commits b ON b.commit_id = cf.first_bad_commit_id").fetchall()
        return list_changes(store), jobs, confirmations


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory):
    """Two commits, the second casting the whole KV pool, each queued once; one worker until idle."""
    tmp = tmp_path_factory.mktemp("confirmed")
    shas = _two_commits(tmp / "repo", None, True)
    db, config = tmp / "s.duckdb", tmp / "stepwatch.toml"
    config.write_text(f'[repos.planted]\npath = "{tmp / "repo"}"\n')
    for sha in shas:
        _queue(db, config, sha)
    out = _work(db, config)
    return {"db": db, "shas": shas, "out": out, "tmp": tmp}


def test_a_suspected_change_of_spec_runs_is_rerun_interleaved_and_confirmed(confirmed):
    shas, out = confirmed["shas"], confirmed["out"]
    changes, jobs, confirmations = _read(confirmed["db"])
    # two single runs: no run-to-run spread, so the step-time change was only suspected, and the
    # worker queued its interleaved re-runs: A B A B on the spec's host, pinned to the two shas
    assert len(confirmations) == 1, confirmations
    state, verdict, host, reruns, batch, good, bad = confirmations[0]
    assert (good, bad, host, reruns) == (shas[0], shas[1], "local", 2 * CONFIRM_PAIRS)
    reruns_jobs = [j for j in jobs if j["batch"] == batch]
    assert [json.loads(j["spec"])["ref"] for j in reruns_jobs] == [shas[0], shas[1]] * CONFIRM_PAIRS
    assert all(j["status"] == "succeeded" for j in jobs) and len(jobs) == 2 + 2 * CONFIRM_PAIRS
    assert [j["job_id"] for j in reruns_jobs] == list(range(3, 3 + 2 * CONFIRM_PAIRS))  # queued after the two
    assert f"queued {2 * CONFIRM_PAIRS} interleaved re-runs on local" in out
    # judged from all runs pooled: 3 and 3, the spread from their repeats; confirmed
    assert (state, verdict) == ("confirmed", "regression")
    step = changes[changes["metric"] == "step_ms"].iloc[0]
    assert (step["last_good_sha"], step["first_bad_sha"], step["status"]) == (shas[0], shas[1], "confirmed")
    assert (step["runs_before"], step["runs_after"], step["noise_source"]) == (3, 3, "repeats")
    assert step["rel_change"] > 1.0  # the whole pool cast: several times the fused step
    assert (step["confirm_state"], step["confirm_reruns"], step["confirm_host"]) == ("confirmed", 4, "local")
    # no loop: the re-runs queued nothing more (no second window, no re-runs of re-runs)
    assert out.count("interleaved re-runs on") == 1


def test_the_card_says_how_it_was_confirmed(confirmed, open_page):
    at = open_page(confirmed["db"], "regressions")
    assert not at.exception
    captions = [c.value for c in at.caption]
    assert f"Confirmed by {2 * CONFIRM_PAIRS} interleaved re-runs on local." in captions
    assert at.markdown[0].value.startswith("**tok/s** :red[regression]")


def test_imported_runs_stay_suspected_and_the_card_says_why(confirmed, open_page):
    """The same two commits' first bundles, imported (no spec): the change stays suspected, and no
    worker can re-run it."""
    db, shas = confirmed["tmp"] / "imported.duckdb", confirmed["shas"]
    for job_id, sha in ((1, shas[0]), (2, shas[1])):
        bundle = kept_bundle_path(str(confirmed["db"]), job_id)  # where the worker kept the job's bundle
        done = run_cli("ingest", "import", str(bundle), "--repo", "planted", "--commit", sha,
                       "--repo-path", str(confirmed["tmp"] / "repo"), "--db", str(db))
        assert done.returncode == 0, done.stderr
    changes, jobs, confirmations = _read(db)
    step = changes[changes["metric"] == "step_ms"].iloc[0]
    assert (step["status"], step["first_bad_sha"]) == ("suspected", shas[1])
    assert pd.isna(step["first_bad_spec_engine"]) and confirmations == [] and jobs == []
    at = open_page(db, "regressions")
    assert not at.exception
    reason = "Suspected: imported runs cannot be re-run: run them with a spec to confirm."
    assert reason in [c.value for c in at.caption]


def test_a_suspected_change_of_the_same_code_is_dismissed_by_its_reruns(tmp_path, open_page):
    shas = _two_commits(tmp_path / "repo", SLEEP_FROM_ENV, False)
    db, config = tmp_path / "s.duckdb", tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.planted]\npath = "{tmp_path / "repo"}"\n')
    _queue(db, config, shas[1])
    _work(db, config, {"PLANTED_STEP_SLEEP_S": "0.3"})  # the disturbed run: the second commit's first
    _queue(db, config, shas[0])
    out = _work(db, config)  # the first commit, then the re-runs, undisturbed
    changes, jobs, confirmations = _read(db)
    assert f"queued {2 * CONFIRM_PAIRS} interleaved re-runs on local" in out
    assert len(confirmations) == 1 and len(jobs) == 2 + 2 * CONFIRM_PAIRS
    state, verdict, host, reruns, batch, good, bad = confirmations[0]
    assert (good, bad, host) == (shas[0], shas[1], "local")
    # 3 and 3 runs pooled: one slow run among the second commit's three is noise, not a change
    assert state == "dismissed" and verdict in ("within noise", "too noisy"), (state, verdict)
    assert changes[changes["metric"].isin(["step_ms", "tok_per_s"])].empty  # no change left standing
    at = open_page(db, "regressions")
    assert not at.exception
    lines = [c.value for c in at.caption]
    assert any("not confirmed by re-runs:" in line and "(4 interleaved re-runs on local)" in line
               for line in lines), lines
