"""Match Flight Recorder entries across ranks and name what hangs.

Per process group, each rank's entries become operations: a collective is the entries that share
its ``collective_seq_id`` (a coalesced group is several entries and its end marker, one
operation), a p2p op is matched by the order of the sends and receives between each pair of
ranks. Collectives are matched across members by sequence id, and for each one every piece of
evidence about its completion on each member is weighed (``Progress``):

- the rank's own entry: ``completed`` (its end event fired); ``retired`` (NCCL: retired
  without completing = timed out or aborted; gloo: the call returned, with or without an error);
  ``pg_status`` (the last completed id the rank's watchdog / worker recorded: it lags behind the
  entries, and counts a failed collective as completed);
- the rank's later work in the same group: on NCCL a later collective that *started* proves it
  (the group's kernels run in order on one stream), one only scheduled proves nothing. On gloo
  nothing later proves it: a call made with ``async_op=True`` (DDP's gradient buckets) does not
  block, gloo's worker threads finish works out of order, and the dump does not say which calls
  blocked. A gloo worker retires a work as the call returns (and only then moves ``pg_status``),
  so there ``retired`` alone says the call returned; retired with a later collective issued, that
  it returned without an error (a failed call raises, an async one when waited for);
- its peers: a collective cannot complete on one member without the data of all, so a member
  that completed it proves every member entered it and sent its data.

The verdict for a group is the earliest sequence number some member never entered (missing-rank),
entered differently (desync), or never finished; one never finished is told "stuck" or "in
flight" by how long it has been pending (``_pending``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from analyzer.base.errors import InputError
from analyzer.base.limits import MAX_WORLD
from analyzer.hang.read import DumpEntry, GroupStatus, RankDump
from analyzer.ingest.p2p import direction, in_posting_order, peer_in_title

DEFAULT_GROUP = "0"  # torch names the default process group "0" (desc "default_pg")
# Collectives whose per-rank sizes legitimately differ: only their name and dtypes must agree.
UNEVEN_SIZES = {"all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
                "scatter", "gather", "all_gather_v", "reduce_scatter_v", "coalesced"}
KIND_ORDER = ("desync", "missing-rank", "not-reporting", "p2p-unmatched", "stuck")
# Backends that run collectives on host threads and record no events (entries stay "scheduled";
# "retired": the call returned). Others (nccl, rccl, xccl, hccl...) run on a device stream.
HOST_BLOCKING = {"gloo"}
STATE_ORDER = {"scheduled": 0, "started": 1, "completed": 2}


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


@dataclass(frozen=True)
class Op:
    """One operation of one rank: a collective (or a coalesced group of them: the entries that
    share one sequence id, the end marker last) or one p2p entry."""
    rank: int
    entries: tuple[DumpEntry, ...]

    @property
    def main(self) -> DumpEntry:
        return self.entries[-1]  # a coalesced group's end marker carries the work's events

    @property
    def seq(self) -> int:
        return self.main.seq

    @property
    def name(self) -> str:
        """The op the JSON names: a coalesced group's end marker ("coalesced", ...)."""
        return self.main.op

    def parts(self) -> dict[str, Any]:
        """A coalesced group's ops, for the report (``detail.coalesced_ops``)."""
        return {"coalesced_ops": [e.op for e in self.entries[:-1]]} if len(self.entries) > 1 else {}

    @property
    def backend(self) -> str:
        return self.main.backend

    @property
    def created_ns(self) -> int:
        return min(e.time_created_ns for e in self.entries)

    @property
    def state(self) -> str:
        return max((e.state for e in self.entries), key=lambda s: STATE_ORDER.get(s, 0))

    @property
    def completed(self) -> bool:
        return any(e.state == "completed" or e.time_completed_ns for e in self.entries)

    @property
    def started(self) -> bool:
        return self.completed or any(e.state == "started" or e.time_started_ns for e in self.entries)

    @property
    def retired(self) -> bool:
        return bool(self.main.retired)

    @property
    def timeout_ms(self) -> int | None:
        return next((e.timeout_ms for e in reversed(self.entries) if e.timeout_ms), None)

    def signature(self) -> tuple:
        return tuple(_signature(e) for e in self.entries)


@dataclass(frozen=True)
class Progress:
    """What the dumps say about one member's completion of one collective."""
    done: bool
    strong: bool = False   # proof that every member's data flowed (not only "the call returned")
    failed: bool = False   # NCCL: retired without completing (timed out or aborted)
    how: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "proof": self.strong, "failed": self.failed, "how": self.how}


def entry_dict(e: DumpEntry | None, completed: bool | None = None) -> dict[str, Any] | None:
    if e is None:
        return None
    out = {"group": e.group, "description": e.description, "seq": e.seq, "p2p": e.is_p2p, "op": e.op,
           "peer": e.peer, "state": e.state, "completed": completed, "time_created_ns": e.time_created_ns,
           "input_sizes": e.input_sizes, "output_sizes": e.output_sizes, "input_dtypes": e.input_dtypes,
           "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in e.frames]}
    return out


class Job:
    """The dumps of one job, indexed for matching."""

    def __init__(self, dumps: list[RankDump], world_size: int | None = None, trace_world: int | None = None):
        self.dumps = {d.rank: d for d in dumps}
        self.notes: list[str] = []
        self.world, self.world_source = self._world(world_size, trace_world)
        self.ops = self._ops()
        self.groups = self._groups()
        self.progress: dict[tuple[int, str, int], Progress] = {}  # (rank, group, seq), set by find_hangs
        self._next: dict[tuple[int, str], dict[int, tuple[Op | None, Op | None]]] = {}
        self._markers: dict[int, dict[tuple[str, int], DumpEntry]] = {}

    # --- world and groups ------------------------------------------------------------------

    def _world(self, world_size: int | None, trace_world: int | None) -> tuple[list[int], str]:
        seen = set(self.dumps)
        top = max(seen) if seen else -1
        if world_size is not None:
            if not 1 <= world_size <= MAX_WORLD:  # the world is listed rank by rank: bounded (issue 30)
                raise InputError("--world-size", f"{world_size} ranks is beyond any job (1 to {MAX_WORLD:,})")
            if top >= world_size:
                raise InputError("--world-size", f"{world_size} ranks, but there is a dump for rank {top}")
            return list(range(world_size)), "--world-size"
        default, how = self._default_group_ranks()
        if default:
            return list(range(max(max(default), top) + 1)), how
        if trace_world and trace_world > top:
            return list(range(trace_world)), "the Kineto traces' distributedInfo (world_size)"
        listed = {r for d in self.dumps.values() for cfg in d.pg_config.values() for r in cfg["ranks"] or []}
        if listed and max(listed) > top:
            return list(range(max(listed) + 1)), "pg_config (the highest rank any group lists)"
        self.notes.append("world size inferred as the highest rank with a dump + 1: a silent highest rank "
                          "would go unnoticed (pass --world-size, or the job's Kineto traces with --traces)")
        return list(range(top + 1)), "inferred: the highest rank with a dump + 1"

    def _default_group_ranks(self) -> tuple[set[int], str]:
        """The default group's members from pg_config, and where they come from: its entry by
        name ("0") or description, else the unnamed entry gloo records it under when that one
        lists every rank with a dump."""
        for d in self.dumps.values():
            for name, cfg in d.pg_config.items():
                if cfg["ranks"] and (name == DEFAULT_GROUP or cfg["desc"] == "default_pg"):
                    return set(cfg["ranks"]), "pg_config (the default group's ranks)"
        for d in self.dumps.values():
            unnamed = d.pg_config.get("", {}).get("ranks")
            if unnamed and set(self.dumps) <= set(unnamed):
                return set(unnamed), "pg_config (an unnamed group listing every rank with a dump: gloo's default group)"
        return set(), ""

    def _ops(self) -> dict[tuple[int, str, bool], list[Op]]:
        """(rank, group, p2p) -> the rank's operations in sequence order. Collectives sharing a
        sequence id are one (coalesced) operation; p2p entries stay one each (they are paired
        per rank pair; a batch's end marker is looked up by ``p2p_marker``)."""
        out: dict[tuple[int, str, bool], list[Op]] = {}
        for rank, dump in self.dumps.items():
            runs: dict[tuple[str, int], list[DumpEntry]] = {}
            for e in sorted(dump.entries, key=lambda e: e.record_id):
                if e.is_p2p:
                    out.setdefault((rank, e.group, True), []).append(Op(rank, (e,)))
                else:
                    runs.setdefault((e.group, e.collective_seq), []).append(e)
            for (group, _), entries in runs.items():
                out.setdefault((rank, group, False), []).append(Op(rank, tuple(entries)))
        for ops in out.values():
            ops.sort(key=lambda o: (o.seq, o.main.record_id))
        return out

    def _groups(self) -> dict[str, Group]:
        described: dict[str, Counter] = {}
        logged: dict[str, set[int]] = {}
        for d in self.dumps.values():
            for e in d.entries:
                described.setdefault(e.group, Counter())[e.description] += 1
                logged.setdefault(e.group, set()).add(d.rank)
        if any(e.backend in HOST_BLOCKING for d in self.dumps.values() for e in d.entries):
            self.notes.append("gloo records no events (its entries stay 'scheduled'): completion is read from "
                              "'retired' (the call returned) and the peers' evidence; a later call proves nothing "
                              "(one made with async_op=True, as DDP's buckets are, does not block)")
        if any(d.version.startswith("1.") and any(e.is_p2p for e in d.entries) for d in self.dumps.values()):
            self.notes.append("format 1.x numbers collectives and p2p ops with one seq_id: collectives are matched by "
                              "it, which holds only if the members of each group issued the same p2p ops")
        return {name: self._group(name, described[name].most_common(1)[0][0], logged[name])
                for name in sorted(described, key=_group_order)}

    def _group(self, name: str, description: str, logged: set[int]) -> Group:
        configured = [d.pg_config[name]["ranks"] for d in self.dumps.values()
                      if name in d.pg_config and d.pg_config[name]["ranks"]]
        if configured:
            if any(c != configured[0] for c in configured):
                self.notes.append(f"group {name}: the dumps disagree on its members; their union is used")
            return Group(name, description, sorted({r for c in configured for r in c}), "pg_config")
        if name == DEFAULT_GROUP or description == "default_pg":
            how = (f"inferred: pg_config does not list this group, and the default group holds every rank "
                   f"(0..{len(self.world) - 1}, world size from {self.world_source})")
            return Group(name, description, list(self.world), how)
        how = "inferred: pg_config does not list this group; its members are the ranks that logged entries for it"
        return Group(name, description, sorted(logged), how)

    # --- lookups ------------------------------------------------------------------------------

    def status(self, rank: int, e: DumpEntry) -> GroupStatus | None:
        return self.dumps[rank].pg_status.get(e.pg_id)

    def entries(self, rank: int, group: str, p2p: bool) -> list[DumpEntry]:
        if rank not in self.dumps:
            return []
        return sorted((e for e in self.dumps[rank].entries if e.group == group and e.is_p2p == p2p),
                      key=lambda e: (e.seq, e.record_id))

    def collectives(self, rank: int, group: str) -> list[Op]:
        return self.ops.get((rank, group, False), [])

    def newest_ns(self) -> int:
        """The latest moment any dump records: the dumps were written no earlier (clocks of one
        job's hosts agree to far better than a collective timeout)."""
        return max((d.newest_ns for d in self.dumps.values()), default=0)

    def next_ops(self, op: Op, group: str) -> tuple[Op | None, Op | None]:
        """The rank's next collective in the group after ``op``, and its next one that started."""
        if (op.rank, group) not in self._next:
            ops = self.collectives(op.rank, group)
            following: dict[int, tuple[Op | None, Op | None]] = {}
            nxt: Op | None = None
            started: Op | None = None
            for o in reversed(ops):  # one pass from the end: the nearest later ones
                following[id(o)] = (nxt, started)
                nxt, started = o, (o if o.started else started)
            self._next[(op.rank, group)] = following
        return self._next[(op.rank, group)].get(id(op), (None, None))

    def p2p_marker(self, rank: int, e: DumpEntry) -> DumpEntry | None:
        """The end marker of the p2p batch ``e`` belongs to (same p2p id, profiling name
        ``coalesced``), which carries the batch's events."""
        if rank not in self.dumps:
            return None
        if rank not in self._markers:
            self._markers[rank] = {(m.group, m.p2p_seq): m for m in self.dumps[rank].entries
                                   if m.is_p2p and m.op == "coalesced"}
        m = self._markers[rank].get((e.group, e.p2p_seq))
        return m if m is not None and m is not e and m.record_id > e.record_id else None

    def completed(self, rank: int, e: DumpEntry) -> bool | None:
        """Whether rank's operation holding ``e`` is done (the weighed evidence; None: unknown)."""
        if e.is_p2p:
            return _p2p_done(self, rank, e)
        found = self.progress.get((rank, e.group, e.collective_seq))
        return found.done if found is not None else None


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _signature(e: DumpEntry) -> tuple:
    sizes = () if e.op in UNEVEN_SIZES else (repr(e.input_sizes), repr(e.output_sizes))
    return (e.op, *sizes, tuple(e.input_dtypes), tuple(e.output_dtypes))


# --- evidence ---------------------------------------------------------------------------------

def own_progress(job: Job, op: Op, after: Op | None, started_after: Op | None) -> Progress:
    """The rank's own evidence: its entry, pg_status, and what it issued after it in the group
    (``after``: its next collective there; ``started_after``: the next one that started). On
    gloo, its entry's ``retired`` alone (see the module's docstring)."""
    if op.completed:
        return Progress(True, True, how="its entry is completed")
    status = job.status(op.rank, op.main)
    last = status.completed if status is not None else -1  # -1: not tracked
    seen_done = last >= op.seq
    if op.backend not in HOST_BLOCKING:
        if op.retired:
            return Progress(False, failed=True, how="retired without completing: timed out or aborted on this rank")
        if started_after is not None:
            return Progress(True, True, how=f"#{started_after.seq} {started_after.state} after it (the group's "
                                              "kernels run in order)")
        if seen_done:
            return Progress(True, how=f"pg_status: last completed #{last}")
        return Progress(False, how=f"its entry is {op.state}")
    if op.retired and after is not None:  # returned, and the program went on: it did not raise
        return Progress(True, True, how=f"retired, and the rank went on to issue #{after.seq} (a call that failed "
                                        "raises, at the latest when waited for)")
    if op.retired:
        return Progress(True, how="retired: the call returned (gloo does not record whether it failed)")
    # Not retired: the call has not returned, whatever followed it. A later collective means the
    # call did not block (async_op=True); a pg_status at or past it, that a later work finished first.
    where = f"pg_status at #{last}" if last >= 0 else "no pg_status"
    later = f"; the rank went on to issue #{after.seq}: an async call (async_op=True), still running" if after else ""
    return Progress(False, how=f"not retired, {where}{later}")


def _weigh(job: Job, group: Group, seq: int, present: dict[int, Op], everyone: bool) -> dict[int, Progress]:
    """Each present member's progress on ``seq``, peers' evidence included. ``everyone``: every
    member has a dump and entered it (then a peer that merely returned from it counts too)."""
    own = {r: own_progress(job, op, *job.next_ops(op, group.name)) for r, op in present.items()}
    proof = next((r for r, p in own.items() if p.done and p.strong), None)
    if proof is not None:
        return {r: p if p.done else Progress(True, True, how=f"rank {proof} completed it (a collective needs "
                                                            "every member's data)") for r, p in own.items()}
    returned = next((r for r, p in own.items() if p.done), None)
    if everyone and returned is not None and not any(p.failed for p in own.values()):
        return {r: p if p.done else Progress(True, how=f"every member entered it and rank {returned} returned "
                                                      "from it") for r, p in own.items()}
    return own


# --- matching -----------------------------------------------------------------------------

@dataclass
class Pending:
    """A collective every member entered and some did not finish: stuck or in flight."""
    group: Group
    seq: int
    ops: dict[int, Op]
    progress: dict[int, Progress]

    @property
    def pending(self) -> list[int]:
        return sorted(r for r, p in self.progress.items() if not p.done)


def find_hangs(job: Job) -> tuple[list[Hang], list[dict[str, Any]]]:
    """(hangs, root causes first; collectives in flight at the dump)."""
    for group in job.groups.values():
        weigh_group(job, group)
    hangs, waiting = [], []
    for group in job.groups.values():
        found = collective_hang(job, group)
        if isinstance(found, Pending):
            waiting.append(found)
            found = None
        found = found or p2p_hang(job, group)
        if found:
            hangs.append(found)
    flying = []
    for candidate in waiting:
        hang, in_flight = _pending(job, candidate, hangs)
        if hang:
            hangs.append(hang)
        else:
            flying.append(in_flight)
    for hang in hangs:
        _mark_consequence(hang, hangs)
    return rank_hangs(hangs), flying


def _mark_consequence(hang: Hang, hangs: list[Hang]) -> None:
    """A hang whose culprits wait in another group's hang may follow from it: say which."""
    for other in hangs:
        blocked = sorted(set(hang.ranks) & set(other.waiting_ranks)) if other is not hang else []
        if blocked:
            hang.detail["consequence_of"] = {"group": other.group.name, "seq": other.seq, "op": other.op,
                                             "kind": other.kind, "blocked_ranks": blocked}
            return


def rank_hangs(hangs: list[Hang]) -> list[Hang]:
    """Root causes first: a hang whose culprits are themselves waiting in another hang is a
    consequence of that one; then the hangs the dumps prove (``proven_hang``) before the ones
    they do not; then the one waiting longest."""
    waiting = {r for h in hangs for r in h.waiting_ranks}
    return sorted(hangs, key=lambda h: (bool(set(h.ranks) & waiting), not proven_hang(h), h.waiting_since_ns or 0,
                                        KIND_ORDER.index(h.kind), _group_order(h.group.name)))


def _aligned(job: Job, group: Group) -> tuple[dict[int, dict[int, Op]], list[int]]:
    """Each reporting member's collectives by sequence id, and the ids to match: from where
    every member's ring buffer still holds entries (older ones may have left some buffers)."""
    by_rank = {r: {o.seq: o for o in job.collectives(r, group.name)} for r in group.ranks if r in job.dumps}
    starts = [min(seqs) for seqs in by_rank.values() if seqs]
    if not starts:
        return by_rank, []
    first = max(starts)
    return by_rank, sorted({s for seqs in by_rank.values() for s in seqs if s >= first})


def weigh_group(job: Job, group: Group) -> None:
    """Every member's progress on every collective of the group (job.progress)."""
    by_rank, seqs = _aligned(job, group)
    complete = all(r in job.dumps for r in group.ranks)
    for seq in seqs:
        present = {r: ops[seq] for r, ops in by_rank.items() if seq in ops}
        for r, p in _weigh(job, group, seq, present, everyone=complete and len(present) == len(by_rank)).items():
            job.progress[(r, group.name, seq)] = p


def collective_hang(job: Job, group: Group) -> Hang | Pending | None:
    """The group's earliest collective some member never entered, entered differently, or
    never finished."""
    by_rank, seqs = _aligned(job, group)
    silent = [r for r in group.ranks if r not in job.dumps]
    for seq in seqs:
        present = {r: ops[seq] for r, ops in by_rank.items() if seq in ops}
        absent = [r for r in by_rank if r not in present]
        progress = {r: job.progress[(r, group.name, seq)] for r in present}
        problem = (_desync(job, group, seq, present)
                   or _missing(job, group, seq, present, absent, silent, progress)
                   or _unfinished(job, group, seq, present, silent, progress))
        if problem:
            return problem
    return None


def _desync(job: Job, group: Group, seq: int, present: dict[int, Op]) -> Hang | None:
    signatures = {r: op.signature() for r, op in present.items()}
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
              **reference.parts(), **_culprit_detail(job, group, culprits, seq)}
    return Hang(group, seq, "desync", reference.name, culprits, waiting,
                min(present[r].created_ns for r in waiting), detail)


def _difference(a: Op, b: Op) -> str:
    if len(a.entries) != len(b.entries) or any(x.op != y.op for x, y in zip(a.entries, b.entries)):
        return "collective"
    if any((x.input_sizes, x.output_sizes) != (y.input_sizes, y.output_sizes) for x, y in zip(a.entries, b.entries)):
        return "sizes"
    return "dtypes"


def _call(op: Op) -> dict[str, Any]:
    """What was issued: a coalesced group as the sizes of its ops, in order (and each op)."""
    members = op.entries[:-1] if len(op.entries) > 1 else op.entries
    out: dict[str, Any] = {"op": op.name, "input_sizes": [s for e in members for s in e.input_sizes],
                           "output_sizes": [s for e in members for s in e.output_sizes],
                           "input_dtypes": sorted({d for e in members for d in e.input_dtypes}) if len(members) > 1
                           else op.main.input_dtypes,
                           "output_dtypes": sorted({d for e in members for d in e.output_dtypes}) if len(members) > 1
                           else op.main.output_dtypes}
    if len(op.entries) > 1:
        out["coalesced"] = [{"op": x.op, "input_sizes": x.input_sizes, "input_dtypes": x.input_dtypes}
                            for x in members]
    return out


def _missing(job: Job, group: Group, seq: int, present: dict[int, Op], absent: list[int], silent: list[int],
             progress: dict[int, Progress]) -> Hang | None:
    if not absent:
        return None
    proof = next((r for r, p in progress.items() if p.done and p.strong), None)
    if proof is not None:
        job.notes.append(f"group {group.name} #{seq}: rank(s) {_list(absent)} have no entry for it although rank "
                         f"{proof} completed it ({progress[proof].how}): their record of it is missing, not the call")
        return None
    waiting = sorted(present)
    detail = {**_culprit_detail(job, group, absent, seq), "not_reporting": silent,
              "evidence": {str(r): p.to_dict() for r, p in sorted(progress.items())}, **present[waiting[0]].parts()}
    return Hang(group, seq, "missing-rank", present[waiting[0]].name, absent, waiting,
                min(op.created_ns for op in present.values()), detail)


def _unfinished(job: Job, group: Group, seq: int, present: dict[int, Op], silent: list[int],
                progress: dict[int, Progress]) -> Hang | Pending | None:
    proof = any(p.done and p.strong for p in progress.values())
    if silent and not proof:
        name = next(iter(present.values())).name
        returned = all(p.done for p in progress.values())
        reason = ("these members wrote no dump (dead host, or the dump was not collected)"
                  + ("; the others returned from it, but nothing proves it completed" if returned else ""))
        return Hang(group, seq, "not-reporting", name, silent, sorted(present),
                    min(op.created_ns for op in present.values()),
                    {"reason": reason, "evidence": {str(r): p.to_dict() for r, p in sorted(progress.items())},
                     **next(iter(present.values())).parts(), **_culprit_detail(job, group, silent, seq)})
    if all(p.done for p in progress.values()):
        return None
    return Pending(group, seq, present, progress)


def _pending(job: Job, c: Pending, hangs: list[Hang]) -> tuple[Hang | None, dict[str, Any]]:
    """Stuck or in flight. Proven stuck: a member retired it without completing (NCCL timed it
    out), or the dumps show it pending for at least its timeout (their newest timestamp minus the
    entry's creation). In flight: it was entered after the job began waiting in another hang,
    and had run for less than its timeout when that hang's timeout expired (the usual moment of
    a dump). Otherwise the dumps cannot tell, and the hang says so."""
    newest = job.newest_ns()
    pending = c.pending
    timeouts = [t for r in pending if (t := c.ops[r].timeout_ms)]
    timeout_s = max(timeouts) / 1000 if timeouts else None
    since = min(c.ops[r].created_ns for r in pending)
    at_least = max(0.0, (newest - max(c.ops[r].created_ns for r in pending)) / 1e9)
    longest = max(0.0, (newest - since) / 1e9)
    failed = sorted(r for r in pending if c.progress[r].failed)
    info: dict[str, Any] = {"since_ns": since, "at_least_s": round(longest, 3), "timeout_s": timeout_s,
                            "dumps_newest_ns": newest}
    if failed:
        info.update(proven=True, why=f"rank(s) {_list(failed)} retired it without completing (timed out)")
        return _stuck(job, c, info), {}
    if timeout_s is not None and longest >= timeout_s:
        info.update(proven=True, why=f"pending at least {longest:.3f} s by the dumps' own timestamps, "
                                     f"past its {timeout_s:g} s timeout")
        return _stuck(job, c, info), {}
    roots = [h for h in hangs if h.waiting_since_ns and h.waiting_since_ns < since]
    if roots:
        root = min(roots, key=lambda h: h.waiting_since_ns or 0)
        root_timeout = _timeout_s(job, root)
        dump_at = max(newest, (root.waiting_since_ns or 0) + int((root_timeout or 0) * 1e9))
        estimate = (dump_at - since) / 1e9
        if timeout_s is None or estimate < timeout_s:
            behind = (since - (root.waiting_since_ns or 0)) / 1e9
            reason = (f"entered by every member {behind:.3f} s after group {root.group.name}'s {root.op} #{root.seq} "
                      f"began waiting; pending at least {at_least:.3f} s"
                      + (f"; had the dumps waited for that one's {root_timeout:g} s timeout, {estimate:.3f} s"
                         if root_timeout else "")
                      + (f", under its own {timeout_s:g} s timeout" if timeout_s else " (no timeout recorded)")
                      + ": still running when the job hung elsewhere, not a hang")
            return None, _in_flight(c, at_least, estimate, timeout_s, reason, "in flight at the dump, not hung")
    proven = [h for h in hangs if h.group.name != c.group.name and proven_hang(h)]
    if proven and (timeout_s is None or longest < timeout_s):
        # Proof elsewhere, none here: this one had not run out its timeout, and the job may as
        # well have hung where the proof is while it was running.
        root = proven[0]
        reason = (f"every member entered it and it had been pending at least {longest:.3f} s"
                  + (f", under its {timeout_s:g} s timeout," if timeout_s else " (no timeout recorded)")
                  + f" when the dumps were taken, while {root.op} #{root.seq} of group {root.group.name} is proven hung "
                  f"({root.kind}: rank(s) {_list(root.ranks)}): in flight when dumped, not proven stuck"
                  + _consequence_text(c.ops, hangs))
        return None, _in_flight(c, at_least, longest, timeout_s, reason, "in flight when dumped, not proven stuck")
    limit = f"its {timeout_s:g} s timeout" if timeout_s is not None else "its timeout (not recorded: format 1.x)"
    if all(c.ops[r].backend in HOST_BLOCKING for r in pending):
        trigger = ("gloo writes no dump on its own: if they were taken while the job hung, this is where it waits; "
                   "if while it ran, it may still be in flight")
    else:
        trigger = ("if on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, the usual trigger) this is the collective that timed "
                   "out, if on demand it may still be in flight")
    info.update(proven=False, why=f"pending at least {longest:.3f} s of {limit}: the dumps do not record when they "
                                  f"were written; {trigger}")
    return _stuck(job, c, info), {}


def _in_flight(c: Pending, at_least: float, estimate: float, timeout_s: float | None, reason: str,
               status: str) -> dict[str, Any]:
    """A pending collective that is not a hang, as ``HangReport.in_flight`` lists it."""
    first = next(iter(c.ops.values()))
    return {"group": c.group.to_dict(), "seq": c.seq, "op": first.name, **first.parts(),
            "ranks": sorted(c.ops), "pending": c.pending, "since_ns": min(c.ops[r].created_ns for r in c.pending),
            "pending_at_least_s": round(at_least, 3), "pending_estimate_s": round(estimate, 3),
            "timeout_s": timeout_s, "reason": reason, "status": status,
            "evidence": {str(r): p.to_dict() for r, p in sorted(c.progress.items())}}


def proven_hang(h: Hang) -> bool:
    """Whether the dumps prove the hang: a rank that never entered, entered a different op,
    wrote no dump, an unmatched p2p op, or a collective past its timeout / timed out."""
    return h.kind != "stuck" or bool((h.detail.get("pending") or {}).get("proven"))


def _consequence_text(members: dict[int, Any], hangs: list[Hang]) -> str:
    """Says which of the members are blocked in another group's hang (this one may follow from it)."""
    for h in hangs:
        blocked = sorted(set(members) & set(h.waiting_ranks + h.ranks))
        if blocked:
            return (f"; rank(s) {_list(blocked)} also wait in {h.op} #{h.seq} of group {h.group.name}: "
                    "this may be a consequence of that hang")
    return ""


def _timeout_s(job: Job, hang: Hang) -> float | None:
    values = [t for r in hang.waiting_ranks for o in job.collectives(r, hang.group.name)
              if o.seq == hang.seq and (t := o.timeout_ms)]
    return max(values) / 1000 if values else None


def _stuck(job: Job, c: Pending, info: dict[str, Any]) -> Hang:
    pending = c.pending
    device = [r for r in pending if c.ops[r].backend not in HOST_BLOCKING]
    started = sorted(r for r in pending if c.ops[r].started)
    not_started = sorted(r for r in device if not c.ops[r].started)
    culprits, reason = pending, ("every member entered it and it did not complete: look at the network / NCCL "
                                 "(or a rank that died inside the kernel)")
    if started and not_started:
        culprits = not_started
        reason = (f"every member entered it, but its kernel never started on rank(s) {_list(not_started)} (their "
                  "stream was still busy: look at what runs before it there); the others are inside it")
    first = next(iter(c.ops.values()))
    waiting = sorted(r for r in c.ops if r not in culprits)
    detail = {"started": started, "reason": reason, "pending": info,
              "evidence": {str(r): p.to_dict() for r, p in sorted(c.progress.items())},
              **first.parts(), **_culprit_detail(job, c.group, culprits, c.seq)}
    return Hang(c.group, c.seq, "stuck", first.name, culprits, waiting, info["since_ns"], detail)


def _culprit_detail(job: Job, group: Group, ranks: list[int], seq: int | None) -> dict[str, Any]:
    """Where each culprit was last seen: its last entry in this group, its last completed one
    before ``seq``, and its newest entry in any group (it may be stuck elsewhere)."""
    out: dict[str, dict[str, Any]] = {}
    for r in ranks:
        if r not in job.dumps:
            out[str(r)] = {"dump": False}
            continue
        mine = job.entries(r, group.name, False)
        finished = [e for e in mine if job.completed(r, e) and (seq is None or e.seq < seq)]
        newest = max(job.dumps[r].entries, key=lambda e: (e.time_created_ns, e.record_id), default=None)
        out[str(r)] = {"dump": True, "last_entry": entry_dict(mine[-1] if mine else None,
                                                               job.completed(r, mine[-1]) if mine else None),
                       "last_completed": entry_dict(finished[-1] if finished else None, True),
                       "newest_entry_any_group": entry_dict(newest, job.completed(r, newest) if newest else None)}
    return {"culprits": out}


# --- point to point -----------------------------------------------------------------------

def _p2p_done(job: Job, rank: int, e: DumpEntry) -> bool | None:
    """A send / recv is done when it, or the end marker of its batch, completed (gloo, which
    logs no p2p in torch 2.13, when it retired)."""
    marker = job.p2p_marker(rank, e)
    for x in (e, marker):
        if x is not None and (x.state == "completed" or x.time_completed_ns):
            return True
    if e.backend in HOST_BLOCKING:
        return True if e.retired else None
    return False


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
    """({(src, dst): sends}, {(src, dst): receives}) in posting order (analyzer.ingest.p2p)."""
    members = group.ranks
    return in_posting_order((pair, e.op, e) for r in members for e in job.entries(r, group.name, True)
                            if e.op in ("send", "recv") and (pair := _peer_pair(e, members)))


def _peer_pair(e: DumpEntry, members: list[int]) -> tuple[int, int] | None:
    """``send 0->1`` / ``recv 1<-0`` name group-local ranks; map them to global ones."""
    ends = peer_in_title(e.op, e.peer)
    if ends is None or max(ends) >= len(members):
        return None
    src, dst = direction(e.op, *ends)
    return members[src], members[dst]


def _p2p_problem(job: Job, group: Group, src: int, dst: int, send: DumpEntry | None,
                 recv: DumpEntry | None) -> Hang | None:
    if send and recv:
        if send.input_sizes == recv.output_sizes or job.completed(src, send):
            return None
        return Hang(group, send.p2p_seq, "p2p-unmatched", "send", [src, dst], [],
                    min(send.time_created_ns, recv.time_created_ns),
                    {"reason": "sizes differ", "send": _call(Op(src, (send,))), "recv": _call(Op(dst, (recv,)))})
    posted, rank, peer = (send, src, dst) if send else (recv, dst, src)
    assert posted is not None
    if job.completed(rank, posted):
        return None
    kind = "p2p-unmatched" if peer in job.dumps else "not-reporting"
    reason = (f"rank {rank} posted {posted.op} {posted.peer}; rank {peer} "
              + ("never posted the matching " + ("recv" if send else "send") if peer in job.dumps
                 else "wrote no dump"))
    return Hang(group, posted.p2p_seq, kind, posted.op, [peer], [rank], posted.time_created_ns,
                {"reason": reason, "posted": entry_dict(posted), **_culprit_detail(job, group, [peer], None)})


def _list(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
