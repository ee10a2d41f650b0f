"""The CI gate: metrics worked out by hand on tests/builders.two_step_ddp, thresholds on both
sides of each measured value, exit codes, baseline regressions, JUnit XML and the job summary.

two_step_ddp, per rank: step 1 lasts 100 µs (next step starts 100 µs later), step 2 its span,
95 µs; each has 20 µs of exposed all-reduce (30 µs, 10 under backward compute) and the GPU busy
95 µs. Step 2, the last, is the drain: the typical step is step 1, the only steady one, and the
gate quotes its figures as the verdict does: step_time_us 100, exposed_comm_pct 20 (20 µs of
100), idle_pct 5, overlap_pct 33.33; one sample per rank of it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from analyzer.cli.main import main
from analyzer.base.errors import ConfigError
from analyzer.compare.gate import GateConfig, evaluate, parse_assertion, parse_gate_config, regression_pct
from analyzer.compare.metrics import aggregate, run_metrics
from builders import two_step_ddp


def gate_row(out: str, name: str) -> str:
    """The text view's row of a check and its detail, which goes under the row (indented) when
    the row would pass 100 columns."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if name in line.split())
    follows = []
    for line in lines[at + 1:]:
        if not line.startswith("      "):
            break
        follows.append(line.strip())
    return " ".join([lines[at], *follows])


def load_run(paths):
    """The run (a saved result or traces) as gate and diff read it: a Result."""
    from analyzer.api import load_run as load
    return load(paths)


def scaled(builder, factor: float):
    """The same job run ``factor`` times slower: every timestamp and duration scaled."""
    for event in builder.events:
        event["ts"] = event["ts"] * factor
        event["dur"] = event["dur"] * factor
    return builder


def write_job(directory, factor: float = 1.0):
    directory.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        scaled(two_step_ddp(rank=rank), factor).write(directory / f"rank-{rank}.json")
    return directory


def run_cli(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def write_config(path, assertions: str, gate: str = "") -> str:
    path.write_text(f"[tool.tracecliff.gate]\n{gate}\n[tool.tracecliff.gate.assertions]\n{assertions}\n")
    return str(path)


@pytest.fixture()
def job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./pyproject.toml of the repo
    return write_job(tmp_path / "job")


def test_metrics_match_the_hand_worked_numbers(job):
    run = load_run([str(job)])
    metrics = run_metrics(run)
    typical = {k: m.typical for k, m in metrics.items()}
    values = {k: sorted(s.value for s in m.samples) for k, m in metrics.items()}
    assert typical["step_time_us"] == pytest.approx(100) == run.attribution["step_time_us"]
    assert typical["exposed_comm_pct"] == pytest.approx(20) == pytest.approx(100 * run.attribution["exposed_share"])
    assert typical["idle_pct"] == pytest.approx(5) and typical["overlap_pct"] == pytest.approx(100 / 3, abs=1e-3)
    # the drain step (step 2) is never a sample: one per rank of the steady step 1
    assert values["step_time_us"] == pytest.approx([100, 100]) and {s.step for s in metrics["step_time_us"].samples} == {1}
    assert values["exposed_comm_pct"] == pytest.approx([20, 20]) and values["idle_pct"] == pytest.approx([5, 5])
    assert "mfu" not in metrics
    # busbw of a 2000-byte (1000 bf16) all-reduce over 2 ranks in 30 µs (both arrive together: no
    # wait): 2000/30e-6/1e9 × 2·1/2; the figure is the typical step's (step 1), its samples the
    # steady step's (one collective per rank): the drain's all-reduce is in neither
    busbw = 2000 / 30e-6 / 1e9
    assert values["busbw_gbps:default_pg"] == pytest.approx([busbw] * 2, rel=1e-3)
    assert typical["busbw_gbps:default_pg"] == pytest.approx(busbw, rel=1e-3)
    assert metrics["busbw_gbps:default_pg"].basis == ("typical step 1: Σ bus bytes / Σ transfer time of 2 collective "
                                                      "kernel(s), each matched on all 2 members")
    assert aggregate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], "p90") == pytest.approx(10.0)


@pytest.mark.parametrize("bound, level, code, status", [
    ("max = 20.1", "error", 0, "PASS"),   # the typical step's 20.0: just under
    ("max = 19.9", "error", 1, "FAIL"),   # just over
    ("max = 19.9", "warn", 0, "WARN"),    # a warning never fails the gate
    ("min = 19.9", "error", 0, "PASS"),
    ("min = 20.1", "error", 1, "FAIL"),
])
def test_threshold_on_both_sides_of_the_measured_value(job, tmp_path, capsys, bound, level, code, status):
    config = write_config(tmp_path / "g.toml", f'"exposed_comm_pct" = ["{level}", {{ {bound} }}]')
    rc, out, _ = run_cli(["gate", job, "--config", config], capsys)
    assert rc == code
    row = gate_row(out, "exposed_comm_pct")
    assert row.split()[0] == status and "20.00%" in row and "typical step 1" in row


@pytest.mark.parametrize("how, bound, code", [
    ("max", "max = 5.01", 0), ("max", "max = 4.99", 1),     # idle: both samples 5 (the drain's 0 is none)
    ("min", "min = 5.0", 0), ("min", "min = 5.01", 1),
    ("p90", "max = 5.01", 0), ("median", "max = 4.99", 1),
])
def test_aggregations(job, tmp_path, capsys, how, bound, code):
    config = write_config(tmp_path / "g.toml", f'"idle_pct" = ["error", {{ {bound}, aggregate = "{how}" }}]')
    assert run_cli(["gate", job, "--config", config], capsys)[0] == code


def test_baseline_catches_a_run_made_20_percent_slower(job, tmp_path, capsys):
    base = tmp_path / "base.json"
    assert run_cli(["diagnose", job, "--format", "json", "-o", base], capsys)[0] == 0
    slow = write_job(tmp_path / "slow", factor=1.2)
    rc, out, _ = run_cli(["gate", slow, "--baseline", base], capsys)
    assert rc == 1
    step = next(line for line in out.splitlines() if line.split()[1:2] == ["step_time_us"])
    assert step.split()[0] == "FAIL" and "+20.00%" in step
    # the ratios are unchanged by a uniform slow-down: compared, and within the limit
    exposed = next(line for line in out.splitlines() if line.split()[1:2] == ["exposed_comm_pct"])
    assert exposed.split()[0] == "PASS" and "+0.00 pp" in exposed  # a share: in points of the step
    # a 25% allowance lets it through; the faster run against the slow one is an improvement
    assert run_cli(["gate", slow, "--baseline", base, "--max-regression-pct", "25"], capsys)[0] == 0
    slow_base = tmp_path / "slow.json"
    run_cli(["diagnose", slow, "--format", "json", "-o", slow_base], capsys)
    rc, out, _ = run_cli(["gate", base, "--baseline", slow_base], capsys)
    assert rc == 0 and "IMPROVED  step_time_us" in out


def test_per_metric_regression_override(job, tmp_path, capsys):
    base = tmp_path / "base.json"
    run_cli(["diagnose", job, "--format", "json", "-o", base], capsys)
    slow = write_job(tmp_path / "slow", factor=1.2)
    config = tmp_path / "g.toml"
    config.write_text("[tool.tracecliff.gate]\nmax_regression_pct = 5\n"
                      "[tool.tracecliff.gate.max_regression_pct_by_metric]\nstep_time_us = 21\n")
    rc, out, _ = run_cli(["gate", slow, "--baseline", base, "--config", config], capsys)
    # step time +20% is now allowed (21% of the baseline is above the 10 µs floor, 10% of 100 µs);
    # bus bandwidth fell to 1/1.2 (-16.67%: 2000 B in 30 µs, then 36 µs), within its floor (0.5 GB/s: latency-bound 2 KB
    # all-reduces of 0.067 GB/s move by µs of jitter), which the threshold column names
    # (one steady step in either run: no noise measured, and the threshold says so)
    # (said once under the table, not on every row)
    unknown = "noise unknown: 1 steady step(s), 3 needed)"
    assert rc == 0 and "+20.00%   ≤ 21.00% limit" in gate_row(out, "step_time_us")
    assert "-16.67%   ≤ 750.00% floor" in out
    assert " ".join(out.split()).count(unknown) == 1
    config.write_text(config.read_text().replace("step_time_us = 21", "step_time_us = 19"))
    rc, out, _ = run_cli(["gate", slow, "--baseline", base, "--config", config], capsys)
    assert rc == 1 and "FAIL    step_time_us" in out and "≤ 19.00% limit" in gate_row(out, "step_time_us")


def test_regression_direction_and_zero_baseline():
    assert regression_pct(100, 120, "lower") == pytest.approx(20)
    assert regression_pct(100, 120, "higher") == pytest.approx(-20)
    assert regression_pct(0, 0, "lower") == 0
    assert regression_pct(0, 1, "lower") == float("inf")


def test_unavailable_metric_fails_an_error_assertion_unless_allowed(job, tmp_path, capsys):
    config = write_config(tmp_path / "g.toml", '"mfu" = ["error", { min = 0.3 }]')
    rc, out, _ = run_cli(["gate", job, "--config", config], capsys)
    assert rc == 1 and "unavailable: model-parameter MFU unknown" in out
    config = write_config(tmp_path / "g.toml", '"mfu" = ["error", { min = 0.3, allow_unavailable = true }]')
    rc, out, _ = run_cli(["gate", job, "--config", config], capsys)
    assert rc == 0 and "SKIP" in out


def test_mfu_and_rule_assertions_on_a_result_document():
    from analyzer.job.result import Result
    doc = {"schema_version": 1, "ranks": [], "mfu": {"mfu_mean": 0.41, "per_step": [], "n_gpus": 8},
           "findings": [{"rule": "straggler-rank", "severity": "warning", "summary": "rank 3 late"}],
           "rules": [{"rule": "straggler-rank", "status": "fired"}, {"rule": "fp32-gradient-comm", "status": "passed"},
                     {"rule": "fsdp-no-prefetch", "status": "disabled", "reason": "disabled in configuration"}]}
    config = GateConfig(assertions=(
        parse_assertion("mfu", ["error", {"min": 0.4}], None),
        parse_assertion("rule:straggler-rank", "error", None),
        parse_assertion("rule:straggler-rank", ["error", {"severity": "error"}], None),
        parse_assertion("rule:fp32-gradient-comm", "error", None),
        parse_assertion("rule:fsdp-no-prefetch", "error", None),
        parse_assertion("rule:fsdp-no-prefetch", ["warn", {"allow_unavailable": True}], None)))
    statuses = [(c.name, c.status, c.actual) for c in evaluate(Result.from_dict(doc), config).checks
                if c.kind == "assertion"]
    assert statuses == [("mfu", "pass", 0.41), ("rule:straggler-rank", "fail", 1.0),
                        ("rule:straggler-rank", "pass", 0.0), ("rule:fp32-gradient-comm", "pass", 0.0),
                        ("rule:fsdp-no-prefetch", "fail", None), ("rule:fsdp-no-prefetch", "skip", None)]
    del doc["rules"]  # a result the rules engine never saw
    assert evaluate(Result.from_dict(doc), GateConfig(assertions=(parse_assertion("rule:straggler-rank", "error", None),))
                    ).checks[-1].message.startswith("unavailable: no rule results")


@pytest.mark.parametrize("assertions, gate, message", [
    ('"no_such_metric" = ["error", { max = 1 }]', "", "unknown gate metric 'no_such_metric'"),
    ('"exposed_comm_pct" = ["fatal", { max = 1 }]', "",
     "gate.assertions.exposed_comm_pct[0] must be one of error, off, warn, warning, got 'fatal'"),
    ('"exposed_comm_pct" = ["error", { maximum = 1 }]', "",
     "gate.assertions.exposed_comm_pct[1]: unknown key 'maximum'; known: aggregate, allow_unavailable, max, min"),
    ('"exposed_comm_pct" = "error"', "", "gate.assertions.exposed_comm_pct: a metric assertion needs min and/or max"),
    ('"exposed_comm_pct" = ["error", { max = 1, aggregate = "mean" }]', "",
     "gate.assertions.exposed_comm_pct[1].aggregate must be one of max, median, min, p90, typical, got 'mean'"),
    ('"exposed_comm_pct" = ["error", { max = "ten" }]', "", "exposed_comm_pct[1].max must be a number, got 'ten'"),
    ('"exposed_comm_pct" = ["error", { max = nan }]', "", "exposed_comm_pct[1].max must be a finite number"),
    ('"exposed_comm_pct" = ["error", "max"]', "", "gate.assertions.exposed_comm_pct[1] must be a table, got 'max'"),
    ('"exposed_comm_pct" = ["error", { max = 1 }]', "preset = 'lenient'",
     "gate.preset must be one of recommended, strict, got 'lenient'"),
    ('"exposed_comm_pct" = ["error", { max = 1 }]', "max_regression_pct = -1",
     "gate.max_regression_pct must be a number ≥ 0, got -1"),
    ('"exposed_comm_pct" = ["error", { max = 1 }]', "colour = 'red'", "gate: unknown key 'colour'; known: "),
    ('"exposed_comm_pct" = ["error", { max = 1 ', "", "invalid TOML"),
    ('"rule:ddp-bucket-huge" = "error"', "", "unknown rule 'ddp-bucket-huge'"),  # checked against the registry
    ('"rule:straggler-rank" = ["error", { max = 0.5 }]', "",
     'gate.assertions."rule:straggler-rank"[1].max must be a whole number ≥ 0, got 0.5'),
])
def test_config_errors_exit_2(job, tmp_path, capsys, assertions, gate, message):
    config = write_config(tmp_path / "g.toml", assertions, gate)
    rc, out, err = run_cli(["gate", job, "--config", config], capsys)
    assert rc == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and str(config) in err


def test_unknown_rule_name_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown rule 'ddp-bucket-huge'"):
        parse_gate_config({"gate": {"assertions": {"rule:ddp-bucket-huge": "error"}}},
                          rule_names=["ddp-bucket-oversized"])
    known = parse_gate_config({"gate": {"assertions": {"rule:ddp-bucket-oversized": "error"}}},
                              rule_names=["ddp-bucket-oversized"])
    assert known.assertions[0].rule == "ddp-bucket-oversized"


@pytest.mark.parametrize("args, message", [
    (["--config", "missing.toml"], "missing.toml: configuration file not found"),
    ([], "nothing to check"),
    (["--preset", "recommended", "--baseline", "nope.json"], "nope.json: no such file"),
    (["--preset", "nope"], "Invalid value for '--preset'"),
])
def test_usage_and_input_errors_exit_2(job, capsys, args, message):
    rc, _, err = run_cli(["gate", job, *args], capsys)
    assert rc == 2 and message in err


def test_no_path_and_unreadable_trace_exit_2(tmp_path, capsys):
    assert run_cli(["gate"], capsys)[0] == 2
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [')
    rc, _, err = run_cli(["gate", bad, "--preset", "recommended"], capsys)
    assert rc == 2 and str(bad) in err and "invalid JSON" in err


def test_preset_from_pyproject_in_the_current_directory(job, tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.tracecliff.gate]\npreset = "recommended"\n'
                                              '[tool.tracecliff.gate.assertions]\n"idle_pct" = "off"\n')
    rc, out, _ = run_cli(["gate", job], capsys)
    # recommended: exposed ≤ 20% (the typical step's 20.0 sits on the bound), overlap ≥ 50% (33.3:
    # warning); idle turned off
    assert rc == 0
    rows = {line.split()[2]: line.split()[0] for line in out.splitlines() if "_pct" in line}
    assert set(rows) == {"exposed_comm_pct", "overlap_pct"} and rows["overlap_pct"] == "WARN"
    assert "idle_pct" not in out


def test_junit_xml_and_github_summary(job, tmp_path, capsys, monkeypatch):
    base = tmp_path / "base.json"
    run_cli(["diagnose", job, "--format", "json", "-o", base], capsys)
    config = write_config(tmp_path / "g.toml", '"exposed_comm_pct" = ["error", { max = 10 }]\n'
                          '"overlap_pct" = ["warn", { min = 50 }]\n"step_time_us" = ["error", { max = 1e6 }]\n'
                          '"mfu" = ["warn", { min = 0.1, allow_unavailable = true }]')
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    rc, _, _ = run_cli(["gate", base, "--config", config, "--baseline", base, "--junit", junit,
                        "--github-summary"], capsys)
    assert rc == 1
    root = ET.parse(junit).getroot()
    cases = root.findall("testsuite/testcase")
    compared = len(run_metrics(load_run([str(base)])))
    # the run's own checks (measured, baseline comparable), the 4 assertions, each metric compared
    assert int(root.get("tests")) == len(cases) == 2 + 4 + compared
    assert [c.get("name") for c in root.findall("testsuite[@name='tracecliff.gate.run']/testcase")] == \
        ["measured", "baseline"]
    assert int(root.get("failures")) == len(root.findall(".//failure")) == 1
    assert int(root.get("skipped")) == len(root.findall(".//skipped")) == 1
    failed = root.find(".//failure/..")
    assert failed.get("name") == "exposed_comm_pct" and failed.get("classname") == "tracecliff.gate.assertions"
    text = summary.read_text()
    assert text.startswith("earlier step\n### tracecliff gate: ❌ FAIL")
    assert text.count("\n| ") == 1 + len(cases)  # header + one row per check


def test_saved_result_is_detected_by_content_and_gives_the_same_metrics(job, tmp_path, capsys):
    saved = tmp_path / "renamed.trace.json"  # a trace-like name: content decides
    run_cli(["diagnose", job, "--format", "json", "-o", saved], capsys)
    assert run_metrics(load_run([str(saved)])) == run_metrics(load_run([str(job)]))


def test_baseline_catches_a_synthetic_job_with_20_percent_slower_compute(tmp_path, capsys, monkeypatch):
    """The generator's own truth says how much slower the step is; the gate must see the same."""
    from dataclasses import replace

    from analyzer.synth import JobSpec, write_job as write_synthetic
    monkeypatch.chdir(tmp_path)
    spec = JobSpec(world_size=2, gpus_per_node=2, n_layers=2, steps=3)
    slow_spec = replace(spec, gemm_efficiency=spec.gemm_efficiency / 1.2,
                        attn_efficiency=spec.attn_efficiency / 1.2, mem_efficiency=spec.mem_efficiency / 1.2)
    fast, slow = write_synthetic(spec, tmp_path / "fast"), write_synthetic(slow_spec, tmp_path / "slow")
    truth = [json.loads((d / "truth.json").read_text())["step_time_us"] for d in (fast, slow)]
    base = tmp_path / "base.json"
    assert run_cli(["diagnose", fast / "rank-*", "--format", "json", "-o", base], capsys)[0] == 0
    rc, out, _ = run_cli(["gate", slow / "rank-*", "--baseline", base, "--format", "json"], capsys)
    step = next(c for c in json.loads(out)["checks"] if c["name"] == "step_time_us")
    assert rc == 1 and step["status"] == "fail"
    assert step["change_pct"] == pytest.approx(100 * (truth[1] / truth[0] - 1), abs=0.5)


def test_mfu_from_model_size_and_tokens(job, tmp_path, capsys):
    """6Ψ FLOPs/token, Ψ = 1e6, 1000 tokens per step on 2 H100s (989 TFLOPS): the typical step
    (step 1, 100 µs) gives MFU 6e6·1e3/100e-6/2/989e12 = 0.030334."""
    config = write_config(tmp_path / "g.toml", '"mfu" = ["error", { min = 0.0303, max = 0.0304 }]')
    rc, out, _ = run_cli(["gate", job, "--config", config, "--model-params", "1e6", "--tokens-per-step", "1000",
                          "--format", "json"], capsys)
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "mfu")
    assert rc == 0 and check["actual"] == pytest.approx(6e9 / 100e-6 / 2 / 989e12, rel=1e-4)


def test_warn_and_warning_both_read_as_warning():
    for spelling in ("warn", "warning"):
        config = parse_gate_config({"gate": {"assertions": {
            "overlap_pct": [spelling, {"min": 50}], "rule:straggler-rank": spelling,
            "idle_pct": [spelling, {"max": 1.0}]}}}, rule_names=["straggler-rank"])
        assert {a.level for a in config.assertions} == {"warning"}
    recommended = parse_gate_config({}, preset="recommended", rule_names=["straggler-rank"])
    assert {a.level for a in recommended.assertions} == {"warning"}


def test_gate_config_errors_name_the_source_and_key():
    with pytest.raises(ConfigError) as info:
        parse_gate_config({"gate": {"max_regression_pct_by_metric": {"step_time_us": -2}}}, source="ci.toml")
    assert str(info.value) == "ci.toml: gate.max_regression_pct_by_metric.step_time_us must be a number ≥ 0, got -2"
    with pytest.raises(ConfigError, match=r"^ci.toml: gate.max_regression_pct_by_metric.nope: unknown gate metric"):
        parse_gate_config({"gate": {"max_regression_pct_by_metric": {"nope": 2}}}, source="ci.toml")
    with pytest.raises(ConfigError, match=r'^ci.toml: gate.assertions.mfu: expected "level" or \["level", \{options\}\]$'):
        parse_gate_config({"gate": {"assertions": {"mfu": 5}}}, source="ci.toml")
