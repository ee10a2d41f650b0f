"""Synthetic Flight Recorder dumps of the NCCL backend, written field for field as torch writes
them, format version by format version, with the verdict built in (no GPU needed: a reader is
tested on the bytes, not on a GPU).

    from analyzer.synth.flight_recorder import SCENARIOS, write_scenario
    truth = write_scenario("nccl_stuck", "out/nccl_stuck")   # nccl_trace_rank_<r>[.json] + truth

What each format version writes (torch's ``NCCLUtils.hpp`` / ``TraceUtils.h`` /
``FlightRecorder.hpp`` / ``FlightRecorderDetail.hpp``; the torch releases are approximate):

- "1.4" (torch 2.3 era): pickle only. Entries: ``record_id``, ``pg_id``, one ``seq_id`` for
  collectives and p2p, ``op_id``, ``profiling_name`` ("nccl:all_reduce", "nccl:send 0->1"),
  ``time_created_ns``, ``input_sizes`` / ``output_sizes``, ``state``,
  ``time_discovered_started_ns`` / ``..._completed_ns`` (None when not seen), ``retired``,
  ``frames``. ``pg_config``: pg_id -> list of ranks.
- "2.2" (torch 2.4): pickle only; ``process_group`` (name, desc), ``collective_seq_id`` and
  ``p2p_seq_id``, ``is_p2p``, dtypes, ``timeout_ms``; ``pg_config``: name -> {"name", "desc",
  "ranks": "[0, 1]"}.
- "2.4" (torch 2.5-2.6): + ``pg_status`` (pg_id -> last enqueued / started / completed id;
  from "2.3"), ``nccl_version``, and the JSON writer (``_dump_nccl_trace_json``, torch 2.5; its
  ``dump_json`` is declared beside the pickle writer from "2.3"): no frames, unseen times as 0,
  ``pg_status`` values as strings, no ``entries`` key when empty.
- "2.7" (torch 2.7): the same fields; every collective of a coalescing block has its entry.
- "2.10" (torch 2.8-2.13): ``comm_lib_version`` replaces ``nccl_version``; ``thread_id`` (a
  string) / ``thread_name``.

The state follows the CUDA events: "scheduled" until the watchdog (or the dump itself) sees the
start event, "started", then "completed"; a work the watchdog retired without its end event
firing timed out. Collectives of a coalescing block share one ``collective_seq_id`` and end
with a "coalesced" marker that carries the work's events; before 2.7 only the marker is
recorded (torch's ``fr_trace``: "We enabled the creating FR entry for non-P2P slow path
collective ops in v2.7"). A batch of p2p ops shares one ``p2p_seq_id`` the same way, each op
with its entry (without events) from 2.2, when ``is_p2p`` and ``p2p_seq_id`` appeared.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

VERSIONS = ("1.4", "2.2", "2.4", "2.7", "2.10")
JSON_VERSIONS = ("2.4", "2.7", "2.10")  # the JSON writer exists
T0 = 1_760_000_000_000_000_000   # ns: the synthetic jobs' clock
MS = 1_000_000
TIMEOUT_MS = 600_000             # ProcessGroupNCCL's default timeout (10 min)
USER_FRAMES = [{"name": "train_step", "filename": "/job/train.py", "line": 88},
               {"name": "main", "filename": "/job/train.py", "line": 140},
               {"name": "<module>", "filename": "/job/train.py", "line": 152}]


@dataclass
class RecordedOp:
    """One entry as the NCCL backend records it."""
    group: str
    desc: str
    pg_id: int
    op: str
    seq: int                     # collective_seq_id, or p2p_seq_id for a p2p op
    created_ns: int
    state: str = "completed"     # scheduled | started | completed
    retired: bool | None = None  # default: retired when completed (the watchdog retires a finished work)
    p2p: bool = False
    peer: str = ""               # "0->1" (send), "1<-0" (recv): group-local ranks
    sizes: tuple = ((1024,),)
    dtype: str = "Float"
    timeout_ms: int = TIMEOUT_MS
    frames: list = field(default_factory=list)
    events: bool = True          # False: an op inside a coalescing block (its marker has the events)

    def started_ns(self) -> int | None:
        return self.created_ns + MS if self.events and self.state in ("started", "completed") else None

    def completed_ns(self) -> int | None:
        return self.created_ns + 5 * MS if self.events and self.state == "completed" else None


@dataclass
class RecordedRank:
    ops: list[RecordedOp]
    status: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # pg_id -> enqueued, started, completed


@dataclass
class RecordedScenario:
    description: str
    version: str
    groups: dict[str, tuple[str, list[int]]]  # name -> (desc, ranks), as pg_config records them
    ranks: dict[int, RecordedRank]
    truth: dict[str, Any]
    pg_config: bool = True                    # False: the dumps carry no pg_config


def entry(op: RecordedOp, record_id: int, version: str, fmt: str, thread: int) -> dict[str, Any]:
    name = f"nccl:{op.op}" + (f" {op.peer}" if op.peer else "")
    state = op.state if op.events else "scheduled"
    retired = op.retired if op.retired is not None else (op.state == "completed" and op.events)
    unseen: Any = 0 if fmt == "json" else None
    started, completed = op.started_ns(), op.completed_ns()
    out: dict[str, Any] = {"record_id": record_id, "pg_id": op.pg_id, "op_id": record_id + 1,
                           "profiling_name": name, "time_created_ns": op.created_ns,
                           "input_sizes": [list(s) for s in op.sizes], "output_sizes": [list(s) for s in op.sizes],
                           "state": state, "time_discovered_started_ns": started if started else unseen,
                           "time_discovered_completed_ns": completed if completed else unseen, "retired": retired}
    if version == "1.4":
        out["seq_id"] = op.seq
    else:
        out.update({"process_group": [op.group, op.desc] if fmt == "json" else (op.group, op.desc),
                    "collective_seq_id": 0 if op.p2p else op.seq, "p2p_seq_id": op.seq if op.p2p else 0,
                    "is_p2p": op.p2p, "input_dtypes": [op.dtype] * len(op.sizes),
                    "output_dtypes": [op.dtype] * len(op.sizes), "timeout_ms": op.timeout_ms})
    if version == "2.10":
        out.update({"thread_id": str(140000000000000 + thread), "thread_name": "pt_main_thread"})
    if fmt == "pickle":
        out["frames"] = op.frames or _frames(op.op)
    return out


def dump(s: RecordedScenario, rank: int, fmt: str) -> bytes:
    """One rank's dump, as torch's pickle writer (``fmt="pickle"``) or JSON writer writes it."""
    if fmt == "json" and s.version not in JSON_VERSIONS:
        raise ValueError(f"format {s.version} has no JSON writer")
    r = s.ranks[rank]
    entries = [entry(op, i, s.version, fmt, rank) for i, op in enumerate(r.ops)]
    doc: dict[str, Any] = {"version": s.version, "pg_config": _pg_config(s, fmt)}
    if s.version != "1.4" and s.version != "2.2":
        doc["pg_status"] = {str(pg): {"last_enqueued_collective": _value(e, fmt), "last_started_collective": _value(st, fmt),
                                      "last_completed_collective": _value(c, fmt)}
                            for pg, (e, st, c) in sorted(r.status.items())}
        doc["comm_lib_version" if s.version == "2.10" else "nccl_version"] = "2.21.5"
    if entries or fmt == "pickle":
        doc["entries"] = entries
    if fmt == "json":
        return json.dumps(doc, sort_keys=True).encode()  # nlohmann's json writes keys sorted
    return pickle.dumps(doc, protocol=2)


def _pg_config(s: RecordedScenario, fmt: str) -> dict[Any, Any]:
    if not s.pg_config:
        return {}
    if s.version == "1.4":  # pg_id -> ranks (the pg_id the entries carry)
        ids = {op.group: op.pg_id for r in s.ranks.values() for op in r.ops}
        return {ids[name]: ranks for name, (_, ranks) in s.groups.items() if name in ids}
    return {name: {"name": name, "desc": desc, "ranks": str(ranks)} for name, (desc, ranks) in s.groups.items()}


def _value(v: int, fmt: str) -> Any:
    return str(v) if fmt == "json" else v


def _frames(op: str) -> list[dict[str, Any]]:
    return [{"name": op, "filename": "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
             "line": 2501}, {"name": "wrapper", "filename": "/usr/lib/python3.11/site-packages/torch/distributed/"
                             "c10d_logger.py", "line": 83}, *USER_FRAMES]


def write_scenario(name: str, out: str | Path, version: str | None = None, formats: tuple[str, ...] | None = None
                   ) -> dict[str, Any]:
    """Write ``nccl_trace_rank_<r>`` (pickle, torch's default file name) and, for versions with a
    JSON writer, ``nccl_trace_rank_<r>.json`` into ``out``; return the scenario's truth."""
    s = SCENARIOS[name]()
    if version is not None:
        s = at_version(s, version)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for fmt in formats or (("pickle", "json") if s.version in JSON_VERSIONS else ("pickle",)):
        for rank in s.ranks:
            suffix = ".json" if fmt == "json" else ""
            (folder / f"nccl_trace_rank_{rank}{suffix}").write_bytes(dump(s, rank, fmt))
    return {"description": s.description, "version": s.version, **s.truth}


def at_version(s: RecordedScenario, version: str) -> RecordedScenario:
    """The same job written in another format version (1.4 has one seq_id for everything, so
    only jobs without p2p ops can be written in it)."""
    if version == "1.4" and any(op.p2p for r in s.ranks.values() for op in r.ops):
        raise ValueError("format 1.4 numbers p2p ops with the collectives: write a job without p2p")
    if version in ("1.4", "2.2", "2.4"):  # a coalescing block's collectives have entries only from 2.7
        ranks = {k: replace(r, ops=[op for op in r.ops if op.events or op.p2p]) for k, r in s.ranks.items()}
        s = replace(s, ranks=ranks)
    return replace(s, version=version)


# --- the jobs ------------------------------------------------------------------------------

DP = ("0", "default_pg", 0)


def _step(t: int) -> int:
    return T0 + t * 100 * MS


def _dp_ops(n: int, *, last_state: str = "completed", t: int = 0) -> list[RecordedOp]:
    """DP all-reduces #1..#n of the default group, one per 100 ms step from step ``t``."""
    return [RecordedOp(*DP, op="all_reduce", seq=k, created_ns=_step(t + k), state="completed" if k < n else last_state)
            for k in range(1, n + 1)]


def missing_rank() -> RecordedScenario:
    """Rank 3's host stalls before the 6th DP all-reduce: the others launched it and wait inside
    it. Rank 0's pg_status lags (the watchdog last saw #3 complete; the dump saw #4 and #5)."""
    world = list(range(4))
    ranks = {r: RecordedRank(_dp_ops(6, last_state="started"), {0: (6, 6, 5)}) for r in (0, 1, 2)}
    ranks[0].status = {0: (6, 6, 3)}
    ranks[3] = RecordedRank(_dp_ops(5), {0: (5, 5, 5)})
    ranks[3].ops[-1].frames = [{"name": "__next__", "filename": "/job/data.py", "line": 41}, *USER_FRAMES]
    return RecordedScenario("rank 3 never enters DP all_reduce #6 (its host stalls in the data loader); the others are "
                    "inside it; rank 0's pg_status lags at #3", "2.10", {"0": ("default_pg", world)}, ranks,
                    {"exit": 1, "hangs": [{"kind": "missing-rank", "group": "0", "seq": 6, "op": "all_reduce",
                                           "ranks": [3], "waiting_ranks": [0, 1, 2]}], "in_flight": []})


def desync() -> RecordedScenario:
    """At DP #4 rank 2 issues a reduce-scatter where the others all-reduce."""
    world = list(range(4))
    ranks = {r: RecordedRank(_dp_ops(4, last_state="started"), {0: (4, 4, 3)}) for r in world}
    bad = ranks[2].ops[-1]
    ranks[2].ops[-1] = replace(bad, op="_reduce_scatter_base", sizes=((4096,),), state="started")
    return RecordedScenario("rank 2 issues _reduce_scatter_base where the others issue all_reduce (#4)", "2.4",
                    {"0": ("default_pg", world)}, ranks,
                    {"exit": 1, "hangs": [{"kind": "desync", "group": "0", "seq": 4, "op": "all_reduce", "ranks": [2],
                                           "waiting_ranks": [0, 1, 3], "differs_in": ["collective"]}], "in_flight": []})


def stuck() -> RecordedScenario:
    """Every rank entered DP #5 and its kernel started everywhere; none completed (a network
    hang). Nothing in the dumps says when they were written: the verdict says so."""
    world = list(range(4))
    ranks = {r: RecordedRank(_dp_ops(5, last_state="started"), {0: (5, 5, 4)}) for r in world}
    return RecordedScenario("every rank is inside DP all_reduce #5 and none completes (network); the dumps do not "
                    "prove how long it has been pending", "2.7", {"0": ("default_pg", world)}, ranks,
                    {"exit": 1, "hangs": [{"kind": "stuck", "group": "0", "seq": 5, "op": "all_reduce",
                                           "ranks": [0, 1, 2, 3], "waiting_ranks": []}], "in_flight": [],
                     "proven": False})


def stuck_kernel() -> RecordedScenario:
    """DP #5: every rank entered it; its kernel started on ranks 0, 1, 3 but never on rank 2
    (a compute kernel before it never finished there); rank 0's watchdog already retired it
    without completion (timed out)."""
    world = list(range(4))
    ranks = {r: RecordedRank(_dp_ops(5, last_state="started"), {0: (5, 5, 4)}) for r in world}
    ranks[2].ops[-1].state = "scheduled"
    ranks[0].ops[-1].retired = True
    return RecordedScenario("DP all_reduce #5 never starts on rank 2 (its stream is busy); the others are inside it and "
                    "rank 0's watchdog timed it out", "2.10", {"0": ("default_pg", world)}, ranks,
                    {"exit": 1, "hangs": [{"kind": "stuck", "group": "0", "seq": 5, "op": "all_reduce",
                                           "ranks": [2], "waiting_ranks": [0, 1, 3]}], "in_flight": [],
                     "proven": True})


def in_flight() -> RecordedScenario:
    """TP groups [0, 1] and [2, 3]. Rank 3 never enters TP #9 of its group (rank 2 waits); 30 s
    later ranks 0 and 1 enter TP #9 of theirs: started on both, running when the job hung in
    the other group."""
    world = list(range(4))
    groups = {"0": ("default_pg", world), "1": ("tp", [0, 1]), "2": ("tp", [2, 3])}
    ranks = {}
    for r in world:
        name = "1" if r < 2 else "2"
        ops = [RecordedOp(name, "tp", 1, "all_reduce", k, _step(k)) for k in range(1, 9)]
        ranks[r] = RecordedRank(ops, {0: (0, -1, -1), 1: (8, 8, 8)})
    for r in (0, 1):
        ranks[r].ops.append(RecordedOp("1", "tp", 1, "all_reduce", 9, _step(9) + 30_000 * MS, state="started"))
        ranks[r].status[1] = (9, 9, 8)
    ranks[2].ops.append(RecordedOp("2", "tp", 1, "all_reduce", 9, _step(9), state="started"))
    ranks[2].status[1] = (9, 9, 8)
    return RecordedScenario("rank 3 never enters TP all_reduce #9 of group 2; group 1's #9 was launched 30 s later and is "
                    "in flight", "2.10", groups, ranks,
                    {"exit": 1, "hangs": [{"kind": "missing-rank", "group": "2", "seq": 9, "op": "all_reduce",
                                           "ranks": [3], "waiting_ranks": [2]}],
                     "in_flight": [{"group": "1", "seq": 9, "op": "all_reduce", "ranks": [0, 1]}]})


def two_groups_in_flight() -> RecordedScenario:
    """Data-parallel subgroups [0-3] and [4-7] (8 ranks). Rank 5 never enters all_reduce #7 of
    its group (4, 6, 7 wait inside it, from 2 ms after ranks 0-3 entered theirs); ranks 0-3 are
    inside their #7, started everywhere, pending 2 ms longer than the others' (far under the
    timeout) when the dumps were taken: in flight, not proven stuck, listed after the culprit."""
    world = list(range(8))
    groups = {"0": ("default_pg", world), "1": ("dp_a", [0, 1, 2, 3]), "2": ("dp_b", [4, 5, 6, 7])}
    ranks = {}
    for r in world:
        name, pg = ("1", 1) if r < 4 else ("2", 2)
        ops = [RecordedOp(name, groups[name][0], pg, "all_reduce", k, _step(k)) for k in range(1, 7)]
        if r != 5:
            delay = 0 if r < 4 else 2 * MS
            ops.append(RecordedOp(name, groups[name][0], pg, "all_reduce", 7, _step(7) + delay, state="started"))
        ranks[r] = RecordedRank(ops, {0: (0, -1, -1), pg: (7, 7, 6) if r != 5 else (6, 6, 6)})
    return RecordedScenario("rank 5 never enters all_reduce #7 of dp_b; dp_a's #7 (ranks 0-3), entered 2 ms before, is "
                    "still in flight when the dumps are taken", "2.10", groups, ranks,
                    {"exit": 1, "hangs": [{"kind": "missing-rank", "group": "2", "seq": 7, "op": "all_reduce",
                                           "ranks": [5], "waiting_ranks": [4, 6, 7]}],
                     "in_flight": [{"group": "1", "seq": 7, "op": "all_reduce", "ranks": [0, 1, 2, 3]}]})


def consequence() -> RecordedScenario:
    """DP group [0, 2] and TP group [0, 1] (4 ranks): rank 2 never enters DP all_reduce #5, so
    rank 0, inside it, never enters TP all_reduce #5, where rank 1 waits: the TP hang follows
    from the DP one (its culprit waits there)."""
    world = list(range(4))
    groups = {"0": ("default_pg", world), "1": ("dp", [0, 2]), "2": ("tp", [0, 1])}
    ranks = {r: RecordedRank([], {0: (0, -1, -1)}) for r in world}
    for r in (0, 2):
        ranks[r].ops += [RecordedOp("1", "dp", 1, "all_reduce", k, _step(k)) for k in range(1, 5)]
        ranks[r].status[1] = (4, 4, 4)
    ranks[0].ops.append(RecordedOp("1", "dp", 1, "all_reduce", 5, _step(5), state="started"))
    ranks[0].status[1] = (5, 5, 4)
    for r in (0, 1):
        ranks[r].ops += [RecordedOp("2", "tp", 2, "all_reduce", k, _step(k) + 10 * MS) for k in range(1, 5)]
        ranks[r].status[2] = (4, 4, 4)
    ranks[1].ops.append(RecordedOp("2", "tp", 2, "all_reduce", 5, _step(5) + 10 * MS, state="started"))
    ranks[1].status[2] = (5, 5, 4)
    ranks[3] = RecordedRank([], {0: (0, -1, -1)})
    return RecordedScenario("rank 2 never enters DP all_reduce #5; rank 0, inside it, never enters TP all_reduce #5 where "
                    "rank 1 waits: a consequence", "2.10", groups, ranks,
                    {"exit": 1, "hangs": [{"kind": "missing-rank", "group": "1", "seq": 5, "op": "all_reduce",
                                           "ranks": [2], "waiting_ranks": [0]},
                                          {"kind": "missing-rank", "group": "2", "seq": 5, "op": "all_reduce",
                                           "ranks": [0], "waiting_ranks": [1]}], "in_flight": []})


def coalesced_p2p() -> RecordedScenario:
    """DP #3 is a coalescing block of three all-reduces (one entry each, then the "coalesced"
    marker with the events), the same on every rank; then pipeline sends in group 3 ([0, 1]):
    batch #1 (send / recv + marker) matches, rank 0's send #2 has no receive on rank 1."""
    world = [0, 1]
    groups = {"0": ("default_pg", world), "3": ("pp", [0, 1])}
    ranks = {}
    for r in world:
        ops = _dp_ops(2)
        block = [RecordedOp(*DP, op="all_reduce", seq=3, created_ns=_step(3) + k * MS, sizes=((256 * (k + 1),),),
                    events=False) for k in range(3)]
        ops += block + [RecordedOp(*DP, op="coalesced", seq=3, created_ns=_step(3) + 4 * MS, sizes=())]
        mine, peer = ("send", "0->1") if r == 0 else ("recv", "1<-0")
        ops += [RecordedOp("3", "pp", 1, mine, 1, _step(4), p2p=True, peer=peer, events=False),
                RecordedOp("3", "pp", 1, "coalesced", 1, _step(4) + MS, p2p=True, sizes=())]
        ranks[r] = RecordedRank(ops, {0: (3, 3, 3), 1: (0, -1, -1)})
    ranks[0].ops.append(RecordedOp("3", "pp", 1, "send", 2, _step(5), state="started", p2p=True, peer="0->1"))
    return RecordedScenario("a coalesced block of three all-reduces that matches; pipeline batch #1 matches; rank 0's "
                    "send #2 to rank 1 has no receive", "2.10", groups, ranks,
                    {"exit": 1, "hangs": [{"kind": "p2p-unmatched", "group": "3", "seq": 2, "op": "send",
                                           "ranks": [1], "waiting_ranks": [0]}], "in_flight": []})


def silent_highest() -> RecordedScenario:
    """8 ranks, format 1.4: rank 7 (the highest) left no dump; the others are inside DP #3.
    pg_config names every member, so rank 7 is not-reporting."""
    world = list(range(8))
    ranks = {r: RecordedRank(_dp_ops(3, last_state="started")) for r in range(7)}
    return RecordedScenario("rank 7, the highest, wrote no dump; ranks 0-6 are inside DP all_reduce #3 (format 1.4)",
                    "1.4", {"0": ("default_pg", world)}, ranks,
                    {"exit": 1, "hangs": [{"kind": "not-reporting", "group": "0", "seq": 3, "op": "all_reduce",
                                           "ranks": [7], "waiting_ranks": [0, 1, 2, 3, 4, 5, 6]}], "in_flight": []})


SCENARIOS: dict[str, Callable[[], RecordedScenario]] = {
    "nccl_missing_rank": missing_rank, "nccl_desync": desync, "nccl_stuck": stuck,
    "nccl_stuck_kernel": stuck_kernel, "nccl_in_flight": in_flight, "nccl_coalesced_p2p": coalesced_p2p,
    "nccl_silent_highest": silent_highest, "nccl_two_groups_in_flight": two_groups_in_flight,
    "nccl_consequence": consequence,
}
