"""The dashboard's fixture database: a real DuckDB file built by the real migrations from the
real bundles (app/sample_data: glm5 on the H200 at three commits; tests/data/bundles: the tiny
preset) and one CPU-only trace without a commit, plus a job in each state; two more real glm5
bundles at two commits of a test repository plant a KV-strategy regression, and the changes are
detected and stored by the real tracker, as the worker does after each job. tests/conftest.py
registers the fixtures on it once for every module: `dashboard_db` (built once a session),
`writable_db` (a copy for tests that write) and `open_page` (an AppTest of one page); the tests
import `find_run_id` and the bundles' names from here, and tests/test_app_fixtures.py checks what
the database holds."""

from __future__ import annotations

import json
from pathlib import Path

from db.store import open_db
from ingest.runs.spec import parse_spec
from ingest.runs.track import track_changes
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from tests.helpers import DATA, ROOT

SAMPLES = ROOT / "app" / "sample_data"
# the sample bundles the expected figures are about: glm5 at three commits (each KV strategy under
# CUDA graphs, and eager at the last); bundles added to app/sample_data later are left out
FIXTURE_COMMITS = ("b9bba77", "3bee539", "3cf1671")
# the tiny preset on the H200 (each KV strategy, eager and graph, with and without stacks), and
# two glm5 bundles that are sample bundles again (imported once: same content hash)
TEST_BUNDLES = [DATA / "bundles" / f"{preset}-{kv}-{mode}{stack}" for preset, kv, mode, stack in (
    [("tiny", kv, mode, stack) for kv in ("full-pool-cast", "fused") for mode in ("eager", "graph")
     for stack in ("-nostack", "-stack")] + [("glm5", "full-pool-cast", "graph", ""), ("glm5", "fused", "graph", "")])]
# the test repository of a planted KV-strategy regression: (bundle, first-parent seq, subject)
KV_REPO = "kv-regression-demo"
KV_REGRESSION = (("fe3ea75-glm5-fused-graph", 1, "decode: read the KV pool with the fused gather-cast kernel"),
                 ("fe3ea75-glm5-full-pool-cast-graph", 4, "decode: switch the KV strategy back to full-pool-cast"))
KV_REGRESSION_SHAS = ("1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d", "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c")
CPU_TRACE = DATA / "traces" / "cpu_small.trace.json"
JOB_BUNDLE = DATA / "bundles" / "tiny-fused-graph-nostack"  # the run a succeeded job made
RUNNING_LOG = "progress: timing 3/20\nprogress: timing 4/20\nprogress: timing 5/20\n"


def import_kv_regression(store, rules) -> None:
    """A regression of the KV strategy at a commit of a test repository: the real H200 glm5
    CUDA-graph bundles of fe3ea75 (left out of the stepwatch series above), the fused one at the
    first commit and the full-pool-cast one at the second, both as variant `main` (the series'
    one configuration), with two commits between them that no run measured. Real traces at two
    commits; only the repository and its commits are made up. (The eager bundles of 3cf1671
    cannot be used: a trace is imported once, and they are already in the stepwatch series.)"""
    for (name, seq, subject), sha in zip(KV_REGRESSION, KV_REGRESSION_SHAS):
        store.insert_run(prepare_import(SAMPLES / name, rules,
                                        ImportOptions(repo=KV_REPO, commit=sha, variant="main")))
        store.record_commit(KV_REPO, sha, f"2026-12-0{seq}T09:00:00+00:00", "Regression Tester", subject, seq)


def _spec_json(kv: str) -> str:
    return parse_spec({"engine": "reference", "device": "cpu",
                       "workload": {"preset": "tiny", "kv": kv, "profile_steps": 2}}).to_json()


def build_dashboard_db(path: Path) -> Path:
    rules = load_rule_chain()
    with open_db(path) as store:
        for bundle in sorted(p for p in SAMPLES.iterdir() if p.is_dir() and p.name.startswith(FIXTURE_COMMITS)):
            store.insert_run(prepare_import(bundle, rules, ImportOptions()))
        facts = json.loads((SAMPLES / "commits.json").read_text())["repos"][0]  # stepwatch's own commits
        for c in (c for c in facts["commits"] if c["sha"].startswith(FIXTURE_COMMITS)):
            store.record_commit(facts["repo"], c["sha"], c["committed_at"], c["author"], c["subject"], c["seq"])

        import_kv_regression(store, rules)

        done = store.enqueue_job(_spec_json("fused"), "reference tiny fused on local/cpu", "b1")
        store.claim_job("testhost:1")
        for bundle in TEST_BUNDLES:
            opts = ImportOptions(job_id=done) if bundle == JOB_BUNDLE else ImportOptions()
            run_id, _ = store.insert_run(prepare_import(bundle, rules, opts))
            if bundle == JOB_BUNDLE:
                store.finish_job(done, "succeeded", run_id=run_id, log="progress: profile 3/3\nbundle written\n")
        store.insert_run(prepare_import(CPU_TRACE, rules, ImportOptions()))

        failed = store.enqueue_job(_spec_json("full-pool-cast"), "reference tiny full-pool-cast on local/cpu", "b2")
        store.claim_job("testhost:1")
        store.finish_job(failed, "failed", error_kind="engine-error",
                         error="kernels.bench exited with status 1", log="Traceback ...\nRuntimeError: out of memory\n")
        running = store.enqueue_job(_spec_json("gather-then-cast"), "reference tiny gather-then-cast on local/cpu",
                                    "b3")
        store.claim_job("testhost:1")
        store.report_progress(running, steps_done=5, steps_planned=23, log_tail=RUNNING_LOG)
        store.enqueue_job(_spec_json("fused"), "reference tiny fused (waiting) on local/cpu", "b3")
        track_changes(store)  # what the worker does after each job: detect and store the changes
    return path


def find_run_id(db: Path, source_name: str) -> int:
    """The run imported from the bundle or trace with this directory or file name."""
    with open_db(db, read_only=True) as store:
        return store.con.execute("SELECT run_id FROM runs WHERE source_path LIKE '%/' || ?",
                                 [source_name]).fetchone()[0]

