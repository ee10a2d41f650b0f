"""straggler-rank (TC302)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

import numpy as np

from analyzer.base.units import fmt_us
from analyzer.job.columns import CollectiveColumns, distinct_rows
from analyzer.rules.evidence_types import (UNSET, Count, Evidence, Flag, Share, Text, UnsetType, Us, inner, keys,
                                           label)
from analyzer.rules.evidence_shared import Cause, Prediction, RankNumber, TypicalStep, WaitSource
from analyzer.rules.engine import Fix, NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import POINT_TO_POINT, median
from analyzer.job.model import LEAF_NAMES
from analyzer.rules.gpu_idle_queued import WAITED_ON, dependency_fix
from analyzer.job.gains import Counterfactuals, GainEngine
from analyzer.job.prediction_doc import predicted
from analyzer.job.waits import (caused_in_step as _caused_in_step, excess_over_others as _excess,
                                recovers as _recovers, step_breakdowns as _steps_by_number, waited_for_ranks)

from analyzer.job.model import HOST_ACTIVITY
from analyzer.rules.host import HOST_FIX, host_fix

CAUSES = ("host", "queued", "compute", "entry-skew", "network", "unknown")


class LateCause(Evidence, frozen=True, forbid_unknown_fields=True):
    """Why a late rank is late (``_cause``'s dict, handed on: ``waited_on`` or ``host_activity``
    only for the causes that name one)."""

    lateness_us: Annotated[Us, label("lateness")]
    vs_median_rank_us: Annotated[dict[str, Us], label("against the median rank"), keys("part")]
    cause: Cause
    waited_on: Annotated[Text | UnsetType, label("waits on")] = UNSET
    host_activity: Annotated[Text | UnsetType, label("host activity")] = UNSET
    text: Annotated[Text | UnsetType, label("in words")] = UNSET


class ReplayRank(Evidence, frozen=True, forbid_unknown_fields=True):
    """A rank's fix replayed: alone, and in the greedy order after the named ones."""

    rank: RankNumber
    cause: Cause
    named: Annotated[Flag, label("named")]
    gain_alone_us: Annotated[Us, label("saving fixed alone")]
    predicted_step_alone_us: Annotated[Us, label("step fixed alone")]
    gain_in_order_us: Annotated[Us, label("saving in order")]
    whatif: Annotated[Text, label("what-if command")]


class StragglerEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    late_ranks: Annotated[list[Count], label("late ranks")]
    pattern: Annotated[Text, label("pattern")]
    main_late_rank: Annotated[Count, label("latest rank most often")]
    main_late_steps: Annotated[Count, label("steps it was the latest")]
    steady_steps: Annotated[list[Count], label("steady steps")]
    cause: Cause
    causes: Annotated[dict[str, LateCause], label("cause per late rank"), keys("rank")]
    caused_wait_direct_us: Annotated[dict[str, Us], label("waiting caused directly (mean over the steady steps)"),
                                     keys("rank")]
    caused_wait_share_direct: Annotated[dict[str, Share], label("share of the waiting caused directly"), keys("rank")]
    wait_per_step_us: Annotated[Us, label("others' wait for them (median rank not late)")]
    wait_measured_in: Annotated[Text, label("waiting measured in")]
    caused_wait_in_step_us: Annotated[Us, label("waiting for the late ranks in the typical step")]
    all_waiting_per_step_us: Annotated[Us, label("all waiting for late peers (mean over the steady steps)")]
    # [step, {rank: µs}] pairs
    caused_wait_by_step: Annotated[list[tuple[Count, dict[str, Us]]], label("waiting caused per steady step"),
                                   keys("step"), inner("rank")]
    lateness_by_step: Annotated[list[tuple[Count, dict[str, Us]]], label("lateness per steady step"),
                                keys("step"), inner("rank")]
    entry_skew: Annotated[dict[str, Us], label("late step entry without cost"), keys("rank")]
    step_time_us: TypicalStep
    wait_source: WaitSource
    # the replay of the named ranks' fixes, where it ran and named some
    per_rank: Annotated[list[ReplayRank] | UnsetType, label("replay per rank")] = UNSET
    recoverable_by_replay_us: Annotated[Us | UnsetType, label("recoverable by the replay")] = UNSET
    next_after_named: Annotated[dict[str, Us] | UnsetType, label("next latest once the named are fixed"),
                                keys("rank")] = UNSET
    replay_gain_beyond_leaves_us: Annotated[Us | UnsetType, label("replay's saving beyond the typical step's leaves")] = UNSET
    prediction: Prediction | UnsetType = UNSET


@register
class StragglerRank(Rule):
    """Some ranks arrive late at the collectives and the others wait for them: one rank step
    after step (persistent) or a different one in different steps (rotating).

    What it detects:
        For every collective matched across ranks (by Comms Id, else group and sequence number,
        else group and order), the rank that arrives last (the shortest kernel: the members of
        a collective end together) and, on every other rank, the part of its kernel before that
        arrival: its wait, of which the exposed part is the step's "waiting for late peers" leaf
        (analyzer.job.attribution), attributed to the rank waited for. Per steady step, the
        waiting each rank causes (mean over the ranks, as the leaf); the late ranks are the
        smallest set that causes ``wait_share`` of all of it, ranks in order of the waiting they
        cause (a rank causing less than ``member_share`` of it is not named); the rule fires
        when they cause at least ``wait_fraction`` of the typical step. A rank that starts the
        step late but is never the last at a collective costs nobody anything: it is named as
        entry skew, not as a straggler. The pattern is ``persistent`` when one rank is the main
        late rank in at least ``consistency`` of the steps, else ``rotating``; with one steady
        step it is ``one step`` (which of the two cannot be told). It needs every rank's trace
        (with a subset, the last rank given may not be the last member).
        Who is named, and what fixing each is worth, comes from the replay of the measured job
        (docs/models.md §9): the ranks causing waiting and the ranks entering late are each
        fixed on the replay (their extra idle or compute taken out of their chain) and named
        greedily, the fix that saves most first, until the named ones save ``wait_share`` of
        what fixing all of them saves; a rank another one hides (it sets the pace once that one
        is on time) is named with it. Entry skew is only a rank whose fix saves nothing with
        the named ones fixed.

    Why it matters:
        Synchronous data parallelism runs at the pace of its slowest rank. Every other GPU waits
        inside the collective for the late rank's extra time, on every step.

    Evidence:
        The late ranks, ordered by the waiting they cause and each one's share of it, the
        waiting per step, the pattern, the entry-skew ranks, and each late rank's cause, from
        its own time breakdown against the median other rank in the steps it was late:
        ``host`` (its GPU idles more for lack of work: the host was busy elsewhere, and the host
        leaves say with what: data loader, device sync, CPU contention, FSDP hooks, launches,
        Python), ``queued`` (its GPU idles more with work launched and waiting behind a
        dependency), ``compute`` (its kernels take longer), ``entry-skew`` (it starts the step
        later than the others although its own step is normal: ranks enter the step out of
        step, as at a first all-to-all), ``network`` (its transfer is slower), ``unknown``.
        ``late_ranks`` in the greedy order; ``per_rank``: each rank weighed (``named``), its
        cause, what fixing it alone saves (``gain_alone_us``) and predicts
        (``predicted_step_alone_us``), what it adds in the greedy order (``gain_in_order_us``);
        the prediction: every named rank fixed, replayed.

    Fix:
        Follows the cause: the host's data loader or device sync, the dependency the launched
        work waits on, the GPU's clocks and thermals, the step entry (uneven input, per-rank
        work before the step), the rank's links.

    References:
        docs/models.md §2 (collectives end together; transfer time vs wait), §9 (the replay);
        NVIDIA nccl-tests doc/PERFORMANCE.md; Li et al., VLDB 2020.
    """

    name = "straggler-rank"
    code = "TC302"
    title = "No rank holds the others back"
    failure_title = "Late ranks make the others wait at the collectives"
    severity = "warning"
    needs = ("multi_process", "communication", "gpu_steps", "all_ranks")
    fix_requires = ()  # each of its fixes declares its own (a Fix's requires)
    thresholds = {
        "consistency": Threshold(0.6, "share of the steady steps in which the same rank is the main "
                                 "late rank, from which the pattern is persistent (else rotating)", 0.0, 1.0),
        "wait_fraction": Threshold(0.03, "exposed waiting the late ranks cause per step (mean over the ranks), "
                                   "as a fraction of the typical step, from which the rule fires", 0.0, 1.0),
        "wait_share": Threshold(0.7, "share of all the waiting for late peers the late ranks must account "
                                "for: ranks are added in order of the waiting they cause until it does", 0.0, 1.0),
        "member_share": Threshold(0.1, "share of all the waiting below which a rank is not named late", 0.0, 1.0),
        "cause_fraction": Threshold(0.5, "share of the caused wait a difference in the late rank's "
                                    "own breakdown must reach to name the cause", 0.0, 1.0),
    }
    recovers = ("exposed_wait_us",)
    references = ("docs/models.md §2", "docs/models.md §9", "NVIDIA nccl-tests doc/PERFORMANCE.md",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    Evidence = StragglerEvidence

    def check(self, ctx):
        job = ctx.result.attribution
        if not job:
            raise NotEvaluated("no time breakdown of the steps (no GPU steps on any rank)")
        every = _steps_by_number(ctx.result)
        steady = sorted(n for n in job["steady_steps"] if n in every)
        if not steady:
            raise NotEvaluated("no steady step with every rank's waiting measured")
        t = ctx.thresholds
        step_us = ctx.model.step_time_us or median(median(tb["step_time_us"] for tb in every[n].values())
                                                   for n in steady)
        by_step = {n: _caused_in_step(every[n]) for n in steady}
        caused = _mean_over_steps(by_step, steady)
        total = sum(caused.values())
        late = _late_set(caused, total, t["wait_share"], t["member_share"])
        if not late or sum(caused[r] for r in late) < t["wait_fraction"] * step_us:
            return []
        # What their lateness costs the typical step (the one every figure quotes): the others'
        # wait for them (the median rank not late), over the step's leaves (mean over the ranks).
        typical = ctx.model.typical
        on = typical.step if typical is not None and typical.step in every else None
        if on is not None:
            wait_us = _wait_for(every[on], set(late))
            waited = sum(_caused_in_step(every[on]).get(r, 0.0) for r in late)
            where = f"typical step {on}"
        else:  # the typical step's waiting is unmeasured: the steady steps' mean, labelled
            wait_us = sum(_wait_for(every[n], set(late)) for n in steady) / len(steady)
            waited = sum(caused[r] for r in late)
            where = f"mean over the {len(steady)} steady step(s)"
        lateness = _lateness(ctx.result)
        main = Counter(max(by_step[n], key=lambda r: (by_step[n][r], -r)) for n in steady if by_step[n])
        top, count = min(((r, c) for r, c in main.items() if r in late), key=lambda kv: (-kv[1], kv[0]),
                         default=(late[0], 0))
        # One steady step cannot show a rank late step after step, nor late ranks taking turns.
        pattern = "one step" if len(steady) < 2 else \
            "persistent" if count >= t["consistency"] * len(steady) else "rotating"
        late_steps = {r: [n for n in steady if by_step[n].get(r, 0.0) > 0.0] for r in late}
        causes = {r: _cause(every, r, late_steps[r], lateness, t["cause_fraction"]) for r in sorted(late)}
        counter, counter_causes = _counterfactuals(ctx.gains, ctx.result, every, steady, caused, lateness, t, step_us)
        if counter is not None and counter.order:
            late = counter.order
            late_steps = {r: [n for n in steady if by_step[n].get(r, 0.0) > 0.0] or steady for r in late}
            causes = {r: _cause(every, r, late_steps[r], lateness, t["cause_fraction"]) for r in sorted(late)}
        worst = late[0]
        lead = causes[worst]
        replayed = counter.together if counter is not None and counter.order else None
        if replayed is not None:  # the waiting for the ranks named now, as ``fix_ranks_doc`` counts it
            waited = waited_for_ranks(every, steady, on, late)
        recovers = _recovers(waited, wait_us if replayed is None else replayed, lead["cause"], typical)
        gain = sum(recovers.values())  # what the typical step's leaves hold of it
        skewed = _entry_skew(every, steady, late, caused, total, t["wait_fraction"] * step_us, t["member_share"])
        if counter is not None:  # entry skew: its lateness costs nothing even with the named ranks fixed
            floor = t["member_share"] * counter.recoverable
            skewed = {r: v for r, v in skewed.items() if counter.beyond.get(r, 0.0) <= floor}
        summary = (f"{_caused_text(late, caused, total, len(steady))} "
                   f"({_pattern_text(pattern, top, count, len(steady))}); "
                   f"{_waited_text(late, waited, where, step_us)}"
                   f"{_held_text(wait_us, gain, recovers) if counter is None else ''}; cause: {lead['cause']} — "
                   f"{lead['text']}.{_counter_text(counter, step_us, gain)}{_skew_text(skewed)}")
        total = total or 1.0
        model = ("the last arrival at a collective is its shortest kernel (its members end together); each other "
                 "member's kernel until then is its wait, the exposed part of it the step's waiting for late "
                 "peers, attributed to the rank waited for; caused waiting = a rank's share of that, mean over "
                 "the ranks and the steady steps; the late ranks = the fewest, in order of caused waiting, that "
                 f"cause {100 * t['wait_share']:.0f}% of it; the gain is what the others' wait for them (median "
                 f"rank not late, {where}: {fmt_us(wait_us)}) takes from the typical step's leaves (mean over the "
                 "ranks): their waiting for the late ranks, and the late ranks' own extra time (the leaf of their "
                 "cause), each at most what the step holds; an upper bound, since with them on time the "
                 "next-latest rank sets the pace")
        replay: dict[str, Any] = {}  # what the replay of the named ranks' fixes gives
        if counter is not None and counter.order:
            replay = {"per_rank": _per_rank(counter, counter_causes, step_us),
                      "recoverable_by_replay_us": round(counter.recoverable, 1),
                      "next_after_named": {str(r): round(us, 1) for r, us in sorted(counter.beyond.items())}}
            beyond = gain < counter.together - 0.05  # e.g. a late entry: its delay lies before the step window
            if beyond:
                replay["replay_gain_beyond_leaves_us"] = round(counter.together - gain, 1)
            # `tracecliff whatif --fix-ranks` replays the same fixes: it gives this figure where the
            # typical step's leaves hold all of the replay's saving (else the evidence says how much more)
            replay["prediction"] = predicted(step_us, gain, REPLAY_MODEL, {
                "fixed": {str(r): counter_causes[r] for r in late}, "steps_replayed": steady},
                whatif=_fix_command(late) if not beyond else None)
        evidence = StragglerEvidence(
            late_ranks=late, pattern=pattern, main_late_rank=top,
            main_late_steps=count, steady_steps=steady, cause=lead["cause"],
            causes={str(r): c for r, c in causes.items()},
            caused_wait_direct_us={str(r): round(v, 1) for r, v in sorted(caused.items(), key=lambda kv: (-kv[1], kv[0]))},
            caused_wait_share_direct={str(r): round(caused.get(r, 0.0) / total, 3) for r in late},
            wait_per_step_us=round(wait_us, 1), wait_measured_in=where, caused_wait_in_step_us=round(waited, 1),
            all_waiting_per_step_us=round(total, 1),
            caused_wait_by_step=[[n, {str(r): round(v, 1) for r, v in sorted(by_step[n].items())}] for n in steady],
            lateness_by_step=[[n, {str(r): round(v, 1) for r, v in sorted(lateness.get(n, {}).items())}]
                              for n in steady],
            entry_skew={str(r): round(v, 1) for r, v in skewed.items()},
            step_time_us=round(step_us, 1),
            wait_source=job.get("wait_source"),
            **replay)
        return [ctx.finding(summary=summary, ranks=late, steps=sorted({n for v in late_steps.values() for n in v}),
                            evidence=evidence, estimated_gain_us=gain, model=model,
                            recovers=recovers,
                            fix_text="", fixes=[Fix(_fix(ctx, worst, lead), _snippet(ctx, worst, lead),
                                                    _host_fix(ctx, lead)[2] if lead["cause"] == "host" else ())])]


def _caused_text(late: list[int], caused: dict[int, float], total: float, steady: int) -> str:
    """Who causes how much of the waiting (mean over the ranks and the steady steps). A rank the
    replay names that is never the last arrival causes none of it directly: said so, never
    listed as causing "0.0 µs (0%)"."""
    causing = [r for r in late if caused.get(r, 0.0) > 0.0]
    masked = [r for r in late if r not in causing]
    many = len(causing) > 1
    share = sum(caused[r] for r in causing) / (total or 1.0)
    shares = ", ".join(f"rank {r} {fmt_us(caused[r])} ({100 * caused[r] / (total or 1.0):.0f}%)" for r in causing)
    text = (f"Rank{'s' if many else ''} {', '.join(map(str, causing))} cause{'' if many else 's'} "
            f"{100 * share:.0f}% of the waiting for late peers at the collectives ({fmt_us(total)} per step, mean "
            f"over the ranks and the {steady} steady step(s)): {shares}")
    if masked:
        few = len(masked) > 1
        text += (f"; rank{'s' if few else ''} {', '.join(map(str, masked))} cause{'' if few else 's'} none of it "
                 f"directly (a later rank arrives after {'them' if few else 'it'}) but the replay below finds "
                 f"{'them' if few else 'it'} setting the pace once that rank is on time")
    return text


def _waited_text(late: list[int], waited: float, where: str, step_us: float) -> str:
    """The waiting the late ranks cause in the step the figures quote: the breakdown's waiting
    for late peers keyed by them (mean over the ranks), not all the waiting the others do."""
    many = len(late) > 1
    return (f"in {where} the others' waiting for {'them' if many else 'it'} is {fmt_us(waited)} (mean over the ranks, "
            f"as the breakdown's waiting for late peers: {100 * waited / step_us:.1f}% of the {fmt_us(step_us)} "
            "typical step)")


def _mean_over_steps(by_step: dict[Any, dict[int, float]], steps: list[Any]) -> dict[int, float]:
    ranks = sorted({r for caused in by_step.values() for r in caused})
    return {r: sum(by_step[n].get(r, 0.0) for n in steps) / len(steps) for r in ranks}


def _late_set(caused: dict[int, float], total: float, share: float, member: float) -> list[int]:
    """The fewest ranks, in order of the waiting they cause (most first), that cause ``share`` of
    it all; none causing less than ``member`` of it."""
    late: list[int] = []
    covered = 0.0
    for rank in sorted(caused, key=lambda r: (-caused[r], r)):
        if covered >= share * total or caused[rank] < member * total or caused[rank] <= 0.0:
            break
        late.append(rank)
        covered += caused[rank]
    return late


def _entry_skew(every, steady: list[Any], late: list[int], caused: dict[int, float], total: float,
                floor_us: float, member: float) -> dict[int, float]:
    """{rank: how much later than the median rank it starts the step (µs, median over the steady
    steps)} of the ranks that start at least ``floor_us`` late yet cause (next to) no waiting."""
    lags: dict[int, list[float]] = {}
    for n in steady:
        rows = every[n]
        middle = median(tb["entry_us"] for tb in rows.values())
        for rank, tb in rows.items():
            lags.setdefault(rank, []).append(tb["entry_us"] - middle)
    out = {}
    for rank, values in sorted(lags.items()):
        lag = median(values)
        if rank not in late and lag >= floor_us and caused.get(rank, 0.0) < member * total:
            out[rank] = lag
    return out


def _skew_text(skewed: dict[int, float]) -> str:
    if not skewed:
        return ""
    ranks = sorted(skewed)
    many = len(ranks) > 1
    lags = ", ".join(fmt_us(skewed[r]) for r in ranks)
    return (f" Rank{'s' if many else ''} {', '.join(map(str, ranks))} start{'' if many else 's'} the step late "
            f"({lags} after the median rank) but {'are' if many else 'is'} never the last at a collective that "
            "costs the others: entry skew, not a straggler.")


def _held_text(wait_us: float, gain: float, recovers: dict[str, float]) -> str:
    """Says how much of the others' wait the typical step's leaves hold, when not all of it."""
    if gain >= wait_us - 0.05:
        return ""
    return (f"; the typical step's leaves hold {fmt_us(gain)} of it (mean over the ranks: "
            f"{' and '.join(f'{LEAF_NAMES[leaf]} {fmt_us(v)}' for leaf, v in recovers.items())})")


def _pattern_text(pattern: str, top: int, count: int, steady: int) -> str:
    if pattern == "one step":
        return f"rank {top} is the latest in the one steady step: whether it is late every step cannot be told"
    return f"{pattern}: rank {top} is the latest in {count} of {steady} steady step(s)"


def _lateness(result: Any) -> dict[Any, dict[int, float]]:
    """{step: {rank: its largest arrival after the median member at the step's GPU collectives
    (0 when never after it)}}, steps and ranks in order of first appearance."""
    view = CollectiveColumns.of(result)
    lag = view.written("arrival_lag_us")
    rows = np.flatnonzero(~np.isnan(lag) & view.on_gpu & ~view.kind.isin(POINT_TO_POINT))
    if not len(rows):
        return {}
    first, _, pair = distinct_rows([view.step.codes[rows], view.rank[rows]])
    order = np.argsort(pair, kind="stable")
    starts = np.searchsorted(pair[order], np.arange(len(first)))
    largest = np.maximum.reduceat(lag[rows][order], starts).tolist()
    out: dict[Any, dict[int, float]] = {}
    for row, value in zip(rows[first].tolist(), largest):
        out.setdefault(view.step.at(row), {})[int(view.rank[row])] = value if value > 0.0 else 0.0
    return out


def _wait_for(rows: dict[int, dict[str, Any]], late: set[int]) -> float:
    """Exposed wait for the late ranks on the median rank that is not late (every rank when all
    were late): what the step would lose less if they arrived on time."""
    waiting = [tb for r, tb in rows.items() if r not in late] or list(rows.values())
    return median(sum(tb["wait_by_peer"].get(str(r), 0.0) for r in late) for tb in waiting) or 0.0


def _host_excess(rows: dict[int, dict[str, Any]] | None, rank: int, key: str = "idle_by_host") -> dict[str, float]:
    """Per host activity, the rank's time minus the median of the other ranks'."""
    if not rows or rank not in rows:
        return {}
    get = lambda tb, a: (tb.get(key) or {}).get(a, 0.0)  # noqa: E731
    return {a: get(rows[rank], a) - (median(get(tb, a) for r, tb in rows.items() if r != rank) or 0.0)
            for a in rows[rank].get(key) or {}}


def _cause(every, rank: int, late_steps: list[Any], lateness, share: float) -> dict[str, Any]:
    """The late rank's own breakdown against the median other rank, in the steps it was late:
    the first difference that explains ``share`` of its lateness names the cause. A host stall
    before the step's first kernel lies in the previous step's window (windows start at the
    first kernel), so the idle of both windows counts."""
    diffs: dict[str, list[float]] = {"idle": [], "queued": [], "compute": [], "entry": [], "transfer": []}
    host: dict[str, list[float]] = {}
    waited: dict[str, list[float]] = {}  # what the queued idle waited on
    entry_host: dict[str, list[float]] = {}  # host activity before the step's first kernel
    lags = []
    for number in late_steps:
        rows, before = every[number], every.get(number - 1) if isinstance(number, int) else None
        lags.append(lateness.get(number, {}).get(rank, 0.0))
        idle_now, idle_before = _excess(rows, rank, "idle_us"), _excess(before, rank, "idle_us")
        diffs["idle"].append(max(idle_now, idle_before))
        chosen = rows if idle_now >= idle_before else before
        diffs["queued"].append(_excess(chosen, rank, "idle_queued_us"))
        for activity, value in _host_excess(chosen, rank).items():
            host.setdefault(activity, []).append(value)
        for dependency, value in _host_excess(chosen, rank, "idle_queued_by").items():
            waited.setdefault(dependency, []).append(value)
        for key, leaf in (("compute", "compute_only_us"), ("entry", "entry_us"), ("transfer", "exposed_transfer_us")):
            diffs[key].append(_excess(rows, rank, leaf))
        for activity, value in _host_excess(rows, rank, "host_before_us").items():
            entry_host.setdefault(activity, []).append(value)
    lag = median(lags)
    d = {k: median(v) for k, v in diffs.items()}
    out = {"lateness_us": round(lag, 1), "vs_median_rank_us": {k: round(v, 1) for k, v in d.items()}}
    if d["idle"] >= share * lag and d["queued"] >= 0.5 * d["idle"]:  # the work was launched and waited
        dependency = max(waited, key=lambda a: (median(waited[a]), a)) if waited else "event"
        return {**out, "cause": "queued", "waited_on": dependency,
                "text": f"rank {rank}'s GPU idles {fmt_us(d['idle'])} more per step than the median rank, "
                        f"{fmt_us(d['queued'])} of it with work launched and waiting on {WAITED_ON[dependency]}"}
    if d["idle"] >= share * lag:
        activity = max(host, key=lambda a: (median(host[a]), a)) if host else "unknown"
        return {**out, "cause": "host", "host_activity": activity,
                "text": f"rank {rank}'s GPU idles {fmt_us(d['idle'])} more per step than the median rank while "
                        f"its host is in {HOST_ACTIVITY.get(activity, activity)}"}
    if d["compute"] >= share * lag:
        return {**out, "cause": "compute", "text": f"rank {rank}'s kernels take {fmt_us(d['compute'])} more "
                                                   "per step than the median rank's"}
    if d["entry"] >= share * lag:
        before = {a: median(v) for a, v in entry_host.items()}
        activity = max(before, key=lambda a: (before[a], a)) if before else None
        if activity and before[activity] >= share * lag:  # the entry was late because the host stalled
            return {**out, "cause": "host", "host_activity": activity,
                    "text": f"rank {rank} starts the step {fmt_us(d['entry'])} after the median rank, its host "
                            f"{fmt_us(before[activity])} longer in {HOST_ACTIVITY[activity]} before the first kernel"}
        return {**out, "cause": "entry-skew",
                "text": f"rank {rank} starts the step {fmt_us(d['entry'])} after the median rank while its own "
                        "compute and idle are normal: the ranks enter the step out of step"}
    if d["transfer"] >= share * lag:
        return {**out, "cause": "network", "text": f"rank {rank}'s transfers take {fmt_us(d['transfer'])} more "
                                                   "per step than the median rank's"}
    return {**out, "cause": "unknown", "text": f"rank {rank}'s own compute, idle, step entry and transfer "
                                               "do not explain its lateness"}


def _host_fix(ctx, lead: dict[str, Any]) -> tuple[str, str, tuple[str, ...]]:
    """rules.host's fix for a host-bound rank's leading activity (its text and preconditions)."""
    activity = lead.get("host_activity") if lead.get("host_activity") in HOST_FIX else "unknown"
    return host_fix(activity, None, ctx.model.workload)


def _fix(ctx, rank: int, lead: dict[str, Any]) -> str:
    node = ctx.facts.node_of(rank)
    cause = lead["cause"]
    if cause == "host":
        return f"Rank {rank} ({node}) is host-bound: {_host_fix(ctx, lead)[0]}."
    if cause == "queued":
        return f"Rank {rank} ({node}) waits behind a dependency: {dependency_fix(lead['waited_on'], {}, False)[0]}"
    if cause == "compute":
        return (f"Inspect rank {rank}'s GPU on {node}: clocks and thermals, competing processes, uneven "
                "input shapes; drain or replace the node.")
    if cause == "entry-skew":
        return ("Align the ranks' step start: look at what each rank does before the step's first "
                "collective (data loading, uneven batches, per-rank logging or evaluation); the first "
                "all-to-all or all-reduce absorbs the skew.")
    if cause == "network":
        return f"Test rank {rank}'s links on {node} (nccl-tests, NIC and NVLink counters); drain the node if slow."
    return (f"Inspect rank {rank}'s host ({node}): GPU clocks/thermals, competing processes, data loading "
            "and input sizes, its network link.")


def _snippet(ctx, rank: int, lead: dict[str, Any]) -> str | None:
    node = ctx.facts.node_of(rank)
    return {"compute": f"nvidia-smi -q -d CLOCK,PERFORMANCE   # on {node}",
            "host": f"py-spy dump --pid <rank {rank} PID>   # on {node}",
            "network": f"all_reduce_perf -b 8 -e 1G -f 2 -g 1   # nccl-tests, on {node}"}.get(lead["cause"])


REPLAY_MODEL = ("replay of the measured job (docs/models.md §9): each named rank's own extra time (its host stall or "
                "its slower compute against the median other rank) taken out of its chain and the job replayed, "
                "every collective ending at its last member's arrival plus its transfer")
# At most this many ranks are weighed by counterfactual (those causing most waiting, then the
# latest to enter the step): the greedy replays each of them once per round.
MAX_CANDIDATES = 8
REPLAY_ROW_BUDGET = 5_000_000  # collective rows replayed over all the greedy's replays, about


def _counterfactuals(gains: GainEngine, result, every, steady, caused, lateness, t,
                     step_us) -> tuple[Counterfactuals | None, dict[int, str]]:
    """The greedy counterfactual over the candidate ranks (None: the job cannot be replayed),
    and each candidate's cause."""
    chains = gains.chains(result)
    if chains is None:
        return None, {}
    waiting = [r for r in sorted(caused, key=lambda r: (-caused[r], r)) if caused[r] > 0.0][:MAX_CANDIDATES]
    entering = _entry_skew(every, steady, waiting, caused, sum(caused.values()) or 1.0, t["wait_fraction"] * step_us, 1.0)
    candidates = waiting + sorted(entering, key=lambda r: (-entering[r], r))[:MAX_CANDIDATES]
    # The greedy replays each candidate about once per round: keep rows x candidates² bounded (a
    # million-row job weighs the two causing most waiting), whatever the job's values.
    keep = max(2, int(math.sqrt(REPLAY_ROW_BUDGET / max(1, len(chains.rank)))))
    candidates = candidates[:keep]
    excess = chains.gap_excess()
    fixes, causes = {}, {}
    for rank in candidates:
        steps = [n for n in steady if _caused_in_step(every[n]).get(rank, 0.0) > 0.0] or steady
        causes[rank] = _cause(every, rank, steps, lateness, t["cause_fraction"])["cause"]
        fix = gains.cause_fix(chains, every, rank, causes[rank], excess)
        if fix is not None:
            fixes[rank] = fix
    if not fixes:
        return None, causes
    return gains.greedy(chains, fixes, steady, t["wait_share"], t["member_share"]), causes


def _per_rank(counter: Counterfactuals, causes: dict[int, str], step_us: float) -> list[ReplayRank]:
    """The named ranks in the greedy order, then every other rank weighed (``named`` false: its
    fix alone, and ``gain_in_order_us`` what it would add after the named ones): the replay's
    savings (mean over the steady steps), as ``tracecliff whatif --fix-ranks R`` gives them."""
    rest = sorted((r for r in counter.alone if r not in counter.in_order), key=lambda r: (-counter.alone[r], r))
    return [ReplayRank(rank=r, cause=causes[r], named=r in counter.in_order,
                       gain_alone_us=round(counter.alone[r], 1),
                       predicted_step_alone_us=round(step_us - counter.alone[r], 1),
                       gain_in_order_us=round(counter.in_order.get(r, counter.beyond.get(r, 0.0)), 1),
                       whatif=_fix_command([r]))
            for r in counter.order + rest]


def _fix_command(ranks: list[int]) -> str:
    return f"tracecliff whatif TRACES --fix-ranks {','.join(map(str, sorted(ranks)))}"


def _counter_text(counter: Counterfactuals | None, step_us: float, gain: float) -> str:
    """What fixing each named rank alone saves, which rank hides which, and what the set saves
    (``gain``: the finding's, the replay's saving as far as the typical step's leaves hold it)."""
    if counter is None or not counter.order:
        return ""
    order = counter.order
    hidden = [r for r in order[1:] if counter.in_order[r] > counter.alone[r] + 0.1 * counter.together]
    parts = []
    for r in order:
        text = f"fixing rank {r} alone saves {fmt_us(counter.alone[r])} ({fmt_us(step_us - counter.alone[r])} a step)"
        if r == order[0] and hidden:
            text += f" because rank{'s' if len(hidden) > 1 else ''} {', '.join(map(str, hidden))} " \
                    f"{'are' if len(hidden) > 1 else 'is'} next"
        elif r in hidden:
            text += f": rank {order[0]} hides it"
        parts.append(text)
    if len(order) > 1:
        parts.append(f"fixing {'both' if len(order) == 2 else f'all {len(order)}'} saves "
                     f"{fmt_us(gain)} ({fmt_us(step_us - gain)} a step)")
    floor = 0.1 * counter.together
    nxt = sorted((r for r, us in counter.beyond.items() if us > floor), key=lambda r: (-counter.beyond[r], r))
    if nxt:
        parts.append(f"then rank{'s' if len(nxt) > 1 else ''} {', '.join(map(str, nxt))} would set the pace (fixing "
                     f"{'each' if len(nxt) > 1 else 'it'} too saves {', '.join(fmt_us(counter.beyond[r]) for r in nxt)} "
                     "more)")
    lead = f" Rank{'s' if len(order) > 1 else ''} {' and '.join(map(str, order))} set{'' if len(order) > 1 else 's'} " \
           "the pace (replay of the measured job, mean over the steady steps): "
    return lead + "; ".join(parts) + "."
