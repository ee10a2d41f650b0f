"""Text view of ``tracecliff whatif`` (the dict of a Projection)."""

from __future__ import annotations

from typing import Any

from analyzer.base.units import fmt_us
from analyzer.reports.evidence import fmt_field, label, unit_of
from analyzer.reports.wrap import WIDTH, wrap


def figure_rows(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, measured, projected) of a projection, as the text and HTML views show them.
    Scaling efficiency only where the GPU count changes: at the same size the ratio of the step
    times is a speed-up, and says so."""
    m, p = doc["measured"], doc["projected"]
    rows = [(title, f"{m[key]:,.0f}", f"{p[key]:,.0f}") for title, key in (
        ("step time (µs)", "step_time_us"), ("exposed comm (µs)", "exposed_comm_us"), ("compute (µs)", "compute_us"))]
    if p.get("scaling_efficiency") is not None:
        if m["gpus"] != p["gpus"]:
            rows.append(("scaling efficiency", "1.00", f"{p['scaling_efficiency']:.2f}"))
        else:
            rows.append(("speed-up (same GPUs)", "1.00×", f"{p['scaling_efficiency']:.2f}×"))
    if m.get("mfu") is not None:
        rows.append(("MFU", f"{100 * m['mfu']:.1f}%", f"{100 * p['mfu']:.1f}%"))
    return rows


def assumption_lines(assumptions: dict[str, Any]) -> list[tuple[str, str]]:
    """(values, why) per origin and source: the assumptions that share one (the profile's
    datasheet line, "as measured") are listed together and the sentence said once."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for key, item in sorted(assumptions.items()):
        grouped.setdefault((str(item["origin"]), str(item["source"])), []).append(
            f"{key} {_value(key, item['value'])}")
    return [("; ".join(values), f"{origin}: {source}") for (origin, source), values in grouped.items()]


def title(doc: dict[str, Any]) -> str:
    m, p = doc["measured"], doc["projected"]
    return (f"What-if: {m['gpus']} -> {p['gpus']} GPUs "
            f"({doc['assumptions']['measured_strategy']['value']} -> {doc['assumptions']['strategy']['value']})")


def render_text(doc: dict[str, Any]) -> str:
    p = doc["projected"]
    lines = [title(doc), f"{'':<22} {'measured':>14} {'projected':>14}"]
    lines += [f"{title:<22} {base:>14} {new:>14}" for title, base, new in figure_rows(doc)]
    model = p.get("compute_model")
    if model:
        lines += ["", f"Compute at {model['factor']:g}x the work per GPU (strong scaling, typical step, mean over ranks):",
                  f"  measured {model['measured_us']:,.0f} µs (ops with FLOPs {model['flop_kernels_us']:,.0f} µs, "
                  f"optimizer {model['optimizer_us']:,.0f} µs); perfect scaling {model['perfect_scaling_us']:,.0f} µs; "
                  f"at the efficiency measured per shape {model['projected_us']:,.0f} µs"]
    lines += ["", "Assumptions (values; origin: source, said once for the values that share it):"]
    for values, why in assumption_lines(doc["assumptions"]):
        lines += wrap(f"{values} ({why})", WIDTH, initial_indent="  ", subsequent_indent="    ")
    lines += [f"note: {n}" for n in doc["notes"]]
    lines += [f"warning: {w}" for w in doc.get("warnings") or []]
    return "\n".join(lines) + "\n"


def _value(key: str, value: Any) -> str:
    """An assumption's value with its unit (a link as "alpha 0.8 µs, beta 450.0 GB/s"), never a
    raw structure or None."""
    if isinstance(value, dict):
        return ", ".join(f"{label(k)} {fmt_field(v, unit_of(k))}" for k, v in sorted(value.items()))
    return fmt_field(value, unit_of(key))


def render_replay_text(doc: dict[str, Any]) -> str:
    """``tracecliff whatif --fix-ranks``: the replayed typical step with those ranks fixed."""
    return replay_sentence(doc) + "\n"


def replay_sentence(doc: dict[str, Any]) -> str:
    fixed = ", ".join(f"rank {r} ({doc['causes'][str(r)]})" for r in doc["ranks"])
    return (f"Replay with {fixed} fixed: typical step {fmt_us(doc['step_time_us'])} -> "
            f"{fmt_us(doc['predicted_step_time_us'])} (saves {fmt_us(doc['gain_us'])}; {doc['model']})")
