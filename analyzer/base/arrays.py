"""Small array helpers that keep optional numpy modules out of a run."""

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
    ordered = np.sort(array)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
