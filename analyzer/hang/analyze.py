"""Match Flight Recorder entries across ranks and name what hangs: per process group, entries are
matched by sequence id (collectives by ``collective_seq_id``; p2p by the order of the sends and
receives between each pair of ranks, which is what ``p2p_seq_id`` counts), and the first
collective that not every member completed is classified."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from analyzer.hang.read import Entry, GroupStatus, RankDump

DEFAULT_GROUP = "0"  # torch names the default process group "0" (desc "default_pg")
# Collectives whose per-rank sizes legitimately differ: only their name and dtypes must agree.
UNEVEN_SIZES = {"all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
                "scatter", "gather", "all_gather_v", "reduce_scatter_v", "coalesced"}
KIND_ORDER = ("desync", "missing-rank", "not-reporting", "p2p-unmatched", "stuck")


@dataclass
class Group:
    name: str
    description: str
    ranks: list[int]
    membership: str  # "pg_config" or how it was inferred

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "ranks": self.ranks,
                "size": len(self.ranks), "membership": self.membership,
                "membership_inferred": self.membership != "pg_config"}


@dataclass
class Hang:
    group: Group
    seq: int
    kind: str
    op: str
    ranks: list[int]           # the culprits
    waiting_ranks: list[int]
    waiting_since_ns: int | None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group.to_dict(), "seq": self.seq, "kind": self.kind, "op": self.op,
                "ranks": self.ranks, "waiting_ranks": self.waiting_ranks,
                "waiting_since_ns": self.waiting_since_ns, "detail": self.detail}


def entry_dict(e: Entry | None, completed: bool | None = None) -> dict[str, Any] | None:
    if e is None:
        return None
    out = {"group": e.group, "description": e.description, "seq": e.seq, "p2p": e.is_p2p, "op": e.op,
           "peer": e.peer, "state": e.state, "completed": completed, "time_created_ns": e.time_created_ns,
           "input_sizes": e.input_sizes, "output_sizes": e.output_sizes, "input_dtypes": e.input_dtypes,
           "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in e.frames]}
    return out


class Job:
    """The dumps of one job, indexed for matching."""

    def __init__(self, dumps: list[RankDump]):
        self.dumps = {d.rank: d for d in dumps}
        self.notes: list[str] = []
        self.world = self._world()
        self.groups = self._groups()

    def _world(self) -> list[int]:
        ranks = set(self.dumps)
        for d in self.dumps.values():
            ranks.update(r for cfg in d.pg_config.values() for r in cfg["ranks"] or [])
        return list(range(max(ranks) + 1)) if ranks else []

    def _groups(self) -> dict[str, Group]:
        described: dict[str, Counter] = {}
        logged: dict[str, set[int]] = {}
        for d in self.dumps.values():
            for e in d.entries:
                described.setdefault(e.group, Counter())[e.description] += 1
                logged.setdefault(e.group, set()).add(d.rank)
        if any(e.backend == "gloo" for d in self.dumps.values() for e in d.entries):
            self.notes.append("gloo entries stay 'scheduled': completion is read from each rank's pg_status "
                              "(last completed sequence id; gloo counts a collective that failed as completed)")
        return {name: self._group(name, described[name].most_common(1)[0][0], logged[name])
                for name in sorted(described, key=_group_order)}

    def _group(self, name: str, description: str, logged: set[int]) -> Group:
        configured = [d.pg_config[name]["ranks"] for d in self.dumps.values()
                      if name in d.pg_config and d.pg_config[name]["ranks"] is not None]
        if configured:
            if any(c != configured[0] for c in configured):
                self.notes.append(f"group {name}: the dumps disagree on its members; their union is used")
            return Group(name, description, sorted({r for c in configured for r in c}), "pg_config")
        if name == DEFAULT_GROUP or description == "default_pg":
            how = ("inferred: pg_config does not list this group, and the default group holds every rank "
                   f"(0..{len(self.world) - 1}, from the dump file names and pg_config)")
            return Group(name, description, list(self.world), how)
        how = "inferred: pg_config does not list this group; its members are the ranks that logged entries for it"
        return Group(name, description, sorted(logged), how)

    def completed(self, rank: int, e: Entry) -> bool | None:
        """True/False, or None when the dump cannot tell (gloo entries stay "scheduled"; their
        progress is only in ``pg_status``)."""
        if e.state == "completed" or e.time_completed_ns:
            return True
        status = self.status(rank, e)
        if status is not None and status.completed >= 0 and not e.is_p2p:
            return e.collective_seq <= status.completed
        if e.backend == "gloo":
            return None
        return False

    def status(self, rank: int, e: Entry) -> GroupStatus | None:
        return self.dumps[rank].pg_status.get(e.pg_id)

    def entries(self, rank: int, group: str, p2p: bool) -> list[Entry]:
        if rank not in self.dumps:
            return []
        return sorted((e for e in self.dumps[rank].entries if e.group == group and e.is_p2p == p2p),
                      key=lambda e: (e.seq, e.record_id))


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def find_hangs(job: Job) -> list[Hang]:
    hangs = []
    for group in job.groups.values():
        hang = collective_hang(job, group) or p2p_hang(job, group)
        if hang:
            hangs.append(hang)
    return rank_hangs(hangs)


def rank_hangs(hangs: list[Hang]) -> list[Hang]:
    """Root causes first: a hang whose culprits are themselves waiting in another hang is a
    consequence of that one; then the one waiting longest."""
    waiting = {r for h in hangs for r in h.waiting_ranks}
    return sorted(hangs, key=lambda h: (bool(set(h.ranks) & waiting), h.waiting_since_ns or 0,
                                        KIND_ORDER.index(h.kind), _group_order(h.group.name)))


def collective_hang(job: Job, group: Group) -> Hang | None:
    reporting = [r for r in group.ranks if r in job.dumps]
    silent = [r for r in group.ranks if r not in job.dumps]
    by_rank = {r: {e.collective_seq: e for e in job.entries(r, group.name, False)} for r in reporting}
    starts = [min(seqs) for seqs in by_rank.values() if seqs]
    if not starts:
        return None
    first = max(starts)  # older entries may have left some ranks' ring buffers
    for seq in sorted({s for seqs in by_rank.values() for s in seqs if s >= first}):
        present = {r: seqs[seq] for r, seqs in by_rank.items() if seq in seqs}
        absent = [r for r in reporting if r not in present]
        hang = (_desync(job, group, seq, present) or _missing(job, group, seq, present, absent, silent)
                or _unfinished(job, group, seq, present, silent))
        if hang:
            return hang
    return None


def _signature(e: Entry) -> tuple:
    sizes = () if e.op in UNEVEN_SIZES else (repr(e.input_sizes), repr(e.output_sizes))
    return (e.op, *sizes, tuple(e.input_dtypes), tuple(e.output_dtypes))


def _desync(job: Job, group: Group, seq: int, present: dict[int, Entry]) -> Hang | None:
    signatures = {r: _signature(e) for r, e in present.items()}
    counts = Counter(signatures.values())
    if len(counts) < 2:
        return None
    # The majority's call is the expected one; on a tie, the lowest rank's (as fr_trace does).
    expected = max(counts, key=lambda s: (counts[s], -min(r for r, x in signatures.items() if x == s)))
    culprits = sorted(r for r, s in signatures.items() if s != expected)
    waiting = sorted(r for r, s in signatures.items() if s == expected)
    reference = present[waiting[0]]
    differs = sorted({_difference(reference, present[r]) for r in culprits})
    detail = {"differs_in": differs, "tie": len(culprits) == len(waiting),
              "expected": _call(reference), "issued": {str(r): _call(present[r]) for r in culprits},
              **_culprit_detail(job, group, culprits, seq)}
    return Hang(group, seq, "desync", reference.op, culprits, waiting,
                min(present[r].time_created_ns for r in waiting), detail)


def _difference(a: Entry, b: Entry) -> str:
    if a.op != b.op:
        return "collective"
    if (a.input_sizes, a.output_sizes) != (b.input_sizes, b.output_sizes):
        return "sizes"
    return "dtypes"


def _call(e: Entry) -> dict[str, Any]:
    return {"op": e.op, "input_sizes": e.input_sizes, "output_sizes": e.output_sizes,
            "input_dtypes": e.input_dtypes, "output_dtypes": e.output_dtypes}


def _missing(job: Job, group: Group, seq: int, present: dict[int, Entry], absent: list[int],
             silent: list[int]) -> Hang | None:
    if not absent:
        return None
    waiting = sorted(present)
    op = present[waiting[0]].op
    detail = {**_culprit_detail(job, group, absent, seq), "not_reporting": silent}
    return Hang(group, seq, "missing-rank", op, absent, waiting,
                min(e.time_created_ns for e in present.values()), detail)


def _unfinished(job: Job, group: Group, seq: int, present: dict[int, Entry], silent: list[int]) -> Hang | None:
    done = {r: job.completed(r, e) for r, e in present.items()}
    if all(done.values()):
        return None
    pending = sorted(r for r, d in done.items() if d is False)
    op = next(iter(present.values())).op
    since = min(e.time_created_ns for e in present.values())
    if silent and (pending or None in done.values()):
        return Hang(group, seq, "not-reporting", op, silent, sorted(present), since,
                    {"reason": "these members wrote no dump (dead host, or the dump was not collected)",
                     **_culprit_detail(job, group, silent, seq)})
    if not pending:
        return None  # completion not recorded (gloo without pg_status): nothing to say
    started = sorted(r for r in pending if _started(job, r, present[r]))
    return Hang(group, seq, "stuck", op, pending, sorted(r for r in present if r not in pending), since,
                {"started": started, "reason": "every member entered it and it did not complete: "
                 "look at the network / NCCL (or a rank that died inside the kernel)",
                 **_culprit_detail(job, group, pending, seq)})


def _started(job: Job, rank: int, e: Entry) -> bool:
    status = job.status(rank, e)
    return e.state in ("started", "completed") or bool(e.time_started_ns) or (
        status is not None and status.started >= e.collective_seq)


def _culprit_detail(job: Job, group: Group, ranks: list[int], seq: int | None) -> dict[str, Any]:
    """Where each culprit was last seen: its last entry in this group, its last completed one
    before ``seq`` (gloo counts a collective that failed as completed), and its newest entry in
    any group (it may be stuck elsewhere)."""
    out = {}
    for r in ranks:
        if r not in job.dumps:
            out[str(r)] = {"dump": False}
            continue
        mine = job.entries(r, group.name, False)
        finished = [e for e in mine if job.completed(r, e) and (seq is None or e.seq < seq)]
        newest = max(job.dumps[r].entries, key=lambda e: (e.time_created_ns, e.record_id), default=None)
        out[str(r)] = {"dump": True, "last_entry": entry_dict(mine[-1] if mine else None),
                       "last_completed": entry_dict(finished[-1] if finished else None, True),
                       "newest_entry_any_group": entry_dict(newest)}
    return {"culprits": out}


def p2p_hang(job: Job, group: Group) -> Hang | None:
    """Pair the k-th send from a to b with the k-th receive at b from a. A pending send or
    receive with no partner (or a partner of other sizes) is a p2p hang."""
    sends, recvs = _p2p_by_pair(job, group)
    problems = []
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        out, into = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(out), len(into))):
            problem = _p2p_problem(job, group, src, dst, out[k] if k < len(out) else None,
                                   into[k] if k < len(into) else None)
            if problem:
                problems.append(problem)
                break
    return min(problems, key=lambda h: (h.waiting_since_ns or 0, h.ranks)) if problems else None


def _p2p_by_pair(job: Job, group: Group) -> tuple[dict, dict]:
    members = group.ranks
    sends: dict[tuple[int, int], list[Entry]] = {}
    recvs: dict[tuple[int, int], list[Entry]] = {}
    for r in members:
        for e in job.entries(r, group.name, True):
            pair = _peer_pair(e, members)
            if pair and e.op == "send":
                sends.setdefault(pair, []).append(e)
            elif pair and e.op == "recv":
                recvs.setdefault(pair, []).append(e)
    return sends, recvs


def _peer_pair(e: Entry, members: list[int]) -> tuple[int, int] | None:
    """``send 0->1`` / ``recv 1<-0`` name group-local ranks; map them to global ones."""
    arrow = "->" if e.op == "send" else "<-"
    parts = e.peer.split(arrow)
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return None
    a, b = (int(p) for p in parts)
    src, dst = (a, b) if e.op == "send" else (b, a)
    if max(src, dst) >= len(members):
        return None
    return members[src], members[dst]


def _p2p_problem(job: Job, group: Group, src: int, dst: int, send: Entry | None,
                 recv: Entry | None) -> Hang | None:
    if send and recv:
        if send.input_sizes == recv.output_sizes or job.completed(src, send):
            return None
        return Hang(group, send.p2p_seq, "p2p-unmatched", "send", [src, dst], [],
                    min(send.time_created_ns, recv.time_created_ns),
                    {"reason": "sizes differ", "send": _call(send), "recv": _call(recv)})
    posted, rank, peer = (send, src, dst) if send else (recv, dst, src)
    if job.completed(rank, posted):
        return None
    kind = "p2p-unmatched" if peer in job.dumps else "not-reporting"
    reason = (f"rank {rank} posted {posted.op} {posted.peer}; rank {peer} "
              + ("never posted the matching " + ("recv" if send else "send") if peer in job.dumps
                 else "wrote no dump"))
    return Hang(group, posted.p2p_seq, kind, posted.op, [peer], [rank], posted.time_created_ns,
                {"reason": reason, "posted": entry_dict(posted), **_culprit_detail(job, group, [peer], None)})
