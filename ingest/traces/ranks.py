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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankWaits:
    """Per rank (in the order given): waiting in collectives, and how often it came last."""

    wait_us: np.ndarray  # ranks x collectives: time spent waiting for the last rank
    last_arrivals: np.ndarray  # per rank: collectives it reached last
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
    last = np.bincount(aligned.argmax(axis=0), minlength=len(starts))
    return RankWaits(wait, last, offset, start.shape[1])
