"""The result bundle: the one file format between a benchmark run and the database.

A bundle is a directory holding `manifest.json` and the profiler trace(s) it names. Runners
(kernels.bench, later SGLang and remote hosts) write bundles; `python -m ingest import DIR`
reads them. Everything about the format lives here, with a version number, so that a bundle
written today is still read correctly after the format moves on.

Only the standard library is used: kernels/ must run as is on the GPU machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "stepwatch-bundle"
VERSION = 1
MANIFEST_NAME = "manifest.json"


class BundleError(ValueError):
    """A bundle directory or manifest that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Timing:
    """Decode step times measured without the profiler (CUDA events or a host clock)."""

    step_ms: list[float]
    median_ms: float
    p10_ms: float
    p90_ms: float
    tok_per_s: float
    method: str  # "cuda-events" or "perf-counter"


@dataclass(frozen=True)
class Manifest:
    engine: str  # "reference", "sglang", ...
    variant: str  # e.g. the KV strategy, "unpatched", or a patch-set name
    workload: dict[str, Any]  # every parameter of the run (preset, batch size, ...)
    device: dict[str, Any]  # {"type": "cuda"|"cpu", "name": ..., ...}
    versions: dict[str, Any]  # torch, triton, cuda, python, ...
    traces: list[str]  # file names inside the bundle directory
    timing: Timing | None = None
    layers: int | None = None
    repo: str | None = None
    commit: str | None = None
    profiled_steps: int | None = None
    created_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float | None:
        return self.timing.tok_per_s if self.timing else None


def write_bundle(directory: str | os.PathLike, manifest: Manifest) -> Path:
    """Write manifest.json into `directory` atomically (the traces must already be there)."""
    directory = Path(directory)
    for name in manifest.traces:
        if not (directory / name).is_file():
            raise BundleError(f"{directory}: trace {name!r} named in the manifest is missing")
    body = {"format": FORMAT, "version": VERSION, **asdict(manifest)}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # mkstemp makes it private; a bundle is meant to be shared
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=2, sort_keys=True)
        f.write("\n")
    target = directory / MANIFEST_NAME
    os.replace(tmp, target)
    return target


def is_bundle(path: str | os.PathLike) -> bool:
    return Path(path, MANIFEST_NAME).is_file()


def _require(body: dict, key: str, kind: type | tuple, where: Path) -> Any:
    if key not in body:
        raise BundleError(f"{where}: field {key!r} is missing")
    value = body[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BundleError(f"{where}: field {key!r} has type {type(value).__name__}")
    return value


def read_bundle(directory: str | os.PathLike) -> Manifest:
    """Read and validate a bundle's manifest; raise BundleError naming the file and field."""
    where = Path(directory) / MANIFEST_NAME
    try:
        body = json.loads(where.read_bytes())
    except OSError as e:
        raise BundleError(f"{where}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise BundleError(f"{where}: not JSON ({e})") from None
    if not isinstance(body, dict):
        raise BundleError(f"{where}: top level is not an object")
    if body.get("format") != FORMAT:
        raise BundleError(f"{where}: field 'format' is {body.get('format')!r}, expected {FORMAT!r}")
    version = _require(body, "version", int, where)
    if version > VERSION:
        raise BundleError(f"{where}: version {version} is newer than this stepwatch reads ({VERSION})")
    traces = _require(body, "traces", list, where)
    if not traces or not all(isinstance(t, str) and t and "/" not in t for t in traces):
        raise BundleError(f"{where}: field 'traces' must be a non-empty list of file names")
    for name in traces:
        if not Path(directory, name).is_file():
            raise BundleError(f"{where}: trace {name!r} is missing from the bundle")
    timing = body.get("timing")
    if timing is not None:
        if not isinstance(timing, dict):
            raise BundleError(f"{where}: field 'timing' is not an object")
        try:
            timing = Timing(**timing)
        except TypeError as e:
            raise BundleError(f"{where}: field 'timing': {e}") from None
        if not isinstance(timing.tok_per_s, (int, float)) or timing.tok_per_s <= 0:
            raise BundleError(f"{where}: field 'timing.tok_per_s' must be a positive number")
    layers = body.get("layers")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0):
        raise BundleError(f"{where}: field 'layers' must be a positive integer")
    for key in ("workload", "device", "versions"):
        _require(body, key, dict, where)
    for key in ("engine", "variant"):
        _require(body, key, str, where)
    known = {f for f in Manifest.__dataclass_fields__}
    return Manifest(
        **{k: v for k, v in body.items() if k in known and k != "timing"},
        timing=timing,
    )
