"""`ingest export` / `ingest merge` (db/exchange.py): history moved between real databases as Parquet.

The databases are real DuckDB files filled by the real import path: the dashboard's fixture
database (tests/dashboard_fixture.py), and databases of the `glm5-serving-demo` sample series
(real H200 bundles in app/sample_data, six commits with a regression and its fix) split between
two workers with commits in common. Tables are compared row for row with ids mapped away (a repo
by name, a commit by repo and sha, a run by content hash), floats exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from db import views
from db.exchange import (TABLES, LOCAL_COLUMNS, ExchangeError, check_history, export_history, merge_history,
                         read_history)
from db.store import SWEEP_COLUMNS, open_db
from ingest.cli import main
from ingest.commands import make_merge_checks
from ingest.runs.track import follow_series, track_changes
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from tests.helpers import ROOT, run_cli

SAMPLES = ROOT / "app" / "sample_data"
DEMO = "glm5-serving-demo"
DEMO_COMMITS = {c["sha"][:7]: c for c in json.loads((SAMPLES / "commits.json").read_text())["repos"][1]["commits"]}
ORDER = ["9317abc", "05a3934", "d445ae3", "6806b21", "bd182fd", "d396647"]  # first-parent order, seq 1-6
# two workers' databases: commits 1-4 and 3-6, the two in the middle measured by both (the same
# bundles: the same runs); worker B never learnt d445ae3's facts (date, author, subject, seq)
WORKER_A, WORKER_B, B_LACKS_FACTS = ORDER[:4], ORDER[2:], "d445ae3"

# what identifies each row with its ids mapped away; the rest of the row is compared as it is
CANONICAL = {
    "repos": "SELECT name, url FROM repos ORDER BY name",
    "commits": "SELECT p.name, c.* EXCLUDE (commit_id, repo_id) FROM commits c JOIN repos p USING (repo_id)"
               " ORDER BY ALL",
    "runs": "SELECT r.* EXCLUDE (run_id, repo_id, commit_id{drop}), p.name AS repo_name, c.sha FROM runs r"
            " LEFT JOIN repos p USING (repo_id) LEFT JOIN commits c USING (commit_id) ORDER BY r.content_hash",
    **{t: f"SELECT r.content_hash, t.* EXCLUDE (run_id) FROM {t} t JOIN runs r USING (run_id) ORDER BY ALL"
       for t in ("steps", "step_categories", "kernel_stats", "rank_stats")},
}


def _plain(row: tuple) -> tuple:
    return tuple("NaN" if isinstance(v, float) and v != v else v for v in row)  # NaN == NaN, for comparing


def canonical_export(directory: Path, drop: tuple[str, ...] = ()) -> dict[str, list[tuple]]:
    """Every table of an export, row for row, ids mapped away (`drop`: runs' columns left out)."""
    con = duckdb.connect()
    for table in TABLES:
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{directory / (table + '.parquet')}')")
    return {table: [_plain(r) for r in con.execute(sql.format(drop="".join(", " + c for c in drop))).fetchall()]
            for table, sql in CANONICAL.items()}


def dump_database(db: Path) -> dict[str, list[tuple]]:
    """Every table of the database (queue, changes and migrations too), every column, sorted."""
    with open_db(db, read_only=True) as store:
        tables = [t for (t,) in store.con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()"
            " ORDER BY table_name").fetchall()]
        return {t: [_plain(r) for r in store.con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()]
                for t in tables}


def export(db: Path, out: Path, repo: str | None = None) -> Path:
    with open_db(db, read_only=True) as store:
        export_history(store, out, repo=repo)
    return out


def merge(db: Path, directory: Path):
    """What `ingest merge` does: check, merge in one transaction, detect the touched series' changes."""
    # the bundles of these runs lie in this checkout, an import root here: their traces verify and travel
    history = check_history(read_history(directory), make_merge_checks((str(ROOT.resolve()),)))
    with open_db(db) as store:
        result = merge_history(store, history)
    for series in result.series:
        follow_series(str(db), series)
    return result


def row_counts(db: Path) -> dict[str, int]:
    with open_db(db, read_only=True) as store:
        return store.count_rows()


@pytest.fixture(scope="module")
def fixture_export(dashboard_db, tmp_path_factory) -> Path:
    return export(dashboard_db, tmp_path_factory.mktemp("exports") / "fixture")


# -- the format -----------------------------------------------------------------------------
def test_every_column_of_the_travelling_tables_is_in_the_format(tmp_path):
    """A migration that adds a column to a table that travels must make a new format version."""
    with open_db(tmp_path / "new.duckdb") as store:
        for table, columns in TABLES.items():
            got = store.con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?"
                " AND table_catalog = current_database() ORDER BY ordinal_position", [table]).fetchall()
            assert [c for c in got if c[0] not in LOCAL_COLUMNS.get(table, ())] == list(columns), table


def test_the_manifest_names_the_format_schema_tables_and_rows(dashboard_db, fixture_export):
    manifest = json.loads((fixture_export / "manifest.json").read_text())
    with open_db(dashboard_db, read_only=True) as store:
        schema = max(store.list_schema_versions())
    assert (manifest["format"], manifest["version"], manifest["schema_version"]) == ("stepwatch-history", 5, schema)
    assert sorted(manifest["tables"]) == sorted(TABLES)
    counts = row_counts(dashboard_db)
    assert {t: e["rows"] for t, e in manifest["tables"].items()} == {t: counts[t] for t in TABLES}
    assert set(manifest["not_included"]) == {"jobs", "changes", "schema_migrations"}
    assert sorted(p.name for p in fixture_export.iterdir()) == sorted(["manifest.json"] + [f"{t}.parquet"
                                                                                          for t in TABLES])


# -- (a) a round trip, (b) idempotence ---------------------------------------------------------
def test_export_merge_into_an_empty_database_and_export_again_gives_every_row_back(fixture_export, tmp_path):
    result = merge(tmp_path / "merged.duckdb", fixture_export)
    assert (result.runs_added, result.runs_present, result.repos_added, result.commits_added) == (23, 0, 2, 5)
    assert result.rows_added == {"steps": 55, "step_categories": 272, "kernel_stats": 342, "rank_stats": 23}
    again = export(tmp_path / "merged.duckdb", tmp_path / "again")
    first, second = canonical_export(fixture_export), canonical_export(again)
    assert {t: len(rows) for t, rows in first.items()} == {"repos": 2, "commits": 5, "runs": 23, "steps": 55,
                                                          "step_categories": 272, "kernel_stats": 342,
                                                          "rank_stats": 23}
    for table in TABLES:
        assert second[table] == first[table], table
    with open_db(tmp_path / "merged.duckdb", read_only=True) as store:  # a worker's queue stays with it
        assert views.count_runs(store)["jobs"] == 0
        assert store.con.execute("SELECT count(*) FROM runs WHERE job_id IS NOT NULL").fetchone() == (0,)


def test_merging_twice_adds_nothing_the_second_time(fixture_export, writable_db, tmp_path):
    db = tmp_path / "merged.duckdb"
    merge(db, fixture_export)
    before = dump_database(db)
    second = merge(db, fixture_export)
    assert (second.runs_added, second.runs_present, second.repos_added, second.commits_added,
            second.commits_completed, second.series) == (0, 23, 0, 0, 0, [])
    assert second.rows_added == {"steps": 0, "step_categories": 0, "kernel_stats": 0, "rank_stats": 0}
    assert dump_database(db) == before
    source = dump_database(writable_db)  # into the database it came from: all of it is there
    into_source = merge(writable_db, fixture_export)
    assert (into_source.runs_added, into_source.runs_present, into_source.commits_added) == (0, 23, 0)
    assert dump_database(writable_db) == source


def test_an_export_of_one_repository_holds_its_commits_and_runs_only(dashboard_db, tmp_path):
    out = export(dashboard_db, tmp_path / "kv", repo="kv-regression-demo")
    rows = canonical_export(out)
    assert [r[0] for r in rows["repos"]] == ["kv-regression-demo"]
    assert len(rows["commits"]) == 2 and len(rows["runs"]) == 2
    assert {r[0] for r in rows["kernel_stats"]} == {r[0] for r in rows["runs"]}  # runs' content hashes first
    with pytest.raises(ExchangeError, match="no repository named 'nope'"):
        export(dashboard_db, tmp_path / "nope", repo="nope")
    assert not (tmp_path / "nope").exists()


# -- (c) two workers' databases -----------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_records():
    """The demo series' runs read once: {short sha: [its two runs' records]}."""
    rules = load_rule_chain()
    return {sha: [prepare_import(SAMPLES / f"demo-{sha}-{i}-glm5-graph", rules, ImportOptions()) for i in (1, 2)]
            for sha in ORDER}


def build_demo_db(path: Path, records: dict, shas: list[str], lacks_facts: str | None = None) -> Path:
    """A worker's database: the runs of these commits, imported as `ingest import` imports a
    bundle, its commits' facts recorded (all but `lacks_facts`'), its changes detected."""
    with open_db(path) as store:
        for sha in shas:
            for record in records[sha]:
                assert store.insert_run(record)[1]
            if sha != lacks_facts:
                c = DEMO_COMMITS[sha]
                store.record_commit(DEMO, c["sha"], c["committed_at"], c["author"], c["subject"], c["seq"])
        track_changes(store)
    return path


@pytest.fixture(scope="module")
def workers(demo_records, tmp_path_factory) -> dict[str, Path]:
    """Databases of worker A and B, their exports, and one database that imported every run."""
    root = tmp_path_factory.mktemp("workers")
    dbs = {"a": build_demo_db(root / "a.duckdb", demo_records, WORKER_A),
           "b": build_demo_db(root / "b.duckdb", demo_records, WORKER_B, lacks_facts=B_LACKS_FACTS),
           "all": build_demo_db(root / "all.duckdb", demo_records, ORDER)}
    return {**dbs, "a_out": export(dbs["a"], root / "a-out"), "b_out": export(dbs["b"], root / "b-out"),
            "all_out": export(dbs["all"], root / "all-out")}


def changes_of(db: Path) -> list[dict]:
    """The confirmed changes as the Regressions page lists them, ids mapped to shas and content hashes."""
    with open_db(db, read_only=True) as store:
        hashes = dict(store.con.execute("SELECT run_id, content_hash FROM runs").fetchall())
        changes = views.list_changes(store)
    changes["last_good_run"] = changes.pop("last_good_run_id").map(hashes)
    changes["first_bad_run"] = changes.pop("first_bad_run_id").map(hashes)
    changes["diagnosis"] = changes["diagnosis"].map(json.dumps)
    # (commit ids, like change ids, are this database's own numbers: the shas say which commits)
    rows = changes.drop(columns=["change_id", "detected_at", "last_good_commit_id", "first_bad_commit_id"]
                        ).sort_values(["series_id", "metric"])
    return [dict(zip(rows.columns, _plain(tuple(r)))) for r in rows.itertuples(index=False)]


@pytest.mark.parametrize("order", [("a_out", "b_out"), ("b_out", "a_out")])
def test_two_workers_merge_into_a_third_holding_each_run_once(workers, tmp_path, order):
    db = tmp_path / "team.duckdb"
    first, second = (merge(db, workers[name]) for name in order)
    assert (first.runs_added, second.runs_added, second.runs_present) == (8, 4, 4)  # commits 3 and 4: in both
    assert first.commits_added + second.commits_added == 6
    # B lacked d445ae3's facts: merged after A it takes nothing; merged first, A completes it (and its seq)
    assert second.commits_completed == (0 if order[0] == "a_out" else 1)
    shared = canonical_export(export(db, tmp_path / "team-out"), drop=("imported_at",))
    assert shared == canonical_export(workers["all_out"], drop=("imported_at",))  # every table: the union, once
    assert len(shared["runs"]) == 12
    changes = changes_of(db)
    assert changes == changes_of(workers["all"])  # detected on the merged series, not on either half
    tok_per_s = {(c["direction"], c["first_bad_short_sha"]) for c in changes if c["metric"] == "tok_per_s"}
    assert tok_per_s == {("regression", "d445ae3"), ("improvement", "bd182fd")}  # the regression and its fix
    assert {c["first_bad_short_sha"] for c in changes_of(workers["a"])} == {"d445ae3"}  # A never measured the fix,
    assert changes_of(workers["b"]) == []  # B had no order for d445ae3: the regression hid behind it


def test_a_commit_whose_order_differs_keeps_this_database_s_and_takes_none(workers, tmp_path):
    db = Path(shutil.copy(workers["a"], tmp_path / "a.duckdb"))
    other = DEMO_COMMITS["05a3934"]
    with open_db(db) as store:  # this database counted 05a3934 from elsewhere (a shallow clone, say)
        store.record_commit(DEMO, other["sha"], None, None, None, 99)
    result = merge(db, workers["all_out"])
    assert result.order_kept == {DEMO: 1} and result.commits_added == 2
    assert "glm5-serving-demo: first-parent order kept, 1 commits' seq differ" in result.describe()
    with open_db(db, read_only=True) as store:
        seqs = dict(store.con.execute("SELECT left(sha, 7), seq FROM commits").fetchall())
    assert seqs == {"9317abc": 1, "05a3934": 99, "d445ae3": 3, "6806b21": 4, "bd182fd": None, "d396647": None}


# -- (d) what the dashboard reads --------------------------------------------------------------
def test_the_dashboard_reads_the_same_series_trends_runs_and_changes_from_the_merged_file(
        dashboard_db, fixture_export, tmp_path, capsys):
    merged = tmp_path / "merged.duckdb"
    config = tmp_path / "stepwatch.toml"  # the runs' bundles lie in this checkout: an import root, so traces travel
    config.write_text(f'[imports]\nroots = ["{ROOT.resolve()}"]\n')
    assert main(["merge", str(fixture_export), "--db", str(merged), "--config", str(config)]) == 0
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "23 runs added, 0 already present" in line and "(2 confirmed, 2 suspected)" in line

    def read(db: Path) -> dict:
        with open_db(db, read_only=True) as store:
            hashes = dict(store.con.execute("SELECT run_id, content_hash FROM runs").fetchall())
            series = views.list_series(store)
            out = {"series": series.assign(variants=series["variants"].map(list)).to_dict("records"),
                   "counts": views.count_runs(store)["runs_with_commit"], "changes": changes_of(db),
                   "trends": [], "runs": {}}
            for s in series.itertuples():
                trend = views.get_trend(store, s.repo, s.engine, s.device, s.workload_id)
                trend["run_id"] = trend["run_id"].map(hashes)
                out["trends"].append([_plain(tuple(r)) for r in trend.itertuples(index=False)])
                marked = views.list_series_changes(store, s.repo, s.engine, s.device, s.workload_id)
                out["trends"].append(sorted(marked["series_id"] + marked["metric"]))
            for run_id, content_hash in hashes.items():
                run = {k: v for k, v in store.get_run(run_id).items() if k not in ("run_id", "job_id")}
                out["runs"][content_hash] = (run, store.list_kernels(run_id, records=True),
                                             store.list_rank_stats(run_id, records=True),
                                             [_plain(tuple(r)) for r in views.get_step_breakdown(store, run_id)
                                              .itertuples(index=False)])
        return out

    source, copy = read(dashboard_db), read(merged)
    assert copy["series"] == source["series"] and copy["counts"] == source["counts"] == 22
    assert copy["trends"] == source["trends"]
    # the fixture's change point: tok/s and step ms (suspected) and its two kernels' counts (exact)
    assert len(copy["changes"]) == 4 and copy["changes"] == source["changes"]
    assert copy["runs"].keys() == source["runs"].keys()
    for content_hash, run in source["runs"].items():
        assert repr(copy["runs"][content_hash]) == repr(run), run[0]["source_path"]  # repr: NaN as NaN


def test_an_export_of_format_version_1_still_merges_its_new_columns_arriving_empty(fixture_export, tmp_path):
    """Version 2 added the import's checks (runs.timeline, consistency, patterns) and
    kernel_stats.input_dtypes; an export written before (version 1, without them) merges whole."""
    old = Path(shutil.copytree(fixture_export, tmp_path / "v1"))
    _rewrite(old, "runs", "SELECT * EXCLUDE (timeline, consistency, patterns, roofline, graph_attribution,"
             " trace_root, trace_digests, " + SWEEP + ") FROM {src}")
    _rewrite(old, "kernel_stats", f"SELECT * EXCLUDE (input_dtypes, {ROOFLINE}, graph_op, graph_source, graph_layers)"
             " FROM {src}")
    _set_manifest(old, lambda m: m.update(version=1))
    result = merge(tmp_path / "m.duckdb", old)
    assert (result.runs_added, result.rows_added["kernel_stats"]) == (23, 342)
    with open_db(tmp_path / "m.duckdb", read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM runs WHERE timeline IS NULL AND consistency IS NULL"
                                 " AND patterns IS NULL").fetchone()[0] == 23
        assert store.con.execute("SELECT count(*) FROM kernel_stats WHERE input_dtypes IS NULL").fetchone()[0] == 342
    later = ("timeline", "consistency", "patterns", "roofline", "trace_root", "trace_digests", *SWEEP_COLUMNS)
    v2 = canonical_export(fixture_export, drop=later)
    merged = canonical_export(export(tmp_path / "m.duckdb", tmp_path / "again"), drop=later)
    assert merged["runs"] == v2["runs"] and merged["steps"] == v2["steps"]


def test_an_export_of_format_version_2_merges_with_graph_attribution_arriving_empty(fixture_export, tmp_path):
    """Version 3 added graph-kernel attribution (runs.graph_attribution, kernel_stats.graph_op,
    graph_source, graph_layers: migration 012); an export of version 2 merges whole without them."""
    old = Path(shutil.copytree(fixture_export, tmp_path / "v2"))
    _rewrite(old, "runs", "SELECT * EXCLUDE (roofline, graph_attribution, trace_root, trace_digests, " + SWEEP
             + ") FROM {src}")
    _rewrite(old, "kernel_stats", f"SELECT * EXCLUDE ({ROOFLINE}, graph_op, graph_source, graph_layers) FROM {{src}}")
    _set_manifest(old, lambda m: m.update(version=2))
    result = merge(tmp_path / "m.duckdb", old)
    assert (result.runs_added, result.rows_added["kernel_stats"]) == (23, 342)
    with open_db(tmp_path / "m.duckdb", read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM runs WHERE graph_attribution IS NULL").fetchone()[0] == 23
        assert store.con.execute("SELECT count(*) FROM kernel_stats WHERE graph_op IS NULL AND graph_source IS NULL"
                                 " AND graph_layers IS NULL").fetchone()[0] == 342
        # version 3 also added the roofline (migration 011): it arrives empty too
        assert store.con.execute("SELECT count(*) FROM runs WHERE roofline IS NULL").fetchone()[0] == 23
        assert store.con.execute("SELECT count(*) FROM kernel_stats WHERE flops_per_call IS NULL AND tflops IS NULL"
                                 " AND tbps IS NULL AND compute_fraction IS NULL AND bound IS NULL"
                                 ).fetchone()[0] == 342


# the runs' sweep columns (migration 015, format version 5): an older export has none
SWEEP = ", ".join(SWEEP_COLUMNS)
# the roofline's kernel_stats columns (migration 011, format version 3)
ROOFLINE = ("flops_per_call, model_bytes_per_call, intensity, tflops, tbps, compute_fraction, bandwidth_fraction,"
            " bound")


def test_the_roofline_travels_with_its_runs(dashboard_db, fixture_export, tmp_path):
    """The fixture's eager H200 runs have roofline figures (the cast's TB/s, the GEMMs' TFLOP/s) and
    their device's ceilings; a merge into an empty database holds the same values, row for row."""
    query = (f"SELECT r.content_hash, k.rank, k.name, k.launcher, k.source, {ROOFLINE} FROM kernel_stats k"
             " JOIN runs r USING (run_id) WHERE k.tflops IS NOT NULL OR k.tbps IS NOT NULL ORDER BY ALL")
    runs = "SELECT content_hash, roofline FROM runs WHERE roofline IS NOT NULL ORDER BY ALL"
    with open_db(dashboard_db, read_only=True) as store:
        source_rows, source_runs = store.con.execute(query).fetchall(), store.con.execute(runs).fetchall()
    merge(tmp_path / "m.duckdb", fixture_export)
    with open_db(tmp_path / "m.duckdb", read_only=True) as store:
        merged_rows, merged_runs = store.con.execute(query).fetchall(), store.con.execute(runs).fetchall()
    assert len(source_rows) > 20 and {r[-1] for r in source_rows} >= {"memory", "latency"}
    assert merged_rows == source_rows
    assert len(source_runs) > 4 and merged_runs == source_runs
    assert json.loads(source_runs[0][1])["datasheet"]["bf16_tflops"] == 989.4


# -- (e) bad input, through the command line ----------------------------------------------------
def _rewrite(directory: Path, table: str, select: str) -> None:
    """Replace one table's file by `select` over it, and give the manifest its new sha256 and rows
    (what another tool writing the file would do), so that the file itself is what is wrong."""
    from db.exchange import _sha256

    path = directory / f"{table}.parquet"
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS {select.format(src=f'read_parquet({str(path)!r})')}")
    rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    _set_manifest(directory, lambda m: m["tables"][table].update(sha256=_sha256(path), rows=rows))


def _set_manifest(directory: Path, change) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    change(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


BAD = {  # case: (how the good export is spoilt, what the one line says)
    "missing-directory": (lambda d: shutil.rmtree(d), "no such directory"),
    "no-manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
    "manifest-not-json": (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json: not JSON"),
    "other-format": (lambda d: _set_manifest(d, lambda m: m.update(format="stepwatch-bundle")),
                     "manifest.json: field 'format' is 'stepwatch-bundle', expected 'stepwatch-history'"),
    "other-version": (lambda d: _set_manifest(d, lambda m: m.update(version=6)),
                      "manifest.json: field 'version' is 6; this stepwatch reads versions 1, 2, 3, 4, 5"),
    "newer-schema": (lambda d: _set_manifest(d, lambda m: m.update(schema_version=m["schema_version"] + 1)),
                     "newer than this database's schema"),
    "table-left-out": (lambda d: _set_manifest(d, lambda m: m["tables"].pop("rank_stats")),
                       "manifest.json: field 'tables' lacks table 'rank_stats'"),
    "missing-parquet": (lambda d: (d / "steps.parquet").unlink(), "steps.parquet: missing"),
    "corrupt-parquet": (lambda d: _corrupt(d / "kernel_stats.parquet"),
                        "kernel_stats.parquet: content differs from the manifest's sha256"),
    "not-parquet": (lambda d: (_truncate(d / "runs.parquet"), _rewrite_sha(d, "runs")),
                    "runs.parquet: not a readable Parquet file"),
    "column-missing": (lambda d: _rewrite(d, "rank_stats", "SELECT * EXCLUDE (collectives) FROM {src}"),
                       "rank_stats.parquet: column 'collectives' is missing"),
    "column-type": (lambda d: _rewrite(d, "steps", "SELECT * REPLACE (CAST(rank AS BIGINT) AS rank) FROM {src}"),
                    "steps.parquet: column 'rank' has type int64, expected int32 (INTEGER)"),
    "column-extra": (lambda d: _rewrite(d, "repos", "SELECT *, 1 AS stars FROM {src}"),
                     "repos.parquet: column 'stars' is not one of table repos's"),
    "rows-differ": (lambda d: _set_manifest(d, lambda m: m["tables"]["commits"].update(rows=99)),
                    "commits.parquet: 4 rows, the manifest says 99"),
    # found by check_history, before the database is opened
    "unknown-commit": (lambda d: _rewrite(d, "commits", "SELECT * FROM {src} WHERE seq <> 2"),
                       "runs.parquet: column 'commit_id' names 2, which commits.parquet does not hold"),
    "null-in-a-kept-column": (lambda d: _rewrite(d, "step_categories",
                                                 "SELECT * REPLACE (CASE WHEN step = 1 THEN NULL ELSE category END"
                                                 " AS category) FROM {src}"),
                              "field 'category' is empty (the schema requires it)"),
}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])  # the footer, where Parquet keeps its schema


def _rewrite_sha(directory: Path, table: str) -> None:
    from db.exchange import _sha256

    _set_manifest(directory, lambda m: m["tables"][table].update(sha256=_sha256(directory / f"{table}.parquet")))


@pytest.mark.slow  # one CLI process a case
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_the_database_unchanged(workers, tmp_path, case):
    spoil, message = BAD[case]
    directory = Path(shutil.copytree(workers["a_out"], tmp_path / "export"))
    db = Path(shutil.copy(workers["b"], tmp_path / "target.duckdb"))  # A's runs at commits 1-2 are new to it
    spoil(directory)
    before = dump_database(db)
    proc = run_cli("ingest", "merge", str(directory), "--db", str(db))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("stepwatch: error: "), proc.stderr
    assert dump_database(db) == before


@pytest.mark.slow
def test_export_refuses_a_directory_that_is_not_empty_and_merge_a_database_that_is_not_there(workers, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = run_cli("ingest", "export", "--db", str(workers["a"]), "--out", str(out))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"stepwatch: error: {out}: directory is not empty; export to a new or empty directory"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    proc = run_cli("ingest", "merge", str(tmp_path / "nowhere"), "--db", str(tmp_path / "new.duckdb"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "new.duckdb").exists()  # nothing was created for bad input
    proc = run_cli("ingest", "export", "--db", str(workers["a"]), "--out", str(tmp_path / "fresh"))
    assert proc.returncode == 0 and proc.stderr.strip().splitlines() == [
        f"exported 8 runs (4 commits, 1 repos) from {workers['a']} to {tmp_path / 'fresh'}"]
