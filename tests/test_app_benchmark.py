"""The Run a benchmark page (AppTest): the queue's live state from the fixture database, specs
refused in the form with parse_spec's reason, jobs queued (one per commit x variant x mode for a
range of a real git repository), and cancelling."""

import json
import subprocess

import pytest

from db.store import open_db


def _jobs(db) -> list[dict]:
    with open_db(db, read_only=True) as store:
        return store.list_jobs()


def _submit(at, **fields):
    """Fill the form's fields (by widget key) and press Queue."""
    for key, value in fields.items():
        if key in ("kv", "modes"):
            at.multiselect(key=key).set_value(value)
        elif key in ("every", "profile_steps"):
            at.number_input(key=key).set_value(value)
        else:
            at.text_input(key=key).input(value)
    at.button(key="FormSubmitter:run_spec-Queue").click()
    return at.run()


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
    ({"commits": "no-such-ref-anywhere"}, "no-such-ref-anywhere"),
    ({"commits": "a..b", "repo": "elsewhere"}, "Not queued: commits: the range 'a..b' needs a repo"),
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


def test_a_range_queues_one_job_per_commit_and_variant(writable_db, open_page, tmp_path, monkeypatch):
    repo = tmp_path / "demo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git[:3], "init", "-q", "-b", "main"], check=True)
    for i in range(4):
        (repo / "f").write_text(str(i))
        subprocess.run([*git, "add", "f"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"change {i}"], check=True)
    shas = subprocess.run([*git[:3], "rev-list", "--reverse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.split()
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[repos.demo]\npath = "{repo}"\n')
    monkeypatch.setenv("STEPWATCH_CONFIG", str(config))

    at = _submit(open_page(writable_db, "run_benchmark"), repo="demo", commits=f"{shas[0]}..main",
                 modes=["eager", "CUDA graph"])
    assert not at.exception
    assert at.success[0].value.startswith("Queued 6 jobs (5, 6, 7, 8, 9, 10)")  # 3 commits x 1 KV x 2 modes
    with open_db(writable_db, read_only=True) as store:
        specs = [store.get_job(j)["spec"] for j in range(5, 11)]
        recorded = store.con.execute("SELECT c.sha, c.subject, c.seq FROM commits c JOIN repos r USING (repo_id)"
                                     " WHERE r.name = 'demo' ORDER BY c.seq").fetchall()
    assert [(json.loads(s)["ref"], json.loads(s)["workload"]["cuda_graph"]) for s in specs] == [
        (shas[1], False), (shas[1], True), (shas[2], False), (shas[2], True), (shas[3], False), (shas[3], True)]
    assert recorded == [(shas[1], "change 1", 2), (shas[2], "change 2", 3), (shas[3], "change 3", 4)]


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
def test_a_cuda_run_on_a_host_without_cuda_is_refused(writable_db, open_page):
    before = len(_jobs(writable_db))
    at = open_page(writable_db, "run_benchmark")
    at.radio(key="device").set_value("cuda")
    at = _submit(at)
    assert not at.exception
    assert at.error[0].value == ("Not queued: device cuda: host local has no CUDA device (torch.cuda.is_available() "
                                 "is False there): use device cpu, or a host with a GPU")
    assert len(_jobs(writable_db)) == before
