"""Was the hang's culprit already the late rank before it hung? Read from what the trace analysis
said of the same job's Kineto traces (passed in as plain data by analyzer.api.hang_trace_link:
this layer does not import the trace analysis).

Who was late is the trace analysis' call, not this module's: the ranks the ``straggler-rank``
rule flagged when it ran, else (CPU-only traces, where it does not run) the ranks the cross-rank
arrival order calls consistently last (``late_ranks``). The per-step detail comes from the
straggler summary: in each profiled step, the rank whose late arrival made the others wait
longest (``per_step[].last_rank``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from analyzer.hang.words import span


def straggler_history(link: dict[str, Any], culprits: list[int]) -> dict[str, Any]:
    """``link``: {"traces", "world_size", "stragglers" (the summary), "rule" ({"status",
    "ranks", "summary", "reason"} of straggler-rank), "late_ranks" ({rank: why})}."""
    section = link.get("stragglers") or {}
    steps = [s for s in section.get("per_step") or [] if isinstance(s, dict) and _is_rank(s.get("last_rank"))]
    compared = [r for r in section.get("ranks_compared") or [] if _is_rank(r)]
    late, source = _late(link)
    by_step = Counter(s["last_rank"] for s in steps)
    out: dict[str, Any] = {"traces": list(link.get("traces") or []), "world_size": link.get("world_size"),
                           "steps": [s.get("step") for s in steps], "late_ranks": late, "source": source,
                           "culprits": {}}
    for rank in culprits:
        out["culprits"][str(rank)] = {"traced": rank in compared, "already_late": rank in late,
                                      "why": late.get(rank),
                                      "late_steps": [s.get("step") for s in steps if s["last_rank"] == rank],
                                      "of_steps": len(steps)}
    out["statement"] = _statement(out, culprits, compared, by_step, section)
    return out


def _late(link: dict[str, Any]) -> tuple[dict[int, str], str]:
    rule = link.get("rule") or {}
    if rule.get("status") == "fired":
        why = rule.get("summary") or "flagged by the straggler-rank rule"
        return {r: why for r in rule.get("ranks") or [] if _is_rank(r)}, "the straggler-rank rule"
    if rule.get("status") == "passed":
        return {}, "the straggler-rank rule (no late rank)"
    late = {int(r): str(why) for r, why in (link.get("late_ranks") or {}).items() if str(r).isdigit()}
    reason = f": {rule['reason']}" if rule.get("reason") else ""
    return late, f"the cross-rank arrival order (the straggler-rank rule did not run{reason})"


def _statement(out: dict[str, Any], culprits: list[int], compared: list[int], by_step: Counter,
               section: dict[str, Any]) -> str:
    if not compared:
        return f"the Kineto traces hold no straggler history ({section.get('note') or 'no matched collective'})"
    n = len(out["steps"])
    others = sorted(r for r in out["late_ranks"] if r not in culprits)
    parts = []
    for rank in culprits:
        info = out["culprits"][str(rank)]
        if not info["traced"]:
            parts.append(f"rank {rank} is not in the Kineto traces (ranks {span(compared)})")
        elif info["already_late"]:
            steps = f"the last in {len(info['late_steps'])} of {n} steps: " if n else ""
            parts.append(f"rank {rank} was already the late rank in the profiled steps ({steps}{info['why']})")
        elif others:
            who = f"rank {others[0]} was" if len(others) == 1 else f"ranks {span(others)} were"
            parts.append(f"rank {rank} was not the late rank in the profiled steps: {who} "
                         f"({out['late_ranks'][others[0]]})")
        else:
            parts.append(f"rank {rank} was not the late rank in the profiled steps (no rank was, by "
                         f"{out['source']})")
    return "; ".join(parts)


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
