"""Progress of long CLI work: a bar that redraws itself on a terminal, plain lines in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, stream: TextIO = sys.stderr, min_interval_s: float = 2.0):
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.min_interval_s = min_interval_s
        self._last_line = 0.0
        self._last = None

    def update(self, done: int, planned: int | None, note: str = "") -> None:
        if (done, planned, note) == self._last:
            return
        self._last = (done, planned, note)
        if self.tty:
            width = 30
            filled = int(width * done / planned) if planned else 0
            bar = "#" * filled + "." * (width - filled)
            count = f"{done}/{planned}" if planned else f"{done}"
            self.stream.write(f"\r{self.label} [{bar}] {count} {note[:40]:<40}")
            self.stream.flush()
        elif time.monotonic() - self._last_line >= self.min_interval_s or (planned and done >= planned):
            self._last_line = time.monotonic()
            count = f"{done}/{planned}" if planned else f"{done}"
            self.stream.write(f"{self.label}: {count} {note}\n".rstrip() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()
