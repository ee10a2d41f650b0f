"""gpu-idle-host-bound (TC303)."""

from __future__ import annotations

from typing import Annotated

from analyzer.rules.engine import Fix, NotEvaluated, Rule, Threshold, register
from analyzer.base.units import fmt_us
from analyzer.job.facts import median
from analyzer.job.model import HOST_ACTIVITY
from analyzer.rules.host import (HOST_SNIPPET, REPLAY_GAIN, host_fix, idle_split_note, ranks_phrase,
                                 replayed_rank_fixes)
from analyzer.rules.evidence_types import UNSET, Count, Evidence, Share, Text, UnsetType, Us, inner, keys, label
from analyzer.rules.evidence_shared import Prediction, StepNumber, StepTimeOfThoseRanks, TypicalStep


class InflatedHostOp(Evidence, frozen=True, forbid_unknown_fields=True):
    """A host op far beyond its usual length (the rank analysis's, handed on as its dict)."""

    longest_us: Annotated[Us, label("longest")]
    usual_us: Annotated[Us, label("usual")]


class AllocatorCalls(Evidence, frozen=True, forbid_unknown_fields=True):
    """One allocator call's count and host time in a rank's typical step (handed on as its dict)."""

    calls: Annotated[Count, label("calls")]
    host_us: Annotated[Us, label("host time")]


class HostBoundIdleEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    step: StepNumber
    host_idle_share_by_rank: Annotated[dict[str, Share], label("idle share per rank"), keys("rank")]
    host_idle_us_median: Annotated[Us, label("GPU idle, nothing launched (median)")]
    idle_us_median: Annotated[Us, label("GPU idle (median)")]
    step_time_us: TypicalStep
    step_time_us_median_of_those_ranks: StepTimeOfThoseRanks
    idle_by_host_median_us: Annotated[dict[str, Us], label("idle by host activity (median)"), keys("host activity")]
    host_activity: Annotated[Text, label("host activity")]
    late_ranks_idle: Annotated[Text, label("idle on late ranks")]
    idle_split: Annotated[Text | UnsetType, label("idle split")] = UNSET
    inflated_host_ops: Annotated[dict[str, InflatedHostOp] | UnsetType, label("host ops far beyond their usual time"),
                                 keys("op")] = UNSET
    allocator_calls: Annotated[dict[str, dict[str, AllocatorCalls]] | UnsetType,
                               label("allocator calls per rank (by op)"), keys("rank"), inner("op")] = UNSET
    own_work_by_phase_us: Annotated[dict[str, Us] | UnsetType, label("host's own work by phase"), keys("phase")] = UNSET
    own_work_phase: Annotated[Text | UnsetType, label("phase of most own work")] = UNSET
    workload: Annotated[Text | UnsetType, label("workload")] = UNSET
    prediction: Prediction | UnsetType = UNSET


@register
class GpuIdleHostBound(Rule):
    """The GPU sits idle for lack of work for a large part of every step: the host, not the GPU
    or the network, sets the pace.

    What it detects:
        Ranks whose GPU runs no kernel, copy or collective, with nothing launched for it to run,
        for at least ``idle_fraction`` of the typical step (the host part of the step window's
        idle leaf: each idle gap until the launch of the work that ends it, analyzer.rank
        .attribution), on any rank: idle on a late rank is what the others then wait for.
        Waiting for another rank happens inside NCCL kernels and is not idle; idle with work
        already launched and waiting behind a dependency is gpu-idle-queued's. The host part is
        split by what the host's CPU trace shows meanwhile: the data loader, a blocking device
        sync (``.item()``, ``.cpu()``, ``torch.cuda.synchronize``, a copy to pageable memory),
        the device allocator (``cudaFree`` / ``hipFree`` / ``cudaMalloc`` ..., each free a sync),
        ordinary host ops running far past their usual length (CPU contention), FSDP's hooks,
        kernel launches, other work.

    Why it matters:
        Time the GPU does not run is lost whatever the parallel strategy; communication tuning
        cannot recover it, and it grows in relative terms as per-GPU work shrinks when scaling
        out (strong scaling), which makes small models look like a network problem.

    Evidence:
        Each rank's host-caused idle share of the typical step, and the host idle split by host
        activity on the ranks that fire (with the inflated host ops when contention leads, the
        host's own work by phase when it leads); a
        caveat when the trace cannot tell host-caused from queued idle (a filtered trace).

    Fix:
        Follows the largest host leaf: a faster data loader for input, removing the sync for a
        device sync (a faster data loader does not fix that), the caching allocator for allocator
        stalls (no PYTORCH_NO_CUDA_MEMORY_CACHING, no ``empty_cache`` in the loop,
        ``expandable_segments``, buffers allocated once), pinning threads and thread counts
        for CPU contention, coarser FSDP units for FSDP overhead, ``torch.compile`` / CUDA
        graphs for launch-bound steps. The rest is the host's own work, placed by the phase of
        the work it launched next: in forward or backward, per-op host overhead (``torch.compile``,
        CUDA graphs, more GPU work per op); in the optimizer step, a fused or foreach optimizer;
        outside them, profiling the host (logging, checkpointing, evaluation). On an inference job
        (no backward pass, no optimizer step: analyzer.rank.workload), the host's own work and
        launch overhead get inference's fix instead: CUDA graphs, ``torch.compile``, larger
        batches, fewer host syncs (never the training loop's logging or checkpointing).

    References:
        docs/models.md §6 (compute, MFU: idle time lowers MFU directly); HTA idle-time
        breakdown (Holistic Trace Analysis); Li et al., VLDB 2020.
    """

    name = "gpu-idle-host-bound"
    code = "TC303"
    title = "The GPU is kept busy"
    failure_title = "The GPU is idle for lack of work for much of each step: the host is the bottleneck"
    severity = "warning"
    needs = ("gpu_steps",)
    fix_requires = ()  # each of its fixes declares its own (a Fix's requires)
    thresholds = {
        "idle_fraction": Threshold(0.25, "GPU idle time, as a fraction of the typical step on a "
                                   "rank, from which the rule fires for that rank", 0.0, 1.0),
    }
    recovers = ("idle_us", "exposed_wait_us")  # on some ranks only: the others wait for them
    references = ("docs/models.md §6", "Holistic Trace Analysis: idle time breakdown",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    Evidence = HostBoundIdleEvidence

    def check(self, ctx):
        rows = [(r.rank, r.time_breakdown) for r in ctx.result.ranks if r.time_breakdown]
        if not rows:
            raise NotEvaluated("no time breakdown of a typical step (no GPU steps on any rank)")
        shares = {rank: host_idle_us(tb) / tb["step_time_us"] for rank, tb in rows if tb["step_time_us"]}
        hit = sorted(rank for rank, share in shares.items() if share >= ctx.thresholds["idle_fraction"])
        if not hit:
            return []
        by_rank = dict(rows)
        activity = _host_activity([by_rank[r] for r in hit])
        step = by_rank[hit[0]]["step"]
        idle = median(host_idle_us(by_rank[r]) for r in hit)
        all_idle = median(by_rank[r]["idle_us"] for r in hit)
        own_step_us = median(by_rank[r]["step_time_us"] for r in hit)
        host = {k: round(median((by_rank[r]["details"].get("idle_by_host") or {}).get(k, 0.0) for r in hit), 1)
                for k in HOST_ACTIVITY}
        own = _own_work_by_phase([by_rank[r] for r in hit])
        host_text = ", ".join(f"{HOST_ACTIVITY[k]} {fmt_us(v)}" + (_phases_text(own) if k == "unknown" else "")
                              for k, v in sorted(host.items(), key=lambda kv: -kv[1]) if v)
        who = ranks_phrase(hit, len(rows))
        queued = all_idle - idle
        rest = (f"; the other {fmt_us(queued)} of its {fmt_us(all_idle)} idle had work launched and waiting "
                "(gpu-idle-queued)" if queued >= 0.05 * all_idle else "")
        note = idle_split_note(ctx)
        calls = _allocator_evidence(hit, by_rank) if activity == "allocator" else {}
        summary = (f"The GPU is idle for lack of work {fmt_us(idle)} of its {fmt_us(own_step_us)} step {who} "
                   f"(median of those ranks, typical step {step}; up to {100 * max(shares[r] for r in hit):.0f}%)"
                   f"{rest}; meanwhile the host is in: {host_text or 'nothing the trace shows'}."
                   + (f" {_allocator_text(hit[0], calls[str(hit[0])])}." if str(hit[0]) in calls else "")
                   + (f" Caveat: {note}." if note else ""))
        model = ("host-caused idle = the step window's time with no kernel, copy or collective on the GPU and the "
                 "work that ends each gap not launched yet (until its launch + the launch latency; waiting for "
                 "other ranks happens inside collectives and is not idle); split by the host's CPU ranges: data "
                 "loader, blocking syncs (and the gap they drained), the device allocator's calls (and the gap "
                 "a free drained), host ops inflated far past their usual length, "
                 "FSDP hooks, short gaps before late launches, the rest; the gain is an upper bound (all of that "
                 "idle recovered)")
        lead = max(own, key=lambda k: (own[k], k)) if activity == "unknown" and own else None
        graphed = any((r.markers_seen or {}).get("graph_kernels") for r in ctx.result.ranks if r.rank in hit)
        fix, snippet, requires = host_fix(activity, lead, ctx.model.workload, graphed)
        gain, recovers = idle, None  # without a replay: an upper bound, the median firing rank's host idle
        replayed = replayed_rank_fixes(ctx, {r: "host" for r in hit}, len(rows))
        prediction = UNSET
        if replayed is not None:
            gain, recovers, prediction = replayed
            model = f"{model}; {REPLAY_GAIN}"
        inflated = _inflated_ops(hit, by_rank) if activity == "contention" else {}
        evidence = HostBoundIdleEvidence(
            step=step, host_idle_share_by_rank={str(r): round(v, 3) for r, v in sorted(shares.items())},
            host_idle_us_median=round(idle, 1), idle_us_median=round(all_idle, 1),
            step_time_us=round(ctx.model.step_time_us, 1),
            step_time_us_median_of_those_ranks=round(own_step_us, 1),
            idle_by_host_median_us=host, host_activity=activity,
            late_ranks_idle="idle on a late rank is what the others then wait for (straggler-rank)",
            idle_split=note if note else UNSET,
            inflated_host_ops=inflated if inflated else UNSET,
            allocator_calls=calls if calls else UNSET,
            own_work_by_phase_us=own if lead else UNSET, own_work_phase=lead if lead else UNSET,
            workload=ctx.model.workload if ctx.model.workload else UNSET,
            prediction=prediction)
        return [ctx.finding(summary=summary, ranks=hit, steps=[step], evidence=evidence, estimated_gain_us=gain,
                            model=model, recovers=recovers,
                            fix_text="", fixes=[Fix(f"the host sets the pace: {fix}", snippet, requires), _PROFILE_HOST])]



# Where the fix for the host's activity does not apply to this job (an inference job's own work)
_PROFILE_HOST = Fix("the host sets the pace: profile that host (py-spy dump / record on the rank) for the work "
                    "between its launches", HOST_SNIPPET["unknown"], otherwise=True)


def host_idle_us(tb) -> float:
    """A breakdown's host-caused idle (all of its idle in a result saved before the split)."""
    value = (tb.get("details") or {}).get("idle_host_us")
    return tb["idle_us"] if value is None else value


def _inflated_ops(hit, by_rank) -> dict:
    """The inflated host ops of the firing ranks' typical step, as the rank analysis found them."""
    ops = {}
    for r in hit:
        for name, figures in ((by_rank[r]["details"].get("inflated_ops")) or {}).items():
            ops.setdefault(name, figures)
    return ops


def _allocator_evidence(hit, by_rank) -> dict[str, dict[str, dict[str, float]]]:
    """Each firing rank's allocator calls in its typical step (name: calls, host µs in them)."""
    return {str(r): by_rank[r]["details"]["allocator_calls"] for r in hit if by_rank[r]["details"].get("allocator_calls")}


def _allocator_text(rank: int, calls: dict[str, dict[str, float]]) -> str:
    """'Rank 0's allocator calls in that step: hipFree x1,298 (3.35 s of host time), ...'."""
    parts = [f"{name} x{c['calls']:,} ({fmt_us(c['host_us'])})"
             for name, c in sorted(calls.items(), key=lambda kv: (-kv[1]["host_us"], kv[0]))]
    return f"Rank {rank}'s allocator calls in that step (host time in them): " + ", ".join(parts)


def _own_work_by_phase(breakdowns) -> dict[str, float]:
    """The host's own work (its unknown idle), median over these ranks, by the phase of the work
    it was getting to; empty where the breakdowns do not split it (a result saved before)."""
    split = [(tb["details"].get("idle_unknown_by_phase") or {}) for tb in breakdowns]
    if not any(split):
        return {}
    phases = sorted({k for s in split for k in s})
    return {k: round(median(s.get(k, 0.0) for s in split), 1) for k in phases if median(s.get(k, 0.0) for s in split)}


def _phases_text(own: dict[str, float]) -> str:
    """' (in forward 82.6 ms, backward 55.9 ms)': where the host's own work falls (the phase of
    the work it launched next)."""
    parts = [f"{k} {fmt_us(v)}" for k, v in sorted(own.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f" (in {', '.join(parts)})" if parts else ""


def _host_activity(breakdowns) -> str:
    """The idle leaf with the most time over these ranks (``unknown`` when none has any)."""
    totals = {k: sum((tb["details"].get("idle_by_host") or {}).get(k, 0.0) for tb in breakdowns) for k in HOST_ACTIVITY}
    best = max(totals, key=lambda k: (totals[k], k))
    return best if totals[best] > 0 else "unknown"
