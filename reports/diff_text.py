"""Plain-text view of ``tracecliff diff`` (the dict of analyzer.compare.diff.diff_runs)."""

from __future__ import annotations

import math
from typing import Any

from analyzer.reports.wrap import WIDTH, wrap
from analyzer.base.units import fmt_change, fmt_flops, fmt_pct, fmt_tflops, fmt_unit, fmt_us

SCOPE = {True: "cross", False: "intra", None: "?"}


class DiffTextRenderer:
    name = "text"

    def render(self, doc: dict[str, Any]) -> str:
        lines = _header(doc)
        lines += _scaling(doc)
        lines += _compute(doc.get("compute") or {})
        lines += _decomposition(doc["step_time"])
        lines += _section("Metrics (each run's typical step: the verdict's figures)",
                          ["metric", "base", "new", "change", ""],
                          [[m["metric"], fmt(m["base"], m["unit"]), fmt(m["new"], m["unit"]),
                            fmt_change(m.get("delta_pp"), m["delta_pct"]), m["verdict"]] for m in doc["metrics"]])
        lines += [line for m in doc["metrics"] if m.get("note") for line in _prose(f"{m['metric']}: {m['note']}", " ")]
        per = {c["per"] for c in doc["collectives"]}
        lines += _section(f"Collectives per {' and '.join(sorted(per)) or 'rank-step'} (count, bytes, time, exposed)",
                          ["group", "collective", "scope", "count", "bytes", "time µs", "exposed µs"],
                          [[c["group"], c["collective"], scope_label(c),
                            _pair(c["count"], "n"), _pair(c["bytes"], "B"), _pair(c["time_us"], "µs"),
                            _pair(c["exposed_us"], "µs")] for c in doc["collectives"]])
        lines += _findings(doc["findings"])
        lines += _predictions(doc.get("predictions"))
        lines += _section("Step time per rank (its own time of the run's typical step)", ["rank", "base", "new", "change"],
                          [[str(r["rank"]), fmt(r["base_step_time_us"], "µs"), fmt(r["new_step_time_us"], "µs"),
                            pct(r["delta_pct"])] for r in doc["ranks"]])
        return "\n".join(lines).rstrip() + "\n"


def _header(doc: dict[str, Any]) -> list[str]:
    lines = ["tracecliff diff"]
    for side in ("base", "new"):
        f = doc[side]
        lines += _prose(f"{side:<4} {f['label']}: {f['world_size'] or '?'} rank(s) on {f['nodes'] or '?'} node(s)"
                        f"{' (' + f['nodes_source'] + ')' if f['nodes_source'] else ''}, {f['strategy'] or '?'}, "
                        f"{f['ranks_given']} rank trace(s), typical step {f['step'] if f['step'] is not None else '?'}: "
                        f"{fmt(f['step_time_us'], 'µs')} µs", " ")
    return lines


def _prose(text: str, indent: str = "") -> list[str]:
    """A sentence of the view, wrapped to the page (its continuation indented under it)."""
    return wrap(text, initial_indent=indent, subsequent_indent=indent + "  ")


def _scaling(doc: dict[str, Any]) -> list[str]:
    s = doc["scaling"]
    if s.get("efficiency") is None:
        return ["", *_prose(f"Scaling: {s.get('basis')}")]
    name = scaling_title(s["kind"])
    per_gpu = f"{s['base_throughput_per_gpu']:.4g} → {s['new_throughput_per_gpu']:.4g}"
    return ["", *_prose(f"{name}: {100 * s['efficiency']:.1f}% ({s['base_gpus']} → {s['new_gpus']} GPUs; "
                        f"per-GPU {s['throughput_unit']} {per_gpu}; basis: {s['basis']})")]


def scaling_title(kind: str) -> str:
    return {"weak scaling": "Weak-scaling efficiency", "strong scaling": "Strong-scaling efficiency"}.get(
        kind, "Throughput ratio (new / base)")


def _compute(c: dict[str, Any]) -> list[str]:
    """Each run's compute of its typical step (recorded shapes) and the compute cliff, if any."""
    if not c.get("available"):
        return ["", *_prose(f"Compute: unavailable ({c.get('reason') or 'no FLOPs from recorded shapes'})")] if c else []
    lines = ["", "Compute per GPU, typical step (FLOPs from recorded shapes):"]
    rows = []
    for side in ("base", "new"):
        r = c[side]
        rows.append([side, str(r["gpus"]), fmt_flops(r["flops_per_step"]), fmt_us(r["counted_us"]),
                     fmt_us(r["compute_us"]), fmt_tflops(r["gemm"]["tflops_per_s"]), fmt_pct(r["gemm"]["pct_of_peak"])])
    lines += table(["run", "GPUs", "FLOP/step", "FLOP kernels", "all compute", "GEMM TFLOP/s", "of peak"], rows)
    sizes = (c.get("finding") or {}).get("evidence", {}).get("gemm_tflops_by_size") or []
    if sizes:
        lines += _prose("GEMM TFLOP/s by FLOPs per op (base → new): " + "; ".join(
            f"{row['bucket']} {fmt_tflops(row['base_tflops_per_s'])} → {fmt_tflops(row['new_tflops_per_s'])}"
            for row in sizes), " ")
    finding = c.get("finding")
    if finding:
        lines += _prose(f"[{finding['severity']}] {finding['code']}: {finding['summary']}", " ")
        lines += _prose(f"model: {finding['model']}", "   ")
        lines += _prose(f"fix: {finding['fix']}", "   ")
    elif c.get("work_ratio") is not None and c["work_ratio"] < 1:
        lines += _prose(f"Each GPU's work fell {1 / c['work_ratio']:.1f}×; its FLOP kernels' time changed "
                        f"{c['counted_ratio']:.2f}× (GEMM TFLOP/s {100 * (c['gemm_tflops_change'] or 0):+.1f}%): "
                        "compute scales with the per-GPU batch.", " ")
    return lines


def _decomposition(step: dict[str, Any]) -> list[str]:
    if not step.get("available"):
        return ["", *_prose(f"Step-time change: unavailable ({step.get('reason')})")]
    lines = ["", *_prose(f"Step-time change: {fmt(step['base_step_time_us'], 'µs')} → "
                         f"{fmt(step['new_step_time_us'], 'µs')} ({signed(step['delta_us'])} µs), {step['per']}:")]
    rows = []
    for c in step["components"]:
        rows.append([c["component"], fmt(c["base_us"], "µs"), fmt(c["new_us"], "µs"), signed(c["delta_us"]),
                     pct(c["share_of_change_pct"], signed_=False), f"{c['efficiency_points']:+.1f}"])
        for p in c.get("parts", []):
            if p["base_us"] or p["new_us"]:
                label = p["component"] + (f" [{scope_label(p)}]" if p.get("collective") else "")
                rows.append(["  " + label, fmt(p["base_us"], "µs"), fmt(p["new_us"], "µs"), signed(p["delta_us"]),
                             pct(p["share_of_change_pct"], signed_=False), f"{p['efficiency_points']:+.1f}"])
        for scope, delta in (c.get("by_scope") or {}).items():
            rows.append([f"  = {scope} collectives", "", "", signed(delta), "", ""])
    lines += table(["component", "base µs", "new µs", "Δ µs", "share", "eff. pts"], rows)
    if not step["straggler_wait_measured"]:
        lines += _prose("(waiting for late peers not measured: no cross-rank matching; it stays in exposed transfer)", " ")
    return lines


def scope_label(part: dict[str, Any]) -> str:
    """intra / cross, or base→new when the group changed scope (the scaling-cliff signature)."""
    new, base = part.get("cross_node"), part.get("base_cross_node")
    if base is not None and base != new:
        return f"{SCOPE[base]}→{SCOPE[new]}"
    return SCOPE[new]


def _findings(findings: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each rule's change by its title, then its summary in full, wrapped (never cut mid-sentence)."""
    rows, summaries = [], []
    for status in ("appeared", "resolved", "persisting"):
        for f in findings[status]:
            count = f"{f.get('base_count', '')}→{f['count']}" if status == "persisting" else str(f["count"])
            rows.append([status, f["rule"], f["severity"] or "", count, f.get("title") or ""])
            if f.get("summary"):
                summaries += wrap(f"{f['rule']} ({'base' if status == 'resolved' else 'new'}): {f['summary']}",
                                  initial_indent=" ", subsequent_indent="   ")
    return _section("Findings", ["status", "rule", "severity", "count", "title"], rows, WIDTH) + summaries


def _predictions(section: dict[str, Any] | None) -> list[str]:
    """Each finding of base: the step its fix was predicted to give against the new run's."""
    if not section:
        return []
    if not section.get("available"):
        return ["", *_prose(f"Predicted vs measured: unavailable ({section.get('reason')})")]
    rows = [[p["rule"] or "?", p["status"], fmt(p["predicted_gain_us"], "µs"), fmt(p["predicted_step_time_us"], "µs"),
             fmt(p["measured_step_time_us"], "µs"), fmt(p["measured_recovered_us"], "µs"), pct(p["error_pct"]),
             p["whatif"] or (f"no gain: {p['why_no_gain']}" if p["why_no_gain"] else "")]
            for p in section["findings"]]
    title = (f"Predicted vs measured (base's findings; measured change {signed(section['measured_gain_us'] * -1)} µs "
             f"of the {section['per']})")
    lines = _section(title, ["rule", "status", "gain µs", "predicted µs", "measured µs", "in leaves µs", "error",
                             "what-if"], rows, WIDTH)
    legend = ("(gain: the fix's predicted gain per step; predicted, measured: the step time; in leaves: the change "
              "measured in the leaves the fix recovers; error: predicted vs measured step)")
    return lines + _prose(legend, " ") + _prose(f"({section['note']})", " ") if rows else lines


def _section(title: str, header: list[str], rows: list[list[str]], width: int | None = None) -> list[str]:
    return ["", *_prose(f"{title}:")] + (table(header, rows, width) if rows else [" (none)"])


# A last column narrower than this is not wrapped in place: its cells go below their rows.
MIN_LAST_COLUMN = 24


def table(header: list[str], rows: list[list[str]], width: int | None = None) -> list[str]:
    """Left-aligned columns, one leading space (shared by the gate's table). ``width``: the page
    (reports.wrap.WIDTH); a wider table has its last column (free text: a title, a command)
    wrapped at words within the page, or, with less than ``MIN_LAST_COLUMN`` left for it, each
    of its cells below its row, wrapped, after the column's name."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lead = 1 + sum(widths[:-1]) + 2 * (len(widths) - 1)
    if width is None or lead + widths[-1] <= width:
        fmt_row = "  ".join(f"{{:<{w}}}" for w in widths)
        return [" " + fmt_row.format(*map(str, r)).rstrip() for r in [header, *rows]]
    fmt_lead = "  ".join(f"{{:<{w}}}" for w in widths[:-1])
    out = []
    if width - lead >= MIN_LAST_COLUMN:
        for r in [header, *rows]:
            pieces = wrap(str(r[-1]), width - lead) or [""]
            out.append((" " + fmt_lead.format(*map(str, r[:-1])) + "  " + pieces[0]).rstrip())
            out += [" " * lead + piece for piece in pieces[1:]]
        return out
    for r in [header, *rows]:
        out.append((" " + fmt_lead.format(*map(str, r[:-1]))).rstrip())
        if r is not header and str(r[-1]):
            out += wrap(f"{header[-1]}: {r[-1]}", width, initial_indent="   ", subsequent_indent="     ")
    return out


def _pair(change: dict[str, Any], unit: str) -> str:
    return f"{fmt(change['base'], unit)} → {fmt(change['new'], unit)}"


def fmt(value: Any, unit: str) -> str:
    """Table cells: µs without the unit (the column header has it), the rest through units."""
    if unit == "µs" and isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:,.1f}"
    return fmt_unit(value, unit)


def pct(value: float | None, signed_: bool = True) -> str:
    if value is None:
        return "–"
    return f"{value:+.1f}%" if signed_ else f"{value:.1f}%"


def signed(value: float) -> str:
    return f"{value:+,.1f}"
