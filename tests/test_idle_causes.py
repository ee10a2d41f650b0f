"""GPU idle by cause (issue 26): host-caused (nothing launched) vs queued (launched work waiting
behind a dependency), from each op's launch; the host part by what the host did, the queued part
by what the work waited on; the fixes follow (analyzer.rank.attribution, gpu-idle-host-bound,
gpu-idle-queued)."""

from __future__ import annotations

import pytest

from analyzer.api import diagnose
from analyzer.rank.attribution import LAUNCH_LATENCY_NS
from builders import TraceBuilder
from rule_cases_lib import diagnosed

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"
LATENCY_US = LAUNCH_LATENCY_NS / 1000


def _runtime(b, name, ts, dur, corr=None, tid=100):
    args = {"correlation": corr} if corr is not None else {}
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                     "args": args})


def _one_step(b, length=2000.0):
    b.cpu("ProfilerStep#1", 0.0, length, cat="user_annotation")
    _runtime(b, "cudaEventRecord", 1.0, 1.0)  # a runtime call without GPU work: not a filtered trace
    b.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 100, "ts": 1.0})


def _step(tmp_path, b):
    path = b.write(tmp_path / "rank-0.json")
    result = diagnose([str(path)], report=False)
    return result.ranks[0].steps[0]["time_breakdown"], result


def test_gap_split_at_the_launch_of_the_work_that_ends_it(tmp_path):
    """Kernel A [100, 200); kernel B launched at 400, runs [1000, 1100): the gap [200, 1000) is
    the host's until B's launch + the latency (450), queued after (550 µs); kernel C [1100, 1200)
    launched at 300, before the gap [1200, 1500) ended by D (launched at 350): all queued."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b)
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.kernel(GEMM, 1000.0, 100.0, launch_ts=400.0)
    b.kernel(GEMM, 1100.0, 100.0, launch_ts=300.0)
    b.kernel(GEMM, 1500.0, 100.0, launch_ts=350.0)
    tb, result = _step(tmp_path, b)
    assert tb["idle_us"] == pytest.approx(1100.0)
    assert tb["idle_host_us"] == pytest.approx(400.0 + LATENCY_US - 200.0)
    assert tb["idle_queued_us"] == pytest.approx(1000.0 - (400.0 + LATENCY_US) + 300.0)
    assert tb["idle_queued_by"]["event"] == pytest.approx(tb["idle_queued_us"])
    assert GEMM in tb["idle_queued_ops"]["event"]
    assert "idle_split_note" not in tb


def test_queued_idle_by_what_it_waited_on(tmp_path):
    """A gap ended by a copy launched before it is queued behind a copy; by an NCCL kernel,
    behind a collective; by two kernels of one launch (a CUDA graph), behind the graph."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b, 4000.0)
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.kernel("Memcpy HtoD (Pageable -> Device)", 700.0, 100.0, cat="gpu_memcpy", launch_ts=60.0)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1300.0, 100.0,
             stream=20, launch_ts=70.0)
    corr = b.kernel(GEMM, 2000.0, 100.0, launch_ts=80.0)
    b.events.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 2100.0, "dur": 100.0,
                     "args": {"device": 0, "stream": 7, "correlation": corr}})  # same launch: a graph
    tb, _ = _step(tmp_path, b)
    assert tb["idle_host_us"] == pytest.approx(0.0)
    assert tb["idle_queued_by"]["copy"] == pytest.approx(500.0)
    assert tb["idle_queued_by"]["collective"] == pytest.approx(500.0)
    assert tb["idle_queued_by"]["graph"] == pytest.approx(600.0)
    assert tb["queued_copies_us"] == pytest.approx(100.0)  # the copy ran alone: the fix overlaps it too


def test_copy_to_pageable_memory_is_a_blocking_sync(tmp_path):
    """The host sits in cudaMemcpyAsync of a 'Memcpy DtoH (Device -> Pageable)' from 150 to
    300 while the GPU drains at 200; the next kernel is launched at 310: the gap [200, 1000)
    began while the host was blocked, so its host part is the sync's."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b)
    b.kernel(GEMM, 100.0, 90.0, launch_ts=50.0)
    b.corr += 1
    b.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
                     "ts": 190.0, "dur": 10.0, "args": {"device": 0, "stream": 7, "correlation": b.corr}})
    _runtime(b, "cudaMemcpyAsync", 150.0, 150.0, corr=b.corr)
    b.kernel(GEMM, 1000.0, 100.0, launch_ts=900.0)
    tb, _ = _step(tmp_path, b)
    assert tb["idle_host_us"] == pytest.approx(900.0 + LATENCY_US - 200.0)
    assert tb["idle_by_host"]["device_sync"] == pytest.approx(tb["idle_host_us"])


def test_fsdp_hooks_and_contention_in_the_host_part(tmp_path):
    """Idle while the host is inside an FSDP2 hook is FSDP overhead; inside a cudaLaunchKernel
    lasting 3 ms when its usual length is 5 µs, CPU contention."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b, 9000.0)
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.cpu("FSDP::pre_forward (layers.0)", 210.0, 490.0)
    b.kernel(GEMM, 800.0, 100.0, launch_ts=750.0 - LATENCY_US)
    for k in range(12):  # the usual launch: 5 µs
        _runtime(b, "cudaLaunchKernel", 950.0 + 10 * k, 5.0)
    _runtime(b, "cudaLaunchKernel", 1100.0, 3000.0)  # descheduled
    b.kernel(GEMM, 4200.0, 100.0, launch_ts=4100.0)
    tb, result = _step(tmp_path, b)
    assert tb["idle_by_host"]["fsdp"] == pytest.approx(490.0)
    assert tb["idle_by_host"]["contention"] == pytest.approx(3000.0)
    assert tb["inflated_ops"]["cudaLaunchKernel"] == {"longest_us": 3000.0, "usual_us": 5.0}
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-host-bound")
    assert finding["evidence"]["host_activity"] == "contention"
    assert "numactl" in finding["fix"]["text"] and "OMP_NUM_THREADS" in finding["fix"]["text"]
    assert finding["evidence"]["inflated_host_ops"]["cudaLaunchKernel"]["usual_us"] == 5.0


def test_filtered_trace_says_the_split_is_unreliable(tmp_path):
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    b.cpu("ProfilerStep#1", 0.0, 2000.0, cat="user_annotation")  # no flows, only the launches
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.kernel(GEMM, 1000.0, 100.0, launch_ts=60.0)
    tb, result = _step(tmp_path, b)
    assert "filtered or sampled" in tb["idle_split_note"]
    assert "filtered or sampled" in result.attribution["idle_split_note"]
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-queued")
    assert "Caveat" in finding["summary"] and finding["evidence"]["idle_split"]


def test_pageable_input_scenario_is_queued_not_host():
    """The generator stages each next batch from pageable memory while the launched step waits:
    queued idle behind the copy, the host sitting in loss.cpu() meanwhile."""
    result = diagnosed("synthetic/ddp_pageable_input")
    rules = {f["rule"] for f in result.findings}
    assert "gpu-idle-queued" in rules and "gpu-idle-host-bound" not in rules
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-queued")
    assert finding["evidence"]["waited_on"] == "copy"
    assert "Memcpy HtoD (Pageable -> Device)" in finding["summary"]
    assert "pin_memory=True" in finding["fix"]["text"] and "non_blocking=True" in finding["fix"]["text"]
    assert finding["recovers"]["idle_us"] > 0 and finding["recovers"]["other_gpu_us"] > 0
    assert finding["evidence"]["host_in_blocking_call_us_median"] > 0.5 * finding["evidence"]["queued_idle_us_median"]


def test_real_sampled_trace_reports_both_causes(real_traces):
    result = diagnose([str(real_traces / "hta_ddp_sampled_128rank")], report=False)
    rules = {f["rule"] for f in result.findings}
    assert {"gpu-idle-host-bound", "gpu-idle-queued"} <= rules
    details = result.attribution["details"]
    assert 0.3 < details["idle_host_us"] / result.attribution["idle_us"] < 0.6
    assert "filtered or sampled" in result.attribution["idle_split_note"]


def test_dlrm_is_launch_bound_not_queued(real_traces):
    result = diagnose([str(real_traces / "param_dlrm_ddp_8rank")], report=False)
    details = result.attribution["details"]
    assert details["idle_queued_us"] < 0.02 * result.attribution["idle_us"]
    assert "gpu-idle-queued" not in {f["rule"] for f in result.findings}


def test_fsdp2_recording_names_fsdp_overhead():
    """The H200 FSDP2 recording: about half of the host-caused idle lies inside FSDP2's hooks."""
    result = diagnosed("gpu_h200/fsdp2")
    details = result.attribution["details"]
    assert 0.4 < details["idle_by_host"]["fsdp"] / details["idle_host_us"] < 0.6
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-host-bound")
    assert finding["evidence"]["host_activity"] == "fsdp" and "reshard_after_forward" in finding["fix"]["text"]


def test_the_hosts_own_work_is_placed_by_the_phase_it_launches_next(tmp_path):
    """Host-caused idle that no host activity explains (Python, operator dispatch) goes to the
    phase of the work whose launch ends its gap: a 600 µs gap before a forward kernel, 900 µs
    before an optimizer kernel (gaps over LAUNCH_GAP_NS: not launch overhead); the leading phase
    chooses the fix (here the optimizer's: a fused optimizer)."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b, 4000.0)
    b.cpu("DistributedDataParallel.forward", 20.0, 1000.0)
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.kernel(GEMM, 800.0, 100.0, launch_ts=800.0 - LATENCY_US)  # gap [200, 800): host, before forward work
    b.cpu("Optimizer.step#AdamW.step", 1500.0, 900.0)
    b.kernel("void at::native::multi_tensor_apply_kernel<>", 1800.0, 100.0, launch_ts=1800.0 - LATENCY_US)
    tb, result = _step(tmp_path, b)
    own = tb["idle_unknown_by_phase"]
    assert own["forward"] == pytest.approx(600.0) and own["optimizer"] == pytest.approx(900.0)
    assert own["backward"] == 0.0 and own["other"] == 0.0
    assert sum(own.values()) == pytest.approx(tb["idle_by_host"]["unknown"])
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-host-bound")
    assert finding["evidence"]["own_work_phase"] == "optimizer"
    assert "(in optimizer 900.0 µs, forward 600.0 µs)" in finding["summary"]
    assert "fused=True" in finding["fix"]["text"] and "logging" not in finding["fix"]["text"]
    details = result.model.typical.details
    assert details.idle_unknown_by_phase["optimizer"] == pytest.approx(900.0)


def test_own_work_outside_the_phases_points_at_the_hosts_other_work(tmp_path):
    """The same gap ended by work launched outside forward, backward and the optimizer step."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    _one_step(b, 2000.0)
    b.kernel(GEMM, 100.0, 100.0, launch_ts=50.0)
    b.kernel(GEMM, 1200.0, 100.0, launch_ts=1200.0 - LATENCY_US)
    tb, result = _step(tmp_path, b)
    assert tb["idle_unknown_by_phase"]["other"] == pytest.approx(tb["idle_by_host"]["unknown"])
    finding = next(f for f in result.findings if f["rule"] == "gpu-idle-host-bound")
    assert finding["evidence"]["own_work_phase"] == "other" and "py-spy" in finding["fix"]["text"]
