"""Graph-kernel attribution: give each kernel replayed from a CUDA graph the op, Python line and
layer that launched it, from a graph-off ("mapping") trace of the same workload.

Under CUDA graphs a replayed kernel has no launching op and no Python line: one `cudaGraphLaunch`
launches them all. The same code run without graphs launches the same kernels in the same order,
each from its op. So, per profiled step, the graph run's kernels are aligned with the mapping
run's, and each matched graph kernel takes its twin's op, source line and layer.

The algorithm (arrays in, arrays out; names are integer codes shared by both traces):

1. Steps. Graph step s is aligned with mapping step min(s, last mapping step) (every decode step
   of one workload launches the same kernels); kernels between steps with the mapping's kernels
   between steps.
2. Streams. A replay may run on other stream ids than the eager run (the capture stream, the
   graph's own branches), so streams are paired by content, not id: each graph stream, most
   kernels first, takes the mapping stream that shares the most kernel names with it (a multiset
   overlap; ties to the stream with more kernels). A stream left without a partner stays unmatched.
3. Alignment. Within a pair of streams, the two kernel-name sequences in time order are aligned:
   equal sequences pair one to one; otherwise their common prefix and suffix pair one to one and
   the rest is aligned by a longest common subsequence (the most kernels matched, in order; one
   row of the dynamic programme at a time in numpy, then a walk back). A greedy longest-block
   match (difflib's) is not used: a model's layers repeat the same names, and it can pair layer
   k of one run with layer k+1 of the other. Kernels left out stay unmatched: a kernel that ran
   only in one of the two modes, or whose name differs between them. Past MAX_LCS_CELLS (the
   part to align is n x m cells) the longest blocks are matched instead.
4. Same workload? A step whose matched kernels are fewer than MIN_STEP_MATCH of the larger of its
   two sides is refused whole (all its kernels unmatched): the mapping is then not of the same
   workload (another preset, layer count or batch size; a graph-off run whose order differs
   throughout), and a partial alignment would attribute kernels wrongly, since any short sequence
   of common kernel names can be found inside a longer one.

Which kernels can differ between graph and eager runs, and why: kernels the eager run launches
that a graph cannot hold (host-to-device copies of Python values, `.item()` syncs; SGLang's
eager-only planning of attention metadata); GEMMs for which cuBLAS picks another algorithm under
capture (a captured cuBLAS call may not use a workspace that eager runs do); SGLang pads a graph
batch to its captured batch size, so a kernel's tile or grid (and with it a templated name) can
follow the padded size; and code compiled for the graph only (torch.compile under
`--enable-torch-compile` fuses ops into Triton kernels of its own names). Such kernels stay
unmatched and are counted; the alignment goes on past them.

What SGLang's own analysis does (scripts/analyze_sglang_torch_profile.py `triage
--mapping-input`, read at sgl-project/sglang 789975a): it builds from the graph-off trace a
table from each kernel *name* to the Python sites and CPU ops that launched it, with each site's
share, and labels every graph-on kernel of that name with the top sites. A kernel name launched
from several places (one GEMM kernel for every projection) then gets a mix of sites; the
position-wise alignment here gives each call its own site and layer.

Other methods:
- Capture-phase traces (SGLang's `--enable-profile-cuda-graph`; with SGLANG_GRAPH_BATCH_CAPTURE=1
  one `<runner>_bs_<bs>[_...]_rank<r>.json.gz` per captured batch size under
  `$SGLANG_TORCH_PROFILER_DIR/graph_capture_profile/`, profiled with record_shapes and with_stack,
  the two warm-up forwards skipped; in sglang 0.5.23 `decode_cuda_graph_runner.py` and
  `full_cuda_graph_backend.py`). Kernels launched while a stream is being captured are recorded
  into the graph, not run, so such a trace holds each launch, its op and its Python frames but no
  kernel events, and with them no kernel names: aligning it with a replay could only go by launch
  order and count. Not done here (see METHODS).
- Node annotations (PyTorch 2.12+ with a driver of CUDA 13.1 or later marks each replayed kernel
  with its graph node, which capture tied to its op). Not done: the lent H200 runs torch 2.11 and
  driver 580 (CUDA 13.0), so no such trace could be made to test it on.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass

import numpy as np

METHOD_MAPPING = "mapping trace"
# the methods stepwatch can name; only the mapping trace is implemented (see the module docstring)
METHODS = (METHOD_MAPPING, "capture trace", "node annotation")
# A step is aligned only when at least this share of the larger side's kernels are matched. On the
# H200 pairs (tests/data) every kernel of every step matches; a pair of different workloads
# shares a small part (a 4-layer graph step holds 64 kernels, a 78-layer eager step 1,404).
MIN_STEP_MATCH = 0.8
# the longest-common-subsequence table's size limit (int32 cells: 64 MB), e.g. 4,000 x 4,000 kernels
MAX_LCS_CELLS = 16_000_000


@dataclass(frozen=True)
class KernelSequence:
    """One trace's kernels, as the alignment needs them (one row per kernel, any order)."""

    name: np.ndarray  # int code of the kernel's name (shared by both traces)
    stream: np.ndarray  # int: the stream (or any per-stream id)
    step: np.ndarray  # int: its step, -1 between steps
    ts_us: np.ndarray  # float: its start, for the order within a stream


@dataclass(frozen=True)
class Alignment:
    """Per graph kernel, its twin in the mapping trace (index into its rows) or -1."""

    twin: np.ndarray
    steps_refused: int  # steps of the graph run refused as not of the mapping's workload
    steps_aligned: int
    refused: list[str]  # one line per refused step: its numbers


def _pair_streams(graph_streams: dict, mapping_streams: dict) -> list[tuple[int, int]]:
    """(graph stream, mapping stream) pairs, by shared kernel names (multiset overlap)."""
    counts = {s: Counter(seq.tolist()) for s, seq in mapping_streams.items()}
    free = set(mapping_streams)
    pairs = []
    for gs in sorted(graph_streams, key=lambda s: (-len(graph_streams[s]), s)):
        if not free:
            break
        mine = Counter(graph_streams[gs].tolist())
        best = max(sorted(free), key=lambda ms: (sum((mine & counts[ms]).values()), len(mapping_streams[ms])))
        if sum((mine & counts[best]).values()):
            pairs.append((gs, best))
            free.discard(best)
    return pairs


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _lcs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A longest common subsequence's positions. Row i of the table is, with the row before it
    (non-decreasing), the running maximum of max(above, above-left + [a_i == b_j])."""
    table = np.zeros((len(a) + 1, len(b) + 1), np.int32)
    for i in range(1, len(a) + 1):
        step = np.maximum(table[i - 1, 1:], table[i - 1, :-1] + (b == a[i - 1]))
        table[i, 1:] = np.maximum.accumulate(step)
    ia, ib = [], []
    i, j = len(a), len(b)
    while i and j:
        if a[i - 1] == b[j - 1]:
            ia.append(i - 1)
            ib.append(j - 1)
            i, j = i - 1, j - 1
        elif table[i - 1, j] >= table[i, j - 1]:
            i -= 1
        else:
            j -= 1
    return np.array(ia[::-1], np.int64), np.array(ib[::-1], np.int64)


def _longest_blocks(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy longest common blocks (difflib, its junk heuristic off): for very long sequences."""
    blocks = difflib.SequenceMatcher(None, a.tolist(), b.tolist(), autojunk=False).get_matching_blocks()
    ia = [np.arange(m.a, m.a + m.size) for m in blocks if m.size]
    ib = [np.arange(m.b, m.b + m.size) for m in blocks if m.size]
    if not ia:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(ia), np.concatenate(ib)


def align_names(a: np.ndarray, b: np.ndarray, max_cells: int = None) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in a, in b) of the matched elements of two name sequences, in order (module
    docstring, step 3)."""
    if len(a) == len(b) and np.array_equal(a, b):
        return np.arange(len(a)), np.arange(len(b))
    head = _common_prefix(a, b)
    tail = _common_prefix(a[head:][::-1], b[head:][::-1])
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    cells = len(mid_a) * len(mid_b)
    ia, ib = (_lcs if cells <= (max_cells or MAX_LCS_CELLS) else _longest_blocks)(mid_a, mid_b)
    tail_a, tail_b = np.arange(len(a) - tail, len(a)), np.arange(len(b) - tail, len(b))
    return (np.concatenate([np.arange(head), head + ia, tail_a]),
            np.concatenate([np.arange(head), head + ib, tail_b]))


def _by_stream(rows: np.ndarray, seq: KernelSequence) -> dict:
    """stream -> the rows of that stream in time order."""
    rows = rows[np.lexsort((seq.ts_us[rows], seq.stream[rows]))]
    out = {}
    bounds = np.flatnonzero(np.diff(seq.stream[rows])) + 1
    for part in np.split(rows, bounds):
        if len(part):
            out[int(seq.stream[part[0]])] = part
    return out


def align_steps(graph: KernelSequence, mapping: KernelSequence, min_step_match: float = MIN_STEP_MATCH) -> Alignment:
    """Each graph kernel's twin in the mapping trace (module docstring, steps 1-4)."""
    twin = np.full(len(graph.name), -1, np.int64)
    map_steps = int(mapping.step.max()) + 1 if len(mapping.step) else 0
    refused, aligned = [], 0
    for s in np.unique(graph.step).tolist():
        if s >= 0 and map_steps == 0:
            continue
        ref = min(s, map_steps - 1) if s >= 0 else -1
        g_rows = np.flatnonzero(graph.step == s)
        m_rows = np.flatnonzero(mapping.step == ref)
        if not len(m_rows):
            continue
        g_streams, m_streams = _by_stream(g_rows, graph), _by_stream(m_rows, mapping)
        found_g, found_m = [], []
        for gs, ms in _pair_streams({k: graph.name[v] for k, v in g_streams.items()},
                                    {k: mapping.name[v] for k, v in m_streams.items()}):
            ia, ib = align_names(graph.name[g_streams[gs]], mapping.name[m_streams[ms]])
            found_g.append(g_streams[gs][ia])
            found_m.append(m_streams[ms][ib])
        hit_g = np.concatenate(found_g) if found_g else np.empty(0, np.int64)
        hit_m = np.concatenate(found_m) if found_m else np.empty(0, np.int64)
        larger = max(len(g_rows), len(m_rows))
        if len(hit_g) < min_step_match * larger:
            if s >= 0:
                refused.append(f"step {s}: {len(hit_g):,} of {len(g_rows):,} graph kernels align with the "
                               f"{len(m_rows):,} of mapping step {ref}")
            continue
        twin[hit_g] = hit_m
        aligned += s >= 0
    return Alignment(twin, len(refused), aligned, refused)


def find_layers(frame_name: np.ndarray, frame_parent: np.ndarray, frame_depth: np.ndarray,
                frame_is_user: np.ndarray, frame_start: np.ndarray, steps: int,
                kernel_frame: np.ndarray, kernel_step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(layer of each kernel, its layer frame's name code); -1 and -1 where none.

    A kernel's layer frame is the outermost user frame around its launch whose function is
    called at least twice per step on average (a model's per-layer `forward`, the reference
    workload's `_run_layer`): the loop over layers. Its layer is that frame's ordinal among the
    frames of the same function in the kernel's step, in time order, from 0. Frames are Python
    function events (`frame_parent`: the enclosing frame's index or -1, `frame_depth` from 1);
    `kernel_frame` is the innermost frame around each kernel's launch (-1: none)."""
    n_frames = len(frame_name)
    layer = np.full(len(kernel_frame), -1, np.int64)
    layer_name = np.full(len(kernel_frame), -1, np.int64)
    if not n_frames or not len(kernel_frame):
        return layer, layer_name
    calls = np.bincount(frame_name, minlength=int(frame_name.max()) + 1)
    repeated = frame_is_user & (calls[frame_name] >= 2 * max(steps, 1))
    outer = np.full(n_frames, -1, np.int64)  # each frame's outermost repeated user frame, itself included
    for d in range(1, int(frame_depth.max()) + 1):
        level = np.flatnonzero(frame_depth == d)
        inherited = np.where(frame_parent[level] >= 0, outer[np.maximum(frame_parent[level], 0)], -1)
        outer[level] = np.where(inherited >= 0, inherited, np.where(repeated[level], level, -1))
    has = (kernel_frame >= 0) & (kernel_step >= 0)
    lf = np.full(len(kernel_frame), -1, np.int64)
    lf[has] = outer[kernel_frame[has]]
    used = lf >= 0
    if not used.any():
        return layer, layer_name
    # the layer frames that launched kernels, with their step; ordinal by (name, step, start)
    frames, first = np.unique(lf[used], return_index=True)
    f_step = kernel_step[used][first]
    order = np.lexsort((frame_start[frames], f_step, frame_name[frames]))
    key_name, key_step = frame_name[frames][order], f_step[order]
    new_group = np.r_[True, (key_name[1:] != key_name[:-1]) | (key_step[1:] != key_step[:-1])]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(order)), 0))
    ordinal = np.empty(len(frames), np.int64)
    ordinal[order] = np.arange(len(order)) - group_start
    pos = np.searchsorted(frames, lf[used])
    layer[used] = ordinal[pos]
    layer_name[used] = frame_name[lf[used]]
    return layer, layer_name


def summarise_layers(layers: np.ndarray) -> str:
    """The distinct layers of a kernel row as text: "3", "0-77", "0, 2, 5-7"; "" for none."""
    values = np.unique(layers[layers >= 0])
    if not len(values):
        return ""
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    parts = []
    for run in np.split(values, breaks):
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts)
