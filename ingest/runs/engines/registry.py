"""Every engine by the name a spec gives (`spec.engine`); ingest.runs.names.ENGINES lists the same
names without importing any engine, for the command line and spec parsing (tests/test_engine_interface.py
checks that the two agree)."""

from __future__ import annotations

from . import imported, reference, sglang
from .base import Engine

ENGINES: dict[str, Engine] = {e.name: e for e in (reference.ENGINE, sglang.ENGINE, imported.ENGINE)}
