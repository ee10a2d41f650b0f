"""gpu-idle-host-bound (TC303)."""

from __future__ import annotations

from analyzer.rules.engine import NotEvaluated, Rule, Threshold, register
from analyzer.base.units import fmt_us
from analyzer.job.facts import median
from analyzer.rules.host import HOST_ACTIVITY, HOST_FIX


@register
class GpuIdleHostBound(Rule):
    """The GPU sits idle for a large part of every step: the host, not the GPU or the network,
    sets the pace.

    What it detects:
        Ranks whose GPU runs no kernel, copy or collective for at least ``idle_fraction`` of the
        typical step (the step window's idle leaf, analyzer.job.attribution), on any rank: idle
        on a late rank is what the others then wait for. Waiting for another rank happens inside
        NCCL kernels and is not idle, so this is the GPU waiting for its own host; the idle is
        split by what the host's CPU trace shows meanwhile: the data loader, a blocking device
        sync (``.item()``, ``.cpu()``, ``torch.cuda.synchronize``), kernel launches, other work.

    Why it matters:
        Time the GPU does not run is lost whatever the parallel strategy; communication tuning
        cannot recover it, and it grows in relative terms as per-GPU work shrinks when scaling
        out (strong scaling), which makes small models look like a network problem.

    Evidence:
        Each rank's idle share of the typical step, and the idle split by host activity on the
        ranks that fire.

    Fix:
        Follows the largest idle leaf: a faster data loader for input, removing the sync for a
        device sync (a faster data loader does not fix that), ``torch.compile`` / CUDA graphs
        for launch-bound steps, profiling the host for the rest.

    References:
        docs/models.md §6 (compute, MFU: idle time lowers MFU directly); HTA idle-time
        breakdown (Holistic Trace Analysis); Li et al., VLDB 2020.
    """

    name = "gpu-idle-host-bound"
    code = "TC303"
    title = "The GPU is kept busy"
    failure_title = "The GPU is idle for much of each step: the host is the bottleneck"
    severity = "warning"
    needs = ("gpu_steps",)
    thresholds = {
        "idle_fraction": Threshold(0.25, "GPU idle time, as a fraction of the typical step on a "
                                   "rank, from which the rule fires for that rank", 0.0, 1.0),
    }
    recovers = ("idle_us", "exposed_wait_us")  # on some ranks only: the others wait for them
    references = ("docs/models.md §6", "Holistic Trace Analysis: idle time breakdown",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    def check(self, ctx):
        rows = [(r.rank, r.time_breakdown) for r in ctx.result.ranks if r.time_breakdown]
        if not rows:
            raise NotEvaluated("no time breakdown of a typical step (no GPU steps on any rank)")
        shares = {rank: tb["idle_us"] / tb["step_time_us"] for rank, tb in rows if tb["step_time_us"]}
        hit = sorted(rank for rank, share in shares.items() if share >= ctx.thresholds["idle_fraction"])
        if not hit:
            return []
        by_rank = dict(rows)
        activity = _host_activity([by_rank[r] for r in hit])
        step = by_rank[hit[0]]["step"]
        idle = median(by_rank[r]["idle_us"] for r in hit)
        own_step_us = median(by_rank[r]["step_time_us"] for r in hit)
        host = {k: round(median((by_rank[r]["details"].get("idle_by_host") or {}).get(k, 0.0) for r in hit), 1)
                for k in HOST_ACTIVITY}
        host_text = ", ".join(f"{HOST_ACTIVITY[k]} {fmt_us(v)}" for k, v in sorted(host.items(), key=lambda kv: -kv[1]) if v)
        who = (f"on {len(hit)} of {len(rows)} ranks" if len(hit) < len(rows) else "on every rank given")
        summary = (f"The GPU is idle {fmt_us(idle)} of its {fmt_us(own_step_us)} step {who} (median of those "
                   f"ranks, typical step {step}; up to {100 * max(shares[r] for r in hit):.0f}%); "
                   f"meanwhile the host is in: {host_text or 'nothing the trace shows'}.")
        model = ("idle = the step window's time with no kernel, copy or collective on the GPU (waiting for "
                 "other ranks happens inside collectives and is not idle); split by the host's CPU ranges: "
                 "data loader, blocking syncs (and the gap they drained), short gaps before late launches, "
                 "the rest; the gain is an upper bound (all of that idle recovered)")
        evidence = {
            "step": step, "idle_share_by_rank": {str(r): round(v, 3) for r, v in sorted(shares.items())},
            "idle_us_median": round(idle, 1), "step_time_us": round(ctx.model.step_time_us, 1),
            "step_time_us_median_of_those_ranks": round(own_step_us, 1),
            "idle_by_host_median_us": host, "host_activity": activity,
            "late_ranks_idle": "idle on a late rank is what the others then wait for (straggler-rank)",
        }
        # The gain is an upper bound: the idle of the median firing rank, were the host never late.
        return [ctx.finding(summary=summary, ranks=hit, steps=[step], evidence=evidence, estimated_gain_us=idle,
                            model=model, fix_text=f"The host sets the pace: {HOST_FIX[activity]}.",
                            fix_snippet=_SNIPPETS[activity])]


_SNIPPETS = {
    "input": ("DataLoader(dataset, batch_size=..., num_workers=8, pin_memory=True,\n"
              "           persistent_workers=True, prefetch_factor=4)"),
    "device_sync": "loss_sum += loss.detach()          # not loss.item() every step\n"
                   "if step % 100 == 0: print(loss_sum.item() / 100)",
    "launch": "model = torch.compile(model)   # or CUDA graphs: torch.cuda.make_graphed_callables",
    "unknown": "py-spy record -o host.svg --pid <PID>   # where the host spends the step",
}


def _host_activity(breakdowns) -> str:
    """The idle leaf with the most time over these ranks (``unknown`` when none has any)."""
    totals = {k: sum((tb["details"].get("idle_by_host") or {}).get(k, 0.0) for tb in breakdowns) for k in HOST_ACTIVITY}
    best = max(totals, key=lambda k: (totals[k], k))
    return best if totals[best] > 0 else "unknown"
