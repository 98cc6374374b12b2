"""Who gets the database file, between real processes (db/lock.py) and within one (db/attach.py).

Every holder here is a real process opening a real DuckDB file through db.store.open_db. The
tests wait for states they can observe (a line printed, a lock file's lock taken) with generous
deadlines, never for a number of seconds a loaded machine may not honour; a starved writer is
measured in the readers' holds, and the bounds on giving up are far below what waiting on
would take (a holder that never lets go, a child that sleeps 900 s)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest

from db.lock import list_queue
from db.store import StoreError, open_db
from tests.helpers import ROOT, wait_for

# Opens the database (read or write), prints "held <t>" with a monotonic clock, keeps it until
# the release file exists (or for HOLD seconds), closes it and prints "released <t>".
HOLDER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from db.store import open_db
    db, mode, release, hold = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    print("asking", time.monotonic(), flush=True)
    with open_db(db, read_only=(mode == "read"), wait_s=300) as store:
        print("held", time.monotonic(), flush=True)
        store.con.execute("SELECT count(*) FROM runs").fetchone()
        end = time.monotonic() + hold
        while not os.path.exists(release) and time.monotonic() < end:
            time.sleep(0.01)
    print("released", time.monotonic(), flush=True)
""")


def _start(db, mode, release, hold=600.0):
    return subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(db), mode, str(release),
                             str(hold)], stdout=subprocess.PIPE, text=True)


def _expect(proc, word, timeout=300):
    """The monotonic time the holder printed `word` at (waits for the line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(word):
            return float(line.split()[1])
    raise AssertionError(f"holder never said {word!r} (exit {proc.poll()})")


def _reader_waiting(db) -> bool:
    """A reader stands in the file's queue (db/lock.py): it is waiting for the file."""
    return any(kind == "r" for _, kind, _ in list_queue(db))


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "lock.duckdb"
    open_db(path).close()
    return path


@pytest.mark.slow
def test_a_waiting_reader_goes_before_the_next_writer(db, tmp_path):
    first = _start(db, "write", tmp_path / "release-first")
    _expect(first, "held")
    reader = _start(db, "read", tmp_path / "release-reader", hold=0.3)
    _expect(reader, "asking")
    deadline = time.monotonic() + 300
    while not _reader_waiting(db):
        assert time.monotonic() < deadline and reader.poll() is None, "the reader never waited"
        time.sleep(0.01)
    writer = _start(db, "write", tmp_path / "release-second", hold=0.0)
    _expect(writer, "asking")
    (tmp_path / "release-first").touch()
    reader_held, reader_released = _expect(reader, "held"), _expect(reader, "released")
    writer_held = _expect(writer, "held")
    # the second writer started only after the reader had been served and let go
    assert writer_held >= reader_released > reader_held
    for p in (first, reader, writer):
        assert p.wait(timeout=300) == 0


@pytest.mark.slow
def test_a_stream_of_readers_does_not_starve_a_writer(db, tmp_path):
    """Three readers hold the file in turn, never all letting go at once. The writer's wait is
    measured in their work, not in seconds: once it is armed, new readers queue behind it
    (db/lock.py), so it waits for at most the hold each reader is in or queued for, plus those
    they begin while this test's own open reaches the queue (at most one per 0.1 s each; the
    bound allows a second of it). A starved writer would watch them take the file thousands of
    times until its deadline. tests/test_db_fair_queue.py shows the order itself."""
    stop = tmp_path / "stop-readers"
    loop = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from db.store import open_db
        holds = open(sys.argv[1], "a")
        while not os.path.exists({str(stop)!r}):
            with open_db({str(db)!r}, read_only=True, wait_s=300):
                holds.write("held\\n")
                holds.flush()
                time.sleep(0.1)  # readers overlap: the file is never free of them
    """)
    logs = [tmp_path / f"reader-{i}.holds" for i in range(3)]
    readers = [subprocess.Popen([sys.executable, "-c", loop, str(log)]) for log in logs]

    def holds() -> list[int]:
        return [len(log.read_text().splitlines()) if log.exists() else 0 for log in logs]

    try:
        wait_for(lambda: min(holds()) >= 2, "every reader to hold the file twice")  # their holds overlap
        before = sum(holds())
        with open_db(db, wait_s=300) as store:  # the patience, then new readers queue behind it
            during = sum(holds()) - before
            store.con.execute("CREATE TABLE IF NOT EXISTS marks (x INTEGER)")
        assert during <= len(readers) * (1 + 1.0 / 0.1), (during, holds())
    finally:
        stop.touch()
        for r in readers:
            assert r.wait(timeout=300) == 0


@pytest.mark.slow
def test_busy_past_the_deadline_is_one_line_naming_the_file(db, tmp_path):
    holder = _start(db, "write", tmp_path / "release")
    _expect(holder, "held")
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=rf"^{db}: database busy: another process held it for 0.5 s$"):
            open_db(db, read_only=True, wait_s=0.5)
        assert time.monotonic() - t0 < 120  # it gave up at its deadline, not when the holder let go
    finally:
        (tmp_path / "release").touch()
        assert holder.wait(timeout=300) == 0
    with open_db(db, read_only=True, wait_s=60) as store:  # and free again once it let go
        assert store.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


@pytest.mark.slow
def test_a_process_without_our_locks_is_waited_for(db, tmp_path):
    """An older stepwatch or a DuckDB shell takes only DuckDB's own lock: open_db retries."""
    release = tmp_path / "release"
    foreign = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, os, time
        con = duckdb.connect({str(db)!r})
        print("held", flush=True)
        while not os.path.exists({str(release)!r}):
            time.sleep(0.01)
        con.close()
    """)], stdout=subprocess.PIPE, text=True)
    assert foreign.stdout.readline().strip() == "held"
    threading.Timer(0.5, release.touch).start()
    with open_db(db, wait_s=300) as store:
        store.con.execute("CREATE TABLE after_foreign (x INTEGER)")
    assert foreign.wait(timeout=300) == 0


def test_nested_and_threaded_opens_in_one_process(db):
    with open_db(db) as outer:
        outer.con.execute("CREATE TABLE t (x INTEGER)")
        outer.con.execute("INSERT INTO t VALUES (1)")
        with open_db(db) as inner:  # same thread: shares the hold and the attachment
            inner.con.execute("INSERT INTO t VALUES (2)")
        with open_db(db, read_only=True) as reader:  # a view read inside a write
            assert reader.con.execute("SELECT sum(x) FROM t").fetchone() == (3,)
        assert outer.con.execute("SELECT count(*) FROM t").fetchone() == (2,)
    results = []

    def write(i):
        with open_db(db, wait_s=300) as store:
            store.con.execute("INSERT INTO t VALUES (?)", [i])
            results.append(i)

    threads = [threading.Thread(target=write, args=(10 + i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open_db(db, read_only=True) as store:
        assert store.con.execute("SELECT count(*), sum(x) FROM t").fetchone() == (10, 3 + sum(range(10, 18)))
    # and the file is free for another process the moment the last one closed
    out = subprocess.run([sys.executable, "-c", f"import duckdb; print(duckdb.connect({str(db)!r}).execute("
                          "'SELECT count(*) FROM t').fetchone()[0])"], capture_output=True, text=True)
    assert out.stdout.strip() == "10", out.stderr


@pytest.mark.slow
def test_a_forked_child_does_not_keep_the_parents_hold(db):
    """The trace reader forks a helper; a write hold must end when the parent closes, not when
    the helper exits."""
    store = open_db(db)
    pid = os.fork()
    if pid == 0:  # the child: outlives the parent's hold by far, touches nothing
        time.sleep(900)
        os._exit(0)
    try:
        store.close()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import sys; sys.path.insert(0, {str(ROOT)!r})
            from db.store import open_db
            with open_db({str(db)!r}, wait_s=300) as s:
                s.con.execute("CREATE TABLE after_fork (x INTEGER)")
            print("ok")
        """)], capture_output=True, text=True, timeout=600)
        assert out.stdout.strip() == "ok", out.stderr
        assert time.monotonic() - t0 < 600  # not the child's 900 s
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_attach_names_a_file_that_is_not_a_database(tmp_path):
    bad = tmp_path / "not-a-db.duckdb"
    bad.write_bytes(b"this is not a duckdb file" * 100)
    with pytest.raises(StoreError, match=rf"^{bad}: cannot open database \("):
        open_db(bad, read_only=True)
    with pytest.raises(StoreError, match=rf"^{bad}: cannot open database \("):
        open_db(bad)
    quoted = tmp_path / "it's.duckdb"  # the path is quoted in ATTACH, not formatted raw
    with open_db(quoted) as store:
        assert store.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert duckdb.connect(str(quoted), read_only=True).execute("SELECT count(*) FROM jobs").fetchone() == (0,)
