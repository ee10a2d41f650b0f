"""ep-alltoall-exposed (TC403)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_us
from analyzer.model import formulas as models
from analyzer.rules.evidence_types import Count, Evidence, Text, Us, columns, label
from analyzer.rules.evidence_shared import Prediction, TypicalStep
from analyzer.rules.engine import MIN_GAIN_FRACTION, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.prediction_doc import not_predicted, predicted


class ExpertAlltoallEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    exposed_ep_us_median: Annotated[Us, label("exposed expert-parallel communication (median)")]
    ep_comm_us_median: Annotated[Us, label("expert-parallel communication (median)")]
    min_exposed_us_if_overlapped: Annotated[Us, label("least exposed if overlapped")]
    step_time_us: TypicalStep
    libraries: Annotated[list[Text], label("libraries")]
    prediction: Prediction
    # each steady rank-step: its exposed expert-parallel time, that communication, its compute (not
    # comm-bound-step's columns of the same name, which the global table gave it)
    by_rank_step: Annotated[list[list[Count]], label("per rank and step"),
                            columns(("rank", None), ("step", None), ("exposed", "us"), ("communication", "us"),
                                    ("compute", "us"))]


@register
class EpAlltoallExposed(Rule):
    """Expert-parallel all-to-all (token dispatch / combine) exposed on the critical path.

    What it detects:
        Communication of the expert-parallel role (NCCL all-to-all in an ``ep`` group, or
        DeepEP / pplx dispatch and combine kernels, whatever their namespace) that no compute
        overlaps, for at least ``exposed_fraction`` of the step (median over ranks and steps).

    Why it matters:
        A mixture-of-experts layer sends every token to its experts and back twice per layer
        and pass. When dispatch and combine run in line with compute, the GPU waits for the
        network at every MoE layer; the network time grows with the number of experts' ranks
        and crosses nodes as EP scales out. The critical overlap equation bounds what can be
        hidden: at least max(0, T_a2a − T_compute) stays exposed.

    Evidence:
        Per rank and step: the exposed expert-parallel time and its kernels' total time, the
        step's compute time, the lower bound on the exposed time with full overlap.

    Fix:
        Run dispatch/combine on a communication stream overlapped with other work: DeepEP's
        communication-computation overlap (hook-based low-latency kernels, or two
        micro-batches interleaved so one's all-to-all hides under the other's experts),
        Megatron-LM ``--moe-token-dispatcher-type flex`` with DeepEP and
        ``--overlap-moe-expert-parallel-comm``; keep EP within a node where it fits.

    References:
        DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024 (§3.2.2, dual micro-batch overlap);
        DeepEP (github.com/deepseek-ai/DeepEP); Lepikhin et al., "GShard", ICLR 2021;
        docs/models.md §4 (critical overlap equation).
    """

    name = "ep-alltoall-exposed"
    code = "TC403"
    title = "Expert-parallel all-to-all is hidden under compute"
    failure_title = "Expert-parallel dispatch/combine is exposed: the GPU waits for token routing"
    severity = "warning"
    needs = ("gpu_steps", "expert_parallel")
    fix_requires = ()  # dispatch/combine overlap applies to training and inference alike
    thresholds = {
        "exposed_fraction": Threshold(0.08, "exposed expert-parallel communication, as a fraction of the "
                                      "step time, from which the rule fires", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("DeepSeek-V3 Technical Report, 2024", "DeepEP", "Lepikhin et al., GShard, ICLR 2021",
                  "docs/models.md §4")

    Evidence = ExpertAlltoallEvidence

    def check(self, ctx):
        facts = ctx.facts
        by_step = facts.rows_by_step("ep")
        rows = []
        for (rank, step), colls in by_step.items():
            view = facts.steady_view(rank, step)
            if view is None or not view.step_time_us:
                continue
            exposed = sum(c["exposed_us"] or 0.0 for c in colls)
            total = sum(c["dur_us"] for c in colls)
            bound = models.critical_overlap(total, view.compute_us, 0.0)
            rows.append((view, exposed, total, bound.min_bubble_us))
        if not rows:
            return []
        step_us = ctx.model.step_time_us or median(v.step_time_us for v, *_ in rows)
        exposed = median(e for _, e, _, _ in rows)
        if exposed < ctx.thresholds["exposed_fraction"] * step_us:
            return []
        total = median(t for _, _, t, _ in rows)
        floor = median(b for *_, b in rows)
        gain = exposed - floor
        if gain < ctx.thresholds["min_gain_fraction"] * step_us:
            prediction = not_predicted(f"overlap could hide only {gain:,.0f} µs: the critical overlap bound leaves "
                                       f"{floor:,.0f} µs of the {exposed:,.0f} µs exposed")
            gain = None
        else:
            prediction = predicted(step_us, gain, "critical overlap bound (docs/models.md §4): exposed ≥ max(0, T_a2a − "
                                   "T_compute); the gain hides all the rest, an upper bound", {
                                       "overlap": {"value": "full", "origin": "assumed",
                                                   "source": "dispatch/combine on their own stream under independent "
                                                             "compute (DeepEP overlap / two interleaved micro-batches)"},
                                       "compute": {"value": "measured", "origin": "measured",
                                                   "source": "the step's compute, unchanged"}})
        libraries = sorted({c.get("library") or "?" for colls in by_step.values() for c in colls})
        summary = (f"Expert-parallel communication ({', '.join(libraries)}) is exposed for {fmt_us(exposed)} per step "
                   f"(median over ranks and steady steps: {100 * exposed / step_us:.0f}% of the {fmt_us(step_us)} "
                   f"typical step), {100 * exposed / total:.0f}% of its {fmt_us(total)}; overlapped with compute at "
                   f"most {fmt_us(floor)} would stay exposed.")
        model = ("critical overlap: exposed ≥ max(0, T_a2a − T_compute) = "
                 f"max(0, {total:,.0f} − compute) ≈ {floor:,.0f} µs (median); gain = exposed − that bound")
        evidence = ExpertAlltoallEvidence(
            exposed_ep_us_median=round(exposed, 1), ep_comm_us_median=round(total, 1),
            min_exposed_us_if_overlapped=round(floor, 1), step_time_us=round(step_us, 1),
            libraries=libraries, prediction=prediction,
            by_rank_step=[[v.rank, v.step, round(e, 1), round(t, 1), round(v.compute_us, 1)] for v, e, t, _ in rows])
        return [ctx.finding(summary=summary, ranks=[v.rank for v, *_ in rows], steps=[v.step for v, *_ in rows],
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text="Overlap dispatch/combine with compute: a communication stream and two "
                                     "interleaved micro-batches (DeepEP / Megatron-LM MoE overlap).",
                            fix_snippet=("# Megatron-LM\n--moe-token-dispatcher-type flex --moe-enable-deepep "
                                         "--overlap-moe-expert-parallel-comm\n"
                                         "# DeepEP low-latency: dispatch(..., async_finish=True, return_recv_hook=True)"))]
