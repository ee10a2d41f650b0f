"""pipeline-bubble (TC402)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from analyzer.base.units import fmt_us
from analyzer.model import formulas as models
from analyzer.rules.evidence_types import Count, Evidence, Share, Us, columns, label
from analyzer.rules.evidence_shared import Prediction, TypicalStep
from analyzer.rules.engine import MIN_GAIN_FRACTION, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.prediction_doc import not_predicted, predicted


class PipelineBubbleEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    stages: Annotated[Count, label("stages")]
    microbatches: Annotated[Count, label("micro-batches")]
    ideal_bubble_fraction: Annotated[Share, label("ideal bubble (p-1)/(m+p-1)")]
    bubble_fraction_median: Annotated[Share, label("bubble (median)")]
    step_time_us: TypicalStep
    compute_us_median: Annotated[Us, label("compute (median)")]
    suggested_microbatches: Annotated[Count, label("suggested micro-batches")]
    # each steady rank-step: its step time and its compute (not comm-bound-step's columns of the
    # same name, which the global table gave it: "communication", "compute window", "exposed")
    by_rank_step: Annotated[list[list[Count]], label("per rank and step"),
                            columns(("rank", None), ("step", None), ("step time", "us"), ("compute", "us"))]
    prediction: Prediction


@register
class PipelineBubble(Rule):
    """Pipeline stages idle (or spinning in recv) for a large share of each step.

    What it detects:
        Pipeline-parallel jobs (send/recv-only groups, ``mesh_pp`` / Megatron
        ``PIPELINE_MODEL_PARALLEL_GROUP``, ``Forward i`` / ``PP:`` schedule ranges) whose
        stages spend at least ``bubble_fraction`` of the step not computing: waiting in a
        posted recv for the neighbouring stage, or idle. The number of micro-batches m is
        counted from the first stage's forward sends per step; the fill/drain bubble of
        GPipe and 1F1B is (p − 1)/(m + p − 1).

    Why it matters:
        During fill and drain only some stages have work: with p stages and m micro-batches
        a step takes (m + p − 1)/m times the stage's compute. With few micro-batches most of
        every GPU's time is spent waiting for its neighbours, and adding stages makes it worse.

    Evidence:
        Per rank and step: step time and compute; the median non-compute share; p, m and the
        ideal bubble (p − 1)/(m + p − 1); the step time the model predicts with more
        micro-batches.

    Fix:
        More micro-batches per step (m ≥ 4(p − 1): smaller micro-batches or gradient
        accumulation), an interleaved schedule (``ScheduleInterleaved1F1B`` with v model
        chunks per stage: bubble (p − 1)/(v·m + p − 1)), or fewer stages.

    References:
        Huang et al., "GPipe", NeurIPS 2019; Narayanan et al., "PipeDream" (SOSP 2019) and
        "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
        SC 2021 (§2.2, interleaved schedule); docs/models.md §7.
    """

    name = "pipeline-bubble"
    code = "TC402"
    title = "The pipeline is kept full"
    failure_title = "Pipeline bubble: stages wait for each other for much of each step"
    severity = "warning"
    needs = ("gpu_steps", "pipeline_parallel")
    fix_requires = ("training",)  # 1F1B / interleaved schedules and micro-batches of a training step
    thresholds = {
        "bubble_fraction": Threshold(0.25, "share of the step a stage does not compute (median over "
                                     "pipeline ranks and steps) from which the rule fires", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("idle_us", "exposed_wait_us", "exposed_transfer_us")
    references = ("Huang et al., GPipe, NeurIPS 2019", "Narayanan et al., SC 2021", "docs/models.md §7")
    Evidence = PipelineBubbleEvidence

    def check(self, ctx):
        facts = ctx.facts
        by_step = facts.rows_by_step("pp")
        views = [facts.steady_view(rank, step) for rank, step in by_step]
        views = [v for v in views if v is not None and v.step_time_us]
        if not views:
            return []
        bubble = median(1.0 - v.compute_us / v.step_time_us for v in views)
        if bubble < ctx.thresholds["bubble_fraction"]:
            return []
        p = int(facts.parallelism["pp"]["size"])
        sends = Counter(key for key, rows in by_step.items() for r in rows
                        if r["collective"] == "send" and r["phase"] == "forward")
        m = max(sends.values(), default=0)
        step_us = ctx.model.step_time_us or median(v.step_time_us for v in views)
        step_text = (f"the typical step is {fmt_us(step_us)}" if ctx.model.step_time_us else
                     f"the median steady rank-step is {fmt_us(step_us)}")
        work = median(v.compute_us for v in views)
        ideal = models.pipeline_bubble_fraction(p, m) if m else None
        target = max(2 * m, 4 * (p - 1)) if m else None
        gain = None
        prediction = not_predicted("the micro-batch count is unknown (no forward sends on the first stage)")
        if m and p > 1:
            after = step_us * models.pipeline_time(1.0, p, target) / models.pipeline_time(1.0, p, m)
            gain = step_us - after
            if gain < ctx.thresholds["min_gain_fraction"] * step_us:
                prediction = not_predicted(f"{target} micro-batches would save only {gain:,.0f} µs by the "
                                           "fill/drain model")
                gain = None
            else:
                prediction = predicted(step_us, gain, "pipeline fill/drain (docs/models.md §7): step ∝ (m + p − 1)/m "
                                       f"at the same work per step, m = {m} -> {target}", {
                                           "work": {"value": "measured", "origin": "measured",
                                                    "source": "the step's work split into more, smaller micro-batches"},
                                           "schedule": {"value": "GPipe / 1F1B", "origin": "assumed",
                                                        "source": "same bubble (p − 1)/(m + p − 1) for both"},
                                           "transfers": {"value": "scaled with the step", "origin": "assumed",
                                                         "source": "stage-to-stage sends shrink with the micro-batch"}})
        ideal_text = (f"; with p = {p} stages and m = {m} micro-batches the fill/drain bubble alone is "
                      f"(p − 1)/(m + p − 1) = {100 * ideal:.0f}%" if ideal is not None else
                      "; the micro-batch count is unknown (no forward sends on the first stage)")
        summary = (f"Pipeline stages do not compute for {100 * bubble:.0f}% of their step (median over "
                   f"{len(views)} steady rank-steps; {step_text}){ideal_text}"
                   + (f"; {target} micro-batches are predicted to cut the typical step to "
                      f"{fmt_us(step_us - gain)}." if gain is not None else "."))
        model = (f"step ≈ work·(m + p − 1)/m; measured non-compute share {bubble:.3f}"
                 + (f", ideal {ideal:.3f}; m = {m} -> {target}: step × ((m' + p − 1)/m')/((m + p − 1)/m)"
                    if ideal is not None else ""))
        evidence = PipelineBubbleEvidence(
            stages=p, microbatches=m or None, ideal_bubble_fraction=None if ideal is None else round(ideal, 4),
            bubble_fraction_median=round(bubble, 4), step_time_us=round(step_us, 1),
            compute_us_median=round(work, 1), suggested_microbatches=target,
            by_rank_step=[[v.rank, v.step, round(v.step_time_us, 1), round(v.compute_us, 1)] for v in views],
            prediction=prediction)
        return [ctx.finding(summary=summary, ranks=[v.rank for v in views], steps=[v.step for v in views],
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text=f"Run more micro-batches per step (m ≥ 4(p − 1) = {4 * (p - 1)}) or an "
                                     "interleaved schedule with several model chunks per stage.",
                            fix_snippet=(f"schedule = ScheduleInterleaved1F1B(stages, n_microbatches={target or 4 * (p - 1)}, "
                                         "loss_fn=loss_fn)  # torch.distributed.pipelining\n"
                                         "# Megatron-LM: --num-layers-per-virtual-pipeline-stage N, larger "
                                         "--global-batch-size / smaller --micro-batch-size"))]
