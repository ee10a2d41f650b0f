"""Interval algebra on numpy arrays: the one implementation every analysis uses.

An interval set is a pair of int64 arrays (starts, ends). ``union`` returns the canonical form:
sorted, disjoint, non-empty intervals; the other functions expect and return canonical sets.
"""

from __future__ import annotations

import numpy as np

IntervalSet = tuple[np.ndarray, np.ndarray]

EMPTY: IntervalSet = (np.empty(0, np.int64), np.empty(0, np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> IntervalSet:
    """Merge possibly overlapping intervals into sorted disjoint ones (zero-length dropped)."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A new merged interval begins where a start lies beyond every earlier end.
    begins = np.empty(len(starts), dtype=bool)
    begins[0] = True
    begins[1:] = starts[1:] > running_end[:-1]
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return starts[first], running_end[last]


def total(intervals: IntervalSet) -> int:
    starts, ends = intervals
    return int((ends - starts).sum())


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Intersection of two canonical sets (linear merge, vectorised)."""
    a_start, a_end = a
    b_start, b_end = b
    if len(a_start) == 0 or len(b_start) == 0:
        return EMPTY
    # For each a-interval, the b-intervals that can overlap it form a contiguous run.
    lo = np.searchsorted(b_end, a_start, side="right")
    hi = np.searchsorted(b_start, a_end, side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY
    a_index, b_index = _runs(lo, counts)
    starts = np.maximum(a_start[a_index], b_start[b_index])
    ends = np.minimum(a_end[a_index], b_end[b_index])
    keep = ends > starts
    return starts[keep], ends[keep]


def _runs(first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, index) of every index in the runs first[k], first[k] + 1, ... (counts[k] of them)."""
    owner = np.repeat(np.arange(len(first)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, np.repeat(first, counts) + offsets


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Parts of ``a`` not covered by ``b``."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    return _complement_within(a, intersect(a, b))


def _complement_within(a: IntervalSet, covered: IntervalSet) -> IntervalSet:
    # Boundaries of a and of the covered pieces interleave; keep the uncovered stretches.
    points_start = np.concatenate([a[0], covered[1]])
    points_end = np.concatenate([a[1], covered[0]])
    starts = np.sort(points_start)
    ends = np.sort(points_end)
    keep = ends > starts
    return starts[keep], ends[keep]


def covered_length(intervals: IntervalSet, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each query [s, e), how much of it the canonical set covers (vectorised)."""
    return covered_lengths(intervals, starts, ends)[0]


def covered_lengths(intervals: IntervalSet, starts: np.ndarray, *ends: np.ndarray) -> list[np.ndarray]:
    """``covered_length(intervals, starts, e)`` for each array ``e`` of ends, sharing the work
    on the set and the starts (the step attribution asks for two ends per collective)."""
    set_start, set_end = intervals
    starts = np.asarray(starts, dtype=np.int64)
    if len(set_start) == 0:
        return [np.zeros(len(starts), dtype=np.int64) for _ in ends]
    lengths = set_end - set_start
    prefix = np.concatenate([[0], np.cumsum(lengths)])
    before = _cumulative(set_start, lengths, prefix, starts)
    return [_cumulative(set_start, lengths, prefix, np.asarray(e, dtype=np.int64)) - before for e in ends]


def _cumulative(set_start: np.ndarray, lengths: np.ndarray, prefix: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered length in (-inf, t] for each t."""
    idx = np.searchsorted(set_start, t, side="right") - 1
    safe = np.maximum(idx, 0)
    inside = np.minimum(np.maximum(t - set_start[safe], 0), lengths[safe])  # np.clip, without its overhead
    return np.where(idx >= 0, prefix[safe] + inside, 0)


def clip(intervals: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The canonical set restricted to [lo, hi); only the intervals that reach it are touched
    (a step window of a long trace costs O(log n + its own intervals))."""
    starts, ends = intervals
    first = int(np.searchsorted(ends, lo, side="right"))  # canonical: ends are sorted too
    last = int(np.searchsorted(starts, hi, side="left"))
    starts, ends = starts[first:last], ends[first:last]
    starts = np.maximum(starts, lo)
    ends = np.minimum(ends, hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def clip_each(intervals: IntervalSet, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``clip(intervals, lo[k], hi[k])`` of every window k at once, concatenated in window order:
    (k of each piece, starts, ends). The step attribution clips the rank's sets to every step
    window (issue 13: one clip per step was most of its cost)."""
    starts, ends = intervals
    first = np.searchsorted(ends, lo, side="right")
    counts = np.maximum(np.searchsorted(starts, hi, side="left") - first, 0)
    window, index = _runs(first, counts)
    clipped_starts = np.maximum(starts[index], lo[window])
    clipped_ends = np.minimum(ends[index], hi[window])
    keep = clipped_ends > clipped_starts
    return window[keep], clipped_starts[keep], clipped_ends[keep]


def gaps(intervals: IntervalSet) -> IntervalSet:
    """What a canonical set leaves uncovered, from -2**63 to 2**63 - 1 (gap k ends where interval
    k starts); canonical but for an empty first or last gap where the set reaches int64's ends
    (``clip_each`` to a finite window drops them)."""
    starts, ends = intervals
    int64 = np.iinfo(np.int64)
    return np.concatenate([[int64.min], ends]), np.concatenate([starts, [int64.max]])
