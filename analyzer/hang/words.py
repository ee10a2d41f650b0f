"""The words of ``tracecliff hang``'s report: how an op, a process group, a call, a time and a
piece of evidence are said. The verdict's sentences (analyzer.hang) and the report's text and
HTML views (analyzer.reports.hang_text, analyzer.reports.hang_html) say them alike; labels only,
no analysis, so the views may import them (tests/test_architecture.py, VIEW_MAY_IMPORT)."""

from __future__ import annotations

import time
from typing import Any


def span(ranks: list[int]) -> str:
    """"0-7" for a run of ranks, else "0, 2, 5"."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def op_text(op: str, parts: list[str] | None = None) -> str:
    """``coalesced[all_reduce x3]`` for a coalesced group, else the op."""
    if not parts:
        return op
    counts: dict[str, int] = {}
    for name in parts:
        counts[name] = counts.get(name, 0) + 1
    return f"{op}[{', '.join(f'{n} x{c}' if c > 1 else n for n, c in sorted(counts.items()))}]"


def pg_label(g: dict[str, Any]) -> str:
    """A process group in words: its description and pg name ("group dp (pg 0)"), else its name
    (not the job model's ``group_label``, the name a group goes by in the breakdowns)."""
    return f"group {g['description']} (pg {g['name']})" if g["description"] else f"group {g['name']}"


def evidence_lines(evidence: dict[str, dict[str, Any]]) -> list[str]:
    """"ranks 0-2: its entry is started" per distinct piece of evidence (a report's
    ``detail.evidence``: rank -> Progress.to_dict()), in rank order of first appearance."""
    by_how: dict[str, list[int]] = {}
    for rank, info in sorted(evidence.items(), key=lambda kv: int(kv[0])):
        by_how.setdefault(str(info.get("how", "")), []).append(int(rank))
    return [f"{'rank' if len(ranks) == 1 else 'ranks'} {span(ranks)}: {how}" for how, ranks in by_how.items()]


def call_text(call: dict[str, Any]) -> str:
    parts = [c["op"] for c in call.get("coalesced") or []]
    return f"{op_text(call['op'], parts)}(sizes {call['input_sizes']}, {'/'.join(call['input_dtypes']) or '?'})"


def clock(ns: int | None) -> str:
    if not ns:
        return "an unknown time"
    return time.strftime("%H:%M:%S UTC", time.gmtime(ns / 1e9))
