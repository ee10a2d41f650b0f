"""What the ranks of the measured job wait for in each step: each step's time breakdown by
rank (``step_breakdowns``), the waiting a rank causes the others in a step (``caused_in_step``,
``waited_for_ranks``), a rank's excess over the median other rank (``excess_over_others``), and
over which leaves of the typical step the others' wait for late ranks lies (``recovers``). Facts
of the job as measured: straggler-rank reads them, and the replay (analyzer.whatif.replay) fixes
ranks by them.
"""

from __future__ import annotations

import math
from typing import Any

from analyzer.job.facts import median


def step_breakdowns(result: Any) -> dict[Any, dict[int, dict[str, Any]]]:
    """{step: {rank: that step's time breakdown + window start (µs, clock offsets corrected)
    and compute time}} of the steps whose waiting by peer is measured."""
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
                                                            "entry_us": entry_us,
                                                            "compute_us": entry.get("compute_us", 0.0)}
    return out


def excess_over_others(rows: dict[int, dict[str, Any]] | None, rank: int, leaf: str) -> float:
    """The rank's leaf minus the median of the other ranks' (0 when the step is unknown)."""
    if not rows or rank not in rows:
        return 0.0
    return rows[rank][leaf] - (median(tb[leaf] for r, tb in rows.items() if r != rank) or 0.0)


def caused_in_step(rows: dict[int, dict[str, Any]]) -> dict[int, float]:
    """{rank: the exposed waiting the step's ranks spend for it (mean over the ranks)}: its share
    of the step's "waiting for late peers" leaf (the α-β estimate names no rank)."""
    out: dict[int, float] = {}
    for tb in rows.values():
        for peer, us in (tb.get("wait_by_peer") or {}).items():
            if peer.isdigit():
                out[int(peer)] = out.get(int(peer), 0.0) + us / len(rows)
    return out


# Where a late rank's own extra time lies, by its cause: fixing it gives that back too.
OWN_LEAF = {"host": "idle_us", "queued": "idle_us", "compute": "compute_only_us", "entry-skew": "idle_us",
             "network": "exposed_transfer_us", "unknown": "exposed_wait_us"}


def recovers(waited: float, wait_us: float, cause: str, typical: Any) -> dict[str, float]:
    """The others' wait for the late ranks (``wait_us``: the median rank not late) over the
    typical step's leaves, which are means over the ranks: the waiting for the late ranks
    (``waited``: mean over the ranks, as the leaf), the rest in the leaf that holds the late
    ranks' own extra time (a slow GPU's compute, a stalled host's idle), each at most what that
    leaf holds. What no leaf holds is no time of the typical step (an entry-skewed rank's delay
    lies before its step window) and is not a gain."""
    room = (lambda leaf: typical.leaves.leaf(leaf)) if typical is not None else (lambda leaf: math.inf)
    wait = min(wait_us, waited, room("exposed_wait_us"))
    rest = OWN_LEAF.get(cause, "exposed_wait_us")
    if rest == "exposed_wait_us":
        return {"exposed_wait_us": min(wait_us, room("exposed_wait_us"))}
    own = min(wait_us - wait, room(rest))
    return {"exposed_wait_us": wait, rest: own} if own > 0.0 else {"exposed_wait_us": wait}



def waited_for_ranks(every: dict[Any, Any], steady: list[Any], on: Any, ranks: list[int]) -> float:
    """The waiting the ranks cause (mean over the ranks, as the leaf): in the typical step
    ``on``, else (None) the mean over the steady steps."""
    if on is not None:
        caused = caused_in_step(every[on])
        return sum(caused.get(r, 0.0) for r in ranks)
    return sum(caused_in_step(every[n]).get(r, 0.0) for n in steady for r in ranks) / len(steady) if steady else 0.0
