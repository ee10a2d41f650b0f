"""Phases from the structure of the CPU side where no autograd range in today's form says them
(issue 37 item 8): autograd's nodes by bare name as PyTorch <= 1.9 records them, torch.compile's
ranges, and forward passes only (inference, a forward-only trace); ops that mark communication
are never taken for a pass. Small hand-built traces: each kernel's phase is known by construction."""

from __future__ import annotations

import json

from analyzer.api import diagnose
from analyzer.reports.html import HtmlRenderer
from analyzer.reports.text import TextRenderer
from builders import TraceBuilder

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"
AUTOGRAD = 200  # the autograd engine's thread


def _compute_by_phase(tmp_path, b):
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    (step,) = result.ranks[0].steps
    return {k: v["compute_us"] for k, v in step["phase_windows"].items()}, result


def _step(b, length=1000.0):
    b.cpu("ProfilerStep#1", 0.0, length, cat="user_annotation")
    b.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 100, "ts": 1.0})


def test_bare_autograd_nodes_are_backward(tmp_path):
    """PyTorch 1.9: 'AddmmBackward' / 'torch::autograd::AccumulateGrad' on the autograd thread,
    no evaluate_function range: the kernel launched in them is backward (30 µs), the one before
    forward (10 µs), the optimizer's in Optimizer.step (5 µs)."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _step(b)
    b.cpu("aten::addmm", 10.0, 20.0)
    b.kernel(GEMM, 40.0, 10.0, launch_ts=15.0)
    b.cpu("AddmmBackward", 100.0, 50.0, tid=AUTOGRAD)
    b.kernel(GEMM, 120.0, 30.0, launch_ts=110.0, tid=AUTOGRAD)
    b.cpu("torch::autograd::AccumulateGrad", 160.0, 10.0, tid=AUTOGRAD)
    b.cpu("Optimizer.step#SGD.step", 300.0, 50.0, cat="user_annotation")
    b.kernel(GEMM, 320.0, 5.0, launch_ts=310.0)
    phases, result = _compute_by_phase(tmp_path, b)
    assert phases == {"forward": 10.0, "backward": 30.0, "optimizer": 5.0}
    assert result.job["workload"] == "training"


def test_compiled_forward_and_its_backward_node(tmp_path):
    """torch.compile (names as torch 2.13 records them on CPU): 'Torch-Compiled Region: 0/0' >
    'CompiledFunction' is forward; 'CompiledFunctionBackward' inside its evaluate_function,
    backward."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _step(b)
    b.cpu("Torch-Compiled Region: 0/0", 10.0, 60.0)
    b.cpu("CompiledFunction", 12.0, 50.0)
    b.kernel(GEMM, 40.0, 20.0, launch_ts=20.0)
    b.cpu("autograd::engine::evaluate_function: CompiledFunctionBackward", 100.0, 60.0, tid=AUTOGRAD)
    b.cpu("CompiledFunctionBackward", 101.0, 58.0, tid=AUTOGRAD)
    b.kernel(GEMM, 130.0, 40.0, launch_ts=110.0, tid=AUTOGRAD)
    phases, _ = _compute_by_phase(tmp_path, b)
    assert phases == {"forward": 20.0, "backward": 40.0}


def test_forward_passes_only_are_forward_and_named_inference(tmp_path):
    """No backward, no optimizer, no range around the model: its kernels and its collective are
    forward; the input copy is not the model's work and stays other. The collective's own ops
    (record_param_comms, nccl:*) mark no pass."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _step(b)
    b.kernel("Memcpy HtoD (Pinned -> Device)", 5.0, 4.0, cat="gpu_memcpy", launch_ts=2.0)
    b.cpu("aten::linear", 10.0, 20.0)
    b.cpu("aten::mm", 11.0, 18.0)
    b.kernel(GEMM, 30.0, 10.0, launch_ts=15.0)
    b.cpu("record_param_comms", 50.0, 20.0)
    b.cpu("nccl:all_reduce", 52.0, 15.0)
    b.kernel(GEMM, 80.0, 10.0, launch_ts=60.0)
    phases, result = _compute_by_phase(tmp_path, b)
    assert phases == {"forward": 20.0}
    assert result.job["workload"] == "inference"
    header = next(line for line in TextRenderer().render(result).splitlines() if line.startswith("tracecliff:"))
    assert ", inference, strategy unknown" in header
    assert result.verdict.startswith("Inference (no backward pass and no optimizer step in the trace): ")
    assert "inference (no backward pass and no optimizer step in the trace)" in HtmlRenderer().render(result)
    assert json.loads(result.to_json())["job"]["workload"] == "inference"


def test_a_filtered_trace_is_not_called_inference(tmp_path):
    """Forward-looking work but no flow events and no runtime call beyond the launches (a
    filtered or sampled trace): the absence of a backward proves nothing."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    b.cpu("ProfilerStep#1", 0.0, 1000.0, cat="user_annotation")
    b.cpu("aten::mm", 11.0, 18.0)
    b.kernel(GEMM, 30.0, 10.0, launch_ts=15.0)
    _, result = _compute_by_phase(tmp_path, b)
    assert result.job["workload"] is None
    assert not result.verdict.startswith("Inference")


def _host_bound_inference(b, graphed):
    """One 2 ms step of forward passes: a kernel, then 850 µs of the host's own work before the
    next launch (a cudaGraphLaunch of two kernels sharing its correlation id, when ``graphed``)."""
    _step(b, 2000.0)
    b.cpu("aten::mm", 10.0, 30.0)
    b.kernel(GEMM, 100.0, 50.0, launch_ts=50.0)
    if not graphed:
        b.kernel(GEMM, 1000.0, 50.0, launch_ts=900.0)
        return
    b.corr += 1
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 100,
                     "ts": 900.0, "dur": 10.0, "args": {"correlation": b.corr}})
    for ts in (1000.0, 1060.0):
        b.events.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": ts, "dur": 50.0,
                         "args": {"device": 0, "stream": 7, "correlation": b.corr}})


def test_inference_advice_leaves_out_cuda_graphs_where_the_work_runs_as_graphs(tmp_path):
    fixes = {}
    for graphed in (False, True):
        b = TraceBuilder(world_size=1, pg_ranks=(0,))
        _host_bound_inference(b, graphed)
        _, result = _compute_by_phase(tmp_path, b)
        assert result.job["workload"] == "inference"
        (finding,) = [f for f in result.findings if f["rule"] == "gpu-idle-host-bound"]
        fixes[graphed] = finding["fix"]["text"]
    assert "CUDA graphs (capture" in fixes[False]
    assert "already run as CUDA graphs" in fixes[True] and "CUDA graphs (capture" not in fixes[True]
    for fix in fixes.values():
        assert "larger batches" in fix and "syncs" in fix
        assert "logging" not in fix and "checkpointing" not in fix and "optimizer" not in fix
