"""Interval algebra against a brute-force reference on a fine integer grid."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base import intervals as iv

intervals_strategy = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=25)


def grid(pairs, size=300):
    mask = np.zeros(size, dtype=bool)
    for start, length in pairs:
        mask[start:start + length] = True
    return mask


def as_set(pairs):
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    ends = np.array([s + n for s, n in pairs], dtype=np.int64)
    return iv.union(starts, ends)


@settings(max_examples=300, deadline=None)
@given(intervals_strategy, intervals_strategy)
def test_algebra_matches_brute_force(a_pairs, b_pairs):
    a, b = as_set(a_pairs), as_set(b_pairs)
    ga, gb = grid(a_pairs), grid(b_pairs)
    assert iv.total(a) == ga.sum()
    assert iv.total(iv.intersect(a, b)) == (ga & gb).sum()
    assert iv.total(iv.subtract(a, b)) == (ga & ~gb).sum()
    # canonical form: sorted, disjoint, non-empty
    starts, ends = a
    assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])


@settings(max_examples=200, deadline=None)
@given(intervals_strategy, st.lists(st.tuples(st.integers(0, 250), st.integers(0, 80)), max_size=10))
def test_covered_length_per_query(a_pairs, queries):
    a, ga = as_set(a_pairs), grid(a_pairs, 400)
    qs = np.array([q for q, _ in queries], dtype=np.int64)
    qe = np.array([q + n for q, n in queries], dtype=np.int64)
    got = iv.covered_length(a, qs, qe)
    want = [ga[s:e].sum() for s, e in zip(qs, qe)]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(intervals_strategy, st.lists(st.tuples(st.integers(0, 250), st.integers(0, 80), st.integers(0, 80)),
                                    max_size=10))
def test_covered_lengths_share_the_starts(a_pairs, queries):
    """Several ends per start at once: each is covered_length of that end (the attribution's
    owned and waiting parts of each collective)."""
    a = as_set(a_pairs)
    qs = np.array([q for q, _, _ in queries], dtype=np.int64)
    first = np.array([q + n for q, n, _ in queries], dtype=np.int64)
    second = np.array([q + m for q, _, m in queries], dtype=np.int64)
    got = iv.covered_lengths(a, qs, first, second)
    assert [g.tolist() for g in got] == [iv.covered_length(a, qs, first).tolist(),
                                         iv.covered_length(a, qs, second).tolist()]


def test_union_merges_touching_and_nested():
    starts, ends = iv.union(np.array([0, 5, 10, 2]), np.array([5, 8, 12, 3]))
    assert starts.tolist() == [0, 10] and ends.tolist() == [8, 12]


def test_empty_inputs():
    assert iv.total(iv.union(np.array([]), np.array([]))) == 0
    a = as_set([(0, 10)])
    assert iv.total(iv.intersect(a, iv.EMPTY)) == 0
    assert iv.total(iv.subtract(a, iv.EMPTY)) == 10
    assert iv.covered_length(iv.EMPTY, np.array([0]), np.array([5])).tolist() == [0]


def test_clip_touches_only_the_window():
    from analyzer.base.intervals import clip, union
    canonical = union(np.array([0, 10, 20, 30]), np.array([5, 15, 25, 35]))
    for lo, hi in ((0, 40), (3, 12), (5, 10), (12, 33), (36, 50), (-5, 0), (14, 14)):
        got = clip(canonical, lo, hi)
        want = [(max(s, lo), min(e, hi)) for s, e in zip(*canonical) if min(e, hi) > max(s, lo)]
        assert list(zip(got[0].tolist(), got[1].tolist())) == want, (lo, hi)


@settings(max_examples=300, deadline=None)
@given(intervals_strategy, st.lists(st.tuples(st.integers(-20, 320), st.integers(-30, 120)), max_size=10))
def test_clip_each_is_clip_of_every_window(a_pairs, windows):
    a = as_set(a_pairs)
    lo = np.array([s for s, _ in windows], dtype=np.int64)
    hi = np.array([s + n for s, n in windows], dtype=np.int64)
    window, starts, ends = iv.clip_each(a, lo, hi)
    for k in range(len(windows)):
        want = iv.clip(a, int(lo[k]), int(hi[k]))
        assert starts[window == k].tolist() == want[0].tolist()
        assert ends[window == k].tolist() == want[1].tolist()
    assert window.tolist() == sorted(window.tolist())
    gaps = iv.gaps(a)
    for k in range(len(windows)):
        got = iv.clip_each(gaps, lo[k:k + 1], hi[k:k + 1])
        want = iv.subtract((lo[k:k + 1], hi[k:k + 1]), a) if hi[k] > lo[k] else iv.EMPTY
        assert (got[1].tolist(), got[2].tolist()) == (want[0].tolist(), want[1].tolist())
