"""Batch work below the pages' priority, database work at the process's own (ingest/priority.py).
Run in a child process: lowering a thread's priority cannot be undone without privilege."""

import subprocess
import sys
import textwrap

from tests.helpers import ROOT

CHILD = textwrap.dedent("""
    import os, sys, threading
    sys.path.insert(0, {root!r})
    from ingest.priority import DatabaseThread, lower_this_thread, run_as_batch

    def nice():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def forked_nice():  # a process forked from this thread (the trace reader's helper)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, str(os.getpriority(os.PRIO_PROCESS, 0)).encode()); os._exit(0)
        os.waitpid(pid, 0)
        return int(os.read(r, 10))

    start = nice()
    batch = run_as_batch(nice)
    try:
        run_as_batch(lambda: 1 / 0)
        raised = "no"
    except ZeroDivisionError:
        raised = "yes"
    with DatabaseThread() as db:
        lower_this_thread()
        print(start, batch, raised, nice(), db(nice), forked_nice(), nice() == start)
""")


def _child(env_nice):
    env = {"PATH": "/usr/bin:/bin", "STEPWATCH_BATCH_NICE": env_nice}
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT))], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_batch_work_runs_lower_and_database_work_does_not():
    start, batch, raised, main_after, db, forked, unchanged = _child("10")
    assert int(batch) == min(19, int(start) + 10)      # a batch phase runs 10 lower
    assert raised == "yes"                             # and its exception reaches the caller
    assert int(main_after) == min(19, int(start) + 10)  # the command's main thread, lowered for good
    assert int(db) == int(start)                       # its database thread is not
    assert int(forked) == int(main_after)              # a helper forked from the lowered thread inherits it
    assert unchanged == "False"


def test_batch_priority_can_be_turned_off():
    start, batch, raised, main_after, db, forked, unchanged = _child("0")
    assert batch == main_after == db == forked == start and raised == "yes" and unchanged == "True"
