"""The typed Result round-trips through its JSON: a saved result is a Result again, and every
renderer gives the same bytes from it as from the traces (the HTML needs nothing but the Result)."""

from __future__ import annotations

import pytest

from analyzer.api import DiagnoseOptions, diagnose, load_result
from analyzer.cli import main
from analyzer.api import Result
from analyzer.reports import render
from conftest import SAMPLES

JOBS = [SAMPLES / "synthetic" / "ddp_straggler", SAMPLES / "synthetic" / "fsdp_fullshard_2node",
        SAMPLES / "cpu_gloo" / "ddp", SAMPLES / "gpu_h200" / "fsdp2"]


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.name)
def test_saved_result_renders_the_same_bytes(job, tmp_path):
    result = diagnose(str(job), DiagnoseOptions(workers=1))
    saved = tmp_path / "result.json"
    saved.write_text(render(result, "json"), encoding="utf-8")
    again = load_result(saved)
    assert isinstance(again, Result) and again.to_dict() == Result.from_dict(result.to_dict()).to_dict()
    for fmt in ("json", "html", "text"):
        assert render(again, fmt) == render(result, fmt), fmt
    assert result.timeline is not None and result.scaling is not None  # the HTML's own sections


def test_cli_rerenders_a_saved_result(tmp_path, capsys):
    job = SAMPLES / "synthetic" / "ddp_bucket_oversized"
    for name, args in (("a.json", ["--format", "json"]), ("a.html", ["--format", "html"])):
        with pytest.raises(SystemExit) as code:
            main(["diagnose", str(job), "--no-cache", "-o", str(tmp_path / name), *args])
        assert code.value.code == 0
    with pytest.raises(SystemExit):
        main(["diagnose", str(tmp_path / "a.json"), "--format", "html", "-o", str(tmp_path / "b.html")])
    assert (tmp_path / "b.html").read_bytes() == (tmp_path / "a.html").read_bytes()


def test_streamed_json_is_the_same_bytes(monkeypatch):
    """The CLI streams a result's JSON (long lists a batch at a time): the bytes are dumps'."""
    import analyzer.job.result as result_module
    from analyzer.job.result import dumps, iter_json
    monkeypatch.setattr(result_module, "_BATCH", 3)  # every list here is "long"
    result = diagnose(str(JOBS[0]), DiagnoseOptions(workers=1))
    doc = result.to_dict()
    # the Result streams its Buckets as they are: the bytes of its plain document
    assert result.buckets and all(type(b) is dict for b in doc["buckets"])
    assert b"".join(result.json_chunks()) == dumps(doc).encode("utf-8") == result.to_json().encode("utf-8")
    odd = {"b": [float("nan"), {"z": 1, "a": [1, 2, {"q": []}]}, [], {}, "x\ny"], "a": {}, "c": list(range(7))}
    for value in (doc, odd, {}):
        assert b"".join(iter_json(value)) == dumps(value).encode("utf-8")
