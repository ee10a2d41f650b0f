"""The generator's jobs beyond a plain training step (issue 37 items 3, 7, 8), each checked
against the truth the generator built in (analyzer.synth.scenarios.WORKLOAD_SCENARIOS): GPU idle
in the device allocator, inference (forward passes only) named as such with inference's advice,
and phases from the forward's structure where no autograd marker or backward tells them."""

from __future__ import annotations

import json

import pytest

from analyzer.api import diagnose
from analyzer.synth import write_job
from analyzer.synth.scenarios import WORKLOAD_SCENARIOS

TRAINING_ADVICE = ("logging", "checkpointing", "evaluation", "optimizer", "DataLoader", "micro-batch")


@pytest.fixture(scope="module", params=sorted(WORKLOAD_SCENARIOS))
def job(request, tmp_path_factory):
    folder = write_job(WORKLOAD_SCENARIOS[request.param], tmp_path_factory.mktemp(request.param))
    truth = json.loads((folder / "truth.json").read_text())
    return request.param, truth, diagnose([str(folder / "rank-*.json.gz")])


def _steps(truth, result):
    """(rank, truth's step, the tool's step) for every step of every rank."""
    ranks = {r.rank: r for r in result.ranks}
    for t in truth["ranks"]:
        got = {s["step"]: s for s in ranks[t["rank"]].steps}
        assert sorted(got) == [s["step"] for s in t["steps"]]
        for want in t["steps"]:
            yield t["rank"], want, got[want["step"]]


def test_the_workload_is_the_generators(job):
    _, truth, result = job
    assert result.job["workload"] == truth["spec"].get("workload", "training")
    inference = result.job["workload"] == "inference"
    assert result.verdict.startswith("Inference (no backward pass and no optimizer step") == inference


def test_compute_by_phase_is_the_truths(job):
    """Each step's compute kernels by phase (the union of each phase's), µs: forward where the
    program ran forward, with no range around it (eager decode) or a compiled one."""
    name, truth, result = job
    checked = 0
    for rank, want, got in _steps(truth, result):
        if "compute_by_phase_us" not in want["time_breakdown"]:
            continue
        phases = {k: v["compute_us"] for k, v in got["phase_windows"].items()}
        assert phases == pytest.approx(want["time_breakdown"]["compute_by_phase_us"], abs=0.002), (rank, want["step"])
        checked += 1
    assert checked or name == "ddp_allocator_stall"


def test_collectives_carry_the_truths_phase(job):
    _, truth, result = job
    cols = truth["collectives"]["columns"]
    want = sorted((dict(zip(cols, row)) for row in truth["collectives"]["rows"]), key=lambda r: (r["rank"], r["start_us"]))
    got = sorted(result.collectives, key=lambda r: (r["rank"], r["start_us"]))
    assert [(g["step"], g["phase"]) for g in got] == [(w["step"], w["phase"]) for w in want]


def test_allocator_idle_is_the_truths(job):
    name, truth, result = job
    if name != "ddp_allocator_stall":
        pytest.skip("no allocator stall in this job")
    for rank, want, got in _steps(truth, result):
        tb, w = got["time_breakdown"], want["time_breakdown"]
        assert tb["idle_by_host"]["allocator"] == pytest.approx(w["idle_allocator_us"], abs=0.002), (rank, want["step"])
        assert tb["idle_by_host"]["device_sync"] == pytest.approx(w["idle_device_sync_us"], abs=0.002)
    stalled = truth["spec"]["host_stall_ranks"]
    (finding,) = [f for f in result.findings if f["rule"] == "gpu-idle-host-bound"]
    assert finding["ranks"] == stalled and finding["evidence"]["host_activity"] == "allocator"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in finding["fix"]["text"]
    # one cudaFree a step on every rank (the program's), the stalled rank's lasting its stall
    for rank, _, got in _steps(truth, result):
        (free,) = got["time_breakdown"]["allocator_calls"].values()
        assert free["calls"] == 1
        assert (free["host_us"] >= truth["spec"]["host_stall_us"]) == (rank in stalled)


def test_inference_gets_inference_advice(job):
    name, truth, result = job
    if truth["spec"].get("workload") != "inference":
        pytest.skip("a training job")
    (finding,) = [f for f in result.findings if f["rule"] == "gpu-idle-host-bound"]
    assert finding["evidence"]["workload"] == "inference"
    fix = finding["fix"]["text"]
    assert "CUDA graphs" in fix and "torch.compile" in fix and "larger batches" in fix and "syncs" in fix
    for advice in TRAINING_ADVICE:
        assert advice not in fix, advice
