"""Hostile and broken input at the trace reader: a generated corpus of each class (written by
this file, not kept in git), each refused with one line naming the file and the limit or field
(exit 2, the database unchanged) or read with what can be measured and a note of what cannot.
And the importer's helper process never outlives it: kill -9 at random moments leaves no
process behind and no pipe held open."""

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from db.store import open_db
from ingest.cli import main
from tests.helpers import DATA, ROOT

pytestmark = pytest.mark.slow  # hostile files read to their limits, kill -9 of imports

SMALL = DATA / "bundles" / "tiny-fused-eager-nostack" / "trace.json.gz"
BIG = ROOT / "ingest" / "studies" / "benchmark_data" / "big-glm5-fullpool-30steps" / "trace.json.gz"


def _body():
    return json.loads(gzip.decompress(SMALL.read_bytes()))


def _write(path, body=None, raw=None, gz=False):
    data = raw if raw is not None else json.dumps(body).encode()
    path.write_bytes(gzip.compress(data, 6) if gz else data)
    return path


def _edited(tmp, name, edit):
    body = _body()
    edit(body)
    return _write(tmp / name, body)


def _first(body, cat):
    return next(e for e in body["traceEvents"] if e.get("cat") == cat)


def _refused_cases(tmp):
    """(name, file, text the one-line error must hold)."""
    raw = json.dumps(_body()).encode()
    cut = raw.index(b"},") + 2
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        ("gzip bomb of whitespace between events", _write(tmp / "bomb.json.gz", raw=raw[:cut] + b" " * (300 << 20)
                                                          + raw[cut:], gz=True), "without an event boundary"),
        ("a 40 MB name", _edited(tmp, "longname.json", lambda b: _first(b, "kernel").update(name="x" * (40 << 20))),
         "without an event boundary"),
        ("a 100,000-deep header", _write(tmp / "deephdr.json", raw=b'{"x": ' + deep + b', ' + raw[1:]),
         "nest deeper than"),
        ("100,000-deep args", _write(tmp / "deepargs.json", raw=raw.replace(b'"args": {', b'"args": {"deep": ' + deep
                                                                             + b', ', 1)), "nested deeper than"),
        ("a rank of 10**20", _edited(tmp, "bigrank.json", lambda b: b.update(distributedInfo={"rank": 10**20})),
         "not a rank"),
        ("a name of 70,000 characters", _edited(tmp, "name70k.json",
                                                lambda b: _first(b, "kernel").update(name="k" * 70_000)),
         "over the limit of 65,536"),
        ("every kernel's duration negative", _edited(tmp, "allneg.json", lambda b: [
            e.update(dur=-1) for e in b["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]),
         "has a duration that can be real"),
        ("a number beyond float", _write(tmp / "huge.json", raw=raw.replace(b'"dur": ', b'"dur": 1e999', 1)
                                         .replace(b'1e999', b'1e999, "x": ', 1)), "out of range"),
        ("gzip magic and garbage", _write(tmp / "garbage.json.gz", raw=b"\x1f\x8b" + os.urandom(4096)),
         "truncated or corrupt"),
    ]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    return _refused_cases(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("index", range(9))
def test_hostile_input_is_refused_in_one_line(refused, index, tmp_path, capsys):
    name, path, expected = refused[index]
    db = tmp_path / "used.duckdb"
    assert main(["import", str(SMALL), "--db", str(db)]) == 0
    with open_db(db, read_only=True) as store:
        before = store.count_rows()
    capsys.readouterr()
    started = time.monotonic()
    assert main(["import", str(path), "--db", str(db)]) == 2, name
    assert time.monotonic() - started < 60, name  # refused within seconds (a loaded 2-core machine: generous)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and expected in err[0], (name, err)
    with open_db(db, read_only=True) as store:
        assert store.count_rows() == before, name


def test_the_gzip_bomb_is_refused_in_bounded_memory(refused):
    # the whole command as a user runs it: its own peak (VmHWM, reset at exec, unlike ru_maxrss,
    # which a child forked from this big test process would inherit) and the peak of the helper it
    # may fork (ru_maxrss of its children, which counts pages shared with the importer too)
    path = refused[0][1]
    code = ("import resource, sys; from ingest.cli import main; rc = main(['import', sys.argv[1], '--db', sys.argv[2]]);"
            " hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'));"
            " print(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(path.with_suffix(".duckdb"))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    importer_kb, helper_kb = map(int, proc.stdout.split())
    assert importer_kb < 300 * 1024 and helper_kb < 300 * 1024, (importer_kb, helper_kb)


@pytest.mark.parametrize("case", ["gpu_only", "no_correlation", "ids_beyond_64_bits", "negative_and_huge",
                                  "zero_length_steps"])
def test_thin_or_odd_traces_are_read_with_a_note(case, tmp_path, capsys):
    def edit(body):
        ev = body["traceEvents"]
        if case == "gpu_only":  # profiled with activities=[CUDA]: kernels only
            body["traceEvents"] = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        elif case == "no_correlation":
            for e in ev:
                (e.get("args") or {}).pop("correlation", None)
        elif case == "ids_beyond_64_bits":
            for e in ev:
                if "correlation" in (e.get("args") or {}):
                    e["args"]["correlation"] += 2**64
        elif case == "negative_and_huge":
            kernels = [e for e in ev if e.get("cat") == "kernel"]
            kernels[0]["dur"], kernels[1]["dur"] = -3.5, 1.5e308
        elif case == "zero_length_steps":
            for e in ev:
                if str(e.get("name", "")).startswith("ProfilerStep"):
                    e["dur"] = 0

    path = _edited(tmp_path, f"{case}.json", edit)
    db = str(tmp_path / "t.duckdb")
    assert main(["import", str(path), "--db", db]) == 0
    capsys.readouterr()
    assert main(["report", "1", "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    notes = " ".join(report["notes"])
    kernels = report["kernels"]
    assert kernels and all(k["total_us"] >= 0 for k in kernels)
    want = {"gpu_only": "whole profiled window is read as one step",
            "no_correlation": "no kernel could be linked to its launch",
            "ids_beyond_64_bits": "beyond 64 bits were read as absent",
            "negative_and_huge": "2 kernels with a negative, non-finite or longer-than-a-day duration were set aside",
            "zero_length_steps": "hold none of its kernels"}[case]
    assert want in notes, notes
    if case == "negative_and_huge":
        body = _body()
        n = sum(1 for e in body["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        assert sum(k["calls"] for k in kernels) == n - 2


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="the two-process read (and its helper) exists only on Linux with 2+ CPUs")
def test_kill_9_of_an_import_leaves_no_process_behind(tmp_path):
    rng = random.Random(20261130)
    helpers_seen = 0
    for i in range(20):
        db = tmp_path / f"k{i}.duckdb"
        proc = subprocess.Popen([sys.executable, "-m", "ingest", "import", str(BIG), "--db", str(db)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        children = set()
        if i % 3 == 1:  # 7 of the 20: a random moment after its helper appeared, however long that takes
            deadline = time.monotonic() + 600
            while not children and time.monotonic() < deadline and proc.poll() is None:
                children.update(_children(proc.pid))
                time.sleep(0.01)
            deadline = time.monotonic() + rng.uniform(0.0, 0.3)
        else:  # the others: a random moment of its first seconds, before or after its helper starts
            deadline = time.monotonic() + rng.uniform(0.3, 2.5)
        while time.monotonic() < deadline and proc.poll() is None:
            children.update(_children(proc.pid))
            time.sleep(0.01)
        helpers_seen += bool(children)
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)  # returns: no helper holds the importer's pipes
        gone_by = time.monotonic() + 60
        while any(_alive(c) for c in children) and time.monotonic() < gone_by:
            time.sleep(0.05)
        assert not [c for c in children if _alive(c)], (i, children)
    assert helpers_seen >= 5  # kills landed while the helper was reading (the 7 that wait for it, at least)


@pytest.mark.parametrize("rules, expected", [
    ('[[rule]]\ncategory = "evil"\nname = \'(a|aa)+$\'\n', "took over 10 s matching kernel names"),
    ('rule = [1, 2]\n', "rule 1 is not a table"),
    ('[[rule]]\ncategory = "x"\nactivity = "kernel"\n', "field 'activity' must be a list"),
    ('[[rule]]\ncategory = "x"\nname = \'([a-\'\n', "is not a valid regex"),
])
def test_bad_rules_are_refused_in_one_line(rules, expected, tmp_path, capsys):
    # a kernel name built to make the first rule's regex backtrack for ever
    body = _body()
    _first(body, "kernel")["name"] = "a" * 40 + "b"
    trace = _write(tmp_path / "t.json", body)
    path = tmp_path / "rules.toml"
    path.write_text(rules)
    db = tmp_path / "r.duckdb"
    started = time.monotonic()
    assert main(["import", str(trace), "--rules", str(path), "--db", str(db)]) == 2
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and expected in err[0], err
    assert not db.exists()


BUNDLE = DATA / "bundles" / "tiny-fused-graph-nostack"


@pytest.mark.parametrize("edit, field", [
    (lambda m: m["workload"].update(batch_size="8"), "workload.batch_size"),
    (lambda m: m["workload"].update(batch_size=10**30), "workload.batch_size"),
    (lambda m: m.update(layers=4.5), "layers"),
    (lambda m: m.update(layers=10**20), "layers"),
    (lambda m: m.update(profiled_steps=-3), "profiled_steps"),
    (lambda m: m["timing"].update(median_ms=float("nan")), "NaN is not a number JSON allows"),
    (lambda m: m["timing"].update(p90_ms=float("inf")), "Infinity is not a number JSON allows"),
    (lambda m: m["timing"].update(tok_per_s=-1.0), "timing.tok_per_s"),
    (lambda m: m["timing"].update(step_ms=[1.0, "fast"]), "timing.step_ms"),
    (lambda m: m.update(commit="--upload-pack=touch /tmp/pwned"), "'commit'"),
    (lambda m: m.update(commit="$(rm -rf ~)"), "'commit'"),
    (lambda m: m.update(variant="fix\nnext line"), "'variant'"),
    (lambda m: m.update(variant="<img src=http://evil.example/x>"), "'variant'"),
    (lambda m: m.update(repo="a'b\"c"), "'repo'"),
])
def test_a_hostile_bundle_manifest_is_refused_as_the_command_line_refuses_it(edit, field, tmp_path, capsys):
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    db = tmp_path / "b.duckdb"
    assert main(["import", str(SMALL), "--db", str(db)]) == 0
    with open_db(db, read_only=True) as store:
        before = store.count_rows()
    capsys.readouterr()
    assert main(["import", str(bundle), "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "manifest.json" in err[0] and field in err[0], err
    with open_db(db, read_only=True) as store:
        assert store.count_rows() == before
