"""A Result is built once (analyzer.api.build_report) and then frozen: no stage, view or loader
writes into it after. What the views derive from it is kept through the one memo helper
(analyzer.base.memo) in its private slot."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from analyzer.api import DiagnoseOptions, analyze_files, build_report, load_result, load_run
from analyzer.base import memo
from analyzer.compare.diff import diff_runs
from analyzer.compare.gate import evaluate, parse_gate_config
from analyzer.ingest.files import discover_trace_files
from analyzer.job.columns import CollectiveColumns
from analyzer.job.digest import collective_digest
from analyzer.job.result import FrozenResultError, Result
from analyzer.reports import render
from analyzer.whatif.counterfactual import Replayer
from analyzer.whatif.prediction import WhatIf
from analyzer.whatif.projection import Measured
from rule_cases_lib import diagnosed, sample_traces

JOB = "synthetic/ddp_straggler"  # eight ranks, two steps: a fired rule, a what-if, every view


@pytest.fixture(scope="module")
def result() -> Result:
    return diagnosed(JOB)  # shared with the rule tests (one diagnosis per session)


def test_a_built_result_refuses_writes_to_its_public_attributes(result):
    assert result.frozen
    for name, value in (("verdict", "patched"), ("findings", []), ("hta", {}), ("collectives", []),
                        ("collective_digest", {}), ("anything_new", 1)):
        with pytest.raises(FrozenResultError, match=f"Result.{name}: the Result is frozen"):
            setattr(result, name, value)
    for name in ("timeline", "scaling"):
        with pytest.raises(FrozenResultError, match=f"Result.{name}"):
            delattr(result, name)
    assert isinstance(FrozenResultError("x"), TypeError)
    assert result.verdict != "patched" and result.findings and result.timeline and result.scaling
    # private slots stay writable: the memo helper's, and a descriptor's cached rows
    result._scratch = 1
    del result._scratch


def test_derived_values_are_kept_once_on_the_frozen_result(result):
    view = CollectiveColumns.of(result)
    assert CollectiveColumns.of(result) is view and view.rows is result.collectives
    assert result.model is result.model
    assert collective_digest(result) is collective_digest(result)
    assert Replayer.of(result) is Replayer.of(result)
    assert Measured.of(result) is Measured.of(result)
    whatif = WhatIf.of(result)
    assert whatif is WhatIf.of(result) and whatif.as_measured is not None
    assert {"job_model", "collective_columns", "collective_digest", "replayer", "whatif_measured",
            "whatif"} <= set(vars(result)[memo.SLOT])


def test_the_memo_is_remade_when_what_it_derives_from_is_replaced():
    owner = SimpleNamespace()
    made: list[int] = []
    rows_a, rows_b = [1, 2], [1, 2]  # equal, not the same object

    def build(rows: list[int]) -> list[int]:
        made.append(len(rows))
        return list(rows)
    first = memo.memo(owner, "copy", lambda: build(rows_a), rows_a)
    assert memo.memo(owner, "copy", lambda: build(rows_a), rows_a) is first and made == [2]
    assert memo.memo(owner, "copy", lambda: build(rows_b), rows_b) is not first and made == [2, 2]
    assert not memo.held(owner, "other")
    memo.seed(owner, "other", "given", rows_a)
    assert memo.held(owner, "other") and memo.memo(owner, "other", lambda: "built", rows_a) == "given"
    assert memo.memo(owner, "other", lambda: "built", rows_a, valid=lambda value: value != "given") == "built"


@pytest.mark.parametrize("job", [JOB, "cpu_gloo/memory_ddp"])  # the second: the memory section and its models
def test_the_views_render_a_frozen_result_without_changing_it(job):
    result = diagnosed(job)
    before = result.to_json()
    texts = {fmt: render(result, fmt) for fmt in ("text", "json", "html")}
    again = {fmt: render(result, fmt) for fmt in ("text", "json", "html")}
    assert texts == again and texts["json"] == before
    assert result._repr_html_() and result.to_html() == texts["html"]
    assert result.to_json() == before


def test_gate_and_diff_read_frozen_results(result):
    before = result.to_json()
    report = evaluate(result, parse_gate_config({}, preset="recommended"), result, "itself")
    assert report.checks
    diff = diff_runs(result, result)
    assert diff["metrics"] and all(m["delta"] == 0 for m in diff["metrics"])
    assert result.to_json() == before


def test_a_saved_result_reads_back_frozen(result, tmp_path):
    path = tmp_path / "result.json"
    result.save(path)
    for loaded in (load_result(path), load_run([str(path)]), Result.from_dict(json.loads(path.read_text()))):
        assert loaded.frozen and loaded.to_json() == result.to_json()
        with pytest.raises(FrozenResultError, match="Result.findings"):
            loaded.findings = []
        assert render(loaded, "text") == render(result, "text")
    # a new Result of other parts is a Result to build, not frozen
    assert not dataclasses.replace(load_result(path), findings=[]).frozen


def test_the_build_is_a_function_of_the_ranks_and_options():
    files = discover_trace_files(sample_traces()["synthetic/ddp_bucket_oversized"])
    options = DiagnoseOptions(workers=1)
    built = [build_report(analyze_files(files, options), options, report=False) for _ in range(2)]
    assert all(r.frozen for r in built)
    assert built[0].to_json() == built[1].to_json()
