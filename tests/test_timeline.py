"""Steps, phases, breakdown and collectives on hand-built traces with hand-worked answers."""

import pytest

from analyzer.api import diagnose
from builders import AUTOGRAD, TraceBuilder, two_step_ddp


def test_two_step_breakdown_by_hand(tmp_path):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    rank = diagnose([str(path)]).ranks[0]
    m = rank.metrics
    # whole trace: GPU work [1000, 1195): span 195; per step compute 30+40+5=75, comm 30,
    # overlap 10 (all-reduce [60,90) vs backward [30,70)), exposed 20, busy 95, idle 5
    assert m["span_us"] == 195.0
    assert m["compute_us"] == 150.0 and m["comm_us"] == 60.0 and m["overlap_us"] == 20.0
    assert m["exposed_comm_us"] == 40.0 and m["busy_us"] == 190.0 and m["idle_us"] == 5.0
    assert m["overlap_pct"] == pytest.approx(100 * 20 / 60, abs=1e-3)
    assert [s["step"] for s in rank.steps] == [1, 2]
    first = rank.steps[0]
    assert first["span_us"] == 95.0 and first["exposed_comm_us"] == 20.0 and first["idle_us"] == 0.0
    assert first["step_time_us"] == 100.0  # next step's first GPU work starts 100 µs later
    assert rank.steps[1]["step_time_us"] == 95.0  # last step: its span
    assert first["phases"] == {"forward": 0.0, "backward": 20.0, "optimizer": 0.0, "other": 0.0}
    assert rank.phases["backward"] == 40.0


def test_collective_row_from_record_param_comms(tmp_path):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    result = diagnose([str(path)])
    rows = result.collectives
    assert len(rows) == 2
    row = rows[0]
    assert row["collective"] == "allreduce" and row["dtype"] == "bf16"
    assert row["bytes"] == 2000 and row["size_source"] == "record_param_comms"
    assert row["group"] == {"name": "0", "description": "default_pg", "ranks": [0, 1], "size": 2}
    assert row["phase"] == "backward" and row["step"] == 1
    assert row["dur_us"] == 30.0 and row["exposed_us"] == 20.0
    assert [b["index"] for b in result.buckets] == [0, 0]
    assert result.job["strategy"] == "ddp"


def test_kernel_args_take_precedence_and_name_fallback(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#5", 0, 100, cat="user_annotation")
    b.kernel("ncclDevKernel_AllGather_RING_LL", 10, 5, stream=20, launch_ts=1, **{
        "Collective name": "_allgather_base", "In msg nelems": 10, "Out msg nelems": 20,
        "dtype": "Float", "Group size": 2})
    b.kernel("ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclDevComm*)", 20, 5, stream=20, launch_ts=2)
    rows = diagnose([str(b.write(tmp_path / "t.json"))]).collectives
    assert rows[0]["collective"] == "allgather" and rows[0]["bytes"] == 80  # output size, f32
    assert rows[0]["size_source"] == "kernel args"
    # no metadata at all: collective and dtype from the kernel name, bytes unknown (never guessed)
    assert rows[1]["collective"] == "reduce_scatter" and rows[1]["dtype"] == "bf16"
    assert rows[1]["bytes"] is None and rows[1]["size_source"] is None


def test_unlinked_kernels_inherit_step_from_their_stream(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#3", 0, 50, cat="user_annotation")
    b.kernel("gemm", 100, 10, launch_ts=5)
    b.kernel("gemm_no_link", 110, 10)  # no launch event: same stream, queued after -> step 3
    rank = diagnose([str(b.write(tmp_path / "t.json"))]).ranks[0]
    assert [s["step"] for s in rank.steps] == [3]
    assert rank.steps[0]["compute_us"] == 20.0


def test_nanosecond_precision_is_kept(tmp_path):
    b = TraceBuilder()
    b.kernel("gemm", 4458676522690.655, 0.001)
    b.kernel("gemm", 4458676522690.657, 0.002)
    m = diagnose([str(b.write(tmp_path / "t.json"))]).ranks[0].metrics
    assert m["span_us"] == 0.004 and m["busy_us"] == 0.003


def test_memcpy_is_busy_but_neither_compute_nor_comm(tmp_path):
    b = TraceBuilder()
    b.kernel("Memcpy HtoD (Pinned -> Device)", 0, 10, cat="gpu_memcpy")
    b.kernel("gemm", 20, 10)
    b.kernel("Stream Sync", 30, 5, cat="cuda_sync")
    b.kernel("Context Sync", 40, 5, cat="cuda_sync", stream=-1)  # not on a stream: ignored (as HTA)
    m = diagnose([str(b.write(tmp_path / "t.json"))]).ranks[0].metrics
    assert m["busy_us"] == 25.0 and m["compute_us"] == 10.0 and m["comm_us"] == 0.0
    assert m["span_us"] == 35.0


def test_backward_thread_without_markers_is_backward(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 0, 100, cat="user_annotation")
    b.cpu("autograd::engine::evaluate_function: AddBackward0", 10, 2, tid=AUTOGRAD)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 10, stream=20, launch_ts=20, tid=AUTOGRAD)
    rows = diagnose([str(b.write(tmp_path / "t.json"))]).collectives
    assert rows[0]["phase"] == "backward" and rows[0]["dtype"] == "f32"
