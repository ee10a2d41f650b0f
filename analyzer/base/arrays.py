"""Small array helpers that keep optional numpy modules out of the per-rank map (each pool
worker pays an import once; the job-level code, once per run, uses numpy's own)."""

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



def unique_ints(values: np.ndarray, return_index: bool = False, return_inverse: bool = False,
                return_counts: bool = False) -> Any:
    """``np.unique(values, return_index=..., return_inverse=..., return_counts=...)`` of a 1-D
    int array, the same arrays (dtypes included): codes, ranks and steps span a narrow range,
    where a count per value and a lookup table give them in linear time, without the stable
    sort of every row np.unique makes (2 million rows at 1,024 ranks: a sort and its
    temporaries per call, most of the reduce's np.unique time). Other arrays: np.unique."""
    array = np.asarray(values)
    wanted = (return_index, return_inverse, return_counts)
    span = 0
    if array.ndim == 1 and array.dtype.kind in "iu" and len(array):
        low, high = int(array.min()), int(array.max())
        span = high - low + 1 if high < 2**63 else 0
    if not 0 < span <= 4 * len(array) + 4096:
        return np.unique(array, *wanted)
    shifted = array.astype(np.intp) - low  # in the platform int: int8 values minus their least overflow int8
    counts = np.bincount(shifted, minlength=span)
    present = counts > 0
    out: list[np.ndarray] = [(np.flatnonzero(present) + low).astype(array.dtype)]
    if return_index:
        first = np.full(span, len(array), dtype=np.intp)
        np.minimum.at(first, shifted, np.arange(len(array), dtype=np.intp))
        out.append(first[present])
    if return_inverse:
        out.append((np.cumsum(present) - 1).astype(np.intp)[shifted])
    if return_counts:
        out.append(counts[present].astype(np.intp, copy=False))
    return out[0] if len(out) == 1 else tuple(out)
