"""The Run a benchmark page (AppTest): the queue's live state from the fixture database, specs
refused in the form with parse_spec's reason, jobs queued (a range of a real git repository as
one job that the real worker expands into one per commit x variant x mode), a bad ref, a dead
host or a missing GPU queued and failed by the worker within seconds, shown in the job list,
and cancelling. The worker's execute_job runs each job here, in this process, on a claimed job:
the fixture's other queued job would otherwise be run too."""

import json
import os
import subprocess
import time

import pytest

from app.markdown_text import format_markdown
from db.store import open_db
from ingest.runs.spec import load_config
from ingest.runs.survival import process_stamp
from ingest.runs.worker import execute_job, worker_name
from ingest.traces.categories import load_rule_chain
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # AppTest pages


def _jobs(db) -> list[dict]:
    with open_db(db, read_only=True) as store:
        return store.list_jobs()


def _submit(at, **fields):
    """Fill the form's fields (by widget key) and press Queue."""
    for key, value in fields.items():
        if key in ("kv", "modes"):
            at.multiselect(key=key).set_value(value)
        elif key in ("every", "profile_steps", "repeat"):
            at.number_input(key=key).set_value(value)
        else:
            at.text_input(key=key).input(value)
    at.button(key="FormSubmitter:run_spec-Queue").click()
    return at.run()


def _failed(job_id: int, kind: str, reason: str) -> str:
    """The line the job list shows for a failed job (as Markdown: the reason's text escaped)."""
    return format_markdown("Job {} failed ({}): {}. Its log is below.", job_id, kind, reason)


def _work(db, job_id: int) -> tuple[str, float]:
    """Job `job_id` claimed and run to its end by the worker's execute_job, with the page's config
    ($STEPWATCH_CONFIG); (its status, the seconds from claim to end)."""
    config = load_config(os.environ.get("STEPWATCH_CONFIG"))
    started = time.monotonic()
    with open_db(db) as store:
        job = store.claim_job(worker_name(), job_id, worker_proc=process_stamp())
    status, _ = execute_job(str(db), job, config, load_rule_chain())
    return status, time.monotonic() - started


def test_the_queue_shows_running_waiting_and_finished_jobs(dashboard_db, open_page):
    at = open_page(dashboard_db, "run_benchmark")
    assert not at.exception
    cards = [m.value for m in at.markdown if m.value.startswith("**Job")]
    assert cards == ["**Job 4** · queued · reference tiny fused (waiting) on local/cpu",
                     "**Job 3** · running · reference tiny gather-then-cast on local/cpu"]
    assert at.get("progress")[0].proto.value == 21  # 5 of 23 steps
    assert "5 of 23 steps" in at.get("progress")[0].proto.text
    assert at.code[0].value.endswith("progress: timing 5/20")
    assert at.error[0].value == ("Job 2 failed (engine-error): kernels.bench exited with status 1. "
                                 "Its log is below.")
    finished = at.dataframe[0].value
    assert finished["status"].tolist() == ["failed", "succeeded"]
    assert finished["why"].tolist() == ["engine-error: kernels.bench exited with status 1", ""]  # not "nan: nan"
    assert finished["open"].tolist()[1].startswith("run?run=")
    at.selectbox(key="log_job").select(2).run()
    assert "RuntimeError: out of memory" in at.code[-1].value


@pytest.mark.parametrize("fields, reason", [
    ({"commits": "--output=x"}, "Not queued: spec.ref: '--output=x' looks like an option"),
    ({"kv": []}, "Not queued: variants: choose at least one KV strategy"),
    ({"modes": []}, "Not queued: execution: choose eager, CUDA graph or both"),
    ({"commits": "main..--x"}, "Not queued: ref: '--x' looks like an option"),  # a range's ends: spelling only
])
def test_invalid_input_is_refused_with_the_reason(writable_db, open_page, fields, reason):
    before = len(_jobs(writable_db))
    at = _submit(open_page(writable_db, "run_benchmark"), **fields)
    assert not at.exception
    assert at.error[0].value.startswith("Not queued: ") and reason in at.error[0].value
    assert len(_jobs(writable_db)) == before


def test_a_valid_spec_is_queued(writable_db, open_page):
    at = _submit(open_page(writable_db, "run_benchmark"), kv=["fused", "full-pool-cast"], profile_steps=2)
    assert not at.exception
    assert at.success[0].value.startswith("Queued 2 jobs (5, 6): reference tiny fused")
    queued = [j for j in _jobs(writable_db) if j["job_id"] in (5, 6)]
    assert {j["status"] for j in queued} == {"queued"}
    with open_db(writable_db, read_only=True) as store:
        spec = store.get_job(5)["spec"]
    assert '"kv": "fused"' in spec and '"profile_steps": 2' in spec and '"device": "cpu"' in spec


def _make_repo(tmp_path, commits: int = 4) -> tuple:
    """A git repository with `commits` commits on main; (its path, their shas oldest first)."""
    repo = tmp_path / "demo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git[:3], "init", "-q", "-b", "main"], check=True)
    for i in range(commits):
        (repo / "f").write_text(str(i))
        subprocess.run([*git, "add", "f"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"change {i}"], check=True)
    shas = subprocess.run([*git[:3], "rev-list", "--reverse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.split()
    return repo, shas


def test_a_range_queues_one_job_per_commit_and_variant(writable_db, open_page, tmp_path, monkeypatch):
    repo, shas = _make_repo(tmp_path)
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.demo]\npath = "{repo}"\n')
    monkeypatch.setenv("STEPWATCH_CONFIG", str(config))

    at = _submit(open_page(writable_db, "run_benchmark"), repo="demo", commits=f"{shas[0]}..main",
                 modes=["eager", "CUDA graph"])
    assert not at.exception
    assert at.success[0].value == format_markdown(
        "Queued job {}: {}; {} (below).", 5,
        f"reference tiny full-pool-cast, full-pool-cast+graph demo@{shas[0]}..main on local/cpu",
        "a worker lists the range's commits and queues 2 jobs at each")
    assert [j["job_id"] for j in _jobs(writable_db)][:1] == [5]  # the form ran no git: one job, no commits yet
    assert _work(writable_db, 5)[0] == "succeeded"
    with open_db(writable_db, read_only=True) as store:
        expanding = store.get_job(5)
        jobs = [store.get_job(j) for j in range(6, 12)]
        recorded = store.con.execute("SELECT c.sha, c.subject, c.seq FROM commits c JOIN repos r USING (repo_id)"
                                     " WHERE r.name = 'demo' ORDER BY c.seq").fetchall()
    assert expanding["label"].endswith(": queued 6 jobs (3 commits x 2 runs)")  # 3 commits x 1 KV x 2 modes
    specs = [json.loads(j["spec"]) for j in jobs]
    assert [(s["ref"], s["workload"]["cuda_graph"]) for s in specs] == [
        (shas[1], False), (shas[1], True), (shas[2], False), (shas[2], True), (shas[3], False), (shas[3], True)]
    assert {(s["repo"], s["repo_path"], s["workload"]["kv"]) for s in specs} == {("demo", None, "full-pool-cast")}
    assert [j["label"] for j in jobs][:2] == [f"reference tiny full-pool-cast demo@{shas[1]} on local/cpu",
                                              f"reference tiny full-pool-cast+graph demo@{shas[1]} on local/cpu"]
    assert {j["batch"] for j in jobs} == {expanding["batch"]} == {f"form reference {shas[0]}..main every 1"}
    assert {j["status"] for j in jobs} == {"queued"}
    assert recorded == [(shas[1], "change 1", 2), (shas[2], "change 2", 3), (shas[3], "change 3", 4)]


def test_a_range_in_a_checkout_the_page_cannot_see_is_queued_and_fails_in_the_worker(writable_db, open_page,
                                                                                     tmp_path, monkeypatch):
    """The form runs no git: a range in a repo whose path does not exist here is queued; the
    worker, which looks, fails it with the reason, and the job list shows it."""
    config = tmp_path / "stepwatch.toml"
    config.write_text('[repos.far]\npath = "/nonexistent/far"\n')
    monkeypatch.setenv("STEPWATCH_CONFIG", str(config))
    at = _submit(open_page(writable_db, "run_benchmark"), repo="far", commits="v1..v2", every=2)
    assert at.success[0].value.startswith(format_markdown("Queued job 5: {}", "reference tiny full-pool-cast "
                                                          "far@v1..v2 every 2 on local/cpu"))
    assert _work(writable_db, 5)[0] == "failed"
    at.run()
    assert at.error[0].value == _failed(5, "bad-spec", "repo /nonexistent/far: not a git checkout on host local")
    assert [j["job_id"] for j in _jobs(writable_db)][0] == 5  # nothing else queued


def test_a_range_whose_repo_the_config_does_not_name_is_refused_at_the_form(writable_db, open_page):
    at = _submit(open_page(writable_db, "run_benchmark"), commits="a..b", repo="elsewhere")
    assert at.error[0].value == format_markdown("Not queued: {}", (
        "spec.repo: 'elsewhere' is not in the config's [repos] (no config file): stepwatch runs code only from "
        "the repositories the config names (or, for the reference engine, leave it out or give 'stepwatch': this "
        "checkout)"))
    assert [j["job_id"] for j in _jobs(writable_db)][0] < 5  # nothing queued


def test_a_bad_ref_becomes_a_failed_job_within_seconds(writable_db, open_page):
    at = _submit(open_page(writable_db, "run_benchmark"), commits="no-such-ref-anywhere")
    assert at.success[0].value == format_markdown("Queued 1 job (5): {}",
                                                  "reference tiny full-pool-cast @no-such-ref-anywhere on local/cpu")
    status, seconds = _work(writable_db, 5)
    assert status == "failed" and seconds < 15, seconds  # no retry, no timeout waited for
    at.run()
    assert not at.exception
    reason = f"ref 'no-such-ref-anywhere': no such commit in {ROOT} on host local"
    assert at.error[0].value == _failed(5, "bad-spec", reason)
    finished = at.dataframe[0].value
    assert finished["why"].tolist()[0] == f"bad-spec: {reason}"
    assert {j["job_id"]: j["attempts"] for j in _jobs(writable_db)}[5] == 1


def test_an_unreachable_host_becomes_a_failed_job_within_seconds(writable_db, open_page, tmp_path, monkeypatch):
    config = tmp_path / "stepwatch.toml"
    config.write_text('[hosts.dead]\nssh = "nobody@127.0.0.1"\nport = 1\n')  # nothing listens on port 1
    monkeypatch.setenv("STEPWATCH_CONFIG", str(config))
    at = open_page(writable_db, "run_benchmark")
    at.selectbox(key="host").select("dead")
    at = _submit(at)
    assert at.success[0].value == "Queued 1 job (5): reference tiny full-pool-cast on dead/cpu"
    status, seconds = _work(writable_db, 5)
    assert status == "failed" and seconds < 15, seconds
    at.run()
    with open_db(writable_db, read_only=True) as store:
        reason = store.get_job(5)["error"]
    assert reason.startswith("host dead (nobody@127.0.0.1:1): unreachable: ") and "Connection refused" in reason
    assert at.error[0].value == _failed(5, "host-unreachable", reason)


def test_cancel_a_queued_job(writable_db, open_page):
    at = open_page(writable_db, "run_benchmark")
    at.button(key="cancel_4").click().run()
    assert not at.exception
    assert at.info[0].value == "Job 4: cancelled."
    assert {j["job_id"]: j["status"] for j in _jobs(writable_db)}[4] == "cancelled"
    at.button(key="cancel_3").click().run()
    assert at.info[0].value.startswith("Job 3: asked to stop")
    with open_db(writable_db, read_only=True) as store:
        assert store.get_job(3)["cancel_requested"]


def test_the_forms_numbers_are_bounded_as_specs_are(writable_db, open_page):
    """The browser keeps a number input within its bounds; they are WORKLOAD_MAXIMA, the limits
    every spec is checked against, so the form cannot ask for 100,000,000 profiled steps."""
    from ingest.runs.spec import WORKLOAD_MAXIMA

    at = open_page(writable_db, "run_benchmark")
    steps = at.number_input(key="profile_steps")
    assert (steps.min, steps.max) == (1, WORKLOAD_MAXIMA["profile_steps"]) == (1, 1000)
    at = _submit(at, profile_steps=1000)
    assert not at.exception and at.success[0].value.startswith("Queued 1 job")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU: nothing to refuse")
def test_a_cuda_run_on_a_host_without_cuda_fails_with_the_reason(writable_db, open_page):
    at = open_page(writable_db, "run_benchmark")
    at.radio(key="device").set_value("cuda")
    at = _submit(at)
    assert not at.exception
    assert at.success[0].value == "Queued 1 job (5): reference tiny full-pool-cast on local/cuda"
    assert _work(writable_db, 5)[0] == "failed"
    at.run()
    assert at.error[0].value == _failed(5, "bad-spec", "device cuda: host local has no CUDA device "
                                        "(torch.cuda.is_available() is False there): use device cpu, or a host with "
                                        "a GPU")


def test_the_import_engine_says_which_directories_it_may_read(writable_db, open_page, tmp_path, monkeypatch):
    """The form's import engine names the config's [imports] roots (or that none is set): a path outside
    them is refused when queued (tests/test_hardening_doors.py), and the form says so before."""
    at = open_page(writable_db, "run_benchmark")
    at.radio(key="engine").set_value("import").run()
    assert any("No [imports] roots are set in no config file" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    root = tmp_path / "traces"
    root.mkdir()
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[imports]\nroots = ["{root}"]\n')
    monkeypatch.setenv("STEPWATCH_CONFIG", str(config))
    at = open_page(writable_db, "run_benchmark")
    at.radio(key="engine").set_value("import").run()
    assert any(f"reads only under these directories ([imports] roots in {config}): {root}" in c.value
               for c in at.caption), [c.value for c in at.caption]


def test_the_forms_repeat_count_queues_each_job_that_many_times_in_rounds(writable_db, open_page):
    from ingest.limits import MAX_REPEATS

    at = open_page(writable_db, "run_benchmark")
    repeat = at.number_input(key="repeat")
    assert (repeat.min, repeat.max, repeat.value) == (1, MAX_REPEATS, 1) == (1, 30, 1)
    at = _submit(at, kv=["fused", "full-pool-cast"], profile_steps=2, repeat=2)
    assert not at.exception
    assert at.success[0].value.startswith("Queued 4 jobs (5, 6, 7, 8): reference tiny fused")
    with open_db(writable_db, read_only=True) as store:
        kvs = [json.loads(store.get_job(j)["spec"])["workload"]["kv"] for j in (5, 6, 7, 8)]
        batches = {store.get_job(j)["batch"] for j in (5, 6, 7, 8)}
    assert kvs == ["fused", "full-pool-cast", "fused", "full-pool-cast"]  # A B A B
    assert batches == {"form reference HEAD x 2 repeats"}
