"""The same collective on every rank: who arrives last and how long the others wait.

A collective ends at about the same moment on every member (the ring completes together), so
each member's kernel duration = its wait for the last member + the transfer. Matching the rows of
one collective across ranks gives: arrival skew (spread of start times), transfer time (the
shortest duration among the ranks given: the last arrival waited for nobody) and wait per rank
(duration − transfer). With a subset of ranks, the last rank *given* may not be the last member,
so waits are lower bounds.

Matching key, first that works for the whole job: the ``Comms Id`` arg; else process group +
``Seq``; else process group + step + order of the group's collectives within the step on each
rank (ProcessGroupNCCL issues a group's collectives in the same order on every member).
Point-to-point operations (send, recv, batched send/recv) are never keyed by those: their
``Seq`` and ``Comms Id`` count one rank's own p2p calls on the group (all peers together, one per
coalesced batch), so equal values on two ranks need not be one transfer, and their order on a
rank differs per peer. They never decide whether a key works for the job's collectives; each
send is paired with its receive by (group, source, destination, n-th of that direction) where
the traces name the peers (analyzer.job.p2p), whatever the collectives' method, in sets of two
codes apart from the collectives' ones (method ``p2p_order`` when no collective matches). The
clock offsets come from the collectives' sets where there are any (a send may end before its
receive: gloo's returns once its bytes are handed to the socket).

Clocks of different hosts are not synchronised; each host's clock offset is estimated as the
median difference between its ranks' collective *end* times and the other ranks' (ends coincide
up to microseconds), and arrivals are compared on the corrected clocks. Processes on one host
read the same clock: their offset is that of the host, never one of their own (an estimate per
process is the noise of when each finishes a collective, gloo's up to milliseconds).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.base.rowtable import Numbers, nones
from analyzer.job.columns import CollectiveColumns, round_array, tuple_numbers
from analyzer.job.p2p import pair_codes

_P2P = ("send", "recv", "sendrecv")
METHODS = ("comms_id", "seq", "order")


# waited_for: the member whose kernel is shortest (the others waited for it); arrival_lag_us:
# after the set's median arrival (clock offsets corrected)
_UNMATCHED = {"wait_us": None, "waited_for": None, "arrival_lag_us": None}


def group_key(row: dict[str, Any]) -> tuple:
    """A row's process group: by name, else by member ranks, else unknown (per collective kind)."""
    group = row.get("group") or {}
    if group.get("name") is not None:
        return ("name", str(group["name"]))
    if group.get("ranks"):
        return ("ranks", tuple(group["ranks"]))
    return ("unknown", row["collective"])


def _codes(keys) -> np.ndarray:
    """Integer code per hashable key, in order of first appearance."""
    seen: dict[Any, int] = {}
    return np.fromiter((seen.setdefault(key, len(seen)) for key in keys), dtype=np.int64)


def _identity_codes(values: list[Any]) -> np.ndarray:
    """Integers that are equal exactly when ``str(value)`` is (the keys the trace gives may be
    ints up to 2**64 or strings); ints stay as they are, at numpy speed."""
    try:
        return np.fromiter(values, dtype=np.uint64, count=len(values)).view(np.int64)
    except (TypeError, ValueError, OverflowError):
        return _codes(str(v) for v in values)


def _tuple_codes(columns: list[np.ndarray], matched: np.ndarray | None = None) -> np.ndarray:
    """One code per distinct tuple of ``columns`` values (dense, in no particular order: enough
    to test a method, ``_first_seen`` numbers the chosen one's); -1 where ``matched`` is False."""
    count = len(columns[0])
    matched = np.ones(count, dtype=bool) if matched is None else matched
    out = np.full(count, -1, dtype=np.int64)
    if not matched.any():
        return out
    out[matched] = _dense(tuple_numbers([column[matched] for column in columns]))
    return out


def _first_seen(codes: np.ndarray) -> np.ndarray:
    """The codes (-1 kept) renumbered in order of first appearance."""
    used = codes >= 0
    _, first, inverse = unique_ints(codes[used], return_index=True, return_inverse=True)
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(len(first))
    out = np.full(len(codes), -1, dtype=np.int64)
    out[used] = renumber[inverse.reshape(-1)]
    return out


def _dense(values: np.ndarray) -> np.ndarray:
    return unique_ints(values, return_inverse=True)[1].astype(np.int64, copy=False)


def _key_codes(rows: list[dict[str, Any]], method: str, groups: np.ndarray, view: CollectiveColumns) -> np.ndarray | None:
    """One matching-key code per row (``_tuple_codes``; -1: this row is not matched), or None
    when the method does not apply. ``groups``: each row's process-group code."""
    collective = ~view.kind.isin(_P2P)  # point-to-point: no key (the module's docstring)
    index = np.flatnonzero(collective)
    if method in ("comms_id", "seq"):
        ids = _id_numbers(view, method, index)
        if ids is None:
            values = view.comms_id if method == "comms_id" else view.seq
            keys = [values[i] for i in index.tolist()]
            if not keys or None in keys:
                return None
            ids = _identity_codes(keys)
        elif not len(ids):
            return None
        full = np.zeros(len(rows), dtype=np.int64)
        full[index] = ids
        return _tuple_codes([full] if method == "comms_id" else [groups, full], collective)
    # order: the n-th collective of a group in a step on each rank
    ranks, starts, steps = view.rank, view.start, view.step.codes
    slot = tuple_numbers([ranks[index], groups[index], steps[index]])  # (rank, group, step) order kept
    order = np.lexsort((index, starts[index], slot))
    slot = slot[order]
    new_slot = np.r_[True, slot[1:] != slot[:-1]]
    run_start = np.maximum.accumulate(np.where(new_slot, np.arange(len(order)), 0))
    nth = np.empty(len(rows), dtype=np.int64)
    nth[index[order]] = np.arange(len(order)) - run_start
    nth[~collective] = 0
    return _tuple_codes([groups, steps, nth], collective)


def _id_numbers(view: CollectiveColumns, key: str, index: np.ndarray) -> np.ndarray | None:
    """``_identity_codes`` of the rows' ``key`` at ``index`` read from its column, when it holds
    whole numbers (an empty array: some of those rows have none, the key does not apply);
    None: read the values (another column form, negative ints)."""
    col = view.rows.column(key)
    if col is None:
        return np.zeros(0, dtype=np.int64)  # no row has the key: every value None
    if not isinstance(col, Numbers) or col.data.dtype.kind not in "iu":
        return None
    missing = view.rows.absent.get(key)
    if (col.none is not None and col.none[index].any()) or (missing is not None and missing[index].any()):
        return np.zeros(0, dtype=np.int64)
    data = col.data[index]
    if data.dtype.kind == "i" and len(data) and int(data.min()) < 0:
        return None  # as _identity_codes: negative ints are told apart by their text
    return data.view(np.int64) if data.dtype == np.uint64 else data.astype(np.int64)


def _valid(ranks: np.ndarray, codes: np.ndarray) -> bool:
    """A key must not repeat on one rank, and must match something across ranks."""
    used = codes >= 0
    if not used.any():
        return False
    code, rank = codes[used], ranks[used]
    pairs = np.sort((rank - rank.min()) * (int(code.max()) + 1) + code)
    if (pairs[1:] == pairs[:-1]).any():
        return False
    return int(np.bincount(code).max()) > 1  # no repeats per rank: two rows = two ranks


def match(rows: list[dict[str, Any]]) -> tuple[str | None, dict[int, list[int]]]:
    """(method, {key code: indices into rows}) of the collectives seen on 2+ ranks; sets in
    order of their first row, indices ascending."""
    method, codes = _match(CollectiveColumns(rows))
    if codes is None:
        return None, {}
    flat, bounds = _flat_sets(codes)
    return method, {int(codes[flat[lo]]): flat[lo:hi].tolist() for lo, hi in zip(bounds[:-1], bounds[1:])}


def _match(view: CollectiveColumns) -> tuple[str | None, np.ndarray | None]:
    """(method, key code per row numbered by first appearance, -1 unmatched), or (None, None)."""
    groups = view.group_keys(group_key)[0]
    pairs = pair_codes(view.rows) if view.kind.isin(_P2P).any() else None
    for method in METHODS:
        codes = _key_codes(view.rows, method, groups, view)
        if codes is None or not _valid(view.rank, codes):
            continue
        return method, _first_seen(_with_pairs(codes, pairs))
    if pairs is not None and (pairs >= 0).any():
        return "p2p_order", _first_seen(pairs)
    return None, None


def _with_pairs(codes: np.ndarray, pairs: np.ndarray | None) -> np.ndarray:
    """The collectives' codes with the p2p pairs' after them (codes of their own)."""
    if pairs is None or not (pairs >= 0).any():
        return codes
    out = codes.copy()
    paired = pairs >= 0
    out[paired] = pairs[paired] + int(codes.max()) + 1
    return out


def _flat_sets(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of each key seen on 2+ rows, set after set (sets by code, indices ascending within
    a set), and the sets' bounds: no list per set (a 64-rank job has thousands)."""
    indices = np.flatnonzero(codes >= 0)
    indices = indices[np.argsort(codes[indices], kind="stable")]  # by code = by first appearance
    sorted_codes = codes[indices]
    bounds = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1], True])
    sizes = np.diff(bounds)
    shared = sizes > 1
    return indices[np.repeat(shared, sizes)], np.r_[0, np.cumsum(sizes[shared])]


def _flat_clock_offsets(members: np.ndarray, ends: np.ndarray, bounds: np.ndarray,
                        clock_of: dict[int, Any] | None = None) -> dict[int, float]:
    """{rank: its clock's offset (µs)}: per clock (``clock_of``: each rank's host; a rank of its
    own where unknown), the median of its ranks' end times minus their sets' medians; 0 for
    all when every rank reads one clock."""
    diffs = ends - np.repeat(_set_medians(ends, bounds), np.diff(bounds))
    ranks = unique_ints(members).tolist()
    clocks = {rank: ("rank", rank) if clock_of is None or rank not in clock_of else ("host", clock_of[rank])
              for rank in ranks}
    if len(set(clocks.values())) == 1:
        return {rank: 0.0 for rank in ranks}
    # each member's clock, looked up per rank (members are ranks: ``ranks`` is their sorted set)
    clock_code: dict[Any, int] = {}
    rank_clock = np.array([clock_code.setdefault(clocks[rank], len(clock_code)) for rank in ranks], dtype=np.int64)
    codes = rank_clock[np.searchsorted(np.array(ranks, dtype=np.int64), members)]
    order = np.argsort(codes, kind="stable")
    found, first = unique_ints(codes[order], return_index=True)
    by_clock = {int(code): float(np.median(part)) for code, part in zip(found.tolist(), np.split(diffs[order], first[1:]))}
    code_of_rank = dict(zip(members.tolist(), codes.tolist()))
    return {rank: by_clock[code_of_rank[rank]] for rank in ranks}


def _clock_sets(view: CollectiveColumns, flat: np.ndarray, bounds: np.ndarray,
                ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(members, ends, bounds) of the sets that give the clock offsets: the collectives' where
    they hold every matched rank (their ends coincide), else every set."""
    p2p = view.kind.isin(_P2P)[flat[bounds[:-1]]]
    members = view.rank[flat]
    if not p2p.any() or p2p.all():
        return members, ends[flat], bounds
    sizes = np.diff(bounds)
    keep = np.repeat(~p2p, sizes)
    if len(unique_ints(members[keep])) < len(unique_ints(members)):  # a rank in pairs only: its offset from them
        return members, ends[flat], bounds
    return members[keep], ends[flat[keep]], np.r_[0, np.cumsum(sizes[~p2p])]


def analyze(rows: list[dict[str, Any]], world_size: int | None = None,
            view: CollectiveColumns | None = None, clock_of: dict[int, Any] | None = None) -> dict[str, Any]:
    """Set ``wait_us``, ``waited_for`` and ``arrival_lag_us`` on every row (None when unmatched:
    by column, in the rows' table) and return the straggler summary; the waits and arrival lags
    are kept in the view's columns too (NaN when unmatched).
    ``view``: the rows' columns when the caller has them; ``clock_of``: each rank's host (ranks
    of one host share its clock offset)."""
    view = view if view is not None else CollectiveColumns(rows)
    ranks = unique_ints(view.rank).tolist()
    view.set("wait_us", np.full(view.n, np.nan))
    view.set("arrival_lag_us", np.full(view.n, np.nan))
    view.set("waited_for", np.full(view.n, -1, dtype=np.int64))  # the member waited for; -1: none
    view.set("matched_ranks", np.zeros(view.n, dtype=np.int64))
    if len(ranks) < 2:
        _write_unmatched(view)
        return {"method": None, "matched_collectives": 0, "ranks_compared": ranks,
                "note": "fewer than two ranks with collectives: no cross-rank comparison",
                "per_step": [], "by_rank": [], "top_rank": None}
    method, codes = _match(view)
    if codes is None:
        _write_unmatched(view)
        return {"method": None, "matched_collectives": 0, "ranks_compared": ranks,
                "note": "no collective could be matched across ranks (no Comms Id, Seq, or "
                        "consistent group order)", "per_step": [], "by_rank": [], "top_rank": None}
    rank_of, starts, durations = view.rank, view.start, view.dur
    flat, bounds = _flat_sets(codes)
    members, flat_durations = rank_of[flat], durations[flat]
    offsets = _flat_clock_offsets(*_clock_sets(view, flat, bounds, starts + durations), clock_of)
    offset_ranks = np.array(list(offsets), dtype=np.int64)  # ascending (np.unique's)
    flat_arrivals = starts[flat] - np.array(list(offsets.values()))[np.searchsorted(offset_ranks, members)]
    transfer = np.minimum.reduceat(flat_durations, bounds[:-1])  # the last arrival waited for nobody
    waits = flat_durations - np.repeat(transfer, np.diff(bounds))
    view.extra["wait_us"][flat] = round_array(waits)
    view.set("matched_ranks", _set_sizes(view.n, flat, bounds))
    member_ranks, member_of = unique_ints(members, return_inverse=True)
    incurred = dict(zip(member_ranks.tolist(), np.bincount(member_of, weights=waits).tolist()))
    caused: dict[int, float] = defaultdict(float)
    last_count: dict[int, int] = defaultdict(int)
    steps: dict[Any, dict[str, Any]] = {}
    lags = np.empty(len(flat))
    waited = np.empty(len(flat), dtype=np.int64)
    last, skew = _per_set(flat_arrivals, flat_durations, members, bounds, lags, waited)
    first_rows = flat[bounds[:-1]].tolist()
    for k, (lo, hi, last_k, skew_k) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), last, skew)):
        set_waits = waits[lo:hi]
        last_rank = int(members[lo + last_k])
        others = float(set_waits.sum() - set_waits[last_k])
        caused[last_rank] += others
        last_count[last_rank] += 1
        step = view.step.at(first_rows[k])
        entry = steps.setdefault(step, {"caused": defaultdict(float), "sets": 0, "max_skew_us": 0.0})
        entry["caused"][last_rank] += others
        entry["sets"] += 1
        entry["max_skew_us"] = max(entry["max_skew_us"], skew_k)
    view.extra["arrival_lag_us"][flat] = round_array(lags)
    matched = np.zeros(view.n, dtype=bool)
    matched[flat] = True
    others = members != waited  # a member waited for by the others: no wait of its own to name
    view.extra["waited_for"][flat[others]] = waited[others]
    # The rows' keys, in _UNMATCHED's order: None where unmatched (and where no one was waited for)
    view.write("wait_us", Numbers(view.extra["wait_us"].copy(), ~matched))
    view.write("waited_for", Numbers(view.extra["waited_for"].copy(), view.extra["waited_for"] < 0))
    view.write("arrival_lag_us", Numbers(view.extra["arrival_lag_us"].copy(), ~matched))
    summary = _summary(method, len(bounds) - 1, ranks, offsets, caused, incurred, last_count, steps)
    if world_size and len(ranks) < world_size:
        summary["note"] = (f"{len(ranks)} of {world_size} ranks compared: the last rank given may "
                           "not be the last member, so waits are lower bounds")
    return summary


def matched_ranks(view: CollectiveColumns) -> np.ndarray:
    """How many ranks' rows each row was matched with, itself included (0: unmatched): the
    matching's column, else the same matching made again (a Result loaded from its JSON, whose
    rows keep their waits but not their sets). A collective whose set holds every member of
    its group has its transfer measured: its last arrival's kernel waited for nobody."""
    if "matched_ranks" not in view.extra:
        codes = _match(view)[1] if len(unique_ints(view.rank)) >= 2 else None
        if codes is None:
            view.set("matched_ranks", np.zeros(view.n, dtype=np.int64))
        else:
            flat, bounds = _flat_sets(codes)
            view.set("matched_ranks", _set_sizes(view.n, flat, bounds))
    return view.extra["matched_ranks"]


def _set_sizes(n: int, flat: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each row's set size (``_flat_sets``' sets), 0 for the rows in none."""
    out = np.zeros(n, dtype=np.int64)
    out[flat] = np.repeat(np.diff(bounds), np.diff(bounds))
    return out


def _write_unmatched(view: CollectiveColumns) -> None:
    """Every row unmatched: ``wait_us``, ``waited_for`` and ``arrival_lag_us`` None."""
    for key in _UNMATCHED:
        view.write(key, nones(view.n))


def _sets_by_size(bounds: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(which sets, their flat positions as one row per set) for each set size: the sets of one
    size as the rows of one 2-D array, where numpy's argmax, argmin, median, max and min of a
    row are those of the set's 1-D slice."""
    sizes = np.diff(bounds)
    for size in unique_ints(sizes).tolist():
        which = np.flatnonzero(sizes == size)
        yield which, bounds[which][:, None] + np.arange(size)


def _set_medians(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``np.median`` of each set's values."""
    out = np.empty(len(bounds) - 1)
    for which, at in _sets_by_size(bounds):
        out[which] = np.median(values[at], axis=1)
    return out


def _per_set(arrivals: np.ndarray, durations: np.ndarray, members: np.ndarray, bounds: np.ndarray,
             lags: np.ndarray, waited: np.ndarray) -> tuple[list[int], list[float]]:
    """Of each matched set (``bounds`` cut the flat members into sets): the position of its last
    arrival and its skew (latest − earliest arrival); each member's arrival lag (arrival − the
    set's median) into ``lags`` and the member it waited for (the one with the shortest kernel,
    the one the waits are measured against) into ``waited`` (``_sets_by_size``)."""
    last = np.empty(len(bounds) - 1, dtype=np.int64)
    skew = np.empty(len(bounds) - 1)
    for which, at in _sets_by_size(bounds):
        arrival = arrivals[at]
        last[which] = np.argmax(arrival, axis=1)
        waited[at] = members[at[np.arange(len(which)), np.argmin(durations[at], axis=1)]][:, None]
        lags[at] = arrival - np.median(arrival, axis=1)[:, None]
        skew[which] = arrival.max(axis=1) - arrival.min(axis=1)
    return last.tolist(), skew.tolist()


def _summary(method, total, ranks, offsets, caused, incurred, last_count, steps) -> dict[str, Any]:
    per_step = []
    for step in sorted(steps, key=lambda s: (s is None, s if s is not None else 0)):
        entry = steps[step]
        worst = min(entry["caused"], key=lambda r: (-entry["caused"][r], r))
        per_step.append({"step": step, "last_rank": worst,
                         "wait_caused_us": round(entry["caused"][worst], 3),
                         "collectives": entry["sets"], "max_skew_us": round(entry["max_skew_us"], 3)})
    by_rank = [{"rank": r, "times_last": last_count.get(r, 0),
                "wait_caused_us": round(caused.get(r, 0.0), 3),
                "wait_incurred_us": round(incurred.get(r, 0.0), 3),
                "clock_offset_us": round(offsets.get(r, 0.0), 3)} for r in ranks]
    top = min(ranks, key=lambda r: (-caused.get(r, 0.0), r))
    return {
        "method": method, "matched_collectives": total, "ranks_compared": ranks,
        "note": None,
        "per_step": per_step, "by_rank": by_rank,
        "top_rank": top if caused.get(top, 0.0) > 0 else None,
        "top_rank_last_share": round(last_count.get(top, 0) / total, 4) if total else None,
        "top_rank_wait_caused_us": round(caused.get(top, 0.0), 3),
    }
