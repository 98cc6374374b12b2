"""Empty and error states (AppTest): no runs yet, no database file, a database another process
holds. Each page says so in a sentence; none shows a traceback."""

import subprocess
import sys

import pytest

from db.store import open_db

pytestmark = pytest.mark.slow  # AppTest pages

PAGES = ["trends", "run", "compare", "regressions", "run_benchmark"]
EMPTY_SENTENCES = {
    "trends": "No runs yet. Start one on the Run a benchmark page, or import a trace with",
    "run": "No runs yet. Start one on the Run a benchmark page, or import a trace with",
    "compare": "Comparing needs two runs; this database has fewer.",
    "regressions": "No confirmed change yet: changes are looked for once a series has runs at two or more commits, "
                   "and none has yet.",
}


@pytest.fixture
def empty_db(tmp_path):
    path = tmp_path / "empty.duckdb"
    with open_db(path):
        pass
    return path


@pytest.mark.parametrize("page", PAGES)
def test_no_runs_yet(empty_db, open_page, page):
    at = open_page(empty_db, page)
    assert not at.exception
    if page == "run_benchmark":
        assert [c.value for c in at.caption][-1] == "No jobs yet."
    else:
        assert at.info[0].value.startswith(EMPTY_SENTENCES[page])


@pytest.mark.parametrize("page", PAGES)
def test_no_database_file(tmp_path, open_page, page):
    missing = tmp_path / "nowhere.duckdb"
    at = open_page(missing, page)
    assert not at.exception
    assert at.warning[0].value.startswith(f"There is no database at {missing} yet. Start stepwatch with ./run.sh")
    assert not missing.exists()  # the dashboard only reads: it never creates one


@pytest.fixture
def held_db(dashboard_db, tmp_path, monkeypatch):
    """A copy of the fixture database that another process (a stand-in for a worker in the
    middle of a write) holds open read-write for the length of the test (killed at its end)."""
    path = tmp_path / "held.duckdb"
    path.write_bytes(dashboard_db.read_bytes())
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('held', flush=True);"
         " time.sleep(3600)", str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    monkeypatch.setenv("STEPWATCH_DB_WAIT_S", "0.5")
    yield path
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("page", PAGES)
def test_busy_database(held_db, open_page, page):
    at = open_page(held_db, page)
    assert not at.exception
    assert at.warning[0].value == (f"The database is busy: another stepwatch process (a worker or an import) has "
                                   f"held {held_db} for 0.5 s. Reload the page in a moment.")


def test_a_file_that_is_not_a_database(tmp_path, open_page):
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database\n" * 100)
    at = open_page(junk, "trends")
    assert not at.exception
    assert at.warning[0].value.startswith("The database cannot be read: ")


def test_a_database_with_an_older_schema(empty_db, open_page):
    with open_db(empty_db) as store:  # as if written before migration 003 (no series key)
        store.con.execute("DROP INDEX runs_commit")
        store.con.execute("ALTER TABLE runs DROP COLUMN workload_key")
    at = open_page(empty_db, "trends")
    assert not at.exception
    assert at.warning[0].value.startswith(f"The database at {empty_db} cannot be read (")
    assert at.warning[0].value.endswith("any write brings its schema up to date: start the worker, or import a trace.")
