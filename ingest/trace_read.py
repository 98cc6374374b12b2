"""Stage 1 of the trace pipeline: stream a Chrome trace from torch.profiler into columns.

The file (`.json` or `.json.gz`) is never loaded whole. The `traceEvents` array is cut into
~4 MB pieces at event boundaries and each piece is decoded by msgspec straight into typed
structs that keep only the fields stepwatch uses (unknown keys are skipped inside the C decoder).
Names, threads and recorded shapes are dictionary-encoded; everything else becomes numpy columns.
The keys before and after `traceEvents` (deviceProperties, distributedInfo, ...) form the header.

A cut is only accepted when the piece before it decodes, so a `},{` inside a string can never
split an event: the piece is then extended to the next boundary.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

import msgspec
import numpy as np
from isal import igzip

from .errors import TraceError

CHUNK_BYTES = 4 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_KEY = b'"traceEvents"'
_MAX_PENDING = 64 << 20  # a piece that still does not decode past this size is bad JSON


_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    python_id: int | None = msgspec.field(default=None, name="Python id")
    # kept undecoded (msgspec.Raw): only the few distinct shapes are ever parsed
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: Args | None = None


_DECODER = msgspec.json.Decoder(list[Event])

# Event kinds kept as columns; everything else (metadata, flows, instants, ...) is dropped.
KINDS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
)
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}


@dataclass
class RawTrace:
    """Columns of the kept events of one trace file (one rank), in file order."""

    path: str
    header: dict
    kind: np.ndarray  # int8 code into KINDS
    name_id: np.ndarray  # int32 into names
    ts_us: np.ndarray  # float64
    dur_us: np.ndarray  # float64
    thread_id: np.ndarray  # int32 into threads
    correlation: np.ndarray  # int64, -1 when absent
    external_id: np.ndarray  # int64, -1 when absent
    shape_id: np.ndarray  # int32 into shapes, -1 when absent
    names: list[str] = field(default_factory=list)
    threads: list[tuple] = field(default_factory=list)  # (pid, tid)
    shapes: list[tuple[bytes, bytes]] = field(default_factory=list)  # (Input Dims, Input type) JSON
    events_seen: int = 0

    def __len__(self) -> int:
        return len(self.kind)


class _Columns:
    """Accumulates per-piece columns with shared dictionaries."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.shapes: dict[tuple[bytes, bytes], int] = {}
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.events_seen = 0

    def add(self, events: list[Event]) -> None:
        self.events_seen += len(events)
        code = _KIND_CODE
        kept = [e for e in events if e.ph == "X" and e.cat in code]
        if not kept:
            return
        names, threads, shapes = self.names, self.threads, self.shapes
        kind = np.fromiter((code[e.cat] for e in kept), np.int8, len(kept))
        name_id = np.fromiter((names.setdefault(e.name, len(names)) for e in kept), np.int32, len(kept))
        ts = np.fromiter((e.ts for e in kept), np.float64, len(kept))
        dur = np.fromiter((e.dur for e in kept), np.float64, len(kept))
        thread = np.fromiter(
            (threads.setdefault((e.pid, e.tid), len(threads)) for e in kept), np.int32, len(kept)
        )
        args = [e.args for e in kept]
        corr = np.fromiter(
            (-1 if a is None or a.correlation is None else a.correlation for a in args), np.int64, len(kept)
        )
        ext = np.fromiter(
            (-1 if a is None or a.external_id is None else a.external_id for a in args), np.int64, len(kept)
        )
        shape = np.full(len(kept), -1, np.int32)
        for i in np.flatnonzero(kind == _KIND_CODE["cpu_op"]):
            a = args[i]
            if a is not None and len(a.input_dims):
                key = (bytes(a.input_dims), bytes(a.input_type) or b"[]")
                shape[i] = shapes.setdefault(key, len(shapes))
        self.parts.append((kind, name_id, ts, dur, thread, corr, ext, shape))

    def finish(self, path: str, header: dict) -> RawTrace:
        if self.parts:
            cols = [np.concatenate(c) for c in zip(*self.parts)]
        else:
            cols = [np.empty(0, t) for t in (np.int8, np.int32, np.float64, np.float64, np.int32, np.int64, np.int64, np.int32)]
        return RawTrace(
            path, header, *cols,
            names=list(self.names), threads=list(self.threads), shapes=list(self.shapes),
            events_seen=self.events_seen,
        )


def open_trace_stream(path: Path) -> BinaryIO:
    """Open `path` for reading, decompressing gzip (detected by magic bytes, not the name)."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except OSError as e:
        raise TraceError(path, f"cannot read ({e.strerror})") from None
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return igzip.IGzipFile(fileobj=f, mode="rb")
    return f


def _read(stream: BinaryIO, path: Path, n: int) -> bytes:
    try:
        return stream.read(n)
    except (EOFError, OSError, igzip.BadGzipFile) as e:  # truncated or corrupt gzip
        raise TraceError(path, f"compressed data is truncated or corrupt ({e})") from None


def _decode_header(path: Path, text: bytes) -> dict:
    try:
        header = json.loads(text)
    except ValueError:
        raise TraceError(path, "not a JSON trace (the keys around 'traceEvents' do not parse)") from None
    if not isinstance(header, dict):
        raise TraceError(path, "not a JSON object at the top level")
    return header


def _decode_piece(path: Path, piece: bytes, first_index: int) -> list[Event]:
    """Decode `[piece]`; a type error is reported with the event's index and field."""
    try:
        return _DECODER.decode(b"[" + piece + b"]")
    except msgspec.ValidationError as e:
        raise TraceError(path, _describe_validation(str(e), first_index)) from None


def _describe_validation(message: str, first_index: int) -> str:
    # msgspec says e.g. "Expected `float`, got `str` - at `$[12].ts`"
    m = re.search(r"at `\$\[(\d+)\]((?:\.[^`]+)?)`", message)
    what = message.split(" - at ")[0]
    if not m:
        return f"wrong type in an event: {what}"
    index = first_index + int(m.group(1))
    fld = m.group(2).lstrip(".")
    where = f"traceEvents[{index}] field '{fld}'" if fld else f"traceEvents[{index}]"
    return f"{where}: {what.replace('`', '')}"


def _iter_pieces(stream: BinaryIO, path: Path, buf: bytes) -> Iterator[tuple[bytes, bool]]:
    """Yield (bytes, at_eof) pieces of the array body, each ending right after an event's '}'.

    The last yielded item has at_eof=True and holds the unparsed remainder (the last event,
    the closing ']' and the keys after the array)."""
    eof = False
    while True:
        if not eof and len(buf) < CHUNK_BYTES:
            more = _read(stream, path, CHUNK_BYTES)
            eof = not more
            buf += more
            if not eof:
                continue
        if eof:
            yield buf, True
            return
        cut = _last_boundary(buf)
        if cut is None:
            more = _read(stream, path, CHUNK_BYTES)
            eof = not more
            buf += more
            continue
        yield buf[: cut + 1], False
        buf = buf[cut + 1 :]
        buf = buf[buf.index(b"{") :]


def _last_boundary(buf: bytes) -> int | None:
    """Position of the '}' of the last `},{` in buf, or None."""
    window = 1 << 16
    while True:
        start = max(0, len(buf) - window)
        last = None
        for m in _BOUNDARY.finditer(buf, start):
            last = m
        if last is not None:
            return last.start()
        if start == 0:
            return None
        window *= 4


def read_trace(path: str | os.PathLike) -> RawTrace:
    """Read one trace file into columns. Raises TraceError naming the file and the problem."""
    path = Path(path)
    with open_trace_stream(path) as stream:
        head = b""
        while _KEY not in head:
            more = _read(stream, path, 1 << 16)
            if not more:
                if not head.strip():
                    raise TraceError(path, "is empty")
                if not head.lstrip().startswith(b"{"):
                    raise TraceError(path, "not JSON: a trace is a JSON object with 'traceEvents'")
                _decode_header(path, head)  # valid JSON but no events key
                raise TraceError(path, "has no 'traceEvents' array")
            head += more
            if len(head) > (64 << 20):
                raise TraceError(path, "no 'traceEvents' key in the first 64 MB")
        key_at = head.index(_KEY)
        prefix = head[:key_at].strip()
        if not prefix.startswith(b"{"):
            raise TraceError(path, "not JSON: a trace is a JSON object with 'traceEvents'")
        rest = head[key_at + len(_KEY) :]
        m = re.match(rb"\s*:\s*\[\s*", rest)
        while m is None or m.end() == len(rest):
            more = _read(stream, path, 1 << 16)
            if not more:
                break
            rest += more
            m = re.match(rb"\s*:\s*\[\s*", rest)
        if m is None:
            raise TraceError(path, "'traceEvents' is not an array")
        header_text = prefix.rstrip(b",") + b"}"
        header = _decode_header(path, header_text if prefix != b"{" else b"{}")

        cols = _Columns()
        pending = b""
        for piece, at_eof in _iter_pieces(stream, path, rest[m.end() :]):
            if at_eof:
                piece = pending + piece if pending else piece
                tail = _decode_last(path, piece, cols)
                header.update(tail)
                break
            candidate = pending + piece if pending else piece
            try:
                events = _decode_piece(path, candidate, cols.events_seen)
            except msgspec.DecodeError:
                # the cut fell inside a string (or the JSON is bad): extend to the next cut
                if len(candidate) > _MAX_PENDING:
                    raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen}") from None
                pending = candidate + b","
                continue
            pending = b""
            cols.add(events)
    trace = cols.finish(str(path), header)
    if trace.events_seen == 0:
        raise TraceError(path, "'traceEvents' holds no events")
    return trace


def _decode_last(path: Path, text: bytes, cols: _Columns) -> dict:
    """Decode the final piece: the remaining events, ']', then the trailing keys and '}'."""
    body = text.rstrip()
    if not body.endswith(b"}"):
        raise TraceError(path, "is truncated (the JSON does not end with '}')")
    # The events end at the last ']' that is followed only by trailing keys: try candidates
    # from the right; the first split where both sides parse wins.
    pos = len(body)
    while True:
        pos = body.rfind(b"]", 0, pos)
        if pos < 0:
            raise TraceError(path, "is truncated or not JSON (the 'traceEvents' array never closes)")
        events_part = body[:pos].rstrip()
        after = body[pos + 1 :].strip()
        if after.startswith(b","):
            after = after[1:]
        try:
            tail = json.loads(b"{" + after) if after != b"}" else {}
        except ValueError:
            continue
        if events_part.endswith(b","):
            events_part = events_part[:-1]
        if not events_part.strip():
            return tail if isinstance(tail, dict) else {}
        try:
            events = _decode_piece(path, events_part, cols.events_seen)
        except msgspec.DecodeError as e:
            raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen} ({e})") from None
        cols.add(events)
        return tail if isinstance(tail, dict) else {}
