"""fp32-gradient-comm (TC103)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes
from analyzer.job.ddp import ddp_steps, representative
from analyzer.rules.evidence_types import Bytes, Evidence, Share, Text, label
from analyzer.rules.evidence_shared import Collectives, PredictedStep, Prediction, TypicalStep
from analyzer.rules.engine import NotApplicable, NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.fsdp import fsdp_steps, unit_links
from analyzer.job.prediction_doc import not_predicted, predicted

LOW_PRECISION = ("bf16", "f16")


class Fp32GradientEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    collective: Annotated[Text, label("collective")]
    dtype: Annotated[Text, label("dtype")]
    grad_bytes_per_step: Annotated[Bytes, label("gradient bytes per step")]
    low_precision_compute_share: Annotated[Share, label("compute in bf16/fp16")]
    allgather_dtypes: Annotated[list[Text], label("all-gather dtypes")]
    step_time_us: TypicalStep
    predicted_step_time_us: PredictedStep
    collectives: Collectives
    prediction: Prediction


@register
class Fp32GradientComm(Rule):
    """Gradients communicated in fp32 while the model computes in bf16 / fp16.

    What it detects:
        Gradient collectives (DDP's backward all-reduces, FSDP's reduce-scatters) in fp32 in a
        job whose compute runs in low precision: most GPU compute time in bf16/fp16 kernels
        (from the kernel names), or FSDP all-gathering its parameters in bf16/fp16.

    Why it matters:
        fp32 doubles the gradient bytes of every step against bf16 (models.md §3: an fp32
        reduce dtype with bf16 parameters doubles the reduce-scatter or all-reduce volume).
        Where that communication is exposed, the step pays for it directly.

    Evidence:
        The gradient collectives' dtype and bytes per step, the low-precision share of compute,
        and the modelled exposed communication with the same collectives at half the bytes.

    Fix:
        DDP: register the bf16 compression hook. FSDP1: ``MixedPrecision(reduce_dtype=
        torch.bfloat16)``; FSDP2: ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``. Keep fp32
        where convergence needs it (very large data-parallel degrees summing many gradients).

    References:
        docs/models.md §3 (volumes; reduce dtype); Zhao et al., "PyTorch FSDP", VLDB 2023;
        Li et al., VLDB 2020.
    """

    name = "fp32-gradient-comm"
    code = "TC103"
    title = "Gradients are communicated in the compute precision"
    failure_title = "Gradients are communicated in fp32 while compute runs in bf16/fp16"
    severity = "warning"
    needs = ("gradient_collectives",)
    fix_requires = ("training", "gradients_wide")  # bf16 gradients where they travel wider, in training
    thresholds = {
        "low_precision_share": Threshold(0.5, "share of GPU compute time in bf16/fp16 kernels from "
                                         "which compute counts as low precision", 0.0, 1.0),
        "min_gain_fraction": Threshold(0.01, "modelled saving, as a fraction of the step time, below "
                                       "which the finding is only informational", 0.0, 1.0),
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §3", "Zhao et al., PyTorch FSDP, VLDB 2023",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    Evidence = Fp32GradientEvidence

    def check(self, ctx):
        facts = ctx.facts
        fsdp = facts.strategy.startswith("fsdp")
        kind = "reduce_scatter" if fsdp else "allreduce"
        grads = facts.data_parallel_of(kind, "backward")
        if fsdp and not grads:  # gloo runs FSDP's reduce-scatter as an all-reduce of the whole input
            grads = facts.data_parallel_of("allreduce", "backward")
        if not grads:
            raise NotApplicable(f"no gradient {kind.replace('_', '-')}s in backward")
        if all(c.get("dtype") is None for c in grads):
            raise NotEvaluated("the gradient collectives' dtype is not recorded")
        if not all(c["dtype"] == "f32" for c in grads):
            return []
        low_share = median(v.low_precision_compute_us / v.compute_us for v in facts.steps if v.compute_us)
        gathered = {c["dtype"] for c in facts.data_parallel_collectives if c["collective"] == "allgather"}
        low_params = bool(gathered) and gathered <= set(LOW_PRECISION)
        if not low_params and low_share is None:
            raise NotEvaluated("the gradients are fp32, but no GPU compute kernels tell the compute precision")
        if not low_params and low_share < ctx.thresholds["low_precision_share"]:
            return []
        step_us = facts.model.step_time_us
        gain, model = self._gain(facts, fsdp)
        per_step = median(self._bytes_per_step(grads).values())  # None: no size recorded
        severity = None
        if gain is None or not step_us or gain < ctx.thresholds["min_gain_fraction"] * step_us:
            severity = "info"
        why = (f"parameters are all-gathered in {'/'.join(sorted(gathered))}" if low_params else
               f"{100 * low_share:.0f}% of compute time is in bf16/fp16 kernels")
        saving = f"; bf16 is predicted to save {gain:,.0f} µs per step" if gain is not None else ""
        moved = (f"move {fmt_bytes(per_step)} of fp32 gradients per step and rank" if per_step is not None else
                 f"run in fp32 ({len(grads) / len({(c['rank'], c['step']) for c in grads}):g} per step and rank; "
                 "their sizes are not recorded)")
        summary = (f"{'Reduce-scatters' if fsdp else 'Gradient all-reduces'} {moved} while {why}: half of "
                   f"those bytes are avoidable{saving}.")
        evidence = Fp32GradientEvidence(
            collective=kind, dtype="f32",
            grad_bytes_per_step=None if per_step is None else round(per_step),
            low_precision_compute_share=None if low_share is None else round(low_share, 3),
            allgather_dtypes=sorted(d for d in gathered if d),
            step_time_us=round(step_us, 1) if step_us else None,
            predicted_step_time_us=round(step_us - gain, 1) if step_us and gain is not None else None,
            collectives=f"backward {kind} in f32",
            prediction=self._prediction(step_us, gain, model, fsdp, per_step))
        fix = ("model.register_comm_hook(None, default_hooks.bf16_compress_hook)" if not fsdp else
               "MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)  # FSDP1\n"
               "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)  # FSDP2")
        return [ctx.finding(summary=summary, ranks=sorted({c["rank"] for c in grads}),
                            steps=sorted({c["step"] for c in grads if c["step"] is not None}),
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text="Communicate gradients in bf16: half the bytes of every gradient collective.",
                            fix_snippet=fix, severity=severity)]

    @staticmethod
    def _prediction(step_us, gain, model, fsdp: bool, per_step) -> dict:
        if gain is not None and step_us:
            return predicted(step_us, gain, (f"{'FSDP unit schedule (docs/models.md §5)' if fsdp else 'DDP bucket pipeline (docs/models.md §4)'}"
                                             f" with the gradient bytes halved: {model}"),
                             {"gradient_bytes_scale": {"value": 0.5, "origin": "assumed",
                                                       "source": "bf16 instead of fp32 in the same buckets / units"}})
        if not step_us:
            return not_predicted("no GPU step times: the exposed communication bf16 would save is not measured")
        if per_step is None:
            return not_predicted("the gradient collectives' sizes are not recorded: the bytes bf16 would save "
                                 "cannot be timed")
        return not_predicted("the gradient collectives' link (α/β) or schedule is unknown: the saving cannot be timed")

    @staticmethod
    def _bytes_per_step(grads):
        out: dict = {}
        for c in grads:
            if c["bytes"] is not None:
                out[(c["rank"], c["step"])] = out.get((c["rank"], c["step"]), 0) + c["bytes"]
        return out

    @staticmethod
    def _gain(facts, fsdp):
        if not fsdp:
            steps = ddp_steps(facts)
            if not steps:
                return None, None
            tails = [(s.modelled_current().exposed_tail_us, s.modelled_current(0.5).exposed_tail_us, s)
                     for s in steps]
            now, half, rep = sorted(tails, key=lambda t: (t[0] - t[1], t[2].rank, str(t[2].step)))[len(tails) // 2]
            return now - half, (f"pipeline tail (rank {rep.rank}, step {rep.step}) with fp32 buckets "
                                f"{now:,.0f} µs, with the same buckets at half the bytes {half:,.0f} µs")
        steps = fsdp_steps(facts)
        if not steps:
            return None, None
        rep = representative(steps, facts.model)
        found = unit_links(facts, rep)
        if found is None:
            return None, None
        links, comm = found
        now, half = rep.exposed_us(comm), rep.exposed_us(comm, rs_scale=0.5)
        return now - half, (f"FSDP unit schedule (rank {rep.rank}, step {rep.step}): exposed "
                            f"{now:,.0f} µs with fp32 reduce-scatters, {half:,.0f} µs at half the bytes")
