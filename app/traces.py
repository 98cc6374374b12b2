"""The trace files behind a run, for downloading into Perfetto (ui.perfetto.dev).

The dashboard serves a file only when it can prove the file is the run's own trace, as the import
recorded it (runs.trace_root and runs.trace_digests, migration 013): the file is the one named in
the run's trace directory, that directory and the file are reached through no symbolic link (no
component of the path is one), the file is a regular file, and its size and sha256 are the ones
recorded at import. Anything else (a run imported before hashes were recorded, a merged run whose
traces could not be verified here, a trace replaced, edited, moved or turned into a link since) is
"no longer available", with one line saying why, and nothing is read from it.

Hashing is paid once per file version: a file's sha256 is kept for its (device, inode, size,
mtime, ctime), so a Run page shown again costs a stat per file; the bytes actually sent (the
download, the Perfetto button's copy) are hashed again as they are read, so a file changed between
the check and the read is not sent either.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

HASH_CACHE_FILES = 256  # file versions whose sha256 is kept (a stat then stands for a hash)
_CHUNK_BYTES = 1 << 20


class TraceGone(Exception):
    """A run's trace that is not (or no longer) provably its own; the message says why, in one line."""


@dataclass(frozen=True)
class TraceFile:
    """A trace file the run may serve, as the import recorded it."""

    path: Path
    name: str
    size_bytes: int
    sha256: str


def _is_plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _hash_file(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


@functools.lru_cache(maxsize=HASH_CACHE_FILES)
def _cached_sha256(path: str, version: tuple[int, int, int, int, int]) -> str | None:
    """The sha256 of the file at `path` whose stat is `version` (dev, ino, size, mtime_ns,
    ctime_ns); None when the file read is not that version (it changed meanwhile)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if _version_of(os.fstat(fd)) != version:
            return None
        return _hash_file(fd)
    finally:
        os.close(fd)


def _version_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_trace_file(root: str, entry: dict) -> TraceFile:
    """The trace `entry` ({"name", "bytes", "sha256"}) of a run whose traces lie in `root`, when
    it is still that file; raises TraceGone saying why not."""
    name = entry.get("name") if isinstance(entry, dict) else None
    if not _is_plain_name(name) or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
        raise TraceGone("its record is not a plain file name with a size and sha256")
    path = os.path.join(root, name)
    try:
        st = os.lstat(path)
    except OSError:
        raise TraceGone(f"{name} is no longer in {root}") from None
    if stat.S_ISLNK(st.st_mode):
        raise TraceGone(f"{name} is now a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise TraceGone(f"{name} is no longer a regular file")
    if os.path.realpath(path) != path:
        raise TraceGone(f"{name} is now reached through a symbolic link")
    if st.st_size != entry["bytes"]:
        raise TraceGone(f"{name} has changed since it was imported ({st.st_size:,} bytes, was {entry['bytes']:,})")
    try:
        digest = _cached_sha256(path, _version_of(st))
    except OSError as e:
        raise TraceGone(f"{name} cannot be read ({e.strerror})") from None
    if digest != entry["sha256"]:
        raise TraceGone(f"{name} has changed since it was imported (its sha256 differs)")
    return TraceFile(Path(path), name, st.st_size, digest)


def list_trace_files(trace_root: str | None, trace_digests: list | None) -> tuple[list[TraceFile], list[str]]:
    """The run's trace files that are provably its own (check_trace_file), and one line for each
    that is not (or for the run, when it recorded none)."""
    if trace_root is None or not trace_digests:
        return [], ["no content hash was recorded for it here (a run imported before stepwatch recorded them, "
                    "or merged from another database where its traces cannot be verified)"]
    if not isinstance(trace_root, str) or not os.path.isabs(trace_root) or os.path.realpath(trace_root) != trace_root:
        return [], [f"its directory {trace_root} is now reached through a symbolic link, or is gone"]
    found, problems = [], []
    for entry in trace_digests:
        try:
            found.append(check_trace_file(trace_root, entry))
        except TraceGone as e:
            problems.append(str(e))
    return found, problems


def read_verified_bytes(trace: TraceFile) -> bytes:
    """The trace's bytes, read without following a link and checked against its sha256 as they
    are read; raises TraceGone when the file is no longer the one checked."""
    try:
        fd = os.open(trace.path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise TraceGone(f"{trace.name} cannot be read ({e.strerror})") from None
    try:
        body = b"".join(iter(lambda: os.read(fd, _CHUNK_BYTES), b""))
    finally:
        os.close(fd)
    if hashlib.sha256(body).hexdigest() != trace.sha256:
        raise TraceGone(f"{trace.name} has changed since it was imported (its sha256 differs)")
    return body


def read_bytes_later(trace: TraceFile):
    """A download button's deferred data: the file is read (and checked) only when someone clicks;
    a file changed meanwhile raises TraceGone, and Streamlit then sends nothing."""
    return lambda: read_verified_bytes(trace)


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
