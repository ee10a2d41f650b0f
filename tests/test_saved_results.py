"""Saved results are input too: a malformed ``diagnose --format json`` file (wrong types, a
missing key, an unknown schema version, a truncated file) is one line naming the file and the
key, exit 2, for diagnose, gate (as the run and as the baseline), diff (either side) and
load_result; never a traceback, never a page drawn from it."""

from __future__ import annotations

import json

import pytest

from analyzer.api import load_result
from analyzer.base.errors import InputError
from analyzer.cli.main import main
from builders import two_step_ddp


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    for rank in (0, 1):
        two_step_ddp(rank=rank).write(root / f"rank-{rank}.json")
    out = root / "result.json"
    with pytest.raises(SystemExit) as done:
        main(["diagnose", str(root), "--format", "json", "-o", str(out), "--no-cache", "--workers", "1"])
    assert done.value.code == 0
    return root, out


def _edited(doc, change):
    doc = json.loads(json.dumps(doc))
    change(doc)
    return doc


def _set(path, value):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _drop(key):
    return lambda doc: doc.pop(key)


# (name, change, what the one line must say)
BROKEN = [
    ("wrong type", _set(["ranks", 0, "rank"], "zero"), "ranks[0].rank: expected `int`, got `str`"),
    ("wrong step type", _set(["attribution", "step_time_us"], "slow"),
     "attribution.step_time_us: expected `float`, got `str`"),
    ("missing key", _drop("job"), "missing required field `job`"),
    ("missing leaf", lambda d: d["attribution"].pop("idle_us"), "missing required field `idle_us`"),
    ("schema version 99", _set(["schema_version"], 99), "schema_version 99 is not one this tracecliff reads"),
    ("schema version as text", _set(["schema_version"], "1"), "schema_version \"1\" is not one"),
    ("excluded step role", _set(["attribution", "excluded_steps", 0, "role"], "sleepy"),
     "attribution.excluded_steps[0].role"),
    # hand-edited times the shares, the gate and the diff would divide (the diff's scaling
    # efficiency failed on them as an internal error)
    ("step time not a number", _set(["attribution", "step_time_us"], float("nan")),
     "Expected `float` >= 0.0 - at `$.attribution.step_time_us`"),
    ("negative step time", _set(["attribution", "step_time_us"], -5.0),
     "Expected `float` >= 0.0 - at `$.attribution.step_time_us`"),
    ("negative leaf of a rank", _set(["ranks", 0, "time_breakdown", "idle_us"], -1.0),
     "Expected `float` >= 0.0 - at `$.ranks[0].time_breakdown.idle_us`"),
    ("infinite step of a rank", _set(["ranks", 1, "steps", 0, "step_time_us"], float("inf")),
     "at `$.ranks[1].steps[0].step_time_us`"),
]


def _variants(tmp_path, saved_file):
    doc = json.loads(saved_file.read_text())
    out = []
    for name, change, message in BROKEN:
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(json.dumps(_edited(doc, change)))
        out.append((path, message))
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(saved_file.read_bytes()[:2000])
    out.append((truncated, "not valid JSON: a truncated or damaged tracecliff result"))
    return out


def _run(args, capsys):
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_load_result_names_the_file_and_the_key(saved, tmp_path):
    _, good = saved
    assert load_result(good).model.step_time_us == 100.0
    for path, message in _variants(tmp_path, good):
        with pytest.raises(InputError) as info:
            load_result(path)
        text = str(info.value)
        assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


@pytest.mark.parametrize("command", ["diagnose", "gate-run", "gate-baseline", "diff-base", "diff-new"])
def test_every_command_refuses_a_malformed_result_in_one_line(saved, tmp_path, capsys, command, monkeypatch):
    traces, good = saved
    monkeypatch.chdir(tmp_path)  # no pyproject.toml of the repository
    for path, message in _variants(tmp_path, good):
        args = {"diagnose": ["diagnose", path],
                "gate-run": ["gate", path, "--baseline", good],
                "gate-baseline": ["gate", traces, "--baseline", path, "--no-cache"],
                "diff-base": ["diff", path, good],
                "diff-new": ["diff", good, path]}[command]
        code, out, err = _run(args, capsys)
        assert code == 2, (command, path.name, out, err)
        assert err.count("\n") == 1 and str(path) in err and message in err, (command, err)
        assert "Traceback" not in err and "internal error" not in err


def test_a_good_result_renders_and_gates_as_its_traces(saved, capsys, tmp_path, monkeypatch):
    traces, good = saved
    monkeypatch.chdir(tmp_path)
    assert _run(["diagnose", good, "--format", "html", "-o", tmp_path / "r.html"], capsys)[0] == 0
    code, out, _ = _run(["gate", traces, "--baseline", good, "--no-cache", "--format", "json"], capsys)
    assert code == 0 and all(c["status"] in ("pass", "improved") for c in json.loads(out)["checks"])


def test_every_sample_and_real_jobs_result_is_plausible():
    """What tracecliff writes it reads back: no job's times are refused by the checks above."""
    from analyzer.job.plausible import check_result
    from rule_cases_lib import diagnosed, sample_traces
    for job in sorted(sample_traces()):
        check_result(json.loads(json.dumps(diagnosed(job).to_dict())), job)
