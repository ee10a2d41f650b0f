"""The document of what a finding's fix is worth (``evidence["prediction"]``), as plain data:
``predicted`` (the typical step after the fix, the model that predicts it, its assumptions, the
``tracecliff whatif`` command that reproduces it), ``not_predicted`` (why there is none, e.g.
``NO_MODEL``) and one ``alternative`` of the several fixes a finding weighs. Pure builders: the
models that make the figures are the rules' own and the gain engine's (analyzer.job.gains,
implemented by analyzer.whatif.gains).
"""

from __future__ import annotations

from typing import Any, Protocol

NO_MODEL = "no model for this fix"


class ProjectedFix(Protocol):
    """A fix the what-if projection made (analyzer.whatif.prediction.Projected), as a finding
    quotes it: its what-if fields, gain, command, model, projected step and assumptions."""

    @property
    def changes(self) -> dict[str, Any]: ...

    @property
    def gain_us(self) -> float: ...

    @property
    def command(self) -> str: ...

    @property
    def model(self) -> str: ...

    def step_after(self, step_us: float) -> float: ...

    def assumptions(self) -> dict[str, Any]: ...


def predicted(step_us: float, gain_us: float, model: str, assumptions: dict[str, Any] | None = None,
              whatif: str | None = None, alternatives: list[dict[str, Any]] | None = None,
              step_after_us: float | None = None, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The prediction of a finding with a gain: the typical step after the fix (``step_after_us``
    when the model predicts a slower step, whose gain is then 0); ``changes``: the what-if
    scenario fields of the fix when the projection made it (the scaling curve's fix series)."""
    after = step_us - gain_us if step_after_us is None else step_after_us
    out: dict[str, Any] = {"predicted_step_time_us": round(after, 1), "gain_us": round(gain_us, 1),
                           "model": model, "assumptions": assumptions or {}, "whatif": whatif}
    if alternatives is not None:
        out["alternatives"] = alternatives
    if changes is not None:
        out["changes"] = dict(changes)
    return out


def not_predicted(reason: str, alternatives: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The prediction of a finding without a gain: why there is none."""
    out: dict[str, Any] = {"predicted_step_time_us": None, "why_no_gain": reason}
    if alternatives is not None:
        out["alternatives"] = alternatives
    return out



def alternative(label: str, step_us: float, fix: ProjectedFix | None, reason: str | None = None) -> dict[str, Any]:
    """One fix a finding weighs, with its projected typical step (or why it has none)."""
    if fix is None:
        return {"fix": label, "projected_step_time_us": None, "gain_us": None, "whatif": None,
                "why_no_gain": reason or "the what-if projection cannot make this change on this trace"}
    return {"fix": label, "projected_step_time_us": round(fix.step_after(step_us), 1), "gain_us": round(fix.gain_us, 1),
            "whatif": fix.command, "changes": dict(fix.changes)}
