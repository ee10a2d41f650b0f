"""Column helpers of the reduce: numpy arrays of the collective rows' fields, turned back into
the rows' Python values exactly as the row-by-row code produced them."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

# Beyond 2**50 a scaled value's fraction is no longer exact in a float: round it in Python.
_EXACT_LIMIT = 2.0 ** 50


def round_list(values: np.ndarray, digits: int = 3) -> list[float]:
    """``[round(float(v), digits) for v in values]``, bit for bit, at numpy speed.

    Python rounds the exact binary value half-to-even, then takes the float nearest the decimal
    (``k / 10**digits``). ``rint(v·10**digits) / 10**digits`` divides the same integer k exactly
    rounded, so it agrees whenever ``rint`` picks Python's k: always, except where ``v·10**digits``
    lies within its own rounding error (≤ |v·10**digits|·2⁻⁵³) of a half. Those values, and
    huge ones, are rounded by Python itself (NaN and ±inf stay as they are, as round() leaves them)."""
    values = np.asarray(values, dtype=np.float64)
    scale = 10.0 ** digits
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = values * scale
        out = (np.rint(scaled) / scale).tolist()
        margin = np.abs(scaled - np.floor(scaled) - 0.5)
        sure = (margin > np.abs(scaled) * 2.0 ** -51) & (np.abs(scaled) < _EXACT_LIMIT) | ~np.isfinite(values)
    for i in np.flatnonzero(~sure).tolist():
        out[i] = round(float(values[i]), digits)
    return out


def keys_per_group(rows: list[dict[str, Any]], key_of: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """``[key_of(row) for row in rows]`` for a key that depends on the row's process group only
    when the group has a name or ranks (else on the collective too): computed once per group
    object, which the map and the reduce share between rows (``analyzer.rank.comms.share_groups``)."""
    groups = [row.get("group") for row in rows]  # held: their ids stay unique
    ids = list(map(id, groups))
    memo = {}
    for ident, row in dict(zip(ids, rows)).items():  # one row of each group object
        group = row.get("group")
        named = group and (group.get("name") is not None or group.get("ranks"))
        memo[ident] = key_of(row) if named else _PER_ROW
    keys = list(map(memo.__getitem__, ids))
    if _PER_ROW in memo.values():
        for index in [i for i, key in enumerate(keys) if key is _PER_ROW]:
            keys[index] = key_of(rows[index])
    return keys


_PER_ROW = object()  # a group without name or ranks: the key depends on the row
