"""fsdp-no-prefetch (TC203)."""

from __future__ import annotations

from typing import Annotated, Any

from analyzer.job.memory import fix_memory
from analyzer.rules.evidence_types import Evidence, Share, Us, columns, label
from analyzer.rules.evidence_shared import (Collectives, Link, MemoryAfterFix, PredictedStep, Prediction, TypicalStep,
                                            UnitsPerForward)
from analyzer.rules.engine import MIN_GAIN_FRACTION, Rule, Threshold, register
from analyzer.job.facts import median
from analyzer.model import formulas as models
from analyzer.job.fsdp import fsdp_steps, parameter_count, unit_links
from analyzer.job.ddp import representative
from analyzer.job.prediction_doc import predicted

# The gain once the schedule's cut is replayed (the gain engine's replayed_exposed: analyzer.job.gains)
REPLAYED = ("the gain: that cut taken out of the exposed transfers of each step and the measured job replayed "
            "(docs/models.md §9)")


class NoPrefetchEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    units_per_forward_pass: UnitsPerForward
    serialized_share_median: Annotated[Share, label("all-gathers serialized with compute (median)")]
    by_pass: Annotated[list[list[Any]], label("serialized share per rank, step and pass"),
                       columns(("rank", None), ("step", None), ("pass", "text"), ("serialized", "share"))]
    modelled_exposed_us_without_prefetch: Annotated[Us, label("modelled exposed without prefetch")]
    modelled_exposed_us_with_prefetch: Annotated[Us, label("modelled exposed with prefetch")]
    predicted_step_time_us: PredictedStep
    step_time_us: TypicalStep
    link: Link
    collectives: Collectives
    memory: MemoryAfterFix
    modelled_gain_us: Annotated[Us, label("the schedule's modelled gain (the replay's input)")]
    prediction: Prediction


@register
class FsdpNoPrefetch(Rule):
    """FSDP all-gathers that wait for the previous unit's compute instead of running under it.

    What it detects:
        An FSDP pass with several units whose all-gathers are almost entirely exposed
        (``serialized_share`` of their time outside compute): each unit's all-gather is issued
        only after the previous unit's compute, so communication and compute alternate. The
        FSDP unit schedule, fed with the measured unit sizes, the group's α/β and the measured
        compute, must predict a material saving with prefetch.

    Why it matters:
        With ``backward_prefetch=BACKWARD_PRE`` / ``forward_prefetch`` (FSDP1; FSDP2 prefetches
        by default unless its hooks are disabled) unit i+1's all-gather overlaps unit i's
        compute; without it the whole all-gather time adds to the step.

    Evidence:
        Units per pass, the exposed share of the all-gather time, and the modelled exposed
        communication with and without prefetch.

    Fix:
        FSDP1: ``backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True``.
        FSDP2: keep the default implicit prefetching (or ``set_modules_to_forward_prefetch`` /
        ``set_modules_to_backward_prefetch``), and do not call ``unshard()`` synchronously.

    References:
        docs/models.md §5 (FSDP units and prefetch); Zhao et al., "PyTorch FSDP", VLDB 2023.
    """

    name = "fsdp-no-prefetch"
    code = "TC203"
    title = "FSDP all-gathers are prefetched under compute"
    failure_title = "FSDP all-gathers are serialized with compute: prefetch is off"
    severity = "warning"
    needs = ("gpu_steps", "fsdp")
    fix_requires = ("fsdp",)  # prefetching is FSDP's
    thresholds = {
        "min_units": Threshold(3, "fewest all-gathers in a pass for prefetch to matter", 2, 1e9),
        "serialized_share": Threshold(0.8, "share of the pass's all-gather time outside compute "
                                      "from which the pass counts as serialized", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §5", "Zhao et al., PyTorch FSDP, VLDB 2023")

    Evidence = NoPrefetchEvidence

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.model.step_time_us
        t = ctx.thresholds
        shares = []
        for (rank, step, phase, kind), rows in facts.units_by_pass().items():
            if kind != "allgather" or len(rows) < t["min_units"] or not all(u["on_gpu"] for u in rows):
                continue
            total = sum(u["dur_us"] for u in rows)
            shares.append((sum(u["exposed_us"] or 0.0 for u in rows) / total if total else 0.0, rank, step, phase))
        if not shares or not step_us:
            return []
        share = median(s[0] for s in shares)
        if share < t["serialized_share"]:
            return []
        steps = fsdp_steps(facts, prefetch=False)
        if not steps:
            return []
        rep = representative(steps, facts.model)
        found = unit_links(facts, rep)
        if found is None:
            return []
        links, comm = found
        serial, overlapped = rep.exposed_us(comm, prefetch=False), rep.exposed_us(comm, prefetch=True)
        gain = serial - overlapped
        if gain < t["min_gain_fraction"] * step_us:
            return []
        modelled, replay_input = gain, {}
        replayed = ctx.gains.replayed_exposed(ctx.result, gain)  # the schedule's cut, replayed on the measured job
        if replayed is not None:
            gain, replay_input = replayed
        units = len(rep.forward_ag_bytes)
        summary = (f"{100 * share:.0f}% of the FSDP all-gather time is outside compute across {units} units "
                   f"per forward pass: each all-gather waits for the previous unit; prefetching is "
                   f"predicted to save {gain:,.0f} µs per step ({100 * gain / step_us:.0f}%).")
        model = (f"FSDP unit schedule (rank {rep.rank}, step {rep.step}): c_i = max(ag_end_i, c_end_(i−1)); "
                 f"without prefetch ag_start_i = c_end_(i−1): exposed {serial:,.0f} µs; with prefetch "
                 f"ag_start_i = c_(i−1): exposed {overlapped:,.0f} µs; all-gather "
                 f"T = (N−1)α + (N−1)/N·S/β with α = {links['allgather'].alpha_us:.3g} µs, "
                 f"β = {links['allgather'].beta_gbps:.4g} GB/s, N = {links['allgather'].n}")
        evidence = NoPrefetchEvidence(
            units_per_forward_pass=units,
            serialized_share_median=round(share, 3),
            by_pass=[[r, s, p, round(x, 3)] for x, r, s, p in sorted(shares, key=lambda v: (v[1], str(v[2]), v[3]))],
            modelled_exposed_us_without_prefetch=round(serial, 1),
            modelled_exposed_us_with_prefetch=round(overlapped, 1),
            predicted_step_time_us=round(step_us - gain, 1),
            step_time_us=round(step_us, 1),
            link=links["allgather"].evidence(),
            collectives="forward and backward all-gather",
            memory=self._memory(facts, rep, links["allgather"].n),
            modelled_gain_us=round(modelled, 1),
            prediction=predicted(step_us, gain, "FSDP unit schedule (docs/models.md §5, analyzer.job.fsdp) on the "
                                    "median rank-step: exposed communication without prefetch less with it"
                                    + (f"; {REPLAYED}" if replay_input else ""), {**replay_input,
                "link": {"value": links["allgather"].evidence(), "origin": "measured",
                         "source": links["allgather"].source},
                "compute": {"value": "measured", "origin": "measured",
                            "source": "each pass's measured compute split evenly over its units"},
                "prefetch": {"value": "one unit ahead", "origin": "assumed",
                             "source": "BACKWARD_PRE and forward_prefetch=True (FSDP2: its default)"}}))
        snippet = ("FullyShardedDataParallel(model, auto_wrap_policy=...,\n"
                   "    backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)"
                   if facts.strategy != "fsdp2" else
                   "# FSDP2 prefetches one unit ahead by default; to go further:\n"
                   "blocks[i].set_modules_to_forward_prefetch([blocks[i + 1]])")
        return [ctx.finding(summary=summary, ranks=sorted({s[1] for s in shares}),
                            steps=sorted({s[2] for s in shares if s[2] is not None}), evidence=evidence,
                            estimated_gain_us=gain, model=model,
                            fix_text="Turn on FSDP prefetching so the next unit's all-gather runs under "
                                     "the current unit's compute.", fix_snippet=snippet)]

    @staticmethod
    def _memory(facts, rep, n: int) -> dict:
        """Prefetching gathers one more unit ahead: the largest forward all-gather's bytes more;
        modelled, the sharded state 16Ψ/N and two units gathered."""
        unit = max(rep.forward_ag_bytes) if rep.forward_ag_bytes else None
        psi, _ = parameter_count(facts)
        modelled = models.zero3_memory_bytes(psi, n) + 2 * unit if psi and unit else None
        return fix_memory(facts, unit, modelled, "one more unit gathered ahead: the largest forward all-gather's bytes"
                          + (f"; modelled peak 16Ψ/N + 2 units (N = {n}; docs/models.md §3)" if modelled else ""))
