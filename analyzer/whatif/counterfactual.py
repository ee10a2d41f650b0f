"""The fixes findings predict as counterfactuals of the replay (analyzer.whatif.replay): one
engine turns each into a step-time gain, and the same engine replays every finding's fix at
once for the verdict's joint estimate (docs/models.md §9).

- a link (``tracecliff whatif --target-nics-per-node / --target-nic-gbps``, comm-bound-step's
  NIC fix): every set's transfer × the α-β ratio of the target link to the measured one
  (``projection.link_ratios``, models.md §2), replayed;
- a fix the what-if projection re-schedules (a bucket cap, prefetch, FSDP units, a strategy):
  the projection's change of the exposed communication (its model as the input, ``WhatIf.fix``)
  taken out of the transfers that were exposed in each step, in proportion to each set's
  exposed transfer (median member), replayed: what the step saves once the other ranks' chains
  (a late rank, a stalled host) are replayed with it;
- a rank's cause (straggler-rank, gpu-idle-host-bound): ``replay.cause_fix``.

A what-if that makes the step slower keeps the projection's change (nothing to take out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.base.memo import memo
from analyzer.job.waits import step_breakdowns
from analyzer.whatif import replay as rp
from analyzer.whatif.projection import Scenario, link_ratios

# What-if fields that change the links only: the measured chains, every transfer scaled.
LINK_FIELDS = frozenset({"nics_per_node", "nic_gbps"})
# Scenario fields of the projected job (the others describe the measured one)
TARGET_FIELDS = ("gpus", "nodes", "gpus_per_node", "nics_per_node", "nic_gbps", "strategy", "bucket_mb", "fsdp_units",
                 "strong_scaling")
LINK_ENGINE = "replay of the measured job, each transfer × the α-β ratio of the target link (docs/models.md §2, §9)"
EXPOSED_ENGINE = ("replay of the measured job, the projection's change of the exposed communication taken out of "
                  "the transfers exposed in each step (docs/models.md §9)")
JOINT_SOURCE = "all fixes together, replayed"


class Replayer:
    """One Result's chains, measured replay and the steps a saving is the mean over (built once)."""

    def __init__(self, result: Any):
        self.result = result
        self.rows = result.collectives  # the rows it was made from
        # every rank's chain, or the replay misses the ranks not given (one of them may set the pace)
        complete = len(result.ranks) >= max(2, int(result.job.get("world_size") or 0))
        self.chains = rp.chains(result) if complete else None
        every = step_breakdowns(result)
        self.every = every
        self.steps = rp.replay_steps(result, every)
        self.ok = self.chains is not None and bool(self.steps)
        self.base = rp.replay(self.chains) if self.ok else None
        self._excess: np.ndarray | None = None

    @classmethod
    def of(cls, result: Any) -> Replayer:
        """The Replayer kept with ``result`` (analyzer.base.memo; remade when its collective rows
        are replaced)."""
        return memo(result, "replayer", lambda: cls(result), result.collectives)

    def saving(self, fix: rp.ReplayFix) -> float:
        assert self.ok and self.chains is not None and self.base is not None
        return rp.saving(self.base, rp.replay(self.chains, fix), self.steps)

    def link_fix(self, scenario: Scenario) -> rp.ReplayFix:
        """Every set's transfer at the target link's: its measured transfer × the α-β ratio."""
        chains = self.chains
        assert chains is not None
        per_set = np.ones(len(chains.transfer))
        per_set[chains.set_of] = link_ratios(self.result, scenario)
        return _transfer_fix(chains, chains.transfer * (1.0 - per_set))

    def exposed_fix(self, us: float) -> rp.ReplayFix:
        """``us`` per step out of the step's exposed transfers, each set's share in proportion to
        its exposed transfer (the median member's: min(its exposed time, the set's transfer))."""
        chains = self.chains
        assert chains is not None
        exposed = np.zeros(len(chains.rank)) if chains.exposed is None else chains.exposed
        own = np.minimum(exposed, chains.transfer[chains.set_of])
        weight = _set_medians(chains, own)
        cut = np.zeros(len(chains.transfer))
        by_step: dict[Any, list[int]] = {}
        for s, rows in zip(chains.order.tolist(), chains.members):
            step = chains.step[int(rows[0])]
            if step is not None:
                by_step.setdefault(step, []).append(s)
        for sets in by_step.values():
            total = float(weight[sets].sum())
            if total > 0.0:
                cut[sets] = weight[sets] * min(1.0, us / total)
        return _transfer_fix(chains, cut)

    def cause_fix(self, rank: int, cause: str) -> rp.ReplayFix | None:
        assert self.chains is not None
        if self._excess is None:
            self._excess = self.chains.gap_excess()
        return rp.cause_fix(self.chains, self.every, rank, cause, self._excess)

    def scenario(self, scenario: Scenario, projected_change_us: float) -> tuple[rp.ReplayFix, str] | None:
        """The counterfactual of a what-if (``scenario``, the projection's change of the step):
        the link's, else the projection's faster exposed communication; None where the job
        cannot be replayed or the projection makes the step slower."""
        if not self.ok:
            return None
        changed = {f for f in TARGET_FIELDS if getattr(scenario, f) not in (None, False)}
        if changed and changed <= LINK_FIELDS:
            return self.link_fix(scenario), LINK_ENGINE
        if projected_change_us < 0.0:
            return self.exposed_fix(-projected_change_us), EXPOSED_ENGINE
        return None


def replayed_change(result: Any, scenario: Scenario, projected_change_us: float) -> tuple[float, str | None,
                                                                                   rp.ReplayFix | None]:
    """(the step's change µs, the engine's words, the counterfactual) of a what-if the projection
    changes the step by ``projected_change_us``: the replay's saving of its counterfactual, the
    projection's change where there is none (slower, or the job cannot be replayed). The one
    figure a finding predicts and ``tracecliff whatif`` prints."""
    changed = {f for f in TARGET_FIELDS if getattr(scenario, f) not in (None, False)}
    if projected_change_us >= 0.0 and not (changed and changed <= LINK_FIELDS):
        return projected_change_us, None, None  # slower: nothing to take out (no chains to build)
    replayer = Replayer.of(result)
    found = replayer.scenario(scenario, projected_change_us)
    if found is None:
        return projected_change_us, None, None
    fix, engine = found
    return -replayer.saving(fix), engine, fix


EXPOSED_CUT = "exposed_cut_us"  # a prediction's assumption: the model's cut of the exposed communication


def replayed_exposed(result: Any, us: float) -> tuple[float, dict[str, Any]] | None:
    """(the step's saving, the assumption to quote) of a rule's own model that shortens the exposed
    communication by ``us`` per step (FSDP prefetch), turned into a gain by the replay (None: the
    job cannot be replayed): the model is the counterfactual's input, the replay the figure."""
    replayer = Replayer.of(result)
    if not replayer.ok or us <= 0.0:
        return None
    return replayer.saving(replayer.exposed_fix(us)), {
        EXPOSED_CUT: {"value": round(us, 1), "origin": "derived",
                      "source": "the rule's model of the exposed communication the fix removes, per step: the "
                                "counterfactual's input, taken out of the exposed transfers and replayed"}}


def _set_medians(chains: rp.Chains, values: np.ndarray) -> np.ndarray:
    """Per set, the median of its members' ``values``: the sets of one size at once."""
    out = np.zeros(len(chains.transfer))
    sizes = np.array([len(rows) for rows in chains.members])
    order = chains.order
    for size in np.unique(sizes).tolist():
        picked = np.flatnonzero(sizes == size)
        rows = np.stack([chains.members[k] for k in picked.tolist()])
        out[order[picked]] = np.median(values[rows], axis=1)
    return out


def _transfer_fix(chains: rp.Chains, cut: np.ndarray) -> rp.ReplayFix:
    return rp.ReplayFix(np.zeros(len(chains.rank)), {}, {}, cut)


def union(chains: rp.Chains, fixes: list[rp.ReplayFix]) -> rp.ReplayFix:
    """Every fix at once, each cut once: where two fixes take time out of the same offset or
    transfer (a rank's stall named by two findings), the larger cut, never their sum."""
    out = rp.no_fix(chains)
    cut, transfer = out.cut, np.zeros(len(chains.transfer))
    window: dict[Any, float] = {}
    floor: dict[Any, float] = {}
    for fix in fixes:
        cut = np.maximum(cut, fix.cut)
        if fix.transfer_cut is not None:
            transfer = np.maximum(transfer, fix.transfer_cut)
        for held, given in ((window, fix.window_cut), (floor, fix.floor_cut)):
            for key, us in given.items():
                held[key] = max(held.get(key, 0.0), us)
    return rp.ReplayFix(cut, window, floor, transfer)
