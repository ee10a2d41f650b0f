"""CI performance gate: Lighthouse-CI style assertions on a run's metrics and findings, plus a
baseline comparison that fails on regressions, and never passes a run it could not measure.

Configuration (``[tool.tracecliff.gate]`` of ./pyproject.toml, or of ``--config FILE``)::

    [tool.tracecliff.gate]
    preset = "recommended"          # optional: "recommended" | "strict"
    max_regression_pct = 5.0        # against --baseline: % of the baseline figure (every metric)
    max_regression_pp = 2.0         # shares of the step: smallest regression that counts, in points
    noise_sigmas = 3.0              # a change within this many σ of the step-to-step noise is noise
    [tool.tracecliff.gate.max_regression_pct_by_metric]
    "step_time_us" = 3.0
    [tool.tracecliff.gate.assertions]
    "exposed_comm_pct" = ["error", { max = 10.0 }]       # the typical step's, as the verdict
    "overlap_pct" = ["warning", { min = 60.0 }]   # "warn" is read as "warning"
    "rule:ddp-bucket-oversized" = "error"

A metric assertion is ``[level, {min?, max?, aggregate?, allow_unavailable?}]``; a rule
assertion is ``level`` or ``[level, {max?, severity?, allow_unavailable?}]`` and fails when the
run has more than ``max`` (default 0) findings of that rule at or above ``severity`` (default:
any). A metric the run cannot measure (or a rule that did not run) fails an error-level
assertion -- a gate must not pass on data it never saw -- unless ``allow_unavailable = true``,
which skips it.

Against a baseline, a metric the baseline has and the new run lacks fails, with the reason; a
share compares in percentage points of the step, every other metric relatively; the threshold of
each comparison is the largest of the configured limit, the metric's floor and ``noise_sigmas``
times the runs' own step-to-step variation (analyzer.compare.metrics.spread: the larger of the
two; unknown, and no term, when neither run has three steady steps), and the report says which
one it used. A figure that cannot be a measurement (a share outside 0-100 %, a bus bandwidth above its
link's peak) is reported as suspect and not gated; a metric the two runs' GPU, world size or nodes
make incomparable is not compared, and the report says so. The run's own checks come first: the
steps ``--steps`` asked for are in the traces, and the run measured GPU steps at all.

Exit codes: 0 pass (warnings allowed), 1 an error-level assertion or a baseline comparison failed,
2 usage, input or configuration error.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

import msgspec

from analyzer.base.config import SEVERITIES, SEVERITY_ORDER, closest, config_error, validate
from analyzer.base.units import fmt_metric
from analyzer.compare.gate_report import (EXIT_FAIL, EXIT_PASS, STATUSES, Check, GateReport,  # noqa: F401  (re-exported)
                                          GateThreshold, change_text)
from analyzer.compare.metrics import (AGGREGATIONS, BASE_METRICS, DEFAULT_AGGREGATE, GROUP_METRIC, METRIC_NAMES,
                                      NOISE_MIN_CHANGES, Metric, has_gpu_activity, implausible, no_gpu_reason, metric_spec,
                                      requested_steps_missing, run_metrics, selected_nothing, spread, steps_text,
                                      unavailable_reason, unmeasured_metrics)

LEVELS = ("off", "warning", "error")
# Defaults of the baseline comparison (docs/ci.md, "Noise-aware thresholds" says why these).
DEFAULT_MAX_REGRESSION_PCT = 5.0
DEFAULT_MAX_REGRESSION_PP = 2.0
DEFAULT_NOISE_SIGMAS = 3.0

# Presets: defaults a project's own assertions override key by key. Metric entries skip
# quietly when the run cannot measure them (single GPU: no overlap to speak of).
_PRESET_METRICS = {
    "recommended": {
        "exposed_comm_pct": ["warning", {"max": 20.0, "allow_unavailable": True}],
        "overlap_pct": ["warning", {"min": 50.0, "allow_unavailable": True}],
        "idle_pct": ["warning", {"max": 30.0, "allow_unavailable": True}],
    },
    "strict": {
        "exposed_comm_pct": ["error", {"max": 10.0, "allow_unavailable": True}],
        "overlap_pct": ["error", {"min": 70.0, "allow_unavailable": True}],
        "idle_pct": ["error", {"max": 20.0, "allow_unavailable": True}],
    },
}
_PRESET_RULE_LEVEL = {"recommended": "warning", "strict": "error"}
PRESETS = tuple(sorted(_PRESET_METRICS))


@dataclass(frozen=True)
class Assertion:
    key: str  # as written: "exposed_comm_pct", "rule:straggler-rank"
    level: str
    min: float | None = None
    max: float | None = None
    aggregate: str = DEFAULT_AGGREGATE
    allow_unavailable: bool = False
    severity: str | None = None  # rule assertions: count findings at or above this severity

    @property
    def rule(self) -> str | None:
        return self.key[5:] if self.key.startswith("rule:") else None


@dataclass(frozen=True)
class GateConfig:
    assertions: tuple[Assertion, ...] = ()
    max_regression_pct: float = DEFAULT_MAX_REGRESSION_PCT
    regression_by_metric: dict[str, float] = field(default_factory=dict)
    preset: str | None = None
    max_regression_pp: float = DEFAULT_MAX_REGRESSION_PP
    noise_sigmas: float = DEFAULT_NOISE_SIGMAS

    def regression_limit(self, metric: str) -> float:
        return self.regression_by_metric.get(metric, self.max_regression_pct)


# ---------------------------------------------------------------- configuration
# The gate table as typed structs, checked by the one validator (analyzer.base.config.validate).


class MetricOptions(msgspec.Struct, forbid_unknown_fields=True):
    min: float | None = None
    max: float | None = None
    aggregate: Literal[AGGREGATIONS] = DEFAULT_AGGREGATE  # type: ignore[valid-type]
    allow_unavailable: bool = False


class RuleOptions(msgspec.Struct, forbid_unknown_fields=True):
    max: Annotated[int, msgspec.Meta(ge=0, description="findings allowed")] = 0
    severity: Literal["info", "warning", "error"] | None = None  # count findings at or above it
    allow_unavailable: bool = False


# "warn" is the old spelling of "warning": read, never written.
Level = Literal["off", "warning", "warn", "error"]
# An assertion is "level" or [level, {options}] ([level] reads as [level, {}]); the options are
# checked by the assertion's kind (MetricOptions, RuleOptions).
AssertionEntry = Union[Level, tuple[Level, dict[str, Any]]]


def _either_options() -> Any:
    """For the published schema: options of either kind (the union of both structs' keys);
    parse_assertion checks each entry against its own kind."""
    fields: dict[str, tuple[str, Any, Any]] = {}
    for struct in (MetricOptions, RuleOptions):
        for f in msgspec.structs.fields(struct):
            fields.setdefault(f.encode_name, (f.name, f.type, f.default))
    return msgspec.defstruct("AssertionOptions", list(fields.values()), forbid_unknown_fields=True)


AssertionValue = Union[Level, Annotated[list[Union[Level, _either_options()]],  # type: ignore[misc]
                                        msgspec.Meta(min_length=1, max_length=2)]]
RegressionPct = Annotated[float, msgspec.Meta(ge=0, description="allowed regression, % of the baseline")]


class GateTable(msgspec.Struct, forbid_unknown_fields=True):
    """``[tool.tracecliff.gate]``."""

    preset: Literal[PRESETS] | None = None  # type: ignore[valid-type]
    max_regression_pct: RegressionPct = DEFAULT_MAX_REGRESSION_PCT
    max_regression_pp: Annotated[float, msgspec.Meta(ge=0, description=(
        "share metrics (exposed_comm_pct, idle_pct, overlap_pct): smallest regression that counts, "
        "in percentage points of the step"))] = DEFAULT_MAX_REGRESSION_PP
    noise_sigmas: Annotated[float, msgspec.Meta(ge=0, description=(
        "a change within this many σ of the runs' own step-to-step variation (the larger) is "
        "noise"))] = DEFAULT_NOISE_SIGMAS
    max_regression_pct_by_metric: dict[str, RegressionPct] = {}
    assertions: Annotated[dict[str, AssertionValue], msgspec.Meta(description=(
        '"<metric>" = [level, {min?, max?, aggregate?, allow_unavailable?}] or "rule:<name>" = level | '
        "[level, {max?, severity?, allow_unavailable?}]; level: off, warning (or warn), error"))] = {}


def parse_gate_config(tool: dict[str, Any], preset: str | None = None,
                      max_regression_pct: float | None = None,
                      rule_names: list[str] | None = None, source: str = "configuration") -> GateConfig:
    """Validate ``[tool.tracecliff]``'s gate table; ``preset`` / ``max_regression_pct`` (command
    line) win over the file. ``rule_names``: the registered rules (None: not checked)."""
    raw = tool.get("gate", {})
    written: dict[str, Assertion] = {}
    # Dict entries one by one first: msgspec does not name the key of a bad dict value.
    if isinstance(raw, dict):
        by_metric = raw.get("max_regression_pct_by_metric")
        for name, value in by_metric.items() if isinstance(by_metric, dict) else ():
            where = ["gate", "max_regression_pct_by_metric", name]
            _check_metric_name(name, source, where)
            validate(value, RegressionPct, source, where)
        entries = raw.get("assertions")
        for key, value in entries.items() if isinstance(entries, dict) else ():
            written[key] = parse_assertion(key, value, rule_names, source)
    table = validate(raw, GateTable, source, "gate")
    preset = preset or table.preset
    limit = max_regression_pct if max_regression_pct is not None else table.max_regression_pct
    merged = {k: parse_assertion(k, v, rule_names, source) for k, v in _preset_entries(preset, rule_names).items()}
    merged.update(written)
    assertions = tuple(merged[k] for k in sorted(merged) if merged[k].level != "off")
    return GateConfig(assertions, float(limit), dict(table.max_regression_pct_by_metric), preset,
                      float(table.max_regression_pp), float(table.noise_sigmas))


def gate_keys() -> tuple[str, ...]:
    """The keys of ``[tool.tracecliff.gate]`` (for the configuration's "did you mean")."""
    return tuple(f.encode_name for f in msgspec.structs.fields(GateTable))


def _preset_entries(preset: str | None, rule_names: list[str] | None) -> dict[str, Any]:
    if preset is None:
        return {}
    entries: dict[str, Any] = dict(_PRESET_METRICS[preset])
    for name in rule_names or []:
        entries[f"rule:{name}"] = [_PRESET_RULE_LEVEL[preset], {"allow_unavailable": True}]
    return entries


def parse_assertion(key: str, value: Any, rule_names: list[str] | None,
                    source: str = "configuration") -> Assertion:
    path = ["gate", "assertions", key]
    if not isinstance(value, (str, list)) or isinstance(value, list) and len(value) not in (1, 2):
        raise config_error(source, path, 'expected "level" or ["level", {options}]')
    if isinstance(value, list) and len(value) == 1:
        value = [*value, {}]
    entry = validate(value, AssertionEntry, source, path)
    level, options = (entry, {}) if isinstance(entry, str) else entry
    level = "warning" if level == "warn" else level
    if key.startswith("rule:"):
        return _rule_assertion(key, level, options, rule_names, source, path)
    _check_metric_name(key, source, path)
    opts = validate(options, MetricOptions, source, path + ["1"])
    if level != "off" and opts.min is None and opts.max is None:
        raise config_error(source, path, "a metric assertion needs min and/or max")
    if opts.min is not None and opts.max is not None and opts.min > opts.max:
        raise config_error(source, path, f"min {opts.min} is above max {opts.max}")
    return Assertion(key, level, opts.min, opts.max, opts.aggregate, opts.allow_unavailable)


def _rule_assertion(key: str, level: str, options: dict[str, Any], rule_names: list[str] | None,
                    source: str, path: list[str]) -> Assertion:
    rule = key[5:]
    if not rule:
        raise config_error(source, path, "empty rule name")
    if rule_names is not None and rule not in rule_names:
        hint = closest(rule, rule_names)
        raise config_error(source, path, f"unknown rule {rule!r}" + (f" (did you mean `rule:{hint}`?)" if hint else "")
                           + "; see `tracecliff rules`")
    opts = validate(options, RuleOptions, source, path + ["1"])
    return Assertion(key, level, None, float(opts.max), "count", opts.allow_unavailable, opts.severity)


def _check_metric_name(name: str, source: str, path: list[str]) -> None:
    if metric_spec(name) is None:
        hint = closest(name, [*BASE_METRICS, GROUP_METRIC])
        hint = f"{GROUP_METRIC}:<group>" if hint == GROUP_METRIC else hint
        raise config_error(source, path, f"unknown gate metric {name!r}" + (f" (did you mean `{hint}`?)" if hint else "")
                           + f"; known: {', '.join(METRIC_NAMES)}, rule:<name>")


def registered_rule_names() -> list[str]:
    from analyzer.rules.engine import all_rules
    return sorted(all_rules())


# ---------------------------------------------------------------- evaluation


def evaluate(run: Any, config: GateConfig, baseline: Any = None, baseline_label: str | None = None,
             steps: Any = None, run_label: str | None = None) -> GateReport:
    """Check a run (a Result) against ``config`` and ``baseline`` (a Result); ``steps``: the
    ProfilerStep numbers the run was asked for (``--steps``), which must all be in it;
    ``run_label``: the run's paths as given, for the ``tracecliff diff`` command it prints."""
    who = "the new run" if baseline is not None else "the run"
    metrics = run_metrics(run)
    checks = run_checks(run, steps, who)
    checks.extend(check_assertion(run, metrics, a, steps) for a in config.assertions)
    if baseline is not None:
        compared = compare_baseline(run, baseline, config, steps, metrics)
        checks.append(baseline_check(run, baseline, compared))
        checks.extend(compared)
    for check in checks:
        check.unit = metric_unit(check.name)
    warnings = list(run.warnings or [])
    warnings += [f"baseline: {w}" for w in (baseline.warnings if baseline is not None else [])]
    if baseline is None:
        return GateReport(checks, baseline_label, warnings)
    from analyzer.compare.diff import grown_findings
    command = shlex.join(["tracecliff", "diff", baseline_label or "BASELINE", *(shlex.split(run_label) if run_label
                                                                                  else ["RUN"])])
    return GateReport(checks, baseline_label, warnings, grown_findings(baseline, run), command)


def run_checks(run: Any, steps: Any, who: str = "the run") -> list[Check]:
    """What the run measured, checked before any figure is: the requested steps are in its
    traces (with ``--steps``), and it has GPU steps at all. A run that selected no step, or
    recorded no GPU activity, fails: no figure of it can vouch for anything."""
    return ([_steps_check(run, steps)] if steps else []) + [_measured_check(run, steps, who)]


def _steps_check(run: Any, steps: Any) -> Check:
    missing = requested_steps_missing(run, steps)
    if not missing:
        status, message = "pass", f"{steps_text(steps)} in every rank's trace"
    elif selected_nothing(run, steps):
        status, message = "fail", f"{steps_text(missing)} not in the traces: --steps selected nothing"
    else:  # the steps missing from the same ranks together
        by_ranks: dict[tuple[int, ...], list[int]] = {}
        for step, ranks in sorted(missing.items()):
            by_ranks.setdefault(tuple(ranks), []).append(step)
        status, message = "fail", "; ".join(
            f"{steps_text(numbers)} not in the traces"
            + ("" if len(ranks) == len(run.model.ranks) else f" of rank(s) {_ranks_text(list(ranks))}")
            for ranks, numbers in by_ranks.items())
    return Check("run", "steps", "error", status, None, "in every rank's trace", None, message)


def _measured_check(run: Any, steps: Any, who: str) -> Check:
    typical = run.model.typical
    if steps and selected_nothing(run, steps):
        status, message = "fail", f"no step measured in {who}: --steps selected nothing"
    elif not has_gpu_activity(run):
        status, message = "fail", no_gpu_reason(run, who)
    elif typical is not None:
        status, message = "pass", (f"typical step {typical.step} of {len(typical.steady_steps)} steady step(s), "
                                   f"{typical.ranks} rank(s)")
    elif any(r.steps for r in run.model.ranks):
        status, message = "fail", f"no steady step measured on the GPU in {who}"
    else:
        status, message = "pass", "whole trace only (no ProfilerStep#N markers): shares over each rank's trace"
    return Check("run", "measured", "error", status, None, "GPU steps measured", None, message)


def _ranks_text(ranks: list[int]) -> str:
    return steps_text(ranks).partition(" ")[2]  # the same ranges: 0-3, 5


def check_assertion(run: Any, metrics: dict[str, Any], assertion: Assertion, steps: Any = None) -> Check:
    if assertion.rule is not None:
        return _check_rule(run, assertion)
    found = metrics.get(assertion.key)
    bound = _bound_text(assertion)
    if found is None:
        return _unavailable(assertion, bound, unavailable_reason(run, assertion.key, steps))
    actual = found.value(assertion.aggregate)
    detail = found.described(assertion.aggregate)
    wrong = implausible(run, assertion.key, actual)
    if wrong is not None:
        return Check("assertion", assertion.key, assertion.level, "suspect", actual, bound, assertion.aggregate,
                     f"suspect, not gated: {wrong} ({detail})")
    problems = []
    if assertion.min is not None and actual < assertion.min:
        problems.append(f"below the minimum {_fmt(assertion.min, assertion.key)}")
    if assertion.max is not None and actual > assertion.max:
        problems.append(f"above the maximum {_fmt(assertion.max, assertion.key)}")
    status = _failed_status(assertion.level) if problems else "pass"
    return Check("assertion", assertion.key, assertion.level, status, actual, bound, assertion.aggregate,
                 f"{detail}: {'; '.join(problems)}" if problems else detail)


def _unavailable(assertion: Assertion, bound: str, why: str) -> Check:
    status = "skip" if assertion.allow_unavailable else _failed_status(assertion.level)
    return Check("assertion", assertion.key, assertion.level, status, None, bound,
                 assertion.aggregate, f"unavailable: {why}")


def _check_rule(run: Any, assertion: Assertion) -> Check:
    """Findings of the rule; ``run.rules`` (the engine's per-rule status) tells whether the
    rule ran: a disabled rule, or a run the engine never saw, cannot vouch for anything."""
    bound = _bound_text(assertion)
    statuses = {s.get("rule"): s for s in run.rules or [] if isinstance(s, dict)}
    status = statuses.get(assertion.rule)
    if run.rules is None:
        return _unavailable(assertion, bound, "no rule results in this run (rules engine not run)")
    if status is not None and status.get("status") == "not_evaluated":
        return _unavailable(assertion, bound, f"rule {assertion.rule} could not check this run "
                                              f"({status.get('reason')})")
    if status is None or status.get("status") == "disabled":
        return _unavailable(assertion, bound, f"rule {assertion.rule} did not run "
                                              f"({(status or {}).get('reason') or 'not in this run'})")
    hits = [f for f in run.findings if f.get("rule") == assertion.rule]
    if assertion.severity:
        floor = SEVERITY_ORDER[assertion.severity]  # this severity or worse
        hits = [f for f in hits if SEVERITY_ORDER.get(f.get("severity"), len(SEVERITIES)) <= floor]
    failed = len(hits) > (assertion.max or 0)
    # the findings' titles: their full sentences are diagnose's (a gate row must stay readable)
    summary = "; ".join(dict.fromkeys(str(f.get("title") or f.get("summary") or "") for f in hits))
    message = f"{len(hits)} finding(s)" + (f": {summary}" if summary else "")
    if status.get("status") == "not_applicable":
        message += f" (not applicable: {status.get('reason')})"
    return Check("assertion", assertion.key, assertion.level,
                 _failed_status(assertion.level) if failed else "pass", float(len(hits)), bound,
                 "count", message)


def _failed_status(level: str) -> str:
    return "fail" if level == "error" else "warn"


def _bound_text(assertion: Assertion) -> str:
    if assertion.rule is not None:
        return f"≤ {int(assertion.max or 0)} finding(s)"
    parts = []
    if assertion.min is not None:
        parts.append(f"≥ {_fmt(assertion.min, assertion.key)}")
    if assertion.max is not None:
        parts.append(f"≤ {_fmt(assertion.max, assertion.key)}")
    return " and ".join(parts)


def regression_pct(base: float, new: float, better: str) -> float:
    """Relative change in the *worse* direction, in % of the baseline (negative = improved).
    A zero baseline: 0 when unchanged, else ±inf."""
    worse = (new - base) if better == "lower" else (base - new)
    if base == 0:
        return 0.0 if worse == 0 else math.copysign(math.inf, worse)
    return 100.0 * worse / abs(base)


def threshold(name: str, base: Metric, new: Metric, base_value: float, config: GateConfig) -> GateThreshold:
    """The smallest worse-direction change of metric ``name`` that counts (see ``Threshold``):
    the configured relative limit (``max_regression_pct``, per metric or for all), the metric's
    floor (a share's ``max_regression_pp``; a fixed one for the others) and the noise term,
    ``noise_sigmas`` × √2 × σ: σ how much the figure moves from one steady step to the next in
    either run, the larger (a noisier window of a healthy job is no regression), √2 because each
    of the two figures compared carries that noise. A run of fewer than three steady steps does
    not measure it (metrics.NOISE_MIN_CHANGES): with neither run measuring it, the noise is
    unknown and the limit and floor alone decide (a band the runs did not measure would pass
    anything within it)."""
    spec = metric_spec(name)
    assert spec is not None
    spreads = ((spread(base), "baseline"), (spread(new), "new run"))
    known = [(s, who) for s, who in spreads if s.sigma is not None]
    chosen, spread_of = max(known, key=lambda k: k[0].sigma or 0.0) if known else \
        (max((s for s, _ in spreads), key=lambda s: s.steps), None)
    noise = config.noise_sigmas * math.sqrt(2.0) * (chosen.sigma or 0.0)
    limit_pct = config.regression_limit(name)
    if spec.compare == "share":
        unit, limit, floor = "pp", limit_pct / 100.0 * abs(base_value), config.max_regression_pp
    else:
        scale = 100.0 / abs(base_value) if base_value else 0.0  # a zero baseline: any change counts
        unit, limit, floor, noise = "%", limit_pct, spec.floor * scale, noise * scale
    terms = {"limit": limit, "floor": floor, "noise": noise}
    basis = max(terms, key=lambda k: terms[k])  # on a tie, the first: limit, floor, noise
    return GateThreshold(terms[basis], unit, basis, limit, floor, noise, chosen.sigma, chosen.changes, chosen.steps,
                     spread_of)


def compare_baseline(new_run: Any, base_run: Any, config: GateConfig, steps: Any = None,
                     new_metrics: dict[str, Metric] | None = None) -> list[Check]:
    """Every metric of either run, with the assertion's aggregate (else the typical figure, the
    verdict's): compared where both runs measured it comparably; failed where the new run lacks
    one the baseline has; suspect (not gated) where either figure is physically impossible."""
    new_metrics = run_metrics(new_run) if new_metrics is None else new_metrics
    base_metrics = run_metrics(base_run)
    base_unmeasured = unmeasured_metrics(base_run)
    how_of = {a.key: a.aggregate for a in config.assertions if a.rule is None}
    return [_compare_one(name, base_metrics.get(name), new_metrics.get(name), how_of.get(name, DEFAULT_AGGREGATE),
                         new_run, base_run, config, steps, base_unmeasured.get(name))
            for name in sorted(set(new_metrics) | set(base_metrics) | set(base_unmeasured)
                               | set(unmeasured_metrics(new_run)))]


def _compare_one(name: str, base: Metric | None, new: Metric | None, how: str, new_run: Any, base_run: Any,
                 config: GateConfig, steps: Any, base_unmeasured: str | None = None) -> Check:
    """``base_unmeasured``: why the baseline has the metric's subject but no figure of it."""
    base_value = base.value(how) if base is not None else None
    new_value = new.value(how) if new is not None else None

    def check(status: str, message: str) -> Check:
        return Check("baseline", name, "error", status, new_value, "", how, message, base=base_value)
    if base_unmeasured is not None:  # nothing measured to compare with: say so, gate nothing
        base_why = f"{_what(name)} {base_unmeasured}"
        if new is None:
            new_why = unavailable_reason(new_run, name, steps, who="the new run")
            why = base_why if new_why == base_why else f"the baseline's {base_why}; the new run's {new_why}"
            return check("skip", f"not gated (neither run): {why}")
        return check("skip", f"not gated (the baseline): {base_why}")
    if base is None or base_value is None:
        if new is None:  # the new run has its subject but cannot measure it
            return check("skip", f"not gated (the new run; not in the baseline): "
                                 f"{unavailable_reason(new_run, name, steps, who='the new run')}")
        return check("skip", "not in the baseline: nothing to compare with")
    if new is None or new_value is None:
        return check("fail", f"in the baseline, missing in the new run: "
                             f"{unavailable_reason(new_run, name, steps, who='the new run')}")
    why = not_comparable(name, base_run, new_run)
    if why is not None:
        return check("skip", f"not comparable: {why}")
    if base.scope != new.scope:
        if new.scope == "trace":  # the new run lost its step breakdown: it cannot give the baseline's figure
            return check("fail", "the new run has only a whole-trace figure (no ProfilerStep#N markers), "
                                 f"the baseline the typical step's ({base.basis})")
        return check("skip", f"not comparable: the baseline's is a whole-trace figure ({base.basis}), "
                             "the new run's its typical step's")
    for which, run, value in (("baseline", base_run, base_value), ("new run", new_run, new_value)):
        wrong = implausible(run, name, value)
        if wrong is not None:
            return check("suspect", f"suspect, not gated: the {which}'s {wrong}")
    return _compared(name, base, new, base_value, new_value, how, config)


def _compared(name: str, base: Metric, new: Metric, base_value: float, new_value: float, how: str,
              config: GateConfig) -> Check:
    spec = metric_spec(name)
    assert spec is not None
    limit = threshold(name, base, new, base_value, config)
    if spec.compare == "share":
        worse = (new_value - base_value) if spec.better == "lower" else (base_value - new_value)
    else:
        worse = regression_pct(base_value, new_value, spec.better)
    if worse > limit.value:
        status, verdict = "fail", f"regressed {change_text(worse, limit.unit)} (threshold {limit.own})"
    elif worse < -limit.value:
        status, verdict = "improved", f"improved {change_text(-worse, limit.unit)} (threshold {limit.own})"
    else:
        status, verdict = "pass", f"within {limit.own}"
    change = 100.0 * (new_value - base_value) / abs(base_value) if base_value else \
        (0.0 if new_value == base_value else math.inf)
    return Check("baseline", name, "error", status, new_value, f"Δ ≤ {limit.own}", how, verdict, base=base_value,
                 change_pct=change, change_pp=(new_value - base_value) if spec.compare == "share" else None,
                 threshold=limit)


def _what(name: str) -> str:
    """A metric's subject in words, for a message ("bus bandwidth of group tp0")."""
    prefix, _, group = name.partition(":")
    return f"bus bandwidth of group {group}" if prefix == GROUP_METRIC and group else name


def baseline_check(new_run: Any, base_run: Any, compared: list[Check]) -> Check:
    """Whether the baseline could vouch for anything: it measured GPU steps, and it ran on the
    same GPU, world size and nodes (else only the comparable metrics are compared, and this says
    which); nothing compared at all fails."""
    if not has_gpu_activity(base_run):
        return Check("run", "baseline", "error", "fail", None, "comparable with the new run", None,
                     "the baseline has no GPU steps (no GPU activity in its traces): nothing to compare with")
    b, n = run_shape(base_run), run_shape(new_run)
    done = [c.name for c in compared if c.threshold is not None or c.status == "suspect"]
    skipped = [c.name for c in compared if c.message.startswith("not comparable")]
    if not done and not any(c.status == "fail" for c in compared):
        return Check("run", "baseline", "error", "fail", None, "comparable with the new run", None,
                     f"nothing compared: baseline {shape_text(b)}, new run {shape_text(n)}"
                     + (f" (not comparable: {', '.join(skipped)})" if skipped else ""))
    few = _few_steady_steps_note(base_run, new_run)
    if b == n:
        return Check("run", "baseline", "error", "pass", None, "comparable with the new run", None,
                     f"same GPU, world size and nodes: {shape_text(b)}{few}")
    return Check("run", "baseline", "warning", "warn", None, "comparable with the new run", None,
                 f"baseline {shape_text(b)}, new run {shape_text(n)}: "
                 + (f"compared only {', '.join(done)}" if done else "nothing compared")
                 + (f"; not compared: {', '.join(skipped)}" if skipped else "") + few)


def _few_steady_steps_note(base_run: Any, new_run: Any) -> str:
    """What a baseline of too few steady steps to measure its noise means for the noise
    thresholds (empty otherwise)."""
    needed = NOISE_MIN_CHANGES + 1
    typical = base_run.model.typical
    if typical is None or len(typical.steady_steps) >= needed:
        return ""
    new = new_run.model.typical
    alone = ("nor has the new run: the noise is unknown and the thresholds are the limits and floors alone"
             if new is None or len(new.steady_steps) < needed else "the new run's steps set the noise thresholds")
    return (f"; the baseline has {len(typical.steady_steps)} steady step(s), too few to measure its step-to-step "
            f"noise by ({needed} needed), {alone} (profile {needed + 1} steps or more)")


# ---------------------------------------------------------------- comparable runs


def run_shape(run: Any) -> dict[str, Any]:
    """What a figure depends on besides the code: the GPU (the one the analysis assumed: the
    trace's device, or the user's --gpu), the world size and the nodes (as the diff counts them)."""
    from analyzer.compare.diff import node_count
    hardware = run.model.hardware
    gpu = hardware.gpu_name.value or run.job.get("gpu")  # the trace's device, or --gpu's name
    # the profile id tells two spellings of one GPU apart from two GPUs (the trace's device name, --gpu h100)
    profile = hardware.gpu_profile.value or gpu
    if str(run.job.get("gpu") or "").startswith("mixed:") and hardware.gpu_name.origin != "user":
        gpu = profile = run.job["gpu"]  # ranks on different GPUs: the mix is the shape, not one of them
    return {"gpu": gpu, "profile": profile, "world_size": run.model.world_size,
            "nodes": node_count(run)[0]}


def shape_text(shape: dict[str, Any]) -> str:
    nodes = f" on {shape['nodes']} node(s)" if shape["nodes"] else ""
    return f"{shape['world_size'] or '?'} x {shape['gpu'] or 'unknown GPU'}{nodes}"


def not_comparable(name: str, base: Any, new: Any) -> str | None:
    """Why metric ``name`` of run ``new`` cannot be compared with the baseline ``base`` (None: it
    can). MFU is normalised by the GPU's peak and the GPU count: comparable across both. The step
    time and the shares depend on the GPU and on the job's size. A group's bus bandwidth is
    comparable on the same GPU when the group has the same size and nodes in both runs (a
    tensor-parallel group inside a node stays comparable when the data-parallel size changes)."""
    if name == "mfu":
        return None
    b, n = run_shape(base), run_shape(new)
    if b["profile"] and n["profile"] and b["profile"] != n["profile"]:
        return f"baseline on {b['gpu']}, new run on {n['gpu']}"
    if name.startswith(GROUP_METRIC + ":"):
        label = name.partition(":")[2]
        gb, gn = (next((g for g in r.model.groups if g.label == label), None) for r in (base, new))
        if gb is not None and gn is not None and (gb.size, gb.nodes) != (gn.size, gn.nodes):
            return (f"group {label}: {gb.size} rank(s) on {gb.nodes} node(s) in the baseline, "
                    f"{gn.size} on {gn.nodes} in the new run")
        return None
    if (b["world_size"], b["nodes"]) != (n["world_size"], n["nodes"]):
        return f"baseline {shape_text(b)}, new run {shape_text(n)}"
    return None


def metric_unit(metric: str) -> str:
    """The unit a metric's figures are in (analyzer.compare.metrics); "" when unknown."""
    spec = metric_spec(metric)
    return spec.unit if spec else ""


def _fmt(value: float | None, metric: str) -> str:
    return fmt_metric(value, metric_unit(metric))
