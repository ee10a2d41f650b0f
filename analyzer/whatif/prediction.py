"""What a finding's fix is worth, as its evidence states it (``evidence["prediction"]``): the
typical step predicted once the fix is applied, the model that predicts it and that model's
assumptions, the ``tracecliff whatif`` command that reproduces it when the what-if projection
makes it, and, where the finding weighs several fixes, each alternative with its projected step;
or, when a finding has no gain, why.

A prediction from the what-if projection is the change it projects for the fix against its own
projection of the job as measured (so that the model's residual on this job cancels), turned into
the step's change by the replay of the measured job (analyzer.whatif.counterfactual) and applied to
the typical step: the projected step ``tracecliff whatif TRACES <options>`` prints (``whatif_doc``).
The verdict's joint estimate replays every finding's fix at once (``joint_replay``).
``tracecliff diff BEFORE AFTER`` puts each prediction of BEFORE beside the change measured.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from analyzer.base.errors import TracecliffError
from analyzer.base.memo import memo
from analyzer.job.prediction_doc import predicted
from analyzer.whatif.projection import Measured, Projection, Scenario, project
from analyzer.base.errors import ConfigError
from analyzer.whatif.counterfactual import EXPOSED_CUT, replayed_change

# The what-if projection, as a prediction names it (its module docstring and docs/models.md §8 say more).
WHATIF_MODEL = "what-if projection (measured transfers × α-β link ratio, replayed on the measured compute; docs/models.md §2, §4, §5)"
# ``tracecliff whatif`` options, by Scenario field (analyzer/cli/whatif.py)
WHATIF_OPTIONS = {"gpus": "--gpus", "nodes": "--nodes", "gpus_per_node": "--target-gpus-per-node",
                  "nics_per_node": "--target-nics-per-node", "nic_gbps": "--target-nic-gbps",
                  "strategy": "--strategy", "bucket_mb": "--bucket-mb", "fsdp_units": "--fsdp-units"}
# The projection's assumptions a prediction quotes besides the options it sets.
_QUOTED_ASSUMPTIONS = ("measured_strategy", "measured_nics_per_node", "measured_nic_gbps", "intra_link",
                       "cross_node_link", "compute")


def whatif_command(changes: dict[str, Any]) -> str:
    """The command line that projects ``changes`` (Scenario fields) on the measured traces."""
    options = " ".join(f"{WHATIF_OPTIONS[key]} {_option_value(value)}" for key, value in changes.items())
    return f"tracecliff whatif TRACES {options}".rstrip()


def _option_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Projected:
    """One fix as the what-if projection sees it: the step-time change (µs, negative = faster)
    against the projection of the job as measured, and the projection itself."""

    changes: dict[str, Any]
    change_us: float
    projection: Projection
    engine: str | None = None  # the replay's counterfactual that turned the projection into the change
    replay_fix: Any = None  # that counterfactual (analyzer.whatif.replay.ReplayFix), for the joint estimate

    @property
    def gain_us(self) -> float:
        return max(0.0, -self.change_us)

    @property
    def command(self) -> str:
        return whatif_command(self.changes)

    @property
    def model(self) -> str:
        """The prediction's model: the projection, and the replay that turned it into the step."""
        return WHATIF_MODEL + (f"; the step from the {self.engine}" if self.engine else "")

    def step_after(self, step_us: float) -> float:
        """The typical step with this fix: ``step_us`` + the projected change (a slower step
        where the model projects one): the projected step ``tracecliff whatif`` prints."""
        return step_us + self.change_us

    def assumptions(self) -> dict[str, Any]:
        """The assumptions of the projection this fix rests on: the options it sets, then the
        measured configuration and links it projects from."""
        quoted = [key for key in self.changes if key in self.projection.assumptions]
        quoted += [key for key in _QUOTED_ASSUMPTIONS if key in self.projection.assumptions and key not in quoted]
        return {key: self.projection.assumptions[key] for key in quoted}


class WhatIf:
    """The what-if projections of one Result's fixes, sharing its measured schedules and its
    projection as measured (a finding weighing several fixes projects the job once per fix)."""

    def __init__(self, result: Any):
        self.result = result
        self._measured = Measured.of(result)
        self._base: Projection | None | bool = False  # not yet projected
        self._fixes: dict[tuple, Projected | None] = {}

    @classmethod
    def of(cls, result: Any) -> WhatIf:
        """The WhatIf kept on ``result`` for the run: every finding's fix is projected against
        one projection of the job as measured, from one set of measured schedules."""
        return memo(result, "whatif", lambda: cls(result), Measured.of(result))

    @property
    def as_measured(self) -> Projection | None:
        """The projection of the job as measured; None when the projection cannot make it."""
        if self._base is False:
            self._base = self._project(Scenario())
        return self._base  # type: ignore[return-value]

    def measured(self, key: str) -> Any:
        """The value of one of the projection's assumptions about the measured job (e.g.
        ``measured_nics_per_node``), None when it cannot project the job."""
        base = self.as_measured
        return None if base is None else (base.assumptions.get(key) or {}).get("value")

    def fix(self, **changes: Any) -> Projected | None:
        """The projected change of ``changes`` (Scenario fields); None when the projection cannot
        make it (the trace or the change is outside its model)."""
        unknown = set(changes) - {f.name for f in fields(Scenario)}
        if unknown:
            raise ValueError(f"not a what-if scenario field: {sorted(unknown)}")
        base = self.as_measured
        base_step = None if base is None else base.projected.get("step_time_us")
        if base_step is None:
            return None
        key = tuple(sorted(changes.items()))
        if key not in self._fixes:
            self._fixes[key] = self._fix(changes, float(base_step))
        return self._fixes[key]

    def _fix(self, changes: dict[str, Any], base_step: float) -> Projected | None:
        scenario = Scenario(**changes)
        projection = self._project(scenario)
        step = None if projection is None else projection.projected.get("step_time_us")
        if step is None:
            return None
        change, engine, fix = replayed_change(self.result, scenario, float(step) - base_step)
        return Projected(dict(changes), change, projection, engine, fix)  # type: ignore[arg-type]

    def _project(self, scenario: Scenario) -> Projection | None:
        try:
            return project(self.result, scenario, self._measured)
        except (TracecliffError, ValueError):
            return None


OWN_SCHEDULE = "the rule's own schedule (the what-if model cannot project this trace)"
WHATIF_SOURCE = "the what-if model (tracecliff whatif), measured configuration as reference"


def what_if_or_own(result: Any, step_us: float, own_gain_us: float, own_model: str,
                   own_assumptions: dict[str, Any] | None = None, **changes: Any) -> tuple[float, str, dict[str, Any]]:
    """(gain µs, where from, prediction) of a fix the what-if projection expresses as ``changes``:
    its projection when it can project the trace (the gain ``tracecliff whatif`` reproduces),
    else the rule's own estimate ``own_gain_us`` from ``own_model``."""
    fix = WhatIf.of(result).fix(**changes)
    if fix is None:
        return own_gain_us, OWN_SCHEDULE, predicted(step_us, own_gain_us, own_model, own_assumptions)
    return fix.gain_us, WHATIF_SOURCE, predicted(step_us, fix.gain_us, fix.model,
                                                 {**(own_assumptions or {}), **fix.assumptions()}, fix.command,
                                                 step_after_us=fix.step_after(step_us), changes=fix.changes)


TYPICAL_STEP = "the report's typical step (diagnose's step_time_us)"


def whatif_doc(result: Any, scenario: Scenario, projection: Projection | None = None,
               base: Projection | None = None) -> dict[str, Any]:
    """``tracecliff whatif``'s document: the projection of ``scenario``, its step times on the
    report's scale, the one computation a finding's prediction makes (``WhatIf.fix``): the
    measured step is the report's typical step and the projected one that step + the change
    the model projects against its own projection of the job as measured (``scenario`` less
    its target fields), so the command a finding prints gives the finding's predicted step. The
    model's own figures stay, labelled ``model_step_time_us``. ``projection`` / ``base``: those
    two projections when made already (the report's scaling curve)."""
    measured = Measured.of(result)
    projection = projection or project(result, scenario, measured)
    base_scenario = Scenario(model_params=scenario.model_params, tokens_per_step=scenario.tokens_per_step,
                             trace_nics_per_node=scenario.trace_nics_per_node)
    base = base or (projection if scenario == base_scenario else project(result, base_scenario, measured))
    doc = projection.to_dict()
    typical = result.model.step_time_us
    m, p = doc["measured"], doc["projected"]
    if typical is None or p.get("step_time_us") is None or base.projected.get("step_time_us") is None:
        raise ConfigError("no typical step to project from (no GPU step times)")
    m["model_step_time_us"], p["model_step_time_us"] = m["step_time_us"], p["step_time_us"]
    change, engine, _ = replayed_change(result, scenario, float(p["step_time_us"]) - float(base.projected["step_time_us"]))
    m["step_time_us"], p["step_time_us"] = round(typical, 1), round(typical + change, 1)
    m["step_time_source"] = TYPICAL_STEP
    p["step_time_source"] = ("the typical step + the change: " + engine if engine else
                             "the typical step + the projected change (this projection less the projection of the job "
                             "as measured)")
    p["scaling_efficiency"] = round(typical / (typical + change), 4) if typical + change > 0 else None
    doc["notes"].insert(0, f"step time: measured = the report's typical step; projected = it {change:+,.1f} µs, "
                           f"{'by the ' + engine if engine else 'the change the projection makes'} (the projection's own steps: "
                           f"{m['model_step_time_us']:,.1f} µs as measured, "
                           f"{base.projected['step_time_us']:,.1f} µs projected as measured, "
                           f"{p['model_step_time_us']:,.1f} µs projected); exposed comm and compute are the "
                           "projection's means over every rank-step")
    for side, model_step in ((m, m["model_step_time_us"]), (p, p["model_step_time_us"])):
        if side.get("mfu") is not None and model_step and side["step_time_us"]:  # MFU ∝ 1 / step time
            side["mfu"] = round(side["mfu"] * model_step / side["step_time_us"], 6)
    return doc


def joint_replay(result: Any, findings: list[dict[str, Any]]) -> tuple[float, tuple[str, ...]] | None:
    """(what the findings' fixes save applied at once on the replay, the rules whose fix it
    applies): a finding's fix as its prediction states it, in plain data: the what-if fields it
    projects (``changes``: ``WhatIf.fix``'s counterfactual) or the ranks it fixes by cause
    (``assumptions.fixed``: straggler-rank, gpu-idle-host-bound). None: the job cannot be
    replayed or no finding's fix is a counterfactual of it."""
    from analyzer.whatif.counterfactual import Replayer, union
    gained = [f for f in findings if f.get("estimated_gain_us") and _is_counterfactual(f)]
    if not gained:  # no chains to build: nothing to replay (the heavy job's one own-model finding)
        return None
    replayer = Replayer.of(result)
    if not replayer.ok or replayer.chains is None:
        return None
    fixes, rules = [], []
    for f in gained:
        found = _finding_fixes(result, replayer, (f.get("evidence") or {}).get("prediction") or {})
        if found:
            fixes += found
            rules.append(str(f["rule"]))
    if not fixes:
        return None
    return replayer.saving(union(replayer.chains, fixes)), tuple(rules)


def _is_counterfactual(finding: dict[str, Any]) -> bool:
    """Whether the finding's prediction states its fix as one the replay can apply."""
    prediction = (finding.get("evidence") or {}).get("prediction") or {}
    assumptions = prediction.get("assumptions") or {}
    return bool(prediction.get("changes")) or EXPOSED_CUT in assumptions or isinstance(assumptions.get("fixed"), dict)


def _finding_fixes(result: Any, replayer: Any, prediction: dict[str, Any]) -> list[Any]:
    changes = prediction.get("changes")
    if isinstance(changes, dict) and changes:
        fix = WhatIf.of(result).fix(**changes)
        return [fix.replay_fix] if fix is not None and fix.replay_fix is not None else []
    assumptions = prediction.get("assumptions") or {}
    cut = (assumptions.get(EXPOSED_CUT) or {}).get("value")
    if isinstance(cut, (int, float)) and cut > 0:
        return [replayer.exposed_fix(float(cut))]
    fixed = assumptions.get("fixed")
    if isinstance(fixed, dict):
        return [fix for rank, cause in sorted(fixed.items()) if (fix := replayer.cause_fix(int(rank), str(cause)))]
    return []
