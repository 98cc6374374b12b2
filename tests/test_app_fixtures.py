"""The dashboard's fixture database (tests/dashboard_fixture.py, built once a session by the
`dashboard_db` fixture of tests/conftest.py) holds every kind of run and job the pages show."""

from db.store import open_db


def test_the_fixture_holds_every_kind_of_run_and_job(dashboard_db):
    with open_db(dashboard_db, read_only=True) as store:
        counts = store.count_rows()
        statuses = [j["status"] for j in store.list_jobs()]
    # 12 sample bundles + 2 of the KV regression + 8 tiny bundles (the two glm5 test bundles are sample
    # bundles again) + 1 CPU trace; the stepwatch series have no confirmed change, the planted one has two
    assert counts["runs"] == 23 and counts["commits"] == 5
    with open_db(dashboard_db, read_only=True) as store:
        changes = store.con.execute("SELECT metric, direction FROM changes ORDER BY metric").fetchall()
    assert changes == [("step_ms", "regression"), ("tok_per_s", "regression")]
    assert statuses == ["queued", "running", "failed", "succeeded"]
