"""The result bundle: the one file format between a benchmark run and the database.

A bundle is a directory holding `manifest.json` and the profiler trace(s) it names. Runners
(kernels.bench, later SGLang and remote hosts) write bundles; `python -m ingest import DIR`
reads them. Everything about the format lives here, with a version number, so that a bundle
written today is still read correctly after the format moves on.

Versions: 1, the manifest and its traces; 2 adds `mapping_traces`, graph-off traces of the same
workload beside a CUDA-graph run's (one per trace, in the same order; empty when none), from which
the importer attributes replayed kernels to ops and Python lines. Version 1 bundles are read as
having none.

Only the standard library is used: kernels/ must run as is on the GPU machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "stepwatch-bundle"
VERSION = 2
MANIFEST_NAME = "manifest.json"


class BundleError(ValueError):
    """A bundle directory or manifest that cannot be read; the message names the file."""


# A repo, commit or variant label, in a manifest as on `ingest import`'s command line: letters,
# digits and ._+/@=:- , not starting with '-' (nothing a shell or an option parser would read).
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/@=:-]*$")
MAX_LABEL_CHARS = 200
LABEL_RULE = "use letters, digits and ._+/@=:- (not starting with '-')"
# Sizes no real run has: a larger figure in a manifest is broken or hostile
MAX_LAYERS = 100_000
MAX_STEPS = 10_000_000
MAX_BATCH = 10_000_000
# A manifest is a few KB (the largest in tests/data, a wild bundle's, 34 KB); 30x that is not a manifest
MANIFEST_MAX_BYTES = 1 << 20


def is_label(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_LABEL_CHARS and LABEL.fullmatch(value) is not None


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
    mapping_traces: list[str] = field(default_factory=list)  # graph-off twins of `traces` (version 2)

    @property
    def tok_per_s(self) -> float | None:
        return self.timing.tok_per_s if self.timing else None


def write_bundle(directory: str | os.PathLike, manifest: Manifest) -> Path:
    """Write manifest.json into `directory` atomically (the traces must already be there)."""
    directory = Path(directory)
    for name in manifest.traces + manifest.mapping_traces:
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
    """A directory with a manifest.json entry, whatever the entry is: read_bundle then refuses one that is
    not a regular file (a FIFO, a device, a directory, a dangling link) instead of the directory being
    read as a plain trace directory."""
    return os.path.lexists(Path(path, MANIFEST_NAME))


def _read_manifest_bytes(where: Path) -> bytes:
    """The manifest's bytes: a regular file (links followed) of at most MANIFEST_MAX_BYTES, checked before
    it is opened (a FIFO would block, /dev/zero never ends) and again while reading (it may grow)."""
    try:
        info = os.stat(where)
    except OSError as e:
        raise BundleError(f"{where}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise BundleError(f"{where}: is {_kind_of(info.st_mode)}, not a regular file")
    if info.st_size > MANIFEST_MAX_BYTES:
        raise BundleError(f"{where}: {info.st_size:,} bytes, more than a manifest's limit "
                          f"(MANIFEST_MAX_BYTES, {MANIFEST_MAX_BYTES:,})")
    try:
        with open(where, "rb") as f:
            body = f.read(MANIFEST_MAX_BYTES + 1)
    except OSError as e:
        raise BundleError(f"{where}: cannot read ({e.strerror})") from None
    if len(body) > MANIFEST_MAX_BYTES:
        raise BundleError(f"{where}: more than a manifest's limit (MANIFEST_MAX_BYTES, {MANIFEST_MAX_BYTES:,})")
    return body


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _require(body: dict, key: str, kind: type | tuple, where: Path) -> Any:
    if key not in body:
        raise BundleError(f"{where}: field {key!r} is missing")
    value = body[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BundleError(f"{where}: field {key!r} has type {type(value).__name__}")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _is_count(value, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def _is_duration(value) -> bool:
    """A positive, finite number of milliseconds (or tokens per second)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e12 and math.isfinite(value)


def _read_timing(timing, where: Path) -> Timing:
    if not isinstance(timing, dict):
        raise BundleError(f"{where}: field 'timing' is not an object")
    try:
        timing = Timing(**timing)
    except TypeError as e:
        raise BundleError(f"{where}: field 'timing': {e}") from None
    for key in ("median_ms", "p10_ms", "p90_ms", "tok_per_s"):
        if not _is_duration(getattr(timing, key)):
            raise BundleError(f"{where}: field 'timing.{key}' must be a positive, finite number")
    if not isinstance(timing.step_ms, list) or not all(map(_is_duration, timing.step_ms)):
        raise BundleError(f"{where}: field 'timing.step_ms' must be a list of positive, finite numbers")
    if not isinstance(timing.method, str):
        raise BundleError(f"{where}: field 'timing.method' must be a string")
    return timing


def read_bundle(directory: str | os.PathLike) -> Manifest:
    """Read and validate a bundle's manifest; raise BundleError naming the file and field."""
    where = Path(directory) / MANIFEST_NAME
    raw = _read_manifest_bytes(where)
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise BundleError(f"{where}: nested deeper than the JSON decoder's limit") from None
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
    mapping = body.get("mapping_traces", [])
    if not isinstance(mapping, list) or not all(isinstance(t, str) and t and "/" not in t for t in mapping):
        raise BundleError(f"{where}: field 'mapping_traces' must be a list of file names")
    if mapping and len(mapping) != len(traces):
        raise BundleError(f"{where}: field 'mapping_traces' names {len(mapping)} trace(s) for {len(traces)} "
                          "trace(s): one graph-off trace per trace, or none")
    for name in mapping:
        if not Path(directory, name).is_file():
            raise BundleError(f"{where}: mapping trace {name!r} is missing from the bundle")
    timing = body.get("timing")
    if timing is not None:
        timing = _read_timing(timing, where)
    layers = body.get("layers")
    if layers is not None and not _is_count(layers, MAX_LAYERS):
        raise BundleError(f"{where}: field 'layers' must be a whole number from 1 to {MAX_LAYERS:,}")
    steps = body.get("profiled_steps")
    if steps is not None and not _is_count(steps, MAX_STEPS):
        raise BundleError(f"{where}: field 'profiled_steps' must be a whole number from 1 to {MAX_STEPS:,}")
    for key in ("workload", "device", "versions"):
        _require(body, key, dict, where)
    batch = body["workload"].get("batch_size")
    if batch is not None and not _is_count(batch, MAX_BATCH):
        raise BundleError(f"{where}: field 'workload.batch_size' must be a whole number from 1 to {MAX_BATCH:,}")
    for key in ("engine", "variant"):
        _require(body, key, str, where)
    for key in ("engine", "variant", "repo", "commit"):
        if body.get(key) is not None and not is_label(body[key]):
            raise BundleError(f"{where}: field {key!r} is {str(body[key])[:80]!r}: {LABEL_RULE}")
    known = {f for f in Manifest.__dataclass_fields__}
    return Manifest(
        **{k: v for k, v in body.items() if k in known and k not in ("timing", "mapping_traces")},
        timing=timing, mapping_traces=list(mapping),
    )
