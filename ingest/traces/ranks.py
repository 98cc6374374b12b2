"""Across the ranks of one run: who waits for whom in the collectives.

In tensor parallelism every rank enters the same collectives (all-reduce, all-gather, ...) in
the same order. A collective cannot finish before its last rank arrives, so the kernels of one
collective end together on every rank while they start when each rank gets there: the time
from a rank's start to the last rank's start is time that rank spent waiting, not moving data.

Algorithm, over arrays of communication kernels per rank (start, end, step; time order):
1. Match collectives by position: the i-th communication kernel of every rank is the i-th
   collective. This needs the same count on every rank; otherwise no waits are computed
   (say so rather than pair unrelated kernels).
2. Put the ranks on one clock: collectives end together, so a rank's clock offset against the
   first rank is the median of (its end - the first rank's end) over all collectives. On one
   host the clocks agree and the offsets come out near zero; across hosts this removes skew.
3. For collective i, the last arrival is the rank with the latest aligned start; each rank's
   wait is (latest start - its start).
The caller sums each rank's waits per step and takes the median over steps: the first profiled
step often holds one long wait, because the ranks' profilers do not start at the same moment.
4. Who keeps whom waiting (`waits_for`): a rank's wait in collective i is caused by that
   collective's last arrival, so rank q's waits per step are split by the rank that came last;
   [q, r] is the median over q's steps of q's waits in the collectives r reached last. The rank
   that costs the others most is the one with the largest mean of its column over the other
   ranks -- not always the one that is last most often (8 Megatron TP ranks from astra-sim: one
   rank last in 34 of 84 collectives kept each other rank waiting 170 ms a step, another last in
   32 kept them waiting 220 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankWaits:
    """Per rank (in the order given): waiting in collectives, and how often it came last."""

    wait_us: np.ndarray  # ranks x collectives: time spent waiting for the last rank
    last_arrivals: np.ndarray  # per rank: collectives it reached last
    last: np.ndarray  # per collective: the rank (its index in the order given) that reached it last
    offset_us: np.ndarray  # clock offset against the first rank (subtracted before comparing)
    collectives: int  # collectives matched across the ranks


def find_waits(starts: list[np.ndarray], ends: list[np.ndarray]) -> RankWaits | None:
    """Waits of each rank given its communication kernels' start and end times (time order);
    None when the ranks did not run the same number of them (or none, or one rank only)."""
    counts = {len(s) for s in starts}
    if len(starts) < 2 or len(counts) != 1 or counts == {0}:
        return None
    start = np.vstack(starts)  # ranks x collectives
    end = np.vstack(ends)
    offset = np.median(end - end[0], axis=1)
    aligned = start - offset[:, None]
    latest = aligned.max(axis=0)
    wait = latest[None, :] - aligned
    last = aligned.argmax(axis=0)
    return RankWaits(wait, np.bincount(last, minlength=len(starts)), last, offset, start.shape[1])


def waits_for(waits: RankWaits, steps: list[np.ndarray], n_steps: list[int]) -> np.ndarray:
    """ranks x ranks, in ms: [q, r] the median over rank q's steps of the time q waits per step
    in the collectives rank r reached last (0 on the diagonal; a step of q without such a wait
    counts 0). `steps[q]`: the step of each of q's communication kernels (-1 outside steps), in the
    order find_waits was given them; `n_steps[q]`: q's step count."""
    n = len(steps)
    out = np.zeros((n, n))
    for q in range(n):
        inside = steps[q] >= 0
        if n_steps[q] <= 0 or not inside.any():
            continue
        for r in range(n):
            if r != q:
                mine = np.where(waits.last == r, waits.wait_us[q], 0.0)
                per_step = np.bincount(steps[q][inside], weights=mine[inside], minlength=n_steps[q])[:n_steps[q]]
                out[q, r] = float(np.median(per_step)) / 1e3
    return out
