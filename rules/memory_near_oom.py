"""memory-near-oom (TC601)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes
from analyzer.job.memory import not_checked, recorded_ranks, share_text
from analyzer.rules.evidence_types import Bytes, Evidence, Share, Text, label
from analyzer.rules.evidence_shared import DeviceMemory, RankNumber, StepNumber
from analyzer.rules.engine import NotApplicable, Rule, Threshold, register



class NearOomPeak(Evidence, frozen=True, forbid_unknown_fields=True):
    """A rank's step of highest reserved memory, with the cache at its allocated peak."""

    rank: RankNumber
    step: StepNumber
    peak_reserved_bytes: Annotated[Bytes, label("peak reserved")]
    peak_allocated_bytes: Annotated[Bytes, label("peak allocated")]
    device_bytes: DeviceMemory
    cached_bytes: Annotated[Bytes, label("cached but unused at the peak")]
    cached_share: Annotated[Share, label("cached share of reserved")]
    phase: Annotated[Text, label("phase")]


class MemoryNearOomEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    ranks: Annotated[list[NearOomPeak], label("ranks")]
    reserved_fraction: Annotated[Share, label("reserved share of the GPU that counts as near")]
    cached_fraction: Annotated[Share, label("cached share that counts as fragmentation")]

@register
class MemoryNearOom(Rule):
    """A rank's memory peaks at the edge of its GPU, or the allocator holds much it cannot use.

    What it detects:
        From the allocator's events (``profile_memory=True``): a rank whose peak reserved memory
        (what the caching allocator holds from the driver) reaches ``reserved_fraction`` of the
        GPU's ``totalGlobalMem``, or whose reserved memory at the allocated peak is cached but
        unused (reserved − allocated) for at least ``cached_fraction`` of it: fragmentation.

    Why it matters:
        At the edge of the device the next larger batch, sequence or a fix that adds memory
        (HYBRID_SHARD, DDP, prefetch) runs out of memory; before it does, the allocator frees
        its cache and retries (``cudaFree`` synchronizes the device: stalls in the step).
        Memory cached in blocks too fragmented to reuse is lost to the job.

    Evidence:
        Per rank: the peak reserved and allocated bytes, their share of the device, the cached
        bytes at the peak, the step and the phase of the peak.

    Fix:
        Fragmentation: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Pressure: fewer
        saved activations (activation checkpointing, a smaller micro-batch with gradient
        accumulation) or more sharding (FSDP FULL_SHARD, ZeRO-1/2 for DDP's optimizer state).

    References:
        docs/models.md §9; PyTorch CUDA semantics, memory management
        (expandable_segments); Rajbhandari et al., ZeRO, SC 2020.
    """

    name = "memory-near-oom"
    code = "TC601"
    title = "GPU memory has room"
    failure_title = "GPU memory is near its limit or fragmented"
    severity = "warning"
    thresholds = {
        "reserved_fraction": Threshold(0.9, "peak reserved memory, as a fraction of the GPU's, from which "
                                       "a rank is near out of memory", 0.0, 1.0),
        "cached_fraction": Threshold(0.2, "cached but unused share of reserved memory at the allocated peak "
                                     "from which the cache counts as fragmented", 0.0, 1.0),
    }
    recovers = ("idle_us",)
    fix_requires = ()  # its fix follows the measured fragmentation (no job premise)
    Evidence = MemoryNearOomEvidence
    references = ("docs/models.md §9", "PyTorch CUDA semantics: memory management (expandable_segments)",
                  "Rajbhandari et al., ZeRO, SC 2020")

    def check(self, ctx):
        ranks = recorded_ranks(ctx.result.memory, absolute=True)
        if not ranks:
            raise NotApplicable(not_checked(ctx.result.memory))
        t = ctx.thresholds
        hit = [row for row in map(_peak, ranks) if row and (
            row.device_bytes and row.peak_reserved_bytes >= t["reserved_fraction"] * row.device_bytes
            or row.cached_share >= t["cached_fraction"])]
        if not hit:
            return []
        worst = max(hit, key=lambda r: (r.peak_reserved_bytes / (r.device_bytes or r.peak_reserved_bytes),
                                        -r.rank))
        fragmented = [r for r in hit if r.cached_share >= t["cached_fraction"]]
        summary = (f"Rank {worst.rank}'s reserved memory peaks at "
                   f"{share_text(worst.peak_reserved_bytes, worst.device_bytes)} of its GPU in step {worst.step}"
                   f" ({len(hit)} rank(s) near the limit or fragmented)")
        if fragmented:
            f = max(fragmented, key=lambda r: (r.cached_share, -r.rank))
            summary += (f"; at rank {f.rank}'s allocated peak {fmt_bytes(f.cached_bytes)} "
                        f"({100 * f.cached_share:.0f}% of reserved) is cached but unused: fragmentation")
        summary += "."
        fix = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the cache is fragmented)." if fragmented else
               "Save fewer activations (activation checkpointing, a smaller micro-batch with gradient "
               "accumulation) or shard more state (FSDP FULL_SHARD, ZeRO) before adding memory.")
        return [ctx.finding(summary=summary, ranks=sorted(r.rank for r in hit), steps=sorted({r.step for r in hit}),
                            evidence=MemoryNearOomEvidence(hit, t["reserved_fraction"], t["cached_fraction"]),
                            estimated_gain_us=None,
                            model=(f"peak reserved ≥ {t['reserved_fraction']:g}·device, or (reserved − allocated) "
                                   f"at the allocated peak ≥ {t['cached_fraction']:g}·reserved"),
                            fix_text=fix,
                            fix_snippet=("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" if fragmented else
                                         "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
                                         "apply_activation_checkpointing\napply_activation_checkpointing(model)"))]


def _peak(rank: dict) -> NearOomPeak | None:
    """The rank's step of highest reserved memory, with the cache at its allocated peak."""
    steps = [s for s in rank["steps"] if s.get("peak_reserved_bytes") is not None]
    if not steps:
        return None
    step = max(steps, key=lambda s: (s["peak_reserved_bytes"], -s["step"]))
    at_peak = step.get("reserved_at_peak_bytes") or step["peak_reserved_bytes"]
    cached = max(0, at_peak - step["peak_allocated_bytes"])
    return NearOomPeak(rank=rank["rank"], step=step["step"], peak_reserved_bytes=step["peak_reserved_bytes"],
                       peak_allocated_bytes=step["peak_allocated_bytes"], device_bytes=rank.get("device_bytes"),
                       cached_bytes=cached, cached_share=round(cached / at_peak, 4) if at_peak else 0.0,
                       phase=(step.get("peak_at") or {}).get("phase"))
