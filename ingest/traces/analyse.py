"""Stages 2-5 of the trace pipeline: normalise -> link launches -> assign steps -> aggregate.

Each stage is a pure function over arrays returning new data. The result for one trace file
(one rank) is a `RankFigures`: per-kernel statistics, per-step figures and run totals.

Terms: a *kernel* is a GPU activity (kernel, memcpy or memset); in a CPU-only trace the leaf CPU
ops play that part. A kernel's *launcher* is the innermost CPU op around its runtime launch
(found through the shared correlation id) or, for kernels replayed from a CUDA graph, the graph
launch itself. Its *source* is the innermost Python frame around the launch that is outside
torch, triton and the standard library, as `path/file.py(line): function`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TraceError
from .categories import COPY_CATEGORIES, Rule, categorise, rules_time_limit
from .costs import model_shape_cost
from .devices import find_device
from .graph_attribution import (METHOD_MAPPING, MIN_STEP_MATCH, KernelSequence, align_steps, find_layers,
                                summarise_layers)
from .nesting import Nesting
from .roofline import resolve_units, spread_op_costs, summarise_roofline
from .shapes import summarise_shape
from .table import Groups, Table, number_groups
from .timeline import HOST_SYNC, measure_timeline
from .trace_read import KINDS, RawTrace

K = {k: i for i, k in enumerate(KINDS)}
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
_SPAN_NAME = re.compile(r"^step\[")
_DECODE_SPAN = re.compile(r"^step\[DECODE\b")
# speculative decoding (sglang 0.5.23 utils/profile_utils.py:485-488): the target's verify forward,
# every forward of the draft model; the stage spans around the draft's work (spec_utils.py:852)
_VERIFY_SPAN = re.compile(r"^step\[VERIFY\b")
_DRAFT_SPAN = re.compile(r"^step\[DRAFT\b")
_SPEC_STAGE = re.compile(r"^(draft|draft_extend)$")
_GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)")
# runtime / driver calls that launch kernels (CUDA and HIP): cudaLaunchKernel, cuLaunchKernel,
# cudaLaunchKernelExC, cudaLaunchCooperativeKernel, hipLaunchKernel, hipExtModuleLaunchKernel, cudaGraphLaunch
_KERNEL_LAUNCH = re.compile(r"\w*(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
# stream capture into a CUDA / HIP graph: launches between these record kernels, they do not run them
_CAPTURE = re.compile(r"^(cuda|hip|cu)StreamBeginCapture")
# a copy to or from host memory ("Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)"):
# PCIe / NVLink-C2C bound, so no fraction of the GPU's memory bandwidth says how fast it ran
_HOST_COPY = re.compile(r"Memcpy (HtoD|DtoH|HtoH|HtoA|AtoH)\b|Pageable|Pinned|\bHost\b", re.IGNORECASE)
# a Python frame as torch names it, `file(line): function`; the file need not end in .py (a script
# run as `python bench`, code compiled from a string, a notebook cell `<ipython-input-3-...>`)
_SOURCE_LINE = re.compile(r"\(\d+\): \S")
# ops that touch only part of their inputs: their input bytes say nothing about traffic
_PARTIAL_ACCESS = re.compile(r"index|gather|scatter|embedding|select|slice|narrow|masked|take|put_")
_NOT_USER_CODE = re.compile(r"(^|/)(torch|triton)/|(^|/)lib/python3\.\d+/(?!site-packages/)|^<(frozen|built-in)")
ACTIVITY = {K["kernel"]: "kernel", K["gpu_memcpy"]: "memcpy", K["gpu_memset"]: "memset", K["cpu_op"]: "cpu_op"}


@dataclass(frozen=True)
class Kernels:
    """One row per kernel (GPU activity, or leaf CPU op in a CPU-only trace)."""

    event: np.ndarray  # index into the RawTrace columns
    ts_us: np.ndarray
    dur_us: np.ndarray
    query_ts_us: np.ndarray  # host-side time used to place it in a step (launch time)
    launcher: np.ndarray  # object: launcher name or "" when unknown
    source: np.ndarray  # object: Python source line or ""
    bytes_per_call: np.ndarray  # float, NaN when unknown
    dtypes_differ: np.ndarray  # bool
    from_cpu_ops: bool
    set_aside: int = 0  # kernels (or CPU ops) whose time could not be real: negative, non-finite, > a day
    input_dtypes: np.ndarray | None = None  # object: the launching op's tensor input dtypes ("bfloat16"), "" unknown
    query_thread: np.ndarray | None = None  # thread of the launch (or of the kernel when unlinked)
    op_event: np.ndarray | None = None  # the launching op's event (-1 none: a graph replay, no launch, CPU-only)
    from_graph: np.ndarray | None = None  # bool: replayed from a graph (launched by cudaGraphLaunch, hipGraphLaunch)
    # bool: launched before (or after) the recorded window: no launch in the file, and a correlation id
    # below (above) every launch the file holds; in no step (assign_steps)
    outside_window: np.ndarray | None = None
    unrun_launches: int = 0  # kernel launches in the trace with no GPU activity of theirs in it
    captures: int = 0  # stream captures into a graph begun in the trace (cudaStreamBeginCapture, ...)
    link_note: str | None = None  # the correlation ids were damaged: how the kernels were linked instead
    # bool: linked to a launch that no recorded CPU op encloses (not a graph replay): its launcher is the
    # runtime call's own name (cudaLaunchKernel, cuLaunchKernelEx), not an op's
    bare_launch: np.ndarray | None = None


@dataclass(frozen=True)
class Steps:
    method: str  # "profiler-step", "span", "graph-launch", "whole-trace" or "given"
    kernel_step: np.ndarray  # step number of each kernel, -1 between (outside every) step
    wall_us: np.ndarray  # per step: its GPU time (see assign_steps)
    host_us: np.ndarray  # per step: its host-side span, NaN where the method has none
    notes: list[str]  # what the method implies, shown with the run


@dataclass(frozen=True)
class RankFigures:
    path: str
    rank: int
    device_name: str | None
    peak_gbps: float | None
    step_method: str
    steps: int
    kernels_from_cpu_ops: bool
    kernel_us_total: float
    copy_share: float | None
    step_ms_median: float | None
    gpu_busy_share: float | None
    kernel_stats: Table  # one row per kernel (name, category, launcher, source, graph op and line) and its figures
    step_table: Table  # step, wall_us, gpu_busy_us, kernel_us
    step_categories: Table  # step, category, dur_us
    between_steps_us: float = 0.0  # kernels launched outside every step
    between_steps_kernels: int = 0
    notes: list = field(default_factory=list)  # what a reader of the figures must know
    # the communication kernels in time order (start, end, step): for waits across ranks
    comm_start_us: np.ndarray = field(default_factory=lambda: np.empty(0))
    comm_end_us: np.ndarray = field(default_factory=lambda: np.empty(0))
    comm_step: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # the GPU timeline's figures (streams, busy, exposed communication, host syncs inside steps:
    # ingest/traces/timeline.py); None for a CPU-only trace
    timeline: dict | None = None
    # how kernels replayed from CUDA graphs were given ops, lines and layers (attribute_graph_kernels);
    # None when no mapping was given
    graph_attribution: dict | None = None
    # the device's ceilings the roofline columns are fractions of (devices.DevicePeaks.describe);
    # None for an unknown device or a CPU-only trace
    roofline: dict | None = None


MAX_RANK = 1 << 20  # more ranks than any job has run: a larger "rank" is not one


def find_rank(trace: RawTrace) -> int:
    """The trace's rank: its distributedInfo.rank, else a rank in its file name (`-TP-3`,
    `rank3`, `rank-3`, `rank_3`), else 0; never the GPU index its kernels ran on."""
    info = trace.header.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int) and not isinstance(info.get("rank"), bool):
        rank, where = info["rank"], "distributedInfo.rank"
    else:
        m = re.search(r"-TP-(\d+)|rank[-_]?(\d+)", Path(trace.path).name)
        rank, where = (int(m.group(1) or m.group(2)), "the rank in its file name") if m else (0, "")
    if not 0 <= rank < MAX_RANK:
        raise TraceError(trace.path, f"{where} is {rank}: not a rank (0 to {MAX_RANK - 1:,})")
    return rank


def find_device_name(trace: RawTrace) -> str | None:
    """The first GPU's name in deviceProperties (Kineto since 2022), or computeProperties (before)."""
    props = trace.header.get("deviceProperties")
    if not isinstance(props, list):
        props = trace.header.get("computeProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        return name if isinstance(name, str) else None
    return None


def _names_matching(trace: RawTrace, pattern: re.Pattern) -> np.ndarray:
    """Whether each distinct name matches `pattern` (index it with name ids): the regex runs
    once per name, not once per event."""
    return np.array([bool(pattern.match(n)) for n in trace.names], bool)


def _user_frames(trace: RawTrace, fname_ids: np.ndarray) -> np.ndarray:
    """Whether each frame (by its name id) is user code: a `file(line): function` outside torch,
    triton and the standard library. The test runs once per distinct name."""
    names = np.asarray(trace.names, dtype=object)
    uniq = np.unique(fname_ids)
    is_user = np.zeros(len(trace.names), bool)
    is_user[uniq] = [bool(_SOURCE_LINE.search(n)) and not _NOT_USER_CODE.search(n) for n in names[uniq]]
    return is_user[fname_ids]


def _python_sources(trace: RawTrace, frames: np.ndarray, q_thread: np.ndarray, q_ts: np.ndarray) -> np.ndarray:
    """Source line (innermost user frame around each query), "" where none."""
    out = np.full(len(q_ts), "", dtype=object)
    if not len(frames) or not len(q_ts):
        return out
    names = np.asarray(trace.names, dtype=object)
    nest = Nesting.build(trace.thread_id[frames], trace.ts_us[frames], trace.ts_us[frames] + trace.dur_us[frames])
    fname_ids = trace.name_id[frames]
    user = _user_frames(trace, fname_ids)
    parent = nest.parents()
    depth = nest.depth_of()
    resolved = np.full(len(frames), -1, np.int64)
    for d in range(1, int(depth.max()) + 1):
        level = np.flatnonzero(depth == d)
        inherited = np.where(parent[level] >= 0, resolved[np.maximum(parent[level], 0)], -1)
        resolved[level] = np.where(user[level], level, inherited)
    frame = nest.enclosing(q_thread, q_ts)
    hit = frame >= 0
    src = np.full(len(q_ts), -1, np.int64)
    src[hit] = resolved[frame[hit]]
    ok = src >= 0
    out[ok] = names[fname_ids[src[ok]]]
    return out


def _op_costs(trace: RawTrace, op_events: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, kind, unit) of each op event (-1 for none: NaN, ""), from its name and recorded
    shapes by costs.model_shape_cost, evaluated once per distinct (name, shape)."""
    n = len(op_events)
    flops, nbytes = np.full(n, math.nan), np.full(n, math.nan)
    kinds, units = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
    has = op_events >= 0
    if not has.any():
        return flops, nbytes, kinds, units
    ev = op_events[has]
    sid = trace.shape_id[ev].astype(np.int64)
    key = trace.name_id[ev].astype(np.int64) * (len(trace.shapes) + 1) + (sid + 1)
    pairs, inverse = np.unique(key, return_inverse=True)
    costs = []
    for pair in pairs.tolist():
        name_id, shape = divmod(pair, len(trace.shapes) + 1)
        dims, types = trace.shapes[shape - 1] if shape > 0 else (b"", b"")
        costs.append(model_shape_cost(trace.names[name_id], dims, types) if dims else None)
    inverse = inverse.reshape(-1)
    flops[has] = np.array([c.flops if c else math.nan for c in costs])[inverse]
    nbytes[has] = np.array([c.bytes if c else math.nan for c in costs])[inverse]
    kinds[has] = np.array([c.kind if c else "" for c in costs], dtype=object)[inverse]
    units[has] = np.array([c.unit if c else "" for c in costs], dtype=object)[inverse]
    return flops, nbytes, kinds, units


def _shape_facts(trace: RawTrace, op_events: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, dtypes_differ, input dtypes) of each op event (-1 for none), from its recorded shapes."""
    facts = [summarise_shape(d, t) for d, t in trace.shapes]
    shape_bytes = np.array([f[0] for f in facts] + [math.nan])
    shape_mixed = np.array([f[1] for f in facts] + [False])
    shape_dtypes = np.array([f[2] for f in facts] + [""], dtype=object)
    safe = np.maximum(op_events, 0)
    sid = np.where(op_events >= 0, trace.shape_id[safe], -1)
    nbytes, mixed, dtypes = shape_bytes[sid], shape_mixed[sid], shape_dtypes[sid]  # sid -1: the trailing "unknown"
    names = trace.names
    partial = np.array([bool(_PARTIAL_ACCESS.search(names[i])) for i in range(len(names))] + [False])
    nbytes = np.where(partial[np.where(op_events >= 0, trace.name_id[safe], -1)], math.nan, nbytes)
    return nbytes, mixed, dtypes


# no GPU kernel or CPU op of a profiled step lasts a day: a longer duration is a broken record
MAX_EVENT_US = 86_400e6


def _sane_times(trace: RawTrace) -> np.ndarray:
    """Whether each event's start and duration can be real: finite, not negative, under a day."""
    return np.isfinite(trace.ts_us) & np.isfinite(trace.dur_us) & (trace.dur_us >= 0) & (trace.dur_us <= MAX_EVENT_US)


def link_kernels(trace: RawTrace) -> Kernels:
    """Find every kernel's launch, launching op, Python source and the op's bytes."""
    kind = trace.kind
    names = np.asarray(trace.names, dtype=object)
    frames = np.flatnonzero(kind == K["python_function"])
    ops = np.flatnonzero(kind == K["cpu_op"])
    # torch before 1.11 recorded ProfilerStep#N as an op: it is a step marker, not an op
    ops = ops[~_names_matching(trace, _STEP_NAME)[trace.name_id[ops]]]
    gpu = np.flatnonzero((kind == K["kernel"]) | (kind == K["gpu_memcpy"]) | (kind == K["gpu_memset"]))
    # events whose time cannot be real are set aside (and counted), not summed into figures
    sane = _sane_times(trace)
    set_aside = int((~sane[gpu]).sum()) if len(gpu) else int((~sane[ops]).sum())
    if len(gpu) and not sane[gpu].any():
        raise TraceError(trace.path, f"none of its {len(gpu)} GPU kernels has a duration that can be real "
                                     "(negative, non-finite or over a day)")
    gpu, ops = gpu[sane[gpu]], ops[sane[ops]]
    op_nest = Nesting.build(trace.thread_id[ops], trace.ts_us[ops], trace.ts_us[ops] + trace.dur_us[ops])

    runtime = np.flatnonzero((kind == K["cuda_runtime"]) | (kind == K["cuda_driver"]))
    kernel_launches = runtime[_names_matching(trace, _KERNEL_LAUNCH)[trace.name_id[runtime]]]
    captures = int(_names_matching(trace, _CAPTURE)[trace.name_id[runtime]].sum())
    if len(gpu) == 0:
        if len(ops) == 0:
            raise TraceError(trace.path, "has no GPU kernels and no CPU ops to measure")
        # CPU-only trace: every CPU op plays a kernel, timed by its self time (its duration less
        # its child ops'), so leaf ops count whole and a heavy parent such as aten::mm keeps the
        # time it spent itself; this is what key_averages() calls self CPU time.
        parent = op_nest.parents()
        has_parent = parent >= 0
        child_us = np.bincount(parent[has_parent], weights=trace.dur_us[ops][has_parent], minlength=len(ops))
        self_us = np.maximum(trace.dur_us[ops] - child_us, 0.0)
        # Like key_averages(), fold an op into a same-named parent whose only child it is
        # (dispatcher overloads such as aten::sum -> aten::sum): one call, self time kept.
        op_name = trace.name_id[ops]
        n_children = np.bincount(parent[has_parent], minlength=len(ops))
        safe_parent = np.maximum(parent, 0)
        dup = has_parent & (op_name[safe_parent] == op_name) & (n_children[safe_parent] == 1)
        target = np.where(dup, parent, np.arange(len(ops)))
        while True:
            nxt = target[target]
            if np.array_equal(nxt, target):
                break
            target = nxt
        self_us = np.bincount(target, weights=self_us, minlength=len(ops))
        keep = np.flatnonzero(~dup)
        order = keep[np.argsort(trace.ts_us[ops[keep]], kind="stable")]
        ev = ops[order]
        nbytes, mixed, dtypes = _shape_facts(trace, ev)
        source = _python_sources(trace, frames, trace.thread_id[ev], trace.ts_us[ev])
        return Kernels(ev, trace.ts_us[ev], self_us[order], trace.ts_us[ev], names[trace.name_id[ev]],
                       source, nbytes, mixed, True, set_aside, dtypes, trace.thread_id[ev],
                       from_graph=np.zeros(len(ev), bool), outside_window=np.zeros(len(ev), bool),
                       unrun_launches=len(kernel_launches), captures=captures)

    gpu = gpu[np.argsort(trace.ts_us[gpu], kind="stable")]
    launches = np.flatnonzero(((kind == K["cuda_runtime"]) | (kind == K["cuda_driver"])) & (trace.correlation >= 0))
    launches = launches[np.argsort(trace.correlation[launches], kind="stable")]
    lcorr = trace.correlation[launches]
    kcorr = trace.correlation[gpu]
    j = np.searchsorted(lcorr, kcorr)
    linked = (j < len(lcorr)) & (kcorr >= 0)
    linked[linked] = lcorr[j[linked]] == kcorr[linked]
    # (a trace recorded with activities=[CUDA] only has kernels and no launches at all)
    launch = np.full(len(gpu), -1, np.int64)
    launch[linked] = launches[j[linked]]
    # Correlation ids count up through the process's launches, so a kernel with an id but no
    # launch in the file, below every launch the file holds, was launched before the profiler's
    # window opened (it was still queued, or CUPTI flushed it late): it belongs to an iteration
    # the trace does not hold. Above every launch: launched after the window closed. (Only where
    # some kernel is linked: with none linked the ids say nothing about the window.)
    outside = np.zeros(len(gpu), bool)
    if linked.any():
        outside = ~linked & (kcorr > 0) & ((kcorr < lcorr[0]) | (kcorr > lcorr[-1]))
    launch, linked, link_note = check_links(trace, gpu, launch, linked, runtime)
    if link_note is not None:
        outside = np.zeros(len(gpu), bool)  # (the ids that said so are the damaged ones)
    has_kernel = np.zeros(len(kind), bool)
    has_kernel[launch[linked]] = True
    unrun = int((~has_kernel[kernel_launches]).sum())

    lthread = trace.thread_id[np.maximum(launch, 0)]
    lts = trace.ts_us[np.maximum(launch, 0)]
    op_pos = np.full(len(gpu), -1, np.int64)
    op_pos[linked] = op_nest.enclosing(lthread[linked], lts[linked])
    op_event = ops[op_pos] if len(ops) else np.full(len(gpu), -1, np.int64)
    op_event[op_pos < 0] = -1

    launch_name_id = trace.name_id[np.maximum(launch, 0)]
    launch_name = np.where(linked, names[launch_name_id], "")
    from_graph = linked & _names_matching(trace, _GRAPH_LAUNCH)[launch_name_id]
    launcher = np.where(op_event >= 0, names[trace.name_id[np.maximum(op_event, 0)]], launch_name)
    launcher = np.where(from_graph, launch_name, launcher)
    bare_launch = linked & ~from_graph & (op_event < 0)
    op_event = np.where(from_graph, -1, op_event)

    # (dtypes are the op's inputs', true of every kernel it launched, such as a GEMM's split-K reduction)
    nbytes, mixed, dtypes = _shape_facts(trace, op_event)
    # bytes are the op's: only meaningful for a kernel that is its op's only kernel
    per_op = np.bincount(np.maximum(op_event, 0), minlength=len(kind))
    sole = (op_event >= 0) & (per_op[np.maximum(op_event, 0)] == 1)
    nbytes = np.where(sole, nbytes, math.nan)

    source = np.full(len(gpu), "", dtype=object)
    source[linked] = _python_sources(trace, frames, lthread[linked], lts[linked])
    query = np.where(linked, lts, trace.ts_us[gpu])
    return Kernels(gpu, trace.ts_us[gpu], trace.dur_us[gpu], query, launcher.astype(object), source,
                   nbytes, mixed, False, set_aside, dtypes, np.where(linked, lthread, trace.thread_id[gpu]),
                   op_event=op_event, from_graph=from_graph, outside_window=outside, unrun_launches=unrun,
                   captures=captures, link_note=link_note, bare_launch=bare_launch)


# A correlation id links a launch to the kernel it ran. In every real trace of tests/data (64
# files: eager, graph, multi-rank, ROCm, MTIA, 2020-2026 Kineto) no linked kernel starts before its
# launch, and none has an External id other than its launch's. Traces whose ids were damaged (all
# equal, or rotated by one) linked kernels to other launches: kernels moved into other steps
# (step ms 2.110 / 2.055 against 2.001) with no word. Past this share of impossible links (and
# MIN_IMPOSSIBLE_LINKS of them), the ids are not used: kernels are linked by External id instead.
MAX_IMPOSSIBLE_LINK_SHARE = 0.01
# A run's notes say so when at least this share of kernel time was launched outside every recorded CPU op
BARE_LAUNCH_NOTE_SHARE = 0.10
MIN_IMPOSSIBLE_LINKS = 3
_LAUNCH_LIKE = re.compile(r"\w*(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|Memcpy|Memset)")


def check_links(trace: RawTrace, gpu: np.ndarray, launch: np.ndarray, linked: np.ndarray,
                runtime: np.ndarray) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(launch, linked, note): the correlation links as they are when they can be right; else the
    links by External id (`link_by_external_id`) and a note saying why. A link is impossible when
    the kernel starts before its launch, or the kernel's External id is not its launch's."""
    if not linked.any():
        return launch, linked, None
    k, lk = gpu[linked], launch[linked]
    before = trace.ts_us[k] < trace.ts_us[lk]
    kext, lext = trace.external_id[k], trace.external_id[lk]
    disagree = (kext >= 0) & (lext >= 0) & (kext != lext)
    impossible = int((before | disagree).sum())
    if impossible < max(MIN_IMPOSSIBLE_LINKS, MAX_IMPOSSIBLE_LINK_SHARE * len(k)):
        return launch, linked, None
    why = (f"the trace's correlation ids are damaged: {impossible:,} of its {len(k):,} kernels would be linked to a "
           f"launch they cannot belong to ({int(before.sum()):,} start before it, {int(disagree.sum()):,} have another "
           "External id)")
    candidates = runtime[(trace.external_id[runtime] >= 0) & _names_matching(trace, _LAUNCH_LIKE)[trace.name_id[runtime]]]
    relinked = link_by_external_id(trace.external_id[gpu], trace.ts_us[gpu], trace.external_id[candidates],
                                   trace.ts_us[candidates])
    launch = np.where(relinked >= 0, candidates[np.maximum(relinked, 0)], -1)
    linked = relinked >= 0
    if linked.any():
        return launch, linked, (f"{why}: kernels were linked to their launches by External id instead "
                                f"({int(linked.sum()):,} of {len(gpu):,} linked)")
    return launch, linked, f"{why}: no kernel was linked, they are placed in steps by their start time"


def link_by_external_id(kernel_ext: np.ndarray, kernel_ts: np.ndarray, launch_ext: np.ndarray,
                        launch_ts: np.ndarray) -> np.ndarray:
    """Per kernel, the index of the last launch with its External id that starts no later than it
    (-1: none). Vectorised: (External id, time) pairs become one integer key (each part's rank
    among the values present), so one sort and one searchsorted find every kernel's launch."""
    exts = np.unique(np.concatenate([kernel_ext, launch_ext]))
    times = np.unique(np.concatenate([kernel_ts, launch_ts]))
    width = len(times) + 1
    lkey = np.searchsorted(exts, launch_ext) * width + np.searchsorted(times, launch_ts)
    kkey = np.searchsorted(exts, kernel_ext) * width + np.searchsorted(times, kernel_ts)
    if not len(launch_ext):
        return np.full(len(kernel_ext), -1, np.int64)
    order = np.argsort(lkey, kind="stable")
    pos = np.searchsorted(lkey[order], kkey, side="right") - 1
    found = (pos >= 0) & (kernel_ext >= 0)
    found[found] = launch_ext[order[pos[found]]] == kernel_ext[found]
    return np.where(found, order[np.maximum(pos, 0)], -1)


@dataclass(frozen=True)
class GraphSites:
    """Per kernel of a graph run, what its twin in a mapping trace says launched it: op, Python
    line and layer ("", "", -1 where it has none, or is not a graph kernel), and the summary
    stored with the run (method, kernels matched and unmatched, time share attributed). `flops`,
    `nbytes`, `kind` and `unit`: the twin's part of its op's modelled cost (costs.py, spread over
    the op's kernels by time in the mapping trace, as roofline.spread_op_costs does for a kernel's
    own op): a replayed kernel runs the same op on the same shapes, so it is priced by them; NaN /
    "" where the twin's op has no recorded shapes or no model, or the kernel has no twin."""

    op: np.ndarray
    source: np.ndarray
    layer: np.ndarray
    summary: dict
    flops: np.ndarray | None = None
    nbytes: np.ndarray | None = None
    kind: np.ndarray | None = None
    unit: np.ndarray | None = None


def find_kernel_layers(trace: RawTrace, kernels: Kernels, steps: Steps) -> tuple[np.ndarray, np.ndarray]:
    """(layer of each kernel, its layer frame's name, "" where none): graph_attribution.find_layers
    over the trace's Python frames."""
    frames = np.flatnonzero(trace.kind == K["python_function"])
    frames = frames[_sane_times(trace)[frames]]
    none = np.full(len(kernels.event), -1, np.int64), np.full(len(kernels.event), "", dtype=object)
    if not len(frames) or kernels.query_thread is None:
        return none
    nest = Nesting.build(trace.thread_id[frames], trace.ts_us[frames], trace.ts_us[frames] + trace.dur_us[frames])
    fname_ids = trace.name_id[frames].astype(np.int64)
    layer, name_code = find_layers(fname_ids, nest.parents(), nest.depth_of(), _user_frames(trace, fname_ids),
                                   trace.ts_us[frames], len(steps.wall_us),
                                   nest.enclosing(kernels.query_thread, kernels.query_ts_us), steps.kernel_step)
    names = np.asarray(trace.names + [""], dtype=object)
    return layer, names[name_code]  # code -1: the trailing ""


def attribute_graph_kernels(trace: RawTrace, kernels: Kernels, steps: Steps,
                            mapping: RawTrace) -> GraphSites:
    """Each graph-replayed kernel's op, line and layer, from its twin in `mapping`, a graph-off
    trace of the same workload (ingest/traces/graph_attribution.py). Raises TraceError naming the
    file when the run has no graph kernels, the mapping is not a graph-off GPU trace, or no step
    of the two aligns (not the same workload)."""
    from_graph = kernels.from_graph
    if kernels.from_cpu_ops or not from_graph.any():
        raise TraceError(trace.path, "has no kernels replayed from a CUDA graph (cudaGraphLaunch): "
                                     "a mapping trace has nothing to attribute")
    m_kernels = link_kernels(mapping)
    if m_kernels.from_cpu_ops:
        raise TraceError(mapping.path, "has no GPU kernels: a mapping trace is a graph-off GPU trace of the "
                                       "same workload")
    m_graph = int(m_kernels.from_graph.sum())
    if m_graph:
        raise TraceError(mapping.path, f"is not graph-off: {m_graph:,} of its {len(m_kernels.event):,} kernels "
                                       "were replayed from a CUDA graph; a mapping trace runs the same workload "
                                       "without graphs")
    m_steps = assign_steps(mapping, m_kernels, None)
    g_names = np.asarray(trace.names, dtype=object)[trace.name_id[kernels.event]]
    m_names = np.asarray(mapping.names, dtype=object)[mapping.name_id[m_kernels.event]]
    codes, _ = _encode(np.concatenate([g_names, m_names]))
    graph_seq = KernelSequence(codes[:len(g_names)], trace.thread_id[kernels.event], steps.kernel_step, kernels.ts_us)
    mapping_seq = KernelSequence(codes[len(g_names):], mapping.thread_id[m_kernels.event], m_steps.kernel_step,
                                 m_kernels.ts_us)
    aligned = align_steps(graph_seq, mapping_seq)
    if aligned.steps_aligned == 0:
        first = aligned.refused[0] if aligned.refused else "it has no step to align with"
        raise TraceError(mapping.path, f"is not of the graph run's workload: {first} (at least "
                                       f"{100 * MIN_STEP_MATCH:.0f} % of the larger side's kernels must)")
    twin = np.where(from_graph, aligned.twin, -1)
    hit = twin >= 0
    m_layer, m_layer_name = find_kernel_layers(mapping, m_kernels, m_steps)
    op = np.full(len(twin), "", dtype=object)
    source, layer = op.copy(), np.full(len(twin), -1, np.int64)
    op[hit], source[hit], layer[hit] = m_kernels.launcher[twin[hit]], m_kernels.source[twin[hit]], m_layer[twin[hit]]
    frames = m_layer_name[twin[hit]]
    frames = frames[frames != ""]
    graph_us = float(kernels.dur_us[from_graph].sum())
    summary = {
        "method": METHOD_MAPPING, "mapping": mapping.path,
        "kernels": int(from_graph.sum()), "matched": int(hit.sum()), "unmatched": int(from_graph.sum() - hit.sum()),
        "time_share": float(kernels.dur_us[hit].sum()) / graph_us if graph_us > 0 else None,
        "steps_aligned": aligned.steps_aligned, "steps_refused": aligned.steps_refused,
        "layer_frame": Counter(frames.tolist()).most_common(1)[0][0] if len(frames) else None,
    }
    m_flops, m_bytes, m_kind, m_unit = _op_costs(mapping, m_kernels.op_event)
    m_flops, m_bytes = spread_op_costs(m_kernels.op_event, m_kernels.dur_us, m_flops, m_bytes,
                                       mapping.kind[m_kernels.event] == K["kernel"])
    flops, nbytes = np.full(len(twin), math.nan), np.full(len(twin), math.nan)
    kind, unit = np.full(len(twin), "", dtype=object), np.full(len(twin), "", dtype=object)
    flops[hit], nbytes[hit], kind[hit], unit[hit] = (m_flops[twin[hit]], m_bytes[twin[hit]], m_kind[twin[hit]],
                                                     m_unit[twin[hit]])
    summary["priced"] = int((hit & ~np.isnan(flops) & ~np.isnan(nbytes)).sum())
    return GraphSites(op, source, layer, summary, flops, nbytes, kind, unit)


def _spans(trace: RawTrace, pattern: re.Pattern, kinds: tuple[str, ...]) -> np.ndarray:
    """Events of the given kinds whose name matches, in time order."""
    cand = np.flatnonzero(np.isin(trace.kind, [K[k] for k in kinds]))
    hit = cand[_names_matching(trace, pattern)[trace.name_id[cand]]]
    return hit[np.argsort(trace.ts_us[hit], kind="stable")]


def _place(kernels: Kernels, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Step of each kernel whose launch lies in one of the (sorted, disjoint) host spans, else -1."""
    idx = np.searchsorted(start, kernels.query_ts_us, "right") - 1
    inside = (idx >= 0) & (kernels.query_ts_us <= end[np.maximum(idx, 0)])
    return np.where(inside, idx, -1)


def _find_steps(trace: RawTrace, kernels: Kernels, given_steps: int | None) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
    """(method, step of each kernel, host span of each step in us (NaN: none), notes)."""
    if given_steps is not None:
        if given_steps <= 0 or given_steps > len(kernels.ts_us):
            raise TraceError(trace.path, f"--steps {given_steps} does not fit its {len(kernels.ts_us)} kernels")
        step = np.repeat(np.arange(given_steps), [len(p) for p in np.array_split(kernels.ts_us, given_steps)])
        return "given", step, np.full(given_steps, math.nan), [
            f"steps given: the kernels split into {given_steps} equal runs in time order"]

    # ProfilerStep#N: a user_annotation since torch 1.11, an Operator (cpu_op) before
    marks = _spans(trace, _STEP_NAME, ("user_annotation", "cpu_op"))
    if len(marks):
        start, dur = trace.ts_us[marks], trace.dur_us[marks]
        return "profiler-step", _place(kernels, start, start + dur), dur.copy(), []

    spans = _spans(trace, _SPAN_NAME, ("user_annotation",))
    if len(spans):
        start, dur, notes = _select_step_spans(trace, spans)
        return "span", _place(kernels, start, start + dur), dur, notes

    graph = _spans(trace, _GRAPH_LAUNCH, ("cuda_runtime", "cuda_driver"))
    if len(graph) and not kernels.from_cpu_ops:
        start = trace.ts_us[graph]
        idx = np.searchsorted(start, kernels.query_ts_us, "right") - 1
        return "graph-launch", idx, np.full(len(graph), math.nan), [
            "no step annotations: each CUDA/HIP graph launch is taken as one step"]

    return "whole-trace", np.zeros(len(kernels.ts_us), np.int64), np.full(1, math.nan), [
        "no step markers (ProfilerStep#N, SGLang step spans or CUDA/HIP graph launches): the whole profiled "
        "window is read as one step; pass --steps N if it holds N iterations"]


def _select_step_spans(trace: RawTrace, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(start, duration, notes) of the decode steps among SGLang's `step[...]` spans (time-ordered).

    A plain decode step is one `step[DECODE ...]` forward. A speculative decoding iteration
    (sglang 0.5.23 speculative/eagle_worker_v2.py:1444-1510) has no DECODE forward: inside a
    `draft` stage span the draft model proposes (one graph replay without a step span, or
    num_steps - 1 `step[DRAFT ...]` forwards), the target verifies them in one `step[VERIFY ...]`
    forward, and inside a `draft_extend` stage span the draft extends over the accepted tokens.
    So in a trace without DECODE spans each VERIFY span is one iteration, widened to the `draft`
    stage right before it and the `draft_extend` stage right after it (in the time order of the
    stage spans and the non-DRAFT step spans); a DRAFT span is never a step of its own. A trace
    with neither (a prefill-only capture) takes every span but DRAFT ones (which, inside a
    prefill's `draft_extend` stage, widen it) as a step; one with DRAFT spans only, all of them."""
    names = trace.name_id[spans]
    decode = _names_matching(trace, _DECODE_SPAN)[names]
    verify = _names_matching(trace, _VERIFY_SPAN)[names]
    draft = _names_matching(trace, _DRAFT_SPAN)[names]
    notes = []
    if decode.any():
        chosen = decode
    elif verify.any():
        chosen = verify
    elif (~draft).any():
        chosen = ~draft
    else:
        chosen = np.ones(len(spans), bool)
    anchors = spans[chosen]
    start, dur = trace.ts_us[anchors], trace.dur_us[anchors].copy()
    stages = _spans(trace, _SPEC_STAGE, ("user_annotation",))
    widened = 0
    if len(stages):
        # the sequence of stage spans (0 draft, 1 draft_extend) and step spans (2) but DRAFT ones
        marks = np.concatenate([stages, spans[~draft]])
        kind = np.concatenate([(np.asarray(trace.names, dtype=object)[trace.name_id[stages]] == "draft_extend")
                               .astype(np.int64), np.full(int((~draft).sum()), 2)])
        order = np.lexsort((marks, trace.ts_us[marks]))
        marks, kind = marks[order], kind[order]
        by_event = np.argsort(marks, kind="stable")
        pos = by_event[np.searchsorted(marks[by_event], anchors)]
        before, after = np.maximum(pos - 1, 0), np.minimum(pos + 1, len(marks) - 1)
        has_draft = (pos > 0) & (kind[before] == 0)
        has_extend = (pos < len(marks) - 1) & (kind[after] == 1)
        end = np.where(has_extend, trace.ts_us[marks[after]] + trace.dur_us[marks[after]], start + dur)
        start = np.where(has_draft, trace.ts_us[marks[before]], start)
        widen = has_draft | has_extend
        dur = np.where(widen, end - start, dur)  # (an unwidened span keeps its own duration, to the ns)
        widened = int(widen.sum())
    others = int((~chosen).sum())
    if decode.any() and others:
        notes.append(f"SGLang step spans: {int(decode.sum())} decode steps; {others} other forward spans (prefill, "
                     "draft, ...) are not decode steps and their kernels count as between steps")
    elif verify.any():
        notes.append(f"SGLang speculative decoding: {len(anchors)} decode iterations, each a `step[VERIFY ...]` "
                     f"forward of the target ({widened} with their draft and draft-extend stages); an iteration "
                     "emits 1 to speculative_num_draft_tokens tokens per request, so a step is not one token"
                     + (f"; {others} other forward spans (prefill, draft, ...) count as between steps"
                        if others - int(draft.sum()) > 0 else ""))
    return start, dur, notes


def _extent_per_step(step: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(earliest start, latest end) of each of n steps (inf, -inf for a step without any)."""
    first, last = np.full(n, np.inf), np.full(n, -np.inf)
    if len(step):
        order = np.argsort(step, kind="stable")
        s = step[order]
        heads = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        first[s[heads]] = np.minimum.reduceat(start[order], heads)
        last[s[heads]] = np.maximum.reduceat(end[order], heads)
    return first, last


def assign_steps(trace: RawTrace, kernels: Kernels, given_steps: int | None) -> Steps:
    """Place each kernel in a step and time the steps from GPU activity.

    Steps come from `given_steps` equal runs of kernels when given, else ProfilerStep#N
    annotations, else SGLang's `step[...]` forward spans (only `step[DECODE ...]` when the trace
    has any: prefill and draft forwards are not decode steps; speculative decoding's iterations
    when it has `step[VERIFY ...]` ones: _select_step_spans), else one step per CUDA-graph
    launch, else the whole profiled window as one step. A kernel belongs to the step whose host
    span holds its launch; kernels launched outside every step are kept (in the kernel table)
    and reported as between steps, and so are kernels launched outside the recorded window
    (Kernels.outside_window), whatever the method but given steps: their GPU time may fall inside
    a step's, but their iteration is not in the trace.

    A step's time is its GPU time: from its first kernel's start to its last kernel's end (what
    Kineto's gpu_user_annotation copy of a span covers), not the host span, which under CUDA
    graphs covers only the launch of the replay. A step without kernels keeps its host span;
    a CPU-only trace, whose CPU ops are the activity, is timed by its host spans."""
    method, step, host_us, notes = _find_steps(trace, kernels, given_steps)
    outside = kernels.outside_window
    # (were every kernel outside, the window would hold nothing: keep the placing by time then)
    set_apart = outside is not None and method != "given" and outside.any() and not outside.all()
    if set_apart:
        step = np.where(outside, -1, step)
    if method in ("profiler-step", "span") and len(step) and not (step >= 0).any():
        # markers that hold none of the kernels (zero-length, or far from them) time nothing:
        # read the trace as one step rather than report empty steps
        notes = [f"its {len(host_us)} step markers ({method}) hold none of its kernels (zero-length or far from "
                 "them): the whole profiled window is read as one step instead"]
        method, host_us = "whole-trace", np.full(1, math.nan)
        step = np.where(outside, -1, 0) if set_apart else np.zeros(len(step), np.int64)
    n = len(host_us)
    wall = host_us.copy()
    if not kernels.from_cpu_ops or np.isnan(wall).any():
        inside = step >= 0
        # a CPU op's own span, not its self time, bounds the activity of a CPU-only trace
        end = kernels.ts_us + (trace.dur_us[kernels.event] if kernels.from_cpu_ops else kernels.dur_us)
        first, last = _extent_per_step(step[inside], kernels.ts_us[inside], end[inside], n)
        has = last >= first
        use = has if not kernels.from_cpu_ops else has & np.isnan(wall)
        wall[use] = last[use] - first[use]
    wall = np.where(np.isnan(wall), 0.0, wall)
    return Steps(method, step, wall, host_us, notes)


def _busy_us(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals."""
    if not len(start):
        return 0.0
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    reach = np.maximum.accumulate(e)
    prev = np.r_[-np.inf, reach[:-1]]
    return float(np.sum(np.clip(e - np.maximum(s, prev), 0, None) * (e > prev)))


def _encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values in order of first appearance) of an object array."""
    table: dict = {}
    for v in dict.fromkeys(values):
        table[v] = len(table)
    return np.fromiter(map(table.__getitem__, values), np.int64, len(values)), np.array(list(table), dtype=object)


def categorise_kernels(trace: RawTrace, kernels: Kernels, rules: list[Rule], name_id: np.ndarray,
                       launcher_code: np.ndarray, launchers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(category code of each kernel, category names): the rules run once per distinct
    (name, launcher, activity, dtypes differ), not once per kernel."""
    kind = trace.kind[kernels.event].astype(np.int64)
    # one integer per combination (a 1-D unique is ten times faster than unique rows)
    n_kinds, n_launchers = len(KINDS), max(len(launchers), 1)
    key = ((name_id * n_launchers + launcher_code) * n_kinds + kind) * 2 + kernels.dtypes_differ
    combos, inverse = np.unique(key, return_inverse=True)
    rest, mixed = np.divmod(combos, 2)
    rest, kinds = np.divmod(rest, n_kinds)
    name_ids, launcher_codes = np.divmod(rest, n_launchers)
    with rules_time_limit():
        names_of = [categorise(rules, trace.names[n], launchers[l], ACTIVITY[k], bool(m))
                    for n, l, k, m in zip(name_ids.tolist(), launcher_codes.tolist(), kinds.tolist(), mixed.tolist())]
    cat_codes, categories = _encode(np.array(names_of, dtype=object))
    return cat_codes[inverse.reshape(-1)], categories


def _group_dtypes(group: np.ndarray, kernels: Kernels, n_groups: int) -> np.ndarray:
    """Per group (a kernel row), its launching ops' input dtypes: one op's ("float32"), the
    distinct ones of several joined by " | " ("bfloat16 | float32"), or "" when none is known."""
    out = np.full(n_groups, "", dtype=object)
    if kernels.input_dtypes is None or not len(group):
        return out
    codes, names = _encode(kernels.input_dtypes)
    pairs = np.unique(group.astype(np.int64) * len(names) + codes)
    owner, code = np.divmod(pairs, len(names))
    known = names[code] != ""
    found: dict[int, list[str]] = {}
    for row, text in zip(owner[known].tolist(), names[code[known]].tolist()):
        found.setdefault(row, []).append(text)
    for row, texts in found.items():
        out[row] = " | ".join(sorted(texts))
    return out


DENSE_SPREAD_CELLS = 4_000_000  # kernel rows x steps up to which _step_spread_ms uses a dense table (32 MB)


def _step_spread_ms(group: np.ndarray, kernel_step: np.ndarray, dur: np.ndarray, n_groups: int,
                    n_steps: int, dense_cells: int = DENSE_SPREAD_CELLS) -> np.ndarray:
    """Per group (a kernel row), the standard deviation over the steps of its ms in each step,
    steps where the group did not run counting 0; NaN with fewer than two steps. Kernels between
    steps (kernel_step < 0) are left out, as the ms per step leaves them out.

    The (group, step) cells are summed with one bincount into a dense groups x steps table when
    it has at most `dense_cells` cells; beyond (a trace with very many kernel names and
    steps), over the cells that occur only (np.unique of the cell keys), with the absent cells'
    zeros added to each group's sum of squares, so memory follows the events, not the product."""
    if n_steps < 2:
        return np.full(n_groups, np.nan)
    inside = kernel_step >= 0
    keys = group[inside].astype(np.int64) * n_steps + kernel_step[inside]
    if n_groups * n_steps <= dense_cells:
        cells = np.bincount(keys, weights=dur[inside], minlength=n_groups * n_steps).reshape(n_groups, n_steps)
        return cells.std(axis=1, ddof=1) / 1e3
    present, where = np.unique(keys, return_inverse=True)
    sums = np.bincount(where, weights=dur[inside])
    owner = present // n_steps
    mean = np.bincount(owner, weights=sums, minlength=n_groups) / n_steps
    seen = np.bincount(owner, minlength=n_groups)
    squares = np.bincount(owner, weights=(sums - mean[owner]) ** 2, minlength=n_groups)
    squares += (n_steps - seen) * mean ** 2
    return np.sqrt(squares / (n_steps - 1)) / 1e3


def _measure_timeline(trace: RawTrace, kernels: Kernels, steps: Steps, step_table: Table,
                      is_comm: np.ndarray) -> dict:
    """timeline.measure_timeline's figures, with the host syncs and decode spans read from the trace."""
    calls = np.flatnonzero(np.isin(trace.kind, [K["cuda_runtime"], K["cuda_driver"]]))
    calls = calls[_names_matching(trace, HOST_SYNC)[trace.name_id[calls]] & _sane_times(trace)[calls]]
    names = np.asarray(trace.names, dtype=object)
    spans = _spans(trace, _DECODE_SPAN, ("user_annotation",)) if steps.method == "span" else np.empty(0, np.int64)
    return measure_timeline(
        kernels.ts_us, kernels.dur_us, trace.thread_id[kernels.event], kernels.query_ts_us, steps.kernel_step,
        step_table["wall_us"], step_table["gpu_busy_us"], step_table["kernel_us"],
        is_comm, trace.ts_us[calls], trace.dur_us[calls], names[trace.name_id[calls]],
        sorted(set(names[trace.name_id[spans]].tolist())), kernels.from_graph)


def _group_layers(group: np.ndarray, layer: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group (a kernel row), its kernels' distinct layers as text ("0-77"), "" when none."""
    out = np.full(n_groups, "", dtype=object)
    known = layer >= 0
    if not known.any():
        return out
    order = np.argsort(group[known], kind="stable")
    g, lay = group[known][order], layer[known][order]
    bounds = np.flatnonzero(np.diff(g)) + 1
    for part_g, part_l in zip(np.split(g, bounds), np.split(lay, bounds)):
        out[part_g[0]] = summarise_layers(part_l)
    return out


def _roofline_columns(trace: RawTrace, kernels: Kernels, group: np.ndarray, n_groups: int, device,
                      sites: GraphSites | None = None) -> Table:
    """roofline.COLUMNS of each kernel row: its launching ops' modelled costs (costs.py) spread over
    their kernels by time, against the device's datasheet peaks; a kernel replayed from a CUDA
    graph (no launching op) takes its mapping twin's cost from `sites`. All null for a CPU-only
    trace: its ops' self times are not the device time a roofline needs."""
    n = len(kernels.event)
    if kernels.from_cpu_ops or kernels.op_event is None:
        op_flops, op_bytes = np.full(n, math.nan), np.full(n, math.nan)
        kinds, units = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
        flops, nbytes = op_flops, op_bytes
    else:
        op_flops, op_bytes, kinds, units = _op_costs(trace, kernels.op_event)
        flops, nbytes = spread_op_costs(kernels.op_event, kernels.dur_us, op_flops, op_bytes,
                                        trace.kind[kernels.event] == K["kernel"])
        if sites is not None and sites.flops is not None:
            twin = (kernels.op_event < 0) & (sites.kind != "")
            flops, nbytes = np.where(twin, sites.flops, flops), np.where(twin, sites.nbytes, nbytes)
            kinds, units = np.where(twin, sites.kind, kinds), np.where(twin, sites.unit, units)
        names = np.asarray(trace.names, dtype=object)[trace.name_id[kernels.event]]
        units = resolve_units(units, names)
    return summarise_roofline(group, n_groups, kernels.dur_us, flops, nbytes, units, kinds,
                              device.datasheet if device else None)


def _step_categories(step: np.ndarray, cat_code: np.ndarray, dur: np.ndarray, categories: np.ndarray) -> Table:
    """Per step and category (kernels inside steps), their time: rows by step, then category name."""
    key = step.astype(np.int64) * len(categories) + cat_code
    cells, where = np.unique(key, return_inverse=True)
    step_of, cat_of = np.divmod(cells, max(len(categories), 1))
    names = categories[cat_of]
    _, name_rank = np.unique(names, return_inverse=True)
    order = np.lexsort((name_rank.reshape(-1), step_of))
    return Table({"step": step_of[order], "category": names[order],
                  "dur_us": np.bincount(where.reshape(-1), weights=dur, minlength=len(cells))[order]})


def aggregate(trace: RawTrace, kernels: Kernels, steps: Steps, rules: list[Rule],
              sites: GraphSites | None = None) -> RankFigures:
    """The run's figures. With `sites` (attribute_graph_kernels), kernel rows are also told apart
    by the op and line attributed to their graph kernels, kept in graph_op / graph_source /
    graph_layers beside (never in) the launcher and source the trace itself gives."""
    name_id = trace.name_id[kernels.event].astype(np.int64)
    launcher_code, launchers = _encode(kernels.launcher)
    source_code, sources = _encode(kernels.source)
    no_sites = np.full(len(name_id), "", dtype=object)
    graph_op_code, graph_ops = _encode(sites.op if sites is not None else no_sites)
    graph_source_code, graph_sources = _encode(sites.source if sites is not None else no_sites)
    cat_code, categories = categorise_kernels(trace, kernels, rules, name_id, launcher_code, launchers)
    category = categories[cat_code]

    n_steps = len(steps.wall_us)
    dur = kernels.dur_us
    in_step = steps.kernel_step >= 0
    total_us = float(dur.sum())
    # group on integer codes; the strings are put back on the few groups afterwards
    codes = (name_id, cat_code, launcher_code, source_code, graph_op_code, graph_source_code)
    group, n_groups = number_groups(*codes)
    groups = Groups(group, n_groups)
    first = np.unique(group, return_index=True)[1]  # each group's first row: its codes
    calls = groups.counts
    total = groups.sum(dur)
    bytes_per_call = groups.median(kernels.bytes_per_call)
    # bytes only when every call of the group had them (else the figure would mislead)
    bytes_per_call[groups.count_known(kernels.bytes_per_call) < calls] = math.nan
    stats = {"name": np.asarray(trace.names, dtype=object)[name_id[first]], "category": categories[cat_code[first]],
             "launcher": launchers[launcher_code[first]], "source": sources[source_code[first]],
             "graph_op": graph_ops[graph_op_code[first]], "graph_source": graph_sources[graph_source_code[first]],
             "calls": calls, "total_us": total, "mean_us": total / calls, "median_us": groups.median(dur),
             "min_us": groups.min(dur), "max_us": groups.max(dur), "p90_us": groups.quantile(dur, 0.9),
             "bytes_per_call": bytes_per_call,
             "ms_per_step_sd": _step_spread_ms(group, steps.kernel_step, dur, n_groups, n_steps),
             "input_dtypes": _group_dtypes(group, kernels, n_groups)}
    device = find_device(find_device_name(trace)) if not kernels.from_cpu_ops else None
    roofline = _roofline_columns(trace, kernels, group, n_groups, device, sites)
    host_copy = (np.asarray([bool(_HOST_COPY.search(str(n))) for n in stats["name"]], bool)
                 & np.isin(stats["category"], COPY_CATEGORIES))
    stats.update({column: roofline[column] for column in roofline.columns})
    stats["bandwidth_fraction"] = np.where(host_copy, math.nan, stats["bandwidth_fraction"])
    stats["graph_layers"] = _group_layers(group, sites.layer if sites is not None else np.full(len(group), -1),
                                          n_groups)
    # calls and time count every kernel (as key_averages does); the per-step figures only the
    # kernels inside steps (those between steps are reported apart)
    with np.errstate(divide="ignore", invalid="ignore"):
        stats["calls_per_step"] = groups.sum(in_step) / n_steps
        stats["ms_per_step"] = groups.sum(np.where(in_step, dur, 0.0)) / n_steps / 1e3
        stats["share"] = total / total_us if total_us > 0 else np.full(n_groups, math.nan)
        # the group's bytes over its time: calls of different sizes (one copy kernel moving 200 KB
        # and 20 MB) make the median bytes over the mean time no rate at all
        moved = groups.sum(np.where(np.isnan(kernels.bytes_per_call), 0.0, kernels.bytes_per_call))
        stats["gbps"] = np.where(np.isnan(bytes_per_call), math.nan, moved / total / 1e3)
    peak = device.datasheet.get("hbm_gbps") if device else None
    if peak:
        # an estimate above the device's peak cannot be the real traffic (the op did not read
        # all of its inputs): say "unknown" rather than print an impossible bandwidth
        impossible = stats["gbps"] > 1.05 * peak
        stats["bytes_per_call"][impossible] = math.nan
        stats["gbps"][impossible] = math.nan
    if kernels.from_cpu_ops and kernels.unrun_launches:
        # a GPU workload profiled without its kernels: an op's host time is its dispatch, not its traffic
        stats["gbps"] = np.full(n_groups, math.nan)
    stats["peak_fraction"] = stats["gbps"] / peak if peak else np.full(n_groups, math.nan)
    stats["peak_fraction"] = np.where(host_copy, math.nan, stats["peak_fraction"])  # not an HBM-bound copy
    # largest time first, then by name; groups of equal time and name in the order they appeared
    _, name_rank = np.unique(stats["name"], return_inverse=True)
    order = np.lexsort((name_rank.reshape(-1), -stats["total_us"]))
    stats = Table(stats)[order]

    busy = np.zeros(n_steps)
    kern_us = np.bincount(steps.kernel_step[in_step], weights=dur[in_step], minlength=n_steps)
    order = np.argsort(steps.kernel_step, kind="stable")
    bounds = np.searchsorted(steps.kernel_step[order], np.arange(n_steps + 1))
    for s in range(n_steps):
        sel = order[bounds[s]:bounds[s + 1]]
        busy[s] = math.nan if kernels.from_cpu_ops else _busy_us(kernels.ts_us[sel], kernels.ts_us[sel] + dur[sel])
    step_table = Table({"step": np.arange(n_steps), "wall_us": steps.wall_us, "gpu_busy_us": busy,
                        "kernel_us": kern_us})
    step_cats = _step_categories(steps.kernel_step[in_step], cat_code[in_step], dur[in_step], categories)

    copy_us = float(dur[np.isin(category, COPY_CATEGORIES)].sum())
    wall_total = float(steps.wall_us.sum())
    between = ~in_step
    notes = list(steps.notes)
    outside = kernels.outside_window if kernels.outside_window is not None else np.zeros(len(dur), bool)
    outside = outside & between
    if outside.any():
        notes.append(f"{int(outside.sum())} kernels ({float(dur[outside].sum()) / 1e3:.3f} ms) were launched outside "
                     "the recorded window (no launch in the file; their correlation ids lie below or above every "
                     "launch it holds): counted in the kernel table's calls and time, in no step, though they ran "
                     "while the window was open")
    if (between & ~outside).any():
        unit = "CPU ops" if kernels.from_cpu_ops else "kernels"
        gap = between & ~outside
        notes.append(f"{int(gap.sum())} {unit} ({float(dur[gap].sum()) / 1e3:.3f} ms) ran between steps: "
                     "counted in the kernel table's calls and time, not in any step")
    if kernels.from_cpu_ops and kernels.unrun_launches:
        notes.append(f"its {kernels.unrun_launches} kernel launches (cudaLaunchKernel, hipLaunchKernel, ...) have no "
                     "GPU kernel in the trace (profiled without the CUDA activity, or the GPU records were lost): the "
                     "figures are the CPU ops' self time, which for a GPU op is its dispatch, not its kernels' time; "
                     "no GB/s is given")
    if kernels.captures:
        unrun = (f"; {kernels.unrun_launches} kernel launches here have no kernel of theirs (captured, not run)"
                 if kernels.unrun_launches and not kernels.from_cpu_ops else "")
        captures = "1 stream capture" if kernels.captures == 1 else f"{kernels.captures} stream captures"
        notes.append(f"the trace records {captures} into a CUDA/HIP graph "
                     f"(cudaStreamBeginCapture, ...){unrun}: a capture records kernels without running them, so "
                     "its figures are not those of the graph's replays; profile the replays (SGLang: not "
                     "--enable-profile-cuda-graph)")
    if kernels.link_note:
        notes.append(kernels.link_note)
    bare = kernels.bare_launch if kernels.bare_launch is not None else np.zeros(len(dur), bool)
    if total_us > 0 and float(dur[bare].sum()) >= BARE_LAUNCH_NOTE_SHARE * total_us:
        calls = dict(zip(*np.unique(kernels.launcher[bare].astype(str), return_counts=True)))
        named = ", ".join(f"{name} ({count:,})" for name, count in sorted(calls.items(), key=lambda kv: -kv[1])[:3])
        notes.append(f"{100 * float(dur[bare].sum()) / total_us:.1f} % of kernel time ({int(bare.sum()):,} kernels) was "
                     f"launched with no recorded CPU op around the launch: their launcher is the runtime call "
                     f"({named}), not an op (kernels called directly, e.g. Triton's, or ops not recorded); "
                     "their bytes are unknown")
    if not kernels.from_cpu_ops and len(kernels.event) and not (kernels.launcher != "").any():
        notes.append("no kernel could be linked to its launch (the trace has no correlation ids or no launch "
                     "events, e.g. profiled with activities=[CUDA] only): launcher and Python source are unknown, "
                     "and kernels are placed in steps by their start time")
    if kernels.set_aside:
        unit = "CPU ops" if kernels.from_cpu_ops else "kernels"
        notes.append(f"{kernels.set_aside} {unit} with a negative, non-finite or longer-than-a-day duration were "
                     "set aside: they are in no figure")
    if trace.ids_out_of_range:
        notes.append(f"{trace.ids_out_of_range} correlation or External ids beyond 64 bits were read as absent")
    if trace.repaired_bytes:
        notes.append(f"{trace.repaired_bytes} bytes of raw control characters or invalid UTF-8 in names "
                     "were read as spaces / U+FFFD (JSON forbids them; torch's profiler wrote them)")
    comm = np.isin(category, ["communication"])
    comm_order = np.argsort(kernels.ts_us[comm], kind="stable")
    return RankFigures(
        path=trace.path, rank=find_rank(trace), device_name=find_device_name(trace), peak_gbps=peak,
        step_method=steps.method, steps=n_steps, kernels_from_cpu_ops=kernels.from_cpu_ops,
        kernel_us_total=total_us,
        copy_share=copy_us / total_us if total_us > 0 else None,
        step_ms_median=float(np.median(steps.wall_us)) / 1e3 if n_steps else None,
        gpu_busy_share=float(busy.sum()) / wall_total if wall_total > 0 and not kernels.from_cpu_ops else None,
        kernel_stats=stats, step_table=step_table, step_categories=step_cats,
        between_steps_us=float(dur[between].sum()), between_steps_kernels=int(between.sum()), notes=notes,
        comm_start_us=kernels.ts_us[comm][comm_order], comm_end_us=(kernels.ts_us + dur)[comm][comm_order],
        comm_step=steps.kernel_step[comm][comm_order],
        timeline=None if kernels.from_cpu_ops else _measure_timeline(trace, kernels, steps, step_table, comm),
        graph_attribution=sites.summary if sites is not None else None,
        roofline=device.describe() if device else None,
    )


def analyse_trace(trace: RawTrace, rules: list[Rule], given_steps: int | None = None,
                  mapping: RawTrace | None = None) -> RankFigures:
    """The trace's figures; with `mapping`, a graph-off trace of the same workload, its graph
    kernels attributed to ops, lines and layers (attribute_graph_kernels)."""
    kernels = link_kernels(trace)
    steps = assign_steps(trace, kernels, given_steps)
    sites = attribute_graph_kernels(trace, kernels, steps, mapping) if mapping is not None else None
    return aggregate(trace, kernels, steps, rules, sites)
