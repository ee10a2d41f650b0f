"""Measured memory against the models (issue 39 item 2; docs/models.md §9), for ``memory.models``.

- **Static state**: the strategy's model (16Ψ, 16Ψ/N, 16Ψ/g, ...) with Ψ from ``--model-params``,
  else from the measured collectives (FSDP's reduce-scatters / all-gathers, DDP's gradient
  buckets), against the allocated memory at the drawn step's start (allocator totals only: a
  relative trace does not hold what was allocated before it started).
- **Activations**: L·34·s·b·h (FlashAttention kernels; ·(34 + 5·a·s/h) otherwise) from the
  recorded shapes of the forward attention ops (L = their count per step, s·b·h = s·(b·a)·d),
  against the peak less the start of the drawn step (a difference: relative traces count too).

Each figure says whether it is ``measured`` or ``modelled``; nothing is compared where either
side is unknown, and the reason is given instead.
"""

from __future__ import annotations

import statistics
from typing import Any

from analyzer.model import formulas as models
from analyzer.rank.comms import DTYPE_BYTES
from analyzer.job.ddp import ddp_steps, representative
from analyzer.job.fsdp import parameter_count
from analyzer.whatif.projection import measured_strategy


def memory_models(result: Any) -> dict[str, Any] | None:
    """``memory.models`` of a Result whose traces recorded memory (None otherwise)."""
    section = result.memory
    if not section or not section.get("recorded"):
        return None
    from analyzer.job.facts import JobFacts
    facts = JobFacts(result)
    steps = [s for m in section["ranks"] for s in m["steps"] if s["step"] == section.get("drawn_step")]
    return {"static": _static(result, facts, section, steps), "activations": _activations(result, steps)}


def _static(result: Any, facts: Any, section: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    psi, source = _parameters(result, facts)
    strategy = measured_strategy(result)
    n, g = facts.world_size, facts.gpus_per_node
    out: dict[str, Any] = {"parameters": psi, "parameters_source": source, "strategy": strategy}
    if psi:
        name = models.canonical_strategy(strategy) if strategy in ("ddp", "hsdp", "fsdp-full", "fsdp-grad-op") \
            else None
        if name is not None:
            out["modelled_bytes"] = round(models.static_memory_bytes(strategy, psi, n, g))
            out["modelled"] = f"{strategy}: docs/models.md §3 with Ψ = {psi:,.0f}, N = {n}, g = {g}"
    starts = [s["start_allocated_bytes"] for s in steps if s.get("start_allocated_bytes") is not None]
    if section.get("relative"):
        out["why"] = "relative figures: what was allocated before the trace started is not measured"
    elif starts:
        out["measured_bytes"] = round(statistics.median(starts))
        out["measured"] = f"allocated at the start of step {section.get('drawn_step')}, median over {len(starts)} rank(s)"
    if out.get("modelled_bytes") and out.get("measured_bytes"):
        out["measured_over_modelled"] = round(out["measured_bytes"] / out["modelled_bytes"], 3)
    elif "why" not in out:
        out["why"] = "Ψ unknown (no --model-params, no sized gradient collectives)" if not psi else "no measured start"
    return out


def _parameters(result: Any, facts: Any) -> tuple[float | None, str]:
    given = (result.mfu or {}).get("model_params")
    if given:
        return float(given), "--model-params"
    if facts.strategy.startswith("fsdp"):
        psi, source = parameter_count(facts)
        return psi, source
    steps = ddp_steps(facts, need_link=False)
    dtypes = [c["dtype"] for c in facts.data_parallel_collectives if c["collective"] == "allreduce" and c["dtype"]]
    elem = DTYPE_BYTES.get(dtypes[0]) if dtypes else None
    if steps and elem:
        return sum(representative(steps, facts.model).bucket_bytes) / elem, "DDP gradient buckets per step"
    return None, "no sized gradient collectives"


def _activations(result: Any, steps: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rises = [s["peak_allocated_bytes"] - s["start_allocated_bytes"] for s in steps
             if s.get("peak_allocated_bytes") is not None and s.get("start_allocated_bytes") is not None]
    if rises:
        out["measured_bytes"] = round(statistics.median(rises))
        out["measured"] = "peak − start of the drawn step, median over ranks (activations, gathered units, workspaces)"
    compute = result.model.compute
    forward = [s for s in (compute.ranks[0].shapes if compute and compute.ranks else ())
               if s.family == "attention" and not s.dims.get("backward") and {"bh", "sq", "d"} <= set(s.dims)]
    if not forward:
        out["why"] = "no attention op with recorded shapes (profile with record_shapes=True)"
        return out
    shape = max(forward, key=lambda s: s.count)
    layers = int(sum(s.count for s in forward if s.dims == shape.dims))
    flash = "flash" in shape.op or "efficient" in shape.op or "cudnn" in shape.op
    sbh = shape.dims["sq"] * shape.dims["bh"] * shape.dims["d"]  # s·(b·a)·d = s·b·h
    # the model with b·a as the batch and d as the width: s·b·h and a·s/h = s/d are the same
    per_layer = round(models.activation_bytes_per_layer(shape.dims["sq"], shape.dims["bh"], shape.dims["d"], 1, flash))
    out.update(modelled_bytes=round(layers * per_layer), layers=layers, flash=flash, sbh=sbh,
               modelled=(f"L·34·s·b·h = {layers}·34·{sbh:,} (FlashAttention: no scores saved)" if flash else
                         f"L·s·b·h·(34 + 5·a·s/h) = {layers}·{per_layer:,}") + " (docs/models.md §9, Korthikanti et al.)")
    if out.get("measured_bytes"):
        out["measured_over_modelled"] = round(out["measured_bytes"] / out["modelled_bytes"], 3)
    return out
