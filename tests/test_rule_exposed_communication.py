"""exposed-communication and the synchronous per-parameter all-reduce pattern, on hand-built
traces whose numbers can be worked out by hand."""

import pytest

from analyzer.api import diagnose
from builders import AUTOGRAD, TraceBuilder

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def sync_allreduce_job(tmp_path, count=20):
    """2 ranks, 3 steps of 600 µs: forward [0,100), backward [100,300), then ``count``
    all-reduces of 10 µs one after the other (each launched 1 µs after the previous ended, from
    the autograd thread: a synchronous all-reduce per parameter, no sizes recorded), then idle.
    Exposed communication: 10·count µs of each 600 µs step."""
    paths = []
    for rank in (0, 1):
        b = TraceBuilder(rank=rank)
        for step in range(3):
            base = 1000.0 + 600 * step
            b.cpu(f"ProfilerStep#{step}", base - 10, 600, cat="user_annotation")
            b.cpu("DistributedDataParallel.forward", base - 9, 5)
            b.kernel("sm80_xmma_gemm_f32", base, 100, launch_ts=base - 8)
            b.cpu("autograd::engine::evaluate_function: MmBackward0", base - 5, 300, tid=AUTOGRAD)
            b.kernel("sm80_xmma_gemm_f32_bwd", base + 100, 200, launch_ts=base - 4, tid=AUTOGRAD)
            t = base + 300
            for _ in range(count):
                b.kernel(AR, t, 10, stream=20, launch_ts=t - 1, tid=AUTOGRAD)
                t += 11
        paths.append(str(b.write(tmp_path / f"rank-{rank}.json")))
    return paths


def test_synchronous_per_parameter_allreduces_without_sizes(tmp_path):
    result = diagnose(sync_allreduce_job(tmp_path), report=False)
    assert all(c["bytes"] is None for c in result.collectives)
    job = result.attribution
    assert job["exposed_transfer_us"] == pytest.approx(200.0) and job["exposed_wait_us"] == 0.0
    status = {s["rule"]: s for s in result.rules}
    for rule in ("ddp-bucket-oversized", "ddp-bucket-undersized"):
        assert status[rule]["status"] == "not_evaluated"
        assert "sizes are unknown" in status[rule]["reason"]
    finding = next(f for f in result.findings if f["rule"] == "exposed-communication")
    sync = finding["evidence"]["synchronous_allreduces"]
    assert sync == {"per_step": 20, "serialized_share": 1.0, "exposed_share": 1.0}
    assert "synchronous" in finding["summary"] and "DistributedDataParallel" in finding["fix"]["text"]
    assert finding["estimated_gain_us"] == pytest.approx(200.0)
    assert "could not check" in result.verdict and not result.verdict.startswith("No scaling problem")


def test_few_allreduces_are_not_called_synchronous(tmp_path):
    result = diagnose(sync_allreduce_job(tmp_path, count=8), report=False)
    finding = next(f for f in result.findings if f["rule"] == "exposed-communication")  # 80 of 600 µs
    assert finding["evidence"]["synchronous_allreduces"] is None


def test_alltoall_heavy_job_against_the_generator():
    """Sharded embeddings + DDP: the all-to-all is the exposed time, and its α-β estimate on the
    fitted link is within 5% of the generator's transfer time for the same bytes."""
    import json

    from conftest import SAMPLES
    from rule_cases_lib import diagnosed
    truth = json.loads((SAMPLES / "synthetic" / "ddp_alltoall_embeddings" / "truth.json").read_text())
    result = diagnosed("synthetic/ddp_alltoall_embeddings")
    f = next(f for f in result.findings if f["rule"] == "exposed-communication")
    kinds = f["evidence"]["by_kind"]
    alltoall = kinds["alltoall"]["wait_us"] + kinds["alltoall"]["transfer_us"]
    assert alltoall > 0.8 * sum(c["wait_us"] + c["transfer_us"] for c in kinds.values())
    model = next(m for m in f["evidence"]["alpha_beta"] if m["collective"] == "alltoall")
    want = truth["comm_per_step"]["alltoall"]
    assert model["bytes"] == want["bytes"]
    assert model["model_us"] == pytest.approx(want["transfer_us"], rel=0.05)
    assert f["fix"]["text"].startswith("Overlap the embedding all-to-all")


def test_forward_allreduce_gets_the_tensor_parallel_fix():
    from rule_cases_lib import diagnosed
    result = diagnosed("synthetic/ddp_forward_allreduce")
    f = next(f for f in result.findings if f["rule"] == "exposed-communication")
    phases = f["evidence"]["by_phase"]
    assert phases["forward"]["transfer_us"] > 5 * phases["backward"]["transfer_us"]
    assert "tensor-parallel" in f["fix"]["text"] and "gradient buckets" not in f["fix"]["text"]


def test_generated_sync_per_param_job():
    """The generator's hand-rolled data parallel (one synchronous all-reduce per gradient, no
    sizes recorded): the pattern is named from the timings alone, its count is the number of
    gradients, and the bucket rules say they could not check."""
    import json

    from conftest import SAMPLES
    from rule_cases_lib import diagnosed
    truth = json.loads((SAMPLES / "synthetic" / "ddp_sync_per_param" / "truth.json").read_text())
    result = diagnosed("synthetic/ddp_sync_per_param")
    f = next(f for f in result.findings if f["rule"] == "exposed-communication")
    assert f["evidence"]["synchronous_allreduces"]["per_step"] == truth["comm_per_step"]["allreduce"]["count"]
    assert "DistributedDataParallel" in f["fix"]["text"]
    status = {s["rule"]: s["status"] for s in result.rules}
    assert status["ddp-bucket-oversized"] == status["ddp-bucket-undersized"] == "not_evaluated"
