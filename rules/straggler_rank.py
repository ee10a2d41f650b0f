"""straggler-rank (TC302)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from analyzer.base.units import fmt_us
from analyzer.job.columns import CollectiveColumns, distinct_rows
from analyzer.rules.engine import NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import POINT_TO_POINT, median
from analyzer.rules.host import HOST_ACTIVITY, HOST_FIX

CAUSES = ("host", "compute", "entry-skew", "network", "unknown")


@register
class StragglerRank(Rule):
    """Some ranks arrive late at the collectives and the others wait for them: one rank step
    after step (persistent) or a different one in different steps (rotating).

    What it detects:
        For every collective matched across ranks (by Comms Id, else group and sequence number,
        else group and order), the rank that arrives last (start times on clock-offset-aligned
        clocks) and, on every other rank, the part of its kernel before that arrival: its wait.
        Per steady step (analyzer.job.attribution), the exposed wait each late rank causes on the
        median other rank. The late ranks are those causing at least ``wait_fraction`` of a step;
        the rule fires when there are any. The pattern is ``persistent`` when one rank is the
        main late rank in at least ``consistency`` of the steps, else ``rotating``; with one
        steady step it is ``one step`` (which of the two cannot be told). It needs
        every rank's trace (with a subset, the last rank given may not be the last member).

    Why it matters:
        Synchronous data parallelism runs at the pace of its slowest rank. Every other GPU waits
        inside the collective for the late rank's extra time, on every step.

    Evidence:
        The late ranks, the wait each causes per step, the pattern, and each late rank's cause,
        from its own time breakdown against the median other rank in the steps it was late:
        ``host`` (its GPU idles more: the host was busy elsewhere, and the idle leaves say with
        what: data loader, device sync, launches, Python), ``compute`` (its kernels take
        longer), ``entry-skew`` (it starts the step later than the others although its own step
        is normal: ranks enter the step out of step, as at a first all-to-all), ``network``
        (its transfer is slower), ``unknown``.

    Fix:
        Follows the cause: the host's data loader or device sync, the GPU's clocks and
        thermals, the step entry (uneven input, per-rank work before the step), the rank's
        links.

    References:
        docs/models.md §2 (collectives end together; transfer time vs wait);
        NVIDIA nccl-tests doc/PERFORMANCE.md; Li et al., VLDB 2020.
    """

    name = "straggler-rank"
    code = "TC302"
    title = "No rank holds the others back"
    failure_title = "Late ranks make the others wait at the collectives"
    severity = "warning"
    needs = ("multi_process", "communication", "gpu_steps", "all_ranks")
    thresholds = {
        "consistency": Threshold(0.6, "share of the steady steps in which the same rank is the main "
                                 "late rank, from which the pattern is persistent (else rotating)", 0.0, 1.0),
        "wait_fraction": Threshold(0.03, "exposed wait a late rank causes on the median other rank in "
                                   "a step, as a fraction of the step time", 0.0, 1.0),
        "cause_fraction": Threshold(0.5, "share of the caused wait a difference in the late rank's "
                                    "own breakdown must reach to name the cause", 0.0, 1.0),
    }
    recovers = ("exposed_wait_us",)
    references = ("docs/models.md §2", "NVIDIA nccl-tests doc/PERFORMANCE.md",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    def check(self, ctx):
        job = ctx.result.attribution
        if not job:
            raise NotEvaluated("no time breakdown of the steps (no GPU steps on any rank)")
        every = _steps_by_number(ctx.result)
        steady = sorted(n for n in job["steady_steps"] if n in every)
        lateness = _lateness(ctx.result)
        t = ctx.thresholds
        late: dict[int, list[Any]] = {}  # late rank -> steps in which it was late
        main: Counter = Counter()
        waits, step_times = {}, {}
        for number in steady:
            rows = every[number]
            step_times[number] = median(tb["step_time_us"] for tb in rows.values())
            lags = lateness.get(number, {})
            lost = median(tb["exposed_wait_us"] for tb in rows.values()) or 0.0
            if not lags or lost < t["wait_fraction"] * step_times[number]:
                continue
            top = max(lags.values())
            in_step = [r for r, lag in lags.items()
                       if lag >= t["wait_fraction"] * step_times[number] and lag >= 0.5 * top]
            for rank in in_step:
                late.setdefault(rank, []).append(number)
            if in_step:
                main[min(in_step, key=lambda r: (-lags[r], r))] += 1
                waits[number] = _wait_for(rows, set(in_step))
        if not late:
            return []
        wait = median(waits.values()) or 0.0
        step_us = ctx.model.step_time_us or median(step_times.values())  # the typical step's, as every view
        top, count = min(main.items(), key=lambda kv: (-kv[1], kv[0]))
        # One steady step cannot show a rank late step after step, nor late ranks taking turns.
        pattern = "one step" if len(steady) < 2 else \
            "persistent" if count >= t["consistency"] * len(steady) else "rotating"
        causes = {rank: _cause(every, rank, late[rank], lateness, t["cause_fraction"]) for rank in sorted(late)}
        worst = max(late, key=lambda r: (sum(lateness[n][r] for n in late[r]), -r))
        names = ", ".join(str(r) for r in sorted(late))
        lead = causes[worst]
        summary = (f"Rank{'s' if len(late) > 1 else ''} {names} arrive{'' if len(late) > 1 else 's'} late at the "
                   f"collectives ({_pattern_text(pattern, top, count, len(steady))}) and the other ranks wait {fmt_us(wait)} per step for "
                   f"{'them' if len(late) > 1 else 'it'} (median of the steady steps they are late in: "
                   f"{100 * wait / step_us:.1f}% of the {fmt_us(step_us)} typical step); cause: "
                   f"{lead['cause']} — {lead['text']}.")
        model = ("lateness = a rank's largest arrival after the median member at the step's collectives "
                 "(clock offsets corrected); wait = the exposed part of each collective before its last member "
                 f"arrived, on the median rank that is not late, median over the steady steps they are late in; "
                 f"{fmt_us(wait)} = {100 * wait / step_us:.1f}% of the {fmt_us(step_us)} typical step")
        evidence = {
            "late_ranks": sorted(late), "pattern": pattern, "main_late_rank": top,
            "main_late_steps": count, "steady_steps": steady, "cause": lead["cause"],
            "causes": {str(r): c for r, c in causes.items()},
            "wait_per_step_us": round(wait, 1),
            "lateness_by_step": [[n, {str(r): round(v, 1) for r, v in sorted(lateness.get(n, {}).items())}]
                                 for n in steady],
            "step_time_us": round(step_us, 1),
            "wait_source": job.get("wait_source"),
        }
        return [ctx.finding(summary=summary, ranks=sorted(late), steps=sorted({n for v in late.values() for n in v}),
                            evidence=evidence, estimated_gain_us=wait, model=model,
                            recovers=_recovers(ctx, set(late), wait, lead["cause"]),
                            fix_text=_fix(ctx, worst, lead), fix_snippet=_snippet(ctx, worst, lead))]


# Where a late rank's own extra time lies, by its cause: fixing it gives that back too.
_OWN_LEAF = {"host": "idle_us", "compute": "compute_only_us", "entry-skew": "idle_us",
             "network": "exposed_transfer_us", "unknown": "exposed_wait_us"}


def _recovers(ctx, late: set[int], gain: float, cause: str) -> dict[str, float]:
    """The gain over the typical step's leaves: the others' waiting for the late ranks (mean over
    ranks, as the step's leaves are), the rest in the leaf that holds the late ranks' own extra
    time (a slow GPU's compute, a stalled host's idle)."""
    typical = ctx.model.typical
    waited = sum(v for peer, v in typical.details.wait_by_peer.items() if peer.isdigit() and int(peer) in late) \
        if typical else 0.0
    wait = min(gain, waited)
    rest = _OWN_LEAF.get(cause, "exposed_wait_us")
    return {"exposed_wait_us": wait, rest: gain - wait} if gain > wait and rest != "exposed_wait_us" \
        else {"exposed_wait_us": gain}


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


def _steps_by_number(result: Any) -> dict[Any, dict[int, dict[str, Any]]]:
    """{step: {rank: that step's time breakdown + window start (µs, clock offsets corrected)}}."""
    out: dict[Any, dict[int, dict[str, Any]]] = {}
    offsets = {b["rank"]: b.get("clock_offset_us") or 0.0 for b in (result.stragglers or {}).get("by_rank") or []}
    origin = result.job.get("time_origin_ns") or 0
    for rank in result.ranks:
        for entry in rank.steps:
            tb = entry.get("time_breakdown")
            if not tb or "wait_by_peer" not in tb:
                continue
            entry_us = (entry["window_ns"][0] - origin) / 1000.0 - offsets.get(rank.rank, 0.0)
            out.setdefault(entry["step"], {})[rank.rank] = {**tb, "step_time_us": entry["step_time_us"],
                                                            "entry_us": entry_us}
    return out


def _wait_for(rows: dict[int, dict[str, Any]], late: set[int]) -> float:
    """Exposed wait for the late ranks on the median rank that is not late (every rank when all
    were late): what the step would lose less if they arrived on time."""
    waiting = [tb for r, tb in rows.items() if r not in late] or list(rows.values())
    return median(sum(tb["wait_by_peer"].get(str(r), 0.0) for r in late) for tb in waiting) or 0.0


def _excess(rows: dict[int, dict[str, Any]] | None, rank: int, leaf: str) -> float:
    """The rank's leaf minus the median of the other ranks' (0 when the step is unknown)."""
    if not rows or rank not in rows:
        return 0.0
    return rows[rank][leaf] - (median(tb[leaf] for r, tb in rows.items() if r != rank) or 0.0)


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
    diffs: dict[str, list[float]] = {"idle": [], "compute": [], "entry": [], "transfer": []}
    host: dict[str, list[float]] = {}
    entry_host: dict[str, list[float]] = {}  # host activity before the step's first kernel
    lags = []
    for number in late_steps:
        rows, before = every[number], every.get(number - 1) if isinstance(number, int) else None
        lags.append(lateness[number][rank])
        idle_now, idle_before = _excess(rows, rank, "idle_us"), _excess(before, rank, "idle_us")
        diffs["idle"].append(max(idle_now, idle_before))
        for activity, value in _host_excess(rows if idle_now >= idle_before else before, rank).items():
            host.setdefault(activity, []).append(value)
        for key, leaf in (("compute", "compute_only_us"), ("entry", "entry_us"), ("transfer", "exposed_transfer_us")):
            diffs[key].append(_excess(rows, rank, leaf))
        for activity, value in _host_excess(rows, rank, "host_before_us").items():
            entry_host.setdefault(activity, []).append(value)
    lag = median(lags)
    d = {k: median(v) for k, v in diffs.items()}
    out = {"lateness_us": round(lag, 1), "vs_median_rank_us": {k: round(v, 1) for k, v in d.items()}}
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


def _fix(ctx, rank: int, lead: dict[str, Any]) -> str:
    node = ctx.facts.node_of(rank)
    cause = lead["cause"]
    if cause == "host":
        return f"Rank {rank} ({node}) is host-bound: {HOST_FIX.get(lead['host_activity'], HOST_FIX['unknown'])}."
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
