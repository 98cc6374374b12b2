"""Interval nesting on threads: innermost enclosing interval and parents, against a brute force."""

import numpy as np

from ingest.traces.nesting import Nesting


def _random_tree(rng, n_roots=30, depth=5):
    """Properly nested intervals on two threads, as a profiler records them."""
    thread, start, end = [], [], []

    def grow(t, lo, hi, d):
        thread.append(t); start.append(lo); end.append(hi)
        if d == 0:
            return
        cuts = np.sort(rng.uniform(lo, hi, size=2 * rng.integers(0, 4)))
        for a, b in zip(cuts[::2], cuts[1::2]):
            grow(t, a, b, d - 1)

    for t in (3, 7):
        edges = np.sort(rng.uniform(0, 1000, 2 * n_roots))
        for a, b in zip(edges[::2], edges[1::2]):
            grow(t, a, b, depth)
    perm = rng.permutation(len(start))
    return np.array(thread)[perm], np.array(start)[perm], np.array(end)[perm]


def _brute_enclosing(thread, start, end, qt, qx):
    best = -1
    for i in range(len(start)):
        if thread[i] == qt and start[i] <= qx <= end[i]:
            if best < 0 or end[i] - start[i] < end[best] - start[best]:
                best = i
    return best


def test_enclosing_and_parents_match_brute_force():
    rng = np.random.default_rng(7)
    thread, start, end = _random_tree(rng)
    nest = Nesting.build(thread, start, end)
    qt = rng.choice([3, 7, 9], size=400)
    qx = rng.uniform(-10, 1010, size=400)
    got = nest.enclosing(qt, qx)
    want = [_brute_enclosing(thread, start, end, t, x) for t, x in zip(qt, qx)]
    assert list(got) == want
    assert (got >= 0).sum() > 100  # the test exercises hits, not only misses
    parents = nest.parents()
    for i in range(len(start)):
        others = [j for j in range(len(start)) if j != i and thread[j] == thread[i]
                  and start[j] <= start[i] and end[i] <= end[j]]
        want_parent = min(others, key=lambda j: end[j] - start[j]) if others else -1
        assert parents[i] == want_parent


def test_shared_start_puts_the_longer_interval_outside():
    # aten::to and aten::_to_copy can start on the same nanosecond
    nest = Nesting.build(np.array([0, 0]), np.array([5.0, 5.0]), np.array([9.0, 20.0]))
    assert list(nest.parents()) == [1, -1]
    assert list(nest.enclosing(np.array([0, 0]), np.array([6.0, 15.0]))) == [0, 1]


def test_zero_length_intervals_at_a_shared_start_sit_inside_the_longer_one():
    # From a real CPU-only trace (HTA tests/data/rank_non_gpu): aten::narrow (929, 2) holds
    # aten::slice (930, 1), which holds a zero-length aten::as_strided at 930; a zero-length
    # aten::to at 604214 sits after aten::clamp (604194-604210) ended, inside the step.
    names = ["step", "narrow", "slice", "as_strided", "clamp", "to"]
    start = np.array([0.0, 929.0, 930.0, 930.0, 604194.0, 604214.0])
    end = np.array([700000.0, 931.0, 931.0, 930.0, 604210.0, 604214.0])
    nest = Nesting.build(np.zeros(6, np.int64), start, end)
    parents = [names[p] if p >= 0 else None for p in nest.parents()]
    assert parents == [None, "step", "narrow", "slice", "step", "step"]
    assert list(nest.depth_of()) == [1, 2, 3, 4, 2, 2]


def test_identical_intervals_nest_in_file_order():
    # aten::to and aten::_to_copy with the same start and length: the first in the file is outside
    nest = Nesting.build(np.zeros(3, np.int64), np.array([1.0, 1.0, 1.0]), np.array([5.0, 5.0, 5.0]))
    assert list(nest.parents()) == [-1, 0, 1]


def test_zero_length_intervals_match_brute_force():
    rng = np.random.default_rng(11)
    thread, start, end = _random_tree(rng, n_roots=20, depth=4)
    # make a fifth of them zero-length at their start, and snap times to whole units as old
    # traces do, so that starts are shared
    start, end = np.floor(start), np.floor(end)
    zero = rng.random(len(start)) < 0.2
    end = np.where(zero, start, end)
    nest = Nesting.build(thread, start, end)
    parents = nest.parents()
    order = np.lexsort((-end, start, thread))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    for i in range(len(start)):
        # the innermost interval that holds i whole and comes before it in (start, longer first)
        # order; an interval that ends at t is over at t, so it does not hold a zero-length one at t
        others = [j for j in range(len(start)) if thread[j] == thread[i] and rank[j] < rank[i]
                  and start[j] <= start[i] and end[i] <= end[j] and end[j] > start[i]]
        want = max(others, key=lambda j: rank[j]) if others else -1
        assert parents[i] == want, i
