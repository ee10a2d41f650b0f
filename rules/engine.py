"""The rules engine: a registry of rules (one file per rule in this package), their settings,
and ``run_rules`` which turns a diagnosed Result into findings.

A rule is a class with a stable ``name`` (public contract), a short ``code``, a ``title`` (what
it checks) and a ``failure_title`` (what a finding says), a default ``severity``, configurable
``thresholds``, the analyses it ``needs``, and docs in its docstring with the sections of
``DOC_SECTIONS``. ``check(ctx)`` returns plain data: a list of finding dicts built with
``ctx.finding(...)``. A rule that cannot check what it checks (no phases, sizes unknown, a
needed rank missing) raises :class:`NotEvaluated` with the reason: its status is then
``not_evaluated``, never ``passed``, and the verdict counts it. A rule that raises anything else
becomes an ``error`` finding for that rule and the run goes on.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Any, ClassVar

from analyzer.base.config import SEVERITY_ORDER, rule_settings
from analyzer.job.facts import JobFacts

DOC_SECTIONS = ("What it detects", "Why it matters", "Evidence", "Fix", "References")
MODELS_DOC = "docs/models.md"


@dataclass(frozen=True)
class Threshold:
    """A configurable number with its default, meaning and accepted range."""

    default: float
    help: str
    minimum: float = 0.0
    maximum: float = math.inf


#: The smallest modelled saving worth a finding, shared by the rules that predict a gain.
MIN_GAIN_FRACTION = Threshold(0.02, "smallest modelled saving, as a fraction of the step time, "
                              "worth a finding", 0.0, 1.0)


class NotEvaluated(Exception):
    """A rule could not check this job; the message says why (one sentence, no period)."""


class Rule:
    name: ClassVar[str]
    code: ClassVar[str]
    title: ClassVar[str]
    failure_title: ClassVar[str]
    severity: ClassVar[str] = "warning"
    thresholds: ClassVar[dict[str, Threshold]] = {}
    needs: ClassVar[tuple[str, ...]] = ()
    references: ClassVar[tuple[str, ...]] = ()
    # Runs after the others and sees their findings (ctx.findings): a rule for what they leave.
    runs_last: ClassVar[bool] = False

    def check(self, ctx: "RuleContext") -> list[dict[str, Any]]:
        raise NotImplementedError

    @classmethod
    def docs(cls) -> str:
        return _dedent(cls.__doc__ or "")

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        """The docstring's sections, by heading (a heading is a line ending with ':')."""
        sections: dict[str, list[str]] = {}
        current = None
        for line in cls.docs().splitlines():
            heading = line.strip().rstrip(":")
            if line.strip().endswith(":") and heading in DOC_SECTIONS:
                current = heading
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
        return {k: "\n".join(v).strip() for k, v in sections.items()}


RULES: dict[str, type[Rule]] = {}
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to the registry (names and codes must be unique)."""
    if not _NAME.match(cls.name):
        raise ValueError(f"rule name {cls.name!r} must be kebab-case")
    if cls.name in RULES or any(r.code == cls.code for r in RULES.values()):
        raise ValueError(f"duplicate rule {cls.name} / {cls.code}")
    RULES[cls.name] = cls
    return cls


def all_rules() -> dict[str, type[Rule]]:
    """Every rule, by name: each module of this package registers its rule when imported, and
    every module but the engine is imported here (in name order, so the registry is stable)."""
    package = __name__.rpartition(".")[0]
    for info in sorted(pkgutil.iter_modules(sys.modules[package].__path__), key=lambda m: m.name):
        if info.name != "engine" and not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")
    return dict(sorted(RULES.items()))


class RuleContext:
    """What a rule sees: the Result, shared facts, and its own settings."""

    def __init__(self, rule: type[Rule], facts: JobFacts, settings: dict[str, Any],
                 findings: list[dict[str, Any]] | None = None,
                 statuses: list[dict[str, Any]] | None = None):
        self.rule = rule
        self.facts = facts
        self.result = facts.result
        self.model = facts.model  # the job's typed facts (analyzer.job.model): what rules read
        self.thresholds = settings["thresholds"]
        self.severity = settings["severity"]
        self.findings = list(findings or [])  # the findings of the rules that ran before
        self.statuses = {s["rule"]: s["status"] for s in statuses or []}  # and how each ended

    def finding(self, *, summary: str, ranks: list[int], steps: list[Any], evidence: dict[str, Any],
                estimated_gain_us: float | None, model: str | None, fix_text: str,
                fix_snippet: str | None = None, severity: str | None = None) -> dict[str, Any]:
        gain = None if estimated_gain_us is None else round(max(0.0, float(estimated_gain_us)), 1)
        return {
            "rule": self.rule.name, "code": self.rule.code,
            "severity": severity or self.severity,
            "title": self.rule.failure_title,
            "summary": summary,
            "ranks": sorted(set(int(r) for r in ranks)),
            "steps": sorted(set(steps), key=lambda s: (not isinstance(s, int), str(s))),
            "evidence": evidence,
            "estimated_gain_us": gain,
            "model": model,
            "fix": {"text": fix_text, "snippet": fix_snippet},
            "references": list(self.rule.references),
        }


def run_rules(result: Any, config: dict[str, Any] | None = None,
              source: str = "configuration") -> list[dict[str, Any]]:
    """Run every enabled rule on ``result``; store and return the findings, sorted by estimated
    gain (largest first; findings without a gain after, by severity), and set
    ``result.rules`` (each rule's status) and ``result.verdict``."""
    rules = all_rules()
    settings = rule_settings(config or {}, rules, source)
    facts = JobFacts(result)
    findings: list[dict[str, Any]] = []
    statuses = []
    for name, rule in sorted(rules.items(), key=lambda kv: (kv[1].runs_last, kv[0])):
        status = {"rule": name, "code": rule.code}
        if not settings[name]["enabled"]:
            statuses.append({**status, "status": "disabled", "reason": "disabled in configuration"})
            continue
        missing = facts.missing(rule.needs)
        if missing:
            what, reason = missing
            statuses.append({**status, "status": what, "reason": reason})
            continue
        ctx = RuleContext(rule, facts, settings[name], findings, statuses)
        try:
            produced = list(rule().check(ctx) or [])
        except NotEvaluated as exc:
            statuses.append({**status, "status": "not_evaluated", "reason": str(exc)})
            continue
        except Exception as exc:  # a broken rule must not hide the others' findings
            produced = [_error_finding(rule, exc)]
        findings.extend(produced)
        statuses.append({**status, "status": "fired" if produced else "passed",
                         "reason": None})
    findings.sort(key=_finding_order)
    statuses.sort(key=lambda s: s["rule"])
    result.findings = findings
    result.rules = statuses
    result.verdict = verdict(findings, facts, statuses)
    return findings


def _finding_order(f: dict[str, Any]) -> tuple:
    gain = f.get("estimated_gain_us")
    return (gain is None, -(gain or 0.0), SEVERITY_ORDER.get(f["severity"], 3), f["rule"],
            tuple(f.get("ranks") or ()))


def _error_finding(rule: type[Rule], exc: Exception) -> dict[str, Any]:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    location = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}" if where else ""
    return {
        "rule": rule.name, "code": rule.code, "severity": "error",
        "title": f"rule {rule.name} failed",
        "summary": f"The rule raised {type(exc).__name__}: {exc}{location}; its check was skipped.",
        "ranks": [], "steps": [], "evidence": {"exception": type(exc).__name__, "message": str(exc)},
        "estimated_gain_us": None, "model": None,
        "fix": {"text": "Report this as a tracecliff bug with the trace that triggers it.",
                "snippet": None},
        "references": [],
    }


#: Share of the typical step above which exposed communication plus GPU idle is never "no problem".
LARGE_SHARE = 0.10


def verdict(findings: list[dict[str, Any]], facts: JobFacts, statuses: list[dict[str, Any]] | None = None) -> str:
    """One sentence: the biggest problem and its cost, or why the run looks healthy; then the
    rules that could not check. "No scaling problem found" only when the typical step's exposed
    communication and idle together are small (analyzer.job.attribution)."""
    return _headline(findings, facts) + _unchecked(statuses or [])


def _headline(findings: list[dict[str, Any]], facts: JobFacts) -> str:
    tb = facts.result.attribution
    step = tb["step_time_us"] if tb else facts.typical_step_us
    problems = [f for f in findings if not f["title"].startswith("rule ")]
    if problems:
        top = problems[0]
        gain = top.get("estimated_gain_us")
        # The gain is a share of the step its rule measured (e.g. the median over the ranks it
        # fired on): quote that step, not the job's mean, so the sentence matches the finding's.
        of_step = (top.get("evidence") or {}).get("step_time_us") or step
        cost = ""
        if gain and of_step:
            cost = f" (about {gain / 1000:.1f} ms of a {of_step / 1000:.1f} ms step)"
        more = f"; {len(problems) - 1} more finding(s) below" if len(problems) > 1 else ""
        return f"{len(problems)} problem(s) found: {top['title']}{cost}{more}."
    if findings:
        return "No problem found, but a rule failed (see findings)."
    if tb and step:
        exposed = (tb["exposed_wait_us"] + tb["exposed_transfer_us"]) / step
        idle = tb["idle_us"] / step
        shares = (f"exposed communication is {100 * exposed:.1f}% and GPU idle {100 * idle:.1f}% "
                  f"of a {step / 1000:.1f} ms step")
        if exposed + idle >= LARGE_SHARE:  # both are time the GPU does no useful work
            return f"No rule explains the lost time: {shares} (see the time breakdown)."
        return f"No scaling problem found: {shares}."
    if step:
        return "No problem found, but no time breakdown could be made, so the step is not accounted for (see warnings)."
    # Not "no problem": with no GPU steps the step-time rules could not look (they say so below).
    return "No GPU steps in the traces (CPU-only profile?): only structural checks ran, and none found a problem."


def _unchecked(statuses: list[dict[str, Any]]) -> str:
    skipped = [s for s in statuses if s.get("status") == "not_evaluated"]
    if not skipped:
        return ""
    names = ", ".join(s["rule"] for s in skipped)
    return f" {len(skipped)} rule(s) could not check: {names}."


def _dedent(text: str) -> str:
    lines = text.expandtabs().splitlines()
    indent = min((len(l) - len(l.lstrip()) for l in lines[1:] if l.strip()), default=0)
    return "\n".join([lines[0].strip()] + [l[indent:] for l in lines[1:]]).strip() if lines else ""
