"""gpu-idle-host-bound (TC303)."""

from __future__ import annotations

from analyzer.rules.engine import NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import median


@register
class GpuIdleHostBound(Rule):
    """The GPU sits idle for a large part of every step: the host, not the GPU or the network,
    sets the pace.

    What it detects:
        Steps in which no kernel, copy or collective runs on the GPU (idle = step time − GPU
        busy time) for at least ``idle_fraction`` of the step, on the median rank. Waiting for
        another rank happens inside NCCL kernels and counts as busy, so this idle time is the
        GPU waiting for its own host: data loading, Python and kernel-launch overhead,
        synchronizing calls (``.item()``, ``.cpu()``, ``torch.cuda.synchronize``).

    Why it matters:
        Time the GPU does not run is lost whatever the parallel strategy; communication tuning
        cannot recover it, and it grows in relative terms as per-GPU work shrinks when scaling
        out (strong scaling), which makes small models look like a network problem.

    Evidence:
        Per rank and step: step time, GPU busy and idle time, and the CPU time of the
        ProfilerStep range (equal to the step when the host is the limit).

    Fix:
        Overlap input with compute (``DataLoader(num_workers=..., pin_memory=True,
        persistent_workers=True)``, ``non_blocking=True`` copies), remove host syncs from the
        step, cut launch overhead (``torch.compile``, CUDA graphs, fused optimizers), or give
        each GPU more work per step (larger micro-batch).

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
        "idle_fraction": Threshold(0.25, "GPU idle time, as a fraction of the step time on the "
                                   "median rank, from which the rule fires", 0.0, 1.0),
    }
    references = ("docs/models.md §6", "Holistic Trace Analysis: idle time breakdown",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    def check(self, ctx):
        rows = [(v, max(0.0, v.step_time_us - v.busy_us)) for v in ctx.facts.steps if v.step_time_us]
        if not rows:
            raise NotEvaluated("no GPU step times")
        by_rank: dict[int, list[float]] = {}
        for view, idle in rows:
            by_rank.setdefault(view.rank, []).append(idle / view.step_time_us)
        share = median(sum(v) / len(v) for v in by_rank.values())
        if share < ctx.thresholds["idle_fraction"]:
            return []
        step_us = ctx.facts.typical_step_us
        idle_us = median(idle for _, idle in rows)
        busy_us = median(v.busy_us for v, _ in rows)
        cpu_us = median(v.cpu_step_us for v, _ in rows)
        cpu_text = (f"; the host spends {cpu_us / 1000:,.1f} ms per step in the ProfilerStep range"
                    if cpu_us else "")
        summary = (f"The GPU is idle {idle_us / 1000:,.1f} ms of a {step_us / 1000:,.1f} ms step "
                   f"({100 * share:.0f}% on the median rank) and busy {busy_us / 1000:,.1f} ms{cpu_text}.")
        model = (f"idle = step time − GPU busy = {step_us:,.0f} − {busy_us:,.0f} µs ≈ {idle_us:,.0f} µs "
                 f"(median over ranks and steps); waiting for other ranks is inside NCCL kernels (busy)")
        hit = [v for v, idle in rows if idle >= ctx.thresholds["idle_fraction"] * v.step_time_us]
        evidence = {
            "idle_share_median_rank": round(share, 3), "idle_us_median": round(idle_us, 1),
            "busy_us_median": round(busy_us, 1), "cpu_step_us_median": None if cpu_us is None else round(cpu_us, 1),
            "step_time_us": round(step_us, 1),
            "by_rank_step": [[v.rank, v.step, round(v.step_time_us, 1), round(v.busy_us, 1), round(idle, 1)]
                             for v, idle in rows],
        }
        return [ctx.finding(summary=summary, ranks=[v.rank for v in hit], steps=[v.step for v in hit],
                            evidence=evidence, estimated_gain_us=None, model=model,
                            fix_text="Feed the GPU faster: overlap data loading, remove host syncs, reduce "
                                     "launch overhead (torch.compile / CUDA graphs), or raise the micro-batch.",
                            fix_snippet="DataLoader(dataset, batch_size=..., num_workers=8, pin_memory=True,\n"
                                        "           persistent_workers=True)\n"
                                        "model = torch.compile(model)")]
