"""Predicted against measured: for each finding of the BEFORE run, the gain its fix was predicted
to bring (its evidence's ``prediction``, analyzer.whatif.prediction) beside the change measured
in the AFTER run, so that users audit the models on their own jobs (``tracecliff diff``).

The measured change is the typical step's (the job model's, as the verdict quotes it) and, leaf
by leaf, the time of the leaves the finding said its fix gives back (``recovers``). It is all that
changed between the runs: a prediction is checked by it when the finding's fix is the change made
(``resolved``: the rule no longer fires in AFTER); several fixes applied at once add up.
"""

from __future__ import annotations

from typing import Any

from analyzer.job.model import LEAVES
from analyzer.base.numbers import finite


def prediction_checks(base: Any, new: Any) -> dict[str, Any]:
    """The ``predictions`` section of the diff document."""
    before, after = base.model.typical, new.model.typical
    if before is None or after is None:
        return {"available": False, "reason": "a run has no typical step (no GPU steps in its traces)",
                "findings": []}
    step_b, step_a = before.leaves.step_time_us, after.leaves.step_time_us
    measured_leaves = {leaf: getattr(before.leaves, leaf) - getattr(after.leaves, leaf) for leaf in LEAVES}
    still = {f.get("rule") for f in new.findings}
    rows = [_check(f, step_b, step_a, measured_leaves, f.get("rule") in still)
            for f in base.findings if not str(f.get("title") or "").startswith("rule ")]
    same_scale = (base.job.get("world_size") or len(base.ranks)) == (new.job.get("world_size") or len(new.ranks))
    return {
        "available": True, "per": "typical step, mean over ranks",
        "base_step_time_us": step_b, "new_step_time_us": step_a, "measured_gain_us": step_b - step_a,
        "same_scale": same_scale,
        "note": ("the measured change is everything that changed between the runs: a prediction is checked when "
                 "its finding's fix is the change made (status resolved); fixes applied together add up"
                 + ("" if same_scale else "; the runs differ in size, so the change includes the scaling")),
        "findings": rows,
    }


def _check(finding: dict[str, Any], step_b: float, step_a: float, measured_leaves: dict[str, float],
           persisting: bool) -> dict[str, Any]:
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), dict) else {}
    prediction = evidence.get("prediction") if isinstance(evidence.get("prediction"), dict) else {}
    gain = finite(finding.get("estimated_gain_us"))
    predicted_step = finite(prediction.get("predicted_step_time_us"))
    if predicted_step is None and gain is not None:  # a result written before predictions
        predicted_step = step_b - gain
    recovers = finding.get("recovers") if isinstance(finding.get("recovers"), dict) else {}
    leaves = {leaf: {"predicted_us": finite(value), "measured_us": measured_leaves[leaf]}
              for leaf, value in recovers.items() if leaf in measured_leaves}
    measured_gain = step_b - step_a
    row: dict[str, Any] = {
        "rule": finding.get("rule"), "title": finding.get("title"), "severity": finding.get("severity"),
        "status": "persisting" if persisting else "resolved",
        "predicted_gain_us": gain, "predicted_step_time_us": predicted_step,
        "measured_gain_us": measured_gain, "measured_step_time_us": step_a,
        # the prediction's error on the step after the fix, as docs/models.md §8 audits it
        "error_pct": None if predicted_step is None or not step_a else 100.0 * (predicted_step - step_a) / step_a,
        "recovered_leaves": leaves,
        "measured_recovered_us": sum(v["measured_us"] for v in leaves.values()) if leaves else None,
        "model": prediction.get("model"), "whatif": prediction.get("whatif"),
        "why_no_gain": prediction.get("why_no_gain") if gain is None else None,
    }
    return row


