"""Bad input: a one-line error naming the file and the problem, exit code 2, and the database
exactly as it was (byte for byte when it existed; not created when it did not)."""

import gzip
import json
import os
import shutil

import pytest

from tests.helpers import DATA, TRACES, file_digest, run_cli

pytestmark = pytest.mark.slow  # one CLI process per bad file

GOOD = TRACES / "cpu_small.trace.json"


def _good_events():
    return json.loads(GOOD.read_text())


def _write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _trace_with(tmp, name, mutate):
    body = _good_events()
    mutate(body)
    return _write(tmp / name, json.dumps(body))


def _first(body, cat):
    return next(e for e in body["traceEvents"] if e.get("cat") == cat)


def _case_files(tmp):
    """(name, path, extra CLI args, text the error must contain)."""
    good_gz = gzip.compress(GOOD.read_bytes())
    no_steps = _good_events()
    no_steps["traceEvents"] = [e for e in no_steps["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    bundle_missing = tmp / "bundle_missing"
    bundle_missing.mkdir()
    _write(bundle_missing / "manifest.json", json.dumps({
        "format": "stepwatch-bundle", "version": 1, "engine": "reference", "variant": "x",
        "workload": {}, "device": {}, "versions": {}, "traces": ["trace.json.gz"]}))
    # ASTRA-sim's results layout: execution traces named *.pt.trace.json beside the Kineto traces
    # (a real Chakra execution trace from HTA's test data, and one of our captures)
    mixed = tmp / "mixed_dir"
    mixed.mkdir()
    shutil.copy(DATA / "wild" / "hta__execution_trace__benchmark_simple_add_et.json.gz",
                mixed / "eg.rank_0.pt.trace.json.gz")
    shutil.copy(GOOD, mixed / "kineto.rank_0_step_4.json")
    bundle_badjson = tmp / "bundle_badjson"
    bundle_badjson.mkdir()
    _write(bundle_badjson / "manifest.json", "{not json")
    shutil.copy(GOOD, bundle_badjson / "trace.json")
    bundle_future = tmp / "bundle_future"
    bundle_future.mkdir()
    shutil.copy(GOOD, bundle_future / "trace.json")
    _write(bundle_future / "manifest.json", json.dumps({
        "format": "stepwatch-bundle", "version": 99, "engine": "reference", "variant": "x",
        "workload": {}, "device": {}, "versions": {}, "traces": ["trace.json"]}))
    empty_dir = tmp / "empty_dir"
    empty_dir.mkdir()
    _write(empty_dir / "notes.txt", "no traces here")
    text = GOOD.read_text()
    os.symlink(tmp / "nowhere.json", tmp / "dangling.json")
    return [
        ("empty file", _write(tmp / "empty.json", b""), [], "is empty"),
        ("plain text", _write(tmp / "text.json", "hello, this is not a trace"), [], "is not a trace: it starts with"),
        ("random bytes", _write(tmp / "noise.json", bytes(range(256)) * 4), [], "is not a trace: it starts with"),
        ("truncated gzip", _write(tmp / "cut.json.gz", good_gz[: len(good_gz) // 2]), [], "truncated"),
        ("gzip of text", _write(tmp / "text.json.gz", gzip.compress(b"hello")), [], "is not a trace: it starts with"),
        # a top-level array is Chrome's JSON Array Format (the events themselves): these are not events
        ("top-level array", _write(tmp / "array.json", "[1, 2, 3]"), [], "traceEvents[0]: Expected object"),
        ("open array", _write(tmp / "open.json", text[text.index("[", text.index('"traceEvents"')):
                                                       text.rindex("]")].rstrip().rstrip(",")), [],
         "array of events does not end with ']'"),
        ("no traceEvents", _write(tmp / "nokey.json", '{"schemaVersion": 1}'), [], "no 'traceEvents'"),
        ("traceEvents not a list", _write(tmp / "notlist.json", '{"traceEvents": 5}'), [], "not an array"),
        ("no events", _write(tmp / "noevents.json", '{"traceEvents": []}'), [], "no events"),
        ("truncated JSON", _write(tmp / "cut.json", text[: len(text) * 3 // 5]), [], "truncated"),
        ("events not objects", _write(tmp / "ints.json", '{"traceEvents": [1, 2, 3]}'), [], "traceEvents[0]"),
        ("ts is a string", _trace_with(tmp, "ts.json", lambda b: _first(b, "cpu_op").update(ts="soon")), [],
         "field 'ts'"),
        ("dur is a list", _trace_with(tmp, "dur.json", lambda b: _first(b, "cpu_op").update(dur=[1])), [],
         "field 'dur'"),
        ("name is a number", _trace_with(tmp, "name.json", lambda b: _first(b, "cpu_op").update(name=7)), [],
         "field 'name'"),
        ("External id is text", _trace_with(tmp, "ext.json",
                                            lambda b: _first(b, "cpu_op")["args"].update({"External id": "x"})),
         [], "field 'args.External id'"),
        ("bad JSON mid-array", _write(tmp / "mid.json", text.replace('"ph": "X"', '"ph": "X",,', 1)), [],
         "not valid JSON"),
        ("only metadata", _write(tmp / "meta.json", json.dumps({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]})), [],
         "no GPU kernels and no CPU ops"),
        ("a Chakra execution trace", _write(tmp / "chakra_et.json", json.dumps(
            {"schema": "1.0.2-chakra.0.0.4", "pid": 1, "time": "x", "start_ts": 1, "nodes": [], "finish_ts": 2})),
         [], "no 'traceEvents'"),
        ("--steps too many", _write(tmp / "nosteps2.json", json.dumps(no_steps)), ["--steps", "100000"],
         "does not fit"),
        ("missing path", tmp / "absent.json", [], "no such file"),
        ("dangling link", tmp / "dangling.json", [], "no such file"),
        ("directory without traces", empty_dir, [], "holds no trace files"),
        ("directory with an execution trace named like a trace", mixed, [],
         "other JSON file(s), kineto.rank_0_step_4.json, were not read"),
        ("bundle missing its trace", bundle_missing, [], "missing from the bundle"),
        ("bundle manifest not JSON", bundle_badjson, [], "manifest.json: not JSON"),
        ("bundle from the future", bundle_future, [], "newer than this stepwatch reads"),
        ("commit looks like an option", GOOD, ["--commit=-rf"], "--commit"),
        ("commit with shell characters", GOOD, ["--commit", "main;rm -rf /"], "--commit"),
    ]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return _case_files(tmp_path_factory.mktemp("bad"))


CASES = 29


def test_corpus_is_large_enough(cases):
    assert len(cases) == CASES  # every case is run below


@pytest.mark.parametrize("index", range(CASES))
def test_bad_input_is_refused_cleanly(cases, index, tmp_path):
    name, path, extra, expected = cases[index]
    db = tmp_path / "fresh.duckdb"
    result = run_cli("ingest", "import", str(path), "--db", str(db), *extra)
    assert result.returncode == 2, (name, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, (name, result.stderr)
    assert expected in lines[0], (name, lines[0])
    if "--commit" not in expected:
        assert path.name in lines[0], (name, lines[0])
    assert result.stdout == ""
    assert not db.exists(), name


def test_existing_database_is_untouched(cases, tmp_path):
    db = tmp_path / "used.duckdb"
    ok = run_cli("ingest", "import", str(GOOD), "--db", str(db))
    assert ok.returncode == 0, ok.stderr
    before = file_digest(db)
    for name, path, extra, _ in cases:
        result = run_cli("ingest", "import", str(path), "--db", str(db), *extra)
        assert result.returncode == 2, name
        assert file_digest(db) == before, name
