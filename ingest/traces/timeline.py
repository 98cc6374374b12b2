"""A stage after the steps are known: what the GPU's timeline says about each step, beyond the
kernels' own figures. The consistency check and the pattern catalog (ingest/regress/) read these.

Everything is per step, then summarised over the steps: a median for times and counts that
describe the step (as the step time is a median), a mean for what a kernel table would sum (calls
and idle time per step, as ms per step is a mean). All intervals are on the trace's one clock.

- streams: the GPU streams (a kernel's pid and tid) that ran kernels inside steps.
- kernel_ms_median / busy_ms_median / wall_ms_median: per step, the kernels' summed time, the
  union of their intervals (the GPU busy), and the step's extent; medians over the steps.
- kernels_per_step: the median count of kernels in a step; kernel_us_median: the median kernel.
  launched_per_step / launched_us_median: the same for the kernels the host launched one by one
  (not replayed from a CUDA/HIP graph): what a launch-bound step is made of.
- communication: per step, the communication kernels' summed time and their *exposed* time, the
  part of their union during which no other kernel ran (the step waits for it); medians.
- host syncs: host calls that block until the GPU is done (HOST_SYNC, e.g. cudaStreamSynchronize,
  cudaDeviceSynchronize, cudaEventSynchronize, a synchronous cudaMemcpy) made *inside* a step,
  that is, between two kernel launches of the same step (after the step's first launch and before
  its last). Each such call leaves the GPU to drain its queue and then wait for the host's next
  launch: the call's window runs from its start to the start, on the GPU, of the first kernel of
  its step launched after it returns, and the GPU's idle time in that window is what the sync
  costs. Windows are merged before measuring (two syncs before one launch count once). Per name
  and for all names together: calls per step and idle ms per step, means over the steps.
  A sync between steps (after a step's last launch: reading the sampled token) is not counted:
  its idle time falls outside every step. Under a CUDA graph a step's kernels share one launch,
  so nothing can be between two of them.
- span_batch_size: the batch size SGLang writes in its decode spans (`step[DECODE bs=4]`), when
  steps are those spans and they agree.

Interval arithmetic: the kernels' intervals are merged once into disjoint, sorted busy intervals
with the running total of their lengths, so that the busy time inside any window [a, b] is two
binary searches (covered(b) - covered(a)); a step's or a window's idle time is its length less that.
"""

from __future__ import annotations

import re

import numpy as np

# host calls that wait for the GPU: the runtime's and driver's synchronisations, and the
# synchronous memcpy (cudaMemcpyAsync to pageable memory blocks too, but only for a
# device-to-host copy, which the trace's runtime event does not say: it is left out)
HOST_SYNC = re.compile(r"^(cuda|hip|cu)(Stream|Device|Event|Ctx)Synchronize$|^(cuda|hip)Memcpy$|^cuMemcpyDtoH(_v2)?$")
_DECODE_BATCH = re.compile(r"^step\[DECODE bs=(\d+)\b")


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of intervals as disjoint intervals sorted by start (touching ones joined):
    (their starts, their ends, the index in the input of the earliest interval of each)."""
    if not len(start):
        return np.empty(0), np.empty(0), np.empty(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    heads = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
    return s[heads], np.maximum.reduceat(e, heads), order[heads]


class Busy:
    """Disjoint busy intervals, answering how much of a window they cover."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        self.start, self.end, _ = merge_intervals(start, end)
        self._before = np.r_[0.0, np.cumsum(self.end - self.start)]  # covered before interval i

    def covered_until(self, t: np.ndarray) -> np.ndarray:
        """Busy time from the beginning of time to each t."""
        if not len(self.start):
            return np.zeros(len(t))
        i = np.searchsorted(self.start, t, "right") - 1
        at = np.maximum(i, 0)
        inside = np.clip(t - self.start[at], 0, self.end[at] - self.start[at])
        return np.where(i >= 0, self._before[at] + inside, 0.0)

    def covered(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Busy time inside each window [a, b]."""
        return self.covered_until(b) - self.covered_until(a)


def _per_step(step: np.ndarray, values: np.ndarray, n_steps: int) -> np.ndarray:
    inside = step >= 0
    return np.bincount(step[inside], weights=values[inside], minlength=n_steps)[:n_steps]


def _median(values: np.ndarray) -> float | None:
    return float(np.median(values)) if len(values) else None


def measure_communication(ts: np.ndarray, end: np.ndarray, step: np.ndarray, is_comm: np.ndarray,
                          n_steps: int) -> dict:
    """Per step: communication kernels' summed time and the part of their union in which no
    other kernel ran; medians over the steps, in ms."""
    inside = step >= 0
    comm, other = inside & is_comm, inside & ~is_comm
    summed = _per_step(step, np.where(comm, end - ts, 0.0), n_steps)
    if not comm.any():
        return {"comm_ms_median": 0.0, "comm_exposed_ms_median": 0.0}
    compute = Busy(ts[other], end[other])
    # a merged communication interval belongs to the step of its earliest kernel
    m_start, m_end, first = merge_intervals(ts[comm], end[comm])
    exposed = (m_end - m_start) - compute.covered(m_start, m_end)
    per_step = np.bincount(step[comm][first], weights=exposed, minlength=n_steps)[:n_steps]
    return {"comm_ms_median": _ms(_median(summed)), "comm_exposed_ms_median": _ms(_median(per_step))}


def measure_host_syncs(call_ts: np.ndarray, call_end: np.ndarray, call_name: np.ndarray, query_ts: np.ndarray,
                       kernel_ts: np.ndarray, step: np.ndarray, n_steps: int, busy: Busy) -> dict:
    """Host syncs between two launches of one step, and the GPU idle time they leave (module
    docstring); `query_ts` is each kernel's launch time, `step` its step (-1 between steps)."""
    empty = {"host_syncs_per_step": 0.0, "host_sync_idle_ms_per_step": 0.0, "host_syncs": []}
    inside = np.flatnonzero(step >= 0)
    if not len(call_ts) or not len(inside) or n_steps <= 0:
        return empty
    # the kernels of steps in launch order: the first launched after a call is the next one
    order = inside[np.lexsort((query_ts[inside], step[inside]))]
    k_step, k_launch, k_start = step[order], query_ts[order], kernel_ts[order]
    bounds = np.searchsorted(k_step, np.arange(n_steps + 1))
    has = bounds[1:] > bounds[:-1]
    first = np.where(has, k_launch[np.minimum(bounds[:-1], len(k_launch) - 1)], np.inf)
    last = np.where(has, k_launch[np.maximum(bounds[1:] - 1, 0)], -np.inf)
    # the step whose launches surround the call: windows of steps run in time order
    by_first = np.argsort(first, kind="stable")
    pos = np.searchsorted(first[by_first], call_ts, "right") - 1
    call_step = np.where(pos >= 0, by_first[np.maximum(pos, 0)], -1)
    within = (call_step >= 0) & (call_ts <= last[np.maximum(call_step, 0)])
    # the first kernel of that step launched at or after the call returned
    nxt = np.full(len(call_ts), -1, np.int64)
    for s in np.unique(call_step[within]).tolist():
        lo, hi = bounds[s], bounds[s + 1]
        sel = np.flatnonzero(within & (call_step == s))
        j = lo + np.searchsorted(k_launch[lo:hi], call_end[sel], "left")
        nxt[sel] = np.where(j < hi, j, -1)
    mid = np.flatnonzero(within & (nxt >= 0))
    if not len(mid):
        return empty

    def idle_per_step(calls: np.ndarray) -> np.ndarray:
        """The GPU's idle time in the union of these calls' windows, per step."""
        w_start, w_end, first = merge_intervals(call_ts[calls], np.maximum(k_start[nxt[calls]], call_ts[calls]))
        idle = np.clip((w_end - w_start) - busy.covered(w_start, w_end), 0, None)
        return np.bincount(call_step[calls][first], weights=idle, minlength=n_steps)[:n_steps]

    by_name = []
    for name in sorted(set(call_name[mid].tolist())):
        calls = mid[call_name[mid] == name]
        by_name.append({"name": name, "calls_per_step": len(calls) / n_steps,
                        "idle_ms_per_step": float(idle_per_step(calls).sum()) / n_steps / 1e3})
    by_name.sort(key=lambda r: (-r["idle_ms_per_step"], r["name"]))
    return {"host_syncs_per_step": len(mid) / n_steps,
            "host_sync_idle_ms_per_step": float(idle_per_step(mid).sum()) / n_steps / 1e3, "host_syncs": by_name}


def find_span_batch_size(span_names: list[str]) -> int | None:
    """The batch size of SGLang's decode spans (`step[DECODE bs=4]`) when they all agree."""
    sizes = {int(m.group(1)) for m in map(_DECODE_BATCH.match, span_names) if m}
    return sizes.pop() if len(sizes) == 1 else None


def measure_timeline(kernel_ts: np.ndarray, kernel_dur: np.ndarray, kernel_stream: np.ndarray, query_ts: np.ndarray,
                     step: np.ndarray, step_wall_us: np.ndarray, step_busy_us: np.ndarray, step_kernel_us: np.ndarray,
                     is_comm: np.ndarray, sync_ts: np.ndarray, sync_dur: np.ndarray, sync_name: np.ndarray,
                     span_names: list[str], from_graph: np.ndarray | None = None) -> dict:
    """The figures of the module docstring for one rank's GPU kernels (not for a CPU-only trace,
    whose ops have no GPU timeline), from the kernels and the step table's per-step wall, busy
    and kernel time: plain Python values, ready for JSON."""
    n_steps = len(step_wall_us)
    inside = step >= 0
    end = kernel_ts + kernel_dur
    counts = np.bincount(step[inside], minlength=n_steps)[:n_steps].astype(float)
    out = {
        "streams": int(len(np.unique(kernel_stream[inside]))),
        "wall_ms_median": _ms(_median(step_wall_us)),
        "busy_ms_median": _ms(_median(step_busy_us)),
        "kernel_ms_median": _ms(_median(step_kernel_us)),
        "kernels_per_step": _median(counts),
        "kernel_us_median": _median(kernel_dur[inside]),
    }
    launched = inside if from_graph is None else inside & ~from_graph
    out["launched_per_step"] = _median(np.bincount(step[launched], minlength=n_steps)[:n_steps].astype(float))
    out["launched_us_median"] = _median(kernel_dur[launched])
    out.update(measure_communication(kernel_ts, end, step, is_comm, n_steps))
    busy = Busy(kernel_ts, end)
    out.update(measure_host_syncs(sync_ts, sync_ts + sync_dur, sync_name, query_ts, kernel_ts, step, n_steps, busy))
    out["span_batch_size"] = find_span_batch_size(span_names)
    return out


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3
