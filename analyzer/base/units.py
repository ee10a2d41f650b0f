"""The one place numbers become text: times (µs), bytes, bandwidths, percentages. Every view
(text, HTML, markdown, finding sentences, gate messages) formats through these, so one quantity
reads the same everywhere."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from analyzer.base.numbers import is_finite_number as _number

MISSING = "–"


def fmt_us(value: Any) -> str:
    """A duration given in µs, in the largest unit that keeps it readable."""
    if not _number(value):
        return MISSING
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.2f} s"
    if abs(value) >= 1e4:
        return f"{value / 1e3:,.1f} ms"
    if abs(value) >= 1e3:
        return f"{value / 1e3:,.2f} ms"
    return f"{value:,.1f} µs"


def fmt_bytes(value: Any) -> str:
    """Decimal units (as NCCL and nccl-tests count): 1.25 GB, 25.0 MB, 4.1 KB, 512 B."""
    if not _number(value):
        return "?"
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("KB", 1e3, 1)):
        if abs(value) >= scale:
            return f"{value / scale:,.{digits}f} {unit}"
    return f"{value:,.0f} B"


def fmt_count(value: Any) -> str:
    """A count in decimal units, three significant digits: 1.47 B, 67.1 M, 950 K, 512 (``–``
    when unknown)."""
    if not _number(value):
        return MISSING
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            digits = 2 if abs(value) < 10 * scale else 1 if abs(value) < 100 * scale else 0
            return f"{value / scale:,.{digits}f} {unit}"
    return f"{value:,.0f}"


def fmt_params(value: Any) -> str:
    """A model's parameter count as a phrase ("1.47 B parameters", "4.19 M parameters"); a
    count that is missing or not positive says so, never "0.00 B"."""
    if not _number(value):
        return "an unknown number of parameters"
    if value <= 0:
        return "no parameters counted"
    return f"{fmt_count(value)} parameters"


def fmt_gbps(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f} GB/s" if _number(value) else MISSING


def fmt_flops(value: Any) -> str:
    """A FLOP count in decimal units: 1.44 TFLOP, 34.3 GFLOP, 512 MFLOP, 1.2 PFLOP."""
    if not _number(value):
        return MISSING
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:,.{2 if abs(value) < 10 * scale else 1}f} {unit}"
    return f"{value:,.0f} FLOP"


def fmt_tflops(value: Any) -> str:
    """A throughput in TFLOP/s (1e12 FLOP per second), three significant digits or more."""
    if not _number(value):
        return MISSING
    return f"{value:,.1f} TFLOP/s" if abs(value) >= 10 else f"{value:,.3g} TFLOP/s"


def fmt_pct(value: Any, digits: int = 1) -> str:
    return f"{value:.{digits}f}%" if _number(value) else MISSING


def fmt_change_pct(value: Any) -> str:
    """A signed relative change; from zero it is infinite and says so."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isinf(value):
        return "new"
    return f"{value:+.2f}%"


def fmt_change(change_pp: Any, change_pct: Any) -> str:
    """A metric's change as every view prints it: a share's in percentage points of the step
    ("+17.93 pp": 1.09% → 19.02% is not "+1643%"), any other metric's relative to the baseline."""
    if change_pp is not None:
        return ("+" if change_pp >= 0 else "") + fmt_unit(change_pp, "pp")
    return fmt_change_pct(change_pct)


def fmt_num(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def fmt_metric(value: Any, unit: str) -> str:
    """A gate metric's figure in its unit (``fmt_unit``), "n/a" when the run has none: the gate's
    checks and their views (analyzer.compare.gate, analyzer.reports.gate_text) say it so."""
    return "n/a" if value is None else fmt_unit(value, unit)


def fmt_unit(value: Any, unit: str) -> str:
    """``value`` in ``unit`` (µs, B, %, pp, GB/s, fraction, n): tables of mixed metrics."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if unit == "µs":
        return f"{value:,.1f} µs"
    if unit == "B":
        return fmt_bytes(value)
    if unit == "%":
        return f"{value:.2f}%"
    if unit == "pp":  # percentage points: a change of a share
        return f"{value:.2f} pp"
    if unit == "GB/s":
        return fmt_gbps(value, 3)
    if unit == "fraction":  # MFU: a percentage, as every view says it (the JSON keeps the fraction)
        return f"{100 * value:.2f}%"
    if unit == "n":
        return f"{value:.3g}"
    if unit == "TFLOP/s":
        return fmt_tflops(value)
    if unit == "FLOP":
        return fmt_flops(value)
    return f"{value:.4g}"


def fmt_value(value: Any, limit: int = 400) -> str:
    """Any evidence value as one short line of text (numbers grouped, structures as JSON)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt_num(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shape_text(dims: Mapping[str, Any] | None) -> str:
    """The sizes an op's FLOPs follow from, as one short text: ``m=4088 n=4096 k=1024`` (a
    batch ``b=`` first when there is one), ``bh=16 sq=64 sk=64 d=32 causal``, ``n=4 out=[64]
    weight=[256, 128, 1]``; "several shapes" for merged rows."""
    if not dims:
        return "several shapes"
    if "m" in dims:
        return (f"b={dims['b']} " if dims.get("b", 1) != 1 else "") + f"m={dims['m']} n={dims['n']} k={dims['k']}"
    if "sq" in dims:
        d = f"d={dims['d']}" + (f" dv={dims['dv']}" if dims.get("dv") != dims.get("d") else "")
        causal = {True: " causal", False: "", None: " causal?"}[dims.get("causal")]
        return f"bh={dims['bh']} sq={dims['sq']} sk={dims['sk']} {d}{causal}" + (" backward" if dims.get("backward") else "")
    if "weight" in dims:
        return (f"n={dims['n']} {'in' if dims.get('transposed') else 'out'}={dims['spatial']} weight={dims['weight']}"
                + (" backward" if dims.get("backward") else ""))
    return ", ".join(f"{k}={v}" for k, v in sorted(dims.items()))
