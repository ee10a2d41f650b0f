"""Phases from the job's own annotations (issue 26): a schedule's forward / backward step ranges
(Megatron-style) and ranges suffixed with their pass (DeepEP-style "dispatch(F)", "combine(B)")
give the phase of the work launched inside them, on the main thread as on any other."""

from __future__ import annotations

from analyzer.api import diagnose
from analyzer.ingest.classify import framework_marker
from builders import TraceBuilder

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
DISPATCH = "deep_ep::intranode::dispatch<__nv_bfloat16, 8, 768>(int4*, float*, int*, int64_t*)"
COMBINE = "deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*, int const*)"


def _trace(tmp_path, forward: str, backward: str, comm: str, comm_b: str):
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    for step, base in ((1, 0.0), (2, 1000.0)):
        b.cpu(f"ProfilerStep#{step}", base, 1000.0, cat="user_annotation")
        b.cpu(forward, base + 10, 300.0, cat="user_annotation")
        b.kernel("sm90_xmma_gemm_bf16bf16", base + 50, 100.0, launch_ts=base + 20)
        b.kernel(comm, base + 150, 100.0, stream=20, launch_ts=base + 30)
        b.cpu(backward, base + 400, 300.0, cat="user_annotation")  # the main thread: no autograd marker
        b.kernel("sm90_xmma_gemm_bf16bf16", base + 450, 100.0, launch_ts=base + 410)
        b.kernel(comm_b, base + 550, 100.0, stream=20, launch_ts=base + 420)
    path = b.write(tmp_path / "rank-0.json")
    return diagnose([str(path)], report=False)


def test_schedule_step_ranges_give_the_phases(tmp_path):
    result = _trace(tmp_path, "forward_step", "backward_step", AR, AR)
    phases = result.ranks[0].steps[0]["phases"]  # exposed communication by phase
    assert phases["forward"] == 100.0 and phases["backward"] == 100.0 and phases["other"] == 0.0


def test_dispatch_combine_suffixes_give_the_phases(tmp_path):
    result = _trace(tmp_path, "dispatch(F)", "combine(B)", DISPATCH, COMBINE)
    phases = result.ranks[0].steps[0]["phases"]
    assert phases["forward"] == 100.0 and phases["backward"] == 100.0
    assert framework_marker("dispatch(F)") == framework_marker("combine(B)") == "expert"
