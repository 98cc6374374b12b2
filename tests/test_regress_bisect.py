"""Automatic bisection on a real git repository: eight commits of stepwatch's kernels/, where the
fifth switches the fused KV path back to casting the whole pool (the seeds' regression). Only
the first and last commits are queued; the worker's change tracking finds the cast kernel that
appears between them (a count: exact, so confirmed without repeats) and bisects to the planted
commit. The step time, single CPU runs on a loaded host at first, has no run-to-run spread: its
change is suspected, so the worker re-runs the two commits interleaved (A B A B, ingest/runs/
confirm.py) and judges it from the pooled runs: the whole-pool cast makes the tiny preset's step
about 10x slower here (7 -> 70 ms), which the re-runs confirm, and the bisect steps after it are
judged with the spread those repeats give. Real processes, git, DuckDB; tiny preset, CPU."""

import json
import re

import pytest

from db.store import open_db
from db.views import list_changes
from ingest.limits import CONFIRM_PAIRS
from tests.helpers import git, kernels_repo, run_cli

pytestmark = pytest.mark.slow  # a worker bisecting with real runs

FUSED = "return gather_cast_fp8_to_bf16(pool, s.rows, s.n_active, out=self._kv_rows)"
WHOLE_POOL = "return pool.view(FP8).to(BF16)[s.rows]  # back to casting the whole pool"


def _make_repo(path):
    workload = kernels_repo(path, "c1")
    for n in range(2, 9):
        if n == 5:
            text = workload.read_text()
            assert FUSED in text
            workload.write_text(text.replace(FUSED, WHOLE_POOL))
        else:
            (path / f"note{n}.txt").write_text(f"commit {n}\n")
            git(path, "add", "-A")
        git(path, "commit", "-q", "-am", f"c{n}" + (": fused KV path casts the whole pool again" if n == 5 else ""))
    return [git(path, "rev-parse", f"main~{8 - n}") for n in range(1, 9)]


def test_worker_bisects_to_the_planted_commit(tmp_path):
    repo = tmp_path / "repo"
    shas = _make_repo(repo)
    db = tmp_path / "s.duckdb"
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.planted]\npath = "{repo}"\n')  # code runs only from a repo the config names
    for sha in (shas[0], shas[-1]):
        queued = run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--kv", "fused",
                         "--device", "cpu", "--profile-steps", "2", "--repo", "planted", "--config", str(config),
                         "--ref", sha, "--db", str(db), "--queue")
        assert queued.returncode == 0, queued.stderr
    # one CPU thread each: steadier timings on a busy 2-core machine
    worker = run_cli("ingest", "worker", "--db", str(db), "--config", str(config), "--exit-when-idle",
                     env={"OMP_NUM_THREADS": "1"})
    assert worker.returncode == 0, worker.stdout
    with open_db(db, read_only=True) as store:
        changes = list_changes(store)
        jobs = store.list_jobs()
    # the whole-pool cast appears at c5: 4 calls per step (one per layer) from _fetch_kv
    line = next(i for i, text in enumerate((repo / "kernels" / "workload.py").read_text().splitlines(), 1)
                if text.strip().startswith("def _fetch_kv("))  # torch names frames by their def line
    key = f"kernel:calls_per_step:aten::copy_\x1faten::copy_\x1fkernels/workload.py({line}): _fetch_kv"
    cast = changes[changes["metric"] == key].iloc[0]
    assert (cast["last_good_sha"], cast["first_bad_sha"]) == (shas[3], shas[4])  # c4 good, c5 bad
    assert (cast["before_value"], cast["after_value"]) == (0.0, 4.0)
    assert cast["first_bad_subject"] == "c5: fused KV path casts the whole pool again"
    assert cast["commits_between"] == 0
    bisect_jobs = [j for j in jobs if (j["batch"] or "").startswith("bisect ")]
    assert all(j["status"] == "succeeded" for j in bisect_jobs)
    # c4, c6, c5 (log2 of the six commits between, as git bisect): only confirmed changes are
    # bisected (ingest.regress.noise), so a noisy CPU timing of single runs opens no extra window
    assert len(bisect_jobs) == 3, [j["label"] for j in bisect_jobs]
    assert re.search(r"first bad commit \w+ isolated after 3 bisect run\(s\)", worker.stdout)
    # the cast's kernel is one fact of the event at c5: "added", never an improvement or regression
    assert cast["direction"] == "added" and cast["status"] == "confirmed"
    # the step time: the first two single runs gave no spread (suspected), so their commits were
    # re-run interleaved on the spec's host before anything was said about speed
    reruns = [j for j in sorted(jobs, key=lambda j: j["job_id"]) if (j["batch"] or "").startswith("confirm ")]
    assert [json.loads(j["spec"])["ref"] for j in reruns] == [shas[0], shas[-1]] * CONFIRM_PAIRS
    assert all(j["status"] == "succeeded" for j in reruns)
    assert worker.stdout.count("interleaved re-runs on local") == 1  # one window re-run; no re-runs of re-runs
    # the change the workload really makes: the whole-pool cast, confirmed at c5 (bisected with the
    # spread the re-runs' repeats give), a regression of both tok/s and step time, several-fold
    speed = changes[changes["metric"].isin(["tok_per_s", "step_ms"])]
    assert set(speed["status"]) == {"confirmed"} and set(speed["direction"]) == {"regression"}
    assert set(speed["first_bad_sha"]) == {shas[4]} and set(speed["last_good_sha"]) == {shas[3]}
    step = speed[speed["metric"] == "step_ms"].iloc[0]
    assert step["rel_change"] > 1.0 and step["noise_source"] == "repeats"
    # the CI gate over the same history: Markdown, the event at c5 with its kernel added; the
    # confirmed tok/s and step-time regression fails --fail-on-regression
    check = run_cli("ingest", "check", "--repo", "planted", "--repo-path", str(repo), "--range",
                    f"{shas[0]}..{shas[-1]}", "--db", str(db), "--fail-on-regression")
    assert check.returncode == 1, check.stdout + check.stderr
    assert check.stdout.startswith(f"## stepwatch check `{shas[0]}..{shas[-1]}`")
    assert "**2 confirmed regression(s)** of tok/s or step time" in check.stdout
    assert f"`{shas[4][:12]}` c5: fused KV path casts the whole pool again" in check.stdout
    assert "copy_ added" in check.stdout  # the cast (aten::copy_), inside its event's row
    # the confirmed regression's diagnosis names what the workload really does there: the whole pool cast
    assert "7.08 MB per call is the whole 4,096 x 576 FP8 KV pool of a layer" in check.stdout
    clean = run_cli("ingest", "check", "--repo", "planted", "--repo-path", str(repo), "--range",
                    f"{shas[0]}..{shas[3]}", "--db", str(db), "--fail-on-regression")
    # before the planted commit nothing changed in the code: nothing confirmed, no kernel appears or goes
    assert clean.returncode == 0, clean.stdout
    assert "**0 confirmed regression(s)**" in clean.stdout or "No change in any series" in clean.stdout
    assert " added" not in clean.stdout and " removed" not in clean.stdout
