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
Point-to-point operations are matched only by id or seq (their order differs per peer).

Clocks of different hosts are not synchronised; each rank's clock offset is estimated as the
median difference between its collective *end* times and the other ranks' (ends coincide up to
microseconds), and arrivals are compared on the corrected clocks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

_P2P = ("send", "recv", "sendrecv")
METHODS = ("comms_id", "seq", "order")


def _group_key(row: dict[str, Any]) -> Any:
    group = row.get("group") or {}
    if group.get("name") is not None:
        return ("name", str(group["name"]))
    if group.get("ranks"):
        return ("ranks", tuple(group["ranks"]))
    return ("unknown", row["collective"])


def _keys(rows: list[dict[str, Any]], method: str) -> list[Any] | None:
    """One key per row (None: this row is not matched), or None when the method does not apply."""
    if method == "comms_id":
        if any(r.get("comms_id") is None for r in rows):
            return None
        return [("id", str(r["comms_id"])) for r in rows]
    if method == "seq":
        if any(r.get("seq") is None for r in rows):
            return None
        return [("seq", _group_key(r), str(r["seq"])) for r in rows]
    order: dict[tuple, int] = defaultdict(int)
    keys = []
    for r in sorted(rows, key=lambda r: (r["rank"], r["start_us"])):
        if r["collective"] in _P2P:
            keys.append((id(r), None))
            continue
        slot = (r["rank"], _group_key(r), r.get("step"))
        keys.append((id(r), ("order", _group_key(r), r.get("step"), order[slot])))
        order[slot] += 1
    by_id = dict(keys)
    return [by_id[id(r)] for r in rows]


def _valid(rows: list[dict[str, Any]], keys: list[Any]) -> bool:
    """A key must not repeat on one rank, and must match something across ranks."""
    seen: set[tuple] = set()
    members: dict[Any, set[int]] = defaultdict(set)
    for row, key in zip(rows, keys):
        if key is None:
            continue
        if (row["rank"], key) in seen:
            return False
        seen.add((row["rank"], key))
        members[key].add(row["rank"])
    return any(len(m) > 1 for m in members.values())


def match(rows: list[dict[str, Any]]) -> tuple[str | None, dict[Any, list[int]]]:
    """(method, {key: indices into rows}) of the collectives seen on 2+ ranks."""
    for method in METHODS:
        keys = _keys(rows, method)
        if keys is None or not _valid(rows, keys):
            continue
        sets: dict[Any, list[int]] = defaultdict(list)
        for index, key in enumerate(keys):
            if key is not None:
                sets[key].append(index)
        return method, {k: v for k, v in sets.items() if len(v) > 1}
    return None, {}


def clock_offsets(rows: list[dict[str, Any]], sets: dict[Any, list[int]]) -> dict[int, float]:
    """Per rank, median of (its end − the set's median end) over the sets it is in (µs)."""
    diffs: dict[int, list[float]] = defaultdict(list)
    for indices in sets.values():
        ends = np.array([rows[i]["start_us"] + rows[i]["dur_us"] for i in indices])
        middle = float(np.median(ends))
        for i, end in zip(indices, ends):
            diffs[rows[i]["rank"]].append(float(end) - middle)
    return {rank: float(np.median(values)) for rank, values in sorted(diffs.items())}


def analyze(rows: list[dict[str, Any]], world_size: int | None = None) -> dict[str, Any]:
    """Set ``wait_us`` on every row (None when unmatched) and return the straggler summary."""
    ranks = sorted({r["rank"] for r in rows})
    for row in rows:
        row["wait_us"] = None
    if len(ranks) < 2:
        return {"method": None, "matched_collectives": 0, "ranks_compared": ranks,
                "note": "fewer than two ranks with collectives: no cross-rank comparison",
                "per_step": [], "by_rank": [], "top_rank": None}
    method, sets = match(rows)
    if method is None:
        return {"method": None, "matched_collectives": 0, "ranks_compared": ranks,
                "note": "no collective could be matched across ranks (no Comms Id, Seq, or "
                        "consistent group order)", "per_step": [], "by_rank": [], "top_rank": None}
    offsets = clock_offsets(rows, sets)
    caused: dict[int, float] = defaultdict(float)
    incurred: dict[int, float] = defaultdict(float)
    last_count: dict[int, int] = defaultdict(int)
    steps: dict[Any, dict[str, Any]] = {}
    for indices in sets.values():
        members = [rows[i] for i in indices]
        arrival = np.array([m["start_us"] - offsets[m["rank"]] for m in members])
        durations = np.array([m["dur_us"] for m in members])
        transfer = float(durations.min())
        waits = durations - transfer
        last = int(np.argmax(arrival))
        last_rank = members[last]["rank"]
        for m, w in zip(members, waits):
            m["wait_us"] = round(float(w), 3)
            incurred[m["rank"]] += float(w)
        others = float(waits.sum() - waits[last])
        caused[last_rank] += others
        last_count[last_rank] += 1
        step = members[0].get("step")
        entry = steps.setdefault(step, {"caused": defaultdict(float), "sets": 0, "max_skew_us": 0.0})
        entry["caused"][last_rank] += others
        entry["sets"] += 1
        entry["max_skew_us"] = max(entry["max_skew_us"], float(arrival.max() - arrival.min()))
    summary = _summary(method, sets, ranks, offsets, caused, incurred, last_count, steps)
    if world_size and len(ranks) < world_size:
        summary["note"] = (f"{len(ranks)} of {world_size} ranks compared: the last rank given may "
                           "not be the last member, so waits are lower bounds")
    return summary


def _summary(method, sets, ranks, offsets, caused, incurred, last_count, steps) -> dict[str, Any]:
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
    total = len(sets)
    return {
        "method": method, "matched_collectives": total, "ranks_compared": ranks,
        "note": None,
        "per_step": per_step, "by_rank": by_rank,
        "top_rank": top if caused.get(top, 0.0) > 0 else None,
        "top_rank_last_share": round(last_count.get(top, 0) / total, 4) if total else None,
        "top_rank_wait_caused_us": round(caused.get(top, 0.0), 3),
    }
