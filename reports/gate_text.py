"""Text and markdown views of ``tracecliff gate`` (a GateReport of analyzer.compare.gate). Every
check shows what it was held to: an assertion its bound, a baseline comparison its threshold
(and which term set it: the configured limit, the floor or the runs' noise)."""

from __future__ import annotations

from analyzer.base.sanitize import markdown
from analyzer.base.units import fmt_change_pct, fmt_unit
from analyzer.compare.gate import Check, GateReport, _fmt
from analyzer.reports.diff_text import table


def render_text(report: GateReport) -> str:
    lines = [_headline(report, "FAIL" if report.failed else "PASS")]
    run = [c for c in report.checks if c.kind == "run"]
    if run:
        lines += ["", "Run:"]
        lines += table(["status", "check", "detail"], [[c.status.upper(), c.name, c.message] for c in run])
    assertions = [c for c in report.checks if c.kind == "assertion"]
    if assertions:
        lines += ["", "Assertions:"]
        lines += table(["status", "level", "assertion", "aggregate", "actual", "bound", "detail"],
                       [[c.status.upper(), c.level, c.name, c.aggregate or "", _actual(c), c.bound, c.message]
                        for c in assertions])
    compared = [c for c in report.checks if c.kind == "baseline"]
    if compared:
        lines += ["", f"Baseline {report.baseline or ''}:".replace(" :", ":")]
        lines += table(["status", "metric", "aggregate", "baseline", "new", "change", "threshold", "verdict"],
                       [[c.status.upper(), c.name, c.aggregate or "", _fmt(c.base, c.name),
                         _fmt(c.actual, c.name), _change(c), c.bound or "-", _verdict(c)] for c in compared])
    if not any(c.kind != "run" for c in report.checks):
        lines.append("no assertion applied and no baseline given")
    if report.warnings:
        lines += [""] + [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def _headline(report: GateReport, status: str) -> str:
    counts = report.counts()
    suspect = f", {counts['suspect']} suspect" if counts["suspect"] else ""
    return (f"tracecliff gate: {status} ({counts['fail']} failed, {counts['warn']} warning(s), {counts['pass']} passed, "
            f"{counts['skip']} skipped, {counts['improved']} improved{suspect})")


def _actual(check: Check) -> str:
    if check.actual is None:
        return "n/a"
    return str(int(check.actual)) if check.aggregate == "count" else _fmt(check.actual, check.name)


def _change(check: Check) -> str:
    """A share's change in points of the step, every other metric's in % of the baseline."""
    if check.change_pp is not None:
        return ("+" if check.change_pp >= 0 else "") + fmt_unit(check.change_pp, "pp")
    return fmt_change_pct(check.change_pct)


def _verdict(check: Check) -> str:
    # the threshold has its own column: the message's would repeat it
    if check.threshold is None:
        return check.message
    return "within the threshold" if check.status == "pass" else check.message.split(" (threshold ")[0]


def render_markdown(report: GateReport) -> str:
    """The GitHub job-summary section."""
    icon = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️", "improved": "🚀", "suspect": "❓"}
    lines = [f"### tracecliff gate: {'❌ FAIL' if report.failed else '✅ PASS'}", "",
             markdown(_headline(report, "FAIL" if report.failed else "PASS").partition("(")[2].rstrip(")")), ""]
    if report.checks:
        lines += ["| status | check | aggregate | actual | baseline (change) | bound / threshold | detail |",
                  "|---|---|---|---|---|---|---|"]
        for c in report.checks:
            base = f"{_fmt(c.base, c.name)} ({_change(c)})" if c.kind == "baseline" and c.base is not None else ""
            actual = _actual(c) if c.kind != "run" else ""
            name = f"{c.kind}:{c.name}" if c.kind == "run" else c.name
            cells = [f"{icon[c.status]} {c.status}", c.aggregate or "", actual, base, c.bound or "", _verdict(c)]
            # <code>, not a backtick span: inside a span no escape works, and a backtick in a
            # name (a process group's) would close it
            lines.append(f"| {_md_cell(cells[0])} | <code>{_md_cell(name)}</code> | "
                         + " | ".join(_md_cell(x) for x in cells[1:]) + " |")
    return "\n".join(lines) + "\n\n"


def _md_cell(text: str) -> str:
    return markdown(str(text))
