"""Structured data (a finding's evidence, the what-if's assumptions) as rows a page shows: a
value with its unit, a list, or a table with its column headings; never raw JSON, never
``null``. An evidence field's label and unit are the ones it is declared with
(analyzer.rules.evidence_fields); a key no declaration names keeps its own words and the unit
its name states (``_us`` µs, ``_bytes`` bytes...), inherited by the entries of a mapping."""

from __future__ import annotations

import math
from typing import Any

from analyzer.base.units import MISSING, fmt_bytes, fmt_gbps, fmt_num, fmt_pct, fmt_tflops, fmt_us
from analyzer.rules.evidence_fields import FIELDS, Field, field

ROWS_MAX = 24  # rows of one table, lists of items
DEPTH_MAX = 3
NOT_KNOWN = "not known"  # a value the analysis could not give (None in the document)
# Data keys shown with what they are ("rank 5", "step 7"); other keys (a collective, a phase,
# an op) are their own name.
_NAMED_KEYS = ("rank", "step")


def unit_of(key: Any, inherited: str | None = None) -> str | None:
    """The unit of a key: its declaration's, else the unit its name states (None: a plain
    number), else the enclosing key's."""
    declared = field(key)
    if declared is not None:
        return declared.unit if declared.unit != "text" else None
    return _named_unit(key, inherited)


def _named_unit(key: Any, inherited: str | None) -> str | None:
    k = str(key).lower()
    if k.endswith(("_us", "_us_median")) or "_us_" in k:
        return "us"
    if k.endswith("_ns"):
        return "ns"
    if k.endswith("_bytes") or k in ("bytes", "size_bytes"):
        return "bytes"
    if k.endswith("_gbps") or "_gbps_" in k:
        return "gbps"
    if k.endswith("_pct"):
        return "pct"
    if "share" in k or "fraction" in k:
        return "share"
    if k.endswith("_mb"):
        return "mb"
    if "lateness" in k or k.startswith("wait") or k.endswith("_wait"):
        return "us"
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
        if unit == "ns":
            return fmt_us(value / 1000.0)
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


def label(key: Any) -> str:
    """A key as a heading: its declared label, else its words without the unit suffix the
    value now carries."""
    declared = field(key)
    if declared is not None:
        return declared.label
    text = str(key)
    for suffix in ("_us", "_ns", "_bytes", "_gbps", "_pct"):
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)]
    return text.replace("_", " ")


def _data_key(key: Any, kind: str | None) -> str:
    """A key that is data (a rank, a step, a collective's name), as a row or column heading."""
    return f"{kind} {key}" if kind in _NAMED_KEYS else str(key)


def rows(data: Any, unit: str | None = None, depth: int = 0) -> list[dict[str, Any]]:
    """``data`` (a dict, list or value) as rows, each ``{key, value, items, table, rows}`` with
    one of the last four set: a value, a list of items, a table ``{head, rows}``, rows within."""
    if isinstance(data, dict):
        items = sorted(data.items(), key=lambda kv: (label(kv[0]), str(kv[0])))  # as the reader finds them
        out = [_row(label(k), v, unit_of(k, unit), depth, field(k)) for k, v in items[:ROWS_MAX]]
        if len(items) > ROWS_MAX:
            out.append({"key": "…", "value": f"{len(items) - ROWS_MAX} more"})
    elif isinstance(data, list):
        out = [_row(str(i + 1), v, unit, depth) for i, v in enumerate(data[:ROWS_MAX])]
    else:
        out = [{"key": "", "value": fmt_field(data, unit)}] if data is not None else []
    return [{"value": None, "entries": None, "table": None, "nested": None, **row} for row in out]


def _row(key: str, value: Any, unit: str | None, depth: int, declared: Field | None = None) -> dict[str, Any]:
    kind = declared.keys if declared is not None else None
    if isinstance(value, dict) and value:
        if depth >= DEPTH_MAX:
            return {"key": key, "value": f"{len(value)} entries"}
        if all(isinstance(v, dict) for v in value.values()):
            return {"key": key, "table": _table_of_dicts(value, unit, kind)}
        if not any(isinstance(v, (dict, list)) for v in value.values()):
            if kind is not None:  # keyed by data: the key, then its value in the field's unit
                return {"key": key, "table": {"head": [kind, declared.label if declared else ""], "rows": [
                    [_data_key(k, kind), fmt_field(v, unit)] for k, v in sorted(value.items(), key=_by_key)[:ROWS_MAX]]}}
            return {"key": key, "entries": [f"{label(k)}: {fmt_field(v, unit_of(k, unit))}"
                                          for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))][:ROWS_MAX]}
        return {"key": key, "nested": rows(value, unit, depth + 1)}
    if isinstance(value, list) and value:
        if declared is not None and declared.columns and all(isinstance(v, list) for v in value):
            return {"key": key, "table": _table_of_columns(value, declared.columns)}
        if all(isinstance(v, dict) for v in value):
            return {"key": key, "table": _table_of_records(value, unit)}
        if all(isinstance(v, list) and v and not isinstance(v[0], (dict, list)) for v in value):
            return {"key": key, "table": _table_of_pairs(value, unit, declared)}
        if not any(isinstance(v, (dict, list)) for v in value):
            return {"key": key, "entries": [fmt_field(v, unit) for v in value[:ROWS_MAX]]
                    + ([f"… {len(value) - ROWS_MAX} more"] if len(value) > ROWS_MAX else [])}
        return {"key": key, "nested": rows(value, unit, depth + 1)}
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


def _table_of_dicts(value: dict[Any, dict[Any, Any]], unit: str | None, kind: str | None = None) -> dict[str, Any]:
    """{label: {column: value}}: one row per label, its column headings the fields' labels."""
    columns = sorted({str(c) for cells in value.values() for c in cells}, key=_column_order)
    body = [[_data_key(k, kind)] + [_cell(cells.get(c, _ABSENT), unit_of(c, unit)) for c in columns]
            for k, cells in sorted(value.items(), key=_by_key)[:ROWS_MAX]]
    return {"head": [kind or ""] + [label(c) for c in columns], "rows": body}


def _column_order(column: str) -> tuple[int, int, str]:
    """A table's columns: rank and step first, then as the fields are declared."""
    known = list(FIELDS)
    return (column not in _NAMED_KEYS, known.index(column) if column in FIELDS else len(known), column)


def _table_of_records(value: list[dict[Any, Any]], unit: str | None) -> dict[str, Any]:
    columns = sorted({str(c) for record in value for c in record}, key=_column_order)
    body = [[_cell(record.get(c, _ABSENT), unit_of(c, unit)) for c in columns] for record in value[:ROWS_MAX]]
    return {"head": [label(c) for c in columns], "rows": body}


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


def _cell(value: Any, unit: str | None) -> str:
    if value is _ABSENT:
        return MISSING
    if isinstance(value, (dict, list)) and not value:
        return "none"
    if isinstance(value, dict):
        return "; ".join(f"{label(k)}: {fmt_field(v, unit_of(k, unit)) if not isinstance(v, (dict, list)) else '…'}"
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
