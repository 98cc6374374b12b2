"""Hostile and careless input, second corpus (issue 29, classes 3, 5, 6, 7, 8): each case is built
here (nothing kept in git but the real traces it starts from) and must end as the house rule
says: one line naming the file or field and what is wrong, exit 2, the database as it was; or,
for an import that runs long within every limit, a stop (cancel, SIGTERM, timeout_s) that ends
it within seconds and leaves no process, file or row behind.

Every wait is for an event (a job's state, a process's exit) with a generous bound (a loaded
two-core machine passes): these tests detect hangs, they time nothing."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from db.store import open_db
from tests.helpers import DATA, ROOT, run_cli, wait_for

SMALL = DATA / "bundles" / "tiny-fused-eager-nostack" / "trace.json.gz"
KEY = b'"traceEvents":'
STOP_WAIT_S = 30  # a stop must end the import within this (a hang detector, not a benchmark)


def _raw() -> bytes:
    return json.dumps(json.loads(gzip.decompress(SMALL.read_bytes()))).encode()


def _gzip_of(parts, path: Path) -> Path:
    """A .json.gz of the parts (bytes, or (bytes, times) for a run of one block), streamed."""
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6) as g:
        for part in parts:
            block, times = part if isinstance(part, tuple) else (part, 1)
            for _ in range(times):
                g.write(block)
    return path


def _import(path: Path, db: Path, *flags: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`python -m ingest import` as a user runs it; a hang is a failure (TimeoutExpired)."""
    return subprocess.run([sys.executable, "-m", "ingest", "import", str(path), "--db", str(db), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def _runs(db: Path) -> int:
    if not db.exists():
        return 0
    with open_db(db, read_only=True, wait_s=60) as store:
        return store.count_rows()["runs"]


def _one_line_refusal(result, *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# -- class 3: whitespace around "traceEvents": [ is skipped in linear time, and bounded ----------

SPACES_1MB = b" " * (1 << 20)


@pytest.mark.parametrize("where", ["after the key", "after the bracket", "before the object"])
def test_a_gzip_of_4_gb_of_whitespace_is_refused_at_the_padding_limit(tmp_path, where):
    """4 GB of spaces (a 4 MB gzip): on b4995d3 the reader re-joined its buffer at every read
    (quadratic: 16 MB took 28 s) and never finished; now refused past 16 MB of whitespace with the
    byte offset, exit 2, nothing written."""
    raw = _raw()
    at = raw.index(KEY) + len(KEY) + (2 if where == "after the bracket" else 0)  # json.dumps: `: [`
    if where == "before the object":
        parts = [(SPACES_1MB, 4096), raw]
    else:
        parts = [raw[:at], (SPACES_1MB, 4096), raw[at:]]
    bomb = _gzip_of(parts, tmp_path / "bomb.json.gz")
    assert bomb.stat().st_size < 8 << 20
    db = tmp_path / "x.duckdb"
    result = _import(bomb, db)
    line = _one_line_refusal(result, str(bomb), "bytes of whitespace before its first event", "at byte")
    offset = int(line.split("at byte ")[1].split()[0].replace(",", ""))
    assert 16 << 20 < offset < 17 << 20  # refused as soon as the limit is passed
    assert _runs(db) == 0


def test_whitespace_under_the_limit_is_read_as_if_it_were_not_there(tmp_path):
    """12 MB of spaces after the key and 2 MB after '[' (under the 16 MB limit): the same run as
    the file without them (a check of the skip's bookkeeping, not of its speed)."""
    raw = _raw()
    at = raw.index(KEY) + len(KEY)
    padded = tmp_path / "padded.json"
    padded.write_bytes(raw[:at] + b" \n" * (6 << 20) + b"[" + b"\t" * (2 << 20) + raw[at + 2:])
    plain = tmp_path / "plain.json"
    plain.write_bytes(raw)
    figures = []
    for path in (plain, padded):
        db = tmp_path / f"{path.stem}.duckdb"
        result = _import(path, db)
        assert result.returncode == 0, result.stderr
        with open_db(db, read_only=True) as store:
            figures.append(store.con.execute("SELECT steps, step_ms_median, kernel_us_total FROM runs").fetchall())
    assert figures[0] == figures[1] and figures[0][0][0] > 0


# -- class 3: an import job in the worker stops on cancel, SIGTERM and timeout_s ------------------

def _long_trace(path: Path, gb: int = 6) -> Path:
    """A trace that takes long to read within every limit: the small trace's events, then `gb`
    GB of 256 KB gaps of whitespace between padding events whose args carry 1.5 KB of random text
    (so the file inflates ~150x, under the 200x gzip-bomb limit), as concatenated gzip members
    (one member, written many times: gzip readers read them as one stream). ~15 s of reading on an
    idle machine, far more than a stop takes."""
    raw = _raw()
    at = raw.index(KEY) + len(KEY) + 2
    rnd = random.Random(29)
    junk = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/") for _ in range(1500))
    pad = json.dumps({"ph": "i", "cat": "pad", "name": "pad", "args": {"junk": junk}}).encode()
    member = gzip.compress((pad + b"," + b" " * (256 << 10)) * 4, 6)
    per_member = 4 * (len(pad) + 1 + (256 << 10))
    with open(path, "wb") as f:
        f.write(gzip.compress(raw[:at]))
        for _ in range((gb << 30) // per_member):
            f.write(member)
        f.write(gzip.compress(raw[at:]))
    return path


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    return _long_trace(tmp_path_factory.mktemp("long") / "long.json.gz")


class Worker:
    """A real `python -m ingest worker` on a real DuckDB file; its output collected."""

    def __init__(self, db: Path, *flags: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "ingest", "worker", "--db", str(db), "--poll-s", "0.2",
                                      "--config", str(_import_config(db)), *flags], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def import_process(self) -> int | None:
        """The pid of the worker's import child (a process group leader), once it runs."""
        for pid in _children(self.proc.pid):
            if os.getpgid(pid) == pid:
                return pid
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of process group `pgid` that are alive (not zombies)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _import_config(db: Path) -> Path:
    """A config whose [imports] roots are this pytest run's temporary directories (the test's own and the
    session's generated traces) and the repository's test data: the import engine reads only under
    the roots a config names (tests/test_hardening_doors.py)."""
    config = db.parent / "imports.toml"
    config.write_text(f'[imports]\nroots = ["{db.parent.parent.resolve()}", "{DATA.resolve()}"]\n')
    return config


def _queue_import(db: Path, path: Path, *flags: str) -> int:
    result = run_cli("ingest", "run", "--engine", "import", "--path", str(path), "--db", str(db), "--queue",
                     "--config", str(_import_config(db)), *flags)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])


def _job(db: Path, job_id: int) -> dict:
    with open_db(db, read_only=True, wait_s=60) as store:
        return store.get_job(job_id)


def _job_runs(db: Path, job_id: int) -> int:
    with open_db(db, read_only=True, wait_s=60) as store:
        return store.con.execute("SELECT count(*) FROM runs WHERE job_id = ?", [job_id]).fetchone()[0]


def _running_import(db: Path, worker: Worker, job_id: int) -> int:
    """Wait until job `job_id` runs and its import process (and its reader) has started."""
    wait_for(lambda: _job(db, job_id)["status"] == "running", f"job {job_id} running", 300)
    return wait_for(worker.import_process, "the import's process", 300)


def _assert_left_nothing(db: Path, group: int) -> None:
    wait_for(lambda: not _alive_in_group(group), f"the import's processes (group {group}) gone", STOP_WAIT_S)
    assert not list(Path("/dev/shm").glob(f"pym-{group}-*"))
    bundles = Path(f"{db}.bundles")
    assert not bundles.exists() or not [p for p in bundles.rglob("*") if "work" in p.name], list(bundles.rglob("*"))


def test_a_whitespace_bomb_job_fails_in_seconds_and_the_queue_goes_on(tmp_path):
    """On b4995d3 the job read the 4 GB of spaces for ever and the queue behind it stopped."""
    raw = _raw()
    at = raw.index(KEY) + len(KEY)
    bomb = _gzip_of([raw[:at], (SPACES_1MB, 4096), raw[at:]], tmp_path / "bomb.json.gz")
    db = tmp_path / "q.duckdb"
    bad, good = _queue_import(db, bomb), _queue_import(db, SMALL)
    worker = Worker(db, "--exit-when-idle")
    try:
        assert worker.proc.wait(timeout=300) == 0
    finally:
        worker.stop()
    job = _job(db, bad)
    assert (job["status"], job["error_kind"]) == ("failed", "bad-result"), job
    assert "bytes of whitespace before its first event" in job["error"]
    assert _job(db, good)["status"] == "succeeded" and _job_runs(db, bad) == 0 and _job_runs(db, good) == 1


def test_cancel_stops_a_long_import_job_within_seconds_and_the_next_job_runs(tmp_path, long_trace):
    db = tmp_path / "q.duckdb"
    long_job, next_job = _queue_import(db, long_trace), _queue_import(db, SMALL)
    worker = Worker(db, "--exit-when-idle")
    try:
        group = _running_import(db, worker, long_job)
        asked = time.monotonic()
        assert run_cli("ingest", "cancel", str(long_job), "--db", str(db)).returncode == 0
        wait_for(lambda: _job(db, long_job)["status"] == "cancelled", "the cancelled job", STOP_WAIT_S)
        assert time.monotonic() - asked < STOP_WAIT_S
        _assert_left_nothing(db, group)
        assert worker.proc.wait(timeout=300) == 0
    finally:
        worker.stop()
    assert _job_runs(db, long_job) == 0
    assert _job(db, next_job)["status"] == "succeeded" and _job_runs(db, next_job) == 1


def test_timeout_s_fails_a_long_import_job_and_the_next_job_runs(tmp_path, long_trace):
    db = tmp_path / "q.duckdb"
    long_job, next_job = _queue_import(db, long_trace, "--timeout-s", "4"), _queue_import(db, SMALL)
    worker = Worker(db, "--exit-when-idle")
    try:
        group = _running_import(db, worker, long_job)
        wait_for(lambda: _job(db, long_job)["status"] == "failed", "the timed-out job", STOP_WAIT_S)
        _assert_left_nothing(db, group)
        assert worker.proc.wait(timeout=300) == 0
    finally:
        worker.stop()
    job = _job(db, long_job)
    assert job["error_kind"] == "timeout" and "timeout_s of 4 s" in job["error"], job
    assert _job_runs(db, long_job) == 0
    assert _job(db, next_job)["status"] == "succeeded" and _job_runs(db, next_job) == 1


def test_sigterm_stops_a_long_import_job_requeues_it_and_the_worker_exits(tmp_path, long_trace):
    db = tmp_path / "q.duckdb"
    long_job, next_job = _queue_import(db, long_trace), _queue_import(db, SMALL)
    worker = Worker(db)
    try:
        group = _running_import(db, worker, long_job)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(timeout=STOP_WAIT_S) == 0
        _assert_left_nothing(db, group)
    finally:
        worker.stop()
    job = _job(db, long_job)
    assert job["status"] == "queued" and job["attempts"] == 0, job  # the stopped attempt does not count
    assert _job_runs(db, long_job) == 0
    # the queue goes on: the long job cancelled while queued, a new worker runs the next one
    assert run_cli("ingest", "cancel", str(long_job), "--db", str(db)).returncode == 0
    again = Worker(db, "--exit-when-idle")
    try:
        assert again.proc.wait(timeout=300) == 0
    finally:
        again.stop()
    assert _job(db, long_job)["status"] == "cancelled"
    assert _job(db, next_job)["status"] == "succeeded" and _job_runs(db, next_job) == 1


# -- class 5: files a user hands in are regular files, size and depth limited; regexes are safe -----

def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "settings.toml"
    os.mkfifo(fifo)
    return fifo


DOORS = {  # door -> the command line that hands it FILE (a trace to import: the small real one)
    "--rules": ["import", str(SMALL), "--rules", "FILE"],
    "--patterns": ["import", str(SMALL), "--patterns", "FILE"],
    "--config": ["run", "--engine", "import", "--path", str(SMALL), "--queue", "--config", "FILE"],
    "spec file": ["run", "FILE", "--engine", "import", "--path", str(SMALL), "--queue"],
}


def _hand_in(door: str, file: Path, db: Path) -> subprocess.CompletedProcess:
    args = [str(file) if a == "FILE" else a for a in DOORS[door]]
    return subprocess.run([sys.executable, "-m", "ingest", *args, "--db", str(db)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _deep_toml(tmp_path: Path) -> Path:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 600 + "]" * 600 + "\n")
    return path


def _deep_json(tmp_path: Path) -> Path:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def _big(tmp_path: Path) -> Path:
    path = tmp_path / "big.toml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    return path


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("make, words", [
    (lambda tmp: Path("/dev/zero"), ["/dev/zero", "is a character device, not a regular file"]),
    (_fifo, ["is a FIFO, not a regular file"]),
    (lambda tmp: tmp, ["is a directory, not a regular file"]),
    (_big, ["is larger than 1,048,576 bytes"]),
    (_deep_toml, ["nests deeper than 32 levels"]),
    (_deep_json, ["nests deeper than 32 levels"]),
], ids=["dev-zero", "fifo", "directory", "2-MB", "600-deep-toml", "100000-deep-json"])
def test_a_settings_file_that_is_not_one_is_refused_in_one_line(tmp_path, door, make, words):
    """On b4995d3: /dev/zero grew to 3.4-3.7 GB before MemoryError, a FIFO blocked for ever, a
    600-deep TOML raised RecursionError (a traceback)."""
    if make is _deep_json and door in ("--rules", "--patterns"):
        words = ["not valid TOML"]  # rules and patterns are TOML, whatever the file's name
    file = make(tmp_path)
    db = tmp_path / "x.duckdb"
    result = _hand_in(door, file, db)
    _one_line_refusal(result, str(file), *words)
    assert _runs(db) == 0


def test_a_rule_whose_activity_nests_a_list_is_refused_in_one_line(tmp_path):
    """`rules_activity_nested`: a TypeError traceback on b4995d3."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncategory = "x"\nactivity = [["kernel"]]\n')
    _one_line_refusal(_hand_in("--rules", rules, tmp_path / "x.duckdb"), str(rules), "rule 1 field 'activity'")


@pytest.mark.parametrize("door, body", [
    ("--rules", '[[rule]]\ncategory = "x"\nname = \'a{4294967296}\'\n'),
    ("--patterns", '[[pattern]]\nid = "big"\nsubject = "kernel"\nname = \'a{1001}\'\nsentence = "x"\n'),
    ("--patterns", '[[pattern]]\nid = "backref"\nsubject = "kernel"\nname = \'(a)\\1\'\nsentence = "x"\n'),
])
def test_a_regex_no_engine_can_build_is_refused_in_one_line(tmp_path, door, body):
    """`a{4294967296}` made `re` raise OverflowError (a traceback) on b4995d3."""
    file = tmp_path / "user.toml"
    file.write_text(body)
    db = tmp_path / "x.duckdb"
    _one_line_refusal(_hand_in(door, file, db), str(file), "field 'name' is not a valid regex")
    assert _runs(db) == 0


def test_a_pattern_regex_that_would_backtrack_for_ever_matches_in_linear_time(tmp_path):
    """'(a+)+$' against a kernel named 60 a's and '!': `re` backtracks 2**60 steps (b4995d3 hung);
    RE2 (google-re2) answers at once. The import ends, the pattern did not fire on that kernel but
    fires on one it matches (the same regex, in a second pattern, against a name that ends in a)."""
    body = json.loads(gzip.decompress(SMALL.read_bytes()))
    kernels = [e for e in body["traceEvents"] if e.get("cat") == "kernel"]
    name = kernels[0]["name"]
    for e in kernels:
        if e["name"] == name:
            e["name"] = "a" * 60 + "!"
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(body))
    patterns = tmp_path / "patterns.toml"
    patterns.write_text('[[pattern]]\nid = "evil"\nsubject = "kernel"\nname = \'^(a+)+$\'\n'
                        'sentence = "{kernel} matched"\n\n'
                        '[[pattern]]\nid = "bang"\nsubject = "kernel"\nname = \'^(a+)+!$\'\n'
                        'sentence = "{kernel} matched"\n')
    db = tmp_path / "x.duckdb"
    result = _import(trace, db, "--patterns", str(patterns), timeout_s=300)
    assert result.returncode == 0, result.stderr
    with open_db(db, read_only=True) as store:
        found = store.con.execute("SELECT patterns FROM runs").fetchone()[0]
    ids = {f["pattern"] for f in json.loads(found)["findings"]}
    assert "bang" in ids and "evil" not in ids, found


@pytest.mark.parametrize("make, words", [
    (lambda tmp: Path("/dev/zero"), ["/dev/zero", "is a character device, not a trace file or a directory"]),
    (_fifo, ["is a FIFO, not a trace file or a directory"]),
])
def test_a_path_that_is_a_device_or_a_fifo_is_refused_in_one_line(tmp_path, make, words):
    """NotADirectoryError (a traceback) on b4995d3."""
    path = make(tmp_path)
    db = tmp_path / "x.duckdb"
    _one_line_refusal(_import(path, db), str(path), *words)
    assert _runs(db) == 0


BUNDLE = DATA / "bundles" / "tiny-fused-eager-nostack"


@pytest.mark.parametrize("kind, words", [
    ("fifo", ["manifest.json: is a FIFO, not a regular file"]),
    ("device", ["manifest.json: is a device, not a regular file"]),
    ("huge", ["manifest.json: 2,000,000 bytes, more than a manifest's limit (MANIFEST_MAX_BYTES"]),
])
def test_a_bundle_whose_manifest_is_not_a_small_regular_file_is_refused_in_one_line(tmp_path, kind, words):
    """On 92529cb a manifest.json that is a FIFO or a link to /dev/zero made the directory a plain
    trace directory (imported, its manifest ignored, exit 0), and a huge one was read whole."""
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle)
    manifest = bundle / "manifest.json"
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "device":
        manifest.symlink_to("/dev/zero")
    else:
        manifest.write_bytes(b" " * 2_000_000)
    db = tmp_path / "x.duckdb"
    _one_line_refusal(_import(bundle, db), *words)
    assert _runs(db) == 0


def test_gzip_magic_then_an_invalid_deflate_block_is_refused_in_one_line(tmp_path):
    """`gzip_magic_garbage` (a valid gzip header, then garbage): isal's IsalError was a traceback."""
    good = gzip.compress(_raw())
    bad = tmp_path / "garbage.json.gz"
    bad.write_bytes(good[:10] + random.Random(5).randbytes(4096))
    db = tmp_path / "x.duckdb"
    _one_line_refusal(_import(bad, db), str(bad), "compressed data is truncated or corrupt")
    assert _runs(db) == 0


# -- class 6: a damaged database is one line naming the file; a full disk is said as it is -------

@pytest.fixture(scope="module")
def good_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("good") / "good.duckdb"
    assert _import(SMALL, db).returncode == 0
    return db


def _damaged(kind: str, good: Path, tmp: Path) -> Path:
    db = tmp / f"{kind}.duckdb"
    data = good.read_bytes()
    if kind == "truncated":
        db.write_bytes(data[: len(data) // 2])
    elif kind == "header-garbage":
        db.write_bytes(random.Random(6).randbytes(4096) + data[4096:])
    elif kind == "empty":
        db.write_bytes(b"")
    elif kind == "text":
        db.write_text("not a database\n" * 100)
    elif kind == "directory":
        db.mkdir()
    return db


def _state(db: Path):
    return db.read_bytes() if db.is_file() else ("dir", sorted(p.name for p in db.iterdir()))


@pytest.mark.parametrize("kind", ["truncated", "header-garbage", "empty", "text", "directory"])
@pytest.mark.parametrize("command", ["import", "jobs"])
def test_a_damaged_database_is_one_line_naming_it_and_is_left_as_it_was(tmp_path, good_db, kind, command):
    """A truncated file raised DuckDB's IOException as a traceback on b4995d3 (the others were
    one line already; kept so they stay so, in every command that opens the file)."""
    db = _damaged(kind, good_db, tmp_path)
    before = _state(db)
    args = {"import": ["import", str(SMALL)], "jobs": ["jobs"]}[command]
    result = subprocess.run([sys.executable, "-m", "ingest", *args, "--db", str(db)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    _one_line_refusal(result, str(db), "database")
    assert _state(db) == before


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MB filesystem (tmpfs; CI runs as root). Skipped only when it cannot be mounted."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave_kb: int) -> None:
    free_kb = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize // 1024
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free_kb - leave_kb) * 1024)


def test_a_full_disk_before_the_database_exists_leaves_no_file_behind(small_disk):
    """b4995d3 left a 0-byte file, which every later open then called 'not a valid DuckDB file'."""
    _fill(small_disk, 0)
    db = small_disk / "x.duckdb"
    _one_line_refusal(_import(SMALL, db), str(db), "No space left on device")
    assert not db.exists() and not Path(f"{db}.wal").exists()


def test_a_disk_that_fills_at_the_checkpoint_says_the_run_is_stored_and_it_is(small_disk):
    """The run's commit reached the WAL, the checkpoint on close did not fit: b4995d3 said
    'IOException' (a traceback, exit 1) although the run was stored; now exit 0, a note, the run there."""
    _fill(small_disk, 80)
    db = small_disk / "x.duckdb"
    result = _import(SMALL, db)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "is stored, in the database's write-ahead log" in result.stderr and "disk is full" in result.stderr
    (small_disk / "filler").unlink()
    assert _runs(db) == 1


def test_a_read_only_filesystem_is_one_line(small_disk):
    db = small_disk / "x.duckdb"
    assert _import(SMALL, db).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    before = db.read_bytes()
    _one_line_refusal(_import(SMALL, db, "--repo", "other"), str(db), "Read-only file system")
    assert db.read_bytes() == before and _runs(db) == 1


# -- class 7: damaged correlation ids are noticed, and kernels linked by External id instead -------

LINKED = DATA / "h200" / "fp32-logits" / "stepwatch-fp32-logits.trace.json.gz"  # eager, real H200 capture


def _with_correlations(source: Path, damage: str, path: Path) -> Path:
    body = json.loads(gzip.decompress(source.read_bytes()))
    events = body["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if damage == "all equal":
        for e in events:
            if "correlation" in e.get("args", {}):
                e["args"]["correlation"] = 1
    else:  # rotated: each kernel takes the next kernel's id (the last the first's)
        ids = [e["args"]["correlation"] for e in kernels]
        for e, new in zip(kernels, ids[1:] + ids[:1]):
            e["args"]["correlation"] = new
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    return path


def _run_row(db: Path):
    with open_db(db, read_only=True) as store:
        return store.con.execute("SELECT step_ms_median, steps, notes FROM runs").fetchone()


@pytest.mark.parametrize("source", [SMALL, LINKED], ids=["tiny-fused-eager", "h200-fp32-logits"])
@pytest.mark.parametrize("damage", ["all equal", "rotated"])
def test_damaged_correlation_ids_give_the_undamaged_steps_and_say_so(tmp_path, source, damage):
    """b4995d3 linked the kernels to other launches, so other steps (step ms 2.110 / 2.055 for
    2.001), and said nothing; now the links are made by External id, the step figure is the
    undamaged trace's and the run's notes say the ids were damaged."""
    plain_db, damaged_db = tmp_path / "plain.duckdb", tmp_path / "damaged.duckdb"
    assert _import(source, plain_db).returncode == 0
    damaged = _with_correlations(source, damage, tmp_path / "damaged.json.gz")
    result = _import(damaged, damaged_db)
    assert result.returncode == 0, result.stderr
    plain, hurt = _run_row(plain_db), _run_row(damaged_db)
    assert hurt[1] == plain[1] and hurt[0] == pytest.approx(plain[0], rel=1e-9), (plain, hurt)
    assert "correlation ids are damaged" in str(hurt[2]) and "by External id" in str(hurt[2]), hurt[2]
    assert "correlation ids are damaged" not in str(plain[2])


# -- class 8: a bundle that lists one trace many times is refused before any is decoded ----------

def test_a_bundle_of_300_copies_of_one_trace_is_refused_at_the_second_copy(tmp_path):
    """b4995d3 decoded all 300 (21 s under load) before saying that several claim rank 0; now the
    second copy is named as the first's twin as the traces are hashed, before the reading."""
    source = DATA / "bundles" / "tiny-fused-eager-nostack"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["traces"] = [f"rank{i}.trace.json.gz" for i in range(300)]
    for name in manifest["traces"]:
        shutil.copy(source / "trace.json.gz", bundle / name)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    db = tmp_path / "x.duckdb"
    _one_line_refusal(_import(bundle, db), str(bundle / "rank1.trace.json.gz"), "same bytes as rank0.trace.json.gz")
    assert _runs(db) == 0
