"""The report's step timeline from the kernels the map kept (issue 13): the same section as
decoding the shown ranks again, without that decode; never in the cache entries; dropped past
the memory budget, where the report reads the ranks again as before."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.job.result import dumps
from analyzer.job.step_timeline import report_timeline
from analyzer.rank import analysis
from analyzer.rank.analysis import RankOptions, kernels_timeline, step_timeline_file
from analyzer.run import cache, executors
from builders import TraceBuilder, two_step_ddp

SAMPLE_JOB = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic" / "ddp_straggler"


@pytest.fixture
def job(tmp_path):
    return [str(two_step_ddp(rank=r, world_size=4, pg_ranks=range(4), comm_us=30.0 + 5 * r)
                .write(tmp_path / f"rank-{r}.json")) for r in range(4)]


def _sample_job() -> list[str]:
    return sorted(str(p) for p in SAMPLE_JOB.glob("rank-*.json*"))


def _no_rereads(monkeypatch):
    def refuse(*_):
        raise AssertionError("decoded a trace again for the step timeline")
    monkeypatch.setattr("analyzer.job.step_timeline.step_timeline_file", refuse)
    monkeypatch.setattr(cache, "step_timeline_file", refuse)


def _reread(result, options: DiagnoseOptions, step=None):
    """The section as before: the shown ranks decoded again."""
    for rank in result.ranks:
        rank.kernels = None
    return report_timeline(result.to_dict(), result, step, options.rank_options())


@pytest.mark.parametrize("workers", [1, 2])
def test_report_reads_no_trace_when_the_ranks_kept_their_kernels(job, monkeypatch, workers):
    options = DiagnoseOptions(workers=workers)
    expected = _reread(diagnose(job, options, report=False), options)
    _no_rereads(monkeypatch)
    result = diagnose(job, options)
    assert result.timeline["available"] and result.timeline == expected
    assert all(r.kernels is None for r in result.ranks)  # let go once the section is drawn


@pytest.mark.parametrize("options", [DiagnoseOptions(workers=2), DiagnoseOptions(workers=1, steps=(6, 7))])
def test_kept_and_reread_timelines_are_equal_on_a_sample_job(options):
    paths = _sample_job()
    steps = [s["step"] for s in diagnose(paths, options, report=False).ranks[0].steps]
    assert len(steps) > 1
    for step in (None, steps[0], steps[-1]):
        drawn = diagnose(paths, options, html_step=step).timeline
        assert drawn["available"] and drawn == _reread(diagnose(paths, options, report=False), options, step)


def test_one_function_draws_both_paths():
    """A rank's kept kernels give, step by step, what decoding its file again gives."""
    options = RankOptions(keep_kernels=True)
    for path in _sample_job()[:2]:
        kept = analysis.analyze_rank_file(path, options)
        assert kept.kernels is not None and kept.kernels.name.dtype.itemsize <= 4
        for step in [s["step"] for s in kept.steps] + [None]:
            steps = None if step is None else (step,)
            again = step_timeline_file(path, RankOptions(steps=steps), 123)
            assert kernels_timeline(kept.kernels, steps, 123) == again
        assert pickle.loads(pickle.dumps(kept)).kernels.nbytes == kept.kernels.nbytes


def test_unstepped_kernels_are_kept_only_without_steps(tmp_path):
    b = TraceBuilder()
    b.kernel("warmup_gemm", 1, 5)  # before the first step: never shown when there are steps
    b.cpu("ProfilerStep#3", 10, 50, cat="user_annotation")
    b.kernel("gemm", 20, 10, launch_ts=11)
    stepped = analysis.analyze_rank_file(str(b.write(tmp_path / "a.json")), RankOptions(keep_kernels=True))
    assert stepped.kernels.step.tolist() == [3] and stepped.kernels.strings == ["gemm"]
    b = TraceBuilder()
    b.kernel("gemm", 1, 5)
    b.kernel("nccl_AllReduce", 8, 5, stream=20)
    whole = analysis.analyze_rank_file(str(b.write(tmp_path / "b.json")), RankOptions(keep_kernels=True))
    assert len(whole.kernels.ts) == 2 and whole.kernels.ts.dtype == np.int64


def test_past_the_budget_all_kernels_are_dropped_and_the_ranks_read_again(job, monkeypatch):
    options = DiagnoseOptions(workers=1)
    expected = diagnose(job, options).timeline
    monkeypatch.setattr(executors, "KEPT_KERNELS_BYTES", 1)
    reads = []
    real = cache.step_timeline_file

    def counting(path, *args):
        reads.append(path)
        return real(path, *args)
    monkeypatch.setattr(cache, "step_timeline_file", counting)
    result = diagnose(job, options)
    assert result.timeline == expected and len(reads) == 3


def test_kernel_budget_drops_every_rank_once_the_total_is_over():
    one = analysis.analyze_rank_file(_sample_job()[0], RankOptions(keep_kernels=True))
    size = one.kernels.nbytes
    budget = executors.KernelBudget(limit=2 * size)
    ranks = [analysis.analyze_rank_file(_sample_job()[0], RankOptions(keep_kernels=True)) for _ in range(3)]
    assert budget.admit(ranks[0]).kernels is not None and budget.admit(ranks[1]).kernels is not None
    assert budget.admit(ranks[2]).kernels is None
    assert all(r.kernels is None for r in ranks) and budget.total == 3 * size


def test_cache_entries_hold_no_kernels_and_a_rerun_reads_no_trace(job, tmp_path, monkeypatch):
    store = str(tmp_path / "cache")
    first = diagnose(job, DiagnoseOptions(workers=2, cache_dir=store))
    entries = sorted(Path(store).glob(f"??/*{cache.ENTRY_SUFFIX}"))
    assert len(entries) == len(job)
    for entry in entries:
        # no field named "kernels" (msgpack's 7-byte string; markers_seen's "compute_kernels" and
        # such are counts, not the kernels)
        assert b"\xa7kernels" not in entry.read_bytes() and cache.load_entry(entry).kernels is None
    # the first run drew the section from kept kernels and cached it for the re-run, whose
    # summaries (cache hits) hold none
    _no_rereads(monkeypatch)
    monkeypatch.setattr(analysis, "load_rank_trace", None)
    again = diagnose(job, DiagnoseOptions(workers=2, cache_dir=store))
    assert dumps(again.to_dict()) == dumps(first.to_dict())


def test_no_kernels_kept_without_a_report(job):
    assert all(r.kernels is None for r in diagnose(job, DiagnoseOptions(workers=1), report=False).ranks)
    kept_timelines = diagnose(job, DiagnoseOptions(workers=1, keep_timeline=True), report=False)
    assert all(r.kernels is None and r.timeline for r in kept_timelines.ranks)

