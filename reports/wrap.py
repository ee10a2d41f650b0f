"""Line breaking for the terminal views (text, diff, gate, what-if, hang): a page of ``WIDTH``
columns, broken at words, never between a figure and its unit, nor inside a word."""

from __future__ import annotations

import re
import textwrap
from typing import Any

WIDTH = 100
# A figure and its unit stay on one line ("179.7 ms", "34.2 GB/s"): the space between them is
# held as a private-use character while the text is wrapped.
_GLUE = "\ue000"
_FIGURE_UNIT = re.compile(r"(?<=\d) (?=(?:µs|ms|s|MB|KB|GB|TB|GB/s|TFLOP/s|[kMGT]?FLOP|pp|%)(?![\w/]))")


def wrap(text: str, width: int = WIDTH, **options: Any) -> list[str]:
    """``textwrap.wrap`` that never breaks a line between a figure and its unit, nor inside a
    word (a file path stays whole, on a line of its own when longer than the page)."""
    options.setdefault("break_long_words", False)
    options.setdefault("break_on_hyphens", False)
    if _GLUE in text:  # the trace itself holds the character: wrap as it is
        return textwrap.wrap(text, width, **options)
    glued = _FIGURE_UNIT.sub(_GLUE, text)
    return [line.replace(_GLUE, " ") for line in textwrap.wrap(glued, width, **options)]
