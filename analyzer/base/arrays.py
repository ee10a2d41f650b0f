"""Small array helpers that keep optional numpy modules out of a run."""

from __future__ import annotations

from typing import Any

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


def median(values: ArrayLike, axis: int | None = None) -> Any:
    """``np.median(values, axis)`` (axis None or one int), the same steps and result, without
    importing ``numpy.ma``: numpy's NaN check after the partition asks ``np.ma.isMaskedArray``
    (issue 13). A NaN in a lane gives NaN there, as numpy's does."""
    array = np.asanyarray(values)
    size = array.size if axis is None else array.shape[axis]
    kth = [size // 2 - 1, size // 2] if size % 2 == 0 else [(size - 1) // 2]
    nans = np.issubdtype(array.dtype, np.inexact) or array.dtype.kind in "Mm"
    if nans:
        kth.append(-1)
    part = np.partition(array, kth, axis=axis)
    if part.shape == ():
        return part.item()
    axis = 0 if axis is None else axis
    index = part.shape[axis] // 2
    indexer = [slice(None)] * part.ndim
    indexer[axis] = slice(index, index + 1) if part.shape[axis] % 2 == 1 else slice(index - 1, index + 1)
    result = np.mean(part[tuple(indexer)], axis=axis)
    if nans and size > 0:
        last = part.take(-1, axis=axis)
        missing = np.isnan(last)
        if missing.any():
            if isinstance(result, np.generic):
                return last
            np.copyto(result, last, where=missing)
    return result
