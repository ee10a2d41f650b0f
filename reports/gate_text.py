"""Text and markdown views of ``tracecliff gate`` (a GateReport of analyzer.compare.gate)."""

from __future__ import annotations

from analyzer.base.units import fmt_change_pct
from analyzer.compare.gate import Check, GateReport, _fmt
from analyzer.reports.diff_text import table


def render_text(report: GateReport) -> str:
    counts = report.counts()
    head = (f"tracecliff gate: {'FAIL' if report.failed else 'PASS'} "
            f"({counts['fail']} failed, {counts['warn']} warning(s), {counts['pass']} passed, "
            f"{counts['skip']} skipped, {counts['improved']} improved)")
    lines = [head]
    assertions = [c for c in report.checks if c.kind == "assertion"]
    if assertions:
        lines += ["", "Assertions:"]
        lines += table(["status", "level", "assertion", "aggregate", "actual", "bound", "detail"],
                        [[c.status.upper(), c.level, c.name, c.aggregate or "", _actual(c), c.bound, c.message]
                         for c in assertions])
    compared = [c for c in report.checks if c.kind == "baseline"]
    if compared:
        lines += ["", f"Baseline {report.baseline or ''}:".replace(" :", ":")]
        lines += table(["status", "metric", "aggregate", "baseline", "new", "change", "verdict"],
                        [[c.status.upper(), c.name, c.aggregate or "", _fmt(c.base, c.name),
                          _fmt(c.actual, c.name), fmt_change_pct(c.change_pct), c.message] for c in compared])
    if not report.checks:
        lines.append("no assertion applied and no baseline given")
    if report.warnings:
        lines += [""] + [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def _actual(check: Check) -> str:
    if check.actual is None:
        return "n/a"
    return str(int(check.actual)) if check.aggregate == "count" else _fmt(check.actual, check.name)


def render_markdown(report: GateReport) -> str:
    """The GitHub job-summary section."""
    counts = report.counts()
    icon = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️", "improved": "🚀"}
    lines = [f"### tracecliff gate: {'❌ FAIL' if report.failed else '✅ PASS'}", "",
             f"{counts['fail']} failed, {counts['warn']} warning(s), {counts['pass']} passed, "
             f"{counts['skip']} skipped, {counts['improved']} improved", ""]
    if report.checks:
        lines += ["| status | check | aggregate | actual | bound / baseline | detail |",
                  "|---|---|---|---|---|---|"]
        for c in report.checks:
            bound = c.bound if c.kind == "assertion" else f"{_fmt(c.base, c.name)} ({fmt_change_pct(c.change_pct)})"
            cells = [f"{icon[c.status]} {c.status}", f"`{c.name}`", c.aggregate or "", _actual(c), bound, c.message]
            lines.append("| " + " | ".join(_md_cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n\n"


def _md_cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")
