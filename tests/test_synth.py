"""The synthetic trace generator: physics (models.md numbers worked by hand), truth consistency
(independent recomputation from the written JSON, and HTA as an oracle), schema, determinism."""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.synth import SCENARIOS, JobSpec, simulate, write_job
from analyzer.synth.layout import ddp_buckets, fsdp_units, model_params, process_groups
from analyzer.synth.physics import ALLGATHER, ALLREDUCE, group_link, ring_time_us
from analyzer.synth.truth import collective_rows

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic"
# d=1024, 2 blocks, vocab 8192: tensor sizes small enough to work buckets out by hand
TINY = JobSpec(n_layers=2, hidden=1024, vocab_size=8192, seq_len=1024, micro_batch=2, steps=2)
METRICS = ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us")


@pytest.fixture(scope="module")
def ddp_sim():
    return simulate(replace(TINY, straggler_rank=5, straggler_slowdown=1.3))


@pytest.fixture(scope="module")
def hsdp_sim():
    return simulate(replace(TINY, strategy="fsdp2", sharding="hybrid_shard", world_size=16, nics_per_node=4))


# ---- physics: models.md worked examples ---------------------------------------------------
def test_allreduce_25mb_on_8_gpus_over_nvlink_takes_108us():
    link = group_link(JobSpec(), list(range(8)))
    assert (link.alpha_us, link.beta_gbps, link.nodes) == (0.8, 450.0, 1)
    # 14 x 0.8 + 1.75 x 25e6 / 450e9 = 11.2 + 97.22 µs
    assert ring_time_us(ALLREDUCE, 25e6, 8, link) == pytest.approx(108.422, abs=1e-3)


def test_cross_node_groups_use_the_nodes_aggregate_nic_bandwidth():
    two_nodes = JobSpec(world_size=16)
    link = group_link(two_nodes, list(range(16)))
    assert (link.alpha_us, link.beta_gbps, link.nodes) == (12.0, 360.0, 2)  # 8 NICs x 45 GB/s
    assert group_link(replace(two_nodes, nics_per_node=1), list(range(16))).beta_gbps == 45.0
    assert group_link(replace(two_nodes, nics_per_node=16), list(range(16))).beta_gbps == 450.0  # NVLink caps
    # an HSDP replicate group (one GPU per node) gets one NIC's worth when each GPU has its own NIC
    assert group_link(two_nodes, [3, 11]).beta_gbps == 45.0
    assert group_link(replace(two_nodes, nics_per_node=4), [3, 11]).beta_gbps == 22.5
    # all-gather of 1 GB across 16 ranks: 15 x 12 µs + 15/16 x 1e9 / 360e9 s
    assert ring_time_us(ALLGATHER, 1e9, 16, link) == pytest.approx(180 + 2604.1667, abs=1e-3)


def test_every_simulated_transfer_time_is_the_ring_model_of_its_group():
    sim = simulate(replace(TINY, world_size=16, noise=0.0))
    groups = {g["name"]: g for g in sim.truth["groups"]}
    rows = collective_rows(sim.truth)
    assert rows
    for row in rows:
        g = groups[row["group"]]
        hops = 2 * (g["size"] - 1) if row["name"] == "allreduce" else g["size"] - 1
        model = hops * g["alpha_us"] + hops / g["size"] * row["bytes"] / (g["beta_gbps"] * 1e3)
        assert row["transfer_us"] == pytest.approx(model, abs=1e-3)


# ---- layout ---------------------------------------------------------------------------------
def test_ddp_buckets_follow_torch_assignment_worked_by_hand():
    d, fc, qkv = 1024, 4 * 1024 * 1024, 3 * 1024 * 1024
    buckets = ddp_buckets(TINY)
    # reversed registration order; the first bucket closes at 1 MiB: output.weight alone
    assert buckets[0].params == ("output.weight",) and buckets[0].numel == 8192 * d
    # then 25 MiB (26,214,400 B): norm + all of block 1 is 25,171,968 B, block 0's fc2 tips it over
    assert buckets[1].params[0] == "norm.weight" and buckets[1].params[-1] == "layers.0.mlp.fc2.weight"
    assert buckets[1].numel == d + (2 * fc + d + d * d + qkv + d) + fc
    assert buckets[2].params[-1] == "tok_embeddings.weight"
    assert buckets[2].nbytes == 2 * (fc + d + d * d + qkv + d + 8192 * d)
    assert sum(b.numel for b in buckets) == sum(p.numel for p in model_params(TINY))
    fp32 = ddp_buckets(replace(TINY, grad_dtype="fp32"))
    assert [b.nbytes for b in fp32[:1]] == [4 * 8192 * d]


def test_fsdp_units_pad_to_the_shard_group():
    spec1 = replace(TINY, strategy="fsdp1")
    units = fsdp_units(spec1, 8)
    assert [u.fqn for u in units] == ["", "layers.0", "layers.1"]
    assert all(u.padded_numel % 8 == 0 and 0 <= u.padded_numel - u.numel < 8 for u in units)
    # FSDP2 pads each parameter's dim 0: norm.weight (1024,) on 3 ranks -> 1026 elements
    spec2 = replace(TINY, strategy="fsdp2", hidden=1024)
    root = fsdp_units(spec2, 3)[0]
    expected = sum(math.ceil(p.shape[0] / 3) * 3 * math.prod(p.shape[1:]) for p in root.params)
    assert root.padded_numel == expected > root.numel
    assert len(fsdp_units(replace(spec2, fsdp_wrap="none"), 8)) == 1


def test_hybrid_shard_groups_are_named_as_torch_names_them():
    groups = process_groups(replace(TINY, strategy="fsdp2", sharding="hybrid_shard", world_size=16))
    assert groups.pg_count == 11
    assert [(g.name, g.desc, g.ranks) for g in groups.member_groups(9)] == [
        ("0", "default_pg", tuple(range(16))), ("2", "mesh_replicate", (1, 9)),
        ("10", "mesh_shard", tuple(range(8, 16)))]
    fsdp1 = process_groups(replace(TINY, strategy="fsdp1", sharding="hybrid_shard", world_size=16))
    assert [(g.name, g.desc) for g in fsdp1.member_groups(9)] == [("0", "default_pg"), ("2", "undefined"),
                                                                   ("4", "undefined")]


# ---- truth ------------------------------------------------------------------------------------
def test_truth_is_self_consistent(ddp_sim, hsdp_sim):
    for sim in (ddp_sim, hsdp_sim):
        for rank in sim.truth["ranks"]:
            for row in [rank] + rank["steps"]:
                assert row["exposed_comm_us"] == pytest.approx(row["comm_us"] - row["overlap_us"], abs=2e-3)
                assert row["idle_us"] == pytest.approx(row["span_us"] - row["busy_us"], abs=2e-3)
                assert row["overlap_us"] <= min(row["compute_us"], row["comm_us"]) + 1e-3
                assert max(row["compute_us"], row["comm_us"]) <= row["busy_us"] <= row["span_us"] + 1e-3
            for key in ("busy_us", "compute_us", "comm_us", "exposed_comm_us"):  # steps do not overlap
                assert sum(s[key] for s in rank["steps"]) == pytest.approx(rank[key], abs=0.01)
    for rank in ddp_sim.truth["ranks"]:  # DDP comm kernels never overlap each other across phases
        assert sum(rank["phases"].values()) == pytest.approx(rank["exposed_comm_us"], abs=0.01)


def test_truth_matches_an_independent_recount_of_the_written_trace(ddp_sim):
    for r in (0, 5):
        events = [e for e in ddp_sim.rank_traces[r]["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        ivs = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), "nccl" in e["name"].lower(),
                e["cat"] == "kernel") for e in events]
        compute = _union_ns([(s, t) for s, t, comm, kernel in ivs if kernel and not comm])
        comm = _union_ns([(s, t) for s, t, comm, _ in ivs if comm])
        busy = _union_ns([(s, t) for s, t, _, _ in ivs])
        overlap = _overlap_ns(compute, comm)
        span = max(t for _, t, _, _ in ivs) - min(s for s, _, _, _ in ivs)
        truth = ddp_sim.truth["ranks"][r]
        assert truth["compute_us"] == _total(compute) / 1000 and truth["comm_us"] == _total(comm) / 1000
        assert truth["busy_us"] == _total(busy) / 1000 and truth["span_us"] == span / 1000
        assert truth["overlap_us"] == overlap / 1000
        assert truth["overlap_pct"] == pytest.approx(100 * overlap / _total(comm), abs=1e-4)


def test_hta_measures_what_the_truth_says(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    monkey_env = {"HTA_DISABLE_NS_ROUNDING": "1"}
    import os

    old = {k: os.environ.get(k) for k in monkey_env}
    os.environ.update(monkey_env)
    try:
        write_job(replace(TINY, steps=1), tmp_path)
        analysis = hta.TraceAnalysis(trace_files={2: str(tmp_path / "rank-2.json.gz")}, trace_dir="",
                                     include_last_profiler_step=True)
        overlap = float(analysis.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0])
        breakdown = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    truth = json.loads((tmp_path / "truth.json").read_text())["ranks"][2]
    assert overlap == pytest.approx(truth["overlap_pct"], abs=0.01)
    assert breakdown["compute_time(us)"] == pytest.approx(truth["compute_us"], abs=0.01)
    assert breakdown["idle_time(us)"] == pytest.approx(truth["idle_us"], abs=0.01)


def test_collectives_end_together_and_late_ranks_make_others_wait(ddp_sim):
    calls = defaultdict(list)
    for row in collective_rows(ddp_sim.truth):
        calls[(row["group"], row["seq"])].append(row)
    assert len(calls) == len(ddp_sim.truth["ddp_buckets"]) * TINY.steps
    last_arrivals = defaultdict(int)
    for rows in calls.values():
        assert len(rows) == 8
        assert len({round(r["start_us"] + r["dur_us"], 3) for r in rows}) == 1  # one end for all
        assert min(r["wait_us"] for r in rows) == 0.0
        assert all(r["dur_us"] - r["wait_us"] == pytest.approx(r["transfer_us"], abs=2e-3) for r in rows)
        last_arrivals[max(rows, key=lambda r: r["start_us"])["rank"]] += 1
    assert last_arrivals[5] == len(calls)  # the 30%-slower rank arrives last every time
    waits = defaultdict(float)
    for row in collective_rows(ddp_sim.truth):
        waits[row["rank"]] += row["wait_us"]
    compute = {rank["rank"]: rank["compute_us"] for rank in ddp_sim.truth["ranks"]}
    assert all(compute[r] < compute[5] / 1.25 for r in range(8) if r != 5)
    # the others wait, in all, about the straggler's extra compute (the optimizer's share excepted)
    assert waits[5] == 0.0
    assert all(waits[r] > 0.8 * (compute[5] - compute[r]) for r in range(8) if r != 5)


def test_ddp_buckets_launch_in_order_when_their_last_gradient_is_ready(ddp_sim):
    rows = [r for r in collective_rows(ddp_sim.truth) if r["rank"] == 0 and r["step"] == TINY.first_step]
    buckets = ddp_sim.truth["ddp_buckets"]
    assert [r["bucket"] for r in rows] == [b["index"] for b in buckets]
    assert [r["bytes"] for r in rows] == [b["bytes"] for b in buckets]
    offsets = [r["ready_offset_us"] for r in rows]
    assert offsets == sorted(offsets) and offsets[0] > 0
    assert all(r["start_us"] >= r["ready_us"] for r in rows)


def test_no_prefetch_serialises_all_gathers_and_lengthens_the_step():
    base = replace(TINY, strategy="fsdp1", hidden=4096, micro_batch=1, n_layers=3, steps=1, world_size=8)
    fast = simulate(base)
    slow = simulate(replace(base, forward_prefetch=False, backward_prefetch=False))
    assert slow.step_time_us > fast.step_time_us * 1.15
    exposed = [sum(r["exposed_comm_us"] for r in s.truth["ranks"]) for s in (fast, slow)]
    assert exposed[1] > 2 * exposed[0]
    assert all(r["overlap_pct"] < 1.0 for r in slow.truth["ranks"])  # nothing overlaps without prefetch


def test_fsdp_without_wrap_gathers_the_whole_model_once_per_step():
    sim = simulate(replace(TINY, strategy="fsdp1", fsdp_wrap="none"))
    rows = [r for r in collective_rows(sim.truth) if r["rank"] == 0]
    assert [r["name"] for r in rows if r["step"] == TINY.first_step] == ["allgather", "reduce_scatter"]
    psi = sim.truth["model"]["params"]
    unit = sim.truth["fsdp_units"][0]
    assert unit["numel"] == psi and rows[0]["bytes"] == unit["allgather_bytes"] >= 2 * psi
    assert rows[0]["phase"] == "forward" and rows[1]["phase"] == "backward"


def test_shard_grad_op_skips_the_backward_all_gathers():
    full = simulate(replace(TINY, strategy="fsdp2", steps=1))
    grad_op = simulate(replace(TINY, strategy="fsdp2", steps=1, sharding="shard_grad_op"))
    passes = [[(r["name"], r["pass"]) for r in collective_rows(sim.truth) if r["rank"] == 0] for sim in (full, grad_op)]
    n_units = len(full.truth["fsdp_units"])
    # the root stays unsharded after forward in both; FULL_SHARD gathers the blocks again for backward
    assert passes[0].count(("allgather", "backward")) == n_units - 1
    assert passes[1].count(("allgather", "backward")) == 0
    assert passes[0].count(("allgather", "forward")) == passes[1].count(("allgather", "forward")) == n_units
    assert passes[1].count(("reduce_scatter", "backward")) == n_units


def test_hybrid_shard_all_reduces_shards_across_nodes_on_a_second_stream(hsdp_sim):
    rows = collective_rows(hsdp_sim.truth)
    groups = {g["name"]: g for g in hsdp_sim.truth["groups"]}
    by_kind = defaultdict(set)
    for row in rows:
        by_kind[row["name"]].add((groups[row["group"]]["desc"], groups[row["group"]]["cross_node"], row["stream"]))
    assert by_kind["allgather"] == {("mesh_shard", False, 20)}
    assert by_kind["reduce_scatter"] == {("mesh_shard", False, 20)}
    assert by_kind["allreduce"] == {("mesh_replicate", True, 24)}
    units = hsdp_sim.truth["fsdp_units"]
    ar = [r for r in rows if r["name"] == "allreduce" and r["rank"] == 0 and r["step"] == TINY.first_step]
    assert [r["bytes"] for r in ar] == [2 * u["padded_numel"] // 8 for u in units[1:][::-1] + units[:1]]


def test_fp32_gradients_double_the_all_reduce_bytes():
    sim = simulate(replace(TINY, grad_dtype="fp32", param_dtype="fp32", steps=1))
    rows = collective_rows(sim.truth)
    assert {r["dtype"] for r in rows} == {"Float"}
    assert sum(r["bytes"] for r in rows if r["rank"] == 0) == 4 * sim.truth["model"]["params"]
    names = {e["name"] for e in sim.rank_traces[0]["traceEvents"] if e.get("cat") == "kernel"}
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)" in names


def test_tensor_parallel_all_reduces_four_per_block_each_issued_as_torch_does():
    """tp_allreduce_mb: two all-reduces per block in forward and two in backward, on top of the
    gradients' buckets, each with its c10d op, record_param_comms, launch and flow like any other."""
    plain = simulate(replace(TINY, steps=1))
    tp = simulate(replace(TINY, steps=1, tp_allreduce_mb=1.0))
    rows = [r for r in collective_rows(tp.truth) if r["rank"] == 0]
    extra = [r for r in rows if "tp" in r]
    assert len(rows) - len(extra) == len([r for r in collective_rows(plain.truth) if r["rank"] == 0])
    for phase in ("forward", "backward"):
        assert sum(r["tp"] == phase and r["phase"] == phase for r in extra) == 2 * TINY.n_layers
    events = tp.rank_traces[0]["traceEvents"]
    count = len(rows)
    for name in ("c10d::allreduce_", "record_param_comms", "cudaLaunchKernelExC"):
        assert sum(e.get("name") == name for e in events) == count
    assert sum(e.get("cat") == "ac2g" and e.get("ph") == "s" for e in events) > count


def test_step_time_is_the_slowest_ranks_profiler_step(ddp_sim):
    per_step = defaultdict(list)
    for trace in ddp_sim.rank_traces.values():
        for e in trace["traceEvents"]:
            if e.get("name", "").startswith("ProfilerStep#"):
                per_step[e["name"]].append(e["dur"])
    assert sorted(per_step) == [f"ProfilerStep#{TINY.first_step + k}" for k in range(TINY.steps)]
    expected = sum(max(v) for v in per_step.values()) / len(per_step)
    assert ddp_sim.step_time_us == pytest.approx(expected, abs=1e-3)


# ---- schema ---------------------------------------------------------------------------------
def test_trace_follows_the_kineto_schema(ddp_sim):
    trace = ddp_sim.rank_traces[3]
    assert {"schemaVersion", "deviceProperties", "distributedInfo", "traceEvents", "displayTimeUnit",
            "baseTimeNanoseconds", "traceName"} <= trace.keys()
    dist = trace["distributedInfo"]
    assert (dist["rank"], dist["world_size"], dist["backend"], dist["host_name"]) == (3, 8, "nccl", "node0")
    assert dist["pg_config"] == [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                  "pg_size": 8, "ranks": list(range(8))}]
    assert [d["name"] for d in trace["deviceProperties"]] == ["NVIDIA H100 80GB HBM3"] * 8
    events = trace["traceEvents"]
    by_corr = defaultdict(dict)
    for e in events:
        if e["ph"] == "X" and e["cat"] in ("cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"):
            by_corr[e["args"]["correlation"]][e["cat"] if e["cat"] == "cuda_runtime" else "gpu"] = e
        if e["ph"] in ("s", "f"):
            by_corr[e["id"]][e["ph"]] = e
    cpu_ext = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op"}
    gpu = [v for v in by_corr.values() if "gpu" in v]
    assert len(gpu) > 100
    for link in gpu:
        kernel, launch = link["gpu"], link["cuda_runtime"]
        assert launch["ts"] <= kernel["ts"] and link["s"]["ts"] == launch["ts"] and link["f"]["ts"] == kernel["ts"]
        assert kernel["pid"] == 3 and kernel["args"]["stream"] == kernel["tid"]
        assert kernel["args"]["External id"] == launch["args"]["External id"] in cpu_ext
        assert all(len(repr(x).split(".")[-1]) <= 3 for x in (kernel["ts"], kernel["dur"]))
    nccl = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_")]
    rpc = [e for e in events if e.get("name") == "record_param_comms"]
    assert len(nccl) == len(rpc) > 0
    assert {"Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
            "Process Group Description", "Process Group Ranks", "Rank", "Seq", "Comms Id"} <= rpc[0]["args"].keys()
    assert nccl[0]["args"]["Collective name"] == "allreduce" and nccl[0]["args"]["dtype"] == "BFloat16"
    assert nccl[0]["args"]["External id"] in {e["args"]["External id"] for e in rpc}
    names = {e["name"] for e in events}
    assert {"DistributedDataParallel.forward", "Optimizer.step#AdamW.step", "c10d::allreduce_", "nccl:all_reduce",
            "autograd::engine::evaluate_function: MmBackward0", "Memcpy HtoD (Pinned -> Device)"} <= names
    main_tid = next(e["tid"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    autograd = {e["tid"] for e in events if e.get("name", "").startswith("autograd::engine")}
    assert autograd == {e["tid"] for e in events if e.get("name") == "c10d::allreduce_"} != {main_tid}


def test_large_groups_are_truncated_in_the_collective_args_like_torch():
    sim = simulate(replace(TINY, world_size=64, n_layers=1, steps=1))
    args = next(e["args"] for e in sim.rank_traces[40]["traceEvents"] if e.get("name") == "record_param_comms")
    assert args["Process Group Ranks"] == "[" + ", ".join(map(str, range(30))) + ", ...]"
    assert args["Rank"] == 40 and args["Group size"] == 64
    assert sim.rank_traces[40]["distributedInfo"]["pg_config"][0]["ranks"] == list(range(64))


def test_fsdp2_annotations_and_optional_fields():
    sim = simulate(replace(TINY, strategy="fsdp2", kernel_comm_args=False, emit_host_name=False, steps=1))
    trace = sim.rank_traces[1]
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"FSDP::root_pre_forward", "FSDP::pre_forward", "FSDP::pre_forward (layers.1)",
            "FSDP::all_gather (layers.0)", "FSDP::forward_prefetch for layers.1", "FSDP::pre_backward (layers.0)",
            "FSDP::backward_prefetch for layers.0", "FSDP::post_backward_reduce (layers.1)",
            "FSDP::root_post_backward_callback", "c10d::_allgather_base_", "nccl:_reduce_scatter_base",
            "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"} <= names
    assert "host_name" not in trace["distributedInfo"]
    nccl = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    assert nccl and not any("Collective name" in e["args"] for e in nccl)
    rpc = [e["args"] for e in trace["traceEvents"] if e.get("name") == "record_param_comms"]
    assert rpc[0]["Collective name"] == "_allgather_base" and rpc[0]["In msg nelems"] * 8 == rpc[0]["Out msg nelems"]
    fsdp1 = simulate(replace(TINY, strategy="fsdp1", steps=1)).rank_traces[0]["traceEvents"]
    assert {"FullyShardedDataParallel.forward", "FullyShardedDataParallel._pre_forward",
            "FullyShardedDataParallel._pre_backward_prefetch", "FullyShardedDataParallel._post_backward_hook"} \
        <= {e["name"] for e in fsdp1}


def test_streams_run_in_order_and_cpu_ranges_nest(hsdp_sim):
    events = hsdp_sim.rank_traces[12]["traceEvents"]
    rows = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation"):
            rows[(e["cat"] in ("cpu_op", "user_annotation"), e["tid"])].append(
                (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for (is_cpu, _), ivs in rows.items():
        ivs.sort(key=lambda iv: (iv[0], -iv[1]))
        stack: list[int] = []
        for start, end in ivs:
            if is_cpu:  # a range either contains the next one or ends before it starts
                while stack and stack[-1] <= start:
                    stack.pop()
                assert not stack or end <= stack[-1]
                stack.append(end)
            else:  # one stream runs one thing at a time
                assert not stack or start >= stack[-1]
                stack = [end]


# ---- determinism and the committed samples --------------------------------------------------
def test_write_job_is_deterministic(tmp_path):
    spec = replace(TINY, world_size=2, n_layers=1, steps=1)
    a, b = write_job(spec, tmp_path / "a"), write_job(spec, tmp_path / "b")
    files = sorted(p.name for p in a.iterdir())
    assert files == ["rank-0.json.gz", "rank-1.json.gz", "truth.json"]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    raw = gzip.decompress((a / "rank-1.json.gz").read_bytes())
    assert re.search(rb'"rank":\s+1\b', raw)  # HTA finds the rank with this regex
    assert (a / "rank-1.json.gz").read_bytes()[4:8] == b"\0\0\0\0"  # gzip mtime 0
    plain = write_job(spec, tmp_path / "plain", gzip=False)
    assert (plain / "rank-0.json").read_bytes() == gzip.decompress((a / "rank-0.json.gz").read_bytes())


def test_spec_rejects_nonsense():
    for bad in ({"strategy": "zero3"}, {"world_size": 12}, {"straggler_rank": 8}, {"grad_dtype": "int8"}):
        with pytest.raises(ValueError, match="JobSpec"):
            JobSpec(**bad)


def test_committed_samples_are_current_and_well_formed():
    from analyzer.synth.parallel import PARALLEL_SCENARIOS  # tested in test_parallel_synthetic.py
    assert sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()) == sorted([*SCENARIOS, *PARALLEL_SCENARIOS])
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 16e6  # 31 jobs: keep the checkout small (they are regenerated by scripts/make_sample_traces.py)
    for name, spec in SCENARIOS.items():
        folder = SAMPLES / name
        assert sorted(p.name for p in folder.glob("rank-*.json.gz")) == sorted(
            f"rank-{r}.json.gz" for r in range(spec.world_size))
        truth = json.loads((folder / "truth.json").read_text())
        assert truth["spec"] == json.loads(json.dumps(spec.to_dict()))
        assert len(truth["ranks"]) == spec.world_size
    fresh = simulate(SCENARIOS["fsdp1_no_wrap"])  # regenerate one job: the files must not be stale
    folder = SAMPLES / "fsdp1_no_wrap"
    assert json.loads((folder / "truth.json").read_text()) == json.loads(json.dumps(fresh.truth))
    assert json.loads(gzip.decompress((folder / "rank-7.json.gz").read_bytes())) == fresh.rank_traces[7]


# ---- helpers: a plain sweep, independent of the generator's interval code -----------------
def _union_ns(ivs):
    out = []
    for start, end in sorted(ivs):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _total(ivs):
    return sum(end - start for start, end in ivs)


def _overlap_ns(a, b):
    i = j = total = 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def test_a_slow_link_sets_the_pace_of_every_ring_through_it():
    """slow_link_rank / slow_link_gbps: each all-reduce of the world group (the ring through that
    rank) is the ring model at the slow link's bandwidth."""
    spec = replace(TINY, world_size=8, noise=0.0, slow_link_rank=3, slow_link_gbps=20.0)
    rows = collective_rows(simulate(spec).truth)
    link, n = group_link(spec, list(range(8))), 8
    assert rows and link.beta_gbps > 20.0
    for row in rows:
        hops = 2 * (n - 1) if row["name"] == "allreduce" else n - 1
        model = hops * link.alpha_us + hops / n * row["bytes"] / (20.0 * 1e3)
        assert row["transfer_us"] == pytest.approx(model, abs=1e-3)


def test_host_stalls_may_start_at_a_later_step():
    """(rank, µs, every, first): stalls in steps first, first + every, ... of the recorded ones."""
    spec = replace(TINY, world_size=8, steps=6, host_stalls=((1, 900.0, 3, 0), (4, 500.0, 3, 1), (6, 700.0, 4, 2)))
    assert [spec.stall_us(k)[1] for k in range(6)] == [900.0, 0.0, 0.0, 900.0, 0.0, 0.0]
    assert [spec.stall_us(k)[4] for k in range(6)] == [0.0, 500.0, 0.0, 0.0, 500.0, 0.0]
    assert [spec.stall_us(k)[6] for k in range(6)] == [0.0, 0.0, 700.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="host_stalls"):
        replace(TINY, host_stalls=((1, 900.0),))
