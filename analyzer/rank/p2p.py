"""A rank's sends and receives: each one's peer, as the row field ``peers``.

``peers`` is a list of ``[kind, peer, tag]`` members (``kind`` send or recv, ``peer`` the other
end's global rank, ``tag`` gloo's tag or None): one member for a send or receive, one per op of a
coalesced batch (``batch_isend_irecv`` on NCCL: one ``SendRecv`` kernel for all its ops). It is
None when the trace does not say who the peer is; the job's pairing (analyzer.job.p2p) reads it.

The peer, best source first (analyzer.ingest.p2p says what each torch version writes):
``Src Rank`` / ``Dst Rank`` (global), ``Rank`` (the peer's rank in the group), the
``nccl:send a->b`` / ``nccl:recv a<-b`` op title, ``c10d::send`` / ``c10d::recv_``'s
``Concrete Inputs``. A rank in the group is mapped to a global one through the group's ranks;
a peer outside the group, beyond it or this rank itself is no peer (the row stays unmatched).

A coalesced batch's kernel is launched by ``nccl:coalesced`` once every op of the batch was
recorded (each op's ``record_param_comms`` ends before it, launching nothing): its members are
the send / receive ``record_param_comms`` of the launch's thread since the thread's previous
communication launch that launched no kernel themselves, of the batch's one ``Seq`` where the
trace records it (a rank's p2p ``Seq`` counts batches: the same for all ops of one).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from analyzer.ingest.p2p import P2P_KINDS, concrete_peer, title_of
from analyzer.ingest.trace import Marker, RankTrace

Member = list  # [kind, peer (global rank), tag or None]


def members(kind: str, meta: dict[str, Any], op_name: str | None, op_args: dict[str, Any] | None,
            group: dict[str, Any], rank: int) -> tuple[list[Member] | None, bool]:
    """(the one member of a send or receive, or None when no source names a usable peer;
    whether a source named one that is not: out of the group or this rank itself)."""
    if kind not in ("send", "recv"):
        return None, False
    ranks = group.get("ranks")
    bad = False
    for source in (_global_peer, _group_peer, _title_peer, _concrete_peer):
        found = source(kind, meta, op_name, op_args, ranks)
        if found is None:
            continue
        peer, tag = found
        if peer is not None and peer != rank and (ranks is None or peer in ranks):
            return [[kind, peer, tag]], bad
        bad = True
    return None, bad


def _global_peer(kind, meta, op_name, op_args, ranks) -> tuple[int | None, None] | None:
    value = meta.get("dst_rank" if kind == "send" else "src_rank")
    return None if value is None else (value, None)


def _group_peer(kind, meta, op_name, op_args, ranks) -> tuple[int | None, None] | None:
    value = meta.get("peer_rank")
    return None if value is None else (_global(value, ranks), None)


def _title_peer(kind, meta, op_name, op_args, ranks) -> tuple[int | None, None] | None:
    title = title_of(op_name) if op_name else None
    if title is None or title[0] != kind:
        return None
    return _global(title[1][1], ranks), None


def _concrete_peer(kind, meta, op_name, op_args, ranks) -> tuple[int | None, int | None] | None:
    found = concrete_peer(op_name or "", (op_args or {}).get("concrete_inputs"))
    if found is None or found[0] != kind:
        return None
    return _global(found[1], ranks), found[2]


def _global(local: int, ranks: list[int] | None) -> int | None:
    """The global rank of a rank in the group; None when the group's ranks are unknown or it is
    not one of them."""
    return ranks[local] if ranks is not None and 0 <= local < len(ranks) else None


def add_batches(rank: RankTrace, rows: list[dict[str, Any]], launch_ts: np.ndarray, launch_thread: np.ndarray,
                params_row: np.ndarray, member_of: Callable[[int], tuple[list[Member] | None, dict[str, Any]]]) -> int:
    """Give each coalesced batch's kernel row (a send / receive kernel no ``record_param_comms``
    encloses, with no peers of its own) its members (the module's docstring); ``member_of(row)``:
    a marker row's (members, metadata). A batch of sends only (receives only) becomes a send
    (receive), a batch of one op takes its sizes. Returns how many rows got members."""
    todo = [k for k, row in enumerate(rows) if row["collective"] in P2P_KINDS and params_row[k] < 0
            and row.get("peers") is None and launch_thread[k] >= 0]
    if not todo:
        return 0
    m = rank.markers
    params = np.flatnonzero(m.kind == Marker.COMM_PARAMS)
    linked = set(params_row[params_row >= 0].tolist())
    free = np.array([p for p in params.tolist() if p not in linked], dtype=np.int64)
    if not len(free):
        return 0
    done = 0
    for k in todo:
        thread, ts = launch_thread[k], launch_ts[k]
        same = launch_thread == thread
        before = launch_ts[same & (launch_ts < ts)]
        since = int(before.max()) if len(before) else -(2**62)
        rows_in = free[(m.thread[free] == thread) & (m.ts[free] > since) & (m.end[free] <= ts)]
        found = [(row, *member_of(int(row))) for row in rows_in.tolist()]
        found = [(row, mine, meta) for row, mine, meta in found if mine is not None]
        if not found:
            continue
        seq = found[-1][2].get("seq")
        if seq is not None:
            found = [f for f in found if f[2].get("seq") == seq]
        _set_batch(rows[k], [member for _, mine, _ in found for member in mine], [meta for _, _, meta in found])
        done += 1
    return done


def _set_batch(row: dict[str, Any], batch: list[Member], metas: list[dict[str, Any]]) -> None:
    kinds = {member[0] for member in batch}
    row["peers"] = batch
    if len(kinds) == 1:
        row["collective"] = kinds.pop()
    if len(metas) == 1 and row["bytes"] is None:
        meta = metas[0]
        for key in ("in_nelems", "out_nelems", "bytes", "dtype", "size_source"):
            if meta.get(key) is not None:
                row[key] = meta[key]
