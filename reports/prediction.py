"""A finding's prediction (its evidence's ``prediction``, analyzer.whatif.prediction) as the
text report, the HTML card and the diff show it: the predicted step, the model, its assumptions
as short ``name: value`` entries, the what-if command, each alternative, or why there is no gain."""

from __future__ import annotations

from typing import Any

from analyzer.base.units import fmt_us
from analyzer.reports.evidence import fmt_field, label, unit_of
from analyzer.base.numbers import is_finite_number as _number


def prediction_view(prediction: Any, step_us: float | None) -> dict[str, Any] | None:
    """``{step, after, gain, model, assumptions, whatif, alternatives, why}`` of a prediction, its
    figures as text; None when the finding has none (a document written before predictions)."""
    if not isinstance(prediction, dict):
        return None
    after = prediction.get("predicted_step_time_us")
    alternatives = [{"fix": str(a.get("fix") or ""),
                     "after": fmt_us(a["projected_step_time_us"]) if _number(a.get("projected_step_time_us")) else None,
                     "whatif": a.get("whatif") or "", "why": a.get("why_no_gain") or ""}
                    for a in prediction.get("alternatives") or [] if isinstance(a, dict)]
    return {
        "step": fmt_us(step_us) if _number(step_us) else None,
        "after": fmt_us(after) if _number(after) else None,
        "gain": fmt_us(prediction["gain_us"]) if _number(prediction.get("gain_us")) else None,
        "model": str(prediction.get("model") or ""),
        "assumptions": assumption_entries(prediction.get("assumptions")),
        "whatif": str(prediction.get("whatif") or ""),
        "alternatives": alternatives,
        "why": str(prediction.get("why_no_gain") or ""),
    }


def assumption_entries(assumptions: Any) -> list[str]:
    """``name: value (origin)`` per assumption (a what-if assumption is {value, origin, source})."""
    if not isinstance(assumptions, dict):
        return []
    out = []
    for key, item in sorted(assumptions.items(), key=lambda kv: str(kv[0])):  # saved JSON sorts its keys
        value, origin = (item.get("value"), item.get("origin")) if isinstance(item, dict) and "value" in item \
            else (item, None)
        if isinstance(value, dict):
            text = ", ".join(f"{label(k)} {fmt_field(v, unit_of(k))}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                             if not isinstance(v, (dict, list)))
        else:
            text = fmt_field(value, unit_of(key))
        out.append(f"{label(key)}: {text}" + (f" ({origin})" if origin else ""))
    return out


