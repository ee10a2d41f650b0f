"""The terminal view wraps at words, never between a figure and its unit."""

import re

from analyzer.reports.wrap import WIDTH, wrap


def test_a_figure_keeps_its_unit_on_its_line():
    text = ("1 problem(s) found: Late ranks make the others wait at the collectives (about 34.0 ms of the "
            "179.7 ms typical step), 12.5 GB/s of 50 GB/s, 3.1 TFLOP/s, 9.2 pp and 2 s.")
    lines = wrap(text)
    assert all(len(line) <= WIDTH for line in lines)
    assert " ".join(lines) == text  # the words, spaces and order as they were
    for line in lines:
        assert not re.search(r"\d$", line), line  # no line ends on a figure whose unit went on
    assert "179.7 ms typical step" in " ".join(lines)


def test_words_that_start_like_units_are_not_glued():
    text = "x " * 45 + "8 steps and 2 sockets"
    assert " ".join(wrap(text, 100)) == text.strip()
    assert any(line.startswith("steps") or line.endswith("8") for line in wrap(text, 92))


def test_a_trace_holding_the_glue_character_is_wrapped_as_it_is():
    text = "kernel \ue000 name " * 10
    assert wrap(text, 40) == __import__("textwrap").wrap(text, 40)


def test_every_terminal_view_wraps_with_the_one_public_helper():
    """diff_text and gate_text imported text.py's private ``_wrap``; the what-if and ``rules``
    views wrapped with textwrap at a hard-coded 100: one public helper (analyzer.reports.wrap),
    and no module defines or imports a ``_wrap`` of its own."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for path in [*(root / "reports").glob("*.py"), *(root / "analyzer").rglob("*.py")]:
        source = path.read_text(encoding="utf-8")
        assert "import _wrap" not in source and "_wrap as" not in source, path
        if path.name != "wrap.py":
            assert "textwrap.wrap(" not in source, path
