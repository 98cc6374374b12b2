"""The DuckDB store: migrations applied and recorded once, runs written whole or not at all,
a content hash imported twice gives one run."""

import duckdb
import pandas as pd
import pytest

from db.store import RunRecord, _migration_files, open_db


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


def test_a_failing_write_leaves_nothing(tmp_path):
    broken = _record("def", kernels=pd.DataFrame({"rank": [0], "name": [None]}))  # NOT NULL columns missing
    with open_db(tmp_path / "s.duckdb") as store:
        store.insert_run(_record())
        before = store.count_rows()
        with pytest.raises(duckdb.Error):
            store.insert_run(broken)
        assert store.count_rows() == before
        assert store.find_run_by_hash("def") is None
