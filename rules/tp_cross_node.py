"""tp-cross-node (TC401)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_us
from analyzer.rules.evidence_types import AlphaBetaLink, Count, Evidence, Text, Us, label
from analyzer.rules.evidence_shared import Collectives, ExposedShare, Nodes, Prediction, TypicalStep
from analyzer.rules.engine import MIN_GAIN_FRACTION, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.prediction_doc import not_predicted, predicted


class TpGroupSpan(Evidence, frozen=True, forbid_unknown_fields=True):
    """The tensor-parallel group that spans nodes."""

    name: Annotated[Text, label("name")]
    description: Annotated[Text, label("description")]
    ranks: Annotated[list[Count], label("ranks")]
    size: Annotated[Count, label("ranks in it")]
    nodes: Nodes


class TpCrossNodeEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    group: Annotated[TpGroupSpan, label("process group")]
    gpus_per_node: Annotated[Count, label("GPUs per node")]
    exposed_tp_us_median: Annotated[Us, label("exposed tensor-parallel communication (median)")]
    step_time_us: TypicalStep
    exposed_share: ExposedShare
    intra_node_link: Annotated[AlphaBetaLink | None, label("link inside a node (α-β)")]
    collectives: Collectives
    prediction: Prediction


@register
class TpCrossNode(Rule):
    """Tensor parallelism whose group spans nodes: the per-layer all-reduces cross the network.

    What it detects:
        A tensor-parallel process group (role ``tp``: a ``mesh_tp`` / Megatron
        ``TENSOR_MODEL_PARALLEL_GROUP`` description, or all-reduces launched in forward) whose
        ranks sit on more than one node (host names, else ``--gpus-per-node``), with its
        exposed communication a material share of the step.

    Why it matters:
        Tensor parallelism puts collectives on the critical path of every layer, forward and
        backward: the next kernel needs their result, so they can hardly be hidden. Inside a
        node they run over NVLink (hundreds of GB/s, α ≈ 1 µs); across nodes every one of them
        pays the NIC's α (≈ 10 µs) and a bandwidth ten times lower, once per layer.

    Evidence:
        The group (ranks, size, nodes), the exposed tensor-parallel time per step (median over
        ranks and steps), its share of the step, and the time the same collectives take on the
        intra-node link (α-β model with the hardware profile) where their sizes are known.

    Fix:
        Keep TP inside a node (TP ≤ GPUs per node) and span nodes with data or pipeline
        parallelism: put ``tp`` last (innermost, contiguous ranks) in the device mesh,
        ``init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))`` with tp ≤ GPUs per
        node; in Megatron-LM, ``--tensor-model-parallel-size`` ≤ GPUs per node.

    References:
        Shoeybi et al., "Megatron-LM", 2019 (§3, TP within a node); Narayanan et al.,
        "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
        SC 2021 (§3.2: TP across nodes); docs/models.md §2 (α-β costs inside and across nodes).
    """

    name = "tp-cross-node"
    code = "TC401"
    title = "Tensor parallelism stays inside a node"
    failure_title = "A tensor-parallel group spans nodes: every layer's all-reduce crosses the network"
    severity = "warning"
    needs = ("gpu_steps", "tensor_parallel")
    fix_requires = ()  # tensor-parallel placement applies to training and inference alike
    thresholds = {
        "exposed_fraction": Threshold(0.05, "exposed tensor-parallel communication, as a fraction of "
                                      "the step time, from which the rule fires", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us",)
    references = ("Shoeybi et al., Megatron-LM, 2019", "Narayanan et al., SC 2021", "docs/models.md §2")

    Evidence = TpCrossNodeEvidence

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.model.step_time_us
        by_step = facts.rows_by_step("tp")
        crossing = {key: rows for key, rows in by_step.items()
                    if facts.group_nodes(rows[0].get("group") or {}) > 1}
        if not step_us or not crossing:
            return []
        exposed = median(sum(r["exposed_us"] or 0.0 for r in rows) for rows in crossing.values())
        if exposed < ctx.thresholds["exposed_fraction"] * step_us:
            return []
        group = next(iter(crossing.values()))[0].get("group") or {}
        members = facts.group_ranks(group)
        nodes = facts.group_nodes(group)
        intra = facts.profile_link(len(members), 1)
        saved = [self._saved_us(facts, rows, intra) for rows in crossing.values()]
        gain = median(saved) if intra is not None and None not in saved else None
        if intra is None:
            prediction = not_predicted("no hardware profile: the intra-node link's α/β is unknown (pass --gpu)")
        elif gain is None:
            prediction = not_predicted("some exposed tensor-parallel collectives have no recorded size: their "
                                       "intra-node time cannot be modelled")
        elif gain < ctx.thresholds["min_gain_fraction"] * step_us:
            prediction = not_predicted(f"the α-β model sees no material saving ({gain:,.0f} µs, below "
                                       f"{100 * ctx.thresholds['min_gain_fraction']:g}% of the step)")
            gain = None  # the model sees no material saving: report the exposure without one
        else:
            prediction = predicted(step_us, gain, "α-β collective times (docs/models.md §2) on the intra-node link: "
                                   "each exposed tensor-parallel collective's exposed time scaled by T_intra / "
                                   "T_measured (what the what-if projection cannot do: it models data parallelism only)", {
                                       "placement": {"value": f"the {len(members)}-rank group inside one node",
                                                     "origin": "assumed",
                                                     "source": "the fix: TP on one node's NVLink (nodes of at least "
                                                               f"{len(members)} GPUs, or a smaller TP degree)"},
                                       "intra_node_link": {"value": intra.evidence(), "origin": "profile",
                                                           "source": intra.source},
                                       "compute": {"value": "measured", "origin": "measured",
                                                   "source": "per-GPU compute unchanged (same TP degree)"}})
        gain_text = (f"; on the intra-node link the same collectives would expose about "
                     f"{fmt_us(exposed - gain)}" if gain is not None else
                     "; the intra-node time cannot be modelled (sizes or link unknown)")
        summary = (f"Tensor-parallel group of {len(members)} ranks spans {nodes} nodes: its all-reduces "
                   f"expose {fmt_us(exposed)} per step ({100 * exposed / step_us:.0f}% of the "
                   f"{fmt_us(step_us)} typical step){gain_text}.")
        model = ("exposed TP time per (rank, step), median; intra-node time of each collective "
                 + (f"T = α + f(N)·S/β with the intra-node link (α = {intra.alpha_us:.3g} µs, "
                    f"β = {intra.beta_gbps:.4g} GB/s, N = {len(members)}); saving = exposed × (1 − T_intra/T_measured)"
                    if intra is not None else "not modelled: no hardware profile"))
        evidence = TpCrossNodeEvidence(
            group=TpGroupSpan(name=group.get("name"), description=group.get("description"), ranks=members,
                              size=len(members), nodes=nodes),
            gpus_per_node=facts.gpus_per_node,
            exposed_tp_us_median=round(exposed, 1), step_time_us=round(step_us, 1),
            exposed_share=round(exposed / step_us, 4),
            intra_node_link=intra.evidence() if intra is not None else None,
            collectives=", ".join(sorted({r["collective"] for rows in crossing.values() for r in rows})),
            prediction=prediction)
        snippet = (f"mesh = init_device_mesh(\"cuda\", (world // {facts.gpus_per_node}, {facts.gpus_per_node}), "
                   "mesh_dim_names=(\"dp\", \"tp\"))  # tp innermost, inside a node\n"
                   f"# Megatron-LM: --tensor-model-parallel-size {min(len(members), facts.gpus_per_node)}")
        return [ctx.finding(summary=summary, ranks=sorted({k[0] for k in crossing}),
                            steps=sorted({k[1] for k in crossing}), evidence=evidence,
                            estimated_gain_us=gain, model=model,
                            fix_text=f"Keep tensor parallelism within a node (TP ≤ {facts.gpus_per_node}) and "
                                     "span nodes with data or pipeline parallelism.",
                            fix_snippet=snippet)]

    @staticmethod
    def _saved_us(facts, rows, intra) -> float | None:
        """Exposed time saved per step if each collective ran at the intra-node link's speed."""
        saved = 0.0
        for r in rows:
            if not r["exposed_us"]:
                continue
            if not r.get("bytes") or not r["dur_us"] or intra is None:
                return None
            fraction = min(1.0, intra.time_us(r["collective"], r["bytes"]) / r["dur_us"])
            saved += r["exposed_us"] * (1.0 - fraction)
        return saved
