"""The gain engine the rules are handed (analyzer.job.gains.GainEngine): each operation the
what-if projection (analyzer.whatif.prediction, .projection) or the replay of the measured job
(analyzer.whatif.replay, .counterfactual) already makes, delegated to."""

from __future__ import annotations

from typing import Any

from analyzer.job.gains import Counterfactuals, GainEngine
from analyzer.whatif import counterfactual, prediction, projection, replay


class WhatIfGains:
    """``GainEngine`` by the what-if layer (stateless: what it keeps, it keeps on the Result)."""

    def what_if(self, result: Any) -> prediction.WhatIf:
        return prediction.WhatIf.of(result)

    def what_if_or_own(self, result: Any, step_us: float, own_gain_us: float, own_model: str,
                       own_assumptions: dict[str, Any] | None = None,
                       **changes: Any) -> tuple[float, str, dict[str, Any]]:
        return prediction.what_if_or_own(result, step_us, own_gain_us, own_model, own_assumptions, **changes)

    def measured_strategy(self, result: Any) -> str:
        return projection.measured_strategy(result)

    def replayed_exposed(self, result: Any, us: float) -> tuple[float, dict[str, Any]] | None:
        return counterfactual.replayed_exposed(result, us)

    def replayed_rank_fixes(self, result: Any, causes: dict[int, str]) -> tuple[float, Any] | None:
        replayer = counterfactual.Replayer.of(result)
        if not replayer.ok or replayer.chains is None:
            return None
        fixes = [f for r, cause in sorted(causes.items()) if (f := replayer.cause_fix(r, cause)) is not None]
        if not fixes:
            return None
        return replayer.saving(counterfactual.union(replayer.chains, fixes)), replayer.steps

    def chains(self, result: Any) -> replay.Chains | None:
        return replay.chains(result)

    def cause_fix(self, chains: Any, every: dict[Any, dict[int, dict[str, Any]]], rank: int, cause: str,
                  excess: Any = None) -> replay.ReplayFix | None:
        return replay.cause_fix(chains, every, rank, cause, excess)

    def greedy(self, chains: Any, fixes: dict[Any, Any], steps: list[Any], share: float,
               floor_share: float = 0.0) -> Counterfactuals:
        return replay.greedy(chains, fixes, steps, share, floor_share)

    def joint_replay(self, result: Any, findings: list[dict[str, Any]]) -> tuple[float, tuple[str, ...]] | None:
        return prediction.joint_replay(result, findings)


WHATIF_GAINS: GainEngine = WhatIfGains()  # typed: mypy checks that it implements the protocol
