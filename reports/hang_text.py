"""Text view of ``tracecliff hang``: the one-line verdict first, then each hang with its
culprits, waiting ranks and stack, the per-rank table, notes and warnings."""

from __future__ import annotations

import json
from typing import Any

from analyzer.hang.words import call_text, clock, evidence_lines, pg_label

STACK_DEPTH = 6
COMPLETION = {True: "completed", False: "pending", None: "completion not recorded"}


def render_text(doc: dict[str, Any]) -> str:
    lines = [f"VERDICT: {doc['verdict']}", ""]
    world = doc.get("world") or {}
    if world:
        silent = f"; no dump from rank(s) {_ranks_text(world['silent'])}" if world.get("silent") else ""
        lines += [f"World: {world['size']} ranks (from {world['source']}){silent}", ""]
    for h in doc["hangs"]:
        lines += _hang(h) + [""]
    for f in doc.get("in_flight") or []:
        lines += [f"[in flight] {f['op']} #{f['seq']} of {pg_label(f['group'])}: members {_ranks_text(f['ranks'])}",
                  f"  {f['reason']}", ""]
    history = doc.get("history")
    if history and history.get("statement"):
        lines += [f"Trace history ({len(history['traces'])} Kineto trace(s), late ranks by {history['source']}):",
                  f"  {history['statement']}", ""]
    lines += _ranks(doc["ranks"])
    for title in ("notes", "warnings"):
        if doc[title]:
            lines += ["", title.capitalize()] + [f"  - {line}" for line in doc[title]]
    return "\n".join(lines) + "\n"


def _hang(h: dict[str, Any]) -> list[str]:
    g = h["group"]
    lines = [f"[{h['kind']}] {h['op']} #{h['seq']} of {pg_label(g)}: {g['size']} members "
             f"{_ranks_text(g['ranks'])} ({'from pg_config' if g['membership'] == 'pg_config' else 'membership inferred'})",
             f"  culprits: {_ranks_text(h['ranks'])}   waiting: {_ranks_text(h['waiting_ranks']) or '-'}"
             f"{' since ' + clock(h['waiting_since_ns']) if h['waiting_ranks'] else ''}"]
    detail = h["detail"]
    if "expected" in detail:
        lines.append(f"  expected {call_text(detail['expected'])}; differs in {', '.join(detail['differs_in'])}"
                     + ("  (a tie: the lowest rank's call taken as expected)" if detail.get("tie") else ""))
        lines += [f"  rank {r} issued {call_text(c)}" for r, c in detail["issued"].items()]
    if detail.get("reason"):
        lines.append(f"  {detail['reason']}")
    pending = detail.get("pending") or {}
    if pending.get("why"):
        lines.append(f"  {'proven stuck' if pending.get('proven') else 'not proven stuck'}: {pending['why']}")
    lines += [f"  #{h['seq']} on {line}" for line in evidence_lines(detail.get("evidence") or {})]
    for ranks, info in same_culprits(detail.get("culprits", {})):
        lines += _culprit(ranks, info)
    return lines


def same_culprits(culprits: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The culprits that tell the same (the same last and newest entries, the same stack: every
    rank of a stuck collective) once, with their ranks listed, in the order of their first rank."""
    grouped: dict[str, tuple[list[int], dict[str, Any]]] = {}
    for rank, info in culprits.items():
        key = json.dumps(info, sort_keys=True, default=str)
        grouped.setdefault(key, ([], info))[0].append(int(rank))
    return [(("ranks " if len(ranks) > 1 else "rank ") + _ranks_text(ranks), info) for ranks, info in grouped.values()]


def _culprit(who: str, info: dict[str, Any]) -> list[str]:
    if not info.get("dump"):
        return [f"  {who}: no dump"]
    done, newest = info.get("last_completed"), info.get("newest_entry_any_group")
    lines = [f"  {who}: last completed {_entry_text(done)}; newest entry {_entry_text(newest)}"]
    frames = (newest or {}).get("frames", [])
    lines += [f"      at {f['name']} ({f['filename']}:{f['line']})" for f in frames[:STACK_DEPTH]]
    if len(frames) > STACK_DEPTH:
        lines.append(f"      ... {len(frames) - STACK_DEPTH} more frames")
    if newest and not frames:
        lines.append("      (no stack frames: JSON dumps carry none; the pickle dump does)")
    return lines


def _entry_text(e: dict[str, Any] | None) -> str:
    if not e:
        return "none"
    return f"{e['op']} #{e['seq']} of group {e['group']} ({COMPLETION[e['completed']]})"


def _ranks(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["Ranks", f"  {'rank':>4}  {'entries':>7}  {'pending':>7}  {'last entry':<40}  last completed"]
    for r in rows:
        if not r["dump"]:
            lines.append(f"  {r['rank']:>4}  no dump")
            continue
        lines.append(f"  {r['rank']:>4}  {r['entries']:>7}  {r['pending']:>7}  {_entry_text(r['last_entry']):<40}  "
                     f"{_entry_text(r['last_completed'])}")
    return lines


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
