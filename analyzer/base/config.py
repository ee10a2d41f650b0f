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
registered rules through the one typed validator (:func:`validate`, msgspec structs), which the
gate's configuration uses too. Every problem is a one-line :class:`ConfigError` naming the file
and the key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import msgspec

from analyzer.base.errors import ConfigError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SEVERITIES = ("error", "warning", "info")  # worst first: the one list of finding severities
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}


MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few KB; its parse must not follow a hostile file


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
        if file.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{file}: larger than {MAX_CONFIG_BYTES:,} bytes: not a configuration file")
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConfigError(f"{file}: invalid TOML: a value nested deeper than any configuration") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None
    table = document.get("tool", {}).get("tracecliff", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: [tool.tracecliff] must be a table")
    return table


def config_source(path: str | Path | None = None) -> str:
    """How to name the configuration in messages: the file given, ./pyproject.toml where there
    is one, else that there is none (a message must not speak of a file that is not there)."""
    if path is not None:
        return str(path)
    if Path("pyproject.toml").is_file():
        return "pyproject.toml [tool.tracecliff]"
    return "the configuration (no --config given and no pyproject.toml in the current directory)"


# The tables of ``[tool.tracecliff]``; any other name under it is an error (most often a typo of
# one of these, e.g. ``[tool.tracecliff.rule.straggler-rank]``, whose settings would otherwise
# be dropped without a word).
TABLES = ("communication", "gate", "rules")


def check_tables(config: Mapping[str, Any], source: str = "configuration",
                 keys_of: Mapping[str, Any] | None = None) -> None:
    """Every name directly under ``[tool.tracecliff]`` is one of ``TABLES``; else one
    :class:`ConfigError` line with the closest valid name. ``keys_of``: each table's own keys,
    so that a key written one level too high (``[tool.tracecliff] preset = ...``) is pointed to
    its table (``gate.preset``)."""
    for name in config:
        if name in TABLES:
            continue
        kind = "table" if isinstance(config[name], dict) else "key"
        home = next((f"{table}.{name}" for table, keys in (keys_of or {}).items() if name in keys), None)
        hint = home or closest(name, TABLES)
        raise ConfigError(f"{source}: unknown {kind} {name!r} under [tool.tracecliff]"
                          + (f" (did you mean `{hint}`?)" if hint else "")
                          + f"; known tables: {', '.join(TABLES)}")


def closest(name: str, names: Any) -> str | None:
    """The valid name ``name`` is most likely a typo of (difflib's closest, case-insensitive), or None."""
    import difflib
    choices = {str(n).lower(): str(n) for n in names}
    match = difflib.get_close_matches(str(name).lower(), list(choices), n=1, cutoff=0.6)
    return choices[match[0]] if match else None


def rule_settings(config: Mapping[str, Any], rules: Mapping[str, Any],
                  source: str = "configuration") -> dict[str, dict[str, Any]]:
    """Validated per-rule settings: ``{rule name: {"enabled", "severity", "thresholds"}}`` for
    every registered rule (defaults filled in). ``rules`` maps names to Rule classes.

    Unknown rule names, unknown keys and values of the wrong type or out of range are errors.
    """
    table = config.get("rules", {}) if config else {}
    checked = validate(table, rules_struct(rules), source, "rules")
    settings = {}
    for name, rule in rules.items():
        given = getattr(checked, _identifier(name))
        thresholds = {key: _as_default_type(getattr(given, _identifier(key)), spec.default)
                      for key, spec in rule.thresholds.items()}
        settings[name] = {"enabled": given.enabled, "severity": given.severity, "thresholds": thresholds}
    return settings


def rules_struct(rules: Mapping[str, Any]) -> type[msgspec.Struct]:
    """``[tool.tracecliff.rules]`` as a typed struct: one table per registered rule, with
    ``enabled``, ``severity`` and the rule's thresholds (default and range from its Threshold)."""
    tables = []
    for name, rule in rules.items():
        fields: list[tuple[str, Any, Any]] = [
            ("enabled", bool, True), ("severity", Literal["error", "warning", "info"], rule.severity)]
        for key, spec in rule.thresholds.items():
            bounds = {"ge": spec.minimum, **({"le": spec.maximum} if math.isfinite(spec.maximum) else {})}
            number = Annotated[float, msgspec.Meta(**bounds, description=spec.help)]
            fields.append((_identifier(key), number, msgspec.field(default=spec.default, name=key)))
        table = msgspec.defstruct(f"Rule_{_identifier(name)}", fields, forbid_unknown_fields=True)
        tables.append((_identifier(name), table, msgspec.field(default_factory=table, name=name)))
    return msgspec.defstruct("RulesConfig", tables, forbid_unknown_fields=True, namespace={"key_noun": "rule"})


def _identifier(name: str) -> str:
    return name.replace("-", "_")


def _as_default_type(value: float, default: float) -> float:
    # an integer threshold (a count) stays an int when given as a whole number
    return int(value) if isinstance(default, int) and float(value).is_integer() else float(value)


# ---------------------------------------------------------------- the one validator
def validate(value: Any, typ: Any, source: str, where: str | list[str]) -> Any:
    """``value`` (parsed TOML) as the typed ``typ`` (msgspec Struct, Literal, ...): types, ranges
    (``msgspec.Meta``), unknown keys (``forbid_unknown_fields``) and non-finite numbers are
    checked; any problem is one :class:`ConfigError` line ``"<source>: <where>.<key> ..."``
    (``where``: the key path of ``value``, e.g. ``"rules"`` or ``["gate", "assertions", key]``)."""
    prefix = [where] if isinstance(where, str) else list(where)
    _reject_non_finite(value, source, prefix)
    try:
        return msgspec.convert(value, typ, strict=True)
    except msgspec.ValidationError as exc:
        message, _, at = str(exc).partition(" - at `$")
        inner = [dot or index for dot, index in _PATH_PART.findall(at.rstrip("`"))]
        path = prefix + inner
        info, got = _type_at(msgspec.inspect.type_info(typ), inner), _value_at(value, inner)
        raise config_error(source, path, _explain(message, info, got)) from None


def config_error(source: str, path: list[str], message: str) -> ConfigError:
    """``"<source>: rules.straggler-rank.consistency must be ..."`` or ``"<source>: <path>: ..."``."""
    return ConfigError(f"{source}: {_dotted(path)}{' ' if message.startswith('must') else ': '}{message}")


_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _dotted(path: list[str]) -> str:
    parts = []
    for part in path:
        if part.isdigit() or part == "...":
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + (part if _BARE_KEY.match(part) else f'"{part}"'))
    return "".join(parts)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _type_at(info: Any, path: list[str]) -> Any:
    arrays = (msgspec.inspect.ListType, msgspec.inspect.TupleType)
    for part in path:
        info = _without_none(info)
        if isinstance(info, msgspec.inspect.UnionType):  # e.g. "level" | [level, {options}]
            wanted = arrays if part.isdigit() else (msgspec.inspect.StructType, msgspec.inspect.DictType)
            info = next((t for t in info.types if isinstance(t, wanted)), None)
        if isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.encode_name == part), None)
        elif isinstance(info, (msgspec.inspect.DictType,)):
            info = info.value_type
        elif isinstance(info, arrays):
            info = info.item_type if hasattr(info, "item_type") else info.item_types[int(part)]
        else:
            return None
    return _without_none(info)


def _without_none(info: Any) -> Any:
    """The type a value must have: ``X | None`` and ``Annotated[X, Meta(description=...)]`` as X."""
    if isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    if isinstance(info, msgspec.inspect.UnionType):
        rest = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        return rest[0] if len(rest) == 1 else info
    return info


def _value_at(value: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _explain(message: str, info: Any, got: Any) -> str:
    """msgspec's message in the project's words, with the accepted values and what was given."""
    unknown = re.match(r"Object contains unknown field `(.*)`", message)
    if unknown and isinstance(info, msgspec.inspect.StructType):
        names = sorted(f.encode_name for f in info.fields)
        noun = getattr(info.cls, "key_noun", "key")  # the rules table's keys are rule names
        hint = closest(unknown.group(1), names)
        return f"unknown {noun} {unknown.group(1)!r}; known: {', '.join(names)}" + \
            (f" (did you mean `{hint}`?)" if hint else "")
    if isinstance(info, (msgspec.inspect.FloatType, msgspec.inspect.IntType)):
        kind = "a whole number" if isinstance(info, msgspec.inspect.IntType) else "a number"
        lo, hi = info.ge, info.le
        if lo is not None and hi is not None:
            return f"must be {kind} between {lo:g} and {hi:g}, got {got!r}"
        return f"must be {kind}{f' ≥ {lo:g}' if lo is not None else ''}, got {got!r}"
    if isinstance(info, msgspec.inspect.BoolType):
        return f"must be true or false, got {got!r}"
    if isinstance(info, msgspec.inspect.LiteralType):
        return f"must be one of {', '.join(map(str, info.values))}, got {got!r}"
    if isinstance(info, (msgspec.inspect.StructType, msgspec.inspect.DictType)):
        return f"must be a table, got {got!r}"
    return message[:1].lower() + message[1:]


def _reject_non_finite(value: Any, source: str, path: list[str]) -> None:
    # TOML has inf and nan; no threshold or bound means anything with them
    if isinstance(value, float) and not math.isfinite(value):
        raise config_error(source, path, f"must be a finite number, got {value!r}")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _reject_non_finite(item, source, path + [str(key)])


class _Communication(msgspec.Struct, forbid_unknown_fields=True):
    kernels: list[str] = []


def communication_kernels(config: Mapping[str, Any], source: str = "configuration") -> tuple[str, ...]:
    """The user's communication-kernel patterns of ``[tool.tracecliff.communication] kernels``,
    through the one validator (unknown keys, non-strings) and then compiled (bad expressions)."""
    table = validate((config or {}).get("communication", {}), _Communication, source, "communication")
    try:
        return check_patterns(table.kernels)
    except ValueError as exc:
        raise config_error(source, ["communication", "kernels"], str(exc)) from None


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
        problem = backtracking_risk(pattern)
        if problem:
            raise ValueError(f"regular expression {pattern[:80]!r} {problem}: its matching time could follow "
                             "a kernel name's length exponentially; write it without") from None
    return tuple(patterns)


MAX_PATTERN_CHARS = 500


def backtracking_risk(pattern: str) -> str | None:
    """Why ``pattern`` could backtrack catastrophically on a hostile kernel name (None: it
    cannot). Python's engine backtracks, so a user's pattern is held to a shape whose cost is
    at most quadratic in the name (searched over its first 4 KB, analyzer.ingest.classify): no
    backreference, no quantifier inside a repeated group or a repeated alternation, at most one
    unbounded quantifier."""
    import importlib
    try:  # the pattern's parse tree: re._parser from Python 3.11, sre_parse before
        sre_parse: Any = importlib.import_module("re._parser")
    except ImportError:  # pragma: no cover - Python 3.10
        sre_parse = importlib.import_module("sre_parse")
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"is longer than {MAX_PATTERN_CHARS} characters"
    unbounded = 0

    def walk(items: Any, repeated: bool) -> str | None:
        nonlocal unbounded
        for op, arg in items:
            name = str(op)
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "uses a backreference"
            if name.endswith("REPEAT"):
                low, high, sub = arg
                wide = high > 1
                if wide and repeated:
                    return "nests a quantifier inside a repeated group"
                if high > 64:
                    unbounded += 1
                if unbounded > 1:
                    return "has more than one unbounded quantifier"
                found = walk(sub, repeated or wide)
            elif name == "SUBPATTERN":
                found = walk(arg[-1], repeated)
            elif name == "BRANCH":
                if repeated:
                    return "repeats an alternation"
                found = next((f for f in (walk(b, repeated) for b in arg[1]) if f), None)
            elif name in ("ASSERT", "ASSERT_NOT", "ATOMIC_GROUP"):
                found = walk(arg[-1], repeated)
            else:
                found = None
            if found:
                return found
        return None

    return walk(sre_parse.parse(pattern), False)


def parse_steps(text: Any) -> tuple[int, ...] | None:
    """``--steps`` / ``steps=``: '3', '3,5', '3-6' or '3-6,9' (or an int, or a sequence of them)
    -> the ProfilerStep numbers (0 to ``MAX_STEP``, at most ``MAX_STEPS_SELECTED`` of them: a
    selection's cost must not follow a number typed by mistake); ValueError naming the text when
    it is not that."""
    from analyzer.base.limits import MAX_STEP
    if text is None or text == "":
        return None
    if isinstance(text, bool) or not isinstance(text, (int, str)) and not hasattr(text, "__iter__"):
        raise ValueError(f"expected step numbers like 3,5-7, got {text!r}")
    if isinstance(text, int):
        bounds = [(text, text)]
    elif isinstance(text, str):
        bounds = [_step_range(part, text) for part in (p.strip() for p in text.split(",")) if part]
    else:
        items = list(text)
        if any(isinstance(s, bool) or not isinstance(s, int) for s in items):
            raise ValueError(f"expected step numbers like 3,5-7, got {text!r}")
        bounds = [(s, s) for s in items]
    shown = str(text)[:80]
    if not bounds:  # ",", " , ": a selection of nothing by its own syntax (issue 41)
        raise ValueError(f"{shown!r} names no step (expected step numbers like 3,5-7)")
    reversed_range = next(((lo, hi) for lo, hi in bounds if lo > hi), None)
    if reversed_range:
        raise ValueError(f"{shown!r}: the range {reversed_range[0]}-{reversed_range[1]} is empty (its first step "
                         "is after its last; write it low-high)")
    if any(not 0 <= n <= MAX_STEP for pair in bounds for n in pair):
        raise ValueError(f"step numbers are 0 to {MAX_STEP:,}, got {shown!r}")
    if sum(max(0, hi - lo + 1) for lo, hi in bounds) > MAX_STEPS_SELECTED:
        raise ValueError(f"{shown!r} selects more than {MAX_STEPS_SELECTED:,} steps (a trace holds far fewer)")
    return tuple(sorted({n for lo, hi in bounds for n in range(lo, hi + 1)}))


def _step_range(part: str, text: str) -> tuple[int, int]:
    try:
        return (tuple(int(v) for v in part.split("-", 1)) if "-" in part[1:]  # type: ignore[return-value]
                else (int(part), int(part)))
    except ValueError:
        raise ValueError(f"expected step numbers like 3,5-7, got {text!r}") from None


MAX_STEPS_SELECTED = 1 << 16

