"""The replay of the measured job (analyzer.whatif.replay): replaying the measured chains gives
back every rank-step's measured time, each collective's members end where the model says (the
last arrival + the transfer), and a counterfactual's saving matches the generator re-simulating
the job with that fix (the prediction audit, tests/prediction_audit.py, checks the rules' use)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from analyzer.synth.programs import build_program
from analyzer.synth.scenarios import GPT_1_5B
from analyzer.synth.truth import build_truth
from analyzer.whatif.replay import chains, no_fix, rank_fix, replay, replay_fix, saving
from prediction_audit import _diagnose_unseen
from rule_cases_lib import diagnosed, sample_traces

TRACES = sorted(t for t in sample_traces() if not t.startswith("real/"))


@pytest.mark.parametrize("trace", TRACES)
def test_replaying_the_measured_chains_gives_every_rank_step(trace):
    result = diagnosed(trace)
    measured = chains(result)
    if measured is None:
        assert not len(result.collectives) or not any(e.get("window_ns") for r in result.ranks for e in r.steps)
        return
    replayed = replay(measured)
    assert replayed.steps.keys() == measured.steps.keys()
    for step, ranks in measured.steps.items():
        for rank, us in ranks.items():
            assert abs(replayed.steps[step][rank] - us) <= 0.01 * us, (step, rank)
    assert saving(replayed, replay_fix(measured, no_fix(measured)), list(measured.steps)) == 0.0


@pytest.mark.parametrize("trace", ["synthetic/ddp_straggler", "synthetic/ddp_two_late_ranks",
                                   "synthetic/fsdp_fullshard_2node", "synthetic/megatron_tp4_dp2"])
def test_members_of_a_collective_end_together_at_last_arrival_plus_transfer(trace):
    """The model's premise on the traces: each member's own kernel end (its start + duration,
    clock corrected) is the set's end = latest arrival + shortest kernel, up to jitter."""
    c = chains(diagnosed(trace))
    own_end = c.arrival + np.asarray([d for d in diagnosed(trace).collectives.values("dur_us")])
    sets = np.array([len(m) for m in c.members])
    matched = np.concatenate([m for m, n in zip(c.members, sets) if n > 1])
    step_us = np.median([us for ranks in c.steps.values() for us in ranks.values()])
    assert np.abs(own_end[matched] - c.end[c.set_of[matched]]).max() <= 0.01 * step_us


def _truth(spec) -> float:
    return float(build_truth(build_program(spec))["step_time_us"])


def _idle_budget(result, rank):
    """Per step, the rank's idle beyond the median other rank's, in its window or the one
    before (a stall before the step's first kernel lies in the previous window)."""
    idle: dict = {}
    for analysis in result.ranks:
        for e in analysis.steps:
            idle.setdefault(e["step"], {})[analysis.rank] = e["time_breakdown"]["idle_us"]

    def excess(n):
        if n not in idle:
            return 0.0
        return idle[n][rank] - float(np.median([v for r, v in idle[n].items() if r != rank]))
    return {n: max(excess(n), excess(n - 1), 0.0) for n in idle}


def test_two_slow_hosts_each_alone_and_together_match_the_resimulation(tmp_path):
    """Ranks 0 and 6 stall 30 and 22 ms in the data loader every step: fixing 0 alone saves only
    what 6 does not then hide, fixing 6 alone nothing, both together nearly all of it."""
    spec = replace(GPT_1_5B, name="two_slow", seed=31, n_layers=2, steps=5, world_size=8,
                   host_stalls=((0, 30000.0, 1), (6, 22000.0, 1)))
    result = _diagnose_unseen(spec, tmp_path)
    c = chains(result)
    base = replay(c)
    steady = result.attribution["steady_steps"]
    fix0, fix6 = (rank_fix(c, r, _idle_budget(result, r), spread=False) for r in (0, 6))
    step = result.model.step_time_us
    cases = [(fix0, replace(spec, host_stalls=((6, 22000.0, 1),))), (fix6, replace(spec, host_stalls=((0, 30000.0, 1),))),
             (fix0 + fix6, replace(spec, host_stalls=()))]
    for fix, fixed in cases:
        predicted = step - saving(base, replay_fix(c, fix), steady)
        assert abs(predicted - _truth(fixed)) <= 0.05 * _truth(fixed), (predicted, _truth(fixed))


def test_equal_stalls_hide_each_other_and_are_named_together(tmp_path):
    """Ranks 2 and 5 stall 25 ms each every step: fixing either alone saves (next to) nothing,
    so no single fix leads the greedy; the rule names both, and both fixed is what the generator
    re-simulates without the stalls."""
    spec = replace(GPT_1_5B, name="equal", seed=41, n_layers=2, steps=5, world_size=8,
                   host_stalls=((2, 25000.0, 1), (5, 25000.0, 1)))
    result = _diagnose_unseen(spec, tmp_path)
    finding = next(f for f in result.findings if f["rule"] == "straggler-rank")
    e = finding["evidence"]
    assert sorted(e["late_ranks"]) == [2, 5]
    alone = {p["rank"]: p["gain_alone_us"] for p in e["per_rank"] if p["named"]}
    assert max(alone.values()) < 0.2 * e["prediction"]["gain_us"]
    truth = _truth(replace(spec, host_stalls=()))
    assert abs(e["prediction"]["predicted_step_time_us"] - truth) <= 0.1 * truth


def test_whatif_fix_ranks_prints_the_findings_figures(capsys):
    """`tracecliff whatif TRACES --fix-ranks R[,R]` replays the fixes straggler-rank weighed: one
    rank gives its per_rank figure, the named ranks the finding's prediction; a rank it did not
    weigh, or no rank list, is a one-line usage error (exit 2)."""
    from hang_dumps import run
    folder = str(sample_traces()["synthetic/ddp_two_late_ranks"][0]).rsplit("/", 1)[0]
    finding = next(f for f in diagnosed("synthetic/ddp_two_late_ranks").findings if f["rule"] == "straggler-rank")
    code, out, err = run(capsys, "whatif", folder, "--fix-ranks", "3", "--format", "json")
    alone = next(p for p in finding["evidence"]["per_rank"] if p["rank"] == 3)
    assert code in (0, None) and not err
    doc = json.loads(out)
    assert doc["predicted_step_time_us"] == alone["predicted_step_alone_us"] and doc["causes"] == {"3": "host"}
    code, out, err = run(capsys, "whatif", folder, "--fix-ranks", "1,3")
    from analyzer.base.units import fmt_us
    assert f"-> {fmt_us(finding['evidence']['prediction']['predicted_step_time_us'])} " in out
    assert finding["evidence"]["prediction"]["whatif"] == "tracecliff whatif TRACES --fix-ranks 1,3"
    for bad, message in (("9", "not weighed by straggler-rank"), ("one", "comma-separated rank numbers")):
        code, out, err = run(capsys, "whatif", folder, "--fix-ranks", bad)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_saved_result_replays_as_its_traces_do():
    """The replay reads only what a saved result keeps (rows, step windows and breakdowns, phase
    windows): `whatif --fix-ranks` on result.json gives the traces' figures."""
    from analyzer.job.result import Result
    from analyzer.whatif.replay import fix_ranks_doc
    for trace in ("synthetic/ddp_two_late_ranks", "synthetic/ddp_host_sync_stall", "synthetic/ddp_straggler"):
        result = diagnosed(trace)
        ranks = next(f for f in result.findings if f["rule"] == "straggler-rank")["evidence"]["late_ranks"]
        saved = Result.from_dict(json.loads(json.dumps(result.to_dict())))
        assert fix_ranks_doc(saved, ranks) == fix_ranks_doc(result, ranks), trace
