"""memory-growth (TC602)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes
from analyzer.job.memory import NOT_RECORDED, recorded_ranks
from analyzer.rules.evidence_types import Bytes, Count, Evidence, Flag, Share, Text, label
from analyzer.rules.evidence_shared import RankNumber
from analyzer.rules.engine import NotApplicable, Rule, Threshold, register


class RankGrowth(Evidence, frozen=True, forbid_unknown_fields=True):
    """A rank whose allocated memory at the step's end grows every step."""

    rank: RankNumber
    steps: Annotated[Count, label("steps")]
    step_numbers: Annotated[list[Count], label("steps")]
    end_allocated_bytes: Annotated[list[Bytes], label("allocated at each step's end")]
    growth_per_step_bytes: Annotated[Bytes, label("growth per step")]
    relative: Annotated[Flag, label("relative to the profiler's start")]
    basis: Annotated[Text, label("basis")]
    headroom_bytes: Annotated[Bytes, label("headroom")]
    steps_to_device_limit: Annotated[Count, label("steps to the device's limit")]


class MemoryGrowthEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    ranks: Annotated[list[RankGrowth], label("ranks")]
    min_steps: Annotated[Count, label("least steps")]
    min_growth_fraction: Annotated[Share, label("least growth that counts")]


@register
class MemoryGrowth(Rule):
    """Allocated memory grows step after step: something keeps tensors from every step.

    What it detects:
        From the allocator's events (``profile_memory=True``): on a rank, the memory allocated
        at each step's end is higher than at the previous step's end in every one of at least
        ``min_steps`` consecutive steps, by ``min_growth_fraction`` of the peak per step or more.
        Bytes-only traces (relative figures) count too: growth needs no absolute level.

    Why it matters:
        A training step should end holding what it started with (parameters, gradients,
        optimizer state). Memory that grows each step is a leak (a loss kept with its graph, a
        list of tensors, a cache keyed by step): the job runs out of memory after a number of
        steps the headroom tells, and before that the allocator thrashes.

    Evidence:
        Per rank: allocated at each step's end, the growth per step, the headroom to the device
        and the steps left before the peak reaches it (allocator totals only).

    Fix:
        Keep no tensor across steps: ``loss.item()`` (not ``loss``) into running metrics,
        ``detach()`` what is stored, clear lists and caches each step.

    References:
        docs/models.md §9; PyTorch FAQ: "My model reports cuda runtime error(2): out of
        memory" (accumulating history across the training loop).
    """

    name = "memory-growth"
    code = "TC602"
    title = "Memory returns to its level every step"
    failure_title = "Allocated memory grows step after step (a leak)"
    severity = "warning"
    thresholds = {
        "min_steps": Threshold(3, "consecutive steps whose end must each hold more than the previous one", 2, 1000),
        "min_growth_fraction": Threshold(0.001, "growth per step, as a fraction of the rank's peak, below which "
                                         "the growth is noise", 0.0, 1.0),
    }
    recovers = ("idle_us",)
    fix_requires = ("training",)  # accumulating loss.item() and per-step tensors of a training loop
    Evidence = MemoryGrowthEvidence
    references = ("docs/models.md §9", "PyTorch FAQ: accumulating history across the training loop")

    def check(self, ctx):
        ranks = recorded_ranks(ctx.result.memory)
        if not ranks:
            raise NotApplicable(NOT_RECORDED)
        t = ctx.thresholds
        hit = [row for row in (_growth(m, int(t["min_steps"]), t["min_growth_fraction"]) for m in ranks) if row]
        if not hit:
            return []
        worst = max(hit, key=lambda r: (r.growth_per_step_bytes, -r.rank))
        left = worst.steps_to_device_limit
        summary = (f"Allocated memory at the step's end grows by {fmt_bytes(worst.growth_per_step_bytes)} a step on "
                   f"rank {worst.rank} ({len(hit)} rank(s)), in each of {worst.steps} steps"
                   + (f": at this pace the peak reaches the GPU's memory in about {left:,} more steps" if left is not None
                      else (f" (relative figures: {worst.basis})" if worst.relative else ""))
                   + ".")
        return [ctx.finding(summary=summary, ranks=sorted(r.rank for r in hit),
                            steps=sorted({s for r in hit for s in r.step_numbers}),
                            evidence=MemoryGrowthEvidence(hit, t["min_steps"], t["min_growth_fraction"]),
                            estimated_gain_us=None,
                            model="growth per step = (allocated at the last step's end − at the first's) / (steps − 1); "
                                  "steps left = headroom / growth per step",
                            fix_text="Keep no tensor from one step to the next: accumulate loss.item(), "
                                     "detach() what is stored, clear per-step lists and caches.",
                            fix_snippet="running_loss += loss.item()  # not: running_loss += loss")]


def _growth(rank: dict, min_steps: int, min_fraction: float) -> RankGrowth | None:
    steps = sorted(rank["steps"], key=lambda s: s["step"])
    ends = [s["end_allocated_bytes"] for s in steps]
    if len(steps) < min_steps or None in ends:
        return None
    peak = max(s["peak_allocated_bytes"] or 0 for s in steps)
    per_step = (ends[-1] - ends[0]) / (len(ends) - 1)
    if not all(b > a for a, b in zip(ends, ends[1:])) or per_step < min_fraction * max(peak, 1):
        return None
    headroom = steps[-1].get("headroom_bytes")
    return RankGrowth(rank=rank["rank"], steps=len(steps), step_numbers=[s["step"] for s in steps],
                      end_allocated_bytes=ends, growth_per_step_bytes=round(per_step), relative=rank["relative"],
                      basis=rank.get("basis"), headroom_bytes=headroom,
                      steps_to_device_limit=int(headroom // per_step) if headroom is not None and headroom > 0 else None)
