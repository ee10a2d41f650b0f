"""fsdp-where-ddp-fits (TC204)."""

from __future__ import annotations

from typing import Annotated

from dataclasses import replace

from analyzer.job.memory import fix_memory
from analyzer.base.units import fmt_bytes, fmt_params, fmt_pct, fmt_us
from analyzer.model import formulas as models
from analyzer.rank.comms import DTYPE_BYTES
from analyzer.rules.evidence_types import Bytes, Evidence, Us, label
from analyzer.rules.evidence_shared import (Collectives, GpuMemory, MemoryAfterFix, Parameters, ParametersFrom,
                                            Prediction, TypicalStep)
from analyzer.rules.engine import Rule, Threshold, register
from analyzer.job.ddp import MAX_GRADIENT_PIECES, representative
from analyzer.job.fsdp import fsdp_steps, group_of_kind, parameter_count, unit_links
from analyzer.job.prediction_doc import not_predicted, predicted


class FsdpWhereDdpFitsEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    parameters: Parameters
    parameters_source: ParametersFrom
    ddp_static_bytes: Annotated[Bytes, label("DDP's static memory (16Ψ)")]
    gpu_memory_bytes: GpuMemory
    fsdp_volume_bytes: Annotated[Bytes, label("FSDP's communication per step")]
    ddp_volume_bytes: Annotated[Bytes, label("DDP's communication per step")]
    exposed_comm_us: Annotated[Us, label("exposed communication")]
    step_time_us: TypicalStep
    projected_ddp_step_time_us: Annotated[Us, label("projected step with DDP")]
    projected_shard_grad_op_step_time_us: Annotated[Us, label("projected step with SHARD_GRAD_OP")]
    collectives: Collectives
    memory: MemoryAfterFix
    prediction: Prediction


@register
class FsdpWhereDdpFits(Rule):
    """FSDP on a model whose full DDP state fits the GPU: 1.5× the communication for nothing.

    What it detects:
        An FSDP job whose parameter count Ψ (from the reduce-scatter inputs) gives a DDP static
        state of 16Ψ (bf16 parameters and gradients, fp32 AdamW master, m, v) that fits within
        ``memory_fraction`` of the GPU memory (``deviceProperties.totalGlobalMem``), leaving the
        rest for activations. The DDP step is projected with the bucket pipeline model (25 MiB
        buckets, gradients produced at the measured backward pace) and the full, unsharded
        optimizer step, and SHARD_GRAD_OP with the FSDP unit schedule without the backward
        all-gathers; below ``min_gain_fraction`` the finding is informational (the extra bytes are
        hidden at this scale).

    Why it matters:
        FULL_SHARD sends 3(N−1)/N·Ψ_b per GPU per step against DDP's 2(N−1)/N·Ψ_b, in many
        per-unit collectives that must be waited for in forward and backward. When memory is not
        the constraint, that is 1.5× the communication and more exposed time for nothing.

    Evidence:
        Ψ and its source, 16Ψ against the GPU memory, the FSDP and DDP volumes per GPU, the
        measured exposed communication and the projected DDP step.

    Fix:
        Use ``DistributedDataParallel`` (bf16 autocast or bf16 parameters), or FSDP
        ``SHARD_GRAD_OP`` / ``reshard_after_forward=False`` if some sharding is still wanted.

    References:
        docs/models.md §3 (volumes and static memory), §4 (DDP pipeline);
        Rajbhandari et al., "ZeRO", SC 2020; Zhao et al., "PyTorch FSDP", VLDB 2023.
    """

    name = "fsdp-where-ddp-fits"
    code = "TC204"
    title = "FSDP is needed for memory"
    failure_title = "FSDP on a model that fits in DDP: 1.5× the communication for nothing"
    severity = "warning"
    needs = ("gpu_steps", "fsdp")
    fix_requires = ("training", "fsdp")  # the move from FSDP to DDP, in training
    thresholds = {
        "memory_fraction": Threshold(0.5, "share of GPU memory the DDP static state 16Ψ may take "
                                     "(the rest is left for activations)", 0.0, 1.0),
        "min_gain_fraction": Threshold(0.02, "projected saving, as a fraction of the step time, below "
                                       "which the finding is only informational", 0.0, 1.0),
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §3, §4", "Rajbhandari et al., ZeRO, SC 2020",
                  "Zhao et al., PyTorch FSDP, VLDB 2023")

    Evidence = FsdpWhereDdpFitsEvidence

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.model.step_time_us
        psi, psi_source = parameter_count(facts)
        memory = facts.job.get("gpu_mem_bytes") or facts.hardware.memory_bytes.value
        if not psi or not memory or not step_us:
            return []
        ddp_state = models.ddp_memory_bytes(psi)
        if ddp_state > ctx.thresholds["memory_fraction"] * memory:
            return []
        n = facts.world_size
        gathered = [d for d in facts.all_gather_dtypes() if d]
        elem = DTYPE_BYTES.get(gathered[0], 2) if gathered else 2  # one dtype: the 1.5x of §3
        fsdp_volume = models.zero3_volume_bytes(psi, elem, n)
        ddp_volume = models.ddp_volume_bytes(psi, elem, n)
        exposed = (facts.model.typical.leaves.exposed_us if facts.model.typical else 0.0)
        projection = self._ddp_projection(facts, psi * elem)
        ddp_step = None if projection is None else step_us - exposed + projection[0] + projection[1]
        sgo_step = self._shard_grad_op_step(facts, step_us)
        options = {k: v for k, v in (("DDP", ddp_step), ("SHARD_GRAD_OP", sgo_step)) if v is not None}
        best = min(options, key=lambda k: (options[k], k)) if options else None
        gain = step_us - options[best] if best else None
        projected = ", ".join(f"{k} {fmt_us(v)}" for k, v in options.items())
        if gain is not None and gain >= ctx.thresholds["min_gain_fraction"] * step_us:
            outcome = f"{best} is projected at {fmt_us(options[best])} per step against the {fmt_us(step_us)} typical step."
        else:
            outcome = (f"at this scale the extra bytes are hidden ({projected} projected against the "
                       f"{fmt_us(step_us)} typical step now): they cost when the job scales out." if options else
                       "the saving could not be projected.")
        summary = (f"The model has {fmt_params(psi)}: DDP's 16Ψ = {fmt_bytes(ddp_state)} fits in "
                   f"{_share(ddp_state / memory)} of the {fmt_bytes(memory)} GPU, yet FULL_SHARD sends "
                   f"{fmt_bytes(fsdp_volume)} per GPU per step, 1.5× the {fmt_bytes(ddp_volume)} of DDP or SHARD_GRAD_OP; "
                   + outcome)
        model = (f"16Ψ = 16·{psi:,.0f} = {fmt_bytes(ddp_state)} ≤ {ctx.thresholds['memory_fraction']:g}·{fmt_bytes(memory)}; "
                 f"volume FULL_SHARD 3(N−1)/N·Ψ_b = {fmt_bytes(fsdp_volume)}, DDP 2(N−1)/N·Ψ_b = {fmt_bytes(ddp_volume)} (N = {n})"
                 + (f"; DDP step ≈ step − exposed + pipeline tail + (N−1)·sharded optimizer = "
                    f"{step_us:,.0f} − {exposed:,.0f} + {projection[0]:,.0f} + {projection[1]:,.0f} µs"
                    if projection else "")
                 + (f"; SHARD_GRAD_OP: the FSDP unit schedule without backward all-gathers gives "
                    f"{sgo_step:,.0f} µs" if sgo_step is not None else ""))
        evidence = FsdpWhereDdpFitsEvidence(
            parameters=psi, parameters_source=psi_source,
            ddp_static_bytes=ddp_state, gpu_memory_bytes=memory,
            fsdp_volume_bytes=round(fsdp_volume), ddp_volume_bytes=round(ddp_volume),
            exposed_comm_us=round(exposed, 1), step_time_us=round(step_us, 1),
            projected_ddp_step_time_us=None if ddp_step is None else round(ddp_step, 1),
            projected_shard_grad_op_step_time_us=None if sgo_step is None else round(sgo_step, 1),
            collectives="all-gather, reduce-scatter",
            memory=self._memory(facts, best or "DDP", psi, n),
            prediction=(predicted(step_us, max(0.0, gain or 0.0), f"{best}: "
                                  + ("DDP bucket pipeline (docs/models.md §4) at the measured backward pace, 25 MiB "
                                     "buckets, plus the unsharded optimizer" if best == "DDP" else
                                     "FSDP unit schedule (docs/models.md §5) without the backward all-gathers"),
                                  {"gradient_bytes": {"value": psi * elem, "origin": "measured",
                                                      "source": f"Ψ ({psi_source}) × {elem} bytes"}},
                                  step_after_us=options[best])
                        if best else not_predicted("the DDP and SHARD_GRAD_OP steps could not be projected "
                                                   "(link or phase windows unknown)")))
        return [ctx.finding(summary=summary, ranks=sorted({r.rank for r in facts.result.ranks}),
                            steps=sorted({v.step for v in facts.steps}), evidence=evidence,
                            estimated_gain_us=gain, model=model,
                            fix_text="Train with DistributedDataParallel (the model fits; DDP moves 2/3 of "
                                     "FSDP's bytes in one overlapped all-reduce pipeline), or keep the sharded "
                                     "optimizer with SHARD_GRAD_OP, which moves the same bytes as DDP.",
                            fix_snippet=("model = DistributedDataParallel(model.cuda(), device_ids=[local_rank])\n"
                                         "# or: FSDP1 sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,\n"
                                         "#     FSDP2 fully_shard(block, reshard_after_forward=False)"),
                            severity=None if gain is not None
                            and gain >= ctx.thresholds["min_gain_fraction"] * step_us else "info")]

    @staticmethod
    def _memory(facts, best: str, psi: float, n: int) -> dict:
        """The fix's memory: DDP holds 16Ψ, SHARD_GRAD_OP 2Ψ + 14Ψ/N, against FULL_SHARD's 16Ψ/N."""
        after = models.ddp_memory_bytes(psi) if best == "DDP" else models.zero2_memory_bytes(psi, n)
        formula = "16Ψ" if best == "DDP" else "2Ψ + 14Ψ/N"
        return fix_memory(facts, after - models.zero3_memory_bytes(psi, n), after,
                          f"{best}: static state {formula} − 16Ψ/N (N = {n}; docs/models.md §3)")

    @staticmethod
    def _shard_grad_op_step(facts, step_us):
        """SHARD_GRAD_OP keeps the parameters gathered from forward to backward: the same
        schedule without the backward all-gathers (the difference of two model runs)."""
        steps = fsdp_steps(facts)
        if not steps:
            return None
        rep = representative(steps, facts.model)
        found = unit_links(facts, rep)
        if found is None:
            return None
        links, comm = found
        saving = rep.exposed_us(comm) - replace(rep, backward_ag_bytes=()).exposed_us(comm)
        return step_us - saving

    @staticmethod
    def _ddp_projection(facts, grad_bytes):
        """(exposed tail of a DDP bucket pipeline at the measured backward pace, extra optimizer
        time of an unsharded optimizer) in µs, for the median rank-step."""
        views = [v for v in facts.steps if "backward" in v.windows]
        if not views:
            return None
        view = views[len(views) // 2]
        link = facts.link(group_of_kind(facts, view.rank, view.step, "reduce_scatter"))
        if link is None:
            return None
        start, end, _ = view.windows["backward"]
        pieces = min(max(1, int(grad_bytes // models.MIB)), MAX_GRADIENT_PIECES)  # bounded (issue 30)
        sizes = [grad_bytes / pieces] * pieces
        ready = [start + (end - start) * (i + 1) / pieces for i in range(pieces)]
        tail = models.ddp_pipeline_for_cap(sizes, ready, end, lambda s: link.time_us("allreduce", s),
                                           models.DEFAULT_BUCKET_CAP_BYTES).exposed_tail_us
        optimizer = view.windows.get("optimizer", (0.0, 0.0, 0.0))[2]
        return tail, optimizer * (facts.world_size - 1)


def _share(fraction: float) -> str:
    """A share of the GPU's memory: whole percent, two significant digits below 1% (a small
    model's 0.08%, not "0%")."""
    return fmt_pct(100 * fraction, 0) if fraction >= 0.01 else f"{100 * fraction:.2g}%"
