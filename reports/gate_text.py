"""Text and markdown views of ``tracecliff gate`` (a GateReport of analyzer.compare.gate). Every
check shows what it was held to: an assertion its bound, a baseline comparison its threshold
(and which term set it: the configured limit, the floor or the runs' noise)."""

from __future__ import annotations

from analyzer.base.sanitize import markdown
from analyzer.base.units import fmt_change, fmt_metric, fmt_us
from analyzer.compare.gate_report import Check, GateReport
from analyzer.reports.diff_text import table
from analyzer.reports.wrap import WIDTH, wrap


def render_text(report: GateReport) -> str:
    lines = [_headline(report, "FAIL" if report.failed else "PASS")]
    run = [c for c in report.checks if c.kind == "run"]
    if run:
        lines += ["", "Run:"]
        lines += _rows(["status", "check"], [([c.status.upper(), c.name], c.message) for c in run])
    assertions = [c for c in report.checks if c.kind == "assertion"]
    if assertions:
        lines += ["", "Assertions:"]
        lines += _rows(["status", "level", "assertion", "aggregate", "actual", "bound"],
                       [([c.status.upper(), c.level, c.name, c.aggregate or "", _actual(c), c.bound], c.message)
                        for c in assertions])
    compared = [c for c in report.checks if c.kind == "baseline"]
    if compared:
        lines += ["", f"Baseline {report.baseline or ''}:".replace(" :", ":")]
        lines += _baseline_rows(compared, report.notes)
    if not any(c.kind != "run" for c in report.checks):
        lines.append("no assertion applied and no baseline given")
    lines += _why(report)
    if report.warnings:
        lines += [""] + [line for w in report.warnings for line in _wrap(f"warning: {w}", "  ")]
    return "\n".join(lines) + "\n"


def _wrap(text: str, indent: str, first: str = "") -> list[str]:
    return wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent)


def _rows(header: list[str], rows: list[tuple[list[str], str]], detail: str = "detail") -> list[str]:
    """A table whose last column (a sentence) stays on its row where the row fits the page, and
    goes under its row, wrapped, where it does not: never a 300-character line."""
    lines = table(header + [detail], [cells + [text] for cells, text in rows])
    start = len(lines[0]) - len(detail)  # where the last column begins, on every row
    out = [lines[0] if any(len(line) <= WIDTH and text for line, (_, text) in zip(lines[1:], rows))
           else lines[0][:start].rstrip()]
    for line, (_, text) in zip(lines[1:], rows):
        if len(line) <= WIDTH:
            out.append(line)
            continue
        out.append(line[:start].rstrip())
        out += _wrap(text, "      ", "      ")
    return out


def _baseline_rows(compared: list[Check], notes: list[str]) -> list[str]:
    """The comparisons: each threshold with the term that set it (limit, floor, noise); what
    every row shares (the aggregate, the unknown noise, what the terms are) said once below."""
    aggregates = {c.aggregate for c in compared}
    shared_aggregate = len(aggregates) == 1
    header = ["status", "metric"] + ([] if shared_aggregate else ["aggregate"]) + ["baseline", "new", "change",
                                                                                    "threshold"]
    rows = []
    for c in compared:
        cells = [c.status.upper(), c.name] + ([] if shared_aggregate else [c.aggregate or ""])
        cells += [fmt_metric(c.base, c.unit), fmt_metric(c.actual, c.unit), _change(c),
                  f"≤ {c.threshold.short}" if c.threshold else "-"]
        # a row's own note: a measured noise (its σ), or why it was not compared
        detail = c.message if c.threshold is None else c.threshold.note if c.threshold.sigma is not None else ""
        rows.append((cells, detail))
    lines = _rows(header, rows, "note")
    aggregate = f"each run's {next(iter(aggregates))} figure; " if shared_aggregate and None not in aggregates else ""
    lines += _wrap(f" ({aggregate}change: a share's in points of the step, any other metric's in % of the baseline; "
                   "threshold: the largest of the limit (max_regression_pct of the baseline's figure), the floor "
                   "(max_regression_pp for a share, the metric's own for the others) and the runs' noise"
                   + "".join(f"; {note}" for note in notes) + ")", "  ")
    return lines


def _why(report: GateReport) -> list[str]:
    """A failing gate against a baseline says why: the findings that appeared or grew since it,
    and the command that shows the whole difference."""
    if not report.failed or report.findings_since is None:
        return []
    failed = ", ".join(c.name for c in report.failed)
    lines = ["", f"Why it failed: {failed}."]
    if report.findings_since:
        for f in report.findings_since:
            gain = f", estimated gain {fmt_us(f['gain_us'])} per step" if f.get("gain_us") is not None else ""
            count = f"{f['base_count']} → {f['count']}" if f["change"] == "grew" else str(f["count"])
            lines += _wrap(f" {f['change']} since the baseline: {f['rule']} ({count} finding(s){gain}): "
                           f"{f.get('title') or ''}", "   ")
    else:
        lines.append(" no finding appeared or grew since the baseline")
    if report.diff_command:
        lines += _wrap(f" see them: {report.diff_command}", "   ")
    return lines


def _headline(report: GateReport, status: str) -> str:
    counts = report.counts()
    suspect = f", {counts['suspect']} suspect" if counts["suspect"] else ""
    return (f"tracecliff gate: {status} ({counts['fail']} failed, {counts['warn']} warning(s), {counts['pass']} passed, "
            f"{counts['skip']} skipped, {counts['improved']} improved{suspect})")


def _actual(check: Check) -> str:
    if check.actual is None:
        return "n/a"
    return str(int(check.actual)) if check.aggregate == "count" else fmt_metric(check.actual, check.unit)


def _change(check: Check) -> str:
    """A share's change in points of the step, every other metric's in % of the baseline."""
    return fmt_change(check.change_pp, check.change_pct)


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
            base = f"{fmt_metric(c.base, c.unit)} ({_change(c)})" if c.kind == "baseline" and c.base is not None else ""
            actual = _actual(c) if c.kind != "run" else ""
            name = f"{c.kind}:{c.name}" if c.kind == "run" else c.name
            cells = [f"{icon[c.status]} {c.status}", c.aggregate or "", actual, base, c.bound or "", _verdict(c)]
            # <code>, not a backtick span: inside a span no escape works, and a backtick in a
            # name (a process group's) would close it
            lines.append(f"| {_md_cell(cells[0])} | <code>{_md_cell(name)}</code> | "
                         + " | ".join(_md_cell(x) for x in cells[1:]) + " |")
    lines += [f"\n_{markdown(note)}_" for note in report.notes]  # shared by the rows: said once
    why = _why(report)
    if why:  # the same reasons as the text view, as a list under the table
        lines += ["", f"**{markdown(why[1].strip())}**"] + [f"- {markdown(line.strip())}" for line in
                                                           _joined(why[2:])]
    return "\n".join(lines) + "\n\n"


def _joined(lines: list[str]) -> list[str]:
    """The text view's wrapped lines back as one line per item (an item's lines after its first
    are indented)."""
    items: list[str] = []
    for line in lines:
        if line.startswith("   ") and items:
            items[-1] += " " + line.strip()
        else:
            items.append(line.strip())
    return items


def _md_cell(text: str) -> str:
    return markdown(str(text))
