"""What a finding's fix is worth beyond the rule's own model: the gain engine the rules are
handed (``RuleContext.gains``), never one they import. ``GainEngine`` names exactly the
operations the rules use; analyzer.whatif.gains implements it (the what-if projection and the
replay of the measured job), and analyzer.api hands that implementation to ``run_rules``. The
rules depend on this protocol only, so the what-if layer stays above them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from analyzer.job.prediction_doc import ProjectedFix


@dataclass(frozen=True)
class Counterfactuals:
    """What fixing each candidate is worth (µs of the step: ``saving``): alone, in the greedy
    order (each one's saving once those before it are fixed) and all of the named ones at once."""

    order: list[int]  # the named ones, greedy order
    alone: dict[int, float]  # every candidate
    in_order: dict[int, float]  # the named ones
    together: float  # the named ones fixed at once
    recoverable: float  # every candidate fixed at once
    beyond: dict[int, float]  # each candidate not named: its saving once the named ones are fixed


class ReplayChains(Protocol):
    """Each rank's chain of work of the measured job, as the replay holds it (analyzer.whatif.replay.Chains)."""

    @property
    def rank(self) -> Any: ...  # the rank of each collective row

    def gap_excess(self) -> Any: ...


class WhatIfFixes(Protocol):
    """The what-if projections of one Result's fixes (analyzer.whatif.prediction.WhatIf)."""

    def measured(self, key: str) -> Any: ...

    def fix(self, **changes: Any) -> ProjectedFix | None: ...


class GainEngine(Protocol):
    """The gains the rules ask for, each computed by the what-if layer."""

    def what_if(self, result: Any) -> WhatIfFixes:
        """The projections of ``result``'s fixes (one per run: every fix against one projection as measured)."""
        ...

    def what_if_or_own(self, result: Any, step_us: float, own_gain_us: float, own_model: str,
                       own_assumptions: dict[str, Any] | None = None,
                       **changes: Any) -> tuple[float, str, dict[str, Any]]:
        """(gain, where from, prediction) of a fix the projection expresses as ``changes``, else the rule's own."""
        ...

    def measured_strategy(self, result: Any) -> str:
        """The data-parallel strategy the projection reads from the job (ddp, fsdp-full, hsdp, ...)."""
        ...

    def replayed_exposed(self, result: Any, us: float) -> tuple[float, dict[str, Any]] | None:
        """(the step's saving, the assumption to quote) of ``us`` less exposed communication per step, replayed."""
        ...

    def replayed_rank_fixes(self, result: Any, causes: dict[int, str]) -> tuple[float, Any] | None:
        """(the saving, the steps replayed) of fixing these ranks' causes at once on the replay;
        None where the job cannot be replayed or no cause of theirs can be."""
        ...

    def chains(self, result: Any) -> ReplayChains | None:
        """The chains of the measured job (None: it cannot be replayed)."""
        ...

    def cause_fix(self, chains: ReplayChains, every: dict[Any, dict[int, dict[str, Any]]], rank: int, cause: str,
                  excess: Any = None) -> Any:
        """The counterfactual fixing the rank's cause (None: a cause the replay cannot fix)."""
        ...

    def greedy(self, chains: ReplayChains, fixes: dict[Any, Any], steps: list[Any], share: float,
               floor_share: float = 0.0) -> Counterfactuals:
        """The greedy counterfactual over the candidates' fixes."""
        ...

    def joint_replay(self, result: Any, findings: list[dict[str, Any]]) -> tuple[float, tuple[str, ...]] | None:
        """(what the findings' fixes save at once on the replay, the rules whose fix it applies)."""
        ...
