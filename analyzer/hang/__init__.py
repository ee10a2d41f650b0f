"""``tracecliff hang``: triage a hung or timed-out job from PyTorch Flight Recorder dumps.

    from analyzer.hang import triage
    report = triage(["dumps/"])          # HangReport; report.to_dict() is the JSON contract
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.base.errors import InputError
from analyzer.hang.analyze import Hang, Job, entry_dict, find_hangs
from analyzer.hang.read import Entry, Frame, RankDump, discover_dumps, read_dump

__all__ = ["HangReport", "triage"]
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

    @property
    def hung(self) -> bool:
        return bool(self.hangs)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict,
                "hangs": [h.to_dict() for h in self.hangs], "ranks": self.ranks, "groups": self.groups,
                "inputs": self.inputs, "notes": self.notes, "warnings": self.warnings}


def triage(paths: list[str] | tuple[str, ...]) -> HangReport:
    dumps = load(discover_dumps(paths))
    job = Job(dumps)
    hangs = find_hangs(job)
    warnings = [w for d in dumps for w in d.warnings] + _version_warnings(dumps)
    silent = [r for r in job.world if r not in job.dumps]
    if silent:
        warnings.append(f"no dump for rank(s) {_list(silent)}")
    notes = [f"group {g.name} ({g.description or 'no description'}): membership {g.membership}"
             for g in job.groups.values() if g.membership != "pg_config"] + job.notes
    return HangReport(verdict=verdict(job, hangs), hangs=hangs, ranks=rank_rows(job),
                      groups=[g.to_dict() for g in job.groups.values()],
                      inputs=[{"rank": d.rank, "path": d.path, "version": d.version,
                               "comm_lib_version": d.comm_lib_version, "entries": len(d.entries)} for d in dumps],
                      notes=notes, warnings=warnings)


def load(paths: list[Path]) -> list[RankDump]:
    dumps: dict[int, RankDump] = {}
    for path in paths:
        dump = read_dump(path)
        if dump.rank in dumps:
            raise InputError(path, f"rank {dump.rank} already has a dump ({dumps[dump.rank].path}): "
                                   "give one dump per rank (JSON and pickle of the same job in separate runs)")
        dumps[dump.rank] = dump
    return [dumps[r] for r in sorted(dumps)]


def _version_warnings(dumps: list[RankDump]) -> list[str]:
    versions = sorted({d.version for d in dumps})
    return [f"the dumps have different format versions ({', '.join(versions)}): from one job?"] if len(versions) > 1 else []


def rank_rows(job: Job) -> list[dict[str, Any]]:
    rows = []
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

def verdict(job: Job, hangs: list[Hang]) -> str:
    if not hangs:
        groups = len(job.groups)
        return (f"no hang found: every collective of the {groups} process group(s) matches across "
                f"{len(job.dumps)} rank dump(s), and none is left pending")
    head = _sentence(job, hangs[0])
    more = f" (+{len(hangs) - 1} more hang(s) in other groups)" if len(hangs) > 1 else ""
    return head + more


def group_label(g: dict[str, Any]) -> str:
    return f"group {g['description']} (pg {g['name']})" if g["description"] else f"group {g['name']}"


def _sentence(job: Job, h: Hang) -> str:
    who = f"rank {h.ranks[0]}" if len(h.ranks) == 1 else f"ranks {_list(h.ranks)}"
    where = f"{h.op} #{h.seq} of {group_label(h.group.to_dict())}"
    waiting = (f" ({len(h.waiting_ranks)} of {len(h.group.ranks)} members waiting since "
               f"{clock(h.waiting_since_ns)})") if h.waiting_ranks else ""
    if h.kind == "missing-rank":
        return f"{who} never entered {where}{waiting}{_last_seen(h)}"
    if h.kind == "desync":
        issued = " / ".join(sorted({call_text(c) for c in h.detail["issued"].values()}))
        return (f"{who} issued {issued} where the others issued {call_text(h.detail['expected'])} at #{h.seq} "
                f"of {group_label(h.group.to_dict())}: desync in {', '.join(h.detail['differs_in'])}{waiting}{_last_seen(h)}")
    if h.kind == "not-reporting":
        return f"{who} wrote no dump (dead host?); the others wait in {where}{waiting}"
    if h.kind == "stuck":
        return (f"{where} never completed on {who} although every member entered it "
                f"(network / NCCL){_last_seen(h)}")
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


def call_text(call: dict[str, Any]) -> str:
    return f"{call['op']}(sizes {call['input_sizes']}, {'/'.join(call['input_dtypes']) or '?'})"


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the user's code: not torch's, not the interpreter's."""
    for f in frames:
        name = f["filename"].replace("\\", "/")
        if "/torch/" in name or name.startswith("<") or ("/lib/python" in name and "site-packages" not in name):
            continue
        return f
    return None


def clock(ns: int | None) -> str:
    if not ns:
        return "an unknown time"
    return time.strftime("%H:%M:%S UTC", time.gmtime(ns / 1e9))


def _list(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


# Re-exported for renderers and tests.
__all__ += ["Entry", "Frame", "call_text", "clock", "group_label", "user_frame"]
