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
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO

import msgspec
import numpy as np
from isal import igzip

from .errors import TraceError

CHUNK_BYTES = 8 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_KEY = b'"traceEvents"'
_MAX_PENDING = 64 << 20  # a piece that still does not decode past this size is bad JSON


_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
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
    args: Args = msgspec.field(default_factory=Args)


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
_CAT, _NAME, _TS, _DUR = attrgetter("cat"), attrgetter("name"), attrgetter("ts"), attrgetter("dur")
_PID, _TID, _ARGS = attrgetter("pid"), attrgetter("tid"), attrgetter("args")
_CORR, _EXT = attrgetter("correlation"), attrgetter("external_id")
_DIMS, _TYPES = attrgetter("input_dims"), attrgetter("input_type")


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
    """Accumulates per-piece columns with shared dictionaries.

    The per-event work runs in C: attribute reads through `map(attrgetter(...))`, numbers
    through numpy, and dictionary encoding through `dict.fromkeys`; Python only loops over
    the few distinct names, threads and shapes of each piece. Ops without recorded shapes
    share the shape (b"", b""), whose bytes are unknown."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.shapes: dict[tuple[bytes, bytes], int] = {}
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.events_seen = 0

    @staticmethod
    def _encode(values: list, table: dict) -> np.ndarray:
        """Codes of `values` in `table` (a value -> id dict that grows as needed)."""
        for value in dict.fromkeys(values):  # the distinct values, found in C
            table.setdefault(value, len(table))
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values))

    def add(self, events: list[Event]) -> None:
        self.events_seen += len(events)
        code = _KIND_CODE
        kept = [e for e in events if e.cat in code and e.ph == "X"]
        n = len(kept)
        if not n:
            return
        kind = np.fromiter(map(code.__getitem__, map(_CAT, kept)), np.int8, n)
        name_id = self._encode(list(map(_NAME, kept)), self.names)
        ts = np.fromiter(map(_TS, kept), np.float64, n)
        dur = np.fromiter(map(_DUR, kept), np.float64, n)
        thread = self._encode(list(zip(map(_PID, kept), map(_TID, kept))), self.threads)
        args = list(map(_ARGS, kept))
        # None (JSON null or absent) becomes NaN in a float array, then -1
        corr = np.array(list(map(_CORR, args)), dtype=np.float64)
        ext = np.array(list(map(_EXT, args)), dtype=np.float64)
        corr = np.where(np.isnan(corr), -1, corr).astype(np.int64)
        ext = np.where(np.isnan(ext), -1, ext).astype(np.int64)
        shape = np.full(n, -1, np.int32)
        ops = np.flatnonzero(kind == _KIND_CODE["cpu_op"])
        if len(ops):
            op_args = [args[i] for i in ops.tolist()]
            keys = list(zip(map(bytes, map(_DIMS, op_args)), map(bytes, map(_TYPES, op_args))))
            shape[ops] = self._encode(keys, self.shapes)
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


def _decode_piece(path: Path, array, first_index: int) -> list[Event]:
    """Decode a JSON array of events; a type error is reported with the event's index and field."""
    try:
        return _DECODER.decode(array)
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


def _last_boundary(buf: bytearray, lo: int) -> int | None:
    """Position of the '}' of the last `},{` in buf[lo:], or None."""
    window = 1 << 16
    while True:
        start = max(lo, len(buf) - window)
        last = None
        for m in _BOUNDARY.finditer(buf, start):
            last = m
        if last is not None:
            return last.start()
        if start == lo:
            return None
        window *= 4


def _decode_events(path: Path, buf: bytearray, start: int, end: int, first_index: int) -> list[Event]:
    """Decode the events in buf[start + 1 : end] without copying them: the byte before the
    piece and the byte after it (separators or whitespace) briefly become '[' and ']'."""
    before, after = buf[start], buf[end]
    buf[start], buf[end] = 0x5B, 0x5D
    try:
        with memoryview(buf) as view:
            return _decode_piece(path, view[start : end + 1], first_index)
    finally:
        buf[start], buf[end] = before, after


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
        # buf[start] is the byte before the next undecoded event ('[' , ',' or whitespace);
        # lo is where the next search for a cut begins (past a cut that fell inside a string)
        buf = bytearray(b"[") + rest[m.end() :]
        start = lo = 0
        eof = False
        while True:
            if not eof and len(buf) - lo < CHUNK_BYTES:
                more = _read(stream, path, CHUNK_BYTES)
                eof = not more
                buf += more
                continue
            cut = None if eof else _last_boundary(buf, lo)
            if cut is None:
                if eof:
                    header.update(_decode_last(path, bytes(buf[start + 1 :]), cols))
                    break
                lo = max(lo, len(buf) - 1)  # no boundary yet: read on
                more = _read(stream, path, CHUNK_BYTES)
                eof = not more
                buf += more
                continue
            try:
                events = _decode_events(path, buf, start, cut + 1, cols.events_seen)
            except msgspec.DecodeError:
                # the cut fell inside a string (or the JSON is bad): extend to the next cut
                if cut + 1 - start > _MAX_PENDING:
                    raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen}") from None
                lo = cut + 1
                continue
            cols.add(events)
            del events  # its Raw fields point into buf, which is resized below
            start = buf.index(b"{", cut + 1) - 1
            lo = start
            if start > CHUNK_BYTES:
                del buf[:start]
                lo -= start
                start = 0
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
            events = _decode_piece(path, b"[" + events_part + b"]", cols.events_seen)
        except msgspec.DecodeError as e:
            raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen} ({e})") from None
        cols.add(events)
        return tail if isinstance(tail, dict) else {}
