"""Allocator stalls as their own host leaf (issue 37 item 3): GPU idle while the host sits in the
device allocator's calls (cudaFree / hipFree / cudaMalloc / cudaHostAlloc ..., empty_cache), or
that began in one (a free synchronizes the device), is ``allocator``; gpu-idle-host-bound then
gives the caching allocator's fix. Small hand-built traces, the figures worked out by hand."""

from __future__ import annotations

import pytest

from analyzer.api import diagnose
from analyzer.rank.attribution import LAUNCH_LATENCY_NS
from builders import TraceBuilder

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"
LATENCY_US = LAUNCH_LATENCY_NS / 1000


def _runtime(b, name, ts, dur, corr=None):
    args = {"correlation": corr} if corr is not None else {}
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 100, "ts": ts, "dur": dur,
                     "args": args})


def _trace(tmp_path, calls, length=2000.0):
    """Kernel A [100, 190) launched at 50; kernel B [1000, 1100) launched at 900; ``calls``:
    (name, start, duration) host calls in between."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    b.cpu("ProfilerStep#1", 0.0, length, cat="user_annotation")
    _runtime(b, "cudaEventRecord", 1.0, 1.0)  # a runtime call without GPU work: not a filtered trace
    b.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 100, "ts": 1.0})
    b.kernel(GEMM, 100.0, 90.0, launch_ts=50.0)
    for name, start, dur in calls:
        _runtime(b, name, start, dur)
    b.kernel(GEMM, 1000.0, 100.0, launch_ts=900.0)
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    return result.ranks[0].steps[0]["time_breakdown"], result


@pytest.mark.parametrize("free", ["cudaFree", "hipFree", "cudaFreeHost"])
def test_a_free_drains_the_gpu_and_the_gap_is_the_allocators(tmp_path, free):
    """The host enters the free at 150, the GPU drains at 190 while it waits, the free returns
    at 400, Python runs until B's launch at 900: the host part of the gap, [190, 950), began in
    the free and is all the allocator's."""
    tb, _ = _trace(tmp_path, [(free, 150.0, 250.0)])
    host = 900.0 + LATENCY_US - 190.0
    assert tb["idle_host_us"] == pytest.approx(host)
    assert tb["idle_by_host"]["allocator"] == pytest.approx(host)
    assert tb["idle_by_host"]["unknown"] == pytest.approx(0.0)


def test_an_allocation_inside_a_gap_counts_its_own_time_only(tmp_path):
    """The gap [190, 950) began in Python; the host then sits in cudaMalloc [300, 500): 200 µs
    are the allocator's, the other 560 µs the host's own work."""
    tb, _ = _trace(tmp_path, [("cudaMalloc", 300.0, 200.0)])
    assert tb["idle_by_host"]["allocator"] == pytest.approx(200.0)
    assert tb["idle_by_host"]["unknown"] == pytest.approx(900.0 + LATENCY_US - 190.0 - 200.0)


def test_a_blocking_sync_comes_first(tmp_path):
    """The gap began in cudaStreamSynchronize [150, 250); a hipMalloc [600, 700) later in the same
    stretch: the sync drained the queue, so the stretch is the sync's, none of it the allocator's."""
    tb, _ = _trace(tmp_path, [("cudaStreamSynchronize", 150.0, 100.0), ("hipMalloc", 600.0, 100.0)])
    assert tb["idle_by_host"]["device_sync"] == pytest.approx(900.0 + LATENCY_US - 190.0)
    assert tb["idle_by_host"]["allocator"] == pytest.approx(0.0)


def test_stream_ordered_allocations_are_not_allocator_stalls(tmp_path):
    """cudaMallocAsync / cudaFreeAsync return without waiting for the device."""
    tb, _ = _trace(tmp_path, [("cudaFreeAsync", 150.0, 250.0)])
    assert tb["idle_by_host"]["allocator"] == pytest.approx(0.0)


def test_the_rule_names_the_allocator_and_its_fix(tmp_path):
    _, result = _trace(tmp_path, [("hipFree", 150.0, 250.0)])
    (finding,) = [f for f in result.findings if f["rule"] == "gpu-idle-host-bound"]
    assert finding["evidence"]["host_activity"] == "allocator"
    assert "the device allocator" in finding["summary"]
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in finding["fix"]["text"]
    assert "torch.compile" not in finding["fix"]["text"]
