"""CI performance gate: Lighthouse-CI style assertions on a run's metrics and findings, plus a
baseline comparison that fails on regressions.

Configuration (``[tool.tracecliff.gate]`` of ./pyproject.toml, or of ``--config FILE``)::

    [tool.tracecliff.gate]
    preset = "recommended"          # optional: "recommended" | "strict"
    max_regression_pct = 5.0        # against --baseline (relative change, worse direction)
    [tool.tracecliff.gate.max_regression_pct_by_metric]
    "step_time_us" = 3.0
    [tool.tracecliff.gate.assertions]
    "exposed_comm_pct" = ["error", { max = 10.0, aggregate = "median" }]
    "overlap_pct" = ["warning", { min = 60.0 }]   # "warn" is read as "warning"
    "rule:ddp-bucket-oversized" = "error"

A metric assertion is ``[level, {min?, max?, aggregate?, allow_unavailable?}]``; a rule
assertion is ``level`` or ``[level, {max?, severity?, allow_unavailable?}]`` and fails when the
run has more than ``max`` (default 0) findings of that rule at or above ``severity`` (default:
any). A metric the run cannot measure (or a rule that did not run) fails an error-level
assertion -- a gate must not pass on data it never saw -- unless ``allow_unavailable = true``,
which skips it.

Exit codes: 0 pass (warnings allowed), 1 an error-level assertion or a baseline comparison failed,
2 usage, input or configuration error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, Union

import msgspec

from analyzer.base.config import SEVERITIES, SEVERITY_ORDER, config_error, validate
from analyzer.compare.metrics import AGGREGATIONS, as_document, aggregate, extract_samples, metric_spec, unavailable_reason
from analyzer.base.units import fmt_unit

LEVELS = ("off", "warning", "error")
DEFAULT_MAX_REGRESSION_PCT = 5.0
EXIT_PASS, EXIT_FAIL = 0, 1  # 2 (usage, input, config) comes from analyzer.cli.main

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
    aggregate: str = "median"
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

    def regression_limit(self, metric: str) -> float:
        return self.regression_by_metric.get(metric, self.max_regression_pct)


@dataclass
class Check:
    kind: str  # "assertion" | "baseline"
    name: str
    level: str
    status: str  # pass | fail | warn | skip | improved
    actual: float | None
    bound: str
    aggregate: str | None
    message: str
    base: float | None = None
    change_pct: float | None = None


@dataclass
class GateReport:
    checks: list[Check]
    baseline: str | None = None
    # What diagnose says of the inputs (a field it could not use, ranks missing...): a gate
    # never passes in silence over a run it read only in part.
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.failed else EXIT_PASS

    def counts(self) -> dict[str, int]:
        statuses = ("pass", "fail", "warn", "skip", "improved")
        return {s: sum(c.status == s for c in self.checks) for s in statuses}

    def to_dict(self) -> dict[str, Any]:
        return {"status": "fail" if self.failed else "pass", "exit_code": self.exit_code,
                "baseline": self.baseline, "counts": self.counts(),
                "checks": [asdict(c) for c in self.checks], "warnings": self.warnings}


# ---------------------------------------------------------------- configuration
# The gate table as typed structs, checked by the one validator (analyzer.base.config.validate).


class MetricOptions(msgspec.Struct, forbid_unknown_fields=True):
    min: float | None = None
    max: float | None = None
    aggregate: Literal[AGGREGATIONS] = "median"  # type: ignore[valid-type]
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
    return GateConfig(assertions, float(limit), dict(table.max_regression_pct_by_metric), preset)


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
        raise config_error(source, path, f"unknown rule {rule!r} (see `tracecliff rules`)")
    opts = validate(options, RuleOptions, source, path + ["1"])
    return Assertion(key, level, None, float(opts.max), "count", opts.allow_unavailable, opts.severity)


def _check_metric_name(name: str, source: str, path: list[str]) -> None:
    if metric_spec(name) is None:
        raise config_error(source, path, f"unknown gate metric {name!r} (known: step_time_us, exposed_comm_pct, "
                                         "overlap_pct, idle_pct, mfu, busbw_gbps:<group>, rule:<name>)")


def registered_rule_names() -> list[str]:
    from analyzer.rules.engine import all_rules
    return sorted(all_rules())


# ---------------------------------------------------------------- evaluation


def evaluate(run: Any, config: GateConfig, baseline: Any = None, baseline_label: str | None = None) -> GateReport:
    """Check a run (a Result or its JSON document) against ``config`` and ``baseline``."""
    doc = as_document(run)
    baseline = None if baseline is None else as_document(baseline)
    samples = extract_samples(doc)
    checks = [check_assertion(doc, samples, a) for a in config.assertions]
    if baseline is not None:
        checks.extend(compare_baseline(doc, baseline, config))
    warnings = list(doc.get("warnings") or [])
    warnings += [f"baseline: {w}" for w in (baseline or {}).get("warnings") or []]
    return GateReport(checks, baseline_label, warnings)


def check_assertion(doc: dict[str, Any], samples, assertion: Assertion) -> Check:
    if assertion.rule is not None:
        return _check_rule(doc, assertion)
    found = samples.get(assertion.key)
    bound = _bound_text(assertion)
    if not found:
        return _unavailable(assertion, bound, unavailable_reason(doc, assertion.key))
    actual = aggregate([s.value for s in found], assertion.aggregate)
    problems = []
    if assertion.min is not None and actual < assertion.min:
        problems.append(f"below the minimum {_fmt(assertion.min, assertion.key)}")
    if assertion.max is not None and actual > assertion.max:
        problems.append(f"above the maximum {_fmt(assertion.max, assertion.key)}")
    status = _failed_status(assertion.level) if problems else "pass"
    detail = f"{assertion.aggregate} of {len(found)} sample(s)"
    return Check("assertion", assertion.key, assertion.level, status, actual, bound, assertion.aggregate,
                 f"{detail}: {'; '.join(problems)}" if problems else detail)


def _unavailable(assertion: Assertion, bound: str, why: str) -> Check:
    status = "skip" if assertion.allow_unavailable else _failed_status(assertion.level)
    return Check("assertion", assertion.key, assertion.level, status, None, bound,
                 assertion.aggregate, f"unavailable: {why}")


def _check_rule(doc: dict[str, Any], assertion: Assertion) -> Check:
    """Findings of the rule; ``doc["rules"]`` (the engine's per-rule status) tells whether the
    rule ran: a disabled rule, or a run the engine never saw, cannot vouch for anything."""
    bound = _bound_text(assertion)
    statuses = {s.get("rule"): s for s in doc.get("rules") or [] if isinstance(s, dict)}
    status = statuses.get(assertion.rule)
    if "rules" not in doc:
        return _unavailable(assertion, bound, "no rule results in this run (rules engine not run)")
    if status is not None and status.get("status") == "not_evaluated":
        return _unavailable(assertion, bound, f"rule {assertion.rule} could not check this run "
                                              f"({status.get('reason')})")
    if status is None or status.get("status") == "disabled":
        return _unavailable(assertion, bound, f"rule {assertion.rule} did not run "
                                              f"({(status or {}).get('reason') or 'not in this run'})")
    hits = [f for f in doc.get("findings") or [] if f.get("rule") == assertion.rule]
    if assertion.severity:
        floor = SEVERITY_ORDER[assertion.severity]  # this severity or worse
        hits = [f for f in hits if SEVERITY_ORDER.get(f.get("severity"), len(SEVERITIES)) <= floor]
    failed = len(hits) > (assertion.max or 0)
    summary = "; ".join(str(f.get("summary") or f.get("title") or "") for f in hits[:3])
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


def compare_baseline(doc: dict[str, Any], baseline: dict[str, Any], config: GateConfig) -> list[Check]:
    """Every metric measured in both runs, with the assertion's aggregate (else the median)."""
    new_samples, base_samples = extract_samples(doc), extract_samples(baseline)
    how_of = {a.key: a.aggregate for a in config.assertions if a.rule is None}
    checks = []
    for name in sorted(set(new_samples) & set(base_samples)):
        how = how_of.get(name, "median")
        spec = metric_spec(name)
        new = aggregate([s.value for s in new_samples[name]], how)
        base = aggregate([s.value for s in base_samples[name]], how)
        worse = regression_pct(base, new, spec.better)
        limit = config.regression_limit(name)
        if worse > limit:
            status, verdict = "fail", f"regressed {_pct_text(worse)} (limit {limit:g}%)"
        elif worse < -limit:
            status, verdict = "improved", f"improved {_pct_text(-worse)}"
        else:
            status, verdict = "pass", f"within ±{limit:g}%"
        change = 100.0 * (new - base) / abs(base) if base else (0.0 if new == base else math.inf)
        checks.append(Check("baseline", name, "error", status, new, f"regression ≤ {limit:g}%", how,
                            verdict, base=base, change_pct=change))
    return checks


def _fmt(value: float | None, metric: str) -> str:
    spec = metric_spec(metric)
    return "n/a" if value is None else fmt_unit(value, spec.unit if spec else "")


def _pct_text(value: float) -> str:
    return "from zero" if math.isinf(value) else f"{value:.2f}%"
