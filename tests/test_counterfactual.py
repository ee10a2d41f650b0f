"""The fixes findings predict as counterfactuals of the replay (analyzer.whatif.counterfactual):
each model's cut turned into a gain by one engine, the joint estimate all of them at once. The
re-simulated truth of each (alone and together) is tests/prediction_audit.py's; these pin the
engine's own arithmetic on the sample jobs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.job.result import dumps
from analyzer.api import load_result
from analyzer.whatif import replay as rp
from analyzer.whatif.counterfactual import JOINT_SOURCE, Replayer, union
from analyzer.whatif.prediction import WhatIf
from analyzer.whatif.projection import Scenario, project
from rule_cases_lib import diagnosed, sample_traces


def test_the_measured_link_changes_nothing():
    """The link counterfactual at the measured link: every α-β ratio 1, no saving."""
    result = diagnosed("synthetic/ddp_comm_bound")
    replayer = Replayer.of(result)
    nics = WhatIf.of(result).measured("measured_nics_per_node")
    fix = replayer.link_fix(Scenario(nics_per_node=nics))
    assert np.allclose(fix.transfer_cut, 0.0)
    assert replayer.saving(fix) == pytest.approx(0.0, abs=1e-6)


def test_a_faster_link_shortens_every_transfer_by_its_ratio():
    result = diagnosed("synthetic/ddp_comm_bound")
    replayer = Replayer.of(result)
    chains = replayer.chains
    fix = replayer.link_fix(Scenario(nics_per_node=4))  # 1 NIC per node measured, a NIC per GPU
    cut = fix.transfer_cut[:-1]  # the last set is the job's start
    assert (cut >= 0).all() and cut.max() > 0
    assert (cut <= chains.transfer[:-1] + 1e-9).all()
    finding = next(f for f in result.findings if f["rule"] == "comm-bound-step")
    assert finding["estimated_gain_us"] == pytest.approx(replayer.saving(fix), abs=0.06)


def test_the_projections_exposed_cut_replays_to_its_change_on_a_healthy_job():
    """ddp_bucket_oversized: every rank's tail exposed alike, the replay gives the projection's
    change back, and the finding prints it."""
    result = diagnosed("synthetic/ddp_bucket_oversized")
    change = project(result, Scenario(bucket_mb=100)).projected["step_time_us"] - project(result).projected["step_time_us"]
    replayer = Replayer.of(result)
    assert replayer.saving(replayer.exposed_fix(-change)) == pytest.approx(-change, abs=0.05)
    finding = next(f for f in result.findings if f["rule"] == "ddp-bucket-oversized")
    assert finding["estimated_gain_us"] == pytest.approx(-change, abs=0.06)
    assert "replay" in finding["evidence"]["prediction"]["model"]


def test_fixes_together_cut_each_time_once():
    """Two findings naming one rank's stall (gpu-idle-host-bound and straggler-rank on
    ddp_host_sync_stall) cut it once: the union takes the larger cut, never the sum."""
    result = diagnosed("synthetic/ddp_host_sync_stall")
    replayer = Replayer.of(result)
    chains = replayer.chains
    a = rp.ReplayFix(np.full(len(chains.rank), 2.0), {(3, 5): 1.0}, {}, np.full(len(chains.transfer), 3.0))
    b = rp.ReplayFix(np.full(len(chains.rank), 5.0), {(3, 5): 4.0}, {(3, 5): 1.0}, None)
    joint = union(chains, [a, b])
    assert (joint.cut == 5.0).all() and (joint.transfer_cut == 3.0).all()
    assert joint.window_cut == {(3, 5): 4.0} and joint.floor_cut == {(3, 5): 1.0}
    fixed = {f["rule"]: f["evidence"]["prediction"]["assumptions"].get("fixed") for f in result.findings}
    assert fixed["gpu-idle-host-bound"] == fixed["straggler-rank"] == {"3": "host"}
    alone = replayer.saving(replayer.cause_fix(3, "host"))
    joint_doc = result.recoverable
    assert joint_doc["replayed_us"] == pytest.approx(alone, abs=0.1)
    assert joint_doc["replayed_all"] and joint_doc["source"].startswith(JOINT_SOURCE)
    assert "(all fixes together, replayed)" in result.verdict


def test_the_joint_estimate_is_said_in_a_saved_result(tmp_path):
    result = diagnosed("synthetic/ddp_two_hosts_stall")
    path = tmp_path / "result.json"
    path.write_text(dumps(result.to_dict()), "utf-8")
    loaded = load_result(str(path))
    assert loaded.recoverable["source"] == result.recoverable["source"]
    assert loaded.recoverable["replayed_us"] == result.recoverable["replayed_us"]
    assert json.loads(path.read_text("utf-8"))["recoverable"]["replayed_rules"] == ["gpu-idle-host-bound",
                                                                                   "straggler-rank"]


def test_a_partial_job_is_not_replayed():
    """Three of four ranks: a rank not given may set the pace, so no gain comes from the replay
    (the rules' own models stand, and the joint estimate says it could not replay)."""
    files = sample_traces()["synthetic/ddp_two_hosts_stall"][:3]
    result = diagnose(files, DiagnoseOptions(workers=1))
    assert not Replayer.of(result).ok
    assert any(f["rule"] == "gpu-idle-host-bound" and f["estimated_gain_us"] for f in result.findings)
    for f in result.findings:
        assert "replay" not in ((f["evidence"].get("prediction") or {}).get("model") or ""), f["rule"]
    assert result.recoverable["replayed_us"] is None
    assert "cannot be replayed" in result.recoverable["source"]
