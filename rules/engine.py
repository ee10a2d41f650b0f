"""The rules engine: a registry of rules (one file per rule in this package), their settings,
and ``run_rules`` which turns a diagnosed Result into findings.

A rule is a class with a stable ``name`` (public contract), a short ``code``, a ``title`` (what
it checks) and a ``failure_title`` (what a finding says), a default ``severity``, configurable
``thresholds``, the analyses it ``needs``, and docs in its docstring with the sections of
``DOC_SECTIONS``. ``check(ctx)`` returns plain data: a list of finding dicts built with
``ctx.finding(...)``. Three statuses say a rule found nothing, and they are never confused:
``passed`` (it checked and found nothing), ``not_applicable`` (its subject is absent: no gradient
collectives for a gradient rule, no communication for a communication rule, one process for a
rule about ranks waiting for each other; the job cannot have the problem) and ``not_evaluated``
(the job may have the problem, but the traces cannot show it: no phases, sizes unknown, a needed
rank missing). A rule says which by raising :class:`NotApplicable` or :class:`NotEvaluated`
with the reason (or through its ``needs``, analyzer.job.facts); the verdict names the rules that
could not check. A rule that raises anything else becomes an ``error`` finding for that rule and
the run goes on. Each fix a rule suggests declares what must be true of the job for it to apply
(``fix_requires``, or a :class:`Fix` per fix), checked before it is printed.
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

from analyzer.job.memory import fits_verdict
from analyzer.base.config import SEVERITY_ORDER, rule_settings
from analyzer.base.units import fmt_us
from analyzer.job.facts import JobFacts
from analyzer.job.model import JobModel, leaf_names, recoverable, split_gain
from analyzer.rank.workload import INFERENCE_NOTE
from analyzer.job.gains import GainEngine
from analyzer.job.prediction_doc import NO_MODEL, not_predicted, predicted
from analyzer.rules.evidence_types import Evidence as EvidenceStruct, evidence_dict, register_evidence

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


@dataclass(frozen=True)
class Fix:
    """One fix a finding suggests, and what must be true of the job for it to apply: the names
    of ``analyzer.job.facts.FIX_PRECONDITIONS``, each checked before the fix is printed."""

    text: str
    snippet: str | None = None
    requires: tuple[str, ...] = ()
    # Printed only when no fix before it is (the general advice where the specific one's premise fails).
    otherwise: bool = False
    # What its snippet needs beyond ``requires`` (a DDP call shown only on a DDP job).
    snippet_requires: tuple[str, ...] = ()


class NotEvaluated(Exception):
    """A rule could not check this job; the message says why (one sentence, no period)."""


class NotApplicable(Exception):
    """What a rule checks is absent from this job (it cannot have the problem); the message says
    what is missing (one sentence, no period)."""


class Rule:
    name: ClassVar[str]
    code: ClassVar[str]
    title: ClassVar[str]
    failure_title: ClassVar[str]
    severity: ClassVar[str] = "warning"
    thresholds: ClassVar[dict[str, Threshold]] = {}
    needs: ClassVar[tuple[str, ...]] = ()
    references: ClassVar[tuple[str, ...]] = ()
    # The leaves of the typical step (analyzer.job.model.LEAVES) its fix gives back, by default.
    recovers: ClassVar[tuple[str, ...]] = ()
    # Runs after the others and sees their findings (ctx.findings): a rule for what they leave.
    runs_last: ClassVar[bool] = False
    # What the job must be for the rule's fix to apply (FIX_PRECONDITIONS), where the rule gives
    # one fix text; a rule with several passes each its own ``Fix`` (ctx.finding's ``fixes``).
    fix_requires: ClassVar[tuple[str, ...]] = ()
    # Its evidence's type (analyzer.rules.evidence_types): the Struct ``check`` hands ctx.finding,
    # whose annotations give every field's label and unit to the views. None: not typed yet
    # (tests/test_one_truth.py EVIDENCE_UNTYPED).
    Evidence: ClassVar[type[EvidenceStruct] | None] = None

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
    if cls.Evidence is not None:
        register_evidence(cls.name, cls.Evidence)
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
    """What a rule sees: the Result, shared facts, its own settings, and the gain engine it
    asks what a fix is worth beyond its own model (``gains``: analyzer.job.gains.GainEngine,
    handed in by the caller of ``run_rules``: the rules import no what-if model)."""

    def __init__(self, rule: type[Rule], facts: JobFacts, settings: dict[str, Any],
                 findings: list[dict[str, Any]] | None = None,
                 statuses: list[dict[str, Any]] | None = None, *, gains: GainEngine):
        self.rule = rule
        self.gains = gains
        self.facts = facts
        self.result = facts.result
        self.model = facts.model  # the job's typed facts (analyzer.job.model): what rules read
        self.thresholds = settings["thresholds"]
        self.severity = settings["severity"]
        self.findings = list(findings or [])  # the findings of the rules that ran before
        self.statuses = {s["rule"]: s["status"] for s in statuses or []}  # and how each ended

    def finding(self, *, summary: str, ranks: list[int], steps: list[Any], evidence: dict[str, Any] | EvidenceStruct,
                estimated_gain_us: float | None, model: str | None, fix_text: str,
                fix_snippet: str | None = None, severity: str | None = None,
                recovers: dict[str, float] | tuple[str, ...] | None = None,
                fixes: list[Fix] | None = None) -> dict[str, Any]:
        """A finding; ``recovers``: the leaves its fix gives back (the rule's by default), or its
        gain split over them in µs when the rule knows the split, each part at most that leaf's
        time in the typical step (analyzer.job.model.split_gain). Its evidence states what the fix
        is worth (``evidence["prediction"]``, analyzer.job.prediction_doc): the rule's own when it
        gives one, else the typical step less the gain, or "no model for this fix". A rule's own
        estimate beyond what those leaves hold is capped at it, and the model text says so.
        The fix: ``fixes`` (each with its preconditions; their texts joined, the first kept
        snippet), else ``fix_text`` / ``fix_snippet`` under the rule's ``fix_requires``; a fix
        whose precondition fails on this job is not printed, and ``evidence["fix_preconditions"]``
        records each with what it requires and why it was withheld. ``evidence``: the rule's
        ``Evidence`` type (a typed rule hands no other), else a dict (a rule not typed yet)."""
        if isinstance(evidence, EvidenceStruct):
            if type(evidence) is not self.rule.Evidence:
                raise TypeError(f"{self.rule.name} hands {type(evidence).__name__}, its Evidence is "
                                f"{getattr(self.rule.Evidence, '__name__', None)}")
            evidence = evidence_dict(evidence)
        elif self.rule.Evidence is not None:
            raise TypeError(f"{self.rule.name} declares {self.rule.Evidence.__name__} but hands a {type(evidence).__name__}")
        fix_text, fix_snippet = self._fixes(evidence, fixes if fixes is not None else
                                            [Fix(fix_text, fix_snippet, self.rule.fix_requires)], fixes is not None)
        gain = None if estimated_gain_us is None else round(max(0.0, float(estimated_gain_us)), 1)
        leaves = self.rule.recovers if recovers is None else recovers
        split = {} if gain is None else split_gain(gain, leaves, self.model.typical)
        held = round(sum(split.values()), 1)
        if gain is not None and self.model.typical is not None and held < gain - 0.05:
            # The typical step holds less of the leaves the fix gives back than the estimate (a
            # per-rank figure, or another step's): what the typical step would gain is that part.
            if "prediction" not in evidence:  # the rule's own estimate
                evidence["estimate_beyond_typical_step_us"] = round(gain - held, 1)
                model = (f"{model}; " if model else "") + (
                    f"capped at the {fmt_us(held)} of {' and '.join(leaf_names(split))} the typical step holds "
                    f"(mean over ranks) of the {fmt_us(gain)} estimate")
                gain = held
            else:  # a model's projection stands: the rest is in leaves the finding does not name
                evidence["gain_outside_recovered_leaves_us"] = round(gain - held, 1)
        if "prediction" not in evidence:
            step = self.model.step_time_us
            evidence["prediction"] = (not_predicted(NO_MODEL) if gain is None else
                                      predicted(step, gain, "the rule's own estimate (its model below)")
                                      if step else not_predicted("the typical step time is unknown"))
        parts = {leaf: None for leaf in leaves} if gain is None else {leaf: round(v, 1) for leaf, v in split.items()}
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
            "recovers": parts,
        }


    def _fixes(self, evidence: dict[str, Any], fixes: list[Fix], joined: bool) -> tuple[str, str | None]:
        """(text, snippet) of the fixes whose preconditions hold; each fix's check into the
        evidence. ``joined``: the texts are clauses of one sentence (several fixes)."""
        kept, record = [], []
        for fix in fixes:
            failed = {need: why for need in fix.requires if (why := self.facts.fix_precondition(need))}
            if fix.otherwise and kept:
                failed["otherwise"] = "a fix before it applies"
            entry = {"fix": fix.text, "requires": list(fix.requires), "printed": not failed, "failed": failed}
            snippet_failed = {need: why for need in fix.snippet_requires if (why := self.facts.fix_precondition(need))}
            if fix.snippet and fix.snippet_requires:
                entry.update(snippet_requires=list(fix.snippet_requires), snippet_failed=snippet_failed)
            record.append(entry)
            if not failed:
                kept.append(fix if not snippet_failed else Fix(fix.text, None, fix.requires))
        evidence["fix_preconditions"] = record
        if not kept:
            reasons = "; ".join(sorted({why for r in record for why in r["failed"].values()}))
            return f"No fix this rule knows applies to this job ({reasons}).", None
        snippet = next((f.snippet for f in kept if f.snippet), None)
        if not joined:
            return kept[0].text, snippet
        text = "; ".join(f.text for f in kept)
        return text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."), snippet


def run_rules(result: Any, config: dict[str, Any] | None = None,
              source: str = "configuration", *, gains: GainEngine) -> list[dict[str, Any]]:
    """Run every enabled rule on ``result``; store and return the findings, sorted by estimated
    gain (largest first; findings without a gain after, by severity), and set
    ``result.rules`` (each rule's status) and ``result.verdict``. ``gains``: the gain engine
    the rules ask (analyzer.whatif.gains.WHATIF_GAINS, which analyzer.api hands in); required,
    so that no run drops the gains silently."""
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
        ctx = RuleContext(rule, facts, settings[name], findings, statuses, gains=gains)
        try:
            produced = list(rule().check(ctx) or [])
        except NotEvaluated as exc:
            statuses.append({**status, "status": "not_evaluated", "reason": str(exc)})
            continue
        except NotApplicable as exc:
            statuses.append({**status, "status": "not_applicable", "reason": str(exc)})
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
    typical = facts.model.typical
    problems = [f for f in findings if not f["title"].startswith("rule ")]
    # the joint estimate: every finding's fix at once on the replay of the measured job
    joint, failed = None, None
    try:
        joint = gains.joint_replay(result, problems) if typical and problems else None
    except Exception as exc:  # a broken replay must not hide the findings: the leaf count stands, and says why
        failed = f"{type(exc).__name__}: {exc}"
    result.recoverable = recoverable(typical, problems, joint).to_dict() if typical and problems else None
    if failed and result.recoverable:
        result.recoverable["source"] += f"; the replay failed ({failed}): please report it"
    result.verdict = verdict(findings, facts.model, statuses, result.recoverable)
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
        "references": [], "recovers": {},
    }


#: Share of the typical step above which exposed communication plus GPU idle is never "no problem".
LARGE_SHARE = 0.10


def verdict(findings: list[dict[str, Any]], model: JobModel, statuses: list[dict[str, Any]] | None = None,
            joint: dict[str, Any] | None = None) -> str:
    """One sentence: the biggest problem and its cost on the typical step, what the findings
    together recover (``joint``: the Result's ``recoverable``), or why the run looks healthy;
    then the rules that could not check. "No scaling problem found" only when the typical step's
    exposed communication and idle together are small (analyzer.job.model)."""
    return _workload(model) + _headline(findings, model, joint) + _unchecked(statuses or [])


def _workload(model: JobModel) -> str:
    """An inference job is named first: the reader must not take its findings for a training step's."""
    return f"Inference ({INFERENCE_NOTE}): " if model.workload == "inference" else ""


def _headline(findings: list[dict[str, Any]], model: JobModel, joint: dict[str, Any] | None) -> str:
    typical = model.typical
    step = model.step_time_us
    problems = [f for f in findings if not f["title"].startswith("rule ")]
    if problems:
        # A fix that does not fit the GPU (evidence.memory) is never the one the verdict leads with.
        top = next((f for f in problems if fits_verdict(f) is not False), problems[0])
        gain = top.get("estimated_gain_us")
        if gain and step:
            # the gain, named as such: not the exposed time the title speaks of (a finding's fix
            # may recover less than its leaf holds)
            cost = f" (its estimated gain is about {fmt_us(gain)} of the {fmt_us(step)} typical step)"
        elif gain is not None and step:  # estimated, and nothing to gain at this scale
            cost = f" (its estimated gain is {fmt_us(gain)} of the {fmt_us(step)} typical step)"
        else:
            cost = f" (no estimate of the gain; the {fmt_us(step)} typical step)" if step else ""
        more = f"; {len(problems) - 1} more finding(s) below" if len(problems) > 1 else ""
        unfit = sum(fits_verdict(f) is False for f in problems)
        if unfit:
            more += f"; {unfit} fix(es) would not fit the GPU's memory (see evidence.memory)"
        return f"{len(problems)} problem(s) found: {top['title']}{cost}{_together(joint)}{more}."
    if findings:
        return "No problem found, but a rule failed (see findings)."
    if typical is not None and step:
        exposed, idle = typical.exposed_share or 0.0, typical.idle_share or 0.0
        shares = (f"exposed communication is {100 * exposed:.1f}% and GPU idle {100 * idle:.1f}% "
                  f"of the {fmt_us(step)} typical step")
        if exposed + idle >= LARGE_SHARE:  # both are time the GPU does no useful work
            return f"No rule explains the lost time: {shares} (see the time breakdown)."
        return f"No scaling problem found: {shares}."
    if model.ranks and any(r.steps for r in model.ranks):
        return "No problem found, but no time breakdown could be made, so the step is not accounted for (see warnings)."
    # Not "no problem": with no GPU steps the step-time rules could not look (they say so below).
    if not model.gpu_events and model.unread_device_events:
        return (f"No GPU work could be read: {model.unread_device_events:,} event(s) under categories tracecliff does "
                "not know look like device work (see warnings); only the structural checks could run.")
    if not model.gpu_events:
        return ("CPU-only traces (no GPU work recorded): only the structural checks could run, and none found a "
                "problem.")
    return "No GPU steps in the traces: only structural checks ran, and none found a problem."


JOINT_REPLAYED = " (all fixes together, replayed)"
JOINT_PART_REPLAYED = " (the fixes the replay expresses replayed together, the others' gains added)"


def _together(joint: dict[str, Any] | None) -> str:
    """What several findings recover together, counted once where they claim the same time."""
    if not joint or len(joint["findings"]) < 2:
        return ""
    shared = leaf_names({leaf: 0 for f in joint["findings"] for leaf in f["shared_us"]})
    text = f"; together the findings recover about {fmt_us(joint['joint_us'])}"
    if joint.get("replayed_us") is not None:
        text += JOINT_REPLAYED if joint.get("replayed_all") else JOINT_PART_REPLAYED
    if shared:
        text += (f", not the {fmt_us(joint['sum_us'])} their gains add up to: they claim the same "
                 + " and ".join(shared))
    return text


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
