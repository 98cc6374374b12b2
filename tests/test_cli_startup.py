"""What `python -m ingest` loads before it answers: --help and usage errors load neither DuckDB
nor NumPy nor pandas, a report loads DuckDB but no NumPy or pandas (they cost ~0.6 s of the
~0.7 s a command used to take to start; ingest/BENCHMARKS.md has the timings), an import
without a commit loads none of change detection's SciPy and ruptures (~1 s of imports), and an
import loads no pandas or pyarrow (~0.3-0.45 s) until a series has two commits to compare; DuckDB is
its engine module alone (`_duckdb`, db/engine.py), not the package's Python (~0.15 s more). Checked
on the commands themselves, from `-X importtime`'s line for every module imported, so the test says
what was loaded, not how long it took."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("duckdb", "_duckdb", "numpy", "pandas", "msgspec", "pyarrow", "torch", "scipy", "ruptures")


def _probe(*argv: str) -> dict:
    """`python -m ingest ARGV` as a user runs it, with `-X importtime`: its exit code, stdout,
    stderr (the import lines taken out) and which of HEAVY it loaded. The command itself, not a
    stand-in: a report ends with os._exit (ingest/__main__.py), which an in-process probe would
    not survive."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ingest", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    imported, err = set(), []
    for line in proc.stderr.splitlines(keepends=True):
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[1].strip())
        else:
            err.append(line)
    return {"code": proc.returncode, "out": proc.stdout, "err": "".join(err),
            "loaded": sorted(m for m in HEAVY if m in imported)}


def test_help_and_usage_errors_load_nothing_heavy():
    helped = _probe("--help")
    assert helped["code"] == 0 and "import" in helped["out"] and "report" in helped["out"]
    assert helped["loaded"] == []
    sub = _probe("import", "--help")
    assert sub["code"] == 0 and "--max-trace-mb" in sub["out"] and "16,384 MB" in sub["out"]
    assert sub["loaded"] == []
    bad = _probe("report", "x")
    assert bad["code"] == 2 and "'x' is not an integer" in bad["err"] and bad["loaded"] == []


@pytest.mark.slow
def test_a_report_loads_duckdb_but_not_numpy_or_pandas(tmp_path):
    db = tmp_path / "s.duckdb"
    made = subprocess.run([sys.executable, "-m", "ingest", "samples", "--db", str(db)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    report = _probe("report", "1", "--db", str(db), "--json")
    assert report["code"] == 0, report["err"]
    figures = json.loads(report["out"])
    assert figures["run"]["id"] == 1 and figures["run"]["device"] == "NVIDIA H200"
    assert round(figures["copy_share"], 3) == 0.906 and figures["categories"][0]["category"] == "cast"
    assert report["loaded"] == ["_duckdb"]  # the engine, not the package's Python (db/engine.py)
    missing = _probe("report", "99", "--db", str(db))
    assert missing["code"] == 2 and missing["err"].strip() == f"stepwatch: error: {db}: no run with id 99"


def test_an_import_without_a_commit_loads_no_change_detection(tmp_path):
    """The worker's modules (and through them the detector's SciPy and ruptures) once loaded
    with every import command: 1.0-1.7 s of a 1.7-3.3 s import of a 179 MB trace."""
    trace = ROOT / "tests" / "data" / "traces" / "cpu_small.trace.json"
    done = _probe("import", str(trace), "--db", str(tmp_path / "i.duckdb"))
    assert done["code"] == 0, done["err"]
    assert done["out"].strip() == "1" and "imported run 1" in done["err"]
    assert "scipy" not in done["loaded"] and "ruptures" not in done["loaded"], done["loaded"]
    assert {"_duckdb", "msgspec", "numpy"} <= set(done["loaded"]) and "duckdb" not in done["loaded"]


@pytest.mark.parametrize("path", ["bundles/tiny-fused-eager-stack", "h200/tp2"])
def test_an_import_loads_no_pandas_or_pyarrow_and_writes_the_run(tmp_path, path):
    """A bundle (its manifest names a commit: the first of its series, nothing to compare) and a
    directory of two ranks: read, analysed, diagnosed, checked and written with NumPy and DuckDB."""
    db = tmp_path / "i.duckdb"
    done = _probe("import", str(ROOT / "tests" / "data" / path), "--db", str(db))
    assert done["code"] == 0, done["err"]
    assert done["out"].strip() == "1" and "imported run 1" in done["err"]
    assert not {"pandas", "pyarrow", "scipy", "ruptures"} & set(done["loaded"]), done["loaded"]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        ranks, kernels, diagnosis = con.execute(
            "SELECT r.ranks, (SELECT count(*) FROM kernel_stats k WHERE k.run_id = r.run_id), r.diagnosis"
            " FROM runs r WHERE r.run_id = 1").fetchone()
        stats = con.execute("SELECT count(*) FROM rank_stats WHERE run_id = 1").fetchone()[0]
    finally:
        con.close()
    assert ranks == stats == (2 if path == "h200/tp2" else 1) and kernels > 5 and json.loads(diagnosis)
    if path.startswith("bundles/"):  # a second commit of the series: now there is a change to look for
        other = _probe("import", str(ROOT / "tests" / "data" / "bundles" / "tiny-fused-eager-nostack"),
                       "--db", str(db), "--commit", "f" * 40)
        assert other["code"] == 0 and other["out"].strip() == "2", other["err"]
        assert {"pandas", "scipy", "ruptures"} <= set(other["loaded"]), other["loaded"]
