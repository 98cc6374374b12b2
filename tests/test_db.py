"""The DuckDB store: migrations applied and recorded once, runs written whole or not at all,
a content hash imported twice gives one run."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from db.common import StoreError
from db.engine import duckdb  # DuckDB's engine module, as db/ uses it (not the package)
from db.store import RunRecord, _migration_files, open_db
from tests.helpers import ROOT


def _record(content_hash="abc", kernels=None):
    kernels = kernels if kernels is not None else pd.DataFrame({
        "rank": [0], "name": ["k"], "category": ["cast"], "launcher": ["aten::copy_"], "source": [""],
        "calls": [78], "calls_per_step": [78.0], "total_us": [780.0], "mean_us": [10.0], "median_us": [10.0],
        "p90_us": [11.0], "min_us": [9.0], "max_us": [12.0], "ms_per_step": [0.78], "share": [0.5],
        "bytes_per_call": [float("nan")], "gbps": [float("nan")], "peak_fraction": [float("nan")]})
    return RunRecord(
        content_hash=content_hash, repo="sglang", commit="a" * 40, variant="unpatched", engine="sglang",
        workload={"batch_size": 1}, device_name="NVIDIA H200", peak_gbps=4800.0, ranks=1, steps=1,
        step_method="graph-launch", step_ms_median=1.5, tok_per_s=650.0, layers=78, copy_share=0.5,
        gpu_busy_share=0.9, kernel_us_total=1560.0, kernels_from_cpu_ops=False, source_path="/x",
        manifest=None,
        step_table=pd.DataFrame({"rank": [0], "step": [0], "wall_us": [1500.0], "gpu_busy_us": [1400.0],
                                 "kernel_us": [1560.0]}),
        step_categories=pd.DataFrame({"rank": [0], "step": [0], "category": ["cast"], "dur_us": [780.0]}),
        kernel_stats=kernels,
    )


def test_migrations_apply_once_and_are_recorded(tmp_path):
    path = tmp_path / "s.duckdb"
    with open_db(path) as store:
        assert store.list_schema_versions() == [v for v, _, _ in _migration_files()]
    with open_db(path) as store:
        assert store.migrate() == []  # nothing left to apply on the second open


def _database_of_version(path, last: int) -> None:
    """A file as a stepwatch of schema version `last` left it: migrations up to `last`, with a run."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
    for version, name, sql in _migration_files():
        if version <= last:
            con.execute(sql.read_text())
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
    con.execute("INSERT INTO runs (run_id, content_hash, ranks, steps, step_method, kernel_us_total,"
                " kernels_from_cpu_ops, source_path) VALUES (1, 'h', 1, 2, 'given', 10.0, false, '/x')")
    con.close()


def test_a_database_of_an_older_stepwatch_read_first_is_brought_up_to_date(tmp_path):
    """An upgrade, then `ingest report` or the dashboard (read-only) before any writer: the file is
    migrated once, then read; before, every read naming a newer column failed (Binder Error)."""
    path = tmp_path / "old.duckdb"
    _database_of_version(path, 10)  # before the roofline (011) and graph attribution (012) columns
    with open_db(path, read_only=True) as store:
        assert store.list_schema_versions() == [v for v, _, _ in _migration_files()]
        assert store.list_pending_migrations() == []
        run = store.get_run(1)
        assert (run["run_id"], run["steps"], run["roofline"], run["graph_attribution"]) == (1, 2, None, None)


def test_reading_a_duckdb_file_that_is_not_stepwatch_s_says_so_and_leaves_it_alone(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (a INTEGER)")
    con.close()
    with pytest.raises(StoreError, match=r"other\.duckdb: not a stepwatch database"):
        open_db(path, read_only=True)
    con = duckdb.connect(str(path), read_only=True)
    assert [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["t"]
    con.close()


def test_run_round_trip_and_dedup(tmp_path):
    with open_db(tmp_path / "s.duckdb") as store:
        run_id, created = store.insert_run(_record())
        assert created
        again, created_again = store.insert_run(_record())
        assert (again, created_again) == (run_id, False)
        run = store.get_run(run_id)
        assert (run["repo"], run["sha"], run["layers"], run["tok_per_s"]) == ("sglang", "a" * 40, 78, 650.0)
        k = store.list_kernels(run_id)
        assert k.loc[0, "calls_per_step"] == 78.0 and pd.isna(k.loc[0, "bytes_per_call"])
        assert store.count_rows() == {"runs": 1, "steps": 1, "step_categories": 1, "kernel_stats": 1,
                                      "repos": 1, "commits": 1, "rank_stats": 0}  # a record without rank figures


def test_a_record_of_dataframes_is_written_by_a_process_that_never_loaded_the_duckdb_package(tmp_path):
    """db/ loads DuckDB's engine module alone (db/engine.py). A record made of DataFrames is
    written through Arrow tables, which DuckDB 2.x scans only once the `duckdb` package is
    loaded ("Python Arrow objects cannot be scanned" before): the store loads it for that write.
    In a fresh process, as a test or an older caller would write such a record."""
    code = ("import json, sys\n"
            "from tests.test_db import _record\n"
            "from db.store import open_db\n"
            "before = 'duckdb' in sys.modules\n"
            "with open_db(sys.argv[1]) as store:\n"
            "    run_id, created = store.insert_run(_record())\n"
            "    rows = store.count_rows()\n"
            "print(json.dumps({'before': before, 'after': 'duckdb' in sys.modules, 'created': created, 'rows': rows}))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.duckdb")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = json.loads(proc.stdout)
    assert (done["before"], done["after"], done["created"]) == (False, True, True)
    assert done["rows"]["kernel_stats"] == done["rows"]["steps"] == done["rows"]["runs"] == 1


def test_a_failing_write_leaves_nothing(tmp_path):
    broken = _record("def", kernels=pd.DataFrame({"rank": [0], "name": [None]}))  # NOT NULL columns missing
    with open_db(tmp_path / "s.duckdb") as store:
        store.insert_run(_record())
        before = store.count_rows()
        with pytest.raises(duckdb.Error):
            store.insert_run(broken)
        assert store.count_rows() == before
        assert store.find_run_by_hash("def") is None
