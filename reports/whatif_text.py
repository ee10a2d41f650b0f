"""Text view of ``tracecliff whatif`` (the dict of a Projection)."""

from __future__ import annotations

from typing import Any


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
    lines += ["", "Assumptions (value, origin: source):"]
    for key, item in sorted(doc["assumptions"].items()):
        lines.append(f"  {key}: {item['value']} ({item['origin']}: {item['source']})")
    lines += [f"note: {n}" for n in doc["notes"]]
    lines += [f"warning: {w}" for w in doc.get("warnings") or []]
    return "\n".join(lines) + "\n"
