"""Structured data (a finding's evidence, the what-if's assumptions) as rows a page shows: a
value with its unit, a list, or a table with its column headings; never raw JSON, never
``null``. An evidence field's label and unit are the ones its rule's evidence type declares
(analyzer.rules.evidence_types); an assumption's or a hardware figure's, and a saved finding's of a
rule with no type, are analyzer.rules.evidence_fields'; never guessed from its name; a key no
declaration names is data (a rank, a collective, an op): its own words, in the unit of the field
it is in."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from analyzer.base.units import MISSING, fmt_bytes, fmt_gbps, fmt_num, fmt_pct, fmt_tflops, fmt_us
from analyzer.rules.evidence_fields import FIELDS, Field
from analyzer.rules.evidence_types import evidence_spec, evidence_type

ROWS_MAX = 24  # rows of one table, lists of items
DEPTH_MAX = 3
NOT_KNOWN = "not known"  # a value the analysis could not give (None in the document)
# Data keys shown with what they are ("rank 5", "step 7"); other keys (a collective, a phase,
# an op) are their own name.
_NAMED_KEYS = ("rank", "step")
#: What the declarations are looked up in: a rule's evidence type's (evidence_spec), else FIELDS.
Spec = Mapping[str, Field]


def field(key: object, spec: Spec | None = None) -> Field | None:
    """The declaration of field ``key`` in ``spec`` (None: FIELDS); None: not declared (data)."""
    return (FIELDS if spec is None else spec).get(str(key))


def evidence_rows(finding: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A finding's evidence, its prediction left out (shown on its own), as rows: labels and units
    from its rule's evidence type; FIELDS for a rule with none (a saved result's rule that no
    longer exists)."""
    evidence = finding.get("evidence")
    data = {k: v for k, v in evidence.items() if k != "prediction"} if isinstance(evidence, dict) else evidence
    typed = evidence_type(finding.get("rule"))
    return rows(data, spec=evidence_spec(typed) if typed is not None else None)


def unit_of(key: Any, inherited: str | None = None, spec: Spec | None = None) -> str | None:
    """The unit of a key: its declaration's (None: a plain number or text), else the enclosing
    field's (a key that is data: a rank, a collective, an op). Never guessed from a key's name:
    tests/test_one_truth.py checks that every field the rules, the what-if and the hardware
    section write is declared."""
    declared = field(key, spec)
    if declared is not None:
        return declared.unit if declared.unit != "text" else None
    return inherited


def fmt_field(value: Any, unit: str | None) -> str:
    """One value as text in its unit."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NOT_KNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if unit == "us":
            return fmt_us(value)
        if unit == "bytes":
            return fmt_bytes(value)
        if unit == "gbps":
            return fmt_gbps(value)
        if unit == "pct":
            return fmt_pct(value)
        if unit == "share":
            return fmt_pct(100.0 * value)
        if unit == "mb":
            return f"{fmt_num(value)} MB"
        if unit == "tflops":
            return fmt_tflops(value)
        return fmt_num(value)
    text = str(value)
    return text if len(text) <= 400 else text[:399] + "…"


def label(key: Any, spec: Spec | None = None) -> str:
    """A key as a heading: its declared label, else its own words (a key that is data)."""
    declared = field(key, spec)
    return declared.label if declared is not None else _words(key)


def _words(key: Any) -> str:
    """A key that is data (a phase, an op, a host activity), as words."""
    return str(key).replace("_", " ")


def _data_key(key: Any, kind: str | None) -> str:
    """A key that is data (a rank, a step, a collective's name), as a row or column heading."""
    return f"{kind} {key}" if kind in _NAMED_KEYS else str(key)


def rows(data: Any, unit: str | None = None, depth: int = 0, spec: Spec | None = None) -> list[dict[str, Any]]:
    """``data`` (a dict, list or value) as rows, each ``{key, value, items, table, rows}`` with
    one of the last four set: a value, a list of items, a table ``{head, rows}``, rows within.
    ``spec``: the declarations (a rule's evidence type's); None: FIELDS."""
    if isinstance(data, dict):
        items = sorted(data.items(), key=lambda kv: (label(kv[0], spec), str(kv[0])))  # as the reader finds them
        out = [_row(label(k, spec), v, unit_of(k, unit, spec), depth, field(k, spec), spec) for k, v in items[:ROWS_MAX]]
        if len(items) > ROWS_MAX:
            out.append({"key": "…", "value": f"{len(items) - ROWS_MAX} more"})
    elif isinstance(data, list):
        out = [_row(str(i + 1), v, unit, depth, None, spec) for i, v in enumerate(data[:ROWS_MAX])]
    else:
        out = [{"key": "", "value": fmt_field(data, unit)}] if data is not None else []
    return [{"value": None, "entries": None, "table": None, "nested": None, **row} for row in out]


def _within(declared: Field | None, spec: Spec | None) -> Spec | None:
    """The declarations inside a field's value: its record's own first (a record's ``peak_bytes``
    is its own), then the enclosing ones."""
    if declared is None or not declared.record or spec is None:
        return spec
    return {**declared.record, **{k: v for k, v in spec.items() if k not in declared.record}}


def _row(key: str, value: Any, unit: str | None, depth: int, declared: Field | None = None,
         spec: Spec | None = None) -> dict[str, Any]:
    kind = declared.keys if declared is not None else None
    spec = _within(declared, spec)
    if isinstance(value, dict) and value:
        if depth >= DEPTH_MAX:
            return {"key": key, "value": f"{len(value)} entries"}
        if all(isinstance(v, dict) for v in value.values()):
            return {"key": key, "table": _table_of_dicts(value, unit, kind, spec)}
        if not any(isinstance(v, (dict, list)) for v in value.values()):
            if kind is not None:  # keyed by data: the key, then its value in the field's unit
                return {"key": key, "table": {"head": [kind, declared.label if declared else ""], "rows": [
                    [_data_key(k, kind), fmt_field(v, unit)] for k, v in sorted(value.items(), key=_by_key)[:ROWS_MAX]]}}
            return {"key": key, "entries": [f"{label(k, spec)}: {fmt_field(v, unit_of(k, unit, spec))}"
                                          for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))][:ROWS_MAX]}
        return {"key": key, "nested": rows(value, unit, depth + 1, spec)}
    if isinstance(value, list) and value:
        if declared is not None and declared.columns and all(isinstance(v, list) for v in value):
            return {"key": key, "table": _table_of_columns(value, declared.columns)}
        if all(isinstance(v, dict) for v in value):
            return {"key": key, "table": _table_of_records(value, unit, spec)}
        if all(isinstance(v, list) and v and not isinstance(v[0], (dict, list)) for v in value):
            return {"key": key, "table": _table_of_pairs(value, unit, declared)}
        if not any(isinstance(v, (dict, list)) for v in value):
            return {"key": key, "entries": [fmt_field(v, unit) for v in value[:ROWS_MAX]]
                    + ([f"… {len(value) - ROWS_MAX} more"] if len(value) > ROWS_MAX else [])}
        return {"key": key, "nested": rows(value, unit, depth + 1, spec)}
    if isinstance(value, (dict, list)):
        return {"key": key, "value": "none"}
    return {"key": key, "value": fmt_field(value, unit)}


def _by_key(kv: tuple[Any, Any]) -> tuple[int, Any]:
    return _natural(str(kv[0]))


def _table_of_columns(value: list[list[Any]], columns: tuple[tuple[str, str | None], ...]) -> dict[str, Any]:
    """Rows as lists, each position as its declaration says (a bucket cap in MB, then µs)."""
    body = [[_cell(v[i] if i < len(v) else _ABSENT, unit) for i, (_, unit) in enumerate(columns)]
            for v in value[:ROWS_MAX]]
    more = [[f"… {len(value) - ROWS_MAX} more"] + [""] * (len(columns) - 1)] if len(value) > ROWS_MAX else []
    return {"head": [heading for heading, _ in columns], "rows": body + more}


def _table_of_dicts(value: dict[Any, dict[Any, Any]], unit: str | None, kind: str | None = None,
                    spec: Spec | None = None) -> dict[str, Any]:
    """{label: {column: value}}: one row per label, its column headings the fields' labels."""
    columns = sorted({str(c) for cells in value.values() for c in cells}, key=_column_order(spec))
    body = [[_data_key(k, kind)] + [_cell(cells.get(c, _ABSENT), unit_of(c, unit, spec), _keyed(c, spec), _within(field(c, spec), spec))
                                    for c in columns]
            for k, cells in sorted(value.items(), key=_by_key)[:ROWS_MAX]]
    return {"head": [kind or ""] + [label(c, spec) for c in columns], "rows": body}


def _column_order(spec: Spec | None) -> Callable[[str], tuple[int, int, str]]:
    """A table's columns: rank and step first, then as the fields are declared: in the order of
    the evidence type (a record's fields as the rule writes them), else of FIELDS."""
    known = {name: i for i, name in enumerate(FIELDS if spec is None else spec)}
    return lambda column: (column not in _NAMED_KEYS, known.get(column, len(known)), column)


def _table_of_records(value: list[dict[Any, Any]], unit: str | None, spec: Spec | None = None) -> dict[str, Any]:
    columns = sorted({str(c) for record in value for c in record}, key=_column_order(spec))
    body = [[_cell(record.get(c, _ABSENT), unit_of(c, unit, spec), _keyed(c, spec), _within(field(c, spec), spec))
             for c in columns]
            for record in value[:ROWS_MAX]]
    return {"head": [label(c, spec) for c in columns], "rows": body}


def _table_of_pairs(value: list[list[Any]], unit: str | None, declared: Field | None = None) -> dict[str, Any]:
    """[[key, value], ...] (e.g. [step, {rank: µs}]): the key, then the value's cells, headed by
    what the keys are where the field declares it."""
    kind, inner = (declared.keys, declared.inner) if declared is not None else (None, None)
    dicts = [v for v in value if len(v) == 2 and isinstance(v[1], dict)]
    if len(dicts) == len(value):
        columns = sorted({str(c) for _, cells in dicts for c in cells}, key=_natural)
        body = [[_data_key(k, kind)] + [_cell(cells.get(c, _ABSENT), unit) for c in columns]
                for k, cells in dicts[:ROWS_MAX]]
        return {"head": [kind or ""] + [_data_key(c, inner) for c in columns], "rows": body}
    width = max(len(v) for v in value)
    body = [[_cell(v[i] if i < len(v) else _ABSENT, unit) for i in range(width)] for v in value[:ROWS_MAX]]
    return {"head": [""] * width, "rows": body}


_ABSENT = object()


def _keyed(column: str, spec: Spec | None = None) -> bool:
    """Whether field ``column`` is a mapping keyed by data (its keys name no field)."""
    declared = field(column, spec)
    return declared is not None and declared.keys is not None


def _cell(value: Any, unit: str | None, keyed: bool = False, spec: Spec | None = None) -> str:
    """One cell; a mapping as ``key: value`` entries, its keys data (``keyed``: a "compute" part
    of a lateness is the field's unit, not the "compute" field's) or fields."""
    if value is _ABSENT:
        return MISSING
    if isinstance(value, (dict, list)) and not value:
        return "none"
    if isinstance(value, dict):
        return "; ".join(f"{_words(k) if keyed else label(k, spec)}: "
                         f"{fmt_field(v, unit if keyed else unit_of(k, unit, spec)) if not isinstance(v, (dict, list)) else '…'}"
                         for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))[:8])
    if isinstance(value, list):
        return ", ".join(fmt_field(v, unit) if not isinstance(v, (dict, list)) else "…" for v in value[:8])
    return fmt_field(value, unit)


def _natural(text: str) -> tuple[int, Any]:
    return (0, int(text)) if text.isdigit() else (1, text)


# A fix withheld for these reasons is one the evidence rules out (not another strategy's alternative).
_EVIDENCE_PRECONDITIONS = frozenset({"training", "gradients_wide", "loader_bound"})


def withheld_fixes(finding: dict[str, Any]) -> list[str]:
    """"not suggested: FIX (why)" for each fix of the job's own strategy that the evidence rules
    out (rules.engine records each fix's preconditions in ``evidence.fix_preconditions``)."""
    out = []
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), dict) else {}
    for entry in evidence.get("fix_preconditions") or []:
        failed = (entry.get("failed") or {}) if isinstance(entry, dict) else {}
        if failed and isinstance(failed, dict) and set(failed) <= _EVIDENCE_PRECONDITIONS:
            out.append(f"not suggested: {entry.get('fix')} ({'; '.join(map(str, failed.values()))})")
    return out
