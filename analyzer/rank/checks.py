"""Warnings for traces that are usable but incomplete: the result stays correct for what the
trace holds, and says plainly which figures are partial (no number is ever silently wrong)."""

from __future__ import annotations

from typing import Any

from analyzer.base import intervals as iv
from analyzer.base.rowtable import RowTable
from analyzer.rank.timeline import NO_STEP, Attribution
from analyzer.ingest.trace import GpuEvents, GpuKind


def partial_result_warnings(gpu: GpuEvents, att: Attribution, steps: list[dict[str, Any]],
                            collectives: RowTable | list[dict[str, Any]], step_name: str = "ProfilerStep") -> list[str]:
    """``step_name``: what the steps are (ProfilerStep, or "step" where they were found otherwise)."""
    warnings = []
    outside = att.step == NO_STEP
    if steps and outside.any():
        busy = iv.total(iv.union(gpu.ts[outside], gpu.end[outside])) / 1000.0
        warnings.append(f"{int(outside.sum())} GPU event(s) ({busy:,.1f} µs busy) ran outside every "
                        f"{step_name}: counted in the whole-trace figures, in no step's")
    linked = att.launch_thread >= 0
    comm = gpu.kind == GpuKind.COMM
    unlinked_comm = int((comm & ~linked).sum())
    if unlinked_comm and linked.any():  # all-unlinked traces get one warning of their own
        warnings.append(f"{unlinked_comm} communication kernel(s) have no CPU-side launch link: their "
                        "step and phase come from stream order and their size only from the kernel itself")
    unknown = collectives.values("bytes").count(None) if isinstance(collectives, RowTable) \
        else sum(1 for row in collectives if row.get("bytes") is None)
    if unknown:
        warnings.append(f"{unknown} of {len(collectives)} collective(s) have an unknown message size "
                        "(no element count or an unrecognised dtype): bytes left empty, never guessed")
    return warnings
