"""gpu-idle-queued (TC305)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_us
from analyzer.job.facts import median
from analyzer.job.model import WAITED_ON  # the words (the model's, which the views say too)
from analyzer.rules.evidence_types import UNSET, Evidence, Share, Text, UnsetType, Us, keys, label
from analyzer.rules.evidence_shared import Prediction, StepNumber, StepTimeOfThoseRanks, TypicalStep
from analyzer.rules.engine import NotEvaluated, Rule, Threshold, register
from analyzer.rules.host import REPLAY_GAIN, idle_split_note, ranks_phrase, replayed_rank_fixes

# A copy's name says where its host memory lives (CUPTI: "Memcpy HtoD (Pageable -> Device)").
PAGEABLE = "Pageable"


class QueuedIdleEvidence(Evidence, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Keyword-only: the fields in the order the rule writes them, ``idle_split`` only sometimes."""

    step: StepNumber
    queued_idle_share_by_rank: Annotated[dict[str, Share], label("queued idle share per rank"), keys("rank")]
    queued_idle_us_median: Annotated[Us, label("GPU idle with work launched (median)")]
    step_time_us: TypicalStep
    step_time_us_median_of_those_ranks: StepTimeOfThoseRanks
    queued_idle_by_median_us: Annotated[dict[str, Us], label("queued idle by what it waits on (median)"),
                                        keys("waited on")]
    waited_on: Annotated[Text, label("waits on")]
    waiting_ops_us: Annotated[dict[str, Us], label("waiting ops"), keys("op")]
    host_in_blocking_call_us_median: Annotated[Us, label("host in a blocking call meanwhile (median)")]
    idle_split: Annotated[Text | UnsetType, label("idle split")] = UNSET
    waited_copies_exposed_us_median: Annotated[Us, label("exposed copies waited on (median)")]
    prediction: Prediction | UnsetType = UNSET


@register
class GpuIdleQueued(Rule):
    """The GPU sits idle with work already launched: the next op waits behind a dependency (a
    copy, another stream's event, a CUDA graph, a collective elsewhere), not for its host.

    What it detects:
        Ranks whose GPU runs nothing for at least ``idle_fraction`` of the typical step while
        the work that ends each idle gap had been launched before (analyzer.rank.attribution:
        each gap after the launch of the work that ends it, + the launch latency, is queued
        idle). The queued idle is split by what the waiting work is: a copy, a collective, the
        work of a CUDA graph launch, or anything else (a stream waiting on an event of another
        stream, another GPU or the host); the ops that waited longest are named, and the share
        of the wait the host spent in a blocking call (a copy to pageable memory,
        ``cudaStreamSynchronize``).

    Why it matters:
        The host is ahead and the GPU still idles: a faster host, data loader or ``torch
        .compile`` recovers none of it. A copy from or to pageable memory is the classic case:
        the driver stages it through a pinned buffer on the host, the copy cannot start before
        its bytes are staged, and the work queued behind it waits.

    Evidence:
        Each rank's queued idle share of the typical step, the queued idle by what it waited on,
        the ops that waited longest, the time the host sat in a blocking call meanwhile, and a
        caveat when the trace cannot tell host-caused from queued idle (a filtered trace).

    Fix:
        Follows the dependency: for a copy from or to pageable memory, pinned host memory and
        ``non_blocking=True`` (``DataLoader(pin_memory=True)``, a pinned destination for
        device-to-host copies); a blocking sync meanwhile moves out of the step; a collective's
        dependency is its stream's wait and the peers (straggler-rank, exposed-communication);
        a CUDA graph's, its inputs and the events it waits on; an event's, the stream whose work
        records it.

    References:
        docs/models.md §6 (idle time lowers MFU directly); CUDA C Programming Guide, "Page-
        Locked Host Memory" and "Asynchronous Concurrent Execution"; PyTorch docs, "Use pinned
        memory buffers" (CUDA semantics).
    """

    name = "gpu-idle-queued"
    code = "TC305"
    title = "Launched work does not wait on the GPU"
    failure_title = "The GPU idles with work already launched: it waits behind a dependency"
    severity = "warning"
    needs = ("gpu_steps",)
    fix_requires = ()  # its fix follows the dependency the idle waited on (no job premise)
    thresholds = {
        "idle_fraction": Threshold(0.10, "GPU idle with work launched and waiting, as a fraction of the typical "
                                   "step on a rank, from which the rule fires for that rank", 0.0, 1.0),
        "sync_share": Threshold(0.5, "share of the queued idle the host spends in a blocking call from which "
                                "the fix also moves that call out of the step", 0.0, 1.0),
    }
    recovers = ("idle_us", "exposed_wait_us")  # on some ranks only: the others wait for them
    references = ("docs/models.md §6", "CUDA C Programming Guide: page-locked host memory, asynchronous "
                  "concurrent execution", "PyTorch docs: CUDA semantics, pinned memory buffers")

    Evidence = QueuedIdleEvidence

    def check(self, ctx):
        rows = [(r.rank, r.time_breakdown) for r in ctx.result.ranks if r.time_breakdown]
        if not rows:
            raise NotEvaluated("no time breakdown of a typical step (no GPU steps on any rank)")
        if not any("idle_queued_us" in (tb.get("details") or {}) for _, tb in rows):
            raise NotEvaluated("the result has no split of idle into host-caused and queued (saved by an older "
                               "tracecliff)")
        details = {rank: tb["details"] for rank, tb in rows}
        shares = {rank: details[rank].get("idle_queued_us", 0.0) / tb["step_time_us"]
                  for rank, tb in rows if tb["step_time_us"]}
        hit = sorted(rank for rank, share in shares.items() if share >= ctx.thresholds["idle_fraction"])
        if not hit:
            return []
        by_rank = dict(rows)
        step = by_rank[hit[0]]["step"]
        queued = median(details[r]["idle_queued_us"] for r in hit)
        causes = {k: round(median((details[r].get("idle_queued_by") or {}).get(k, 0.0) for r in hit), 1)
                  for k in WAITED_ON}
        lead = max(causes, key=lambda k: (causes[k], k))
        ops = _ops([(details[r].get("idle_queued_ops") or {}).get(lead) or {} for r in hit])
        in_sync = median(details[r].get("idle_queued_in_sync_us", 0.0) for r in hit)
        own_step_us = median(by_rank[r]["step_time_us"] for r in hit)
        who = ranks_phrase(hit, len(rows))
        waited = ", ".join(f"{WAITED_ON[k]} {fmt_us(v)}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1]) if v)
        top = ", ".join(f"{_short(name)} {fmt_us(us)}" for name, us in list(ops.items())[:2])
        top = f"; the work that waited longest on {WAITED_ON[lead].split(' (')[0]}: {top}" if top else ""
        blocked = (f"; meanwhile the host sat in a blocking call (a copy to pageable memory, a stream or event "
                   f"synchronize) for {fmt_us(in_sync)} of it" if in_sync >= 0.05 * queued else "")
        note = idle_split_note(ctx)
        summary = (f"The GPU is idle {fmt_us(queued)} of its {fmt_us(own_step_us)} step {who} with work already "
                   f"launched (median of those ranks, typical step {step}; up to "
                   f"{100 * max(shares[r] for r in hit):.0f}%): it waited on {waited}{top}{blocked}."
                   + (f" Caveat: {note}." if note else ""))
        model = ("queued idle = the step window's time with nothing running on the GPU while the work that ends "
                 "each idle gap had been launched (from its launch + the launch latency to its start); "
                 "attributed to what that work is (a copy, a collective, a CUDA graph's work, else an event "
                 "wait); the gain is an upper bound: all of that idle recovered, and for a copy also its own time "
                 "where nothing ran beside it (the fix overlaps it with compute)")
        fix, snippet = dependency_fix(lead, ops, in_sync >= ctx.thresholds["sync_share"] * queued)
        # A copy the fix turns into a DMA under compute gives back its own exposed time as well.
        copies = median(details[r].get("queued_copies_us", 0.0) for r in hit) if lead == "copy" else 0.0
        recovers = {"idle_us": queued, **({"other_gpu_us": copies} if copies else {})}
        gain = queued + copies  # without a replay: an upper bound
        # a copy's own time is no stretch of idle the replay can take out: the upper bound stands
        replayed = None if copies else replayed_rank_fixes(ctx, {r: "queued" for r in hit}, len(rows))
        prediction = UNSET
        if replayed is not None:
            gain, recovers, prediction = replayed
            model = f"{model}; {REPLAY_GAIN}"
        evidence = QueuedIdleEvidence(
            step=step, queued_idle_share_by_rank={str(r): round(v, 3) for r, v in sorted(shares.items())},
            queued_idle_us_median=round(queued, 1), step_time_us=round(ctx.model.step_time_us, 1),
            step_time_us_median_of_those_ranks=round(own_step_us, 1),
            queued_idle_by_median_us=causes, waited_on=lead,
            waiting_ops_us={name: round(us, 1) for name, us in ops.items()},
            host_in_blocking_call_us_median=round(in_sync, 1),
            idle_split=note if note else UNSET,
            waited_copies_exposed_us_median=round(copies, 1),
            prediction=prediction)
        return [ctx.finding(summary=summary, ranks=hit, steps=[step], evidence=evidence,
                            estimated_gain_us=gain, model=model, fix_text=fix, fix_snippet=snippet,
                            recovers=recovers)]


def _ops(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The ops that waited longest on the firing ranks (µs, mean over them), by time then name."""
    totals: dict[str, float] = {}
    for ops in per_rank:
        for name, us in ops.items():
            totals[name] = totals.get(name, 0.0) + us / len(per_rank)
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def _short(name: str, limit: int = 60) -> str:
    """A kernel name cut to its head (template arguments make them hundreds of characters)."""
    head = name.split("(", 1)[0] if not name.startswith("Memcpy") else name
    return head if len(head) <= limit else head[:limit - 1] + "…"


def dependency_fix(lead: str, ops: dict[str, float], blocked: bool) -> tuple[str, str | None]:
    """The fix for the dependency the queued work mostly waited on, naming the op."""
    name = next(iter(ops), None)
    op = f" ({_short(name)})" if name else ""
    sync = (" The host also sits in a blocking call through most of the wait: move it out of the step "
            "(read values every N steps, copy them into pinned memory with non_blocking=True).") if blocked else ""
    pageable = any(PAGEABLE in n for n in ops if n.startswith("Memcpy"))
    if lead == "copy" and pageable:
        return ("The GPU waits for a copy from or to pageable memory" + op + ": the driver stages it through a "
                "pinned buffer on the host, so it starts only when its bytes are staged. Use pinned memory and "
                "non_blocking=True (DataLoader(pin_memory=True), a pinned destination for device-to-host copies): "
                "the copy becomes a DMA that overlaps compute." + sync,
                "loader = DataLoader(dataset, ..., pin_memory=True)\n"
                "batch = batch.to(device, non_blocking=True)\n"
                "host_buf = torch.empty(shape, dtype=dtype, pin_memory=True)\n"
                "host_buf.copy_(metrics, non_blocking=True)   # then event.synchronize() when it is read")
    if lead == "copy":
        return ("The GPU waits for a copy" + op + " that waits on another stream or the host: issue it earlier "
                "(prefetch on a side stream) from pinned memory with non_blocking=True." + sync, None)
    if lead == "collective":
        return ("Launched work waits for a collective" + op + " whose kernel could not start: its stream waits "
                "on another stream's event or on a peer; see straggler-rank and exposed-communication for the "
                "peers, and overlap the collective with independent compute." + sync, None)
    if lead == "graph":
        return ("The work of a CUDA graph launch waits" + op + ": the graph depends on an event or a host node "
                "that comes late; replay it once its inputs are ready, or capture without the wait." + sync, None)
    return ("Launched work" + op + " waits on an event: its stream waits for work another stream, GPU or host "
            "callback records later; record the event earlier or make the work independent of it." + sync, None)
