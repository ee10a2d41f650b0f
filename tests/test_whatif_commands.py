"""The ``tracecliff whatif`` command a finding prints gives the finding's figure, to the µs: for
every sample job and every command its findings print (a prediction's, an alternative's, a
straggler's ``per_rank`` entry), the command is run (TRACES: the job's saved result, which
``whatif`` reads as it reads traces) and its measured step is the report's typical step and its
projected step the finding's predicted one."""

from __future__ import annotations

import json
import shlex

import pytest

from analyzer.cli.main import main
from analyzer.job.result import dumps
from rule_cases_lib import diagnosed, sample_traces


def _commands(result) -> list[tuple[str, float]]:
    """(command, the predicted step the finding prints beside it) of every finding."""
    out = []
    for f in result.findings:
        evidence = f.get("evidence") or {}
        prediction = evidence.get("prediction") or {}
        if prediction.get("whatif") and prediction.get("predicted_step_time_us") is not None:
            out.append((prediction["whatif"], prediction["predicted_step_time_us"]))
        for alternative in prediction.get("alternatives") or []:
            if alternative.get("whatif") and alternative.get("projected_step_time_us") is not None:
                out.append((alternative["whatif"], alternative["projected_step_time_us"]))
        for entry in evidence.get("per_rank") or []:
            out.append((entry["whatif"], entry["predicted_step_alone_us"]))
    return out


def _run(capsys, path: str, command: str) -> dict:
    words = shlex.split(command)
    assert words[:3] == ["tracecliff", "whatif", "TRACES"], command
    with pytest.raises(SystemExit) as code:
        main(["whatif", path, *words[3:], "--format", "json"])
    captured = capsys.readouterr()
    assert code.value.code == 0, (command, captured.err)
    return json.loads(captured.out)


JOBS = [t for t in sorted(sample_traces()) if _commands(diagnosed(t))]


def test_sample_jobs_print_whatif_commands():
    assert len(JOBS) >= 8  # the bucket, NIC, wrap-policy and straggler jobs among them
    assert any(cmd.split()[3] == "--fix-ranks" for t in JOBS for cmd, _ in _commands(diagnosed(t)))
    assert any(cmd.split()[3] != "--fix-ranks" for t in JOBS for cmd, _ in _commands(diagnosed(t)))


@pytest.mark.parametrize("trace", JOBS)
def test_each_printed_command_reproduces_the_finding(trace, tmp_path, capsys):
    result = diagnosed(trace)
    saved = tmp_path / "result.json"
    saved.write_text(dumps(result.to_dict()), "utf-8")
    typical = round(result.model.step_time_us, 1)
    for command, predicted in _commands(result):
        doc = _run(capsys, str(saved), command)
        if "--fix-ranks" in command:
            assert (doc["step_time_us"], doc["predicted_step_time_us"]) == (typical, predicted), (trace, command)
        else:
            assert doc["measured"]["step_time_us"] == typical, (trace, command)
            assert doc["projected"]["step_time_us"] == predicted, (trace, command)
