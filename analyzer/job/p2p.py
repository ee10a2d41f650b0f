"""Point-to-point operations paired across ranks: each send with its receive.

The key of a transfer is (process group, source global rank, destination global rank, n-th op of
that direction in posting order): two ranks' p2p ops between them complete in the order they
were posted (NCCL and gloo alike), so the k-th send from a to b goes with the k-th receive at b
from a (analyzer.ingest.p2p). ``Seq`` and ``Comms Id`` are no key (a rank's own count of its p2p
calls, all peers together): only the rows' ``peers`` (analyzer.rank.p2p) are read.

A trace window cut mid-step misaligns posting order at its edges (a receive posted before the
window whose send is not in it, a send whose receive came after): a direction is aligned by the
k-th op from the start of each side's window only when both sides hold as many ops; else that
direction is left unmatched (no guess of which end lost an op).

A matched pair is a set of two rows, measured as a collective's set is (analyzer.job.crossrank:
transfer = the shorter kernel, wait = duration − transfer). A coalesced batch's kernel (several
members) is paired only when all its members pair one to one with the members of a single
other row (rank 0's ``{send to 1, recv from 1}`` with rank 1's ``{recv from 0, send to 0}``);
a batch spanning several peers ends with its slowest peer, so no one-to-one duration
comparison holds and it stays unmatched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.ingest.p2p import direction, in_posting_order


def p2p_group(row: dict[str, Any]) -> tuple:
    """A p2p row's process group: by name, else member ranks, else unknown (one for both kinds:
    a send and its receive must share it)."""
    group = row.get("group") or {}
    if group.get("name") is not None:
        return ("name", str(group["name"]))
    if group.get("ranks"):
        return ("ranks", tuple(group["ranks"]))
    return ("unknown",)


def pair_codes(rows: Any) -> np.ndarray:
    """One code per row: the number of its send / receive pair (0, 1, ... in no particular
    order), -1 for every row in no pair (collectives, p2p rows without peers or unpaired)."""
    codes = np.full(len(rows), -1, dtype=np.int64)
    # a row table (analyzer.base.rowtable) gives the column without a dict per row
    peers = rows.values("peers") if hasattr(rows, "values") else [row.get("peers") for row in rows]
    with_peers = [i for i, found in enumerate(peers) if found]
    if not with_peers:
        return codes
    p2p = {i: rows[i] for i in with_peers}  # the few p2p rows as dicts, by position
    # each rank's ops in posting order: the host's launch, else the op's start; the members of
    # a batch in their recorded order
    order = sorted(with_peers, key=lambda i: (_posted(p2p[i]), i))
    items = []
    for i in order:
        row, group = p2p[i], p2p_group(p2p[i])
        for m, (kind, peer, _tag) in enumerate(row["peers"]):
            items.append(((group, *direction(kind, row["rank"], peer)), kind, (i, m)))
    sends, recvs = in_posting_order(items)
    partner: dict[tuple[int, int], tuple[int, int]] = {}
    for key, sent in sends.items():
        got = recvs.get(key, [])
        if len(got) != len(sent):  # a window edge cut this direction: no alignment is sure
            continue
        for a, b in zip(sent, got):
            partner[a], partner[b] = b, a
    return _one_to_one(p2p, with_peers, partner, codes)


def _posted(row: dict[str, Any]) -> float:
    launch = row.get("launch_us")
    return float(launch if launch is not None else row["start_us"])


def _one_to_one(rows: dict[int, dict[str, Any]], with_peers: list[int], partner: dict[tuple[int, int], tuple[int, int]],
                codes: np.ndarray) -> np.ndarray:
    """Pairs of rows whose every member's partner is a member of the other row (the module's
    docstring), numbered in order of their first row."""
    count = 0
    for i in with_peers:
        members = range(len(rows[i]["peers"]))
        others = {partner.get((i, m), (-1, -1))[0] for m in members}
        if len(others) != 1:
            continue
        j = others.pop()
        if j <= i or j < 0:  # unpaired, or numbered from its first row
            continue
        if len(rows[j]["peers"]) == len(rows[i]["peers"]) and all(
                partner.get((j, m), (-1, -1))[0] == i for m in range(len(rows[j]["peers"]))):
            codes[i] = codes[j] = count
            count += 1
    return codes
