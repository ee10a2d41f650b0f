"""ddp-bucket-undersized (TC102)."""

from __future__ import annotations

import statistics
from typing import Annotated

from analyzer.job.memory import bucket_cap_memory
from analyzer.base.units import fmt_bytes
from analyzer.model import formulas as models
from analyzer.job.ddp import ddp_steps, link_origin, why_no_ddp_steps, typical_step
from analyzer.rules.evidence_types import (Bytes, Evidence, RankStepRef, Share,
                                           Us, label)
from analyzer.rules.evidence_shared import (BucketCount, Collectives, Link, MemoryAfterFix, ModelledTail, PredictedStep,
                                            Prediction, ProjectedBy, Representative, SStar, SuggestedCapMb, TailByCapMb,
                                            TypicalStep)
from analyzer.rules.engine import NotEvaluated, MIN_GAIN_FRACTION, Rule, Threshold, register


class BucketUndersizedEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    representative: Representative
    bucket_count: BucketCount
    median_bucket_bytes: Annotated[Bytes, label("median bucket")]
    s_star_bytes: SStar
    allreduce_crossover_bytes: Annotated[Bytes, label("all-reduce size where bandwidth takes over")]
    share_latency_bound: Annotated[Share, label("share of buckets latency-bound")]
    latency_share: Annotated[Share, label("latency share of the all-reduces")]
    measured_tail_us: Annotated[Us, label("measured tail")]
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
class DdpBucketUndersized(Rule):
    """Many small DDP gradient all-reduces, latency-bound against the group's S* = α·β.

    What it detects:
        A DDP step with many gradient buckets most of which are latency-bound: a ring
        all-reduce sends each of its 2(N−1) steps a chunk of S/N bytes, so it is latency-bound
        when S/N < S* (its latency term 2(N−1)α exceeds its bandwidth term 2(N−1)/N·S/β, i.e.
        S < N·S*). The rule needs α to be a large share of the all-reduce time and the bucket
        pipeline model to predict a smaller exposed tail with larger buckets.

    Why it matters:
        Below S* a message is latency-bound: more bandwidth does not help, fewer and larger
        messages do. Each bucket adds 2(N−1)·α; with hundreds of buckets the all-reduces fall
        behind backward and their backlog is exposed after it.

    Evidence:
        Bucket count and median size, S* of the group, the share of buckets below S*, the α share
        of the modelled all-reduce time, and the modelled exposed tail now and with the
        suggested cap.

    Fix:
        Raise ``bucket_cap_mb`` to the suggested value (and make sure no custom comm hook or
        ``static_graph`` setting splits buckets per parameter).

    References:
        docs/models.md §1 (α-β and S*), §4 (DDP buckets); Hockney 1994; Li et al., VLDB 2020.
    """

    name = "ddp-bucket-undersized"
    code = "TC102"
    title = "DDP buckets are large enough to be bandwidth-bound"
    failure_title = "DDP buckets are undersized: all-reduces are latency-bound (below S*)"
    severity = "warning"
    needs = ("gpu_steps", "ddp", "gradient_collectives")
    fix_requires = ("training", "ddp")  # bucket_cap_mb is DistributedDataParallel's, in training
    thresholds = {
        "min_buckets": Threshold(2, "fewest buckets per step for the rule to look (merging needs "
                                 "two)", 1, 1e9),
        "small_fraction": Threshold(0.5, "share of latency-bound buckets (S/N < S*) above which "
                                    "buckets count as undersized", 0.0, 1.0),
        "latency_share": Threshold(0.25, "share of the modelled all-reduce time spent in α "
                                   "(2(N−1)α per bucket) above which α dominates", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §1, §4", "Hockney, Parallel Computing 1994",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    Evidence = BucketUndersizedEvidence

    def check(self, ctx):
        steps = ddp_steps(ctx.facts)
        step_us = ctx.model.step_time_us
        if not steps or not step_us:
            raise NotEvaluated(why_no_ddp_steps(ctx.facts))
        t = ctx.thresholds
        typical_count, rep = typical_step(steps, lambda s: len(s.bucket_bytes))
        if typical_count < t["min_buckets"]:
            return []
        link = rep.link
        s_star = link.s_star_bytes
        crossover = link.n * s_star  # 2(N−1)α = 2(N−1)/N·S/β
        small = sum(b < crossover for b in rep.bucket_bytes) / len(rep.bucket_bytes)
        latency_us = len(rep.bucket_bytes) * 2 * (link.n - 1) * link.alpha_us
        total_us = sum(rep.allreduce_us(b) for b in rep.bucket_bytes)
        latency_share = latency_us / total_us if total_us else 0.0
        if small < t["small_fraction"] or latency_share < t["latency_share"]:
            return []
        choice, current, gain = rep.cap_saving()
        median_bucket = statistics.median(rep.bucket_bytes)
        if choice.cap_bytes <= median_bucket:
            return []
        if gain < t["min_gain_fraction"] * step_us:
            return []
        cap_mib = choice.cap_bytes / models.MIB
        gain, projection_source, prediction = ctx.gains.what_if_or_own(
            ctx.facts.result, step_us, gain,
            "DDP bucket pipeline (docs/models.md §4) on the median rank-step, re-bucketed at the suggested cap",
            {"link": {"value": link.evidence(), "origin": link_origin(link), "source": link.source}},
            bucket_mb=cap_mib)
        n = link.n
        summary = (f"{len(rep.bucket_bytes)} gradient all-reduces per step, median {fmt_bytes(median_bucket)}, "
                   f"{100 * small:.0f}% latency-bound (S/N below S* = {fmt_bytes(s_star)}): α is {100 * latency_share:.0f}% of the "
                   f"all-reduce time and {rep.measured_tail_us:,.0f} µs is exposed after backward; "
                   f"bucket_cap_mb={cap_mib:g} is predicted to cut that to {choice.exposed_tail_us:,.0f} µs.")
        model = (f"S* = α·β = {link.alpha_us:.3g} µs × {link.beta_gbps:.4g} GB/s = {fmt_bytes(s_star)}, "
                 f"all-reduce crossover N·S* = {fmt_bytes(crossover)}; "
                 f"latency per step = buckets·2(N−1)α = {len(rep.bucket_bytes)}·2·{n - 1}·{link.alpha_us:.3g} µs "
                 f"= {latency_us:,.0f} µs of {total_us:,.0f} µs modelled all-reduce time; pipeline tail "
                 f"(rank {rep.rank}, step {rep.step}) {current:,.0f} µs now, {choice.exposed_tail_us:,.0f} µs "
                 f"with bucket_cap_mb={cap_mib:g}")
        evidence = BucketUndersizedEvidence(
            representative=RankStepRef(rep.rank, rep.step),
            bucket_count=len(rep.bucket_bytes),
            median_bucket_bytes=int(median_bucket),
            s_star_bytes=round(s_star),
            allreduce_crossover_bytes=round(crossover),
            share_latency_bound=round(small, 3),
            latency_share=round(latency_share, 3),
            measured_tail_us=round(rep.measured_tail_us, 1),
            modelled_tail_us=round(current, 1),
            suggested_bucket_cap_mb=cap_mib,
            modelled_tail_us_by_cap_mb=[[c / models.MIB, round(x, 1)] for c, x in choice.tails_us],
            predicted_step_time_us=round(step_us - gain, 1),
            projection_source=projection_source,
            memory=bucket_cap_memory(ctx.facts, sum(rep.bucket_bytes)),
            prediction=prediction,
            step_time_us=round(step_us, 1),
            link=link.evidence(),
            collectives="backward all-reduce (DDP gradient buckets)")
        return [ctx.finding(summary=summary, ranks=sorted({s.rank for s in steps}),
                            steps=sorted({s.step for s in steps}), evidence=evidence,
                            estimated_gain_us=gain, model=model,
                            fix_text=f"Raise bucket_cap_mb to {cap_mib:g}: fewer, larger all-reduces above S*.",
                            fix_snippet=f"model = DistributedDataParallel(model, bucket_cap_mb={cap_mib:g})")]
