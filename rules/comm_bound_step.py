"""comm-bound-step (TC301)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Annotated

from analyzer.base.units import fmt_us
from analyzer.model import formulas as models
from analyzer.job.ddp import backward_transfer_us, ddp_steps, representative
from analyzer.job.fsdp import layer_count, parameter_count
from analyzer.job.memory import bucket_cap_memory, fix_memory
from analyzer.job.prediction_doc import alternative, not_predicted, predicted
from analyzer.job.columns import CollectiveColumns
from analyzer.rules.evidence_types import (UNSET, Count, Evidence, FixMemory, RankStepRef, Text, UnsetType, Us,
                                           columns, label)
from analyzer.rules.evidence_shared import (Collectives, CommTime, FirstBucketWait, Prediction, Representative,
                                            TypicalStep)
from analyzer.rules.engine import Fix, NotApplicable, NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import POINT_TO_POINT, median


# Each fix with what it needs of the job: the bf16 hook only where the gradients travel wider
# than 16 bits, sharding advice only on FSDP, more compute per step only in training.
FIXES = (
    Fix("reduce the bytes per step: bf16 gradients (a DDP comm hook)",
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(None, default_hooks.bf16_compress_hook)", ("training", "gradients_wide", "ddp")),
    Fix("reduce the bytes per step: bf16 gradients (reduce_dtype=torch.bfloat16)",
        "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)  # FSDP2",
        ("training", "gradients_wide", "fsdp")),
    Fix("shard within each node and replicate across nodes (HYBRID_SHARD)", None, ("training", "fsdp")),
    Fix("add compute per step (a larger micro-batch, gradient accumulation with no_sync())", None, ("training",)),
    Fix("or give the group more bandwidth (NICs per node, NCCL settings)"),
)


class CommBoundEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    representative: Representative
    t_comm_us: CommTime
    t_window_us: Annotated[Us, label("compute window it could hide under")]
    window: Annotated[Text, label("window")]
    first_bucket_wait_us: FirstBucketWait
    min_bubble_us_median: Annotated[Us, label("least idle between collectives (median)")]
    exposed_comm_us_median: Annotated[Us, label("exposed communication (median)")]
    step_time_us: TypicalStep
    by_rank_step: Annotated[list[list[Count]], label("per rank and step"),
                            columns(("rank", None), ("step", None), ("communication", "us"), ("compute window", "us"),
                                    ("exposed", "us"))]
    collectives: Collectives
    t_comm_basis: Annotated[Text, label("communication time from")]
    prediction: Prediction
    memory: Annotated[FixMemory | UnsetType, label("memory after the fix")] = UNSET


@register
class CommBoundStep(Rule):
    """Communication that backward (or the whole compute window) cannot hide.

    What it detects:
        Steps whose communication time exceeds what the compute can hide by the critical
        overlap equation, T_comm ≤ T_bwd − T_first_bucket_wait, and whose measured exposed
        communication (the bubble) is a large share of the step. T_comm is the transfer time of
        the step's collectives (the shortest duration of each across ranks, so waiting for a
        late rank does not count); for FSDP the window is forward plus backward, which the
        all-gathers and reduce-scatters can overlap. When some ranks' traces are missing a kernel's
        duration is its transfer plus waiting for members not given, which that rank's kernels
        cannot tell apart: T_comm is then bounded by the link model (hardware profile or
        ``--gpu`` / ``--nics-per-node`` / ``--nic-gbps``), the least it can be, and a finding
        states that bound. Where the bound fits under compute but the kernels less the measured waits (the most it can be) would not, or
        no link model bounds it, the rule could not check ("needs every member's trace").

    Why it matters:
        Once T_comm exceeds the window, no bucket size, prefetch or stream trick can hide the
        difference: the step is communication-bound and scaling out adds to it. The only fixes
        reduce the bytes or the time per byte, or add compute per step.

    Evidence:
        T_comm, T_bwd (or the FSDP compute window), the first-bucket wait, the lower bound on
        the bubble from the equation, and the measured exposed communication, per rank and step;
        each fix the what-if projection can make (one NIC per GPU, HYBRID_SHARD across nodes,
        larger DDP buckets when they are latency-bound) with its projected typical step and its
        ``tracecliff whatif`` command; the gain is the best of them.

    Fix:
        Communicate fewer bytes (bf16 gradients or a compression hook; HYBRID_SHARD across
        nodes), amortize them over more compute (larger micro-batch, gradient accumulation with
        ``no_sync()``), or give the group more bandwidth (NICs per node, NCCL settings).

    References:
        docs/models.md §2 (collective costs), §3 (volumes), §4 (critical overlap equation);
        Li et al., VLDB 2020; Thakur, Rabenseifner & Gropp, IJHPCA 2005.
    """

    name = "comm-bound-step"
    code = "TC301"
    title = "Communication fits under compute"
    failure_title = "The step is communication-bound: communication exceeds what compute can hide"
    severity = "warning"
    needs = ("gpu_steps", "communication")
    fix_requires = ()  # each of its fixes declares its own (a Fix's requires)
    thresholds = {
        "bubble_fraction": Threshold(0.10, "measured exposed communication, as a fraction of the "
                                     "step time, above which the rule looks", 0.0, 1.0),
        "min_bubble_fraction": Threshold(0.03, "lower bound of the bubble from the critical overlap "
                                         "equation, as a fraction of the step time", 0.0, 1.0),
    }
    recovers = ("exposed_transfer_us", "exposed_wait_us")
    references = ("docs/models.md §2-§4", "Li et al., PyTorch Distributed, VLDB 2020",
                  "Thakur, Rabenseifner & Gropp, IJHPCA 2005")

    Evidence = CommBoundEvidence

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.model.step_time_us
        if not step_us:
            raise NotEvaluated("no GPU step times")
        ddp = facts.strategy in ("ddp", "unknown") and bool(facts.result.buckets)
        rows = self._ddp_rows(facts) if ddp else self._window_rows(facts)
        if not rows:
            view = CollectiveColumns.of(facts.result)
            if not (view.on_gpu & ~view.kind.isin(POINT_TO_POINT)).any():
                raise NotApplicable("only point-to-point communication on the GPU (pipeline sends and receives "
                                    "are pipeline-bubble's): no collective for compute to hide")
            raise NotEvaluated("no step has both a forward/backward phase and GPU collectives, so the "
                               "critical-overlap window is unknown")
        known, bound_by = facts.transfer_bound(self._comm_rows(facts, rows[0]["kind"]))
        if not known:  # T_comm would be each kernel's duration, waiting for the unseen members included
            raise NotEvaluated(f"{facts.members_missing}: nothing bounds the transfer of its collectives, whose "
                               f"kernels also wait for the members not given ({bound_by})")
        exposed = median(r["exposed_us"] for r in rows)
        bubble = median(r["min_bubble_us"] for r in rows)
        t = ctx.thresholds
        if exposed < t["bubble_fraction"] * step_us or bubble < t["min_bubble_fraction"] * step_us:
            if bound_by and self._fires_unbounded(facts, ddp, step_us, t):
                # The bound is the least the transfer can be: below it the step fits, but the rest of
                # the kernels may be transfer on a slower link as well as waiting for the unseen members.
                raise NotEvaluated(f"{facts.members_missing}: with the transfer bounded by the link model the "
                                   "communication fits under compute, but the rest of its kernels' time may be "
                                   "transfer on a slower link as well as waiting for the members not given")
            return []
        rep = min(rows, key=lambda r: (abs(r["min_bubble_us"] - bubble), r["rank"], str(r["step"])))
        window = "T_bwd" if rep["kind"] == "ddp" else "T_fwd+bwd"
        summary = (f"Communication takes {fmt_us(rep['t_comm_us'])} per step but the {window} window is "
                   f"{fmt_us(rep['t_window_us'])} (first-bucket wait {fmt_us(rep['wait_us'])}): at least "
                   f"{fmt_us(bubble)} cannot be hidden, and {fmt_us(exposed)} ({100 * exposed / step_us:.0f}% "
                   f"of the step) is exposed.")
        model = (f"critical overlap: T_comm ≤ {window} − T_first_wait ⇔ {rep['t_comm_us']:,.0f} µs ≤ "
                 f"{rep['t_window_us']:,.0f} − {rep['wait_us']:,.0f} µs: false; bubble ≥ T_comm + T_first_wait "
                 f"− {window} = {rep['min_bubble_us']:,.0f} µs (rank {rep['rank']}, step {rep['step']})")
        if bound_by:
            summary += f" T_comm is the {bound_by}."
            model += f"; T_comm: {bound_by}"
        hit = [r for r in rows if r["min_bubble_us"] >= t["min_bubble_fraction"] * step_us]
        step_us = facts.model.step_time_us
        gain, best, prediction = self._prediction(ctx, rep["kind"])
        if gain is not None:
            summary += (f" The best fix the what-if projects, {best}, cuts the typical step from "
                        f"{fmt_us(step_us)} to {fmt_us(prediction['predicted_step_time_us'])}.")
        memory = _fix_memory(facts, best, rep["kind"])
        evidence = CommBoundEvidence(
            representative=RankStepRef(rep["rank"], rep["step"]),
            t_comm_us=round(rep["t_comm_us"], 1), t_window_us=round(rep["t_window_us"], 1),
            window=window, first_bucket_wait_us=round(rep["wait_us"], 1),
            min_bubble_us_median=round(bubble, 1), exposed_comm_us_median=round(exposed, 1),
            step_time_us=round(step_us, 1),
            by_rank_step=[[r["rank"], r["step"], round(r["t_comm_us"], 1), round(r["t_window_us"], 1),
                           round(r["exposed_us"], 1)] for r in rows],
            collectives=rep["collectives"], t_comm_basis=bound_by or "measured (every rank's trace given)",
            prediction=prediction,
            # where the projected fix changes memory (HYBRID_SHARD, a bucket cap)
            memory=memory if memory is not None else UNSET)
        return [ctx.finding(summary=summary, ranks=[r["rank"] for r in hit], steps=[r["step"] for r in hit],
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            fix_text="", fixes=self._fixes(best))]

    @staticmethod
    def _fixes(best: str | None) -> list[Fix]:
        """The fixes, the what-if's best projection first (judged for this job by the projection
        itself: a strategy change like HYBRID_SHARD from DDP is one), then the general ones."""
        if best is None:
            return list(FIXES)
        general = [f for f in FIXES if not ("HYBRID_SHARD" in best and "HYBRID_SHARD" in f.text)]
        return [Fix(f"{best}, the best fix the what-if projects for this job"), *general]

    @staticmethod
    def _prediction(ctx, kind: str) -> tuple[float | None, str | None, dict]:
        """(gain, best fix, prediction): every fix the what-if projection can make for this job,
        each with its projected typical step; the gain is the best one's."""
        facts, step_us = ctx.facts, ctx.model.step_time_us
        whatif = ctx.gains.what_if(ctx.result)
        nodes, g = whatif.measured("measured_nodes"), whatif.measured("measured_gpus_per_node")
        strategy = whatif.measured("measured_strategy")
        if nodes is None:
            return None, None, not_predicted("the what-if projection cannot project this trace "
                                       "(no data-parallel schedule it models): no fix is projected")
        options: list[tuple[str, dict]] = []
        nics = whatif.measured("measured_nics_per_node")
        if nodes > 1 and g and nics and nics < g:
            options.append((f"one NIC per GPU ({g} per node, measured {nics})", {"nics_per_node": g}))
        if nodes > 1 and strategy in ("ddp", "fsdp-full"):
            layers = layer_count(facts, {(v.rank, v.step): 1 for v in facts.steps})[0] if strategy == "ddp" else None
            units = {"fsdp_units": layers} if layers and layers > 1 else {}
            options.append(("HYBRID_SHARD (shard inside each node, all-reduce shards across nodes)"
                            + (f" with {layers} units (one per block)" if units else ""),
                            {"strategy": "hsdp", **units}))
        cap = _bucket_cap_mib(facts) if kind == "ddp" else None
        if cap is not None:
            options.append((f"bucket_cap_mb={cap:g} (fewer, larger all-reduces)", {"bucket_mb": cap}))
        projected = [(label, whatif.fix(**changes)) for label, changes in options]
        alternatives = [alternative(label, step_us, fix) for label, fix in projected]
        found = [(fix.gain_us, label, fix) for label, fix in projected if fix is not None]
        if not found:
            return None, None, not_predicted("no fix the what-if projection models applies here (a single node, "
                                       "one NIC per GPU already, or a schedule it cannot project): cut the "
                                       "bytes or add compute per step", alternatives)
        gain, label, fix = max(found, key=lambda f: (f[0], f[1]))
        model = f"{fix.model}, the best of {len(found)} fix(es): {label}"
        return gain, label, predicted(step_us, gain, model, fix.assumptions(), fix.command, alternatives,
                                      step_after_us=fix.step_after(step_us), changes=fix.changes)

    @staticmethod
    def _comm_rows(facts, kind: str) -> Iterator[dict]:
        """The collective rows T_comm sums: the backward all-reduces (DDP) or every GPU
        collective but point-to-point (the window). Made as they are read: transfer_bound
        reads none when every rank's trace is given (a dict per row was 2 million at 1,024 ranks)."""
        if kind == "ddp":
            return (c for c in facts.data_parallel_of("allreduce", "backward") if c.get("on_gpu"))
        view = CollectiveColumns.of(facts.result)
        kinds = tuple(k for k in view.kind.names if k not in POINT_TO_POINT)
        return (c for c in facts.rows_of_kinds(kinds) if c.get("on_gpu"))

    @classmethod
    def _fires_unbounded(cls, facts, ddp: bool, step_us: float, t) -> bool:
        """Whether the rule would fire with T_comm at its most: each kernel less the waits the
        given ranks measure (transfer on a link as slow as the kernels say)."""
        rows = cls._ddp_rows(facts, upper=True) if ddp else cls._window_rows(facts, upper=True)
        return bool(rows) and median(r["min_bubble_us"] for r in rows) >= t["min_bubble_fraction"] * step_us \
            and median(r["exposed_us"] for r in rows) >= t["bubble_fraction"] * step_us

    @staticmethod
    def _ddp_rows(facts, upper: bool = False):
        steps = ddp_steps(facts, need_link=False)  # a large job has thousands: the bound of all at once
        t_comm = [facts.backward_allreduce_upper_us.get((s.rank, s.step), 0) if upper
                  else backward_transfer_us(facts, s.rank, s.step) for s in steps]
        backward = [s.backward_us for s in steps]
        wait = [s.first_wait_us for s in steps]
        bubbles = models.critical_overlap_bubbles(t_comm, backward, wait)
        return [{"kind": "ddp", "rank": s.rank, "step": s.step, "t_comm_us": comm, "t_window_us": window,
                 "wait_us": first_wait, "min_bubble_us": bubble,
                 "exposed_us": facts.step_view(s.rank, s.step).exposed_comm_us,
                 "collectives": "backward all-reduce (DDP gradient buckets)"}
                for s, comm, window, first_wait, bubble in zip(steps, t_comm, backward, wait, bubbles)]

    @staticmethod
    def _window_rows(facts, upper: bool = False):
        rows = []
        for view in facts.steps:
            phases = [view.windows[p] for p in ("forward", "backward") if p in view.windows]
            # send/recv durations include waiting for the peer stage (no cross-rank match gives
            # their transfer time): a pipeline's bubble is pipeline-bubble's, not this rule's
            colls = [c for c in facts.collectives_of(view.rank, view.step)
                     if c.get("on_gpu") and c["collective"] not in POINT_TO_POINT]
            if not phases or not colls:
                continue
            window = max(w[1] for w in phases) - min(w[0] for w in phases)
            t_comm = sum(facts.transfer_upper_time(c) if upper else facts.transfer_time(c) for c in colls)
            bound = models.critical_overlap(t_comm, window, 0.0)
            kinds = sorted({c["collective"] for c in colls})
            rows.append({"kind": "window", "rank": view.rank, "step": view.step, "t_comm_us": t_comm,
                         "t_window_us": window, "wait_us": 0.0, "min_bubble_us": bound.min_bubble_us,
                         "exposed_us": view.exposed_comm_us, "collectives": ", ".join(kinds)})
        return rows


def _fix_memory(facts, best: str | None, kind: str) -> dict | None:
    """``evidence.memory`` of the best projected fix where it changes memory: HYBRID_SHARD
    (from DDP it only frees memory; from FULL_SHARD it holds 16Ψ/g instead of 16Ψ/N) or a
    bucket cap; None for a fix that moves no memory (more NICs) or none."""
    if best is None:
        return None
    if best.startswith("bucket_cap_mb") and kind == "ddp":
        steps = ddp_steps(facts)
        return bucket_cap_memory(facts, sum(representative(steps, facts.model).bucket_bytes)) if steps else None
    if not best.startswith("HYBRID_SHARD"):
        return None
    g = facts.gpus_per_node
    if facts.strategy == "ddp":
        return fix_memory(facts, None, source="HYBRID_SHARD shards the 16Ψ DDP holds over each node", frees_only=True)
    psi, _ = parameter_count(facts)
    n = facts.world_size
    if not (psi and g and n):
        return fix_memory(facts, None, source="Ψ or the shard group unknown")
    after = models.hsdp_memory_bytes(psi, g)
    return fix_memory(facts, after - models.zero3_memory_bytes(psi, n), after,
                      f"static state 16Ψ/g − 16Ψ/N (g = {g}, N = {n}; docs/models.md §3)")


def _bucket_cap_mib(facts) -> float | None:
    """The bucket cap (MiB) the DDP bucket model wants when it is larger than the measured
    buckets (latency-bound all-reduces), else None."""
    steps = ddp_steps(facts)
    if not steps:
        return None
    rep = representative(steps, facts.model)
    choice, _, saving = rep.cap_saving()
    if saving <= 0 or choice.cap_bytes <= statistics.median(rep.bucket_bytes):
        return None
    return choice.cap_bytes / models.MIB
