"""Column helpers of the reduce: numpy arrays of the collective rows' fields, turned back into
the rows' Python values exactly as the row-by-row code produced them."""

from __future__ import annotations

import numpy as np

# Beyond 2**50 a scaled value's fraction is no longer exact in a float: round it in Python.
_EXACT_LIMIT = 2.0 ** 50


def round_list(values: np.ndarray, digits: int = 3) -> list[float]:
    """``[round(float(v), digits) for v in values]``, bit for bit, at numpy speed.

    Python rounds the exact binary value half-to-even, then takes the float nearest the decimal
    (``k / 10**digits``). ``rint(v·10**digits) / 10**digits`` divides the same integer k exactly
    rounded, so it agrees whenever ``rint`` picks Python's k: always, except where ``v·10**digits``
    lies within its own rounding error (≤ |v·10**digits|·2⁻⁵³) of a half. Those values, and
    non-finite or huge ones, are rounded by Python itself."""
    values = np.asarray(values, dtype=np.float64)
    scale = 10.0 ** digits
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = values * scale
        out = (np.rint(scaled) / scale).tolist()
        margin = np.abs(scaled - np.floor(scaled) - 0.5)
        sure = (margin > np.abs(scaled) * 2.0 ** -51) & (np.abs(scaled) < _EXACT_LIMIT)
    for i in np.flatnonzero(~sure).tolist():
        out[i] = round(float(values[i]), digits)
    return out
