"""Small array helpers that keep optional numpy modules out of the per-rank map (each pool
worker pays an import once; the job-level code, once per run, uses numpy's own)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def unique(values: ArrayLike) -> np.ndarray:
    """``np.unique(values)`` (the sorted distinct values) of a 1-D array of integers or bools,
    without importing ``numpy.ma``: numpy's ``np.unique`` with no optional output asks
    ``np.ma.is_masked`` first, which imports ``numpy.ma`` (~8 ms of every process that calls
    it, issue 13). Other arrays go to ``np.unique``."""
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iub":
        return np.unique(array)
    if len(array) and array.dtype.kind in "iu":
        low, high = int(array.min()), int(array.max())
        # Ids, streams, steps (a narrow range): a count per value, as fast as numpy's hash table.
        if high - low <= 4 * len(array) + 4096 and high < 2**63:
            counts = np.bincount(array.astype(np.int64) - low)
            return (np.flatnonzero(counts) + low).astype(array.dtype)
    ordered = np.sort(array)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]

