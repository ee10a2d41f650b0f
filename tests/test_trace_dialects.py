"""Traces written other ways than today's PyTorch + NCCL (issue 37 items 1, 2, 6, 9), from the
generator with its truth: PyTorch <= 1.9's category names, iterations marked only by the
optimizer, all-reduces by symmetric memory or a custom all-reduce, impossible identities."""

from __future__ import annotations

import json

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.synth import JobSpec, write_job
from analyzer.synth.truth import collective_rows
from builders import TraceBuilder

SPEC = dict(n_layers=2, hidden=1024, vocab_size=8192, seq_len=512, micro_batch=2, world_size=2, gpus_per_node=2,
            steps=5, seed=37)


def _job(tmp_path, name, **knobs):
    out = write_job(JobSpec(name=name, **{**SPEC, **knobs}), tmp_path / name)
    paths = sorted(str(p) for p in out.glob("rank-*.json.gz"))
    return paths, diagnose(paths, DiagnoseOptions(workers=1), report=False), json.loads((out / "truth.json").read_text())


def test_legacy_category_names_give_todays_result_and_the_truth(tmp_path):
    """The same job written with PyTorch 1.9's categories (Kernel, Runtime, Operator, async)
    and with today's: the same result figure for figure, the data-loader stall the truth holds
    found as such."""
    knobs = dict(host_stall_ranks=(0, 1), host_stall_us=3000.0)
    old_paths, old, truth = _job(tmp_path, "legacy", category_names="legacy", **knobs)
    new_paths, new, _ = _job(tmp_path, "today", **knobs)
    text = old.to_json()
    for old_path, new_path in zip(old_paths, new_paths):
        text = text.replace(old_path, new_path)
    old_doc, new_doc = json.loads(text), json.loads(new.to_json())
    for doc in (old_doc, new_doc):
        doc.pop("inputs", None)
    assert old_doc == new_doc
    want = [s["time_breakdown"]["step_time_us"] for s in truth["ranks"][0]["steps"]]
    got = [s["step_time_us"] for s in old.ranks[0].steps]
    assert got[:-1] == pytest.approx(want[:-1], rel=0.01)
    fired = {f["rule"]: f for f in old.findings}
    assert fired["gpu-idle-host-bound"]["evidence"]["host_activity"] == "input"


def test_the_legacy_writer_uses_the_old_names(tmp_path):
    import gzip

    paths, result, _ = _job(tmp_path, "legacy_names", category_names="legacy", steps=2)
    with gzip.open(paths[0], "rt") as f:
        cats = {e.get("cat") for e in json.load(f)["traceEvents"]}
    assert {"Kernel", "Runtime", "Operator", "async"} <= cats
    assert not cats & {"kernel", "cuda_runtime", "cpu_op", "user_annotation", "ac2g"}
    assert result.ranks[0].gpu_event_count > 0 and "CPU-only" not in result.verdict


def test_optimizer_marks_the_iterations(tmp_path):
    """Neither ProfilerStep nor a forward range: the optimizer's 5 repeats give 4 iterations,
    each as long as the generator's step (a window from one optimizer step to the next holds one
    step's work: the rest of step k and the start of k+1, the same in steady state)."""
    _, result, truth = _job(tmp_path, "optimizer_only", step_marker="optimizer")
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    source = result.attribution["step_source"]
    assert "the 4 iterations between the 5 repeats of the optimizer's 'Optimizer.step#AdamW.step'" in source
    full = truth["ranks"][0]["steps"][:-1]  # the last step drains: shorter
    mean_step = sum(s["time_breakdown"]["step_time_us"] for s in full) / len(full)
    for step, later in zip(steps, truth["ranks"][0]["steps"][1:]):
        assert step["cpu_step_us"] == pytest.approx(mean_step, rel=0.02)
        # iteration k: step k's optimizer kernels, then step k + 1's forward and backward
        assert step["busy_us"] == pytest.approx(later["busy_us"], rel=0.01)
    assert not any("nor a repeating annotation" in w for w in result.warnings)


def test_an_annotation_repeating_once_an_iteration_is_still_preferred(tmp_path):
    """DDP's forward range repeats once a step: it, not the optimizer, gives the steps."""
    _, result, _ = _job(tmp_path, "forward_range", step_marker="none")
    assert "'DistributedDataParallel.forward'" in result.attribution["step_source"]
    assert [s["step"] for s in result.ranks[0].steps] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("impl, library", [("symm_mem", "symm_mem"), ("custom_ar", "custom_allreduce")])
def test_allreduces_beyond_nccl_take_kind_from_the_launching_op(tmp_path, impl, library):
    """Forward all-reduces by symmetric memory (symm_mem::multimem_all_reduce_ launching
    multimem_all_reduce_kernel) or vLLM's custom all-reduce (vllm::all_reduce launching
    cross_device_reduce_1stage), no record_param_comms: each is an all-reduce of the truth's
    size and dtype, in a group of the truth's size, never "unknown"."""
    _, result, truth = _job(tmp_path, impl, tp_allreduce_impl=impl, tp_allreduce_mb=4.0)
    rows = [c for c in result.collectives if c["library"] == library]
    want = [r for r in collective_rows(truth) if r.get("library") == library]
    assert rows and len(rows) == len(want)
    assert {(r["collective"], r["dtype"], r["bytes"], r["group"]["size"]) for r in rows} == \
        {("allreduce", "bf16", w["bytes"], 2) for w in want}
    assert sorted(r["dur_us"] for r in rows) == pytest.approx(sorted(w["dur_us"] for w in want), abs=0.002)
    if impl == "symm_mem":  # it names a c10d group: the trace's only one
        assert {r["group"]["name"] for r in rows} == {"0"}


@pytest.mark.parametrize("rank, world", [(-1, 4), (4, 4), (9, 2)])
def test_an_impossible_rank_in_one_file_is_said_once(tmp_path, rank, world):
    """distributedInfo.rank negative or not below world_size: one warning naming the field."""
    b = TraceBuilder(rank=rank, world_size=world, pg_ranks=range(world))
    for k in range(3):
        b.kernel("sm90_xmma_gemm_bf16bf16", 100.0 * k, 60.0, launch_ts=100.0 * k - 5)
    result = diagnose([str(b.write(tmp_path / "trace.json"))], report=False)
    named = [w for w in result.warnings if "distributedInfo.rank" in w]
    assert len(named) == 1 and f"distributedInfo.rank {rank} " in named[0]


def test_a_rank_beyond_the_declared_groups_is_said(tmp_path):
    """No world_size, but the only declared group holds ranks 0-3: rank 6 is in no group."""
    b = TraceBuilder(rank=6, world_size=4, pg_ranks=range(4))
    del b.doc["distributedInfo"]["world_size"]
    for k in range(3):
        b.kernel("sm90_xmma_gemm_bf16bf16", 100.0 * k, 60.0, launch_ts=100.0 * k - 5)
    result = diagnose([str(b.write(tmp_path / "trace.json"))], report=False)
    named = [w for w in result.warnings if "distributedInfo.rank" in w]
    assert len(named) == 1 and "distributedInfo.rank 6 " in named[0]


def test_an_annotation_repeating_within_the_iteration_gives_way_to_the_optimizer(tmp_path):
    """A range around each of 4 layers repeats 4 times an iteration: it marks layers, not
    iterations; the optimizer's 3 repeats, 1,000 µs apart, give the 2 iterations."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    for it in range(3):
        base = 1000.0 * it
        for layer in range(4):
            b.cpu("my_layer", base + 100.0 * layer, 80.0, cat="user_annotation")
            b.kernel("sm90_xmma_gemm_bf16bf16", base + 100.0 * layer + 10, 60.0, launch_ts=base + 100.0 * layer + 5)
        b.cpu("Optimizer.step#SGD.step", base + 500.0, 50.0, cat="user_annotation")
        b.kernel("multi_tensor_apply_kernel", base + 520.0, 20.0, launch_ts=base + 510.0)
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [0, 1]
    assert [s["cpu_step_us"] for s in steps] == [1000.0, 1000.0]
    # iteration 0: the optimizer kernel at 1,520 aside, from 500 to 1,500: the optimizer's 20 µs
    # and the next iteration's 4 layers, 60 µs each
    assert [s["busy_us"] for s in steps] == [260.0, 260.0]
    assert "'Optimizer.step#SGD.step'" in result.attribution["step_source"]


def test_a_kernel_the_catalog_does_not_know_is_communication_when_a_launching_op_names_it(tmp_path):
    """vllm::all_reduce launching a kernel no catalog entry names: the op says it is an
    all-reduce of 4,096 bf16 elements (its recorded shapes), so the kernel is communication;
    the GEMM launched after the op stays compute."""
    b = TraceBuilder(world_size=8, pg_ranks=range(8))
    for k in range(3):
        base = 1000.0 + 100.0 * k
        b.cpu(f"ProfilerStep#{k}", base - 10, 100, cat="user_annotation")
        b.cpu("vllm::all_reduce", base - 5, 4, **{"Input Dims": [[4096]], "Input type": ["c10::BFloat16"]})
        b.kernel("void vllm::my_new_allreduce_kernel<__nv_bfloat16, 8>(float*)", base, 30, launch_ts=base - 4)
        b.kernel("sm90_xmma_gemm_bf16bf16", base + 40, 30, launch_ts=base + 1)
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    rows = list(result.collectives)
    assert len(rows) == 3
    assert {(r["collective"], r["library"], r["dtype"], r["bytes"]) for r in rows} == \
        {("allreduce", "custom_allreduce", "bf16", 4096 * 2)}
    step = result.ranks[0].steps[0]
    assert (step["comm_us"], step["compute_us"]) == (30.0, 30.0)


@pytest.mark.parametrize("runtime", ["xpu_runtime", "privateuse1_runtime", "mtia_runtime"])
def test_other_backends_launches_link_their_kernels(tmp_path, runtime):
    """Intel XPU, PrivateUse1 and MTIA launches (Kineto's categories for them) link their
    kernels to the CPU as CUDA's do: each kernel in the ProfilerStep that launched it."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    for k in range(2):
        b.cpu(f"ProfilerStep#{k}", 1000.0 * k, 900.0, cat="user_annotation")
        b.kernel("gemm_kernel", 1000.0 * k + 20, 300.0, launch_ts=1000.0 * k + 10)
    for event in b.events:
        if event["cat"] == "cuda_runtime":
            event["cat"], event["name"] = runtime, "launch"
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    assert [(s["step"], s["busy_us"]) for s in result.ranks[0].steps] == [(0, 300.0), (1, 300.0)]
    assert not any("categories tracecliff does not know" in w or "no CPU-side link" in w for w in result.warnings)


def test_a_trace_inventing_categories_costs_its_size_and_one_short_warning(tmp_path):
    """20,000 device-looking events under 20,000 invented categories (hostile input): a bounded
    number of categories examined, one warning that names a few and counts the rest."""
    events = [{"ph": "X", "cat": f"c{i}", "name": "void k", "pid": 0, "tid": "stream 7", "ts": float(i), "dur": 1.0,
               "args": {"stream": 7}} for i in range(20000)]
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 5.0, "dur": 1.0,
                   "args": {"stream": 7}})
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    result = diagnose([str(path)], report=False)
    named = [w for w in result.warnings if "categories tracecliff does not know" in w]
    assert len(named) == 1 and " more; not read" in named[0] and len(named[0]) < 500
