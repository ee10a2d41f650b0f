"""Project configuration: the ``[tool.tracecliff]`` tables of ``./pyproject.toml`` or of a file
given with ``--config FILE`` (a TOML file with the same tables, so a pyproject.toml can be passed
as it is).

    [tool.tracecliff.rules.ddp-bucket-oversized]
    tail_fraction = 0.08        # a threshold of that rule
    [tool.tracecliff.rules.fsdp-where-ddp-fits]
    enabled = false             # turn a rule off
    severity = "info"           # or change its severity
    [tool.tracecliff.communication]
    kernels = ["my_a2a_kernel"] # regexes of kernels that also count as communication

``load_config`` returns the whole ``[tool.tracecliff]`` table (other tools, e.g. the gate, read
their own sub-tables from it); ``rule_settings`` validates the ``rules`` sub-table against the
registered rules. Every problem is a one-line :class:`ConfigError` naming the file.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from analyzer.base.errors import ConfigError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SEVERITIES = ("error", "warning", "info")
_RULE_KEYS = ("enabled", "severity")


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """The ``[tool.tracecliff]`` table of ``path`` (``--config FILE``; it must exist), else of
    ``./pyproject.toml`` when there is one, else ``{}``. The table's ``source`` is not added:
    callers that report errors use :func:`config_source`."""
    if path is None:
        default = Path.cwd() / "pyproject.toml"
        if not default.is_file():
            return {}
        file = default
    else:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"{file}: configuration file not found")
    try:
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None
    table = document.get("tool", {}).get("tracecliff", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: [tool.tracecliff] must be a table")
    return table


def config_source(path: str | Path | None = None) -> str:
    """How to name the configuration in messages."""
    return str(path) if path is not None else "pyproject.toml [tool.tracecliff]"


def rule_settings(config: Mapping[str, Any], rules: Mapping[str, Any],
                  source: str = "configuration") -> dict[str, dict[str, Any]]:
    """Validated per-rule settings: ``{rule name: {"enabled", "severity", "thresholds"}}`` for
    every registered rule (defaults filled in). ``rules`` maps names to Rule classes.

    Unknown rule names, unknown keys and values of the wrong type or out of range are errors.
    """
    table = config.get("rules", {}) if config else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tool.tracecliff.rules] must be a table")
    unknown = sorted(set(table) - set(rules))
    if unknown:
        raise ConfigError(f"{source}: unknown rule(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(rules))}")
    settings = {}
    for name, rule in rules.items():
        given = table.get(name, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{source}: [tool.tracecliff.rules.{name}] must be a table")
        settings[name] = _one_rule(name, rule, given, source)
    return settings


def _one_rule(name: str, rule: Any, given: Mapping[str, Any], source: str) -> dict[str, Any]:
    where = f"{source}: rules.{name}"
    allowed = set(_RULE_KEYS) | set(rule.thresholds)
    extra = sorted(set(given) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}; "
                          f"known: {', '.join(sorted(allowed))}")
    enabled = given.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled must be true or false, got {enabled!r}")
    severity = given.get("severity", rule.severity)
    if severity not in SEVERITIES:
        raise ConfigError(f"{where}.severity must be one of {', '.join(SEVERITIES)}, "
                          f"got {severity!r}")
    thresholds = {}
    for key, spec in rule.thresholds.items():
        value = given.get(key, spec.default)
        thresholds[key] = _check_threshold(f"{where}.{key}", value, spec)
    return {"enabled": enabled, "severity": severity, "thresholds": thresholds}


def _check_threshold(where: str, value: Any, spec: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if not spec.minimum <= value <= spec.maximum:
        raise ConfigError(f"{where} must be between {spec.minimum:g} and {spec.maximum:g}, "
                          f"got {value!r}")
    return int(value) if isinstance(spec.default, int) and float(value).is_integer() else float(value)


def communication_kernels(config: Mapping[str, Any], source: str = "configuration") -> tuple[str, ...]:
    """The user's communication-kernel patterns of ``[tool.tracecliff.communication] kernels``,
    validated (unknown keys, non-strings and invalid regular expressions are errors)."""
    table = config.get("communication", {}) if config else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tool.tracecliff.communication] must be a table")
    extra = sorted(set(table) - {"kernels"})
    if extra:
        raise ConfigError(f"{source}: communication: unknown key(s) {', '.join(extra)}; known: kernels")
    try:
        return check_patterns(table.get("kernels", []))
    except ValueError as exc:
        raise ConfigError(f"{source}: communication.kernels: {exc}") from None


def check_patterns(patterns: Any) -> tuple[str, ...]:
    """A list of regular expressions as a tuple; ValueError naming the bad one."""
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
        raise ValueError(f"expected a list of regular expressions, got {patterns!r}")
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{pattern!r} is not a non-empty string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    return tuple(patterns)
