"""Data-driven rule cases (tests/rule_cases/<rule>.toml): the exact set of rules that fires on
every sample trace, synthetic, CPU gloo and real."""

from __future__ import annotations

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.job.model import LEAVES
from analyzer.rules.engine import all_rules
from analyzer.synth import JobSpec, write_job
from rule_cases_lib import load_cases, sample_traces, diagnosed

CASES = load_cases()
TRACES = sample_traces()


def expected_rules(trace: str) -> set[str]:
    return {name for name, case in CASES.items() if trace in case["fires_on"]}


def test_one_case_file_per_rule():
    assert set(CASES) == set(all_rules())
    for name, case in CASES.items():
        assert case["rule"] == name


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_file_is_complete(name):
    case = CASES[name]
    synthetic = [t for t in case["fires_on"] if t.startswith("synthetic/")]
    assert synthetic or "generated" in case, "every rule needs a synthetic trace where it must fire"
    assert case["healthy_counterpart"] in TRACES
    assert case["healthy_counterpart"] not in case["fires_on"]
    for trace in case["fires_on"]:
        assert trace in TRACES or trace.startswith("real/"), trace
        assert case["why"].get(trace), f"{trace}: say why the rule fires"
    for trace in (t for t in TRACES if t.startswith("real/")):
        assert case["why"].get(trace), f"{trace}: justify the verdict on each real trace"


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_exact_rule_set(trace):
    result = diagnosed(trace)
    fired = {f["rule"] for f in result.findings}
    assert not [f for f in result.findings if f["title"].startswith("rule ")], "a rule raised"
    assert fired == expected_rules(trace)
    statuses = {s["rule"]: s["status"] for s in result.rules}
    assert {n for n, s in statuses.items() if s == "fired"} == fired


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_findings_follow_the_contract(trace):
    result = diagnosed(trace)
    keys = {"rule", "code", "severity", "title", "summary", "ranks", "steps", "evidence",
            "estimated_gain_us", "model", "fix", "references", "recovers"}
    for f in result.findings:
        assert set(f) == keys
        assert f["severity"] in ("error", "warning", "info")
        assert f["summary"].endswith(".") and any(ch.isdigit() for ch in f["summary"])
        assert set(f["fix"]) == {"text", "snippet"} and f["fix"]["text"]
        assert f["references"] and all(isinstance(r, str) for r in f["references"])
        assert all(isinstance(r, int) for r in f["ranks"]) and f["ranks"]
        # the leaves its fix gives back; with a gain, its µs, adding up to the gain
        assert f["recovers"] and set(f["recovers"]) <= set(LEAVES)
        if f["estimated_gain_us"] is not None:
            assert sum(f["recovers"].values()) == pytest.approx(f["estimated_gain_us"], abs=0.2)
    gains = [f["estimated_gain_us"] for f in result.findings if f["estimated_gain_us"] is not None]
    assert gains == sorted(gains, reverse=True)
    assert result.verdict.endswith(".")


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if "generated" in c))
def test_generated_case_fires_exactly_its_rule(name, tmp_path):
    """A rule whose problem no bundled sample shows: its case file carries the JobSpec."""
    generated = CASES[name]["generated"]
    out = write_job(JobSpec(name=generated["name"], **generated["spec"]), tmp_path / generated["name"])
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))
    assert {f["rule"] for f in result.findings} == {name}
