"""The trace files behind a run, for downloading into Perfetto (ui.perfetto.dev)."""

from __future__ import annotations

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
