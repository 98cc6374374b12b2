"""Progress of long CLI work: a bar that redraws itself on a terminal, plain lines in a log.

An import's reading reports through a `ReadMeter`: counters in shared memory, one set per file,
written by whichever process reads the file (the importer, a rank reader it forked, or the helper
of a split read), once per chunk or piece, never per event; `ImportBar` draws them, from a thread
of the importer, on a terminal only."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from ..limits import PROGRESS_AFTER_S


class Progress:
    def __init__(self, label: str, stream: TextIO = sys.stderr, min_interval_s: float = 2.0, width: int = 30):
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.min_interval_s = min_interval_s
        self.width = width
        self._last_line = 0.0
        self._last = None
        self._drawn = 0  # length of the line on the terminal

    def update(self, done: int, planned: int | None, note: str = "", count: str | None = None) -> None:
        """`count` replaces the "done/planned" text (e.g. sizes in MB)."""
        if (done, planned, note, count) == self._last:
            return
        self._last = (done, planned, note, count)
        given = count is not None
        if not given:
            count = f"{done}/{planned}" if planned else f"{done}"
        if self.tty:
            filled = min(self.width, int(self.width * done / planned)) if planned else 0
            bar = "#" * filled + "." * (self.width - filled)
            line = f"{self.label} [{bar}] {count}" + (f" {note[:40]:<40}" if note or not given else "")
            # pad over what the previous line left on the terminal
            self.stream.write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
            self.stream.flush()
        elif time.monotonic() - self._last_line >= self.min_interval_s or (planned and done >= planned):
            self._last_line = time.monotonic()
            self.stream.write(f"{self.label}: {count} {note}\n".rstrip() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()


# -- an import's reading --------------------------------------------------------------------

# the counters of one file: bytes of it read (as stored: compressed for a .json.gz), events decoded
# by the process that reads it, events decoded by that process's helper
_STORED, _EVENTS, _HELPER_EVENTS, _FIELDS = 0, 1, 2, 3


class ReadMeter:
    """How far the reading of an import's files has got. Made before the readers are forked:
    the counters live in shared memory, so a forked reader's writes are seen here. Each counter
    has one writer (a word store, no lock)."""

    def __init__(self, files: list[Path]) -> None:
        from multiprocessing.sharedctypes import RawArray  # ctypes: loaded by an import only

        self.files = [Path(f) for f in files]
        self.sizes = []
        for f in self.files:
            try:
                self.sizes.append(os.stat(f).st_size)
            except OSError:
                self.sizes.append(0)  # the reader says what is wrong with it
        self._counts = RawArray("q", _FIELDS * len(self.files))
        self._done = RawArray("b", len(self.files))

    def slot(self, index: int) -> "MeterSlot":
        return MeterSlot(self._counts, _FIELDS * index)

    def finished(self, index: int) -> None:
        """File `index` is read and analysed (its figures are in hand)."""
        self._done[index] = 1
        self._counts[_FIELDS * index + _STORED] = self.sizes[index]

    def totals(self) -> dict:
        """What has been read of all the files so far."""
        c = self._counts[:]
        return {"stored": sum(c[_STORED::_FIELDS]), "planned": sum(self.sizes),
                "events": sum(c[_EVENTS::_FIELDS]) + sum(c[_HELPER_EVENTS::_FIELDS]),
                "files_done": sum(self._done[:]), "files": len(self.files)}


class MeterSlot:
    """One file's counters, as its reader writes them (ingest/traces/trace_read.py calls `read` once per
    chunk and `decoded` once per piece). A split read's helper writes through `for_helper()`:
    its events into a counter of their own, no bytes (the main process reports those)."""

    __slots__ = ("_counts", "_at", "_helper")

    def __init__(self, counts, at: int, helper: bool = False) -> None:
        self._counts, self._at, self._helper = counts, at, helper

    def for_helper(self) -> "MeterSlot":
        return MeterSlot(self._counts, self._at, helper=True)

    def start(self) -> None:
        """A read of the file begins (again, when a split read falls back to one process)."""
        for i in range(_FIELDS):
            self._counts[self._at + i] = 0

    def read(self, stored: int) -> None:
        if not self._helper:
            self._counts[self._at + _STORED] = stored

    def decoded(self, events: int) -> None:
        self._counts[self._at + (_HELPER_EVENTS if self._helper else _EVENTS)] = events


def describe(totals: dict) -> str:
    """The bar's text: `28.8/84.0 MB read, 1,234,567 events, 3/8 ranks`."""
    planned = totals["planned"]
    unit, scale = next(((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if planned >= s), ("B", 1))
    text = f"{totals['stored'] / scale:,.1f}/{planned / scale:,.1f} {unit} read, {totals['events']:,} events"
    if totals["files"] > 1:
        text += f", {totals['files_done']}/{totals['files']} ranks"
    return text


class ImportBar:
    """One bar on `stream` for the whole import (every rank of a directory), drawn only when
    `stream` is a terminal and the import has run `after_s` (short imports stay silent), then
    redrawn every `every_s` from a thread of its own; its last state stays on screen when the
    reading ends. On a pipe or a log file nothing is written."""

    def __init__(self, meter: ReadMeter, stream: TextIO | None = None, after_s: float = PROGRESS_AFTER_S,
                 every_s: float = 0.2) -> None:
        self.meter = meter
        self.stream = stream if stream is not None else sys.stderr
        self.after_s, self.every_s = after_s, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Progress | None = None

    def _draw(self) -> None:
        if self._bar is None:
            self._bar = Progress("import", self.stream, width=20)
        t = self.meter.totals()
        self._bar.update(t["stored"], t["planned"] or None, count=describe(t))

    def _run(self) -> None:
        if self._stop.wait(self.after_s):
            return
        while True:
            self._draw()
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "ImportBar":
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._run, name="stepwatch-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            if exc_type is None:
                self._draw()  # the final state: every byte read
            self._bar.close()  # the next line (the result, or the error) starts on a line of its own
