"""exposed-communication (TC304)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from analyzer.base.units import fmt_bytes, fmt_us
from analyzer.job.model import group_label, wait_words
from analyzer.job.facts import median
from analyzer.model import formulas as models
from analyzer.rules.evidence_types import UNSET, Bytes, Count, Evidence, Share, Text, UnsetType, Us, keys, label
from analyzer.rules.evidence_shared import ExposedShare, Prediction, StepNumber, TypicalStep, WaitSource
from analyzer.rules.engine import Fix, NotEvaluated, Rule, Threshold, register
from analyzer.job.prediction_doc import predicted

# The collective kinds whose exposed transfer a finding of each specific rule explains (None:
# every kind), and the rules that explain the waiting (a late rank).
EXPLAINS: dict[str, tuple[str, ...] | None] = {
    "comm-bound-step": None,
    "ddp-bucket-oversized": ("allreduce",), "ddp-bucket-undersized": ("allreduce",),
    "fp32-gradient-comm": ("allreduce", "reduce_scatter"),
    "fsdp-fullshard-cross-node": ("allgather", "reduce_scatter"),
    "fsdp-missing-wrap-policy": ("allgather", "reduce_scatter"),
    "fsdp-no-prefetch": ("allgather", "reduce_scatter"),
    "fsdp-where-ddp-fits": ("allgather", "reduce_scatter"),
    # model parallelism (issue 12's rules): their own groups' collectives
    "tp-cross-node": ("allreduce", "allgather", "reduce_scatter"),
    "ep-alltoall-exposed": ("alltoall",),
    "pipeline-bubble": ("send", "recv", "sendrecv"),
}
WAIT_RULES = ("straggler-rank",)

_FIX_BY_KIND = {
    "alltoall": (Fix("overlap the embedding all-to-all with dense compute (pipeline the sparse stage "
                     "one batch ahead, e.g. TorchRec's TrainPipelineSparseDist) and cut its bytes "
                     "(fp16/bf16 or quantized embedding communication)",
                     "pipeline = TrainPipelineSparseDist(model, optimizer, device)  # torchrec", ("training",)),),
    "allreduce": (Fix("overlap the all-reduces with backward compute (gradient buckets, no synchronous "
                      "per-tensor all-reduce)", "model = DDP(model, bucket_cap_mb=25)", ("training",),
                      snippet_requires=("ddp",)),
                  Fix("cut their bytes (bf16 gradients / reduce dtype)",
                      "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
                      "model.register_comm_hook(None, default_hooks.bf16_compress_hook)",
                      ("training", "gradients_wide", "ddp")),
                  Fix("cut their bytes (bf16 reduce dtype)", None, ("training", "gradients_wide", "fsdp"))),
    "allgather": (Fix("prefetch the all-gathers under the previous compute (FSDP forward/backward "
                      "prefetch); an optimizer-step all-gather can overlap the next forward",
                      "FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)",
                      ("fsdp",)),),
    "reduce_scatter": (Fix("overlap the reduce-scatters with backward compute", None, ("training",)),
                       Fix("cut their bytes (bf16 reduce dtype)", None, ("training", "gradients_wide"))),
    "broadcast": (Fix("broadcast once, not per step (e.g. broadcast_buffers=False in DDP)"),),
}
_FIX_FORWARD_ALLREDUCE = Fix("the all-reduces in the forward pass are activation (tensor-parallel) all-reduces "
                             "the next layer waits for: keep the tensor-parallel group inside a node (NVLink), "
                             "overlap them with the next GEMM (sequence parallelism / async TP, e.g. "
                             "torch.distributed._symmetric_memory or TransformerEngine comm overlap), or use a "
                             "smaller tensor-parallel degree")
_FIX_SYNC = Fix("all-reduce gradients in buckets that overlap backward (wrap the model in "
                "DistributedDataParallel, or all_reduce(async_op=True) on flattened buckets) instead of one "
                "synchronous all-reduce per parameter",
                "model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)\n"
                "# not: for p in model.parameters(): dist.all_reduce(p.grad)", ("training",))
_FIX_WAIT = Fix("most of it is waiting for late ranks: find why they arrive late (the straggler-rank "
                "and gpu-idle-host-bound findings and the per-rank breakdown name them)")


class CommCell(Evidence, frozen=True, forbid_unknown_fields=True):
    """Exposed communication of a collective kind, phase or group (analyzer.job.attribution's cell)."""

    transfer_us: Annotated[Us, label("transfer")]
    wait_us: Annotated[Us, label("waiting")]


class AlphaBetaEstimate(Evidence, frozen=True, forbid_unknown_fields=True):
    """A collective kind in a group, mean per rank over the typical step: measured against the α-β model."""

    collective: Annotated[Text, label("collective")]
    group: Annotated[Text, label("process group")]
    count: Annotated[Count, label("count")]
    measured_transfer_us: Annotated[Us, label("measured transfer")]
    why: Annotated[Text | UnsetType, label("why")] = UNSET
    bytes: Annotated[Bytes | UnsetType, label("bytes")] = UNSET
    model_us: Annotated[Us | UnsetType, label("α-β model")] = UNSET
    link_source: Annotated[Text | UnsetType, label("link from")] = UNSET


class SyncAllreduces(Evidence, frozen=True, forbid_unknown_fields=True):
    """Unbucketed synchronous all-reduces: one after another, mostly exposed."""

    per_step: Annotated[Count, label("per step")]
    serialized_share: Annotated[Share, label("serialized share")]
    exposed_share: ExposedShare


class ParallelismOwnCost(Evidence, frozen=True, forbid_unknown_fields=True):
    """Communication a parallelism puts on the critical path by design (judged by its own rule)."""

    kinds: Annotated[list[Text], label("collectives")]
    wait_us: Annotated[Us, label("waiting")]
    tp_transfer_us: Annotated[Us, label("tensor-parallel transfer")]
    tp_groups_intra_node: Annotated[list[Text], label("tensor-parallel groups inside a node")]


class ExposedCommEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    step: StepNumber
    step_time_us: TypicalStep
    exposed_wait_us: Annotated[Us, label("exposed waiting for late peers")]
    exposed_transfer_us: Annotated[Us, label("exposed transfer")]
    unexplained_us: Annotated[Us, label("not explained by a collective's model")]
    explained_by: Annotated[list[Text], label("explained by")]
    by_kind: Annotated[dict[str, CommCell] | None, label("by collective"), keys("collective")]
    by_phase: Annotated[dict[str, CommCell] | None, label("by phase"), keys("phase")]
    by_group: Annotated[dict[str, CommCell] | None, label("by process group"), keys("group")]
    wait_by_peer: Annotated[dict[str, Us] | None, label("waiting by the rank waited for"), keys("rank")]
    wait_source: WaitSource
    alpha_beta: Annotated[list[AlphaBetaEstimate], label("α-β estimate per collective")]
    synchronous_allreduces: Annotated[SyncAllreduces | None, label("synchronous all-reduces")]
    parallelism_own_cost: Annotated[ParallelismOwnCost, label("the parallelism's own communication")]
    prediction: Prediction


@register
class ExposedCommunication(Rule):
    """A large share of the step is spent in communication that nothing overlaps, and no more
    specific rule explains it.

    What it detects:
        From the time breakdown of the typical step (mean over ranks): exposed communication,
        waiting for late peers plus transfer, as a share of the step. The part that findings of
        the specific rules explain is taken off (the waiting when straggler-rank fired, the
        transfer of the collective kinds a fired rule is about, all of it when comm-bound-step
        fired); the rule
        fires when what is left is at least ``exposed_fraction`` of the step. Any collective
        kind counts (all-reduce, all-gather, reduce-scatter, all-to-all, point-to-point), in
        any process group and phase.

    Why it matters:
        Exposed communication is time the GPU does no useful work; it grows with the number of
        ranks and the network's share of the step. Most of it can be hidden under compute or
        made smaller; waiting for late peers is lost to every rank that waits.

    Evidence:
        The typical step's exposed time split into waiting (by the peer waited for) and
        transfer, by collective kind, process group and phase; for each kind, the α-β model's
        time for the bytes moved on the group's link (measured fit where there is one, else the
        hardware profile) beside the measured transfer.

    Fix:
        Follows the largest kind: overlap it with compute (bucketing, prefetch, pipelining the
        sparse stage), cut its bytes (lower-precision communication), or, when waiting
        dominates, make the late ranks arrive on time.

    References:
        docs/models.md §2 (α-β collective times), §4 (overlap); Thakur, Rabenseifner & Gropp,
        IJHPCA 2005; Holistic Trace Analysis: communication-computation overlap.
    """

    name = "exposed-communication"
    code = "TC304"
    title = "Communication is hidden under compute"
    failure_title = "Communication nothing hides takes a large share of the step"
    severity = "warning"
    needs = ("gpu_steps", "communication")
    fix_requires = ()  # each of its fixes declares its own (a Fix's requires)
    runs_last = True  # it covers what the other rules leave unexplained
    thresholds = {
        "exposed_fraction": Threshold(0.10, "exposed communication no other finding explains, as a "
                                      "fraction of the typical step, from which the rule fires", 0.0, 1.0),
        "min_sync_allreduces": Threshold(16, "all-reduces per step, each launched after the previous "
                                         "ended and mostly exposed, from which they are called synchronous "
                                         "per-parameter all-reduces", 2, 1e9),
    }
    recovers = ("exposed_wait_us", "exposed_transfer_us")
    references = ("docs/models.md §2", "docs/models.md §4", "Thakur, Rabenseifner & Gropp, IJHPCA 2005",
                  "Holistic Trace Analysis: comm-comp overlap")

    Evidence = ExposedCommEvidence

    def check(self, ctx):
        typical = ctx.model.typical
        if typical is None:
            raise NotEvaluated("no time breakdown of a typical step (no GPU steps on any rank)")
        tb = ctx.result.attribution  # its details, as the evidence quotes them
        step = typical.step_time_us
        wait, transfer = typical.leaves.exposed_wait_us, typical.leaves.exposed_transfer_us
        details = tb["details"]
        fired = {f["rule"] for f in ctx.findings}
        open_wait = 0.0 if fired & set(WAIT_RULES) else wait
        sync = _synchronous_allreduces(ctx, tb["step"], ctx.thresholds["min_sync_allreduces"])
        # Serialized per-gradient all-reduces are lost whatever their dtype or bucket model says.
        explained = [EXPLAINS[r] for r in fired if r in EXPLAINS and not (sync and EXPLAINS[r] is not None)]
        by_design = _owned_by_parallelism(ctx, details)
        open_transfer = sum(c["transfer_us"] for kind, c in (details.get("by_kind") or {}).items()
                            if not any(e is None or kind in e for e in explained) and kind not in by_design.kinds)
        open_wait = max(0.0, open_wait - by_design.wait_us)
        open_transfer = max(0.0, open_transfer - by_design.tp_transfer_us)
        unexplained = open_wait + open_transfer
        if unexplained < ctx.thresholds["exposed_fraction"] * step:
            return []
        kinds = _ranked(details.get("by_kind") or {})
        phases = _ranked(details.get("by_phase") or {})
        groups = _ranked(details.get("by_group") or {})
        model = _alpha_beta(ctx, tb["step"])
        summary = (f"Exposed communication takes {fmt_us(wait + transfer)} of the {fmt_us(step)} typical step "
                   f"({100 * typical.exposed_share:.0f}%): {fmt_us(wait)} {wait_words(tb.get('wait_source'))} and "
                   f"{fmt_us(transfer)} transfer; by collective {_list(kinds)}; by phase {_list(phases)}; "
                   f"by process group {_list(groups)}; "
                   f"{fmt_us(unexplained)} of it no other finding explains{_wait_caveat(tb)}.")
        if sync:
            summary += (f" {sync.per_step:g} all-reduces per step run one at a time, each launched after the "
                        f"previous one ended ({100 * sync.serialized_share:.0f}%) and {100 * sync.exposed_share:.0f}% "
                        "exposed: synchronous, unbucketed (per-parameter) gradient all-reduces.")
        fixes = [_FIX_SYNC] if sync else []
        fixes += [_FIX_WAIT] if open_wait > open_transfer else []
        fixes += [fix for kind, _ in kinds[:2] for fix in _fix_for(kind, _ranked(details.get("by_kind_phase") or {}))]
        evidence = ExposedCommEvidence(
            step=tb["step"], step_time_us=step, exposed_wait_us=wait, exposed_transfer_us=transfer,
            unexplained_us=round(unexplained, 1), explained_by=sorted(fired & (set(EXPLAINS) | set(WAIT_RULES))),
            by_kind=details.get("by_kind"), by_phase=details.get("by_phase"),
            by_group=details.get("by_group"), wait_by_peer=details.get("wait_by_peer"),
            wait_source=tb.get("wait_source"), alpha_beta=model, synchronous_allreduces=sync,
            parallelism_own_cost=by_design,
            prediction=predicted(step, unexplained, "upper bound: every exposed µs no other finding explains "
                                    "hidden under compute or made unnecessary (|comm \\ compute| of the typical step, "
                                    "docs/models.md §4)", {
                                        "overlap": {"value": "full", "origin": "assumed",
                                                    "source": "the fix hides or removes all of it (bucketing, prefetch, "
                                                              "pipelining, fewer bytes); the compute is enough to hide it"},
                                        "waiting": {"value": round(open_wait, 1), "origin": _wait_origin(tb),
                                                    "source": "waiting for late peers counted as recoverable: the late "
                                                              "ranks arrive on time"}}))
        model_text = "; ".join(
            f"{m.collective} in {m.group}: {m.count:g} per rank, {fmt_bytes(m.bytes)} → α-β "
            f"{fmt_us(m.model_us)} ({m.link_source}) vs measured transfer "
            f"{fmt_us(m.measured_transfer_us)}" if m.model_us is not UNSET else
            f"{m.collective} in {m.group}: {m.why}" for m in model)
        ranks = sorted({r.rank for r in ctx.result.ranks if r.time_breakdown})
        return [ctx.finding(
            summary=summary, ranks=ranks, steps=[tb["step"]], evidence=evidence,
            estimated_gain_us=unexplained,
            recovers={"exposed_wait_us": open_wait, "exposed_transfer_us": open_transfer},
            model=("exposed = |comm \\ compute| over the step window, waiting = the part of each collective "
                   "before its last member arrived; the gain is an upper bound (all of it hidden). "
                   + model_text),
            fix_text="", fixes=fixes)]


def _fix_for(kind: str, kind_phases: list[tuple[str, float]]) -> tuple[Fix, ...]:
    """The fix for a kind, by the phase where most of its exposed time is: an all-reduce in the
    forward pass is an activation (tensor-parallel) all-reduce, not a gradient one."""
    phase = next((label.split(" ", 1)[1] for label, _ in kind_phases if label.split(" ", 1)[0] == kind), None)
    if kind == "allreduce" and phase == "forward":
        return (_FIX_FORWARD_ALLREDUCE,)
    return _FIX_BY_KIND.get(kind, (Fix(f"overlap the {kind} transfers with compute or cut their bytes"),))


def _wait_caveat(tb: dict[str, Any]) -> str:
    """Said when the waiting could not be measured on every rank (analyzer.job.attribution)."""
    source = tb.get("wait_source") or ""
    if source.startswith("not measured"):
        return " (one rank's trace: waiting is not measured and counts as transfer)"
    if source.startswith("estimated") and "ranks' traces given" in source:
        return (" (waiting is an α-β estimate: the transfer bounded by the link model, the rest waiting or "
                "contention; the other members' traces are missing)")
    if source.startswith("estimated"):
        return " (one rank's trace: waiting is an α-β estimate)"
    if "lower bound" in source:
        return f" (waiting is a lower bound: {source.split(':')[0]})"
    return ""


def _wait_origin(tb: dict[str, Any]) -> str:
    """How the waiting was obtained: measured by the cross-rank matching, else estimated."""
    return "estimated" if str(tb.get("wait_source") or "").startswith("estimated") else "measured"


def _synchronous_allreduces(ctx, step: Any, minimum: float) -> SyncAllreduces | None:
    """The pattern of unbucketed synchronous all-reduces, recognised without message sizes: many
    all-reduces per step on each rank, each launched only after the previous one ended (the host
    waited for it) and mostly not under compute. None when the typical step does not show it."""
    per_rank = []
    for rank in ctx.result.ranks:
        rows = sorted((c for c in ctx.facts.collectives_of(rank.rank, step)
                       if c["collective"] == "allreduce" and c.get("on_gpu") and c.get("launch_us") is not None),
                      key=lambda c: c["start_us"])
        if len(rows) < minimum:
            return None
        after = sum(b["launch_us"] >= a["start_us"] + a["dur_us"] for a, b in zip(rows, rows[1:]))
        exposed = sum(c["exposed_us"] or 0.0 for c in rows) / (sum(c["dur_us"] for c in rows) or 1.0)
        per_rank.append((len(rows), after / (len(rows) - 1), exposed))
    if not per_rank:
        return None
    count, serialized, exposed = (median(v[i] for v in per_rank) for i in range(3))
    if serialized < 0.8 or exposed < 0.8:
        return None
    return SyncAllreduces(per_step=count, serialized_share=round(serialized, 3), exposed_share=round(exposed, 3))


def _ranked(cells: dict[str, dict[str, float]]) -> list[tuple[str, float]]:
    totals = [(label, c["wait_us"] + c["transfer_us"]) for label, c in cells.items()]
    return sorted((t for t in totals if t[1] > 0), key=lambda t: (-t[1], t[0]))


def _owned_by_parallelism(ctx, details: dict[str, Any]) -> ParallelismOwnCost:
    """Communication a parallelism puts on the critical path by design, judged by that
    parallelism's own rule rather than counted as unexplained here: a pipeline's send/recv
    (their waits are the fill/drain bubble: pipeline-bubble) and tensor-parallel collectives
    inside a node (tp-cross-node judges the cross-node case; inside NVLink they are TP's price)."""
    by_kind = details.get("by_kind") or {}
    kinds: list[str] = []
    wait = 0.0
    if "pp" in (ctx.result.job.get("parallelism") or {}) and ctx.statuses.get("pipeline-bubble") in ("fired", "passed"):
        kinds = [k for k in ("send", "recv", "sendrecv") if k in by_kind]
        wait += sum(by_kind[k].get("wait_us") or 0.0 for k in kinds)
    tp_groups = {group_label(g) for g in ctx.result.groups or []
                 if g.get("role") == "tp" and g.get("cross_node") is False}
    by_group = details.get("by_group") or {}
    tp_transfer = sum(v.get("transfer_us") or 0.0 for k, v in by_group.items() if k in tp_groups)
    wait += sum(v.get("wait_us") or 0.0 for k, v in by_group.items() if k in tp_groups)
    return ParallelismOwnCost(kinds=kinds, wait_us=round(wait, 3), tp_transfer_us=round(tp_transfer, 3),
                              tp_groups_intra_node=sorted(g for g in tp_groups if g))


def _list(ranked: list[tuple[str, float]]) -> str:
    return ", ".join(f"{label} {fmt_us(value)}" for label, value in ranked[:3]) or "none"


def _alpha_beta(ctx, step: Any) -> list[AlphaBetaEstimate]:
    """Per (collective kind, group) of the typical step on the ranks, mean per rank: the bytes,
    the α-β model's time for them on the group's link, and the measured transfer time."""
    facts = ctx.facts
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    ranks = [r.rank for r in ctx.result.ranks if r.time_breakdown]
    for rank in ranks:
        for row in facts.collectives_of(rank, step):
            if not row.get("on_gpu"):
                continue
            key = (row["collective"], group_label(row.get("group")) or "unknown")
            cell = cells.setdefault(key, {"rows": [], "group": row.get("group") or {}})
            cell["rows"].append(row)
    out = []
    for (kind, group_name), cell in sorted(cells.items()):
        rows = cell["rows"]
        n = len(ranks)
        measured = sum(facts.transfer_time(r) for r in rows) / n
        entry = AlphaBetaEstimate(collective=kind, group=group_name, count=round(len(rows) / n, 1),
                                  measured_transfer_us=round(measured, 1))
        link = facts.link(cell["group"]) if kind in models.COLLECTIVE_KINDS else None
        if any(r.get("bytes") is None for r in rows):
            entry = msgspec.structs.replace(entry, why="message sizes unknown: no α-β estimate")
        elif link is None or link.n < 2:
            entry = msgspec.structs.replace(entry, why="link or group size unknown: no α-β estimate")
        else:
            entry = msgspec.structs.replace(
                entry, bytes=round(sum(r["bytes"] for r in rows) / n),
                model_us=round(sum(link.time_us(kind, r["bytes"]) for r in rows) / n, 1), link_source=link.source)
        out.append(entry)
    return out
