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
    "overlap_pct" = ["warn", { min = 60.0 }]
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
from typing import Any

from analyzer.base.config import load_config
from analyzer.base.errors import ConfigError
from analyzer.base.units import fmt_unit
from analyzer.compare.metrics import AGGREGATIONS, as_document, aggregate, extract_samples, metric_spec, unavailable_reason

LEVELS = ("off", "warn", "error")
SEVERITIES = ("info", "warning", "error")
DEFAULT_MAX_REGRESSION_PCT = 5.0
EXIT_PASS, EXIT_FAIL = 0, 1  # 2 (usage, input, config) comes from analyzer.cli.main

# Presets: defaults a project's own assertions override key by key. Metric entries skip
# quietly when the run cannot measure them (single GPU: no overlap to speak of).
_PRESET_METRICS = {
    "recommended": {
        "exposed_comm_pct": ["warn", {"max": 20.0, "allow_unavailable": True}],
        "overlap_pct": ["warn", {"min": 50.0, "allow_unavailable": True}],
        "idle_pct": ["warn", {"max": 30.0, "allow_unavailable": True}],
    },
    "strict": {
        "exposed_comm_pct": ["error", {"max": 10.0, "allow_unavailable": True}],
        "overlap_pct": ["error", {"min": 70.0, "allow_unavailable": True}],
        "idle_pct": ["error", {"max": 20.0, "allow_unavailable": True}],
    },
}
_PRESET_RULE_LEVEL = {"recommended": "warn", "strict": "error"}
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
                "checks": [asdict(c) for c in self.checks]}


# ---------------------------------------------------------------- configuration


def parse_gate_config(tool: dict[str, Any], preset: str | None = None,
                      max_regression_pct: float | None = None,
                      rule_names: list[str] | None = None) -> GateConfig:
    """Validate ``[tool.tracecliff]``'s gate table; ``preset`` / ``max_regression_pct`` (command
    line) win over the file. ``rule_names``: the registered rules (None: not checked)."""
    table = tool.get("gate", {})
    if not isinstance(table, dict):
        raise ConfigError("[tool.tracecliff.gate] must be a table")
    unknown = sorted(set(table) - {"preset", "max_regression_pct", "max_regression_pct_by_metric",
                                   "assertions"})
    if unknown:
        raise ConfigError(f"[tool.tracecliff.gate]: unknown key(s) {', '.join(unknown)}")
    preset = preset or table.get("preset")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"[tool.tracecliff.gate] preset: unknown preset {preset!r} "
                          f"(known: {', '.join(PRESETS)})")
    limit = max_regression_pct if max_regression_pct is not None else table.get(
        "max_regression_pct", DEFAULT_MAX_REGRESSION_PCT)
    limit = _non_negative("max_regression_pct", limit)
    by_metric = table.get("max_regression_pct_by_metric", {})
    if not isinstance(by_metric, dict):
        raise ConfigError("[tool.tracecliff.gate] max_regression_pct_by_metric must be a table")
    for name in by_metric:
        _check_metric_name(name)
    overrides = {name: _non_negative(f"max_regression_pct_by_metric.{name}", v) for name, v in by_metric.items()}
    entries = dict(_preset_entries(preset, rule_names))
    written = table.get("assertions", {})
    if not isinstance(written, dict):
        raise ConfigError("[tool.tracecliff.gate.assertions] must be a table")
    entries.update(written)
    assertions = tuple(a for a in (parse_assertion(k, v, rule_names) for k, v in sorted(entries.items()))
                       if a.level != "off")
    return GateConfig(assertions, limit, overrides, preset)


def _preset_entries(preset: str | None, rule_names: list[str] | None) -> dict[str, Any]:
    if preset is None:
        return {}
    entries: dict[str, Any] = dict(_PRESET_METRICS[preset])
    for name in rule_names or []:
        entries[f"rule:{name}"] = [_PRESET_RULE_LEVEL[preset], {"allow_unavailable": True}]
    return entries


def parse_assertion(key: str, value: Any, rule_names: list[str] | None) -> Assertion:
    where = f"[tool.tracecliff.gate.assertions] {key!r}"
    if isinstance(value, str):
        level, options = value, {}
    elif isinstance(value, list) and len(value) in (1, 2) and isinstance(value[0], str):
        level, options = value[0], (value[1] if len(value) == 2 else {})
    else:
        raise ConfigError(f"{where}: expected \"level\" or [\"level\", {{options}}]")
    if level not in LEVELS:
        raise ConfigError(f"{where}: unknown level {level!r} (off|warn|error)")
    if not isinstance(options, dict):
        raise ConfigError(f"{where}: options must be a table")
    if key.startswith("rule:"):
        return _rule_assertion(key, level, options, rule_names, where)
    _check_metric_name(key)
    unknown = sorted(set(options) - {"min", "max", "aggregate", "allow_unavailable"})
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)}")
    how = options.get("aggregate", "median")
    if how not in AGGREGATIONS:
        raise ConfigError(f"{where}: unknown aggregate {how!r} ({'|'.join(AGGREGATIONS)})")
    low, high = (_bound(where, options, k) for k in ("min", "max"))
    if level != "off" and low is None and high is None:
        raise ConfigError(f"{where}: a metric assertion needs min and/or max")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{where}: min {low} is above max {high}")
    return Assertion(key, level, low, high, how, bool(options.get("allow_unavailable", False)))


def _rule_assertion(key, level, options, rule_names, where) -> Assertion:
    rule = key[5:]
    if not rule:
        raise ConfigError(f"{where}: empty rule name")
    if rule_names is not None and rule not in rule_names:
        raise ConfigError(f"{where}: unknown rule {rule!r} (see `tracecliff rules`)")
    unknown = sorted(set(options) - {"max", "severity", "allow_unavailable"})
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)} "
                          "(rules take max, severity, allow_unavailable)")
    high = _bound(where, options, "max")
    if high is not None and (high < 0 or high != int(high)):
        raise ConfigError(f"{where}: max must be a whole number of findings ≥ 0")
    severity = options.get("severity")
    if severity is not None and severity not in SEVERITIES:
        raise ConfigError(f"{where}: unknown severity {severity!r} ({'|'.join(SEVERITIES)})")
    return Assertion(key, level, None, 0.0 if high is None else float(high), "count",
                     bool(options.get("allow_unavailable", False)), severity)


def _check_metric_name(name: str) -> None:
    if metric_spec(name) is None:
        raise ConfigError(f"unknown gate metric {name!r} (known: step_time_us, exposed_comm_pct, "
                          "overlap_pct, idle_pct, mfu, busbw_gbps:<group>, rule:<name>)")


def _bound(where: str, options: dict[str, Any], key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"[tool.tracecliff.gate] {name} must be a number ≥ 0, got {value!r}")
    return float(value)


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
    return GateReport(checks, baseline_label)


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
        floor = SEVERITIES.index(assertion.severity)
        hits = [f for f in hits if f.get("severity") in SEVERITIES and SEVERITIES.index(f["severity"]) >= floor]
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
