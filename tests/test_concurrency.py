"""The app, a worker and CLI imports on one DuckDB file at the same time: no lock error reaches
anyone and no run is lost. Three kinds of real processes share the file: a worker running
queued jobs, a reader polling as the dashboard does, and `python -m ingest import` calls."""

import subprocess
import sys
import textwrap
import threading

import pytest

from db.store import open_db
from tests.helpers import DATA, ROOT, run_cli, wait_for

pytestmark = pytest.mark.slow  # a worker, imports and a reader, all real processes

# Reads as the dashboard does, printing the run count each read saw, until the test says the
# writers are done (the stop file); then reads once more, so that its last line is the final count.
READER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from db.store import open_db

    def read():
        # what each dashboard query does; patient, because this test is about lost or duplicated runs
        # and errors, not latency (a page's wait under writers is db/studies/load.py's benchmark's)
        with open_db({db!r}, read_only=True, wait_s=300) as store:
            store.list_jobs(limit=20)
            count = store.con.execute("SELECT count(*), avg(tok_per_s) FROM runs").fetchall()[0][0]
        print(count, flush=True)

    while not os.path.exists({stop!r}):
        read()
        time.sleep(0.05)  # a page polls; a loop with no pause would hold the file from the writers
    read()
""")


class Lines:
    """A process's stdout lines, collected as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(line.strip() for line in proc.stdout),
                                        daemon=True)
        self._thread.start()

    def wait_for_more(self, than: int, what: str) -> int:
        """The number of lines, once it is more than `than`; fails at once if the output ended."""
        def more() -> int:
            count = len(self.lines)
            assert count > than or self._thread.is_alive(), f"the process ended before {what}"
            return count if count > than else 0
        return wait_for(more, what)

    def join(self) -> list[str]:
        self._thread.join(timeout=300)
        return self.lines


def test_app_worker_and_imports_share_the_database(tmp_path):
    """The work is fixed (three queued jobs, one import per bundle) and so is the reading it must
    overlap: the reader reads once before any writer starts (no runs yet), then the worker starts,
    and each import starts only after the reader has made one more read; so at least one read per
    bundle falls while the writers work, however slow the machine. The test then waits for every
    writer and for the reader (no wall-clock bound)."""
    db = tmp_path / "shared.duckdb"
    jobs = [int(run_cli("ingest", "run", "--engine", "reference", "--preset", "tiny", "--kv", kv,
                        "--device", "cpu", "--profile-steps", "2", "--db", str(db), "--queue").stdout.split()[-1])
            for kv in ("full-pool-cast", "gather-then-cast", "fused")]
    stop = tmp_path / "writers-done"
    reader_log = tmp_path / "reader.err"
    with open(reader_log, "w") as err:
        reader = subprocess.Popen([sys.executable, "-c", READER.format(root=str(ROOT), db=str(db), stop=str(stop))],
                                  stdout=subprocess.PIPE, stderr=err, text=True)
    counts = Lines(reader)
    reads = counts.wait_for_more(0, "the reader's first read")
    worker = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--exit-when-idle",
                               "--poll-s", "0.1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    bundles = sorted((DATA / "bundles").iterdir())
    imports = []
    for b in bundles:
        reads = counts.wait_for_more(reads, "a read while the writers work")
        imports.append(subprocess.Popen([sys.executable, "-m", "ingest", "import", str(b), "--db", str(db)],
                                        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=600) + (p.returncode,) for p in imports]
    worker_out, _ = worker.communicate(timeout=600)
    stop.touch()
    reader.wait(timeout=600)
    reader_err = reader_log.read_text()
    seen = [int(c) for c in counts.join()]
    for out, err, code in results:
        assert code == 0, err
        assert "error" not in err.lower()
    assert worker.returncode == 0 and "error" not in worker_out.lower(), worker_out
    assert reader.returncode == 0, reader_err
    total = len(bundles) + len(jobs)
    # it kept reading while the others wrote: it saw the run count change (from none to all of
    # them), and never fall (no run it had seen was lost)
    assert seen[0] == 0 and seen[-1] == total and seen == sorted(seen), seen
    imported = [int(out.split()[-1]) for out, _, _ in results]  # each import prints its run id last
    with open_db(db, read_only=True) as store:
        statuses = [(j["job_id"], j["status"], j["error"], j["run_id"]) for j in store.list_jobs()]
        assert store.count_rows()["runs"] == total, (statuses, worker_out)
        assert [store.get_job(j)["status"] for j in jobs] == ["succeeded"] * 3
        made = imported + [store.get_job(j)["run_id"] for j in jobs]
        stored = [r for (r,) in store.con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    assert sorted(made) == stored, (imported, statuses)  # every run once: none lost, none made twice
