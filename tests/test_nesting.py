"""Interval nesting on threads: innermost enclosing interval and parents, against a brute force."""

import numpy as np

from ingest.nesting import Nesting


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
