"""Was the hang's culprit already the late rank before it hung? Read from the straggler summary
of the same job's Kineto traces (the ``stragglers`` section of a diagnosed Result, passed in as
plain data: this layer does not import the trace analysis).

The summary's ``per_step`` names, for each profiled step, the rank whose late arrival made the
others wait longest (``last_rank``); ``by_rank`` counts how often each rank arrived last at a
matched collective (``times_last``). A culprit is called already late when it was that rank in at
least half of the profiled steps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

ALREADY_LATE_SHARE = 0.5


def straggler_history(link: dict[str, Any], culprits: list[int]) -> dict[str, Any]:
    """``link``: {"traces": [paths], "world_size": int | None, "stragglers": dict | None}."""
    section = link.get("stragglers") or {}
    steps = [s for s in section.get("per_step") or [] if isinstance(s, dict) and _is_rank(s.get("last_rank"))]
    compared = [r for r in section.get("ranks_compared") or [] if _is_rank(r)]
    by_rank = {row["rank"]: row for row in section.get("by_rank") or [] if isinstance(row, dict) and _is_rank(row.get("rank"))}
    late = Counter(s["last_rank"] for s in steps)
    late_rank = min(late, key=lambda r: (-late[r], r)) if late else None
    out: dict[str, Any] = {"traces": list(link.get("traces") or []), "world_size": link.get("world_size"),
                           "steps": [s.get("step") for s in steps], "late_rank": late_rank,
                           "late_rank_steps": late.get(late_rank, 0) if late_rank is not None else 0,
                           "matched_collectives": section.get("matched_collectives"), "culprits": {}}
    if not steps:
        why = section.get("note") or "no profiled step with a matched collective"
        out["statement"] = f"the Kineto traces hold no straggler history ({why})"
        return out
    for rank in culprits:
        mine = [s.get("step") for s in steps if s["last_rank"] == rank]
        row = by_rank.get(rank, {})
        out["culprits"][str(rank)] = {
            "traced": rank in compared, "late_steps": mine, "of_steps": len(steps),
            "times_last": row.get("times_last"), "wait_caused_us": row.get("wait_caused_us"),
            "already_late": bool(mine) and len(mine) >= ALREADY_LATE_SHARE * len(steps)}
    out["statement"] = _statement(out, culprits, compared)
    return out


def _statement(out: dict[str, Any], culprits: list[int], compared: list[int]) -> str:
    n = len(out["steps"])
    parts = []
    for rank in culprits:
        info = out["culprits"][str(rank)]
        if not info["traced"]:
            parts.append(f"rank {rank} is not in the Kineto traces (ranks {_span(compared)})")
        elif info["already_late"]:
            last = info["times_last"]
            matched = out["matched_collectives"]
            tail = f", last to arrive at {last} of {matched} matched collectives" if last is not None and matched else ""
            parts.append(f"rank {rank} was already the late rank in the profiled steps "
                         f"({len(info['late_steps'])} of {n}{tail})")
        else:
            other = out["late_rank"]
            parts.append(f"rank {rank} was not the late rank in the {n} profiled steps"
                         + (f" (rank {other} was, in {out['late_rank_steps']} of {n})" if other is not None else ""))
    return "; ".join(parts)


def _span(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
