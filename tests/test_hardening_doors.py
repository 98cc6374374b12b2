"""Hostile input at the doors through which stepwatch serves, runs or merges what the user did not
ask for (issue 29, classes 1, 2 and 4), each case made here with real parts: a real DuckDB file
built by the migrations, real `python -m ingest` processes for exit codes, the Run and Run a
benchmark pages through AppTest, real symbolic links, real git checkouts made in tmp dirs.

1. The dashboard serves a trace only while it is provably the run's own (app/traces.py): inside
   the directory recorded at import, reached through no link, of the sha256 recorded at import. A
   trace turned into a link to a secret, edited, or a directory moved behind a link is "no longer
   available" and nothing of it is sent; a merged run pointing at /etc gets no download.
2. Code runs only from repositories the config names (spec.find_code_problem,
   repos.check_code_source): the form refuses "nosuchrepo" and a path to another checkout by
   name; a job row naming them, written by hand, is refused again by the worker, whose checkout's
   code never runs; `--engine import --path` is read only under the config's [imports] roots.
3. `ingest merge` trusts nothing (db/exchange.py check_history): paths are read literally (a
   directory `glob[1]` is not its sibling `glob1`), every row is checked as import checks it, the
   named limits hold, and bad input is one line, exit 2, the database file byte for byte as it
   was, and later imports into its series work.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from app.markdown_text import format_markdown
from db.engine import duckdb
from db.store import open_db
from ingest.cli import main
from ingest.runs.errors import SpecError
from ingest.runs.spec import Config, RepoConfig, load_config
from tests.helpers import DATA, file_digest, git, kernels_repo, run_cli

pytestmark = pytest.mark.slow  # CLI processes, AppTest pages, a worker

TINY = DATA / "bundles" / "tiny-fused-eager-nostack"
TINY_OTHER = DATA / "bundles" / "tiny-full-pool-cast-eager-nostack"
CPU_TRACE = DATA / "traces" / "cpu_small.trace.json"


def _import(db: Path, path: Path, *flags: str) -> int:
    """`ingest import PATH` in this process; the new run's id."""
    assert main(["import", str(path), "--db", str(db), *flags]) == 0
    with open_db(db, read_only=True) as store:
        return store.con.execute("SELECT max(run_id) FROM runs").fetchone()[0]


def _downloads(at) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def _page_text(at) -> str:
    """Every element the page sent, as text (the Perfetto button's iframe and its embedded trace too)."""
    def walk(node):
        for child in getattr(node, "children", {}).values():
            yield str(getattr(child, "proto", ""))
            yield from walk(child)

    return "\n".join(walk(at._tree))


# -- 1. the dashboard's file access -----------------------------------------------------------
@pytest.fixture
def imported_bundle(tmp_path) -> tuple[Path, Path, int]:
    """A copy of a real bundle imported into a new database: (db, bundle, run id)."""
    bundle = Path(shutil.copytree(TINY, tmp_path / "bundles" / "tiny"))
    db = tmp_path / "s.duckdb"
    return db, bundle, _import(db, bundle)


def test_a_trace_replaced_by_a_link_to_a_secret_is_not_served(imported_bundle, tmp_path, open_page):
    db, bundle, run_id = imported_bundle
    at = open_page(db, "run", run=str(run_id))
    assert _downloads(at) == [f"Download run{run_id}-3cf1671-fused-trace.json.gz"]  # its own trace, as imported
    assert base64.b64encode((bundle / "trace.json.gz").read_bytes()[:48]).decode() in _page_text(at)  # Perfetto's
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:$6$not-for-the-dashboard\n" * 50)
    (bundle / "trace.json.gz").unlink()
    (bundle / "trace.json.gz").symlink_to(secret)
    at = open_page(db, "run", run=str(run_id))
    assert not at.exception
    assert _downloads(at) == []
    assert "Trace no longer available: trace.json.gz is now a symbolic link." in [c.value for c in at.caption]
    text = _page_text(at)
    assert "not-for-the-dashboard" not in text and base64.b64encode(secret.read_bytes()[:48]).decode() not in text


def test_a_trace_edited_since_import_is_not_served_even_at_the_same_size(imported_bundle, open_page):
    db, bundle, run_id = imported_bundle
    trace = bundle / "trace.json.gz"
    body = bytearray(trace.read_bytes())
    body[-20:] = b"x" * 20  # the same size, other bytes
    trace.write_bytes(bytes(body))
    at = open_page(db, "run", run=str(run_id))
    assert not at.exception and _downloads(at) == []
    assert "Trace no longer available: trace.json.gz has changed since it was imported (its sha256 differs)." in [
        c.value for c in at.caption]


def test_a_bundle_directory_moved_behind_a_link_is_not_served(imported_bundle, tmp_path, open_page):
    db, bundle, run_id = imported_bundle
    moved = Path(shutil.move(bundle, tmp_path / "elsewhere"))
    bundle.symlink_to(moved, target_is_directory=True)  # the same files, now through a link
    at = open_page(db, "run", run=str(run_id))
    assert not at.exception and _downloads(at) == []
    assert [c.value for c in at.caption if c.value.startswith("Trace no longer available")] == [
        f"Trace no longer available: its directory {bundle} is now reached through a symbolic link, or is gone."]


def _rewrite(directory: Path, table: str, select: str) -> None:
    """Replace one table's file of an export by `select` over it and give the manifest its new rows
    and sha256, as a hostile tool would (so that the rows themselves are what is wrong)."""
    path = directory / f"{table}.parquet"
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS " + select.replace("{src}", f"read_parquet({str(path)!r})"))
    rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["tables"][table].update(rows=rows, sha256=file_digest(path))
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def test_a_merged_run_pointing_at_etc_gets_no_download(tmp_path, open_page):
    """(a) of the issue: an export whose run names /etc/passwd as its source and /etc/shadow and a
    climb out of its bundle as its traces, its manifest's sha256 recomputed: the merge takes the
    run, and its Run page serves none of them (nor a file with the right hash outside a root)."""
    source = tmp_path / "source.duckdb"
    _import(source, Path(shutil.copytree(TINY, tmp_path / "b" / "tiny")))
    export = tmp_path / "export"
    assert run_cli("ingest", "export", "--db", str(source), "--out", str(export)).returncode == 0
    manifest = json.dumps({"traces": ["/etc/shadow", "../../../../etc/hostname"]})
    passwd = Path("/etc/passwd").read_bytes()
    digests = json.dumps([{"name": "passwd", "bytes": len(passwd), "sha256": hashlib.sha256(passwd).hexdigest()}])
    columns = [c for (c,) in duckdb.connect().execute(
        f"SELECT name FROM parquet_schema({str(export / 'runs.parquet')!r}) WHERE name <> 'duckdb_schema'").fetchall()]
    replace = f"'/etc/passwd' AS source_path, {_sql_text(manifest)} AS manifest"
    if "trace_root" in columns:  # this stepwatch's format: a reference with the right hash, outside any root
        replace += f", '/etc' AS trace_root, {_sql_text(digests)} AS trace_digests"
    _rewrite(export, "runs", f"SELECT * REPLACE ({replace}) FROM " + "{src}")
    db = tmp_path / "team.duckdb"
    merged = run_cli("ingest", "merge", str(export), "--db", str(db))
    assert merged.returncode == 0, merged.stderr
    assert "1 runs' traces cannot be verified on this machine" in merged.stderr
    at = open_page(db, "run", run="1")
    assert not at.exception and _downloads(at) == []
    assert [c.value for c in at.caption if c.value.startswith("Trace no longer available")] == [
        "Trace no longer available: no content hash was recorded for it here (a run imported before stepwatch "
        "recorded them, or merged from another database where its traces cannot be verified)."]
    assert base64.b64encode(passwd[:48]).decode() not in _page_text(at)


def test_a_merged_run_whose_traces_verify_under_an_import_root_is_served(tmp_path, open_page):
    """The verifiable form: the export's trace reference, under a directory the config's [imports]
    roots allow, hashed again at the merge and on the page."""
    traces = tmp_path / "shared"
    bundle = Path(shutil.copytree(TINY, traces / "tiny"))
    source = tmp_path / "source.duckdb"
    _import(source, bundle)
    export = tmp_path / "export"
    assert run_cli("ingest", "export", "--db", str(source), "--out", str(export)).returncode == 0
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[imports]\nroots = ["{traces}"]\n')
    db = tmp_path / "team.duckdb"
    merged = run_cli("ingest", "merge", str(export), "--db", str(db), "--config", str(config))
    assert merged.returncode == 0 and "cannot be verified" not in merged.stderr, merged.stderr
    at = open_page(db, "run", run="1")
    assert _downloads(at) == ["Download run1-3cf1671-fused-trace.json.gz"]


# -- 2. the form, the worker and --engine import run only what the config names -------------------
@pytest.fixture
def foreign_checkout(tmp_path) -> tuple[Path, Path]:
    """A real git checkout of another project whose kernels/bench.py leaves a mark when it runs:
    (checkout, the mark)."""
    checkout = tmp_path / "foreign"
    kernels_repo(checkout, "someone else's code")
    mark = tmp_path / "ran-foreign-code"
    bench = checkout / "kernels" / "bench.py"
    future = "from __future__ import annotations\n"  # the mark goes right after it: Python wants it first
    assert future in bench.read_text()
    bench.write_text(bench.read_text().replace(future, f"{future}open({str(mark)!r}, 'w').write('ran')\n", 1))
    git(checkout, "commit", "-q", "-am", "leave a mark")
    return checkout, mark


@pytest.mark.parametrize("repo", ["nosuchrepo", "checkout"])
def test_the_form_refuses_a_repo_the_config_does_not_name(repo, foreign_checkout, tmp_path):
    from app.job_form import FormInput, plan_jobs

    named = str(foreign_checkout[0]) if repo == "checkout" else repo
    form = FormInput("reference", repo=named, commits="HEAD~0", variants=("fused",), workload={"preset": "tiny"})
    with pytest.raises(SpecError) as refused:
        plan_jobs(form, Config(repos={"bench": RepoConfig("bench", str(tmp_path))}))
    assert str(refused.value).splitlines() == [
        f"spec.repo: {named!r} is not in the config's [repos] (no config file): stepwatch runs code only from the "
        "repositories the config names (or, for the reference engine, leave it out or give 'stepwatch': this "
        "checkout)"]


def test_the_page_says_which_repo_it_refused(writable_db, open_page, foreign_checkout):
    at = open_page(writable_db, "run_benchmark")
    at.text_input(key="repo").input(str(foreign_checkout[0]))
    at.text_input(key="commits").input("HEAD~0")
    at.button(key="FormSubmitter:run_spec-Queue").click()
    at = at.run()
    assert [e.value for e in at.error if e.value.startswith("Not queued")] == [format_markdown("Not queued: {}", (
        f"spec.repo: '{foreign_checkout[0]}' is not in the config's [repos] (no config file): stepwatch runs code "
        "only from the repositories the config names (or, for the reference engine, leave it out or give "
        "'stepwatch': this checkout)"))]
    with open_db(writable_db, read_only=True) as store:
        assert max(j["job_id"] for j in store.list_jobs()) == 4  # the fixture's jobs only: nothing queued


def test_the_worker_refuses_job_rows_naming_code_the_config_does_not(tmp_path, foreign_checkout):
    """Job rows written by hand (or by an older stepwatch): a checkout path as repo_path, a range
    job in that checkout, a repo name the config lacks, an import of a file outside any import
    root. The worker fails each with one line and the foreign checkout's code never runs."""
    checkout, mark = foreign_checkout
    db = tmp_path / "s.duckdb"
    run = {"engine": "reference", "device": "cpu", "workload": {"preset": "tiny", "profile_steps": 1}}
    sha = git(checkout, "rev-parse", "HEAD")  # a commit, not HEAD: what the worker would check out and run
    rows = [{**run, "repo": "foreign", "repo_path": str(checkout), "ref": sha},
            {"expand": {"commits": "HEAD~1..HEAD", "repo": str(checkout), "runs": [run]}},
            {**run, "repo": "nosuchrepo"},
            {"engine": "import", "path": "/etc/passwd"}]  # outside any [imports] root (there is none)
    with open_db(db) as store:
        ids = [store.enqueue_job(json.dumps(row), f"by hand {i}") for i, row in enumerate(rows)]
    worker = run_cli("ingest", "worker", "--db", str(db), "--exit-when-idle")
    assert worker.returncode == 0, worker.stderr
    with open_db(db, read_only=True) as store:
        jobs = {j["job_id"]: j for j in store.list_jobs()}
        runs = store.count_rows()["runs"]
    assert [(jobs[i]["status"], jobs[i]["error_kind"]) for i in ids] == [("failed", "bad-spec")] * 4
    assert jobs[ids[0]]["error"] == (
        f"spec.repo_path: {checkout} is not a checkout the config names in [repos] (no config file): stepwatch runs "
        "code only from the repositories the config names, or its own checkout")
    assert jobs[ids[1]]["error"].startswith(f"spec.expand.repo: '{checkout}' is not in the config's [repos]")
    assert jobs[ids[2]]["error"].startswith("spec.repo: 'nosuchrepo' is not in the config's [repos]")
    assert jobs[ids[3]]["error"] == ("spec.path: /etc/passwd is not under a directory the config allows the import "
                                     "engine to read ([imports] roots in no config file: none set)")
    assert runs == 0 and not mark.exists()


def test_run_spec_refuses_a_spec_built_without_the_parser(tmp_path, foreign_checkout):
    """Defence in depth: a RunSpec made by a caller (not parsed) naming another checkout is refused
    by the worker's own check before any git runs."""
    from ingest.runs.spec import RunSpec, Workload
    from ingest.runs.worker import check_runnable

    checkout, mark = foreign_checkout
    spec = RunSpec("reference", Workload(preset="tiny"), repo="bench", repo_path=str(checkout), ref="HEAD")
    with pytest.raises(SpecError, match=r"^spec.repo_path: .*foreign is not the checkout the config names for "
                                        r"'bench' \(/nonexistent/bench"):
        check_runnable(spec, Config(repos={"bench": RepoConfig("bench", "/nonexistent/bench")}))
    assert not mark.exists()


def test_engine_import_reads_only_under_the_config_s_import_roots(tmp_path):
    db = tmp_path / "s.duckdb"
    refused = run_cli("ingest", "run", "--engine", "import", "--path", "/etc/passwd", "--queue", "--db", str(db))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "stepwatch: error: spec.path: /etc/passwd is not under a directory the config allows the import engine to "
        "read ([imports] roots in no config file: none set)"]
    root = tmp_path / "traces"
    root.mkdir()
    shutil.copy(CPU_TRACE, root / "cpu.trace.json")
    (root / "out").symlink_to("/etc")  # a link under the root that leads out of it
    config = tmp_path / "stepwatch.toml"
    config.write_text(f'[imports]\nroots = ["{root}"]\n')
    assert load_config(config).import_roots == (str(root.resolve()),)
    through = run_cli("ingest", "run", "--engine", "import", "--path", str(root / "out" / "passwd"), "--queue",
                      "--db", str(db), "--config", str(config))
    assert through.returncode == 2 and len(through.stderr.splitlines()) == 1
    assert f"spec.path: {root}/out/passwd is not under a directory the config allows" in through.stderr
    queued = run_cli("ingest", "run", "--engine", "import", "--path", str(root / "cpu.trace.json"), "--queue",
                     "--db", str(db), "--config", str(config))
    assert queued.returncode == 0, queued.stderr
    with open_db(db, read_only=True) as store:
        assert [json.loads(j["spec"])["path"] for j in store.list_jobs()] == [str(root / "cpu.trace.json")]


# -- 3. merge trusts nothing ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_exports(tmp_path_factory) -> dict:
    """Two exports of different runs: one in a directory named `glob[1]`, its sibling `glob1`."""
    base = tmp_path_factory.mktemp("exports")
    made = {}
    for name, path in (("glob[1]", TINY), ("glob1", CPU_TRACE)):
        db = base / f"{name}.duckdb"
        _import(db, path, "--repo", "demo", "--commit", "c0ffee1" if name == "glob1" else "c0ffee2")
        assert run_cli("ingest", "export", "--db", str(db), "--out", str(base / name)).returncode == 0
        with open_db(db, read_only=True) as store:
            made[name] = store.con.execute("SELECT content_hash FROM runs").fetchall()
    return {"base": base, "hashes": made}


def test_merge_reads_a_directory_named_like_a_pattern_literally(two_exports, tmp_path):
    db = tmp_path / "m.duckdb"
    merged = run_cli("ingest", "merge", str(two_exports["base"] / "glob[1]"), "--db", str(db))
    assert merged.returncode == 0, merged.stderr
    with open_db(db, read_only=True) as store:
        assert store.con.execute("SELECT content_hash FROM runs").fetchall() == two_exports["hashes"]["glob[1]"]
        assert store.con.execute("SELECT sha FROM commits").fetchall() == [("c0ffee2",)]


@pytest.fixture
def target(tmp_path) -> Path:
    """A database with one run of series demo, to merge into."""
    db = tmp_path / "target.duckdb"
    _import(db, Path(shutil.copytree(TINY_OTHER, tmp_path / "b" / "other")), "--repo", "demo", "--commit", "aaaa111")
    return db


BAD_ROWS = {  # case: (table, the SELECT that spoils it, what the one line says)
    "workload-a-list": ("runs", "SELECT * REPLACE ('[1, 2]' AS workload) FROM {src}",
                        "runs.parquet: row 1 (run_id 1): field 'workload' must be a JSON object"),
    "variant-refused-by-import": ("runs", "SELECT * REPLACE ('--x;rm -rf ~' AS variant) FROM {src}",
                                  "runs.parquet: row 1 (run_id 1): field 'variant': use letters, digits and ._+/@=:- "
                                  "(not starting with '-')"),
    "repo-name-refused-by-import": ("repos", "SELECT * REPLACE ('a b' AS name) FROM {src}",
                                    "repos.parquet: row 1 (repo_id 1): field 'name': use letters"),
    "nan-figure": ("runs", "SELECT * REPLACE ('NaN'::DOUBLE AS step_ms_median) FROM {src}",
                   "runs.parquet: row 1 (run_id 1): field 'step_ms_median' must be a finite number, not negative"),
    "negative-duration": ("step_categories",
                          "SELECT * REPLACE (CASE WHEN step = 1 THEN -5.0 ELSE dur_us END AS dur_us) FROM {src}",
                          "field 'dur_us' must be a finite number, not negative"),
    "infinite-kernel-time": ("kernel_stats", "SELECT * REPLACE ('inf'::DOUBLE AS total_us) FROM {src}",
                             "kernel_stats.parquet: row 1 (run_id 1): field 'total_us' must be a finite number"),
    "workload-key-of-another-series": ("runs", "SELECT * REPLACE ('{\"preset\": \"glm5\"}' AS workload_key) FROM {src}",
                                       "runs.parquet: row 1 (run_id 1): field 'workload_key' is not the key of its "
                                       "workload"),
    "null-in-a-kept-column": ("step_categories", "SELECT * REPLACE (NULL::VARCHAR AS category) FROM {src}",
                              "step_categories.parquet: row 1 (run_id 1): field 'category' is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_is_one_line_exit_2_and_the_database_byte_for_byte(two_exports, target, tmp_path, case):
    table, select, message = BAD_ROWS[case]
    export = Path(shutil.copytree(two_exports["base"] / "glob[1]", tmp_path / "export"))
    _rewrite(export, table, select)
    before = file_digest(target)
    merged = run_cli("ingest", "merge", str(export), "--db", str(target))
    assert merged.returncode == 2, merged.stderr
    assert len(merged.stderr.strip().splitlines()) == 1 and message in merged.stderr, merged.stderr
    assert merged.stderr.startswith(f"stepwatch: error: {export}/"), merged.stderr
    assert file_digest(target) == before and not Path(f"{target}.wal").exists()
    # the series is as it was: a valid import into it works
    assert run_cli("ingest", "import", str(TINY), "--db", str(target), "--repo", "demo",
                   "--commit", "bbbb222").returncode == 0


def _grow_run(export: Path, table: str, rows: int) -> None:
    """The export's run given `rows` rows in `table` (its first row repeated, steps numbered)."""
    _rewrite(export, table, f"SELECT s.* REPLACE (r.i::INTEGER AS step) FROM (SELECT * FROM {{src}} LIMIT 1) s,"
                            f" (SELECT range AS i FROM range({rows})) r")


@pytest.mark.parametrize("rows, limit", [(10_000_000, "MERGE_MAX_TABLE_ROWS 5,000,000"),
                                         (1_500_000, "MERGE_MAX_RUN_ROWS 1,000,000")])
def test_a_run_of_millions_of_rows_is_refused_by_a_named_limit(two_exports, target, tmp_path, rows, limit):
    export = Path(shutil.copytree(two_exports["base"] / "glob[1]", tmp_path / "export"))
    _grow_run(export, "steps", rows)
    before = file_digest(target)
    merged = run_cli("ingest", "merge", str(export), "--db", str(target))
    assert merged.returncode == 2 and len(merged.stderr.strip().splitlines()) == 1, merged.stderr
    assert f"{export}/steps.parquet: " in merged.stderr and limit in merged.stderr, merged.stderr
    assert file_digest(target) == before


def test_a_good_merge_into_the_series_then_imports_into_it(two_exports, target):
    """The control of the cases above: the unspoilt export merges, and the series takes imports."""
    merged = run_cli("ingest", "merge", str(two_exports["base"] / "glob[1]"), "--db", str(target))
    assert merged.returncode == 0, merged.stderr
    assert run_cli("ingest", "import", str(CPU_TRACE), "--db", str(target), "--repo", "demo",
                   "--commit", "cccc333").returncode == 0
    with open_db(target, read_only=True) as store:
        assert store.count_rows()["runs"] == 3
