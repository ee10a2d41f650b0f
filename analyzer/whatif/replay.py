"""The replay of the measured job: each rank's chain of work between its arrivals at collectives,
each collective ending on every member at its last member's arrival plus its transfer.

From the collective rows (clock offsets corrected: ``stragglers.by_rank[].clock_offset_us``)
and each rank's step windows:

- a *set* is one collective matched across its members (``analyzer.job.crossrank``'s matching;
  an unmatched row is a set of one); its transfer is its shortest kernel (the last arrival
  waited for nobody), its end = the latest arrival + the transfer;
- every event of a rank (its arrival at a set, the start of each of its step windows, the end
  of its last window) is *anchored* on the latest set end of that rank at or before it: the
  event comes ``offset`` after that end (its own work between the two: compute, host gaps,
  copies), or at its measured time when nothing of the rank ended before it.

Replaying the measured offsets gives back every measured arrival, set end and window, so every
rank-step's time (``test_replay``: within 1% on every sample job). A counterfactual takes time
out of some offsets (a rank's host stall, its extra compute) and replays: a set ends at its
latest member's new arrival + its transfer, and everything anchored after it moves with it. The
step time it saves is that fix's gain. Sets are replayed in order of their measured end (a
dependency ends before what it anchors), one pass: linear in the number of collective rows.

What the replay assumes: a rank whose collective started as soon as its previous one ended (its
work was hidden under the wait) arrives, in the replay, as soon as that one ends: its own work
there is unseen, so a fix that moves the others earlier may be credited a little more than the
re-simulated job gives when such a rank would have been next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from analyzer.job import crossrank
from analyzer.job.columns import CollectiveColumns
from analyzer.job.gains import Counterfactuals
from analyzer.job.waits import excess_over_others, step_breakdowns


@dataclass(frozen=True, eq=False)
class Chains:
    """The measured job as chains (µs, corrected clocks). Rows are the collective rows' indices."""

    set_of: np.ndarray  # per row: its set
    step: list[Any]  # per row: its step (None: outside every step)
    rank: np.ndarray  # per row
    arrival: np.ndarray  # per row, measured
    anchor: np.ndarray  # per row: the set its arrival is anchored on (-1: none)
    offset: np.ndarray  # per row: arrival − that set's end (the arrival itself when no anchor)
    transfer: np.ndarray  # per set
    end: np.ndarray  # per set, measured: latest arrival + transfer
    order: np.ndarray  # the sets in order of measured end
    members: list[np.ndarray]  # per set, in ``order``'s positions: its rows
    # per rank: [(step, start anchor, start offset)] ascending, then the last window's end
    windows: dict[int, list[tuple[Any, int, float]]]
    window_end: dict[int, tuple[int, float]]
    steps: dict[Any, dict[int, float]]  # measured {step: {rank: step time µs}}
    floors: list[tuple[int, Any, float]]  # (rank, step, its compute's own time after the window start)
    floor_of: np.ndarray  # per row: the floor it cannot arrive before (-1: none)
    exposed: np.ndarray | None = None  # per row: its exposed time (µs; 0 where unknown)

    @cached_property
    def plain(self) -> tuple[list[int], list[int], list[float]]:
        """(anchor, floor_of, transfer) as lists, for the replay's loop."""
        return self.anchor.tolist(), self.floor_of.tolist(), self.transfer.tolist()

    @cached_property
    def plain_members(self) -> list[tuple[int, list[int]]]:
        """(set, its rows) in the replay's order, as lists."""
        return [(s, rows.tolist()) for s, rows in zip(self.order.tolist(), self.members)]

    def gap_excess(self) -> np.ndarray:
        """Per row: its offset minus the median offset of the other members of its set (how much
        more own work this rank did before it arrived than the others); 0 for a set of one or
        a row not anchored. The sets of one size at once, as the rows of one array."""
        out = np.zeros(len(self.rank))
        sizes = np.array([len(rows) for rows in self.members])
        for size in np.unique(sizes[sizes > 1]).tolist():
            rows = np.stack([self.members[k] for k in np.flatnonzero(sizes == size).tolist()])
            values = self.offset[rows]
            out[rows] = values - _others_median(values)
        out[self.anchor < 0] = 0.0
        return out


def _others_median(values: np.ndarray) -> np.ndarray:
    """For each element of each row, the median of the row's other elements."""
    m = values.shape[1]
    order = np.argsort(values, axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.arange(m)[None, :].repeat(len(values), axis=0), axis=1)

    def other(j: int) -> np.ndarray:  # the j-th smallest of the others: skip the element itself
        return np.where(position > j, ranked[:, [j]], ranked[:, [min(j + 1, m - 1)]])
    k = (m - 1) // 2
    return other(k) if (m - 1) % 2 else (other(k - 1) + other(k)) / 2


def chains(result: Any) -> Chains | None:
    """The chains of ``result`` (None: no collective rows or no step windows)."""
    view = CollectiveColumns.of(result)
    if view.n == 0:
        return None
    offsets = {b["rank"]: b.get("clock_offset_us") or 0.0 for b in (result.stragglers or {}).get("by_rank") or []}
    rank = view.rank.astype(np.int64)
    shift = np.array([offsets.get(int(r), 0.0) for r in rank.tolist()]) if offsets else np.zeros(view.n)
    arrival = view.start - shift
    dur = view.dur
    set_of = _sets(view)
    n_sets = int(set_of.max()) + 1
    transfer = np.full(n_sets, np.inf)
    np.minimum.at(transfer, set_of, dur)
    latest = np.full(n_sets, -np.inf)
    np.maximum.at(latest, set_of, arrival)
    # the job's start: the earliest window start, a set of its own that never moves, which
    # anchors what comes before a rank's first collective end (a rank entering late moves)
    origin = _first_window_us(result, offsets)
    if origin is None:
        return None
    end = np.r_[latest + transfer, min(origin, float(arrival.min()))]
    transfer = np.r_[transfer, 0.0]
    anchor, offset = _anchors(rank, arrival, set_of, end)
    order = np.argsort(end[:-1], kind="stable")
    by_set = np.argsort(set_of, kind="stable")
    cuts = np.searchsorted(set_of[by_set], np.arange(n_sets + 1))
    members = [by_set[cuts[s]:cuts[s + 1]] for s in order.tolist()]
    step = [view.step.at(i) for i in range(view.n)]
    exposed = np.nan_to_num(view.nullable("exposed_us"))
    windows, window_end, steps, floors, floor_of = _windows(result, rank, set_of, end, offsets,
                                                            (arrival, dur, exposed), step)
    if not windows:
        return None
    return Chains(set_of, step, rank, arrival, anchor, offset, transfer, end, order, members, windows, window_end,
                  steps, floors, floor_of, exposed)


def _first_window_us(result: Any, offsets: dict[int, float]) -> float | None:
    origin = int(result.job.get("time_origin_ns") or 0)
    starts = [(e["window_ns"][0] - origin) / 1000.0 - offsets.get(a.rank, 0.0)
              for a in result.ranks for e in a.steps if e.get("window_ns")]
    return min(starts) if starts else None


def _sets(view: CollectiveColumns) -> np.ndarray:
    """Per row, its set: the matched collectives' code, a set of its own for every other row."""
    codes = crossrank._match(view)[1] if len(np.unique(view.rank)) >= 2 else None
    codes = np.full(view.n, -1, dtype=np.int64) if codes is None else codes.copy()
    lone = codes < 0
    base = int(codes.max()) + 1 if (~lone).any() else 0
    codes[lone] = base + np.arange(int(lone.sum()))
    return codes


def _anchors(rank: np.ndarray, times: np.ndarray, set_of: np.ndarray,
             end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the latest end of a set of its rank's at or before its arrival, and the offset."""
    anchor = np.full(len(rank), -1, dtype=np.int64)
    offset = times.copy()
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.r_[True, rank[by_rank][1:] != rank[by_rank][:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = by_rank[lo:hi]
        found, off = anchor_times(rows, set_of, end, times[rows])
        own = found == set_of[rows]  # a transfer of 0: never its own anchor
        anchor[rows], offset[rows] = np.where(own, -1, found), np.where(own, times[rows], off)
    return anchor, offset


def anchor_times(rows: np.ndarray, set_of: np.ndarray, end: np.ndarray,
                 times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``times`` on the rank whose rows are ``rows``: the set of the rank's that ended
    last at or before it (-1: none) and the time after that end (the time itself when none)."""
    ends = end[set_of[rows]]
    by_end = np.argsort(ends, kind="stable")
    at = np.searchsorted(ends[by_end], times, side="right") - 1
    start = len(end) - 1  # the job's start (``chains``)
    found = np.where(at >= 0, set_of[rows][by_end][np.maximum(at, 0)] if len(rows) else start, start)
    return found, times - end[found]


def _windows(result: Any, rank: np.ndarray, set_of: np.ndarray, end: np.ndarray, offsets: dict[int, float],
             times_of_rows: tuple[np.ndarray, np.ndarray, np.ndarray], row_step: list[Any]):
    """Each rank's step windows anchored as its arrivals are, the measured step times, and the
    compute floors (``_floors``)."""
    origin = int(result.job.get("time_origin_ns") or 0)
    windows: dict[int, list[tuple[Any, int, float]]] = {}
    window_end: dict[int, tuple[int, float]] = {}
    steps: dict[Any, dict[int, float]] = {}
    floors: list[tuple[int, Any, float]] = []
    floor_of = np.full(len(rank), -1, dtype=np.int64)
    by_rank = _rows_by_rank(rank)
    for analysis in result.ranks:
        entries = sorted((e for e in analysis.steps if e.get("window_ns")), key=lambda e: e["window_ns"][0])
        rows = by_rank.get(analysis.rank, np.zeros(0, dtype=np.int64))
        if not entries:
            continue
        shift = offsets.get(analysis.rank, 0.0)
        starts = np.array([(e["window_ns"][0] - origin) / 1000.0 - shift for e in entries])
        last = (entries[-1]["window_ns"][0] - origin) / 1000.0 - shift + entries[-1]["step_time_us"]
        times = np.r_[starts, last]
        found, off = anchor_times(rows, set_of, end, times)
        windows[analysis.rank] = [(e["step"], int(a), float(o)) for e, a, o in zip(entries, found[:-1], off[:-1])]
        window_end[analysis.rank] = (int(found[-1]), float(off[-1]))
        for e in entries:
            steps.setdefault(e["step"], {})[analysis.rank] = float(e["step_time_us"])
        _floors(analysis, entries, rows, times_of_rows, row_step, (origin, shift), floors, floor_of)
    return windows, window_end, steps, floors, floor_of


def _rows_by_rank(rank: np.ndarray) -> dict[int, np.ndarray]:
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.r_[True, rank[by_rank][1:] != rank[by_rank][:-1], True])
    return {int(rank[by_rank[lo]]): by_rank[lo:hi] for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())}


def _floors(analysis: Any, entries: list[dict[str, Any]], rows: np.ndarray, times: tuple[np.ndarray, np.ndarray, np.ndarray],
            row_step: list[Any], clock: tuple[int, float], floors: list[tuple[int, Any, float]],
            floor_of: np.ndarray) -> None:
    """The compute floor of each step: the last collective a rank launches after its backward
    ends (the last bucket) cannot start before it, however early the collectives before it end.
    Its time after the window start = the backward's end − the window start − the waiting
    exposed in between (what the compute itself waited for): the compute stream's own pace,
    which a rank whose collectives queued behind a late peer's shows nowhere else."""
    origin, shift = clock
    arrival, dur, exposed = times
    for e in entries:
        backward = (e.get("phase_windows") or {}).get("backward") or {}
        if backward.get("end_ns") is None:
            continue
        start_ns, end_ns = e["window_ns"][0], backward["end_ns"]
        after = (end_ns - origin) / 1000.0 - shift
        step_rows = [row for row in rows.tolist() if row_step[row] == e["step"]]
        # the exposed time of its collectives that ended before the backward did (the rows'
        # own figure: a saved result replays as the traces do)
        waited = sum(float(exposed[row]) for row in step_rows if arrival[row] + dur[row] <= after)
        mine = [row for row in step_rows if arrival[row] >= after]
        if mine:  # the step's last collective: the one the backward's end makes ready
            floor_of[max(mine, key=lambda row: arrival[row])] = len(floors)
            floors.append((analysis.rank, e["step"], (end_ns - start_ns) / 1000.0 - waited))


@dataclass(frozen=True)
class Replayed:
    end: np.ndarray  # per set
    steps: dict[Any, dict[int, float]]  # {step: {rank: step time µs}}


def replay(chains: Chains, fix: "ReplayFix | None" = None) -> Replayed:
    """The job replayed with ``fix`` (its cuts: µs out of rows' offsets, window starts' and
    compute floors'); none: the measured job. A row arrives at its anchor's replayed end + its
    offset, and never before its compute floor (the window start's replayed time + the floor)."""
    cut = np.zeros(len(chains.offset)) if fix is None else fix.cut
    window_cut = {} if fix is None else fix.window_cut
    floor_cut = {} if fix is None else fix.floor_cut
    # Python lists, not numpy scalars: the loop is the replay's whole cost (one pass over the rows)
    offset = (chains.offset - cut).tolist()
    end = chains.end.tolist()
    anchor, floor_of, transfer = chains.plain
    if fix is not None and fix.transfer_cut is not None:  # a faster link, a shorter tail: never below 0
        transfer = np.maximum(chains.transfer - fix.transfer_cut, 0.0).tolist()
    starts = {(r, step): (a, o) for r, windows in chains.windows.items() for step, a, o in windows}
    floor_at = [(starts[(r, step)], own - window_cut.get((r, step), 0.0) - floor_cut.get((r, step), 0.0))
                for r, step, own in chains.floors]
    for s, rows in chains.plain_members:
        latest = -math.inf
        for row in rows:
            a = anchor[row]
            t = offset[row] if a < 0 else end[a] + offset[row]
            f = floor_of[row]
            if f >= 0:
                (wa, wo), own = floor_at[f]
                floor = (wo if wa < 0 else end[wa] + wo) + own
                t = floor if floor > t else t
            latest = t if t > latest else latest
        end[s] = latest + transfer[s]
    end = np.asarray(end)
    return Replayed(end, _step_times(chains, end, window_cut))


def _step_times(chains: Chains, end: np.ndarray, window_cut: dict[tuple[int, Any], float]) -> dict[Any, dict[int, float]]:
    out: dict[Any, dict[int, float]] = {}
    for r, windows in chains.windows.items():
        starts = [(o if a < 0 else end[a] + o) - window_cut.get((r, step), 0.0) for step, a, o in windows]
        a, o = chains.window_end[r]
        starts.append(o if a < 0 else end[a] + o)
        for k, (step, _, _) in enumerate(windows):
            out.setdefault(step, {})[r] = float(starts[k + 1] - starts[k])
    return out


def saving(measured: Replayed, fixed: Replayed, steps: list[Any]) -> float:
    """The step time a counterfactual saves: mean over ``steps`` of the median over ranks of each
    rank-step's replayed time before minus after (a step the replay lacks counts 0). The median
    rank: a fixed rank's own window moves with its fix at one end only where its first step has
    nothing before it to anchor on, which would pull a mean."""
    total = 0.0
    for step in steps:
        before, after = measured.steps.get(step, {}), fixed.steps.get(step, {})
        ranks = [r for r in before if r in after]
        if ranks:
            total += float(np.median([before[r] - after[r] for r in ranks]))
    return total / len(steps) if steps else 0.0


@dataclass(frozen=True)
class ReplayFix:
    """A counterfactual as cuts: µs out of rows' offsets (a rank's own work), out of window
    starts' offsets and compute floors, and out of sets' transfers (a link's, a tail's: None
    is none; a negative cut lengthens a transfer)."""

    cut: np.ndarray
    window_cut: dict[tuple[int, Any], float]
    floor_cut: dict[tuple[int, Any], float]
    transfer_cut: np.ndarray | None = None

    def __add__(self, other: "ReplayFix") -> "ReplayFix":
        transfer = other.transfer_cut if self.transfer_cut is None else self.transfer_cut if other.transfer_cut is None \
            else self.transfer_cut + other.transfer_cut
        return ReplayFix(self.cut + other.cut, _added(self.window_cut, other.window_cut), _added(self.floor_cut, other.floor_cut),
                   transfer)


def _added(a: dict[Any, float], b: dict[Any, float]) -> dict[Any, float]:
    out = dict(a)
    for key, us in b.items():
        out[key] = out.get(key, 0.0) + us
    return out


def no_fix(chains: Chains) -> ReplayFix:
    return ReplayFix(np.zeros(len(chains.rank)), {}, {})


def rank_fix(chains: Chains, rank: int, budget: dict[Any, float], spread: bool,
             excess: np.ndarray | None = None) -> ReplayFix:
    """The rank's own extra time taken out: per step, ``budget[step]`` µs (its excess in the leaf
    of its cause against the median other rank) out of the offsets of its arrivals in that step
    where they exceed the other members' (``Chains.gap_excess``): out of the one that exceeds
    them most (a host stall is one stretch of idle), or, ``spread`` (slower kernels: every
    stretch of its work is longer), out of each in turn from the largest. A window start in a
    cut offset moves by as much of the cut as its own offset exceeds the other ranks' (the extra
    time lay before the step's first kernel); its compute floor (``_floors``) shrinks by as much
    of the step's budget as it exceeds the other ranks'."""
    excess = chains.gap_excess() if excess is None else excess
    cut = np.zeros(len(chains.rank))
    window_cut: dict[tuple[int, Any], float] = {}
    rows = np.flatnonzero(chains.rank == rank)
    anchors = {step: a for step, a, _ in chains.windows.get(rank, [])}
    for step, left in budget.items():
        mine = sorted((row for row in rows.tolist() if chains.step[row] == step and excess[row] > 0.0),
                      key=lambda i: (-excess[i], i))
        for row in mine if spread else mine[:1]:
            if left <= 0.0:
                break
            take = min(float(excess[row]), left)
            cut[row] += take
            left -= take
            if anchors.get(step, -2) == chains.anchor[row]:
                ahead = window_excess(chains, rank, step)
                if ahead > 0.0:
                    window_cut[(rank, step)] = window_cut.get((rank, step), 0.0) + min(take, ahead)
    floor_cut = {(rank, step): min(us, ahead) for step, us in budget.items()
                 if (ahead := floor_excess(chains, rank, step)) > 0.0 and us > 0.0}
    return ReplayFix(cut, window_cut, floor_cut)


def floor_excess(chains: Chains, rank: int, step: Any) -> float:
    """How much longer the rank's compute floor of ``step`` is than the median other rank's: the
    part of its own extra time that lies in its compute before the step's last buckets."""
    own = {r: o for r, n, o in chains.floors if n == step}
    if rank not in own or len(own) < 2:
        return 0.0
    return own[rank] - float(np.median([o for r, o in own.items() if r != rank]))


def window_excess(chains: Chains, rank: int, step: Any) -> float:
    """How much later after its anchor the rank's window of ``step`` starts than the median
    other rank's (0 when unknown)."""
    offsets = {r: o for r, windows in chains.windows.items() for n, a, o in windows if n == step and a >= 0}
    if rank not in offsets or len(offsets) < 2:
        return 0.0
    return offsets[rank] - float(np.median([o for r, o in offsets.items() if r != rank]))


def replay_fix(chains: Chains, fix: ReplayFix) -> Replayed:
    return replay(chains, fix)


def greedy(chains: Chains, fixes: dict[Any, ReplayFix], steps: list[Any], share: float,
           floor_share: float = 0.0) -> Counterfactuals:
    """Fix the candidate whose fix saves most, replay, pick the next, until the named ones save
    ``share`` of what fixing every candidate saves. When no one fix adds anything (equal ranks
    hiding each other: fixing either alone saves nothing), the next named is the one whose fix
    the rest of them can least do without. A candidate that would add no more than
    ``floor_share`` of that saving is not named. At most two replays per candidate per round."""
    base = replay(chains)
    worth = lambda chosen: saving(base, replay_fix(chains, _sum(chains, [fixes[k] for k in chosen])), steps)  # noqa: E731
    alone = {k: worth([k]) for k in fixes}
    recoverable = worth(list(fixes))
    floor = floor_share * recoverable
    order: list[Any] = []
    in_order: dict[Any, float] = {}
    together = 0.0
    while len(order) < len(fixes) and together < share * recoverable:
        rest = [k for k in fixes if k not in order]
        gains = {k: (alone[k] if not order else worth(order + [k])) - together for k in rest}
        best = min(gains, key=lambda k: (-gains[k], k))
        if gains[best] <= floor and len(rest) > 1:  # hidden by one another: who is needed most
            everyone = worth(order + rest)
            needed = {k: everyone - worth(order + [j for j in rest if j != k]) for k in rest}
            best = min(needed, key=lambda k: (-needed[k], k))
            if needed[best] <= floor:
                break
        elif gains[best] <= floor:
            break
        order.append(best)
        in_order[best] = worth(order) - together
        together += in_order[best]
    beyond = {k: worth(order + [k]) - together for k in fixes if k not in order}
    return Counterfactuals(order, alone, in_order, together, recoverable, beyond)


def _sum(chains: Chains, fixes: list[ReplayFix]) -> ReplayFix:
    out = no_fix(chains)
    for fix in fixes:
        out = out + fix
    return out


# ---- fixing ranks by their cause: what straggler-rank names and `tracecliff whatif --fix-ranks` replays
# (each step's breakdown by rank and a rank's excess over the others: analyzer.job.waits)

def cause_fix(chains: Chains, every: dict[Any, dict[int, dict[str, Any]]], rank: int, cause: str,
              excess: np.ndarray | None = None) -> ReplayFix | None:
    """The cuts that fix the rank's cause (``every``: ``step_breakdowns``): its extra compute
    spread over its work, else (a host stall, a queue, a late entry) its extra idle — in its
    window or the one before: a stall before the step's first kernel lies there — or entry in
    one stretch; None for a slow link (its transfer is the set's, not a stretch of its work)."""
    if cause == "network":
        return None
    steps = sorted(n for n in every if isinstance(n, int))
    if cause == "compute":
        budget = {n: max(0.0, excess_over_others(every[n], rank, "compute_us")) for n in steps}
        return rank_fix(chains, rank, budget, True, excess)
    budget = {n: max(0.0, excess_over_others(every[n], rank, "idle_us"),
                     excess_over_others(every.get(n - 1), rank, "idle_us"),
                     excess_over_others(every[n], rank, "entry_us")) for n in steps}
    return rank_fix(chains, rank, budget, False, excess)


def replay_steps(result: Any, every: dict[Any, Any]) -> list[Any]:
    """The steps a fix's saving is the mean over: the steady ones whose waiting is measured."""
    return sorted(n for n in (result.attribution or {}).get("steady_steps") or [] if n in every)


def fixed_ranks(result: Any, causes: dict[int, str]) -> float | None:
    """What fixing these ranks' causes at once saves per step on the replay (µs; None: the job
    cannot be replayed or no cause of theirs can be): the figure straggler-rank prints for
    each rank alone (``per_rank[].gain_alone_us``) and for the ranks it names."""
    chains_ = chains(result)
    every = step_breakdowns(result)
    steps = replay_steps(result, every)
    if chains_ is None or not steps:
        return None
    excess = chains_.gap_excess()
    fixes = [fix for rank, cause in sorted(causes.items()) if (fix := cause_fix(chains_, every, rank, cause, excess))]
    if not fixes:
        return None
    return saving(replay(chains_), replay_fix(chains_, _sum(chains_, fixes)), steps)


STRAGGLER_RULE = "straggler-rank"


def fix_ranks_doc(result: Any, ranks: list[int], source: str = "--fix-ranks") -> dict[str, Any]:
    """``tracecliff whatif --fix-ranks``: the typical step with these ranks' causes fixed, on the
    replay: each rank's cause as straggler-rank's finding names it (its ``per_rank``), the same
    computation as the finding's figures, so one rank gives its ``predicted_step_alone_us`` and
    the ranks it names its prediction (where the typical step's leaves hold all of the saving:
    the finding counts no more than they do, and says how much more the replay gives)."""
    from analyzer.base.errors import InputError
    finding = next((f for f in result.findings or [] if f.get("rule") == STRAGGLER_RULE), None)
    weighed = {p["rank"]: p["cause"] for p in ((finding or {}).get("evidence") or {}).get("per_rank") or []}
    if not weighed:
        raise InputError(source, "no straggler-rank finding weighed any rank on the replay in this run")
    unknown = [r for r in ranks if r not in weighed]
    if unknown:
        raise InputError(source, f"rank(s) {', '.join(map(str, unknown))} not weighed by straggler-rank "
                                 f"(weighed: {', '.join(map(str, sorted(weighed)))})")
    causes = {r: weighed[r] for r in ranks}
    replayed = fixed_ranks(result, causes)
    step = result.model.step_time_us
    if replayed is None or step is None:
        raise InputError(source, "the job cannot be replayed (no matched collectives or step windows)")
    gain = replayed
    return {"ranks": sorted(causes), "causes": {str(r): c for r, c in sorted(causes.items())},
            "step_time_us": round(step, 1), "gain_us": round(gain, 1), "predicted_step_time_us": round(step - gain, 1),
            "model": "replay of the measured job (docs/models.md §9)"}
