"""Steps where the trace has no ProfilerStep (issue 26): the repeats of a user annotation, else
the whole trace as one step, said as such; "CPU-only" only when there is no GPU work."""

from __future__ import annotations

import json

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.reports.text import TextRenderer
from analyzer.synth import JobSpec, write_job
from builders import TraceBuilder
from rule_cases_lib import diagnosed

SPEC = dict(n_layers=2, hidden=1024, vocab_size=8192, seq_len=512, micro_batch=2, world_size=2, gpus_per_node=2,
            steps=4, seed=41)


def _job(tmp_path, **knobs):
    out = write_job(JobSpec(name="no_profiler_steps", **SPEC, **knobs), tmp_path / "job")
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))
    return result, json.loads((out / "truth.json").read_text())


def test_repeating_annotation_gives_the_steps(tmp_path):
    """The benchmark's own 'measure|forward' around each forward, no ProfilerStep: one step per
    repeat, each as long as the generator's step (from one forward's start to the next's)."""
    result, truth = _job(tmp_path, step_marker="annotation")
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    want = [s["time_breakdown"]["step_time_us"] for s in truth["ranks"][0]["steps"]]
    for got, expected in zip(steps[:-1], want[:-1]):  # the last runs to the end of the trace
        assert got["step_time_us"] == pytest.approx(expected, rel=0.01)
    assert "'measure|forward'" in result.attribution["step_source"]
    assert any("repeats of the annotation 'measure|forward'" in w for w in result.warnings)
    text = TextRenderer().render(result)
    assert "steps: no ProfilerStep#N markers" in text and "CPU-only" not in text
    statuses = {s["rule"]: s["status"] for s in result.rules}
    assert statuses["gpu-idle-host-bound"] in ("passed", "fired")
    assert statuses["exposed-communication"] in ("passed", "fired")
    assert "CPU-only" not in result.verdict


def test_without_step_markers_a_repeating_framework_range_gives_the_steps(tmp_path):
    """No ProfilerStep and no benchmark annotation: DDP's own forward range repeats every step."""
    result, _ = _job(tmp_path, step_marker="none")
    assert [s["step"] for s in result.ranks[0].steps] == [0, 1, 2, 3]
    assert "'DistributedDataParallel.forward'" in result.attribution["step_source"]


def test_nothing_repeats_the_whole_trace_is_one_step(tmp_path):
    """Kernels and their launches only: one window, the whole GPU span, its idle as measured."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    for k in range(5):
        b.kernel("sm90_xmma_gemm_bf16bf16", 100.0 * k, 60.0, launch_ts=100.0 * k - 5)
    path = b.write(tmp_path / "rank-0.json")
    result = diagnose([str(path)], report=False)
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [0]
    assert steps[0]["step_time_us"] == pytest.approx(460.0)
    assert steps[0]["time_breakdown"]["idle_us"] == pytest.approx(160.0)
    assert "whole trace is analysed as one step" in result.attribution["step_source"]
    assert "CPU-only" not in result.verdict


def test_cpu_only_is_said_only_without_gpu_work():
    result = diagnosed("cpu_gloo/ddp")
    assert "CPU-only" in result.verdict
    assert not any("ProfilerStep#N markers" in w for w in result.warnings)
