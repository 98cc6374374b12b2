"""The app, a worker and CLI imports on one DuckDB file at the same time: no lock error reaches
anyone and no run is lost. Three kinds of real processes share the file: a worker running
queued jobs, a reader polling as the dashboard does, and `python -m ingest import` calls."""

import subprocess
import sys
import textwrap

from db.store import open_db
from tests.helpers import DATA, ROOT, run_cli

# Reads as the dashboard does until the test says the writers are done (the stop file), then
# prints how many reads it made and how many different run counts it saw: bounded by the work
# the writers do, not by a number of seconds that a loaded machine may not honour.
READER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from db.store import open_db
    reads, seen = 0, set()
    while not os.path.exists({stop!r}):
        # what each dashboard query does; patient, because this test is about lost or duplicated runs
        # and errors, not latency (a page's wait under writers is ingest/regress's benchmark's)
        with open_db({db!r}, read_only=True, wait_s=300) as store:
            store.list_jobs(limit=20)
            seen.add(store.con.execute("SELECT count(*), avg(tok_per_s) FROM runs").fetchall()[0][0])
        reads += 1
        time.sleep(0.05)  # a page polls; a loop with no pause would hold the file from the writers
    print(reads, len(seen))
""")


def test_app_worker_and_imports_share_the_database(tmp_path):
    db = tmp_path / "shared.duckdb"
    jobs = [int(run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--kv", kv,
                        "--device", "cpu", "--profile-steps", "2", "--db", str(db), "--queue").stdout.split()[-1])
            for kv in ("full-pool-cast", "gather-then-cast", "fused")]
    worker = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--exit-when-idle",
                               "--poll-s", "0.1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    stop = tmp_path / "writers-done"
    reader = subprocess.Popen([sys.executable, "-c", READER.format(root=str(ROOT), db=str(db), stop=str(stop))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    bundles = sorted((DATA / "bundles").iterdir())
    imports = [subprocess.Popen([sys.executable, "-m", "ingest", "import", str(b), "--db", str(db)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b in bundles]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in imports]
    worker_out, _ = worker.communicate(timeout=300)
    stop.touch()
    reader_out, reader_err = reader.communicate(timeout=300)
    for out, err, code in results:
        assert code == 0, err
        assert "error" not in err.lower()
    assert worker.returncode == 0 and "error" not in worker_out.lower(), worker_out
    assert reader.returncode == 0, reader_err
    reads, counts_seen = map(int, reader_out.split())
    # it kept reading while the others wrote: it saw the run count change, however slow the machine
    assert counts_seen >= 2 and reads >= counts_seen, reader_out
    with open_db(db, read_only=True) as store:
        statuses = [(j["job_id"], j["status"], j["error"], j["run_id"]) for j in store.list_jobs()]
        assert store.count_rows()["runs"] == len(bundles) + len(jobs), (statuses, worker_out)
        assert [store.get_job(j)["status"] for j in jobs] == ["succeeded"] * 3
