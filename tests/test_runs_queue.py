"""What the dashboard's form queues, as the real worker takes it: a range job expands into the
specs `python -m ingest backfill` queues (same order, labels, repo and commits), and a bad ref,
an unreachable host or a range on an unreachable host fails within seconds, with one line that
names it, on its first attempt, and the open Run a benchmark page shows it without a reload.
Real parts: a DuckDB file made by the migrations, git repositories made here, the worker as a
subprocess (`python -m ingest worker`) or its execute_job on a claimed job, the dashboard as
./run.sh serves it in headless chromium; ssh is the system client, refused at once by
127.0.0.1 port 1."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from app.job_form import FormInput, plan_jobs
from db.store import open_db
from ingest.runs.spec import Config, load_config
from ingest.runs.survival import process_stamp
from ingest.runs.worker import execute_job, worker_name
from ingest.traces.categories import load_rule_chain
from tests.browser import CHROMIUM, CHROMIUM_ARGS, free_port, need_browser, start_streamlit, wait_http
from tests.helpers import ROOT, run_cli, wait_for

pytestmark = pytest.mark.slow  # a worker process, git repositories and a browser

TINY = {"preset": "tiny", "profile_steps": 2}


def _make_repo(path, commits: int = 3):
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "-C", str(path), "init", "-q", "-b", "main"], check=True, env=env)
    for i in range(commits):
        (path / "f").write_text(str(i))
        subprocess.run(["git", "-C", str(path), "add", "f"], check=True, env=env)
        subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", f"change {i}"], check=True, env=env)
    return path


def _queue(db, form: FormInput, config: Config) -> list[int]:
    """Queue the form's plan as the page does."""
    plan = plan_jobs(form, config)
    with open_db(db) as store:
        return [store.enqueue_job(spec_json, label, plan.batch) for spec_json, label in plan.jobs]


def _specs_and_labels(db, statuses=("queued",)) -> list[tuple[str, str]]:
    with open_db(db, read_only=True) as store:
        return [(j["spec"], j["label"]) for j in reversed(store.list_jobs(statuses))]


def test_a_range_job_expands_into_the_specs_backfill_queues(tmp_path):
    repo = _make_repo(tmp_path / "bench", commits=4)
    config_path = tmp_path / "stepwatch.toml"
    config_path.write_text(f'[repos.bench]\npath = "{repo}"\n')  # code runs only from a repo the config names
    config = load_config(config_path)
    backfilled, formed = tmp_path / "backfill.duckdb", tmp_path / "form.duckdb"
    result = run_cli("ingest", "backfill", "--repo", "bench", "--range", "main~2..main", "--engine", "reference",
                     "--preset", "tiny", "--kv", "fused", "--device", "cpu", "--profile-steps", "2",
                     "--db", str(backfilled), "--config", str(config_path))
    assert result.returncode == 0, result.stderr

    (job_id,) = _queue(formed, FormInput("reference", repo="bench", commits="main~2..main", variants=("fused",),
                                         workload=TINY), config)
    with open_db(formed) as store:
        job = store.claim_job(worker_name(), job_id, worker_proc=process_stamp())
    assert execute_job(str(formed), job, config, load_rule_chain()) == ("succeeded", None)

    expected = _specs_and_labels(backfilled)
    assert len(expected) == 2 and _specs_and_labels(formed) == expected
    assert {(json.loads(spec)["repo"], json.loads(spec)["repo_path"]) for spec, _ in expected} == {("bench", None)}
    query = "SELECT c.sha, c.seq, c.subject FROM commits c JOIN repos r USING (repo_id) WHERE r.name = 'bench'"
    with open_db(backfilled, read_only=True) as a, open_db(formed, read_only=True) as b:
        assert b.con.execute(query + " ORDER BY seq").fetchall() == a.con.execute(query + " ORDER BY seq").fetchall()
        assert b.get_job(job_id)["label"].endswith(": queued 2 jobs (2 commits x 1 run)")


def test_bad_refs_and_dead_hosts_fail_within_seconds_in_a_running_worker(tmp_path):
    db = tmp_path / "s.duckdb"
    config_path = tmp_path / "stepwatch.toml"
    config_path.write_text('[hosts.dead]\nssh = "nobody@127.0.0.1"\nport = 1\n'  # nothing listens on port 1
                           f'[repos.bench]\npath = "{_make_repo(tmp_path / "bench")}"\n')
    config = load_config(config_path)
    worker = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--config", str(config_path)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: db.exists(), "the worker's first poll", 120)
        seconds, rows = {}, {}
        for name, form in [
            ("bad ref", FormInput("reference", commits="no-such-ref", variants=("fused",), workload=TINY)),
            ("dead host", FormInput("reference", host="dead", variants=("fused",), workload=TINY)),
            ("range on a dead host", FormInput("reference", host="dead", repo="bench", commits="main~1..main",
                                               variants=("fused",), workload=TINY)),
        ]:
            started = time.monotonic()
            (job_id,) = _queue(db, form, config)
            rows[name] = wait_for(lambda: _find_finished(db, job_id), f"job {job_id} ({name}) to end", 120)
            seconds[name] = time.monotonic() - started
    finally:
        worker.terminate()
        output = worker.communicate(timeout=60)[0]
    print({name: f"{s:.1f} s" for name, s in seconds.items()})
    assert all(s < 15 for s in seconds.values()), (seconds, output)
    assert {name: (r["status"], r["error_kind"], r["attempts"]) for name, r in rows.items()} == {
        "bad ref": ("failed", "bad-spec", 1), "dead host": ("failed", "host-unreachable", 1),
        "range on a dead host": ("failed", "host-unreachable", 1)}
    assert rows["bad ref"]["error"] == f"ref 'no-such-ref': no such commit in {ROOT} on host local"
    for name in ("dead host", "range on a dead host"):
        assert rows[name]["error"].startswith("host dead (nobody@127.0.0.1:1): unreachable: ")
        assert "Connection refused" in rows[name]["error"]
    with open_db(db, read_only=True) as store:
        assert len(store.list_jobs()) == 3  # the failed range queued nothing


def _find_finished(db, job_id: int) -> dict | None:
    with open_db(db, read_only=True) as store:
        job = store.get_job(job_id, with_log=False)
    return job if job["status"] not in ("queued", "running") else None


def test_the_open_page_shows_a_bad_refs_failure_without_a_reload(tmp_path):
    need_browser()
    from playwright.sync_api import sync_playwright

    db = tmp_path / "stepwatch.duckdb"
    env = {**os.environ, "STEPWATCH_DB": str(db), "PYTHONUNBUFFERED": "1"}
    env.pop("STEPWATCH_CONFIG", None)
    worker = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    port = free_port()
    app = start_streamlit(env, port)
    try:
        wait_for(lambda: db.exists(), "the worker's first poll", 120)
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 300, app)
        with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="stepwatch-chromium-") as profile:
            context = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True,
                                                           args=CHROMIUM_ARGS)
            context.set_default_timeout(120_000)
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{port}/run_benchmark")
            page.get_by_role("button", name="Queue").wait_for()
            page.get_by_label("Commit or range").fill("no-such-ref")
            clicked = time.monotonic()
            page.get_by_role("button", name="Queue").click()
            page.get_by_text(re.compile(r"Queued 1 job \(1\)")).wait_for()
            page.get_by_text(re.compile(r"Job 1 failed \(bad-spec\)")).wait_for(timeout=60_000)  # the list's refresh
            seconds = time.monotonic() - clicked
            text = page.locator("body").inner_text()
            context.close()
    finally:
        for proc in (app, worker):
            proc.terminate()
            proc.wait(timeout=30)
    print(f"bad ref -> failed job shown in the open page: {seconds:.1f} s")
    assert "no such commit" in text and seconds < 15, (seconds, text)
