"""An independent count of a profiler trace's kernels, taken straight from its JSON.

Written plainly with json and gzip and nothing from stepwatch, so that a reviewer can check it by
eye and so that it and stepwatch's reader can disagree when either one is wrong.

- A *GPU activity* is an event with `ph` "X" whose category, lower-cased, is in GPU_CATEGORIES
  (kernels, copies and sets of every Kineto era, and MTIA's CCP events). Per name: how many, and
  their total `dur` in microseconds.
- A trace with no GPU activity is *CPU-only*: every CPU op (category `cpu_op`, or `Operator` in
  torch 1.8-1.10 traces) plays a kernel, timed by its self time: its `dur` less the `dur` of its
  direct child ops on the same (pid, tid), never below 0. An op is a child of the innermost op
  still open at its start (a stack over the thread's ops sorted by start, longer first; an op
  that ends when another starts is over). As torch's key_averages() does, an op whose parent has
  the same name and no other child is folded into that parent: its self time is added to the
  parent's and it is not a call of its own (aten::sum calling aten::sum is one call).
- A file that is a JSON array is the events array itself (Chrome's JSON Array Format).
- The *rank* of a file: `distributedInfo.rank` when the trace has one, else a rank in the file's
  name (`-TP-<n>`, `rank<n>`, `rank-<n>`, `rank_<n>`), else 0.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"})
CPU_OP_CATEGORIES = frozenset({"cpu_op", "operator"})
_RANK_IN_NAME = re.compile(r"-TP-(\d+)|rank[-_]?(\d+)")
_STEP_MARKER = re.compile(r"ProfilerStep#\d+$|step\[|(cuda|cu|hip)GraphLaunch")


@dataclass(frozen=True)
class Count:
    calls: int
    total_us: float


@dataclass(frozen=True)
class Reference:
    rank: int
    cpu_only: bool  # the kernels are CPU ops timed by self time
    kernels: dict[str, Count]  # per name
    has_step_markers: bool  # ProfilerStep#N, step[...] or a graph launch


def load_trace(path: str | Path) -> dict:
    """The trace as a JSON object; a file that is the events array itself (Chrome's JSON Array
    Format, as Kineto wrote traces in 2020) as {"traceEvents": that array}."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    trace = json.loads(raw)
    return {"traceEvents": trace} if isinstance(trace, list) else trace


def find_rank(path: str | Path, trace: dict) -> int:
    info = trace.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    if isinstance(rank, str) and rank.strip().isdigit():
        return int(rank)
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1) or m.group(2)) if m else 0


def _category(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def _dur(event: dict) -> float:
    return float(event.get("dur", 0))


def count_gpu_activities(events: list[dict]) -> dict[str, Count]:
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and _category(e) in GPU_CATEGORIES:
            calls[e["name"]] += 1
            total[e["name"]] += _dur(e)
    return {name: Count(calls[name], total[name]) for name in calls}


def count_cpu_ops(events: list[dict]) -> dict[str, Count]:
    ops = [e for e in events if e.get("ph") == "X" and _category(e) in CPU_OP_CATEGORIES]
    by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        by_thread[(op.get("pid"), op.get("tid"))].append(i)

    parent = [None] * len(ops)
    n_children = [0] * len(ops)
    children_us = [0.0] * len(ops)
    for members in by_thread.values():
        members.sort(key=lambda i: (ops[i]["ts"], -_dur(ops[i])))  # stable: file order breaks ties
        open_ops: list[int] = []
        for i in members:
            while open_ops and ops[open_ops[-1]]["ts"] + _dur(ops[open_ops[-1]]) <= ops[i]["ts"]:
                open_ops.pop()
            if open_ops:
                p = open_ops[-1]
                parent[i] = p
                n_children[p] += 1
                children_us[p] += _dur(ops[i])
            open_ops.append(i)

    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for i, op in enumerate(ops):
        p = parent[i]
        folded = p is not None and ops[p]["name"] == op["name"] and n_children[p] == 1
        calls[op["name"]] += 0 if folded else 1
        # a folded op's self time goes to its parent, which has the same name: same per-name sum
        total[op["name"]] += max(_dur(op) - children_us[i], 0.0)
    return {name: Count(calls[name], total[name]) for name in calls}


def has_step_markers(events: list[dict]) -> bool:
    return any(e.get("ph") == "X" and _STEP_MARKER.match(str(e.get("name", ""))) for e in events)


def reference_of(path: str | Path) -> Reference:
    trace = load_trace(path)
    events = [e for e in trace["traceEvents"] if isinstance(e, dict)]
    kernels = count_gpu_activities(events)
    cpu_only = not kernels
    if cpu_only:
        kernels = count_cpu_ops(events)
    return Reference(find_rank(path, trace), cpu_only, kernels, has_step_markers(events))
