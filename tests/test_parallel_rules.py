"""The parallelism rules' numbers against the synthetic jobs' truth and hand-worked models."""

import json
from pathlib import Path

import pytest

from analyzer.model import formulas as models
from rule_cases_lib import diagnosed

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic"


def finding(trace, rule):
    return next(f for f in diagnosed(f"synthetic/{trace}").findings if f["rule"] == rule)


def truth(trace):
    return json.loads((SAMPLES / trace / "truth.json").read_text())


def per_step(t, key):
    """Median over ranks of a whole-trace truth metric per step (every rank runs the same plan)."""
    values = sorted(r[key] / t["spec"]["steps"] for r in t["ranks"].values())
    return values[len(values) // 2]


def test_pipeline_bubble_formulas():
    assert models.pipeline_bubble_fraction(4, 2) == pytest.approx(3 / 5)
    assert models.pipeline_bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert models.pipeline_bubble_fraction(4, 4, virtual_stages=2) == pytest.approx(3 / 11)
    assert models.pipeline_time(1200.0, 4, 2) == pytest.approx(3000.0)  # 1200 · 5/2
    with pytest.raises(ValueError):
        models.pipeline_bubble_fraction(0, 4)


def test_pipeline_bubble_numbers():
    f = finding("pp_gpipe_4stage", "pipeline-bubble")
    t = truth("pp_gpipe_4stage")
    ev = f["evidence"]
    assert ev["stages"] == 4 and ev["microbatches"] == 2 and ev["ideal_bubble_fraction"] == pytest.approx(0.6)
    # the stage's non-compute share: 1 - compute/step, with the truth's compute and step time
    compute = sorted(r["compute_us"] / 2 for r in t["ranks"].values())
    want = 1 - (compute[1] + compute[2]) / 2 / t["step_time_us"]
    assert ev["bubble_fraction_median"] == pytest.approx(want, abs=1e-3)
    # 12 micro-batches: step x (15/12)/(5/2) = half the step
    assert ev["suggested_microbatches"] == 12
    assert f["estimated_gain_us"] == pytest.approx(t["step_time_us"] / 2, abs=1.0)


def test_tp_cross_node_numbers():
    f = finding("megatron_tp8_2node", "tp-cross-node")
    t = truth("megatron_tp8_2node")
    ev = f["evidence"]
    assert ev["group"]["size"] == 8 and ev["group"]["nodes"] == 2
    # 4 layers x (2 forward + 1 backward) all-reduces of 120 µs, none hidden
    assert ev["exposed_tp_us_median"] == pytest.approx(12 * 120.0) == pytest.approx(per_step(t, "exposed_comm_us"))
    assert 0 < f["estimated_gain_us"] < ev["exposed_tp_us_median"]


def test_ep_alltoall_exposed_numbers():
    f = finding("ep_deepep_exposed", "ep-alltoall-exposed")
    t = truth("ep_deepep_exposed")
    ev = f["evidence"]
    # 4 layers x 2 passes x (dispatch + combine) of 60 µs, all exposed; compute can hide all of it
    assert ev["exposed_ep_us_median"] == pytest.approx(960.0) == pytest.approx(per_step(t, "exposed_comm_us"))
    assert ev["ep_comm_us_median"] == pytest.approx(960.0)
    assert ev["min_exposed_us_if_overlapped"] == 0.0 and f["estimated_gain_us"] == pytest.approx(960.0)
    assert ev["libraries"] == ["deepep"]


@pytest.mark.parametrize("trace, rule", [("megatron_tp4_dp2", "tp-cross-node"),
                                         ("pp_gpipe_4stage_16mb", "pipeline-bubble"),
                                         ("ep_deepep_overlapped", "ep-alltoall-exposed")])
def test_healthy_counterparts_pass(trace, rule):
    statuses = {s["rule"]: s["status"] for s in diagnosed(f"synthetic/{trace}").rules}
    assert statuses[rule] == "passed"


def test_rules_say_when_they_cannot_check():
    statuses = {s["rule"]: (s["status"], s.get("reason")) for s in diagnosed("synthetic/ddp_healthy_8r").rules}
    assert statuses["tp-cross-node"] == ("not_applicable", "no tensor-parallel process group")
    assert statuses["pipeline-bubble"] == ("not_applicable", "no pipeline-parallel process group")
    assert statuses["ep-alltoall-exposed"] == ("not_applicable", "no expert-parallel communication")
