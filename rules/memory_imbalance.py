"""memory-imbalance (TC604)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes
from analyzer.job.memory import not_checked, recorded_ranks, share_text
from analyzer.rules.engine import NotApplicable, Rule, Threshold, register
from analyzer.rules.evidence_types import Bytes, Count, Evidence, keys, label
from analyzer.rules.evidence_shared import DeviceMemory, RankNumber


class RankPeak(Evidence, frozen=True, forbid_unknown_fields=True):
    rank: RankNumber
    bytes: Annotated[Bytes, label("bytes")]


class MemoryImbalanceEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    peak_bytes_by_rank: Annotated[dict[str, Bytes], label("peak per rank"), keys("rank")]
    highest: Annotated[RankPeak, label("highest peak")]
    lowest: Annotated[RankPeak, label("lowest peak")]
    ratio: Annotated[Count, label("highest peak over the lowest")]
    device_bytes: DeviceMemory


@register
class MemoryImbalance(Rule):
    """Some ranks (pipeline stages, embedding shards) peak far above the others.

    What it detects:
        From the allocator's events (``profile_memory=True``, totals comparable across ranks):
        the highest peak of any rank is at least ``ratio`` times the lowest rank's, and fills
        at least ``min_device_fraction`` of its GPU.

    Why it matters:
        The fullest rank decides the largest micro-batch, sequence and sharding the whole job can
        use; the memory the others leave free is wasted. In a pipeline the first stages hold
        the activations of more micro-batches in flight (1F1B: p − i of them at stage i).

    Evidence:
        Every rank's peak allocated and reserved bytes, the highest and lowest, their ratio.

    Fix:
        Balance what each rank holds: move layers from the fullest pipeline stage (or give the
        embedding / head stage fewer layers), spread embedding tables evenly, checkpoint
        activations on the fullest stages only.

    References:
        docs/models.md §9; Narayanan et al., "Efficient Large-Scale Language Model Training
        on GPU Clusters Using Megatron-LM", SC 2021 (1F1B in-flight micro-batches).
    """

    name = "memory-imbalance"
    code = "TC604"
    title = "Memory is balanced across ranks"
    failure_title = "Some ranks use much more memory than others"
    severity = "info"
    thresholds = {
        "ratio": Threshold(1.25, "highest over lowest rank peak from which memory is imbalanced", 1.0, 100.0),
        "min_device_fraction": Threshold(0.5, "share of the GPU the fullest rank must fill for the imbalance to "
                                         "matter", 0.0, 1.0),
    }
    recovers = ("idle_us",)
    fix_requires = ()  # balancing what each rank holds applies to training and inference alike
    references = ("docs/models.md §9", "Narayanan et al., Megatron-LM, SC 2021")
    Evidence = MemoryImbalanceEvidence

    def check(self, ctx):
        ranks = recorded_ranks(ctx.result.memory, absolute=True)
        if len(ranks) < 2:
            raise NotApplicable("one rank: nothing to compare" if ranks else not_checked(ctx.result.memory))
        peaks = sorted(((max(s["peak_reserved_bytes"] or s["peak_allocated_bytes"] or 0 for s in m["steps"]), m["rank"],
                         m.get("device_bytes")) for m in ranks), key=lambda p: (p[0], -p[1]))
        (low, low_rank, _), (high, high_rank, device) = peaks[0], peaks[-1]
        t = ctx.thresholds
        if not low or high < t["ratio"] * low or not device or high < t["min_device_fraction"] * device:
            return []
        over = [r for p, r, _ in peaks if p >= t["ratio"] * low]
        summary = (f"Rank {high_rank}'s memory peaks at {share_text(high, device)} of its GPU, {high / low:.2f}× "
                   f"rank {low_rank}'s {fmt_bytes(low)}: {len(over)} rank(s) at {t['ratio']:g}× the lowest or more.")
        return [ctx.finding(summary=summary, ranks=sorted(over), steps=[], estimated_gain_us=None,
                            evidence=MemoryImbalanceEvidence(
                                peak_bytes_by_rank={str(r): p for p, r, _ in sorted(peaks, key=lambda p: p[1])},
                                highest=RankPeak(high_rank, high), lowest=RankPeak(low_rank, low),
                                ratio=round(high / low, 3), device_bytes=device),
                            model="ratio = highest rank peak / lowest rank peak (reserved where recorded)",
                            fix_text="Balance what each rank holds: move layers off the fullest pipeline stage, "
                                     "spread embedding tables evenly, checkpoint activations on the fullest stages.",
                            fix_snippet=None)]
