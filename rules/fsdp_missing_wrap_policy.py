"""fsdp-missing-wrap-policy (TC201)."""

from __future__ import annotations

from typing import Annotated

from dataclasses import replace

from analyzer.job.memory import fix_memory
from analyzer.base.units import fmt_bytes, fmt_us
from analyzer.rank.comms import DTYPE_BYTES
from analyzer.rules.evidence_types import Bytes, Count, Evidence, Text, Us, label
from analyzer.rules.evidence_shared import (Collectives, MemoryAfterFix, Parameters, ParametersFrom, Prediction,
                                            TypicalStep, UnitsPerForward)
from analyzer.rules.engine import Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.job.fsdp import fsdp_steps, layer_count, parameter_count, unit_links
from analyzer.job.ddp import representative
from analyzer.job.prediction_doc import not_predicted, predicted


class MissingWrapEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    units_per_forward_pass: UnitsPerForward
    allgather_bytes: Annotated[Bytes, label("all-gather bytes")]
    parameter_bytes: Annotated[Bytes, label("parameter bytes")]
    parameters: Parameters
    parameters_source: ParametersFrom
    unsharded_peak_bytes: Annotated[Bytes, label("unsharded peak")]
    exposed_allgather_us: Annotated[Us, label("exposed all-gather")]
    layers: Annotated[Count, label("layers")]
    layers_source: Annotated[Text, label("layers from")]
    collectives: Collectives
    step_time_us: TypicalStep
    prediction: Prediction
    memory: MemoryAfterFix


@register
class FsdpMissingWrapPolicy(Rule):
    """FSDP with a single unit: the whole model is all-gathered at once, every pass.

    What it detects:
        An FSDP1 or FSDP2 job whose forward pass issues one all-gather per step (at most
        ``max_units``): without an auto-wrap policy (FSDP1) or ``fully_shard`` on each block
        (FSDP2) the root is the only unit, so its all-gather holds about the whole model. Works
        on CPU-only (gloo) traces too: only the collectives' count and sizes are needed.

    Why it matters:
        With one unit nothing can overlap the all-gather (there is no earlier unit to compute
        while it runs), and the unsharded peak is the full parameter set on every GPU: FSDP
        then saves no parameter memory during the pass and hides none of its communication.

    Evidence:
        All-gathers per pass, the all-gather bytes against the parameter bytes (Ψ from the
        reduce-scatter inputs), the unsharded peak, the exposed all-gather time on GPU, and the
        step predicted with one unit per transformer block: the FSDP unit schedule (models.md
        §5) with as many units of equal size as the forward pass runs attention kernels (else
        n_layers from Ψ), each all-gathered one unit ahead, replayed by the what-if projection
        (``tracecliff whatif TRACES --fsdp-units N``).

    Fix:
        FSDP1: pass ``auto_wrap_policy=ModuleWrapPolicy({Block})`` (your transformer block
        class). FSDP2: call ``fully_shard(block)`` on every block before ``fully_shard(model)``.

    References:
        docs/models.md §5 (FSDP units and prefetch); Zhao et al., "PyTorch FSDP", VLDB 2023;
        Rajbhandari et al., "ZeRO", SC 2020.
    """

    name = "fsdp-missing-wrap-policy"
    code = "TC201"
    title = "FSDP shards the model into several units"
    failure_title = "FSDP has no wrap policy: one all-gather of the whole model per pass"
    severity = "warning"
    needs = ("fsdp",)
    fix_requires = ("fsdp",)  # a wrap policy is FSDP's
    thresholds = {
        "max_units": Threshold(1, "all-gathers per forward pass at or below which the model counts "
                               "as a single unit", 1, 1e9),
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §5", "Zhao et al., PyTorch FSDP, VLDB 2023",
                  "Rajbhandari et al., ZeRO, SC 2020")

    Evidence = MissingWrapEvidence

    def check(self, ctx):
        facts = ctx.facts
        passes = facts.units_by_pass()
        forward = {(r, s): rows for (r, s, phase, kind), rows in passes.items()
                   if phase == "forward" and kind == "allgather"}
        if not forward:
            return []
        units = median(len(rows) for rows in forward.values())
        if units > ctx.thresholds["max_units"]:
            return []
        psi, psi_source = parameter_count(facts)
        gathered = [u["bytes"] for rows in forward.values() for u in rows if u["bytes"] is not None]
        ag_bytes = median(gathered)
        dtypes = [c["dtype"] for c in facts.data_parallel_collectives if c["collective"] == "allgather" and c["dtype"]]
        param_elem = DTYPE_BYTES.get(dtypes[0]) if dtypes else None
        rs_dtypes = [c["dtype"] for c in facts.data_parallel_collectives if c["collective"] == "reduce_scatter" and c["dtype"]]
        elem = param_elem or (DTYPE_BYTES.get(rs_dtypes[0]) if rs_dtypes else None)
        param_bytes = psi * elem if psi and elem else None
        exposed = [u["exposed_us"] for rows in forward.values() for u in rows if u.get("exposed_us") is not None]
        exposed_us = median(exposed)
        layers, layers_source = layer_count(facts, {key: len(rows) for key, rows in forward.items()})
        gain, prediction = self._prediction(ctx, layers, layers_source)
        size_text = f"{fmt_bytes(ag_bytes)}" if ag_bytes else "the whole model"
        share = f" ({100 * ag_bytes / param_bytes:.0f}% of the {fmt_bytes(param_bytes)} of parameters)" \
            if ag_bytes and param_bytes else (f" (parameters: {fmt_bytes(param_bytes)})" if param_bytes else "")
        step_us = ctx.model.step_time_us
        outcome = (f"; one unit per block ({layers}) is predicted to cut the typical step from {fmt_us(step_us)} "
                   f"to {fmt_us(prediction['predicted_step_time_us'])}" if gain is not None else "")
        summary = (f"{units:g} all-gather per forward pass of {size_text}{share}: FSDP runs as a single "
                   f"unit, so the full model is materialized on every rank and nothing overlaps its "
                   f"all-gather" + (f" ({exposed_us:,.0f} µs exposed per pass)" if exposed_us else "") + outcome + ".")
        model = (f"units = {units:g}; unsharded peak ≈ Ψ·bytes = {fmt_bytes(param_bytes)}" if param_bytes else
                 f"units = {units:g}") + f" (Ψ = {psi:,.0f} from {psi_source})" if psi else f"units = {units:g}"
        evidence = MissingWrapEvidence(
            units_per_forward_pass=units,
            allgather_bytes=ag_bytes, parameter_bytes=param_bytes,
            parameters=psi, parameters_source=psi_source,
            unsharded_peak_bytes=param_bytes or ag_bytes,
            exposed_allgather_us=exposed_us,
            layers=layers, layers_source=layers_source,
            collectives="forward all-gather",
            step_time_us=None if step_us is None else round(step_us, 1),
            prediction=prediction,
            memory=self._memory(facts, param_bytes or ag_bytes, layers))
        strategy = facts.strategy
        snippet = ("for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)" if strategy == "fsdp2" else
                   "FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}))")
        return [ctx.finding(summary=summary, ranks=sorted({r for r, _ in forward}),
                            steps=sorted({s for _, s in forward if s is not None}),
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text="Wrap each transformer block as its own FSDP unit so all-gathers "
                                     "overlap compute and only one block is unsharded at a time.",
                            fix_snippet=snippet)]

    @staticmethod
    def _memory(facts, gathered: float | None, layers: int | None) -> dict:
        """Wrapping each block holds one block gathered and the prefetched next one instead of
        the whole model: it frees (1 − 2/L) of the gathered parameters."""
        saved = gathered * (1 - 2 / layers) if gathered and layers and layers > 2 else None
        return fix_memory(facts, None if saved is None else -saved, source=(
            f"gathered parameters: Ψ·bytes at once now, 2/L of them per block (L = {layers})" if saved else
            "the gathered parameters shrink from the whole model to two blocks"), frees_only=True)

    @staticmethod
    def _prediction(ctx, layers: int | None, layers_source: str) -> tuple[float | None, dict]:
        """(gain µs, prediction) of wrapping each block: the what-if projection with ``layers``
        units (FULL_SHARD, or HYBRID_SHARD as measured), else the FSDP unit schedule of
        analyzer.job.fsdp on the median rank-step."""
        step_us = ctx.model.step_time_us
        if not step_us:
            return None, not_predicted("no GPU step times: the compute the per-block all-gathers would "
                                       "overlap is not measured")
        if layers is None or layers < 2:
            return None, not_predicted(f"{NO_UNITS}: {layers_source}")
        strategy = "hsdp" if ctx.gains.measured_strategy(ctx.result) == "hsdp" else "fsdp-full"
        assumptions = {
            "units": {"value": layers, "origin": "measured" if layers_source.startswith("measured") else "derived",
                      "source": layers_source},
            "unit_sizes": {"value": "equal", "origin": "assumed",
                           "source": "the measured parameter and gradient bytes split evenly over the units "
                                     "(the root's embeddings and head shared among them)"},
            "prefetch": {"value": "one unit ahead", "origin": "assumed",
                         "source": "FSDP's defaults (backward_prefetch=BACKWARD_PRE; FSDP2 prefetches both passes)"},
            "sharding": {"value": strategy, "origin": "assumed" if strategy == "fsdp-full" else "measured",
                         "source": "a root-only unit shows no backward all-gathers under FULL_SHARD either: "
                                   "FULL_SHARD (the default) assumed, each unit all-gathered again in backward"
                                   if strategy == "fsdp-full" else "replicate all-reduces in the trace"},
        }
        fix = ctx.gains.what_if(ctx.result).fix(fsdp_units=layers, strategy=strategy)
        if fix is not None:
            model = f"FSDP unit schedule with {layers} units (docs/models.md §5), by the {fix.model}"
            return fix.gain_us, predicted(step_us, fix.gain_us, model, {**assumptions, **fix.assumptions()},
                                          fix.command, step_after_us=fix.step_after(step_us), changes=fix.changes)
        gain = _schedule_gain(ctx.facts, layers, strategy)
        if gain is None:
            return None, not_predicted("the all-gather's link (α/β) or the unit sizes are unknown: "
                                       "the unit schedule cannot be timed")
        model = (f"FSDP unit schedule (docs/models.md §5, analyzer.job.fsdp) on the median rank-step: exposed "
                 f"communication with the measured unit less that with {layers} units of equal size")
        return gain, predicted(step_us, gain, model, assumptions)


NO_UNITS = "the number of transformer blocks is unknown"


def _schedule_gain(facts, layers: int, strategy: str) -> float | None:
    """The fallback: FsdpStep's exposed time with the measured unit less with ``layers`` units."""
    steps = fsdp_steps(facts)
    if not steps:
        return None
    rep = representative(steps, facts.model)
    found = unit_links(facts, rep)
    if found is None:
        return None
    _, comm = found
    params, grads = sum(rep.forward_ag_bytes), sum(rep.rs_bytes)
    per_unit = replace(rep, forward_ag_bytes=(params / layers,) * layers,
                       backward_ag_bytes=(params / layers,) * layers if strategy != "fsdp-grad-op" else (),
                       rs_bytes=(grads / layers,) * layers, prefetch=True)
    return max(0.0, rep.exposed_us(comm) - per_unit.exposed_us(comm))
