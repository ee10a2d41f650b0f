"""Each derived figure has one definition (analyzer.job.model) that the text, the HTML and the
gate quote. Here: the figures without a typical step (``WholeTrace``: a saved result written
before the step breakdown, or one whose typical step could not be chosen), which the HTML took
as a median over ranks, the text as Σ/Σ and the gate as a mean of the ranks' shares."""

from __future__ import annotations

import dataclasses

import pytest

from analyzer.base.units import fmt_pct, fmt_us
from analyzer.compare.metrics import run_metrics
from analyzer.job.model import WholeTrace
from analyzer.job.result import Result
from analyzer.reports.html import HtmlRenderer
from analyzer.reports.text import TextRenderer
from rule_cases_lib import diagnosed


@pytest.fixture(scope="module")
def untyped() -> Result:
    """A diagnosed job with its step breakdown taken away (as a result saved before it)."""
    result = diagnosed("synthetic/ddp_straggler")
    ranks = [dataclasses.replace(r, time_breakdown=None) for r in result.ranks]
    return dataclasses.replace(result, ranks=ranks, attribution=None, rules=None, verdict=None,
                               findings=[])


def test_whole_trace_is_the_ranks_figures_summed(untyped):
    model = untyped.model
    assert model.typical is None
    whole = model.whole_trace
    ranks = untyped.ranks
    span = sum(r.metrics["span_us"] for r in ranks)
    exposed = sum(r.metrics["exposed_comm_us"] for r in ranks)
    assert whole.ranks == len(ranks)
    assert whole.span_us == pytest.approx(span / len(ranks))
    assert whole.exposed_share == pytest.approx(exposed / span)  # Σ/Σ: the mean figures' ratio
    assert whole.overlap_share == pytest.approx(sum(r.metrics["overlap_us"] for r in ranks)
                                                / sum(r.metrics["comm_us"] for r in ranks))
    assert 0 < whole.exposed_share < 1


def test_text_html_and_gate_quote_the_one_whole_trace_share(untyped):
    whole = untyped.model.whole_trace
    share = fmt_pct(100 * whole.exposed_share)
    text = " ".join(TextRenderer().render(untyped).split())  # as read, the lines unwrapped
    assert f"exposed communication {fmt_us(whole.exposed_us)} ({share} of the GPU span" in text
    html = HtmlRenderer().render(untyped)
    assert f"{share} of the step" in html and "whole trace, mean over" in html
    assert f"{share} of the GPU span is exposed communication" in html  # the verdict without rules
    gate = run_metrics(untyped)
    assert gate["exposed_comm_pct"].typical == pytest.approx(100 * whole.exposed_share)
    assert gate["overlap_pct"].typical == pytest.approx(100 * whole.overlap_share)


def test_no_gpu_activity_has_no_whole_trace_figures():
    assert WholeTrace.of(()) is None
    assert diagnosed("cpu_gloo/ddp").model.whole_trace is None


@pytest.mark.parametrize("job", ["synthetic/ddp_bucket_oversized", "synthetic/fsdp2_tp_2d", "cpu_gloo/compute"])
def test_the_model_read_during_the_analysis_is_the_finished_jobs(job):
    """The job analysis builds the model once, with no reset: every figure it cached while the
    sections were being written equals a model built afresh from the finished result."""
    from analyzer.job.model import JobModel

    result = diagnosed(job)
    fresh = JobModel(result)
    used = result.model
    assert used.typical == fresh.typical and used.ranks == fresh.ranks
    assert used.group_busbw == fresh.group_busbw and used.compute == fresh.compute
    assert used.groups == fresh.groups and used.whole_trace == fresh.whole_trace


def test_the_job_analysis_runs_once_on_a_fresh_result(untyped):
    from analyzer.job.analysis import analyze_job

    assert untyped.model.typical is None  # a model read before the analysis: figures of an unanalysed job
    with pytest.raises(ValueError, match="runs once"):
        analyze_job(untyped, None)


def test_one_median_rule_picks_every_step_the_figures_are_of():
    """analyzer.job.typical: the typical step is the steady step closest to the median time
    (ties: the lower step), and so is every fallback without a typical step."""
    from analyzer.job.compute import step_of
    from analyzer.job.typical import choose_typical, median_step

    times = {1: 30.0, 2: 12.0, 3: 11.0, 4: 10.5, 5: 11.5, 6: 40.0}  # 1: warm-up, 6: drain
    typical, kept, excluded = choose_typical(times)
    assert kept == [2, 3, 4, 5] and [e["step"] for e in excluded] == [1, 6]
    assert typical == 3  # median 11.25: 11.0 and 11.5 are as close, the lower step wins
    assert median_step({7: 2.0, 8: 1.0}) == 7  # a tie goes to the lower step, not the shorter one
    # CPU-only ProfilerSteps with FLOPs but no step time: the middle step by its number
    assert step_of({"steps": {"2": {}, "3": {}, "4": {}, "5": {}}}, None)[0] == "3"
