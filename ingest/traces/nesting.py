"""Nesting of intervals on a thread (CPU ops, Python frames), answered with array operations.

Events recorded on one thread are properly nested: a child starts and ends inside its parent.
With intervals sorted by (start, longer first, then file order), an interval's depth is the
number of intervals before it in that order that are still open at its start, plus one: the
intervals before it, less those that ended at or before its start. Zero-length intervals need
care: one that starts (and ends) where a longer interval starts sorts after it and is inside it,
so it must not count as "ended" for the longer one. The innermost interval enclosing a time x
is then the last interval that started at or before x among those whose depth equals the number
of intervals open at x. Every answer is checked for containment; a time that no interval
contains answers -1, an interval that no other contains has no parent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Nesting:
    """Intervals grouped by thread, sorted, with their depth; indices refer to the input order."""

    order: np.ndarray  # input index of each sorted position
    thread: np.ndarray  # sorted
    start: np.ndarray
    end: np.ndarray
    depth: np.ndarray  # 1 = outermost
    groups: dict  # thread -> (lo, hi) slice of the sorted arrays

    @classmethod
    def build(cls, thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> "Nesting":
        order = np.lexsort((-end, start, thread))
        t, s, e = thread[order], start[order], end[order]
        depth = np.zeros(len(order), np.int32)
        groups = {}
        bounds = np.flatnonzero(np.diff(t)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(t)]):
            if hi <= lo:
                continue
            groups[int(t[lo])] = (int(lo), int(hi))
            gs, ge = s[lo:hi], e[lo:hi]
            closed = np.searchsorted(np.sort(ge), gs, "right")  # intervals over by each start
            # ... of which those not before it in the order: the zero-length intervals at its
            # start that sort at or after it (itself included), which come last among that start
            zero = (ge == gs).astype(np.int64)
            zeros_up_to = np.cumsum(zero)
            new_start = np.r_[gs[1:] != gs[:-1], True]
            run_end = np.flatnonzero(new_start)  # the last position of each run of equal starts
            same_start_end = run_end[np.r_[0, np.cumsum(new_start[:-1])]]
            closed -= zeros_up_to[same_start_end] - zeros_up_to + zero
            depth[lo:hi] = np.arange(1, hi - lo + 1) - closed
        return cls(order, t, s, e, depth, groups)

    def _lookup(self, lo: int, hi: int, times: np.ndarray, want_depth: np.ndarray) -> np.ndarray:
        """Sorted position of the last interval in [lo, hi) starting <= time with that depth."""
        out = np.full(len(times), -1, np.int64)
        d = self.depth[lo:hi]
        s = self.start[lo:hi]
        for k in np.unique(want_depth):
            if k <= 0:
                continue
            pos = np.flatnonzero(d == k)
            if not len(pos):
                continue
            sel = np.flatnonzero(want_depth == k)
            j = np.searchsorted(s[pos], times[sel], "right") - 1
            ok = j >= 0
            out[sel[ok]] = lo + pos[j[ok]]
        return out

    def enclosing(self, q_thread: np.ndarray, q_time: np.ndarray) -> np.ndarray:
        """Input index of the innermost interval containing each query time, or -1."""
        result = np.full(len(q_time), -1, np.int64)
        for th, (lo, hi) in self.groups.items():
            sel = np.flatnonzero(q_thread == th)
            if not len(sel):
                continue
            x = q_time[sel]
            started = np.searchsorted(self.start[lo:hi], x, "right")
            over = np.searchsorted(np.sort(self.end[lo:hi]), x, "left")
            pos = self._lookup(lo, hi, x, started - over)
            hit = pos >= 0
            hit[hit] = (self.start[pos[hit]] <= x[hit]) & (self.end[pos[hit]] >= x[hit])
            result[sel[hit]] = self.order[pos[hit]]
        return result

    def parents(self) -> np.ndarray:
        """Input index of each interval's parent (the innermost interval around it), or -1."""
        parent_sorted = np.full(len(self.order), -1, np.int64)
        for lo, hi in self.groups.values():
            want = self.depth[lo:hi] - 1
            pos = self._lookup(lo, hi, self.start[lo:hi], want)
            hit = pos >= 0
            # a parent holds its child whole (an interval that overlaps another is nobody's child)
            hit[hit] = (self.start[pos[hit]] <= self.start[lo:hi][hit]) & (self.end[pos[hit]] >= self.end[lo:hi][hit])
            parent_sorted[lo:hi] = np.where(hit, pos, -1)
        result = np.full(len(self.order), -1, np.int64)
        ok = parent_sorted >= 0
        result[self.order[ok]] = self.order[parent_sorted[ok]]
        return result

    def depth_of(self) -> np.ndarray:
        """Depth of each interval, in input order."""
        out = np.empty(len(self.order), np.int32)
        out[self.order] = self.depth
        return out
