"""What counts as a number in a document: an int or float that is finite, never a bool (JSON's
``true`` is Python's 1). One definition for every reader of saved results, gate and diff
documents, and the views, so a value one of them takes as a figure none of them drops."""

from __future__ import annotations

import math
from typing import Any


def is_finite_number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond every float: no quantity a trace can have
        return False


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    return float(value) if is_finite_number(value) else None


def sourced(value: Any) -> Any:
    """The value of a ``Sourced`` record (a dict with its ``value`` and where it came from), or
    ``value`` itself when it is given plain: one reading for every view and analysis."""
    return value.get("value") if isinstance(value, dict) else value


def sourced_figure(value: Any) -> float | None:
    """The value of a figure given plain or as a ``Sourced`` record: a float when finite, else None."""
    return finite(sourced(value))
