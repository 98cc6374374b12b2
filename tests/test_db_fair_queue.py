"""db/lock.py's fair queue, between real processes on a real DuckDB file.

Every waiter here is a real process opening the file through db.store.open_db. The order in
which they are served is read from one log they append to while they hold the file (a
reader's line cannot fall between a writer's taking the file and its line, nor the reverse),
and the states waited for are read from the queue itself (db.lock.list_queue), never from
the clock: these tests assert order, not time, and pass as well on a loaded 2-core machine.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from db.lock import QUEUE_SUFFIX, STALE_TEMP_S, list_queue
from db.store import StoreError, open_db
from tests.helpers import ROOT, wait_for

pytestmark = pytest.mark.slow

# Opens the database (read or write) as NAME, appends "NAME held" to the log while it holds it,
# keeps it until the release file exists (if one is named), closes it.
HOLDER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from db.store import open_db
    db, mode, name, log, release = sys.argv[1:6]
    with open_db(db, read_only=(mode == "read"), wait_s=600) as store:
        store.con.execute("SELECT count(*) FROM runs").fetchone()
        with open(log, "a") as out:
            out.write(name + " held\\n")
        while release != "-" and not os.path.exists(release):
            time.sleep(0.01)
""")


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "queue.duckdb"
    open_db(path).close()
    return path


class Holders:
    """The test's processes: start one and wait until it stands in the queue (or holds the file)."""

    def __init__(self, db, tmp_path):
        self.db, self.tmp, self.log = db, tmp_path, tmp_path / "order.log"
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, mode: str, hold: bool = False) -> subprocess.Popen:
        """Start `name`; with hold=True it keeps the file until release(name)."""
        before = {t for t, _, _ in list_queue(self.db)}
        release = str(self.tmp / f"release-{name}") if hold else "-"
        proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(self.db), mode, name,
                                 str(self.log), release])
        self.procs[name] = proc
        kind = "w" if mode == "write" else "r"
        # it has a ticket (new in the queue) or it holds the file already
        wait_for(lambda: name in self.order() or {t for t, k, _ in list_queue(self.db) if k == kind} - before
                 or proc.poll() is not None, f"{name} to stand in the queue")
        assert proc.poll() in (None, 0), f"{name} exited with {proc.poll()}"
        return proc

    def release(self, name: str) -> None:
        (self.tmp / f"release-{name}").touch()

    def order(self) -> list[str]:
        return [line.split()[0] for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def finish(self) -> None:
        for name, proc in self.procs.items():
            self.release(name)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.wait(timeout=600)


@pytest.fixture
def holders(db, tmp_path):
    made = Holders(db, tmp_path)
    yield made
    made.finish()


def _entries(db) -> list[tuple[int, str, int | None]]:
    return list_queue(db)


def test_a_reader_behind_three_queued_writers_goes_after_the_write_in_progress(db, holders):
    holders.start("w0", "write", hold=True)
    wait_for(lambda: holders.order() == ["w0"], "w0 to hold the file")
    for name in ("w1", "w2", "w3"):  # one after another: their tickets are in this order
        holders.start(name, "write")
    holders.start("r", "read")
    queue = _entries(db)
    assert [k for _, k, _ in queue] == ["w", "w", "w", "w", "r"], queue
    assert queue[0][2] is not None and all(a is None for _, _, a in queue[1:4]), queue  # only w0 is armed
    holders.release("w0")
    for name in ("w1", "w2", "w3", "r"):
        assert holders.procs[name].wait(timeout=600) == 0
    # the reader waited for the write in progress only; the writers kept the order they asked in
    assert holders.order() == ["w0", "r", "w1", "w2", "w3"]
    assert _entries(db) == []


def test_a_reader_that_asks_after_a_writer_armed_waits_for_it(db, holders):
    """Readers that always hold the file between them do not starve a writer: once it is armed,
    a reader asking again queues behind it, though other readers still hold the file."""
    for name in ("ra", "rb"):
        holders.start(name, "read", hold=True)
    wait_for(lambda: sorted(holders.order()) == ["ra", "rb"], "both readers to hold the file")
    holders.start("w", "write")
    wait_for(lambda: [(k, a is not None) for _, k, a in _entries(db)] == [("w", True)], "the writer to arm")
    holders.release("ra")  # ra lets go while rb holds: the file is never free of readers ...
    assert holders.procs["ra"].wait(timeout=600) == 0
    holders.start("rc", "read")  # ... and a new reader asks
    queue = _entries(db)
    assert [k for _, k, _ in queue] == ["w", "r"] and queue[1][0] > queue[0][2], queue  # behind the armed writer
    holders.release("rb")
    for name in ("w", "rc"):
        assert holders.procs[name].wait(timeout=600) == 0
    assert holders.order() == ["ra", "rb", "w", "rc"] or holders.order() == ["rb", "ra", "w", "rc"]


def test_readers_that_ask_while_readers_hold_join_them(db, holders):
    holders.start("ra", "read", hold=True)
    wait_for(lambda: holders.order() == ["ra"], "ra to hold the file")
    holders.start("rb", "read", hold=True)
    wait_for(lambda: holders.order() == ["ra", "rb"], "rb to hold the file beside ra")  # no writer armed
    assert _entries(db) == []


def test_a_waiter_killed_in_the_queue_does_not_stall_it(db, holders):
    holders.start("w0", "write", hold=True)
    wait_for(lambda: holders.order() == ["w0"], "w0 to hold the file")
    doomed_writer = holders.start("dead-w", "write")
    doomed_reader = holders.start("dead-r", "read")
    holders.start("w2", "write")
    holders.start("r", "read")
    assert [k for _, k, _ in _entries(db)] == ["w", "w", "r", "w", "r"]
    for proc in (doomed_writer, doomed_reader):
        proc.send_signal(signal.SIGKILL)  # kill -9 while queued: its entry stays behind, unlocked
        assert proc.wait(timeout=600) == -signal.SIGKILL
    holders.release("w0")
    for name in ("w2", "r"):
        assert holders.procs[name].wait(timeout=600) == 0
    assert holders.order() == ["w0", "r", "w2"]
    assert _entries(db) == [] and sorted(os.listdir(str(db) + QUEUE_SUFFIX)) == ["ticket"]  # dead entries removed


def test_an_armed_writer_killed_while_waiting_lets_the_readers_behind_it_go(db, holders):
    holders.start("ra", "read", hold=True)
    wait_for(lambda: holders.order() == ["ra"], "ra to hold the file")
    doomed = holders.start("dead-w", "write")
    wait_for(lambda: [(k, a is not None) for _, k, a in _entries(db)] == [("w", True)], "the writer to arm")
    holders.start("rb", "read", hold=True)
    assert [k for _, k, _ in _entries(db)] == ["w", "r"]  # rb waits behind the armed writer
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(timeout=600) == -signal.SIGKILL
    wait_for(lambda: holders.order() == ["ra", "rb"], "rb to hold the file beside ra")  # ra still holds it


def test_a_holder_killed_lets_the_next_one_in(db, holders):
    doomed = holders.start("dead-w", "write", hold=True)
    wait_for(lambda: holders.order() == ["dead-w"], "the writer to hold the file")
    holders.start("r", "read")
    holders.start("w", "write")
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(timeout=600) == -signal.SIGKILL
    for name in ("r", "w"):
        assert holders.procs[name].wait(timeout=600) == 0
    assert holders.order() == ["dead-w", "r", "w"]
    with open_db(db, read_only=True) as store:  # the file is whole: DuckDB replays what the killed writer left
        assert store.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_deadlines_in_the_queue_raise_and_leave_no_entry(db, holders):
    holders.start("w0", "write", hold=True)
    wait_for(lambda: holders.order() == ["w0"], "w0 to hold the file")
    holders.start("w1", "write")  # queued behind w0, not yet armed
    busy = rf"^{db}: database busy: another process held it for 0.3 s$"
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=busy):  # a reader behind the write in progress
        open_db(db, read_only=True, wait_s=0.3)
    with pytest.raises(StoreError, match=busy):  # a writer behind w1, which is behind w0
        open_db(db, wait_s=0.3)
    assert time.monotonic() - t0 < 300  # they gave up at their deadlines, not when w0 let go
    assert [k for _, k, _ in _entries(db)] == ["w", "w"]  # the two that gave up left the queue
    holders.release("w0")
    assert holders.procs["w1"].wait(timeout=600) == 0
    with open_db(db, read_only=True, wait_s=300) as store:  # and the queue moves on without them
        assert store.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert holders.order() == ["w0", "w1"]


def test_an_entry_left_unnamed_by_a_killed_process_is_removed_when_stale(db):
    """A process killed between making its entry and naming it leaves a temporary file that
    nobody waits for; the next writer to arm removes it once it is STALE_TEMP_S old (a younger
    one may be a waiter between those two steps right now)."""
    queue_dir = str(db) + QUEUE_SUFFIX
    open_db(db).close()  # the queue directory exists once anyone has waited
    old, young = os.path.join(queue_dir, "temp-1-1-1"), os.path.join(queue_dir, "temp-1-1-2")
    for path in (old, young):
        open(path, "w").close()
    os.utime(old, (time.time() - STALE_TEMP_S - 5, time.time() - STALE_TEMP_S - 5))
    with open_db(db) as store:  # a writer: it arms
        store.con.execute("SELECT 1").fetchone()
    assert sorted(os.listdir(queue_dir)) == ["temp-1-1-2", "ticket"]
