"""``tracecliff hang``: triage a hung or timed-out job from PyTorch Flight Recorder dumps.

    from analyzer.hang import triage
    report = triage(["dumps/"])          # HangReport; report.to_dict() is the JSON contract
    report = triage(["dumps/"], world_size=16, traces={"traces": [...], "stragglers": {...}})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.base.errors import InputError
from analyzer.hang.analyze import Hang, Job, entry_dict, find_hangs
from analyzer.hang.history import straggler_history
from analyzer.hang.read import DumpEntry, Found, Frame, RankDump, discover, discover_dumps, read_dump
from analyzer.hang.words import call_text, clock, evidence_lines, pg_label, op_text, span

__all__ = ["HangReport", "find_inputs", "triage"]
SCHEMA_VERSION = 1


@dataclass
class HangReport:
    verdict: str
    hangs: list[Hang]
    ranks: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    world: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] | None = None
    traces: list[str] = field(default_factory=list)  # Kineto traces found beside the dumps

    @property
    def hung(self) -> bool:
        return bool(self.hangs)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict,
                "hangs": [h.to_dict() for h in self.hangs], "ranks": self.ranks, "groups": self.groups,
                "inputs": self.inputs, "notes": self.notes, "warnings": self.warnings,
                "in_flight": self.in_flight, "world": self.world, "history": self.history}


def find_inputs(paths: list[str] | tuple[str, ...]) -> Found:
    """The dumps and Kineto traces at ``paths`` (analyzer.hang.read.discover)."""
    return discover(paths)


def triage(paths: list[str] | tuple[str, ...] | Found, world_size: int | None = None,
           traces: dict[str, Any] | None = None) -> HangReport:
    """``world_size``: the job's rank count when the dumps do not carry it (every rank without
    a dump is then not-reporting, the highest included). ``traces``: the straggler summary of the
    same job's Kineto traces, ``{"traces": [paths], "world_size", "stragglers"}`` (analyzer.api
    builds it), for the culprit's history."""
    found = paths if isinstance(paths, Found) else discover(paths)
    dumps, pairs = load(found.dumps)
    trace_world = (traces or {}).get("world_size")
    job = Job(dumps, world_size, trace_world)
    hangs, in_flight = find_hangs(job)
    warnings = [w for d in dumps for w in d.warnings] + _version_warnings(dumps) + pairs["warnings"]
    silent = [r for r in job.world if r not in job.dumps]
    if silent:
        warnings.append(f"no dump for rank(s) {_list(silent)}")
    history = _history(traces, hangs, job, warnings)
    notes = (pairs["notes"]
             + [f"group {g.name} ({g.description or 'no description'}): membership {g.membership}"
                for g in job.groups.values() if g.membership != "pg_config"] + job.notes)
    if found.skipped:
        notes.append(f"left out {len(found.skipped)} file(s) that are neither dumps nor traces: "
                     + ", ".join(str(p) for p in found.skipped[:5]) + (" ..." if len(found.skipped) > 5 else ""))
    return HangReport(verdict=verdict(job, hangs, in_flight, history), hangs=hangs, ranks=rank_rows(job),
                      groups=[g.to_dict() for g in job.groups.values()], inputs=pairs["inputs"],
                      notes=notes, warnings=warnings, in_flight=in_flight,
                      world={"size": len(job.world), "source": job.world_source, "silent": silent},
                      history=history, traces=[str(p) for p in found.traces])


def load(paths: list[Path]) -> tuple[list[RankDump], dict[str, list]]:
    """One dump per rank. A rank with both a JSON and a pickle dump (a job with both writers
    on) is read from the pickle, which carries the stack frames; the two are compared."""
    by_rank: dict[int, list[RankDump]] = {}
    for path in paths:
        dump = read_dump(path)
        by_rank.setdefault(dump.rank, []).append(dump)
    chosen, inputs, agree, notes, warnings = [], [], [], [], []
    for rank in sorted(by_rank):
        got = sorted(by_rank[rank], key=lambda d: (d.format != "pickle", d.path))
        if len(got) > 2 or (len(got) == 2 and got[0].format == got[1].format):
            raise InputError(got[1].path, f"rank {rank} already has a dump ({got[0].path}): give one dump per rank "
                                          "(a JSON and a pickle dump of one rank are read together)")
        used = got[0]
        row: dict[str, Any] = {"rank": rank, "path": used.path, "format": used.format, "version": used.version,
               "comm_lib_version": used.comm_lib_version, "entries": len(used.entries), "also": None}
        if len(got) == 2:
            other = got[1]
            found = compare_dumps(used, other)
            row["also"] = {"path": other.path, "format": other.format, **found}
            if found["agree"]:
                agree.append(rank)
                if found["progressed"] or found["only_in_one"]:
                    notes.append(f"rank {rank}: the JSON dump was written at another moment than the pickle "
                                 f"({found['progressed']} entries progressed, {found['only_in_one']} in one only)")
            else:
                warnings.append(f"rank {rank}: its JSON and pickle dumps disagree ({'; '.join(found['differences'])}): "
                                f"the pickle {used.path} is used")
        chosen.append(used)
        inputs.append(row)
    if agree:
        notes.insert(0, f"rank(s) {span(agree)} have a JSON and a pickle dump: the pickles are used (they carry "
                        "stack frames); the two agree on what was issued")
    return chosen, {"inputs": inputs, "notes": notes, "warnings": warnings}


def compare_dumps(a: RankDump, b: RankDump) -> dict[str, Any]:
    """What two dumps of one rank share: the same entries issued (ids, groups, sequence numbers,
    calls, creation times), version and pg_config. Entries that progressed between the two writes
    (state, retired) or that one of them has and the other not (written at another moment) do
    not make them disagree."""
    mine, theirs = {e.record_id: e for e in a.entries}, {e.record_id: e for e in b.entries}
    common = sorted(mine.keys() & theirs.keys())
    differences = []
    if a.version != b.version:
        differences.append(f"format {a.version} vs {b.version}")
    if a.pg_config != b.pg_config:
        differences.append("pg_config differs")
    issued = [r for r in common if _identity(mine[r]) != _identity(theirs[r])]
    if issued:
        differences.append(f"{len(issued)} entries differ in what was issued (first: record {issued[0]})")
    if not common and (mine or theirs):
        differences.append("no entry in common")
    progressed = sum(1 for r in common if _progress(mine[r]) != _progress(theirs[r]))
    return {"agree": not differences, "differences": differences, "progressed": progressed,
            "only_in_one": len(mine.keys() ^ theirs.keys())}


def _identity(e: DumpEntry) -> tuple:
    return (e.group, e.pg_id, e.collective_seq, e.p2p_seq, e.is_p2p, e.op, e.peer, e.input_sizes, e.output_sizes,
            e.input_dtypes, e.output_dtypes, e.time_created_ns)


def _progress(e: DumpEntry) -> tuple:
    return (e.state, e.retired, e.time_started_ns, e.time_completed_ns)


def _history(traces: dict[str, Any] | None, hangs: list[Hang], job: Job, warnings: list[str]) -> dict[str, Any] | None:
    if not traces:
        return None
    trace_world = traces.get("world_size")
    if trace_world and job.world_source != "inferred: the highest rank with a dump + 1" and trace_world != len(job.world):
        warnings.append(f"the Kineto traces are of a {trace_world}-rank job, the dumps of {len(job.world)} ranks: "
                        "not the same job, so no straggler history is given")
        return {"traces": list(traces.get("traces") or []), "world_size": trace_world, "statement": None,
                "mismatch": True}
    return straggler_history(traces, hangs[0].ranks if hangs else [])


def _version_warnings(dumps: list[RankDump]) -> list[str]:
    versions = sorted({d.version for d in dumps})
    return [f"the dumps have different format versions ({', '.join(versions)}): from one job?"] if len(versions) > 1 else []


def rank_rows(job: Job) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for r in job.world:
        dump = job.dumps.get(r)
        if dump is None:
            rows.append({"rank": r, "dump": False})
            continue
        ordered = sorted(dump.entries, key=lambda e: e.record_id)  # the ring buffer's own order
        done = [e for e in ordered if job.completed(r, e)]
        pending = [e for e in ordered if job.completed(r, e) is False]
        rows.append({"rank": r, "dump": True, "path": dump.path, "entries": len(ordered),
                     "last_entry": entry_dict(ordered[-1] if ordered else None,
                                              job.completed(r, ordered[-1]) if ordered else None),
                     "last_completed": entry_dict(done[-1] if done else None, True),
                     "pending": len(pending)})
    return rows


# --- the one-line verdict ------------------------------------------------------------------

def verdict(job: Job, hangs: list[Hang], in_flight: list[dict[str, Any]] | None = None,
            history: dict[str, Any] | None = None) -> str:
    flying = _in_flight_text(in_flight or [])
    if not hangs:
        groups = len(job.groups)
        return (f"no hang found: every collective of the {groups} process group(s) matches across "
                f"{len(job.dumps)} rank dump(s), and none is left pending" + (f" ({flying})" if flying else ""))
    head = _sentence(job, hangs[0])
    more = f" (+{len(hangs) - 1} more hang(s) in other groups{_consequences(hangs[1:])})" if len(hangs) > 1 else ""
    past = f"; {history['statement']}" if history and history.get("statement") else ""
    return head + past + more + (f"; {flying}" if flying else "")


def _consequences(hangs: list[Hang]) -> str:
    """The hangs that may follow from another one (``detail.consequence_of``), said."""
    said = [f"{h.op} #{h.seq} of group {h.group.name} may be its consequence: rank(s) "
            f"{_list(h.detail['consequence_of']['blocked_ranks'])} wait in {h.detail['consequence_of']['op']} "
            f"#{h.detail['consequence_of']['seq']} of group {h.detail['consequence_of']['group']}"
            for h in hangs if h.detail.get("consequence_of")]
    return ": " + "; ".join(said) if said else ""


def _in_flight_text(in_flight: list[dict[str, Any]]) -> str:
    return "; ".join(f"{op_text(f['op'], f.get('coalesced_ops'))} #{f['seq']} of {pg_label(f['group'])} was "
                     f"{f.get('status') or 'in flight at the dump, not hung'}" for f in in_flight)


def _sentence(job: Job, h: Hang) -> str:
    who = f"rank {h.ranks[0]}" if len(h.ranks) == 1 else f"ranks {_list(h.ranks)}"
    where = f"{op_text(h.op, h.detail.get('coalesced_ops'))} #{h.seq} of {pg_label(h.group.to_dict())}"
    waiting = (f" ({len(h.waiting_ranks)} of {len(h.group.ranks)} members waiting since "
               f"{clock(h.waiting_since_ns)})") if h.waiting_ranks else ""
    if h.kind == "missing-rank":
        return f"{who} never entered {where}{waiting}{_last_seen(h)}"
    if h.kind == "desync":
        issued = " / ".join(sorted({call_text(c) for c in h.detail["issued"].values()}))
        return (f"{who} issued {issued} where the others issued {call_text(h.detail['expected'])} at #{h.seq} "
                f"of {pg_label(h.group.to_dict())}: desync in {', '.join(h.detail['differs_in'])}{waiting}{_last_seen(h)}")
    if h.kind == "not-reporting":
        evidence = (h.detail.get("evidence") or {}).values()
        if evidence and all(e.get("done") for e in evidence):  # gloo: returned, perhaps with an error
            return (f"{who} wrote no dump (dead host?); the others returned from {where} but nothing proves it "
                    f"completed ({len(h.waiting_ranks)} of {len(h.group.ranks)} members entered it at "
                    f"{clock(h.waiting_since_ns)})")
        return f"{who} wrote no dump (dead host?); the others wait in {where}{waiting}"
    if h.kind == "stuck":
        pending = h.detail.get("pending") or {}
        how = f" ({pending['why']})" if pending.get("why") else ""
        if h.waiting_ranks and h.detail.get("started"):
            return f"{where} never started on {who} while the others are inside it{how}{_last_seen(h)}"
        return (f"{where} never completed on {who} although every member entered it "
                f"(network / NCCL){how}{_last_seen(h)}")
    return f"p2p {where} is unmatched: {h.detail['reason']}"


def _last_seen(h: Hang) -> str:
    """The culprit's last completed entry in the group and where its code was."""
    info = next(iter(h.detail.get("culprits", {}).values()), {})
    parts = []
    done = info.get("last_completed")
    if done:
        parts.append(f"its last completed collective was {done['op']} #{done['seq']}")
    elif info.get("last_entry"):
        last = info["last_entry"]
        parts.append(f"its last entry was {last['op']} #{last['seq']} (completion not recorded)")
    newest = info.get("newest_entry_any_group") or {}
    if h.kind == "missing-rank" and newest.get("time_created_ns") and h.waiting_since_ns:
        gap = max(0, h.waiting_since_ns - newest["time_created_ns"]) / 1e9
        parts.append(f"it last logged {newest['op']} #{newest['seq']} of group {newest['group']} "
                     f"{gap:.3f} s before the first waiting rank entered")
    frame = user_frame(newest.get("frames", []))
    if frame:
        parts.append(f"last seen in {frame['name']} ({frame['filename']}:{frame['line']})")
    return "; " + "; ".join(parts) if parts else ""


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the user's code: not torch's, not the interpreter's."""
    for f in frames:
        name = f["filename"].replace("\\", "/")
        if "/torch/" in name or name.startswith("<") or ("/lib/python" in name and "site-packages" not in name):
            continue
        return f
    return None


def _list(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


# Re-exported for renderers and tests.
__all__ += ["DumpEntry", "Frame", "call_text", "clock", "discover_dumps", "evidence_lines", "pg_label", "op_text",
            "user_frame"]
