"""JUnit XML of a gate report: one testcase per check, so CI systems (GitLab, Jenkins, GitHub
test reporters) show each assertion and each baseline comparison as a test.

Error-level failures are <failure>; warn-level failures pass (a warning is not a failed test)
with the warning in <system-out>; skipped checks (unavailable metric, allowed; a metric the runs
cannot compare) are <skipped>, and so are suspect ones (a physically impossible figure: not
gated). Each case's text gives the bound or, against a baseline, the threshold it used and why.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from analyzer.base.sanitize import terminal

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
SUITES = (("run", "tracecliff.gate.run"), ("assertion", "tracecliff.gate.assertions"),
          ("baseline", "tracecliff.gate.baseline"))


def render_junit(report: dict[str, Any]) -> str:
    root = ET.Element("testsuites", name="tracecliff gate")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for kind, suite_name in SUITES:
        checks = [c for c in report["checks"] if c["kind"] == kind]
        if not checks:
            continue
        suite = ET.SubElement(root, "testsuite", name=suite_name)
        counts = {"tests": len(checks), "failures": 0, "skipped": 0}
        for check in checks:
            outcome = _add_case(suite, suite_name, check)
            if outcome in counts:
                counts[outcome] += 1
        if kind == "baseline" and report.get("notes"):  # what every comparison shares, said once
            ET.SubElement(suite, "system-out").text = "; ".join(report["notes"])
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("errors", "0")
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("errors", "0")
    ET.indent(root)
    text = ET.tostring(root, encoding="unicode")
    # ElementTree escapes markup but passes control characters through, which XML 1.0 forbids
    # even escaped: a trace string holding one would make the whole file unreadable.
    # Control characters and undecodable bytes are shown escaped (the one sanitiser of every sink).
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + _XML_INVALID.sub("\ufffd", terminal(text)) + "\n"


def _add_case(suite: ET.Element, suite_name: str, check: dict[str, Any]) -> str:
    """Append the testcase; return its outcome: failures, skipped or passed."""
    case = ET.SubElement(suite, "testcase", name=check["name"], classname=suite_name)
    text = _describe(check)
    if check["status"] == "fail":
        failure = ET.SubElement(case, "failure", message=check["message"], type=f"{check['kind']}-{check['level']}")
        failure.text = text
        return "failures"
    if check["status"] in ("skip", "suspect"):
        ET.SubElement(case, "skipped", message=check["message"]).text = text
        return "skipped"
    out = ET.SubElement(case, "system-out")
    out.text = ("WARNING: " if check["status"] == "warn" else "") + text
    return "passed"


def _describe(check: dict[str, Any]) -> str:
    parts = [f"{check['name']}: {check['status']}", f"level {check['level']}"]
    if check.get("aggregate"):
        parts.append(f"aggregate {check['aggregate']}")
    if check["kind"] != "run":
        parts.append(f"actual {_figure(check.get('actual'))}")
    if check["kind"] == "baseline":
        parts.append(f"baseline {_figure(check.get('base'))}")
        if check.get("change_pp") is not None:
            parts.append(f"change {check['change_pp']:+.4g} pp")
        elif check.get("change_pct") is not None:
            parts.append(f"change {check['change_pct']:+.4g}%")
    if check["bound"]:
        parts.append(f"{'threshold' if check['kind'] == 'baseline' else 'bound'} {check['bound']}")
    parts.append(check["message"])
    return "; ".join(parts)


def _figure(value: Any) -> str:
    return "n/a" if value is None else f"{value:.6g}"
