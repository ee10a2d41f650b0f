"""Terminal view: fits a 100-column terminal; verdict first, then ranks, then collectives."""

from __future__ import annotations

import textwrap
from typing import Any

from analyzer.base.units import fmt_bytes

WIDTH = 100
COLUMNS = (("step time", "step_time_us"), ("compute", "compute_us"), ("comm", "comm_us"),
           ("overlapped", "overlap_us"), ("exposed", "exposed_comm_us"), ("idle", "idle_us"))


class TextRenderer:
    name = "text"

    def render(self, doc: dict[str, Any]) -> str:
        lines: list[str] = []
        lines += _header(doc)
        lines += _findings(doc)
        lines += _rank_table(doc)
        lines += _top_collectives(doc)
        lines += _groups(doc)
        lines += _stragglers(doc)
        lines += _warnings(doc)
        return "\n".join(line[:WIDTH] if len(line) > WIDTH else line for line in lines) + "\n"


def _header(doc: dict[str, Any]) -> list[str]:
    job = doc["job"]
    ranks = doc["ranks"]
    parts = [f"{job['ranks_given']} rank(s)"]
    if job.get("world_size"):
        parts[0] += f" of {job['world_size']}"
    parts.append(f"strategy {job['strategy']}")
    if job.get("gpu"):
        parts.append(str(job["gpu"]))
    if job.get("nccl_version"):
        parts.append(f"NCCL {job['nccl_version']}")
    lines = ["tracecliff: " + ", ".join(parts)]
    dims = job.get("parallelism") or {}
    if dims:
        lines.append("parallelism: " + ", ".join(f"{dim}={dims[dim]['size']}" for dim in sorted(dims)))
    verdict = doc.get("verdict")
    if verdict:
        lines[0:0] = textwrap.wrap(verdict, WIDTH, break_on_hyphens=False)
    comm = sum(r["comm_us"] for r in ranks)
    exposed = sum(r["exposed_comm_us"] for r in ranks)
    span = sum(r["span_us"] for r in ranks)
    if span:
        lines.append(f"exposed communication: {exposed / max(len(ranks), 1):,.0f} µs per rank "
                     f"({100 * exposed / span:.1f}% of GPU span), overlap {100 * (comm - exposed) / comm if comm else 0:.1f}%")
    return lines + [""]


def _findings(doc: dict[str, Any]) -> list[str]:
    """Each finding: severity, code, rule and gain; its summary and fix wrapped to the width."""
    findings = doc.get("findings") or []
    if not findings:
        return []
    lines = ["Findings (by estimated gain):"]
    for f in findings:
        gain = f.get("estimated_gain_us")
        gain_text = f"  ~{gain / 1000:,.1f} ms/step" if isinstance(gain, (int, float)) else ""
        lines.append(f"  [{f.get('severity', '?')}] {f.get('code', '')} {f.get('rule')}{gain_text}")
        wrap = dict(width=WIDTH, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
        lines += textwrap.wrap(f.get("summary", ""), **wrap)
        fix = (f.get("fix") or {}).get("text")
        if fix:
            lines += textwrap.wrap(f"fix: {fix}", **wrap)
    return lines + ["  (tracecliff explain RULE: what a rule checks, the model, the fix)", ""]


def _cell(value: float | None, span: float) -> str:
    if value is None:
        return f"{'-':>14}"
    pct = 100.0 * value / span if span else 0.0
    return f"{value:>9,.0f}{pct:>4.0f}%"


def _rank_table(doc: dict[str, Any]) -> list[str]:
    head = f"{'rank':>5} " + " ".join(f"{title:>14}" for title, _ in COLUMNS)
    lines = ["Per rank (µs, % of GPU span):", head]
    for r in doc["ranks"]:
        span = r["span_us"]
        cells = " ".join(_cell(r.get(key), span) for _, key in COLUMNS)
        lines.append(f"{r['rank']:>5} {cells}")
    return lines + [""]


def _top_collectives(doc: dict[str, Any], limit: int = 5) -> list[str]:
    rows = [c for c in doc["collectives"] if c.get("exposed_us")]
    rows.sort(key=lambda c: (-c["exposed_us"], c["rank"], c["start_us"]))
    if not rows:
        return ["No exposed communication." if doc["collectives"] else "No communication kernels.", ""]
    lines = [f"Top {min(limit, len(rows))} collectives by exposed time:",
             f"{'rank':>5} {'step':>5} {'phase':<9} {'collective':<14} {'size':>10} {'dur µs':>10} {'exposed µs':>11}  group"]
    for c in rows[:limit]:
        size = fmt_bytes(c.get("bytes"))
        group = (c.get("group") or {}).get("description") or (c.get("group") or {}).get("name") or "?"
        step = c["step"] if c.get("step") is not None else "-"
        lines.append(f"{c['rank']:>5} {step:>5} {str(c.get('phase')):<9} {c['collective']:<14} {size:>10} "
                     f"{c['dur_us']:>10,.0f} {c['exposed_us']:>11,.0f}  {group}")
    return lines + [""]


def _groups(doc: dict[str, Any]) -> list[str]:
    """Process groups: span, fitted α/β (or the profile's) with S*, median busbw."""
    groups = doc.get("groups") or []
    if not groups:
        return []
    lines = ["Process groups (α/β: fit of the lower envelope, else hardware profile):",
             f"{'group':<22} {'role':<9} {'size':>5} {'nodes':>6} {'α µs':>8} {'β GB/s':>8} {'S*':>10} "
             f"{'busbw med':>10}  how"]
    for g in groups:
        name = str(g.get("description") or g.get("name") or f"? ({','.join(g.get('kinds') or [])})")[:22]
        nodes = "?" if g.get("nodes") is None else f"{g['nodes']}{'x' if g.get('cross_node') else ''}"
        lines.append(f"{name:<22} {str(g.get('role') or '?')[:9]:<9} {_num(g.get('size'), '{:d}'):>5} {nodes:>6} "
                     f"{_num(g.get('alpha_us'), '{:.2f}'):>8} {_num(g.get('beta_gbps'), '{:.1f}'):>8} "
                     f"{fmt_bytes(round(g['s_star_bytes'])) if g.get('s_star_bytes') is not None else '?':>10} "
                     f"{_num(g.get('busbw_median_gbps'), '{:.1f}'):>10}  {g.get('fit_source', '')}")
    return lines + [""]


def _num(value: Any, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def _stragglers(doc: dict[str, Any]) -> list[str]:
    s = doc.get("stragglers") or {}
    if not s.get("method"):
        return [f"Latest arrival: {s['note']}", ""] if s.get("note") else []
    if s.get("top_rank") is None:
        return [f"Latest arrival: none ({s['matched_collectives']} collectives matched by {s['method']})", ""]
    share = 100 * (s.get("top_rank_last_share") or 0)
    return [f"Latest arrival: rank {s['top_rank']}, last at {share:.0f}% of {s['matched_collectives']} "
            f"matched collectives; {s['top_rank_wait_caused_us']:,.0f} µs of others' waiting", ""]


def _warnings(doc: dict[str, Any], longest: int = 600) -> list[str]:
    """Wrapped, not cut at the terminal width: a warning must be readable in full (up to
    ``longest`` characters: a hostile 100,000-character name must not flood the terminal)."""
    lines = []
    for w in doc.get("warnings") or []:
        text = f"warning: {w}"
        text = text if len(text) <= longest else text[:longest - 1] + "…"
        lines += textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return lines
