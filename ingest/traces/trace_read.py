"""Stage 1 of the trace pipeline: stream a Chrome trace from torch.profiler into columns.

The file (`.json` or `.json.gz`) is never loaded whole. The `traceEvents` array is cut into
~1 MB pieces at event boundaries and each piece is decoded by msgspec straight into typed
structs that keep only the fields stepwatch uses (unknown keys are skipped inside the C decoder).
Names, threads and recorded shapes are dictionary-encoded; everything else becomes numpy columns.
The keys before and after `traceEvents` (deviceProperties, distributedInfo, ...) form the header.

A cut is only accepted when the piece before it decodes, so a `},{` inside a string can never
split an event: the piece is then extended to the next boundary.

A large trace is read by two processes at once (see `read_trace`): decoding is CPU-bound Python
object work that one process cannot spread over two cores.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO

import msgspec
import numpy as np
from isal import igzip
from isal.igzip_lib import IsalError

from ..errors import TraceError
from ..limits import DEFAULT_LIMITS, ReadLimits
from .progress import MeterSlot

# ~1 MB pieces: a piece's decoded objects stay in the CPU's caches (8 MB pieces read 30 % slower)
CHUNK_BYTES = 1 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_KEY = b'"traceEvents"'


_INFLATION_CHECKED_FROM = 256 << 20


_NO_RAW = msgspec.Raw(b"")

# Where the read in progress reports how far it got (for a progress bar), or None: set around a
# read by `metered`; written once per chunk read and once per piece decoded, never per event.
_meter: MeterSlot | None = None


@contextmanager
def metered(slot: MeterSlot | None):
    """Reads in this block report to `slot` (ingest/traces/progress.py's ReadMeter)."""
    global _meter
    previous, _meter = _meter, slot
    try:
        yield
    finally:
        _meter = previous


class Args(msgspec.Struct, gc=False):
    # absent ids are -1 (so a piece's ids go to numpy without a Python loop); JSON null is None
    correlation: int | None = -1
    external_id: int | None = msgspec.field(default=-1, name="External id")
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
# The `cat` of each kept kind in every Kineto layout seen in the wild: torch 1.8-1.10 wrote
# capitalised names (Kernel, Runtime, Memcpy, Memset, Operator; Kineto's own table then spelt
# "gpu_user_Annotation"); other accelerators have their
# own device-activity and runtime categories (MTIA's mtia_ccp_events / mtia_runtime, Intel XPU,
# PrivateUse1 backends), read here as kernels and launches.
_CAT_KIND = {
    "kernel": "kernel", "Kernel": "kernel", "mtia_ccp_events": "kernel",
    "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset", "Memset": "gpu_memset",
    "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime", "mtia_runtime": "cuda_runtime",
    "xpu_runtime": "cuda_runtime", "privateuse1_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver", "xpu_driver": "cuda_driver", "privateuse1_driver": "cuda_driver",
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation", "gpu_user_Annotation": "gpu_user_annotation",
    "python_function": "python_function",
}
_KIND_CODE = {cat: KINDS.index(kind) for cat, kind in _CAT_KIND.items()}
# torch <= 1.7's autograd profiler (`export_chrome_trace`, torch/autograd/profiler.py of v1.7.0) wrote a
# bare array of events with no `cat`: ops under pid "CPU functions", the kernels it timed with
# use_cuda=True under pid "CUDA functions" (tid = the device), joined only by flow arrows ("s"/"f",
# cat cpu_to_cuda, which are dropped). Its C++ twin (RecordProfile) capitalised "Functions". Read
# by pid, only in a piece with no event of a known `cat` (no Kineto trace has such pids).
_LEGACY_PID_CAT = {"CPU functions": "Operator", "CPU Functions": "Operator",
                   "CUDA functions": "Kernel", "CUDA Functions": "Kernel"}
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
    processes: int = 1  # how many processes decoded it (2: a split read)
    repaired_bytes: int = 0  # raw control characters and invalid UTF-8 bytes read as spaces / U+FFFD
    ids_out_of_range: int = 0  # correlation / External ids outside int64, read as absent

    def __len__(self) -> int:
        return len(self.kind)


class _Columns:
    """Accumulates per-piece columns with shared dictionaries.

    The per-event work runs in C: attribute reads through `map(attrgetter(...))`, numbers
    through numpy, and dictionary encoding through `dict.fromkeys`; Python only loops over
    the few distinct names, threads and shapes of each piece. Ops without recorded shapes
    share the shape (b"", b""), whose bytes are unknown. A shape is keyed here by its two JSON
    texts joined by a NUL byte (JSON text holds none: raw control characters are invalid, and
    the repair turns them into spaces), split back into a pair by `finish`."""

    def __init__(self, path: Path, limits: ReadLimits) -> None:
        self.path, self.limits = path, limits
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.shapes: dict[tuple[bytes, bytes], int] = {}
        self.parts: list[tuple[int, tuple[np.ndarray, ...]]] = []  # (piece number, columns)
        self.events_seen = 0
        self.repaired_bytes = 0  # control characters and invalid UTF-8 replaced (one-process read)
        self.ids_out_of_range = 0  # correlation / External ids outside int64, read as absent

    @staticmethod
    def _encode(values: list, table: dict) -> tuple[np.ndarray, list]:
        """(codes of `values` in `table`, a value -> id dict that grows as needed; the values
        new to it)."""
        start = len(table)
        for value in dict.fromkeys(values):  # the distinct values, found in C
            table.setdefault(value, len(table))
        new = list(itertools.islice(table, start, None)) if len(table) > start else []
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values)), new

    def _ids(self, values: list) -> np.ndarray:
        """Correlation / External ids as int64; -1 (absent), None (JSON null) and ids no int64
        holds or below -1 become -1 (the latter counted: they are read as absent)."""
        try:
            ids = np.fromiter(values, np.int64, len(values))  # the usual case: in C
        except (TypeError, OverflowError):  # a null, or an id beyond int64
            bad = [v is not None and not -1 <= v < 2**63 for v in values]
            self.ids_out_of_range += sum(bad)
            return np.array([-1 if v is None or b else v for v, b in zip(values, bad)], np.int64)
        bad = ids < -1
        if bad.any():
            self.ids_out_of_range += int(bad.sum())
            ids[bad] = -1
        return ids

    def _threads(self, kept: list[Event]) -> np.ndarray:
        """The (pid, tid) code of each event. Integer ids (Kineto writes them) are coded in
        numpy: the distinct pairs of a piece are a handful, found by np.unique, and only they
        meet the table, in the order they first occur; text ids take the tuple path."""
        n = len(kept)
        pids, tids = list(map(_PID, kept)), list(map(_TID, kept))
        # numpy would parse a text id such as "1890023232" as a number, so that one thread written
        # as text (torch 1.8's tids) would get two codes, one per piece, as pieces took one path or
        # the other: only JSON integers take the numeric path (the types are found in C)
        if not set(map(type, pids)) | set(map(type, tids)) <= {int}:
            return self._encode(list(zip(pids, tids)), self.threads)[0]
        try:
            pid = np.fromiter(pids, np.int64, n)
            tid = np.fromiter(tids, np.int64, n)
        except OverflowError:
            return self._encode(list(zip(pids, tids)), self.threads)[0]
        pids, pid_code = np.unique(pid, return_inverse=True)
        tids, tid_code = np.unique(tid, return_inverse=True)
        pairs, first, code = np.unique(pid_code.astype(np.int64) * len(tids) + tid_code.ravel(),
                                       return_index=True, return_inverse=True)
        ids = np.empty(len(pairs), np.int32)
        for k in np.argsort(first, kind="stable").tolist():
            key = (int(pids[pairs[k] // len(tids)]), int(tids[pairs[k] % len(tids)]))
            ids[k] = self.threads.setdefault(key, len(self.threads))
        return ids[code.ravel()]

    def add(self, events: list[Event], number: int) -> None:
        first = self.events_seen
        self.events_seen += len(events)
        if _meter is not None:
            _meter.decoded(self.events_seen)
        if self.events_seen > self.limits.max_events:
            raise TraceError(self.path, f"holds more than {self.limits.max_events:,} events (the limit; "
                                        "raise it with --max-events)")
        code = _KIND_CODE
        kept = [e for e in events if e.cat in code and e.ph == "X"]
        cats = map(_CAT, kept)
        if not kept:  # a torch <= 1.7 autograd-profiler export?
            legacy = _LEGACY_PID_CAT
            kept = [e for e in events if not e.cat and e.ph == "X" and isinstance(e.pid, str) and e.pid in legacy]
            cats = (legacy[e.pid] for e in kept)
        n = len(kept)
        if not n:
            return
        kind = np.fromiter(map(code.__getitem__, cats), np.int8, n)
        names = list(map(_NAME, kept))
        name_id, new = self._encode(names, self.names)
        longest = max(new, key=len, default="")
        if len(longest) > self.limits.max_name_chars:
            at = first + next(i for i, e in enumerate(events) if e.name is longest)
            raise TraceError(self.path, f"traceEvents[{at}] field 'name' is {len(longest):,} characters long, over "
                                        f"the limit of {self.limits.max_name_chars:,}")
        ts = np.fromiter(map(_TS, kept), np.float64, n)
        dur = np.fromiter(map(_DUR, kept), np.float64, n)
        thread = self._threads(kept)
        args = list(map(_ARGS, kept))
        corr = self._ids(list(map(_CORR, args)))
        ext = self._ids(list(map(_EXT, args)))
        shape = np.full(n, -1, np.int32)
        ops = np.flatnonzero(kind == _KIND_CODE["cpu_op"])
        if len(ops):
            op_args = [args[i] for i in ops.tolist()]
            keys = list(map(b"\0".join, zip(map(_DIMS, op_args), map(_TYPES, op_args))))
            shape[ops], _ = self._encode(keys, self.shapes)
        self.parts.append((number, (kind, name_id, ts, dur, thread, corr, ext, shape)))

    def export(self) -> dict:
        """What a helper process sends back (pickled: numpy arrays and the code tables)."""
        return {"parts": self.parts, "names": list(self.names), "threads": list(self.threads),
                "shapes": list(self.shapes), "events_seen": self.events_seen,
                "ids_out_of_range": self.ids_out_of_range}

    def merge(self, other: dict) -> None:
        """Take in another process's columns, recoding its names, threads and shapes."""
        def recode(values: list, table: dict) -> np.ndarray:
            return np.array([table.setdefault(v, len(table)) for v in values] + [-1], np.int32)

        names = recode(other["names"], self.names)
        threads = recode(other["threads"], self.threads)
        shapes = recode(other["shapes"], self.shapes)  # a shape of -1 (none) stays -1
        for number, (kind, name_id, ts, dur, thread, corr, ext, shape) in other["parts"]:
            self.parts.append((number, (kind, names[name_id], ts, dur, threads[thread], corr, ext, shapes[shape])))
        self.parts.sort(key=lambda part: part[0])
        self.events_seen += other["events_seen"]
        self.ids_out_of_range += other["ids_out_of_range"]

    def finish(self, path: str, header: dict) -> RawTrace:
        if self.parts:
            cols = [np.concatenate(c) for c in zip(*(columns for _, columns in self.parts))]
        else:
            cols = [np.empty(0, t) for t in (np.int8, np.int32, np.float64, np.float64, np.int32, np.int64, np.int64, np.int32)]
        return RawTrace(
            path, header, *cols,
            names=list(self.names), threads=list(self.threads),
            shapes=[tuple(key.split(b"\0", 1)) for key in self.shapes],
            events_seen=self.events_seen, repaired_bytes=self.repaired_bytes,
            ids_out_of_range=self.ids_out_of_range,
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


@contextmanager
def _reading(path: Path):
    """A read error (a truncated or corrupt gzip) becomes a TraceError naming the file."""
    try:
        yield
    except (EOFError, OSError, igzip.BadGzipFile, IsalError) as e:  # IsalError: an invalid deflate block
        raise TraceError(path, f"compressed data is truncated or corrupt ({e})") from None


def _read(stream: BinaryIO, path: Path, n: int) -> bytes:
    with _reading(path):
        return stream.read(n)


def _read_into(stream: BinaryIO, path: Path, buf: bytearray, at: int, n: int) -> int:
    """Read up to n bytes into buf[at:] (exactly n unless the file ends: both processes of a
    split read must see the same bytes at the same places)."""
    got = 0
    with _reading(path), memoryview(buf) as view:
        while got < n:
            k = stream.readinto(view[at + got : at + n])
            if not k:
                break
            got += k
    return got


def _decode_header(path: Path, text: bytes) -> dict:
    try:
        header = json.loads(text)
    except ValueError:
        raise TraceError(path, "not a JSON trace (the keys around 'traceEvents' do not parse)") from None
    except RecursionError:
        raise TraceError(path, "the keys around 'traceEvents' nest deeper than the JSON decoder's limit of "
                               f"{sys.getrecursionlimit():,} levels") from None
    if not isinstance(header, dict):
        raise TraceError(path, "not a JSON object at the top level")
    return header


def _decode_piece(path: Path, array, first_index: int) -> list[Event]:
    """Decode a JSON array of events; a type error is reported with the event's index and field."""
    try:
        return _DECODER.decode(array)
    except msgspec.ValidationError as e:
        raise TraceError(path, _describe_validation(str(e), first_index)) from None
    except RecursionError:
        raise TraceError(path, f"traceEvents after event {first_index}: JSON nested deeper than the decoder's "
                               f"limit of {sys.getrecursionlimit():,} levels") from None


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


def _last_boundary(buf: bytearray, lo: int, end: int) -> int | None:
    """Position of the '}' of the last `},{` in buf[lo:end], or None."""
    window = 1 << 16
    while True:
        start = max(lo, end - window)
        last = None
        for m in _BOUNDARY.finditer(buf, start, end):
            last = m
        if last is not None:
            return last.start()
        if start == lo:
            return None
        window *= 4


def _decode_in_place(buf: bytearray, start: int, end: int, decode):
    """decode(the events in buf[start + 1 : end] as a JSON array) without copying them: the
    byte before the piece and the byte after it (separators or whitespace) briefly become '['
    and ']'. The events' Raw fields point into buf: drop them before buf is overwritten."""
    before, after = buf[start], buf[end]
    buf[start], buf[end] = 0x5B, 0x5D
    try:
        with memoryview(buf) as view:
            return decode(view[start : end + 1])
    finally:
        buf[start], buf[end] = before, after


def read_trace(path: str | os.PathLike, *, split: bool | None = None, chunk_bytes: int = CHUNK_BYTES,
               limits: ReadLimits = DEFAULT_LIMITS) -> RawTrace:
    """Read one trace file into columns. Raises TraceError naming the file and the problem.

    A large trace is read by two processes (`split`; by default when it is worth it): both
    stream the whole file and cut it at the same event boundaries, each decodes the pieces it
    reaches first (`_Claims`: turn about on an idle machine, mostly this process when the helper
    gets little CPU), and the helper's columns join this process's. Anything unusual on that path (bad
    JSON, a wrong type, a cut that fell inside a string) sends the read to the one-process
    reader, which alone says what is wrong and where."""
    path = Path(path)
    if _meter is not None:
        _meter.start()
    if split is None:
        split = _worth_splitting(path, chunk_bytes)
    if split:
        trace = _read_split(path, chunk_bytes, limits)
        if trace is not None:
            return trace
    return _read_serial(path, chunk_bytes, limits)


_READ_BYTES = 1 << 16  # what _open_events reads at a time


def _skip_space(stream: BinaryIO, path: Path, rest: bytes, offset: int, skipped: int,
                limits: ReadLimits) -> tuple[bytes, int, int]:
    """(rest without the whitespace it starts with, reading on while all it holds is whitespace,
    b"" at the end of the file; the byte offset of its first byte in the JSON; the whitespace
    skipped so far, `skipped` included). Each read is stripped once and dropped when it is all
    whitespace, so the skip is linear in its bytes and holds one read; more than
    limits.max_padding_bytes of whitespace in all is refused at the offset it reached."""
    while True:
        stripped = rest.lstrip()
        offset += len(rest) - len(stripped)
        skipped += len(rest) - len(stripped)
        if skipped > limits.max_padding_bytes:
            raise TraceError(path, f"has more than {limits.max_padding_bytes:,} bytes of whitespace before its "
                                   f"first event (at byte {offset:,} of the JSON; the limit)")
        if stripped:
            return stripped, offset, skipped
        rest = _read(stream, path, _READ_BYTES)
        if not rest:
            return b"", offset, skipped


def _not_a_trace(path: Path) -> TraceError:
    return TraceError(path, "is not a trace: it starts with neither '{' (a JSON object with "
                            "'traceEvents') nor '[' (an array of events)")


def _open_events(stream: BinaryIO, path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> tuple[dict, bytes, bool]:
    """Read up to the first event: (the keys before `traceEvents`, the bytes from its first event
    on, whether the file is Chrome's JSON Array Format: the events array itself, as Kineto wrote
    traces in 2020, with no keys at all).

    The first byte that is not whitespace decides: '[' an array of events, '{' an object whose
    `traceEvents` key is then looked for in the bytes as they arrive (each read searched once,
    with the key's length of overlap: linear in the bytes before it), anything else is refused.
    The whitespace before the object, around the key's ':' and '[' and before the first event is
    skipped a read at a time (`_skip_space`: linear, at most limits.max_padding_bytes in all)."""
    head, offset, skipped = _skip_space(stream, path, b"", 0, 0, limits)
    if not head:
        raise TraceError(path, "is empty")
    if head[:1] == b"[":
        rest, _, _ = _skip_space(stream, path, head[1:], offset + 1, skipped, limits)
        return {}, rest, True
    if head[:1] != b"{":
        raise _not_a_trace(path)
    parts: list[bytes] = [head]
    size = len(head)
    while _KEY not in (parts[-2][-len(_KEY):] if len(parts) > 1 else b"") + parts[-1]:
        if size > (64 << 20):
            raise TraceError(path, "no 'traceEvents' key in the first 64 MB")
        more = _read(stream, path, _READ_BYTES)
        if not more:
            _decode_header(path, b"".join(parts))  # valid JSON but no events key
            raise TraceError(path, "has no 'traceEvents' array")
        parts.append(more)
        size += len(more)
    head = b"".join(parts)
    key_at = head.index(_KEY)
    prefix = head[:key_at].strip()
    rest, at, skipped = _skip_space(stream, path, head[key_at + len(_KEY) :], offset + key_at + len(_KEY), skipped,
                                    limits)
    for expected in (b":", b"["):
        if rest[:1] != expected:
            raise TraceError(path, "'traceEvents' is not an array")
        rest, at, skipped = _skip_space(stream, path, rest[1:], at + 1, skipped, limits)
    header_text = prefix.rstrip(b",") + b"}"
    header = _decode_header(path, header_text if prefix != b"{" else b"{}")
    return header, rest, False


def _scan(path: Path, chunk_bytes: int, on_piece, on_last, limits: ReadLimits = DEFAULT_LIMITS,
          where=lambda: "") -> dict:
    """Stream the trace, cutting `traceEvents` into pieces of about chunk_bytes at event
    boundaries: on_piece(number, buf, start, end) for the events in buf[start + 1 : end]
    (it returns False when the cut must move on to the next boundary), on_last(number, JSON
    array) for the final events (it raises msgspec.DecodeError when that text is not the array:
    see `_finish_events`). Returns the keys around the array. The cuts depend only on the
    file's bytes, so two processes scanning one file cut it at the same places.

    The bytes go into one buffer allocated once (readinto, moving the unread tail to the
    front when it fills), not a new bytes object per read: fresh memory costs page faults.

    The limits are checked as the bytes arrive: the uncompressed size, how far a .json.gz
    inflates (a gzip bomb is refused within its first few hundred MB), and the size of one
    piece that has no event boundary (one huge event, or a huge run of whitespace)."""
    stored = _stored_size(path)
    with open_trace_stream(path) as stream:
        raw = getattr(stream, "fileobj", stream)  # the file on disk (under a gzip stream)
        header, rest, array_form = _open_events(stream, path, limits)
        total = len(rest)
        buf = bytearray(max(3 * chunk_bytes, 2 * len(rest) + 2))
        buf[0] = 0x5B  # '['
        buf[1 : 1 + len(rest)] = rest
        # buf[start] is the byte before the next undecoded event ('[' , ',' or whitespace);
        # lo is where the next search for a cut begins (past a cut that fell inside a string);
        # buf[:end] holds what has been read
        end = 1 + len(rest)
        start = lo = number = 0
        eof = False
        while True:
            cut = None if eof or end - lo < chunk_bytes else _last_boundary(buf, lo, end)
            if cut is None:
                if eof:
                    header.update(_finish_events(path, bytes(memoryview(buf)[start + 1 : end]),
                                                 lambda text: on_last(number, text), array_form))
                    return header
                if end - lo >= chunk_bytes:
                    lo = max(lo, end - 1)  # no boundary in a whole chunk: read on
                if end - start > limits.max_piece_bytes:
                    raise TraceError(path, f"has more than {limits.max_piece_bytes:,} bytes without an event boundary "
                                           f"in traceEvents {where()} (one event, or whitespace, over the limit)")
                if end + chunk_bytes > len(buf):
                    buf = _move_to_front(buf, start, end, chunk_bytes)
                    lo, end, start = lo - start, end - start, 0
                got = _read_into(stream, path, buf, end, chunk_bytes)
                eof = got == 0
                end += got
                total += got
                _check_size(path, total, stored, limits)
                if _meter is not None:
                    _meter.read(raw.tell())
                continue
            if not on_piece(number, buf, start, cut + 1):
                lo = cut + 1
                continue
            number += 1
            start = buf.index(b"{", cut + 1, end) - 1
            lo = start


def _stored_size(path: Path) -> int | None:
    """The compressed size of a gzip file (None for plain JSON or what cannot be stat'ed)."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size if f.read(2) == b"\x1f\x8b" else None
    except OSError:
        return None


def _check_size(path: Path, total: int, stored: int | None, limits: ReadLimits) -> None:
    if total > limits.max_bytes:
        raise TraceError(path, f"is larger than {limits.max_bytes / 2**20:,.0f} MB of JSON (the limit; raise it with "
                               "--max-trace-mb)")
    if stored and total > _INFLATION_CHECKED_FROM and total > limits.max_inflation * stored:
        raise TraceError(path, f"inflates more than {limits.max_inflation:.0f}x ({total / 2**20:,.0f} MB from "
                               f"{stored / 2**20:,.1f} MB so far): refused as a gzip bomb (profiler traces "
                               "compress 10-30x; the limit is 200x)")


def _move_to_front(buf: bytearray, start: int, end: int, room: int) -> bytearray:
    """buf[start:end] moved to the front, with at least `room` bytes free after it (in a
    bigger buffer when a piece outgrows this one)."""
    n = end - start
    if n + room > len(buf):
        bigger = bytearray(n + 2 * room)  # grows a chunk at a time: a piece is at most max_piece_bytes
        bigger[:n] = memoryview(buf)[start:end]
        return bigger
    with memoryview(buf) as view:
        view[:n] = view[start:end]  # memmove
    return buf


def _read_serial(path: Path, chunk_bytes: int, limits: ReadLimits = DEFAULT_LIMITS) -> RawTrace:
    if _meter is not None:
        _meter.start()  # (again, after a split read that fell back to this one)
    cols = _Columns(path, limits)

    def on_piece(number: int, buf: bytearray, start: int, end: int) -> bool:
        try:
            events = _decode_in_place(buf, start, end, lambda piece: _decode_piece(path, piece, cols.events_seen))
        except msgspec.DecodeError:
            events = _decode_repaired(path, bytes(memoryview(buf)[start + 1 : end]), cols)
            if events is None:
                # the cut fell inside a string (or the JSON is bad): extend the piece
                if end - start > limits.max_piece_bytes:
                    raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen}") from None
                return False
        cols.add(events, number)
        return True

    def on_last(number: int, events_text: bytes) -> None:
        try:
            events = _decode_piece(path, events_text, cols.events_seen)
        except msgspec.DecodeError:
            events = _decode_repaired(path, events_text[1:-1], cols)
            if events is None:
                raise
        cols.add(events, number)

    try:
        header = _scan(path, chunk_bytes, on_piece, on_last, limits, lambda: f"after event {cols.events_seen}")
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON in traceEvents after event {cols.events_seen} ({e})") from None
    return _finish(cols, path, header)


# JSON forbids raw control characters in strings and requires UTF-8; torch's profiler has been
# seen writing both into names (Perfetto refuses such traces). Structural JSON is ASCII printable,
# so turning every control byte into a space changes no structure: outside strings they were
# whitespace (or invalid), inside strings they become spaces.
_CONTROL_TO_SPACE = bytes.maketrans(bytes(range(32)), b" " * 32)
_NOT_WHITESPACE_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r")


def _decode_repaired(path: Path, body: bytes, cols: "_Columns") -> list[Event] | None:
    """Decode the events in `body` (a piece without its brackets) after replacing raw control
    characters by spaces and invalid UTF-8 by U+FFFD; None when the piece needs no such repair
    or is still not valid JSON (then the fault is elsewhere). Counts the bytes replaced."""
    fixed = body.translate(_CONTROL_TO_SPACE)
    text = fixed.decode("utf-8", "replace")
    bad_utf8 = text.count("\ufffd") - fixed.count("\ufffd".encode())
    controls = len(body) - len(body.translate(None, _NOT_WHITESPACE_CONTROL))
    if not bad_utf8 and fixed == body:
        return None
    try:
        events = _decode_piece(path, b"[" + text.encode() + b"]", cols.events_seen)
    except msgspec.DecodeError:
        return None
    cols.repaired_bytes += controls + bad_utf8
    return events


def _finish(cols: _Columns, path: Path, header: dict) -> RawTrace:
    if cols.events_seen > cols.limits.max_events:  # a split read counts each half alone
        raise TraceError(path, f"holds more than {cols.limits.max_events:,} events (the limit; raise it with "
                               "--max-events)")
    trace = cols.finish(str(path), header)
    if trace.events_seen == 0:
        raise TraceError(path, "'traceEvents' holds no events")
    return trace


def _finish_events(path: Path, text: bytes, on_last, array_form: bool = False) -> dict:
    """Hand the events after the last cut to on_last and return the keys that follow the
    `traceEvents` array (Kineto writes traceName, displayTimeUnit, baseTimeNanoseconds and often
    "INFO": [...log lines...] there). The array's end is first taken at the last ']' before keys
    that parse; when that text is not an array of events (a ']' inside the trailing keys), the
    array's end is found exactly by parsing. A wrong split can never decode: it would leave a
    ']' at the top level of the events. In the array form the file ends with the array's ']'
    (Chrome's format lets a writer leave it off; such a file is refused as truncated)."""
    body = text.rstrip()
    if array_form:
        if not body.endswith(b"]"):
            raise TraceError(path, "is truncated (the array of events does not end with ']'; an array left "
                                   "open, which Chrome's trace format allows, is not read)")
        events_part = body[:-1].rstrip()
        if events_part.endswith(b","):
            events_part = events_part[:-1]
        if events_part.strip():
            on_last(b"[" + events_part + b"]")
        return {}
    if not body.endswith(b"}"):
        raise TraceError(path, "is truncated (the JSON does not end with '}')")
    fast = _split_at_last_bracket(path, body)
    try:
        return _hand_over(fast, on_last)
    except msgspec.DecodeError:
        exact = _split_exactly(body)
        if exact is None or exact == fast:
            raise
    return _hand_over(exact, on_last)


def _hand_over(split: tuple[bytes | None, dict], on_last) -> dict:
    events_text, tail = split
    if events_text is not None:
        on_last(events_text)
    return tail


def _events_and_tail(events_part: bytes, after: bytes) -> tuple[bytes | None, dict] | None:
    """(events as a JSON array or None when empty, the trailing keys) of a split of the final
    text into the events before a ']' and what follows it; None when what follows is not
    a run of object keys closing the top-level object."""
    after = after.strip()
    if after.startswith(b","):
        after = after[1:]
    try:
        tail = json.loads(b"{" + after) if after.strip() != b"}" else {}
    except (ValueError, RecursionError):
        return None
    if not isinstance(tail, dict):
        return None
    events_part = events_part.rstrip()
    if events_part.endswith(b","):
        events_part = events_part[:-1]
    if not events_part.strip():
        return None, tail
    return b"[" + events_part + b"]", tail


def _split_at_last_bracket(path: Path, body: bytes) -> tuple[bytes | None, dict]:
    """The split at the last ']' that is followed only by parseable keys."""
    pos = len(body)
    while True:
        pos = body.rfind(b"]", 0, pos)
        if pos < 0:
            raise TraceError(path, "is truncated or not JSON (the 'traceEvents' array never closes)")
        split = _events_and_tail(body[:pos], body[pos + 1 :])
        if split is not None:
            return split


def _split_exactly(body: bytes) -> tuple[bytes | None, dict] | None:
    """The split at the ']' that really closes the events array, found by parsing it (a few ms
    a MB; only for traces whose trailing keys hold brackets); None when it does not parse."""
    text = (b"[" + body).decode("utf-8", "surrogateescape")
    try:
        _, end = json.JSONDecoder(strict=False).raw_decode(text)
    except (ValueError, RecursionError):
        return None
    close = len(text[:end].encode("utf-8", "surrogateescape")) - 1  # just past ']' in body
    return _events_and_tail(body[: close - 1], body[close:])


# -- the two-process reader ------------------------------------------------------------------

# A helper process pays for itself on traces of some MB: its start (fork) costs milliseconds.
SPLIT_MIN_BYTES = 16 << 20


def _worth_splitting(path: Path, chunk_bytes: int) -> bool:
    """Two processes on Linux (fork starts the helper in milliseconds) when this process may
    run on two CPUs and the trace is big enough (its uncompressed size, from the gzip trailer)
    to repay it."""
    if os.environ.get("STEPWATCH_READ_PROCESSES", "2") == "1":
        return False
    if not sys.platform.startswith("linux"):  # fork is only safe to lean on there
        return False
    return len(os.sched_getaffinity(0)) >= 2 and _uncompressed_size(path) >= max(SPLIT_MIN_BYTES, 4 * chunk_bytes)


def _uncompressed_size(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)  # ISIZE: the uncompressed length modulo 2**32
            return max(size, int.from_bytes(f.read(4), "little"))
    except OSError:
        return 0  # the one-process reader will say what is wrong with the file


class _Claims:
    """Which process of a split read decodes each piece: the first to reach it. Both processes
    scan every piece in order; `take(n)` is true for the one that gets to piece n first. Pieces
    below `next` are taken (a process at piece n has seen every piece before it taken, by itself
    or the other), so one counter under a lock is the whole record. When the other process is
    slowed (a busy machine gives it little CPU), this one takes more pieces, down to reading the
    trace alone; on an idle machine the two take turns, piece about piece."""

    def __init__(self, ctx) -> None:
        self._next = ctx.RawValue("q", 0)
        self._done = ctx.RawValue("b", 0)
        self._lock = ctx.Lock()
        # events the helper has decoded: written by it once per piece, shown by the main
        # process on the progress meter (a helper started early was forked before the meter)
        self.helper_events = ctx.RawValue("q", 0)

    def take(self, number: int) -> bool:
        with self._lock:
            if self._next.value > number:
                return False
            self._next.value = number + 1
            return True

    def finish(self) -> None:
        """Said by the main process when it reads on alone (when its scan is over, or when the
        helper does not help): the helper stops, and this process takes every piece left."""
        self._done.value = 1

    @property
    def finished(self) -> bool:
        return bool(self._done.value)

    def left_behind(self, number: int) -> bool:
        """Whether a helper at piece `number` is done for: the main process has read to the end,
        or has taken the next HELPER_LAG_PIECES pieces while the helper was held up (the machine
        gives it too little CPU to be worth the cores it takes from the main process)."""
        return bool(self._done.value) or self._next.value > number + HELPER_LAG_PIECES


class _Finished(Exception):
    """The helper stops scanning: the main process reads the rest (see `_Claims.left_behind`)."""


# A helper this many pieces behind the main process stops: it is not getting a CPU of its own.
# Every this many pieces the main process also checks that it had most of a CPU to itself.
HELPER_LAG_PIECES = 8
MIN_CPU_SHARE = 0.75


def _read_share(path: Path, chunk_bytes: int, claims: _Claims, limits: ReadLimits,
                helper: bool = False) -> tuple[dict | None, _Columns]:
    """One process's share of a split read: the pieces it reaches first (see `_Claims`). The
    helper stops as soon as the main process has read to the end (header None). Cuts are not
    checked here: a cut inside a string breaks the piece before it, whichever process decodes
    it, and then the read goes to the one-process reader."""
    cols = _Columns(path, limits)
    window = [time.perf_counter(), time.process_time()]

    def on_piece(number: int, buf: bytearray, start: int, end: int) -> bool:
        if helper and claims.left_behind(number):
            raise _Finished
        if claims.take(number):
            cols.add(_decode_in_place(buf, start, end, _DECODER.decode), number)
            if helper:
                claims.helper_events.value = cols.events_seen
        if not helper and _meter is not None:
            _meter.for_helper().decoded(claims.helper_events.value)
        if not helper and number % HELPER_LAG_PIECES == HELPER_LAG_PIECES - 1 and not claims.finished:
            # the main process's share of a CPU over the last pieces: well under one CPU means
            # the two processes are sharing one (a busy machine, or a CPU quota) and the helper
            # only takes time from this process: it stops, this process reads on alone
            wall, cpu = time.perf_counter(), time.process_time()
            if cpu - window[1] < MIN_CPU_SHARE * (wall - window[0]):
                claims.finish()
            window[:] = wall, cpu
        return True

    def on_last(number: int, events_text: bytes) -> None:
        events = _DECODER.decode(events_text)  # decoded by both: it tells where the array ends
        if claims.take(number):
            cols.add(events, number)

    try:
        header = _scan(path, chunk_bytes, on_piece, on_last, limits)
    except _Finished:
        return None, cols
    if not helper:
        claims.finish()
    return header, cols


_PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux prctl PR_SET_PDEATHSIG), and
    exit now if the parent is already gone (it may have died before the call)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux's libc: the closed pipe below still ends it
        pass
    if os.getppid() != parent:
        os._exit(0)


def _helper_main(path: Path, chunk_bytes: int, claims: _Claims, limits: ReadLimits, conn, parents_end,
                 parent: int) -> None:
    """The helper process: decode the pieces it reaches first and send their columns back. It must never
    outlive the importer: it dies with it (parent-death signal), and it holds no copy of the
    parent's end of the pipe, so a send to a dead parent fails instead of blocking for ever."""
    global _meter
    _die_with_parent(parent)
    parents_end.close()
    _meter = None  # its events go to claims.helper_events; the main process reports them
    # Ctrl-C reaches the whole process group: the parent stops this helper itself (terminate),
    # so the helper must not die printing a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _, cols = _read_share(path, chunk_bytes, claims, limits, helper=True)
        payload = (True, cols.export())
    except BaseException:  # noqa: BLE001 - whatever it was, the one-process reader will say it
        payload = (False, None)
    try:
        conn.send(payload)
        conn.close()
    except OSError:  # the parent is gone
        pass


@dataclass
class _Helper:
    """A split read's helper process, started, and what the main process holds of it."""

    process: multiprocessing.process.BaseProcess
    receiver: object  # the pipe's end its columns come back through
    claims: _Claims
    chunk_bytes: int
    limits: ReadLimits

    def stop(self) -> None:
        self.receiver.close()
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()
        self.process.close()


def _start_helper(path: Path, chunk_bytes: int, limits: ReadLimits) -> _Helper | None:
    """Fork the helper of a split read of `path`; None when this process cannot fork."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    claims = _Claims(ctx)
    process = ctx.Process(target=_helper_main, args=(path, chunk_bytes, claims, limits, sender, receiver, os.getpid()),
                          name="stepwatch-trace-reader")
    try:
        with warnings.catch_warnings():
            # Python 3.12 warns when a process with threads forks; the helper runs only this
            # module's reader (msgspec, numpy, isal), never code that could wait on their locks
            warnings.simplefilter("ignore", DeprecationWarning)
            process.start()
    except (OSError, AssertionError):  # cannot fork here (no memory, or a daemon process)
        receiver.close()
        sender.close()
        return None
    sender.close()
    return _Helper(process, receiver, claims, chunk_bytes, limits)


# Helpers started before their read (`start_early`), by the file's real path.
_EARLY: dict[str, _Helper] = {}


def start_early(path: str | os.PathLike, limits: ReadLimits = DEFAULT_LIMITS, chunk_bytes: int = CHUNK_BYTES) -> bool:
    """Start the helper of a split read of `path` now, before the read itself: the importer
    calls this as soon as its command line is parsed, so the helper reads the first pieces
    while this process loads the modules the import needs (DuckDB, the analysis: ~0.3 s of a
    core that would otherwise stay idle on a 2-core machine). The read of that path
    (`read_trace`, same limits) takes the helper over; pieces it decoded already are not read
    twice (`_Claims`). True when a helper was started (a file worth splitting: see
    `_worth_splitting`). `stop_early` ends helpers no read took."""
    path = Path(path)
    key = os.path.realpath(path)
    if key in _EARLY or not path.is_file() or not _worth_splitting(path, chunk_bytes):
        return False
    helper = _start_helper(path, chunk_bytes, limits)
    if helper is None:
        return False
    _EARLY[key] = helper
    return True


def stop_early() -> None:
    """End the helpers `start_early` started that no read took (the import failed first)."""
    while _EARLY:
        _EARLY.popitem()[1].stop()


def _take_early(path: Path, chunk_bytes: int, limits: ReadLimits) -> _Helper | None:
    helper = _EARLY.pop(os.path.realpath(path), None)
    if helper is not None and (helper.chunk_bytes, helper.limits) != (chunk_bytes, limits):
        helper.stop()  # started for another read of the file
        return None
    return helper


def _read_split(path: Path, chunk_bytes: int, limits: ReadLimits = DEFAULT_LIMITS) -> RawTrace | None:
    """Read with a forked helper (one started early, or one started now); None when that did
    not work out (read it in one process)."""
    helper = _take_early(path, chunk_bytes, limits) or _start_helper(path, chunk_bytes, limits)
    if helper is None:
        return None
    try:
        try:
            header, cols = _read_share(path, chunk_bytes, helper.claims, limits)
            ok, theirs = helper.receiver.recv()
        except (TraceError, msgspec.MsgspecError, EOFError, RecursionError):
            return None
        if not ok:
            return None
        if _meter is not None:
            _meter.for_helper().decoded(theirs["events_seen"])
        cols.merge(theirs)
        return replace(_finish(cols, path, header), processes=2)
    finally:
        helper.stop()
