"""Step-time attribution of the job: the tree every verdict rests on.

Each rank's steps arrive with four leaves over their windows (analyzer.rank.attribution). Here the
exposed communication is split with the cross-rank matching (analyzer.job.crossrank, which put a
``wait_us`` on every matched collective): the part of a collective before its last member arrived
is **waiting for late peers** (``exposed_wait_us``), the rest is **transfer**. An instant where
several collectives run at once belongs to the one that started first. Leaves per step:

    step_time_us = compute_only_us + exposed_wait_us + exposed_transfer_us + other_gpu_us + idle_us

exactly (integer nanoseconds underneath). The *typical step* is a steady-state step: the last step
of a trace (its time is its GPU span: no next step closes it), a first step much slower than the
rest (warm-up) and other outliers are left out and reported; among the rest, the step whose time
(mean over ranks) is nearest the median. Every rank's ``time_breakdown`` is its figures for that
step; the job's is the mean over the ranks (the leaves still add up).

``exposed_share`` = (exposed_wait + exposed_transfer) / step time of the typical step: the one
definition the verdict, the text and HTML views, the JSON and the gate use.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from itertools import chain
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from analyzer.base import intervals as iv
from analyzer.base.rowtable import Numbers
from analyzer.job.columns import CollectiveColumns
from analyzer.job.facts import POINT_TO_POINT, JobFacts
from analyzer.job.model import ESTIMATED_PEER, LEAVES, Leaves, group_label
from analyzer.job.typical import choose_typical
from analyzer.model.formulas import COLLECTIVE_KINDS
from analyzer.rank.timeline import ns_to_us

DETAIL_KEYS = ("by_kind", "by_group", "by_phase", "by_kind_phase", "wait_by_peer", "idle_by_host", "idle_queued_by",
               "idle_queued_ops", "idle_unknown_by_phase")
# The idle split of a step (analyzer.rank.attribution): host-caused vs queued idle, the queued
# idle while the host sat in a blocking call, the idle ended by work whose launch is unknown (µs).
# ``queued_copies_us``: the other-GPU time of the copies the queued idle waited for.
IDLE_FIGURES = ("idle_host_us", "idle_queued_us", "idle_queued_in_sync_us", "idle_unlinked_us", "queued_copies_us")
# (row's position among its rank's, exposed ns it owns, of which waiting) of the rows with
# exposed time in a step
_Split = list[tuple[int, int, int]]


def attribute_job(result: Any) -> None:
    """Split every step's exposed communication into wait and transfer, pick the typical step,
    and set each rank's ``time_breakdown`` and the Result's ``attribution`` section."""
    origin = int(result.job.get("time_origin_ns") or 0)
    source = _wait_source(result, _estimate_waits(result))
    view = CollectiveColumns.of(result)
    on_gpu = np.flatnonzero(view.on_gpu)
    order = np.argsort(view.rank[on_gpu], kind="stable")  # each rank's GPU rows together, in row order
    by_rank = dict(zip(*_runs(view.rank[on_gpu][order], on_gpu[order])))
    # Each rank's steps, by step: the per-step detail tables are built for the typical step only
    # (the only one the output carries), once it is chosen from every step's time.
    per_rank: dict[int, dict[Any, _Step]] = {}
    peers = _Peers(view)
    for rank in result.ranks:
        rows = _RowIntervals(view, by_rank.get(rank.rank, on_gpu[:0]), peers)
        per_rank[rank.rank] = {}
        entries = [e for e in rank.steps if e.get("time_breakdown") is not None and "window_ns" in e]
        exposed_sets, totals = _exposed_sets([rank.exposed_intervals.get(str(e["step"]), []) for e in entries],
                                             origin)
        for entry, total, split in zip(entries, totals, rows.split_all(exposed_sets)):
            tb = entry["time_breakdown"]
            wait_ns = sum(map(itemgetter(2), split))  # the waiting ns of each (row, owned, waiting)
            tb["exposed_wait_us"] = ns_to_us(wait_ns)
            tb["exposed_transfer_us"] = ns_to_us(total - wait_ns)
            tb["wait_by_peer"] = _wait_by_peer(split, rows)
            per_rank[rank.rank][entry["step"]] = _step_figures(entry, split, rows.index)
    result.attribution = _job_section(result, per_rank, source, view)


def _estimate_waits(result: Any) -> bool:
    """Without every rank's trace a collective's wait is unknown (one rank) or a lower bound (a
    subset): estimate it as the time beyond the α-β model's transfer for its bytes on its
    group's link, ``max(0, dur − T_model)``, kept as ``wait_estimated_us`` where it exceeds the
    measured wait. With every rank matched, only the sends and receives whose peers are known
    but that were left unpaired (a trace window's edges, analyzer.job.p2p) are: their waits are
    unknown. (Those whose peers are unknown still count as transfer, as before pairing existed.)
    True when any row got one."""
    world = result.job.get("world_size") or len(result.ranks)
    view = CollectiveColumns.of(result)
    table = view.rows
    on_gpu, sizes, kinds, groups, durations, waits = map(
        table.values, ("on_gpu", "bytes", "collective", "group", "dur_us", "wait_us"))
    candidates: Any = range(view.n)
    if len(result.ranks) >= world and (result.stragglers or {}).get("method"):
        candidates = [i for i, (kind, known, wait) in enumerate(zip(kinds, table.values("peers"), waits))
                      if kind in POINT_TO_POINT and known and wait is None]
        if not candidates:
            return False
    facts = JobFacts(result)
    view.extra.pop("wait_estimated_us", None)  # read again after this
    found: dict[int, float] = {}
    for i in candidates:
        gpu, size, kind = on_gpu[i], sizes[i], kinds[i]
        if not gpu or not size or kind not in COLLECTIVE_KINDS:
            continue
        link = facts.link(groups[i] or {})
        if link is None or link.n < 2:
            continue
        estimate = max(0.0, durations[i] - link.time_us(kind, size))
        if estimate > (waits[i] or 0.0):
            found[i] = round(estimate, 3)
    if found:  # the key on those rows only
        present = np.zeros(view.n, dtype=bool)
        present[list(found)] = True
        values = np.zeros(view.n)
        values[list(found)] = list(found.values())
        view.write("wait_estimated_us", Numbers(values), present)
    return bool(found)


class _Peers:
    """Of every row, as arrays: whether it has an estimated wait (``wait_estimated_us`` set and
    not zero) and the member it waited for (``waited_for``; -1: None)."""

    def __init__(self, view: CollectiveColumns) -> None:
        estimated = view.written("wait_estimated_us")
        self.estimated = ~np.isnan(estimated) & (estimated != 0)
        waited = view.extra.get("waited_for")
        if waited is None:  # read from the rows (whole numbers, or None)
            waited = np.array([-1 if v is None else v for v in view.rows.values("waited_for")], dtype=np.int64)
        self.waited = waited


class _RowIntervals:
    """One rank's GPU collectives as the disjoint stretches each one *owns* (the instants where
    it is the earliest-started collective running) and the waiting prefix of each, in ns."""

    def __init__(self, view: CollectiveColumns, index: np.ndarray, peers: _Peers):
        index = index[np.lexsort((view.dur[index], view.start[index]))]  # by start, then duration
        self.index = index  # the rows, by position here
        self.rows = len(index)
        self.estimated = peers.estimated[index].tolist()
        waited = peers.waited[index]
        self.waited = np.where(waited < 0, None, waited.astype(object)).tolist()
        self.p2p = view.kind.isin(POINT_TO_POINT)[index].tolist()  # a send's / recv's wait is keyed apart
        # round(x * 1000) to the ns: np.rint rounds half to even on the same product, as round()
        start = _ns(view.start[index])
        end = start + _ns(view.dur[index])
        measured, estimated = view.written("wait_us")[index], view.written("wait_estimated_us")[index]
        wait = _ns(np.maximum(_known(measured), _known(estimated)))  # max(wait or 0.0, estimate or 0.0)
        before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]]) if len(index) \
            else np.zeros(0, np.int64)
        self.start = start
        self.longest = int((end - start).max()) if len(index) else 0
        self.own_start = np.minimum(np.maximum(start, before), end)
        self.own_end = end
        self.wait_end = np.clip(start + wait, self.own_start, end)

    def split(self, exposed: iv.IntervalSet) -> _Split:
        """(row's position, exposed ns it owns, of which waiting) for the rows with exposed time."""
        if not self.rows or not len(exposed[0]):
            return []
        # Only the rows that can reach the step's exposed stretch (rows are sorted by start).
        lo = int(np.searchsorted(self.start, exposed[0][0] - self.longest, side="left"))
        hi = int(np.searchsorted(self.start, exposed[1][-1], side="left"))
        part = slice(lo, hi)
        owned, waiting = iv.covered_lengths(exposed, self.own_start[part], self.own_end[part], self.wait_end[part])
        return [(lo + i, int(owned[i]), int(waiting[i])) for i in np.flatnonzero(owned > 0).tolist()]


    def split_all(self, sets: list[iv.IntervalSet]) -> list[_Split]:
        """``split`` of each of a rank's step sets, in one pass over all of them (a long trace has
        hundreds of steps): the steps' exposed stretches lie in disjoint windows, so together
        they are one canonical set, and a query clamped to a step's extent [first start, last
        end] measures that step's set alone (covered length is monotone in the clamp). Sets that
        are not disjoint and in order once sorted are split one by one."""
        present = [k for k, s in enumerate(sets) if len(s[0])]
        if not self.rows or not present:
            return [[] for _ in sets]
        present.sort(key=lambda k: int(sets[k][0][0]))
        starts = np.concatenate([sets[k][0] for k in present])
        ends = np.concatenate([sets[k][1] for k in present])
        if not ((ends > starts).all() and (starts[1:] >= ends[:-1]).all()):
            return [self.split(s) for s in sets]
        first = np.array([int(sets[k][0][0]) for k in present], dtype=np.int64)
        last = np.array([int(sets[k][1][-1]) for k in present], dtype=np.int64)
        lo = np.searchsorted(self.start, first - self.longest, side="left")
        hi = np.maximum(np.searchsorted(self.start, last, side="left"), lo)
        # (step, row) pairs: each step's candidate rows, as split() takes them
        counts = hi - lo
        step_of = np.repeat(np.arange(len(present)), counts)
        row = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + lo[step_of]
        low, high = first[step_of], last[step_of]

        def clamp(t: np.ndarray) -> np.ndarray:
            return np.minimum(np.maximum(t, low), high)

        owned, waiting = iv.covered_lengths((starts, ends), clamp(self.own_start[row]), clamp(self.own_end[row]),
                                            clamp(self.wait_end[row]))
        hit = np.flatnonzero(owned > 0)
        cut = np.searchsorted(step_of[hit], np.arange(len(present) + 1), side="left").tolist()
        found = list(zip(row[hit].tolist(), owned[hit].tolist(), waiting[hit].tolist()))
        out: list[_Split] = [[] for _ in sets]
        for j, k in enumerate(present):
            out[k] = found[cut[j]:cut[j + 1]]
        return out


def _runs(keys: np.ndarray, values: np.ndarray) -> tuple[list[Any], list[np.ndarray]]:
    """(each distinct key, its values) of values sorted by key."""
    cut = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
    return keys[cut].tolist(), np.split(values, cut[1:])


def _known(values: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(values), 0.0, values)


def _ns(us: np.ndarray) -> np.ndarray:
    return np.rint(us * 1000).astype(np.int64)


def _exposed_sets(flats: list[list[int]], origin_ns: int) -> tuple[list[iv.IntervalSet], list[int]]:
    """``_exposed_set`` of each step and its ``iv.total``: one array for all of a rank's steps
    (a long trace has hundreds). Integer sums: a difference of prefix sums is the sum."""
    lengths = np.fromiter(map(len, flats), dtype=np.int64, count=len(flats))
    if (lengths % 2).any():  # not (start, end) pairs: refused step by step, as before
        sets = [_exposed_set(flat, origin_ns) for flat in flats]
        return sets, list(map(iv.total, sets))
    pairs = np.asarray(list(chain.from_iterable(flats)), dtype=np.int64).reshape(-1, 2) - origin_ns
    bounds = np.r_[0, np.cumsum(lengths // 2)]
    sums = np.r_[0, np.cumsum(pairs[:, 1] - pairs[:, 0])]
    sets = [(pairs[lo:hi, 0], pairs[lo:hi, 1]) if hi > lo else iv.EMPTY
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    return sets, (sums[bounds[1:]] - sums[bounds[:-1]]).tolist()


def _exposed_set(flat: list[int], origin_ns: int) -> iv.IntervalSet:
    """A step's exposed intervals (``RankAnalysis.exposed_intervals``: flat start, end pairs)."""
    if not flat:
        return iv.EMPTY
    array = np.asarray(flat, dtype=np.int64).reshape(-1, 2) - origin_ns
    return array[:, 0], array[:, 1]


def _wait_source(result: Any, estimated: bool) -> str:
    stragglers = result.stragglers or {}
    world = result.job.get("world_size")
    given = len(result.ranks)
    model = ("the kernel time beyond the α-β model's transfer for its bytes on the group's link "
             "(dur − T_model), where sizes and link are known")
    if not stragglers.get("method"):
        if estimated and world and given < world:
            return (f"estimated: {given} of {world} ranks' traces given and no collective matched across them, so "
                    f"the transfer is bounded by the α-β model's time for its bytes on the group's link and the rest "
                    f"of each kernel (dur − T_model) is waiting or contention (the other members' traces are "
                    f"missing), where sizes and link are known; the rest counts as transfer")
        if estimated:
            return (f"estimated: no collective could be matched across ranks (one rank's trace?), so waiting "
                    f"is {model}; the rest counts as transfer")
        return ("not measured: no collective could be matched across ranks (one rank's trace?); "
                "exposed communication is counted as transfer, part of it may be waiting")
    if world and given < world:
        return (f"cross-rank matching of {given} of {world} ranks: waits are lower bounds (the last member "
                "may be a rank not given)" + (f", raised to {model} where that is larger" if estimated else ""))
    if estimated:  # every rank given: only unpaired sends / receives were estimated
        return (f"cross-rank matching of all {given} ranks ({stragglers['method']}); the sends and receives "
                f"left unpaired (a trace window's edges): waiting is {model}")
    return f"cross-rank matching of all {given} ranks ({stragglers['method']})"


class _Step(NamedTuple):
    """A rank's figures of one step as they are when its split is made (steps may share their
    ``time_breakdown`` dict), and the split, the typical step's details are made of."""
    figures: dict[str, Any]  # step, step_time_us and the leaves
    split: _Split
    index: np.ndarray  # the rows by their position in ``split``
    wait_by_peer: dict[str, float]
    idle_by_host: dict[str, float]
    idle: dict[str, Any]  # the idle split (IDLE_FIGURES, idle_queued_by, idle_queued_ops, its note)


def _step_figures(entry: dict[str, Any], split: _Split, index: np.ndarray) -> _Step:
    tb = entry["time_breakdown"]
    figures = {"step": entry["step"], "step_time_us": entry["step_time_us"]}
    figures.update({k: tb[k] for k in LEAVES})
    idle = {k: tb[k] for k in (*IDLE_FIGURES, "idle_queued_by", "idle_queued_ops", "idle_unknown_by_phase",
                               "idle_split_note", "inflated_ops", "allocator_calls") if k in tb}
    return _Step(figures, split, index, dict(tb["wait_by_peer"]), dict(tb.get("idle_by_host") or {}), idle)


def _rank_breakdown(step: _Step, source: str, labels: dict[int, str], view: CollectiveColumns) -> dict[str, Any]:
    """The typical step's breakdown of a rank. ``labels``: each group's ``group_label`` by the
    group's id, filled as they come and shared by the ranks (rows share their group's dict)."""
    by_kind: dict[str, list[float]] = {}
    by_group: dict[str, list[float]] = {}
    by_phase: dict[str, list[float]] = {}
    by_kind_phase: dict[str, list[float]] = {}
    for position, owned, wait in step.split:
        row = int(step.index[position])
        phase, kind, group = view.phase.at(row) or "other", view.kind.at(row), view.group.at(row)
        group_name = labels.get(id(group))
        if group_name is None:
            group_name = labels[id(group)] = group_label(group) or "unknown"
        wait_us, transfer_us = wait / 1000.0, (owned - wait) / 1000.0
        for cells, label in ((by_kind, kind), (by_group, group_name), (by_phase, phase),
                             (by_kind_phase, f"{kind} {phase}")):
            cell = cells.get(label)
            if cell is None:
                cells[label] = [0.0 + wait_us, 0.0 + transfer_us]  # as 0.0 += would
            else:
                cell[0] += wait_us
                cell[1] += transfer_us
    out = dict(step.figures)
    # _rounded's result (keys sorted at every level, floats to 3 decimals), built directly
    out["details"] = {"by_group": _rounded_cells(by_group), "by_kind": _rounded_cells(by_kind),
                      "by_kind_phase": _rounded_cells(by_kind_phase), "by_phase": _rounded_cells(by_phase),
                      "idle_by_host": _rounded(step.idle_by_host),
                      "wait_by_peer": _rounded(step.wait_by_peer)}
    out["details"].update(_rounded({k: v for k, v in step.idle.items() if k != "idle_split_note"}))
    if step.idle.get("idle_split_note"):
        out["idle_split_note"] = step.idle["idle_split_note"]
    out["wait_source"] = source
    return out


def _rounded_cells(cells: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {label: {"transfer_us": round(cell[1], 3), "wait_us": round(cell[0], 3)}
            for label, cell in sorted(cells.items())}


def _wait_by_peer(split: _Split, rows: _RowIntervals) -> dict[str, float]:
    """Exposed waiting (µs) by the rank that arrived last (the peer waited for). A send's or
    receive's wait for its peer is keyed ``rank N (send/recv)``: a pipeline stage waiting for
    the stage before it is the pipeline's dependency, not a late member of a collective (the
    straggler rule reads the plain rank keys only)."""
    peers: dict[str, int] = defaultdict(int)
    estimated, waited = rows.estimated, rows.waited
    for position, _, wait in split:
        if wait and estimated[position]:
            peers[ESTIMATED_PEER] += wait
        elif wait and waited[position] is not None:
            key = f"rank {waited[position]} (send/recv)" if rows.p2p[position] else str(waited[position])
            peers[key] += wait
    return {peer: ns_to_us(ns) for peer, ns in sorted(peers.items())}


def _job_section(result: Any, per_rank: dict[int, dict[Any, _Step]], source: str,
                 view: CollectiveColumns) -> dict[str, Any] | None:
    """The job's section: the typical step from every step's time (mean over ranks), and each
    rank's breakdown of it."""
    times: dict[Any, list[float]] = defaultdict(list)
    for steps in per_rank.values():
        for number, step in steps.items():
            times[number].append(step.figures["step_time_us"])
    if not times:
        for rank in result.ranks:
            rank.time_breakdown = None
        return None
    means = {s: statistics.fmean(v) for s, v in times.items()}
    typical, kept, excluded = choose_typical(means)  # the one choice (analyzer.job.typical)
    chosen = []
    labels: dict[int, str] = {}
    for rank in result.ranks:
        figures = per_rank.get(rank.rank, {}).get(typical)
        rank.time_breakdown = None if figures is None else _rank_breakdown(figures, source, labels, view)
        if rank.time_breakdown is not None:
            chosen.append(rank.time_breakdown)
    section = _mean_breakdown(chosen)
    section.update({"step": typical, "ranks": len(chosen), "wait_source": source,
                    "steady_steps": kept, "excluded_steps": excluded})
    sources = sorted({e["step_source"] for r in result.ranks for e in r.steps
                      if e.get("step") == typical and e.get("step_source")})
    if sources:  # steps that are not ProfilerSteps: say how they were found wherever they are quoted
        section["step_source"] = "; ".join(sources)
    notes = sorted({b["idle_split_note"] for b in chosen if b.get("idle_split_note")})
    if notes:  # the idle split of some rank cannot be trusted: say so wherever it is quoted
        section["idle_split_note"] = "; ".join(notes)
    leaves = Leaves.of(section)  # the shares' one definition (analyzer.job.model)
    section["exposed_share"] = _round(leaves.exposed_share, 4)
    section["idle_share"] = _round(leaves.idle_share, 4)
    return section


def _mean_breakdown(breakdowns: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(breakdowns)
    out: dict[str, Any] = {key: round(sum(b[key] for b in breakdowns) / n, 3) for key in LEAVES}
    # The sum of the rounded means (within 0.003 µs of the mean step time): the leaves add up.
    out = {"step_time_us": round(sum(out.values()), 3), **out}
    details: dict[str, Any] = {key: {} for key in DETAIL_KEYS}
    for b in breakdowns:
        for key in DETAIL_KEYS:
            _add_into(details[key], b["details"].get(key) or {}, n)
    for key in IDLE_FIGURES:  # the mean over ranks, as the leaves
        if any(key in b["details"] for b in breakdowns):
            details[key] = sum(b["details"].get(key, 0.0) for b in breakdowns) / n
    out["details"] = _rounded(details)
    return out


def _add_into(target: dict[str, Any], source: dict[str, Any], n: int) -> None:
    for label, value in source.items():
        if isinstance(value, dict):
            cell = target.setdefault(label, {})
            for k, v in value.items():
                cell[k] = cell.get(k, 0.0) + v / n
        else:
            target[label] = target.get(label, 0.0) + value / n


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in sorted(value.items())}
    return round(value, 3) if isinstance(value, float) else value


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


