"""The trace files behind a run, for downloading into Perfetto (ui.perfetto.dev)."""

from __future__ import annotations

import re
from pathlib import Path

_TRACE_SUFFIXES = (".json", ".json.gz")
_NOT_TRACES = {"manifest.json", "key_averages.json"}


def list_trace_files(source_path: str, trace_files: list[str] | None) -> list[Path]:
    """The run's trace files that are still on disk: a bundle's traces as its manifest names
    them, a plain trace file itself, or the trace files in a directory of per-rank traces."""
    source = Path(source_path)
    if trace_files:
        found = [source / name for name in trace_files]
    elif source.is_dir():
        found = sorted(p for p in source.iterdir() if p.name.endswith(_TRACE_SUFFIXES) and p.name not in _NOT_TRACES)
    else:
        found = [source]
    return [p for p in found if p.is_file()]


def read_bytes_later(path: Path):
    """A download button's deferred data: the file is read only when someone clicks."""
    return lambda: path.read_bytes()


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
DOWNLOAD_NAME_CHARS = 150  # longest name a download is saved under


def download_name(run_id: int, sha: str | None, variant: str | None, file_name: str) -> str:
    """The name a run's trace is saved under, saying whose it is: `run12-3bee539-fused-trace.json.gz`
    rather than the bundle's `trace.json.gz` for every run. Parts from the data keep only
    letters, digits and ._+- (anything else becomes '_'), and the whole stays under
    DOWNLOAD_NAME_CHARS, the file's own name last so its extension survives."""
    parts = [f"run{int(run_id)}"] + [_UNSAFE.sub("_", p).strip("._-") for p in (sha and sha[:7], variant) if p]
    tail = _UNSAFE.sub("_", file_name).lstrip(".-") or "trace.json"
    head = "-".join(p for p in parts if p)[: max(8, DOWNLOAD_NAME_CHARS - len(tail) - 1)]
    return f"{head}-{tail}"[-DOWNLOAD_NAME_CHARS:]
