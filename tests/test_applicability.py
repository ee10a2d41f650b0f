"""Three ways a rule finds nothing, never confused (issue 26): ``passed`` (it checked), ``not_applicable``
(its subject is absent from the job) and ``not_evaluated`` (the traces cannot show it); the text,
HTML, JSON and gate say which."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.compare.gate import GateConfig, evaluate, parse_assertion
from analyzer.reports.html import HtmlRenderer
from analyzer.reports.text import TextRenderer
from analyzer.whatif.gains import WHATIF_GAINS
from analyzer.rules.engine import NotApplicable, Rule, run_rules
from analyzer.synth import JobSpec, write_job
from rule_cases_lib import diagnosed

COMM_RULES = ("comm-bound-step", "exposed-communication", "straggler-rank")
GRADIENT_RULES = ("ddp-bucket-oversized", "ddp-bucket-undersized", "fp32-gradient-comm")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """A generated single-process DDP job: no collective at all (a group of one moves nothing)."""
    spec = JobSpec(name="one_process", world_size=1, gpus_per_node=1, n_layers=2, steps=3, seed=31)
    out = write_job(spec, tmp_path_factory.mktemp("one") / "one_process")
    return diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))


def _status(result):
    return {s["rule"]: (s["status"], s["reason"]) for s in result.rules}


def test_single_process_without_communication_passes_no_communication_rule(one_process):
    status = _status(one_process)
    assert not one_process.collectives  # the generator issued none: world size 1
    for rule in COMM_RULES + GRADIENT_RULES:
        assert status[rule][0] == "not_applicable", rule
    assert "one process" in status["straggler-rank"][1]
    assert "no communication" in status["comm-bound-step"][1]
    assert "no gradient collectives" in status["fp32-gradient-comm"][1]
    # what the trace can be checked for still is: the GPU's idle
    assert status["gpu-idle-host-bound"][0] in ("passed", "fired")
    assert "could not check" not in one_process.verdict


def test_collectives_in_a_group_of_one_are_no_communication():
    """The H200 DDP recording: DDP issues its bucket all-reduces on a world of one (CPU-side
    rows, no NCCL kernel): the bucket and gradient rules have nothing to check."""
    result = diagnosed("gpu_h200/ddp")
    assert result.collectives and all(c["group"]["size"] == 1 for c in result.collectives)
    status = _status(result)
    for rule in COMM_RULES + GRADIENT_RULES:
        assert status[rule][0] == "not_applicable", rule


def test_pipeline_sends_are_not_comm_bound_steps_subject():
    status = _status(diagnosed("synthetic/pp_gpipe_4stage"))
    assert status["comm-bound-step"][0] == "not_applicable"
    assert "point-to-point" in status["comm-bound-step"][1]


def test_fp32_rule_without_gpu_compute_could_not_check():
    """gloo DDP on CPU: fp32 gradient all-reduces, but no GPU kernel tells the compute precision."""
    status = _status(diagnosed("cpu_gloo/ddp"))
    assert status["fp32-gradient-comm"][0] == "not_evaluated"
    assert "precision" in status["fp32-gradient-comm"][1]


def test_a_rule_can_say_it_does_not_apply():
    class Absent(Rule):
        name, code, title, failure_title = "absent-subject", "TC999", "t", "f"

        def check(self, ctx):
            raise NotApplicable("nothing of the kind in this job")

    from analyzer.rules import engine
    result = dataclasses.replace(copy.deepcopy(diagnosed("synthetic/ddp_healthy_8r")))  # a Result to build again
    engine.RULES["absent-subject"] = Absent
    try:
        run_rules(result, gains=WHATIF_GAINS)
    finally:
        del engine.RULES["absent-subject"]
    assert _status(result)["absent-subject"] == ("not_applicable", "nothing of the kind in this job")
    assert "absent-subject" not in result.verdict  # the verdict names what could not be checked


def test_views_tell_the_three_apart(one_process):
    text = TextRenderer().render(one_process)
    tally = next(line for line in text.splitlines() if line.startswith("Rules: "))
    counts = {s: sum(r["status"] == s for r in one_process.rules) for s in ("passed", "not_applicable")}
    assert f"{counts['not_applicable']} not applicable" in tally
    assert "  not applicable: " in text and "(one process (world size 1): no rank to wait for)" in text
    html = HtmlRenderer().render(one_process)
    assert f"{counts['not_applicable']} not applicable" in html
    assert "<td>not applicable</td>" in html
    config = GateConfig(assertions=(parse_assertion("rule:straggler-rank", "error", None),))
    check = next(c for c in evaluate(one_process, config).checks if c.name == "rule:straggler-rank")
    assert check.status == "pass" and "not applicable: one process" in check.message


FSDP_RULES = ("fsdp-fullshard-cross-node", "fsdp-missing-wrap-policy", "fsdp-no-prefetch", "fsdp-where-ddp-fits")


def test_fsdp_on_one_process_is_said_as_such():
    """The H200 FSDP2 recording (world size 1): an FSDP job, but nothing is sharded: the FSDP
    rules do not apply, and they do not call it 'not an FSDP job'."""
    result = diagnosed("gpu_h200/fsdp2")
    assert result.model.strategy.startswith("fsdp")
    status = _status(result)
    for rule in FSDP_RULES:
        assert status[rule][0] == "not_applicable", rule
        assert "FSDP on one process" in status[rule][1] and "not an FSDP job" not in status[rule][1]


def test_fsdp_units_the_traces_do_not_show_could_not_be_checked():
    """An FSDP job of several processes whose units were not found: the rules apply but could not
    look (not_evaluated), never 'not an FSDP job'."""
    result = dataclasses.replace(copy.deepcopy(diagnosed("synthetic/fsdp1_no_wrap")), fsdp_units=[])
    run_rules(result, gains=WHATIF_GAINS)
    status = _status(result)
    for rule in FSDP_RULES:
        assert status[rule][0] == "not_evaluated", rule
        assert "units the traces do not show" in status[rule][1]


def test_cpu_only_traces_say_why_the_gpu_rules_could_not_check():
    status = _status(diagnosed("cpu_gloo/tp"))
    assert status["gpu-idle-host-bound"] == ("not_evaluated", "no GPU work in the traces (CPU-only): no GPU timeline "
                                                              "to measure")
    assert all("ProfilerStep" not in reason for _, reason in status.values())
