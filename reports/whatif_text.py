"""Text view of ``tracecliff whatif`` (the dict of a Projection)."""

from __future__ import annotations

from typing import Any

from analyzer.base.units import fmt_us
from analyzer.reports.evidence import fmt_field, label, unit_of


def render_text(doc: dict[str, Any]) -> str:
    m, p = doc["measured"], doc["projected"]
    lines = [f"What-if: {m['gpus']} -> {p['gpus']} GPUs "
             f"({doc['assumptions']['measured_strategy']['value']} -> {doc['assumptions']['strategy']['value']})",
             f"{'':<22} {'measured':>14} {'projected':>14}"]
    for title, key in (("step time (µs)", "step_time_us"), ("exposed comm (µs)", "exposed_comm_us"),
                       ("compute (µs)", "compute_us")):
        lines.append(f"{title:<22} {m[key]:>14,.0f} {p[key]:>14,.0f}")
    if p.get("scaling_efficiency") is not None:
        lines.append(f"{'scaling efficiency':<22} {'1.00':>14} {p['scaling_efficiency']:>14.2f}")
    if m.get("mfu") is not None:
        lines.append(f"{'MFU':<22} {100 * m['mfu']:>13.1f}% {100 * p['mfu']:>13.1f}%")
    model = p.get("compute_model")
    if model:
        lines += ["", f"Compute at {model['factor']:g}x the work per GPU (strong scaling, typical step, mean over ranks):",
                  f"  measured {model['measured_us']:,.0f} µs (ops with FLOPs {model['flop_kernels_us']:,.0f} µs, "
                  f"optimizer {model['optimizer_us']:,.0f} µs); perfect scaling {model['perfect_scaling_us']:,.0f} µs; "
                  f"at the efficiency measured per shape {model['projected_us']:,.0f} µs"]
    lines += ["", "Assumptions (value, origin: source):"]
    for key, item in sorted(doc["assumptions"].items()):
        lines.append(f"  {key}: {_value(key, item['value'])} ({item['origin']}: {item['source']})")
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
    fixed = ", ".join(f"rank {r} ({doc['causes'][str(r)]})" for r in doc["ranks"])
    return (f"Replay with {fixed} fixed: typical step {fmt_us(doc['step_time_us'])} -> "
            f"{fmt_us(doc['predicted_step_time_us'])} (saves {fmt_us(doc['gain_us'])}; {doc['model']})\n")
