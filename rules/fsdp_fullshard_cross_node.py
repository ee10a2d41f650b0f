"""fsdp-fullshard-cross-node (TC202)."""

from __future__ import annotations

from typing import Annotated

from analyzer.job.memory import fit_text, fix_memory
from analyzer.base.units import fmt_bytes, fmt_us
from analyzer.model import formulas as models
from analyzer.rules.evidence_types import AlphaBetaLink, Bytes, Count, Evidence, Text, Us, label
from analyzer.rules.evidence_shared import (Collectives, GpuMemory, Link, MemoryAfterFix, Nodes, Parameters,
                                            ParametersFrom, Prediction, ProjectedBy, TypicalStep)
from analyzer.rules.engine import NotEvaluated, MIN_GAIN_FRACTION, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.ddp import representative
from analyzer.job.fsdp import fsdp_steps, group_of_kind, parameter_count


class FsdpGroupSpan(Evidence, frozen=True, forbid_unknown_fields=True):
    """The all-gather group that spans nodes."""

    name: Annotated[Text, label("name")]
    size: Annotated[Count, label("ranks in it")]
    nodes: Nodes


class FullShardCrossNodeEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    group: Annotated[FsdpGroupSpan, label("process group")]
    link: Link
    intra_node_link: Annotated[AlphaBetaLink, label("link inside a node (α-β)")]
    exposed_ag_rs_us_median: Annotated[Us, label("exposed all-gather and reduce-scatter (median)")]
    modelled_exposed_us_full_shard: Annotated[Us, label("modelled exposed, FULL_SHARD")]
    modelled_exposed_us_hybrid_shard: Annotated[Us, label("modelled exposed, HYBRID_SHARD")]
    projected_step_time_us: Annotated[Us, label("projected step")]
    step_time_us: TypicalStep
    projection_source: ProjectedBy
    prediction: Prediction
    parameters: Parameters
    parameters_source: ParametersFrom
    hybrid_shard_memory_bytes: Annotated[Bytes, label("memory with HYBRID_SHARD")]
    gpu_memory_bytes: GpuMemory
    collectives: Collectives
    memory: MemoryAfterFix


@register
class FsdpFullShardCrossNode(Rule):
    """FULL_SHARD whose shard group spans nodes: every per-unit collective crosses the NICs.

    What it detects:
        FSDP all-gathers and reduce-scatters in a process group that spans more than one node,
        with a material share of the step exposed. The rule projects HYBRID_SHARD (shard within
        the node over the intra-node link, all-reduce each GPU's gradient shard across the
        nodes) with the FSDP unit schedule and the measured units, and checks that the
        HYBRID_SHARD state, 16Ψ/g, fits the GPU.

    Why it matters:
        FULL_SHARD moves 3(N−1)/N·Ψ_b per GPU per step, all of it over the slowest link when
        the group spans nodes, in many per-unit messages that each pay the cross-node α.
        HYBRID_SHARD keeps the per-unit traffic on NVLink and sends only 2(M−1)/M·Ψ_b/g per GPU
        across nodes (models.md §3).

    Evidence:
        The group (size, nodes, α/β), the exposed all-gather / reduce-scatter time, the
        modelled exposed time under FULL_SHARD and HYBRID_SHARD, the projected step time, and
        the memory check.

    Fix:
        ``ShardingStrategy.HYBRID_SHARD`` (FSDP1) or a 2-D device mesh
        ``init_device_mesh("cuda", (nodes, gpus_per_node))`` with ``fully_shard(..., mesh=mesh)``
        (FSDP2, HSDP), when 16Ψ/g plus activations fits the GPU.

    References:
        docs/models.md §2 (across nodes), §3 (FULL_SHARD vs HYBRID_SHARD volumes and memory),
        §5; Zhao et al., "PyTorch FSDP", VLDB 2023; Rajbhandari et al., "ZeRO", SC 2020.
    """

    name = "fsdp-fullshard-cross-node"
    code = "TC202"
    title = "FSDP shards within the node"
    failure_title = "FSDP FULL_SHARD spans nodes: per-layer collectives cross the network"
    severity = "warning"
    needs = ("gpu_steps", "fsdp")
    fix_requires = ("training", "fsdp")  # HYBRID_SHARD is FSDP's sharding of a training job
    thresholds = {
        "exposed_fraction": Threshold(0.05, "exposed all-gather / reduce-scatter time, as a fraction "
                                      "of the step time, above which the rule looks", 0.0, 1.0),
        "memory_fraction": Threshold(0.8, "share of GPU memory the HYBRID_SHARD static state 16Ψ/g "
                                     "may take (the rest is left for activations)", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §2, §3, §5", "Zhao et al., PyTorch FSDP, VLDB 2023",
                  "Rajbhandari et al., ZeRO, SC 2020")

    Evidence = FullShardCrossNodeEvidence

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.model.step_time_us
        steps = fsdp_steps(facts)
        if not step_us or not steps:
            return []
        rep = representative(steps, facts.model)
        group = group_of_kind(facts, rep.rank, rep.step, "allgather")
        link = facts.link(group)
        if link is None and facts.members_missing:
            raise NotEvaluated(f"{facts.members_missing}: no link model (hardware profile or --gpu, "
                               "--nics-per-node, --nic-gbps) for the all-gather group")
        if link is None or not link.cross_node:
            return []
        exposed = median(self._exposed_per_step(facts).values()) or 0.0
        if exposed < ctx.thresholds["exposed_fraction"] * step_us:
            return []
        g = max(1, link.n // link.nodes)
        nodes = link.nodes
        intra = facts.profile_link(g, 1)
        node_nic = link.beta_gbps * g / (link.n / link.nodes)  # aggregate NIC bandwidth of a node
        replicate_beta = node_nic / g  # each GPU's replicate ring gets its share of the node's NICs
        if intra is None:
            return []
        current = lambda kind, size: link.time_us(kind, size)  # noqa: E731
        hybrid = lambda kind, size: intra.time_us(kind, size)  # noqa: E731
        replicate = lambda size: models.ring_allreduce_time(size / g, nodes, link.alpha_us, replicate_beta)  # noqa: E731
        now = rep.exposed_us(current)
        projected = rep.exposed_us(hybrid, replicate_time=replicate)
        gain = now - projected
        if gain < ctx.thresholds["min_gain_fraction"] * step_us:
            if facts.members_missing:
                # the link is the model's (no fit of kernels that wait for unseen members): a slower
                # real link would expose more of FULL_SHARD's traffic, and HYBRID_SHARD gain more
                raise NotEvaluated(f"{facts.members_missing}: on the link model's link ({link.source}) HYBRID_SHARD "
                                   "gains little, but the all-gathers' kernels may run on a slower link")
            return []
        psi, psi_source = parameter_count(facts)
        memory = facts.job.get("gpu_mem_bytes") or facts.hardware.memory_bytes.value
        need = models.hsdp_memory_bytes(psi, g) if psi else None
        fits = need is not None and memory is not None and need <= ctx.thresholds["memory_fraction"] * memory
        fit = fix_memory(facts, need - models.zero3_memory_bytes(psi, link.n) if need else None, need,
                         f"static state 16Ψ/g − 16Ψ/N (g = {g}, N = {link.n}; docs/models.md §3)")
        if need is not None and memory and not fits and fit["how"] != "measured":
            return []  # HYBRID_SHARD would not fit by the models: nothing to suggest
        gain, projection_source, prediction = ctx.gains.what_if_or_own(
            facts.result, step_us, gain,
            "FSDP unit schedule (docs/models.md §5) on the median rank-step with the intra-node link and a replicate all-reduce",
            {"intra_node_link": {"value": intra.evidence(), "origin": "profile", "source": intra.source}},
            strategy="hsdp")
        step_after = step_us - gain
        memory_text = (f"; HYBRID_SHARD needs 16Ψ/g = {fmt_bytes(need)} of {fmt_bytes(memory)} per GPU" if need and memory
                       else "; check that 16Ψ/g fits the GPU (Ψ unknown)")
        if fit["how"] == "measured":
            memory_text += f" ({fit_text(fit)})"
        summary = (f"FULL_SHARD all-gathers and reduce-scatters run in a {link.n}-rank group across "
                   f"{nodes} nodes with {fmt_us(exposed)} exposed per step ({100 * exposed / step_us:.0f}%); "
                   f"HYBRID_SHARD (shard over {g} GPUs per node) is projected to cut the typical step from "
                   f"{fmt_us(step_us)} to {fmt_us(step_after)}{memory_text}.")
        model = (f"FSDP unit schedule (rank {rep.rank}, step {rep.step}): exposed {now:,.0f} µs with "
                 f"T_AG = (N−1)α + (N−1)/N·S/β, N = {link.n}, α = {link.alpha_us:.3g} µs, β = {link.beta_gbps:.4g} GB/s; "
                 f"{projected:,.0f} µs with HYBRID_SHARD: N = {g}, α = {intra.alpha_us:.3g} µs, β = {intra.beta_gbps:.4g} GB/s "
                 f"plus a replicate all-reduce of S/{g} over {nodes} nodes at β = {replicate_beta:.4g} GB/s per GPU"
                 + (f"; memory 16Ψ/g = 16·{psi:,.0f}/{g} = {fmt_bytes(need)}" if need else ""))
        evidence = FullShardCrossNodeEvidence(
            group=FsdpGroupSpan(name=group.get("name"), size=link.n, nodes=nodes),
            link=link.evidence(), intra_node_link=intra.evidence(),
            exposed_ag_rs_us_median=round(exposed, 1),
            modelled_exposed_us_full_shard=round(now, 1),
            modelled_exposed_us_hybrid_shard=round(projected, 1),
            projected_step_time_us=round(step_after, 1), step_time_us=round(step_us, 1),
            projection_source=projection_source,
            prediction=prediction,
            parameters=psi, parameters_source=psi_source,
            hybrid_shard_memory_bytes=need, gpu_memory_bytes=memory,
            collectives="all-gather, reduce-scatter",
            memory=fit)
        snippet = ("FullyShardedDataParallel(model, ..., sharding_strategy=ShardingStrategy.HYBRID_SHARD)  # FSDP1\n"
                   f"mesh = init_device_mesh(\"cuda\", ({nodes}, {g}), mesh_dim_names=(\"replicate\", \"shard\"))\n"
                   "fully_shard(block, mesh=mesh)  # FSDP2 (HSDP)")
        return [ctx.finding(summary=summary, ranks=sorted(facts.group_ranks(group)),
                            steps=sorted({s.step for s in steps}), evidence=evidence,
                            estimated_gain_us=gain, model=model,
                            fix_text=f"Shard within each node and replicate across the {nodes} nodes (HYBRID_SHARD).",
                            fix_snippet=snippet)]

    @staticmethod
    def _exposed_per_step(facts):
        out: dict = {}
        for u in facts.result.fsdp_units:
            if u["exposed_us"] is not None:
                out[(u["rank"], u["step"])] = out.get((u["rank"], u["step"]), 0.0) + u["exposed_us"]
        return out
