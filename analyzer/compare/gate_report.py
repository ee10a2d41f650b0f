"""The report ``tracecliff gate`` makes (analyzer.compare.gate.evaluate) and its views render
(analyzer.reports.gate_text): the checks, their thresholds and the report, as data types with
the words they say of themselves and nothing computed from a run. A module of its own so that
the views import the type they render and none of the gate's analysis (tests/test_architecture.py,
VIEW_MAY_IMPORT)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.base.units import fmt_unit
# the fewest step-to-step changes a noise figure rests on: a constant of the metrics' spread,
# said in the threshold's note
from analyzer.compare.metrics import NOISE_MIN_CHANGES

EXIT_PASS, EXIT_FAIL = 0, 1  # 2 (usage, input, config) comes from analyzer.cli.main
STATUSES = ("pass", "fail", "warn", "skip", "improved", "suspect")


@dataclass(frozen=True)
class GateThreshold:
    """How large a worse-direction change of one metric must be to count as a regression: the
    largest of three terms, in percentage points of the step (a share) or in % of the baseline
    figure (every other metric), and which of them it was."""

    value: float
    unit: str  # "pp" | "%"
    basis: str  # "limit" (max_regression_pct) | "floor" | "noise"
    limit: float
    floor: float
    noise: float
    # σ of the figure from one steady step to the next (analyzer.compare.metrics.spread), in the
    # metric's unit; None: neither run has enough steady steps to measure it, the noise is
    # unknown (no noise term)
    sigma: float | None
    changes: int  # the step-to-step changes of the figure ``sigma`` was taken from
    steps: int  # the steady steps of that run (unknown noise: of the run with more)
    spread_of: str | None  # "baseline" | "new run": whose σ it is (the larger known)

    @property
    def short(self) -> str:
        """The threshold and the term that set it, for a table cell ("2.00 pp floor"): the
        noise's basis and the unknown noise are said once, under the table (``note``)."""
        return f"{change_text(self.value, self.unit)} {self.basis}"

    @property
    def note(self) -> str:
        """What the noise term rests on: unknown (too few steady steps), or σ from which run."""
        if self.sigma is None:
            return f"noise unknown: {self.steps} steady step(s), {NOISE_MIN_CHANGES + 1} needed"
        return (f"noise: σ {self.sigma:.3g} from the {self.spread_of}'s {self.changes} step-to-step change(s) "
                f"over {self.steps} steady steps")

    @property
    def text(self) -> str:
        """The threshold, the term that set it and, with the noise unknown, that too."""
        return self._said(f"; {self.note}" if self.sigma is None else "")

    @property
    def own(self) -> str:
        """``text`` less the unknown noise: a note every comparison of the gate shares, said once
        (``GateReport.notes``), not on each check's ``bound``."""
        return self._said("")

    def _said(self, unknown: str) -> str:
        amount = change_text(self.value, self.unit)
        if self.basis == "limit":
            return f"{amount} (max_regression_pct{unknown})"
        if self.basis == "floor":
            return f"{amount} ({'max_regression_pp' if self.unit == 'pp' else 'floor'}{unknown})"
        return (f"{amount} (noise: σ {self.sigma:.3g} from the {self.spread_of}'s {self.changes} step-to-step "
                f"change(s) over {self.steps} steady steps)")


@dataclass
class Check:
    kind: str  # "run" | "assertion" | "baseline"
    name: str
    level: str
    status: str  # one of STATUSES
    actual: float | None
    bound: str  # an assertion's bound; a baseline comparison's threshold, in words
    aggregate: str | None
    message: str
    base: float | None = None
    change_pct: float | None = None  # relative change, % of the baseline figure
    change_pp: float | None = None  # a share's change, percentage points of the step
    threshold: GateThreshold | None = None
    # the unit of the metric's figures (analyzer.compare.metrics; "" for none), which the views
    # format ``base`` and ``actual`` in (analyzer.base.units.fmt_metric); not in ``to_dict``
    unit: str = field(default="", compare=False)


@dataclass
class GateReport:
    checks: list[Check]
    baseline: str | None = None
    # What diagnose says of the inputs (a field it could not use, ranks missing...): a gate
    # never passes in silence over a run it read only in part.
    warnings: list[str] = field(default_factory=list)
    # Against a baseline: the findings that appeared or grew since it (analyzer.compare.diff.
    # grown_findings), and the command that shows the whole difference.
    findings_since: list[dict[str, Any]] | None = None
    diff_command: str | None = None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.failed else EXIT_PASS

    @property
    def notes(self) -> list[str]:
        """What the comparisons share, said once: the unknown noise (too few steady steps)."""
        return sorted({c.threshold.note for c in self.checks if c.threshold is not None and c.threshold.sigma is None})

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        return {"status": "fail" if self.failed else "pass", "exit_code": self.exit_code,
                "baseline": self.baseline, "counts": self.counts(),
                "checks": [_check_dict(c) for c in self.checks], "notes": self.notes, "warnings": self.warnings,
                "findings_since_baseline": self.findings_since, "diff_command": self.diff_command}


def change_text(value: float, unit: str) -> str:
    """A change in percentage points (``pp``) or in % of the baseline (``%``)."""
    return "from zero" if math.isinf(value) else fmt_unit(value, unit)


def _check_dict(check: Check) -> dict[str, Any]:
    """A check's fields as the gate's JSON has them (its unit aside: the metric's, said by
    ``tracecliff gate``'s text)."""
    out = asdict(check)
    del out["unit"]
    return out
