"""ddp-bucket-oversized (TC101)."""

from __future__ import annotations

import statistics
from typing import Annotated

from analyzer.job.memory import bucket_cap_memory
from analyzer.base.units import fmt_bytes
from analyzer.model import formulas as models
from analyzer.job.ddp import (allreduce_equation, backward_transfer_us, ddp_steps, link_origin, typical_step,
                                 why_no_ddp_steps)
from analyzer.rules.evidence_types import (Bytes, Count, Evidence, RankStepRef, Us, columns, label)
from analyzer.rules.evidence_shared import (BucketCount, Collectives, CommTime, FirstBucketWait, Link, MemoryAfterFix,
                                            ModelledTail, PredictedStep, Prediction, ProjectedBy, Representative,
                                            SuggestedCapMb, TailByCapMb, TypicalStep)
from analyzer.rules.engine import NotEvaluated, MIN_GAIN_FRACTION, Rule, Threshold, register


class BucketOversizedEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    representative: Representative
    bucket_count: BucketCount
    bucket_bytes: Annotated[list[Bytes], label("bucket sizes")]
    first_bucket_wait_us: FirstBucketWait
    backward_us: Annotated[Us, label("backward")]
    t_comm_us: CommTime
    backward_window_us: Annotated[list[Us], label("backward window (start, end)")]
    exposed_tail_us_median: Annotated[Us, label("exposed tail after backward (median)")]
    exposed_tail_us_by_rank_step: Annotated[list[list[Count]], label("exposed tail per rank and step"),
                                            columns(("rank", None), ("step", None), ("exposed tail", "us"))]
    modelled_tail_us: ModelledTail
    suggested_bucket_cap_mb: SuggestedCapMb
    modelled_tail_us_by_cap_mb: TailByCapMb
    predicted_step_time_us: PredictedStep
    projection_source: ProjectedBy
    memory: MemoryAfterFix
    prediction: Prediction
    step_time_us: TypicalStep
    link: Link
    collectives: Collectives


@register
class DdpBucketOversized(Rule):
    """DDP gradient buckets so large that communication starts late and ends after backward.

    What it detects:
        A DDP step whose last gradient all-reduce ends well after the last backward kernel
        (the exposed tail) although its communication fits under backward (T_comm ≤ T_bwd,
        transfer times only: otherwise the step is communication-bound and no bucket size
        helps), with large buckets: the first all-reduce waits for a whole
        bucket of gradients, and a large all-reduce remains when backward is done. The bucket
        pipeline model, fed with the measured gradient-ready times and the group's α/β, must
        predict a smaller exposed tail for a smaller ``bucket_cap_mb``.

    Why it matters:
        DDP can only overlap an all-reduce with the backward kernels that run after its bucket
        is ready. Oversized buckets delay the first launch (T_first_bucket_wait grows) and leave
        a large all-reduce after the last gradient, which every step pays in full.

    Evidence:
        T_comm against T_bwd, bucket count and sizes, first-bucket wait (backward start to first all-reduce start),
        the exposed tail per rank and step, the modelled tail for each candidate cap, and the
        α/β used (fitted per group, else the hardware profile).

    Fix:
        Set ``bucket_cap_mb`` to the suggested value (recent PyTorch then uses it for the first
        bucket too). Re-profile: the exposed tail should drop to about the predicted value.

    References:
        docs/models.md §4 (DDP buckets and the overlap bound; pipeline model);
        S. Li et al., "PyTorch Distributed", VLDB 2020; Hockney 1994 (α-β cost).
    """

    name = "ddp-bucket-oversized"
    code = "TC101"
    title = "DDP buckets let all-reduces overlap backward"
    failure_title = "DDP buckets are oversized: a large all-reduce is exposed after backward"
    severity = "warning"
    needs = ("gpu_steps", "ddp", "gradient_collectives")
    fix_requires = ("training", "ddp")  # bucket_cap_mb is DistributedDataParallel's, in training
    thresholds = {
        "tail_fraction": Threshold(0.05, "measured exposed tail (median over ranks and steps), "
                                   "as a fraction of the step time, above which the rule looks", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §4", "Li et al., PyTorch Distributed, VLDB 2020",
                  "Hockney, Parallel Computing 1994")

    Evidence = BucketOversizedEvidence

    def check(self, ctx):
        steps = ddp_steps(ctx.facts)
        step_us = ctx.model.step_time_us
        if not steps or not step_us:
            raise NotEvaluated(why_no_ddp_steps(ctx.facts))
        tail, rep = typical_step(steps, lambda s: s.measured_tail_us)
        if tail < ctx.thresholds["tail_fraction"] * step_us:
            return []
        t_comm = backward_transfer_us(ctx.facts, rep.rank, rep.step)
        if t_comm > rep.backward_us:
            return []  # the volume itself does not fit under backward: comm-bound-step's case
        upper = ctx.facts.backward_allreduce_upper_us.get((rep.rank, rep.step), 0)
        if ctx.facts.members_missing and upper > rep.backward_us:
            # t_comm is the link model's bound, the least the transfer can be: with the kernels'
            # time it may not fit under backward, which is comm-bound-step's case, not a bucket's
            raise NotEvaluated(f"{ctx.facts.members_missing}: bounded by the link model the all-reduces fit under "
                               "backward, but the rest of their kernels' time may be transfer on a slower link "
                               "(comm-bound-step's case) as well as waiting for the members not given")
        largest = max(rep.bucket_bytes)
        choice, current, gain = rep.cap_saving()
        if choice.cap_bytes >= statistics.median(rep.bucket_bytes):
            return []  # the model does not want smaller buckets: not an oversized-bucket problem
        if gain < ctx.thresholds["min_gain_fraction"] * step_us:
            return []
        cap_mib = choice.cap_bytes / models.MIB
        gain, projection_source, prediction = ctx.gains.what_if_or_own(
            ctx.facts.result, step_us, gain,
            "DDP bucket pipeline (docs/models.md §4) on the median rank-step, re-bucketed at the suggested cap",
            {"link": {"value": rep.link.evidence(), "origin": link_origin(rep.link), "source": rep.link.source}},
            bucket_mb=cap_mib)
        hit = [s for s in steps if s.measured_tail_us >= ctx.thresholds["tail_fraction"] * step_us]
        wait = rep.first_wait_us
        summary = (f"{len(rep.bucket_bytes)} gradient buckets up to {fmt_bytes(largest)}: the first all-reduce "
                   f"starts {wait:,.0f} µs ({100 * wait / rep.backward_us:.0f}% of backward) after "
                   f"backward begins and {tail:,.0f} µs of all-reduce ({100 * tail / step_us:.1f}% of the "
                   f"step) runs after backward ends; bucket_cap_mb={cap_mib:g} is predicted to cut "
                   f"the exposed tail to {choice.exposed_tail_us:,.0f} µs.")
        model = (f"T_comm = {t_comm:,.0f} µs ≤ T_bwd = {rep.backward_us:,.0f} µs (the volume fits); "
                 f"pipeline s_i = max(r_i, e_(i−1)), e_i = s_i + T_AR(S_i), tail = e_last − t_bwd_end "
                 f"(rank {rep.rank}, step {rep.step}): measured {rep.measured_tail_us:,.0f} µs, modelled "
                 f"{current:,.0f} µs with the current {len(rep.bucket_bytes)} buckets, "
                 f"{choice.exposed_tail_us:,.0f} µs with bucket_cap_mb={cap_mib:g}; "
                 + allreduce_equation(rep.link, largest))
        evidence = BucketOversizedEvidence(
            representative=RankStepRef(rep.rank, rep.step),
            bucket_count=len(rep.bucket_bytes),
            bucket_bytes=[int(b) for b in rep.bucket_bytes],
            first_bucket_wait_us=round(wait, 1),
            backward_us=round(rep.backward_us, 1),
            t_comm_us=round(t_comm, 1),
            backward_window_us=[round(rep.backward_start_us, 1), round(rep.backward_end_us, 1)],
            exposed_tail_us_median=round(tail, 1),
            exposed_tail_us_by_rank_step=[[s.rank, s.step, round(s.measured_tail_us, 1)] for s in steps],
            modelled_tail_us=round(current, 1),
            suggested_bucket_cap_mb=cap_mib,
            modelled_tail_us_by_cap_mb=[[c / models.MIB, round(t, 1)] for c, t in choice.tails_us],
            predicted_step_time_us=round(step_us - gain, 1),
            projection_source=projection_source,
            memory=bucket_cap_memory(ctx.facts, sum(rep.bucket_bytes)),
            prediction=prediction,
            step_time_us=round(step_us, 1),
            link=rep.link.evidence(),
            collectives="backward all-reduce (DDP gradient buckets)")
        return [ctx.finding(summary=summary, ranks=[s.rank for s in hit], steps=[s.step for s in hit],
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text=(f"Set bucket_cap_mb={cap_mib:g} so the first all-reduce starts "
                                      "early and the last one is small."),
                            fix_snippet=f"model = DistributedDataParallel(model, bucket_cap_mb={cap_mib:g})")]

