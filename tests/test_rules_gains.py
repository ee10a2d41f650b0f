"""Predicted gains against the generator (tests/prediction_audit.py): every fix a rule case file
states, and every fix of the unseen jobs, is re-simulated with the fix applied; the step time
the finding predicts must be within 10% of the re-simulated one. Every finding carries its
prediction (the step after the fix, its model, assumptions and what-if command) or says why it
has none; every gain on a generated job is audited, or its case file says why it cannot be."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analyzer.api import replay_fix_ranks
from analyzer.whatif.prediction import WHATIF_OPTIONS, WhatIf
from prediction_audit import (TOLERANCE, UNSEEN, audit, case_fixes, markdown, sample_audits, unseen_audits,
                              _diagnose_unseen)
from rule_cases_lib import diagnosed, load_cases, sample_traces

CASES = load_cases()
FIXES = case_fixes()
DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"


def test_every_rule_with_a_config_fix_is_checked():
    assert {f.rule for f in FIXES} >= {
        "ddp-bucket-oversized", "ddp-bucket-undersized", "fp32-gradient-comm", "fsdp-fullshard-cross-node",
        "fsdp-no-prefetch", "straggler-rank", "fsdp-where-ddp-fits", "fsdp-missing-wrap-policy", "comm-bound-step",
        "tp-cross-node", "pipeline-bubble", "ep-alltoall-exposed", "exposed-communication", "gpu-idle-host-bound",
        "gpu-idle-queued", "gemm-below-peak"}


@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f"{f.rule}-{f.scenario}-{f.alternative or 'gain'}")
def test_predicted_step_time_matches_resimulation(fix):
    checked = audit(fix, diagnosed(f"synthetic/{fix.scenario}"))
    assert abs(checked.error) <= TOLERANCE, (checked.predicted_us, checked.resimulated_us)


@pytest.fixture(scope="module")
def unseen(tmp_path_factory):
    return unseen_audits(tmp_path_factory.mktemp("unseen"))


@pytest.mark.parametrize("index", range(len(UNSEEN)), ids=lambda i: f"{UNSEEN[i].rule}-{UNSEEN[i].spec.name}")
def test_unseen_jobs_predicted_within_tolerance(unseen, index):
    checked = unseen[index]
    assert abs(checked.error) <= TOLERANCE, (checked.fix.name, checked.predicted_us, checked.resimulated_us)


def test_models_md_reports_the_audit(unseen):
    """docs/models.md's table is tests/prediction_audit.py's output (rerun it after a model change)."""
    assert markdown(sample_audits(), unseen) in DOCS.read_text("utf-8")


@pytest.mark.parametrize("trace", sorted(sample_traces()))
def test_every_finding_states_its_prediction(trace):
    result = diagnosed(trace)
    step = result.model.step_time_us
    for f in result.findings:
        prediction = f["evidence"]["prediction"]
        gain = f["estimated_gain_us"]
        if gain is None:
            assert prediction["predicted_step_time_us"] is None and prediction["why_no_gain"], f["rule"]
            continue
        assert prediction["model"] and isinstance(prediction["assumptions"], dict), f["rule"]
        assert prediction["gain_us"] == pytest.approx(gain, abs=0.15)
        if gain > 0:  # a model predicting a slower step has gain 0 and says which step
            assert prediction["predicted_step_time_us"] == pytest.approx(step - gain, abs=0.3)
        for alternative in prediction.get("alternatives") or []:
            assert alternative["projected_step_time_us"] is None or alternative["gain_us"] <= gain + 0.1


def test_every_gain_on_a_generated_job_is_audited_or_says_why():
    audited = {(f.rule, f.scenario) for f in FIXES}
    for trace in (t for t in sample_traces() if t.startswith("synthetic/")):
        for f in diagnosed(trace).findings:
            if f["estimated_gain_us"] is None:
                continue
            scenario = trace.split("/", 1)[1]
            why = CASES[f["rule"]].get("unaudited", {}).get(trace)
            assert (f["rule"], scenario) in audited or why, f"{trace}: {f['rule']} has a gain no re-simulation checks"


def test_whatif_commands_reproduce_the_gains():
    """A prediction's ``tracecliff whatif`` command, projected (or replayed), gives the finding's gain."""
    checked = replays = 0
    for trace in (t for t in sample_traces() if t.startswith("synthetic/")):
        result = diagnosed(trace)
        for f in result.findings:
            prediction = f["evidence"]["prediction"]
            command = prediction.get("whatif")
            for entry in f["evidence"].get("per_rank") or []:  # the replay (docs/models.md §9): the very figure
                alone = replay_fix_ranks(result, entry["whatif"].split("--fix-ranks ", 1)[1])
                assert alone["predicted_step_time_us"] == entry["predicted_step_alone_us"], (trace, entry)
                replays += 1
            if not command:
                continue
            if "--fix-ranks" in command:
                replayed = replay_fix_ranks(result, command.split("--fix-ranks ", 1)[1])
                assert replayed["gain_us"] == f["estimated_gain_us"], (trace, command)
                continue
            changes = _parse(command)
            fix = WhatIf(result).fix(**changes)
            assert fix is not None and fix.gain_us == pytest.approx(f["estimated_gain_us"], abs=0.15), (trace, command)
            checked += 1
    assert checked >= 6 and replays >= 10


def _parse(command: str) -> dict:
    flags = {flag: field for field, flag in WHATIF_OPTIONS.items()}
    out = {}
    for flag, value in re.findall(r"(--[\w-]+) (\S+)", command):
        field = flags[flag]
        out[field] = value if field == "strategy" else (int(value) if value.isdigit() and field != "bucket_mb"
                                                        else float(value))
    return out


def test_a_single_unit_gloo_job_says_why_it_has_no_gain():
    result = diagnosed("cpu_gloo/fsdp1_nowrap")
    finding = next(f for f in result.findings if f["rule"] == "fsdp-missing-wrap-policy")
    assert finding["estimated_gain_us"] is None
    assert "no GPU step times" in finding["evidence"]["prediction"]["why_no_gain"]


def test_wrap_policy_counts_the_blocks_from_the_attention_kernels():
    finding = next(f for f in diagnosed("synthetic/fsdp1_no_wrap").findings if f["rule"] == "fsdp-missing-wrap-policy")
    assert finding["evidence"]["layers"] == 6  # the generator's GPT_7B has 6 blocks
    assert finding["evidence"]["layers_source"].startswith("measured")
    assert "--fsdp-units 6 --strategy fsdp-full" in finding["evidence"]["prediction"]["whatif"]


def test_wrap_policy_falls_back_to_the_parameter_count(tmp_path, monkeypatch):
    """Without attention kernels (other kernel names) the blocks come from Ψ: d = 128·L."""
    from dataclasses import replace
    from analyzer.synth import SCENARIOS
    from analyzer.synth import compute
    spec = replace(SCENARIOS["fsdp1_no_wrap"], name="plain", n_layers=2, steps=2)
    monkeypatch.setattr(compute, "FLASH_FWD", "void custom_attention_kernel<128>(Params)")
    result = _diagnose_unseen(spec, tmp_path / "plain")
    finding = next(f for f in result.findings if f["rule"] == "fsdp-missing-wrap-policy")
    psi = finding["evidence"]["parameters"]
    assert finding["evidence"]["layers"] == max(2, round((psi / (12 * 128 ** 2)) ** (1 / 3)))
    assert finding["evidence"]["layers_source"].startswith("from the parameter count")
    assert finding["estimated_gain_us"] > 0
