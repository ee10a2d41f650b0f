"""Predicted gains against the generator: re-simulate each scenario with the finding's
suggested fix applied; the step time must be within 15% of the one the rule predicts
(measured step time minus the estimated gain)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analyzer.synth import SCENARIOS
from analyzer.synth.programs import build_program
from analyzer.synth.truth import build_truth
from rule_cases_lib import diagnosed, load_cases

FIXES = {name: case for name, case in load_cases().items() if "fix" in case}


def fixed_spec(case, finding):
    changes = {}
    for key, value in case["fix"]["changes"].items():
        if isinstance(value, str) and value.startswith("evidence:"):
            value = finding["evidence"][value.split(":", 1)[1]]
        changes[key] = value
    return replace(SCENARIOS[case["fix"]["scenario"]], **changes)


def resimulated_step_us(spec) -> float:
    # The truth alone (no Kineto rendering): the step time the generator simulates.
    return build_truth(build_program(spec))["step_time_us"]


def test_every_rule_with_a_config_fix_is_checked():
    assert set(FIXES) >= {"ddp-bucket-oversized", "ddp-bucket-undersized", "fp32-gradient-comm",
                          "fsdp-fullshard-cross-node", "fsdp-no-prefetch", "straggler-rank",
                          "fsdp-where-ddp-fits"}


@pytest.mark.parametrize("rule", sorted(FIXES))
def test_predicted_step_time_matches_resimulation(rule):
    case = FIXES[rule]
    result = diagnosed(f"synthetic/{case['fix']['scenario']}")
    finding = next(f for f in result.findings if f["rule"] == rule)
    assert finding["estimated_gain_us"] is not None
    predicted = finding["evidence"]["step_time_us"] - finding["estimated_gain_us"]
    if "predicted_step_us" in case["fix"]:
        predicted = finding["evidence"][case["fix"]["predicted_step_us"].split(":", 1)[1]]
    actual = resimulated_step_us(fixed_spec(case, finding))
    assert abs(predicted - actual) <= 0.15 * actual, (predicted, actual)
