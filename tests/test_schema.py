"""The published contracts: `tracecliff schema` (the result) and `tracecliff schema --config`
validate what the tool really writes and reads, and reject what it would not."""

import copy
import json
import re

import jsonschema
import pytest

from analyzer.base.config import tomllib
from analyzer.job.large import LARGE_SCHEMA_VERSION
from analyzer.job.result import SCHEMA_VERSION
from conftest import REPO
from rule_cases_lib import diagnosed, sample_traces
from test_gate import run_cli


@pytest.fixture(scope="module")
def result_validator():
    from analyzer.api import result_schema
    schema = result_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_command_prints_the_versioned_schema(capsys):
    rc, out, err = run_cli(["schema"], capsys)
    assert rc == 0 and err == ""
    schema = json.loads(out)
    assert schema["title"].endswith(f"(schema_version {SCHEMA_VERSION} or {LARGE_SCHEMA_VERSION})")
    assert schema["$id"].endswith(f"result-v{LARGE_SCHEMA_VERSION}.json")
    assert schema["$defs"]["ResultDocument"]["properties"]["schema_version"] == {"enum": [SCHEMA_VERSION]}
    assert schema["$defs"]["LargeResultDocument"]["properties"]["schema_version"] == {"enum": [LARGE_SCHEMA_VERSION]}
    assert run_cli(["schema", "--format", "json"], capsys)[1] == out  # json is the default
    rc, config_out, _ = run_cli(["schema", "--config"], capsys)
    assert rc == 0 and json.loads(config_out)["$id"].endswith(f"config-v{SCHEMA_VERSION}.json")


@pytest.mark.parametrize("trace", sorted(sample_traces()))
def test_every_sample_result_validates(trace, result_validator, capsys, tmp_path):
    out = tmp_path / "result.json"
    rc, _, err = run_cli(["diagnose", *sample_traces()[trace], "--format", "json", "-o", out, "--workers", "1"],
                         capsys)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in result_validator.iter_errors(doc)]
    assert errors == []
    _assert_schema_lists_every_key(doc, result_validator.schema)


def _assert_schema_lists_every_key(doc, schema):
    """The Structs mirror the JSON: a key the tool writes but the schema does not name is a
    contract nobody published (sections kept open on purpose: evidence, timeline, scaling, hta)."""
    defs = schema["$defs"]
    props = lambda name: set(defs[name]["properties"])  # noqa: E731
    assert set(doc) <= props("ResultDocument")
    for key, name in (("ranks", "RankDoc"), ("collectives", "Collective"), ("buckets", "BucketDoc"),
                      ("fsdp_units", "FsdpUnit"), ("groups", "GroupDoc"), ("findings", "Finding"),
                      ("collective_summary", "CollectiveSummary"), ("rules", "RuleStatus"), ("inputs", "Input")):
        for row in doc.get(key) or []:
            assert set(row) <= props(name), (key, set(row) - props(name))
    for rank in doc["ranks"]:
        for step in rank["steps"]:
            assert set(step) <= props("Step"), set(step) - props("Step")
    for key, name in (("job", "JobDoc"), ("topology", "TopologyDoc"), ("stragglers", "Stragglers"), ("mfu", "Mfu")):
        if doc.get(key) is not None:
            assert set(doc[key]) <= props(name), (key, set(doc[key]) - props(name))


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.update(schema_version=4), "schema_version"),
    (lambda d: d.update(schema_version=3), "collective_rows"),  # a large result's keys, missing
    (lambda d: d.pop("ranks"), "ranks"),
    (lambda d: d["findings"][0].update(severity="fatal"), "severity"),
    (lambda d: d["findings"][0].pop("summary"), "summary"),
    (lambda d: d["collectives"][0].update(bytes="many"), "bytes"),
    (lambda d: d["collectives"][0].update(bound="fast"), "bound"),
    (lambda d: d["ranks"][0]["steps"][0].update(exposed_comm_us=None), "exposed_comm_us"),
    (lambda d: d["groups"][0].update(cross_node="yes"), "cross_node"),
    (lambda d: d["hardware"]["gpu_name"].pop("origin"), "origin"),
])
def test_a_broken_document_is_rejected(result_validator, mutate, where):
    doc = copy.deepcopy(diagnosed("synthetic/ddp_bucket_oversized").to_dict())
    doc = json.loads(json.dumps(doc))
    assert list(result_validator.iter_errors(doc)) == []
    mutate(doc)
    errors = _leaves(result_validator.iter_errors(doc))
    assert errors and any(where in (list(e.absolute_path) + [e.message]).__str__() for e in errors), errors


def _leaves(errors):
    """The specific errors under the schema_version alternatives (``anyOf``: the document
    matched neither version's schema); their message names the key, not the whole document."""
    out = []
    for e in errors:
        out.extend(_leaves(e.context) if e.context else [e])
    return out


def test_msgspec_decodes_a_saved_result_into_the_typed_document():
    import msgspec

    from analyzer.job.schema import ResultDocument
    text = diagnosed("synthetic/ddp_straggler").to_json()
    typed = msgspec.json.decode(text, type=ResultDocument)
    assert typed.findings[0].rule == "straggler-rank" and typed.ranks[0].steps
    with pytest.raises(msgspec.ValidationError, match=r"findings\[0\]\.severity"):
        msgspec.json.decode(text.replace('"severity": "warning"', '"severity": "fatal"'), type=ResultDocument)


# ---------------------------------------------------------------- configuration schema
def _toml_blocks(path):
    return [tomllib.loads(block) for block in re.findall(r"```toml\n(.*?)```", path.read_text("utf-8"), re.S)]


def test_config_schema_accepts_the_documented_examples_and_the_validator_agrees():
    from analyzer.api import config_schema
    from analyzer.base.config import rule_settings
    from analyzer.compare.gate import parse_gate_config, registered_rule_names
    from analyzer.rules.engine import all_rules
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    examples = _toml_blocks(REPO / "README.md") + _toml_blocks(REPO / "docs" / "ci.md")
    tables = [doc["tool"]["tracecliff"] for doc in examples if "tracecliff" in doc.get("tool", {})]
    assert len(tables) >= 2
    for table in tables:
        assert list(validator.iter_errors(table)) == []
        rule_settings(table, all_rules())
        parse_gate_config(table, rule_names=registered_rule_names())


@pytest.mark.parametrize("table", [
    {"rules": {"no-such-rule": {}}},
    {"rules": {"straggler-rank": {"consistency": 1.5}}},
    {"rules": {"straggler-rank": {"severity": "fatal"}}},
    {"rules": {"straggler-rank": {"enabled": 1}}},
    {"gate": {"preset": "lenient"}},
    {"gate": {"max_regression_pct": -1}},
    {"gate": {"colour": "red"}},
    {"gate": {"max_regression_pct_by_metric": {"step_time_us": -1}}},
    {"gate": {"assertions": {"overlap_pct": ["warning", {"minimum": 50}]}}},
    {"gate": {"assertions": {"overlap_pct": ["warning", {"min": 50}, 3]}}},
    {"gate": {"assertions": {"mfu": 5}}},
    {"gate": {"assertions": {"mfu": ["fatal", {"min": 0.3}]}}},
    {"gate": {"assertions": {"mfu": ["error", {"aggregate": "mean", "min": 0.3}]}}},
])
def test_config_schema_and_validator_reject_the_same_tables(table):
    from analyzer.api import config_schema
    from analyzer.base.config import rule_settings
    from analyzer.base.errors import ConfigError
    from analyzer.compare.gate import parse_gate_config
    from analyzer.rules.engine import all_rules
    assert list(jsonschema.Draft202012Validator(config_schema()).iter_errors(table))
    with pytest.raises(ConfigError):
        rule_settings(table, all_rules(), "t.toml")
        parse_gate_config(table, source="t.toml")


def test_the_ci_doc_script_validates_a_result(tmp_path):
    import os
    import subprocess
    import sys
    script = re.search(r"```python\n(# check_result\.py.*?)```", (REPO / "docs" / "ci.md").read_text("utf-8"), re.S)
    (tmp_path / "check_result.py").write_text(script.group(1))
    shim = tmp_path / "bin" / "tracecliff"  # this checkout's CLI, whatever else is on PATH
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m analyzer \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    good = tmp_path / "good.json"
    good.write_text(diagnosed("synthetic/ddp_straggler").to_json())
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"severity": "warning"', '"severity": "fatal"'))
    run = lambda path: subprocess.run([sys.executable, "check_result.py", str(path)], cwd=tmp_path, env=env,  # noqa: E731
                                      capture_output=True, text=True)
    assert run(good).returncode == 0
    failed = run(bad)
    assert failed.returncode == 1 and "findings/0/severity: 'fatal' is not one of" in failed.stderr


def _edge_jobs(tmp_path):
    """Traces unlike any sample: no steps, no GPU activity, no distributed info, no collectives."""
    from builders import TraceBuilder, two_step_ddp
    jobs = {}
    no_steps = two_step_ddp()
    no_steps.events[:] = [e for e in no_steps.events if not e["name"].startswith("ProfilerStep")]
    cpu_only = TraceBuilder()
    cpu_only.cpu("ProfilerStep#1", 0, 100, cat="user_annotation")
    cpu_only.cpu("aten::mm", 10, 50)
    bare = two_step_ddp()
    del bare.doc["distributedInfo"], bare.doc["deviceProperties"]
    no_comm = two_step_ddp()
    no_comm.events[:] = [e for e in no_comm.events if "nccl" not in e["name"] and e["name"] != "record_param_comms"]
    for name, builder in (("no_steps", no_steps), ("cpu_only", cpu_only), ("bare", bare), ("no_comm", no_comm)):
        (tmp_path / name).mkdir()
        jobs[name] = builder.write(tmp_path / name / "rank-0.json")
    return jobs


def test_results_of_unusual_traces_validate(result_validator, tmp_path, capsys):
    for name, path in _edge_jobs(tmp_path).items():
        out = tmp_path / f"{name}.json"
        rc, _, err = run_cli(["diagnose", path, "--format", "json", "-o", out, "--no-cache"], capsys)
        assert rc == 0, (name, err)
        doc = json.loads(out.read_text())
        assert [e.message for e in result_validator.iter_errors(doc)] == [], name
        _assert_schema_lists_every_key(doc, result_validator.schema)
