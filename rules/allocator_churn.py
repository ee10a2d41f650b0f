"""allocator-churn (TC603)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes
from analyzer.job.memory import not_checked, recorded_ranks
from analyzer.rules.evidence_types import Bytes, Count, Evidence, Share, label
from analyzer.rules.evidence_shared import RankNumber
from analyzer.rules.engine import NotApplicable, Rule, Threshold, register


class RankChurn(Evidence, frozen=True, forbid_unknown_fields=True):
    """A rank whose allocator frees segments and takes them again, or whose reserve creeps up."""

    rank: RankNumber
    steps: Annotated[Count, label("steps")]
    churn_steps: Annotated[list[Count], label("steps with segments freed and taken again")]
    released_bytes_per_step: Annotated[Bytes, label("released per step")]
    segment_grows: Annotated[list[Count], label("segments taken per step")]
    segment_releases: Annotated[list[Count], label("segments freed per step")]
    reserved_growth_bytes: Annotated[Bytes, label("reserved growth")]
    end_reserved_bytes: Annotated[list[Bytes], label("reserved at each step's end")]


class AllocatorChurnEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    ranks: Annotated[list[RankChurn], label("ranks")]
    min_step_share: Annotated[Share, label("least share of the steps that counts")]


@register
class AllocatorChurn(Rule):
    """The caching allocator gives memory back to the driver and takes it again, step after step.

    What it detects:
        From the allocator's ``Total Reserved`` (``profile_memory=True``): on a rank, in at least
        ``min_step_share`` of the steps after the first, reserved memory drops (segments freed:
        ``torch.cuda.empty_cache()``, or the allocator emptying its cache to retry a failed
        allocation) and grows again (new segments: ``cudaMalloc``); or reserved memory at the
        step's end grows step after step while allocated memory does not (fragmentation).

    Why it matters:
        ``cudaFree`` synchronizes the device and ``cudaMalloc`` is slow: each step pays both, on
        the critical path, for memory it will need again a moment later. Reserved memory that
        keeps growing ends in an out-of-memory error with free memory in the cache.

    Evidence:
        Per rank and step: segments taken and given back, the bytes released, reserved at the
        step's start and end.

    Fix:
        Remove ``torch.cuda.empty_cache()`` from the training loop (call it only between phases
        that need different memory); with fragmentation or retries,
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

    References:
        docs/models.md §9; PyTorch CUDA semantics: memory management (empty_cache,
        expandable_segments); ``torch.cuda.memory_stats`` (num_alloc_retries, segment counts).
    """

    name = "allocator-churn"
    code = "TC603"
    title = "The allocator keeps its cache"
    failure_title = "The allocator frees and re-takes device memory every step"
    severity = "warning"
    thresholds = {
        "min_step_share": Threshold(0.5, "share of the steps after the first with segments freed and taken "
                                    "again", 0.0, 1.0),
    }
    recovers = ("idle_us",)
    fix_requires = ()  # the caching allocator's settings apply to training and inference alike
    Evidence = AllocatorChurnEvidence
    references = ("docs/models.md §9", "PyTorch CUDA semantics: memory management (empty_cache, expandable_segments)",
                  "torch.cuda.memory_stats (num_alloc_retries, segment counts)")

    def check(self, ctx):
        ranks = [m for m in recorded_ranks(ctx.result.memory, absolute=True) if m["device_type"] != "cpu"]
        if not ranks:
            raise NotApplicable(not_checked(ctx.result.memory))
        hit = [row for row in (_churn(m, ctx.thresholds["min_step_share"]) for m in ranks) if row]
        if not hit:
            return []
        worst = max(hit, key=lambda r: (r.released_bytes_per_step, r.rank * -1))
        if worst.churn_steps:
            summary = (f"Rank {worst.rank} gives {fmt_bytes(worst.released_bytes_per_step)} of cached memory back "
                       f"to the driver and takes new segments again in {len(worst.churn_steps)} of its "
                       f"{worst.steps - 1} steps after the first ({len(hit)} rank(s)): each cudaFree synchronizes "
                       "the device")
        else:
            summary = (f"Rank {worst.rank}'s reserved memory grows by {fmt_bytes(worst.reserved_growth_bytes)} "
                       f"over {worst.steps} steps while allocated memory does not ({len(hit)} rank(s)): fragmentation")
        return [ctx.finding(summary=summary + ".", ranks=sorted(r.rank for r in hit),
                            steps=sorted({s for r in hit for s in r.churn_steps}),
                            evidence=AllocatorChurnEvidence(hit, ctx.thresholds["min_step_share"]),
                            estimated_gain_us=None,
                            model="per step: reserved drops (segments released) and grows (segments taken) between "
                                  "consecutive allocator events",
                            fix_text=("Remove torch.cuda.empty_cache() from the training loop; with fragmentation or "
                                      "allocation retries set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."),
                            fix_snippet="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")]


def _churn(rank: dict, min_share: float) -> RankChurn | None:
    steps = sorted((s for s in rank["steps"] if s.get("start_reserved_bytes") is not None), key=lambda s: s["step"])
    if len(steps) < 2:
        return None
    later = steps[1:]  # the first step may fill the cache the profiler found empty
    churn = [s for s in later if s["segment_releases"] and s["segment_grows"]]
    ends = [s["end_reserved_bytes"] for s in steps]
    allocated = [s["end_allocated_bytes"] for s in steps]
    creeping = (len(steps) >= 3 and all(b > a for a, b in zip(ends, ends[1:]))
                and not any(b > a for a, b in zip(allocated, allocated[1:])))
    churning = bool(churn) and len(churn) >= min_share * len(later)
    if not (churning or creeping):
        return None
    churn = churn if churning else []
    released = [s["released_bytes"] for s in churn]
    return RankChurn(rank=rank["rank"], steps=len(steps), churn_steps=[s["step"] for s in churn],
                     released_bytes_per_step=round(sum(released) / len(released)) if released else 0,
                     segment_grows=[s["segment_grows"] for s in steps],
                     segment_releases=[s["segment_releases"] for s in steps],
                     reserved_growth_bytes=ends[-1] - ends[0], end_reserved_bytes=ends)
