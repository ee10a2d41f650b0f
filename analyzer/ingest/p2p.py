"""Point-to-point operations as the traces record them: which op is a send or a receive, who
its peer is, and the order that pairs a send with its receive.

What torch writes about a send's or receive's peer (each later version keeps the earlier ones):

- ``record_param_comms``' ``Rank``: for send / recv the *peer's* rank in the process group (a
  collective's own rank otherwise);
- the ``nccl:send a->b`` / ``nccl:recv a<-b`` op titles (torch ≈ 2.2): ``a`` this rank, ``b`` the
  peer, both ranks in the group; Flight Recorder's ``profiling_name`` is the same title;
- ``Src Rank`` / ``Dst Rank`` (≈ 2.5): the peer's global rank, copied onto kernels by Kineto;
- ``Seq`` and ``Comms Id`` (2.12): a rank's own count of its p2p calls on the group, all peers
  together (one per coalesced batch), and a hash of it: no key across ranks (a send and its
  receive share one only by chance), used within a rank only;
- gloo (no ``record_param_comms``): ``c10d::send`` / ``c10d::recv_`` with ``Concrete Inputs``
  ``['', '', peer, tag]`` (the peer's rank in the group) when shapes are recorded.

Two ranks' p2p ops between them complete in the order they were posted (NCCL and gloo alike),
so the k-th send from a to b goes with the k-th receive at b from a (analyzer.hang pairs Flight
Recorder entries so; analyzer.job.p2p aligns the counts at a trace window's edges).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, TypeVar

P2P_KINDS = ("send", "recv", "sendrecv")
# record_param_comms' ``Collective name`` of a send / receive (kernels in newer Kineto copy it)
P2P_ARG_NAMES = frozenset({"send", "recv", "Send", "Recv", "SEND", "RECV"})
# The c10d dispatcher ops of a send / receive, with the position of their peer and tag among
# the ``Concrete Inputs`` (tensors, process group, peer, tag)
C10D_P2P = {"c10d::send": "send", "c10d::recv_": "recv"}
_PEER_AT, _TAG_AT = 2, 3

_TITLE = re.compile(r"^\s*(\d{1,9})\s*(->|<-)\s*(\d{1,9})\s*$")

T = TypeVar("T")


def peer_in_title(kind: str, text: str) -> tuple[int, int] | None:
    """(this rank, its peer), ranks in the group, of a ``0->1`` (send) / ``1<-0`` (receive)
    title, e.g. the part after ``nccl:send ``; None when it is not one for ``kind``."""
    match = _TITLE.match(text) if isinstance(text, str) else None
    if match is None or match.group(2) != ("->" if kind == "send" else "<-"):
        return None
    return int(match.group(1)), int(match.group(3))


def title_of(op_name: str) -> tuple[str, tuple[int, int]] | None:
    """(kind, (this rank, peer)) of a ``nccl:send 0->1`` / ``nccl:recv 1<-0`` op name (any
    backend prefix); None for any other name."""
    prefix, _, rest = op_name.partition(":")
    kind, _, text = rest.partition(" ")
    if not prefix or kind not in ("send", "recv"):
        return None
    ends = peer_in_title(kind, text)
    return None if ends is None else (kind, ends)


def concrete_peer(op_name: str, concrete: Any) -> tuple[str, int, int | None] | None:
    """(kind, peer's rank in the group, tag) of a ``c10d::send`` / ``c10d::recv_`` op from its
    ``Concrete Inputs`` (a list of texts); None when it is not one or they do not say."""
    kind = C10D_P2P.get(op_name)
    if kind is None or not isinstance(concrete, list) or len(concrete) <= _PEER_AT:
        return None
    peer = _small_int(concrete[_PEER_AT])
    if peer is None:
        return None
    return kind, peer, _small_int(concrete[_TAG_AT]) if len(concrete) > _TAG_AT else None


def _small_int(text: Any) -> int | None:
    if isinstance(text, str) and text.strip().isdigit() and len(text.strip()) <= 9:
        return int(text)
    return None


def direction(kind: str, rank: int, peer: int) -> tuple[int, int]:
    """(source, destination) of a send (``rank`` sends) or receive (``rank`` receives)."""
    return (rank, peer) if kind == "send" else (peer, rank)


def in_posting_order(items: Iterable[tuple[Any, str, T]]) -> tuple[dict[Any, list[T]], dict[Any, list[T]]]:
    """({key: sends}, {key: receives}) of ``(key, kind, item)`` triples given in each rank's
    posting order, where ``key`` names the direction (a group, source and destination): the
    k-th send of a key goes with the k-th receive of it."""
    sends: dict[Any, list[T]] = {}
    recvs: dict[Any, list[T]] = {}
    for key, kind, item in items:
        (sends if kind == "send" else recvs).setdefault(key, []).append(item)
    return sends, recvs
