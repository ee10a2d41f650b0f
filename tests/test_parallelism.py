"""Process-group roles, parallelism sizes and strategy names, on hand-built traces."""

import pytest

from analyzer.api import diagnose
from analyzer.job.parallelism import description_role, is_data_parallel
from builders import AUTOGRAD, TraceBuilder, two_step_ddp

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("description, role", [
    ("default_pg", "world"), ("mesh_default", "world"), ("mesh_tp", "tp"), ("mesh_dp_shard", "dp_shard"),
    ("mesh_dp_replicate", "dp_replicate"), ("mesh_pp", "pp"), ("mesh_ep", "ep"), ("mesh_cp", "cp"),
    ("mesh_dp_shard_cp", "dp_shard+cp"), ("mesh_dp_cp", "dp+cp"), ("mesh_dp_shard_mod_ep", "dp_shard"),
    ("mesh_replicate", "dp_replicate"), ("mesh_shard", "dp_shard"), ("mesh_dim_0", None),
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("DATA_PARALLEL_GROUP", "dp"), ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "tp+dp"),
    ("EMBEDDING_GROUP", "embedding"), ("undefined", None), (None, None),
])
def test_description_roles(description, role):
    assert description_role(description) == role


@pytest.mark.parametrize("role, dp", [("dp", True), ("dp_shard+cp", True), ("world", True), ("unknown", True),
                                      (None, True), ("tp", False), ("pp", False), ("ep", False),
                                      ("tp+dp", False), ("embedding", False)])
def test_data_parallel_roles(role, dp):
    assert is_data_parallel(role) is dp


def megatron_tp(tmp_path, rank=0, world=4):
    """Megatron-style TP over the whole world, no pg_config (older recorder): per step two
    forward all-reduces launched inside _ReduceFromModelParallelRegion, one backward all-reduce
    (the input-gradient reduce of _CopyToModelParallelRegion's backward)."""
    b = TraceBuilder(rank=rank, world_size=world, pg_ranks=range(world))
    del b.doc["distributedInfo"]["pg_config"]
    for step, base in ((1, 1000.0), (2, 2000.0)):
        b.cpu(f"ProfilerStep#{step}", base - 10, 900, cat="user_annotation")
        b.kernel("sm90_gemm_fwd", base, 100, launch_ts=base - 9)
        for k in range(2):
            b.cpu("_ReduceFromModelParallelRegion", base - 8 + k, 0.8)
            b.kernel(AR, base + 100 + 50 * k, 20, stream=20, launch_ts=base - 7.9 + k)
        b.cpu("autograd::engine::evaluate_function: _CopyToModelParallelRegionBackward", base - 5, 2, tid=AUTOGRAD)
        b.kernel("sm90_gemm_bwd", base + 200, 200, launch_ts=base - 6, tid=AUTOGRAD)
        b.kernel(AR, base + 400, 30, stream=20, launch_ts=base - 4.5, tid=AUTOGRAD)
    return b.write(tmp_path / f"rank-{rank}.json")


def test_megatron_tp_without_pg_config(tmp_path):
    result = diagnose([str(megatron_tp(tmp_path, r)) for r in range(2)])
    job = result.job
    assert job["strategy"] == "megatron tp"
    assert job["dp_strategy"] == "unknown"
    assert job["parallelism"]["tp"]["size"] == 4
    assert any("Megatron tensor-parallel markers" in e for e in job["parallelism"]["tp"]["evidence"])
    # the default group is the world (distributedInfo.world_size), not unknown
    assert [(g["description"], g["size"], g["ranks"], g["role"]) for g in result.groups] == [
        ("default_pg", 4, [0, 1, 2, 3], "tp")]
    assert all(r["group"]["size"] == 4 for r in result.collectives)
    # tensor-parallel all-reduces are no DDP gradient buckets
    assert result.buckets == []


def ddp_with_tp(tmp_path, rank):
    """DDP over ranks {rank % 2, rank % 2 + 2} (group "1", described DATA_PARALLEL_GROUP) and TP
    over {2*(rank//2), +1} (group "2", TENSOR_MODEL_PARALLEL_GROUP): the TP all-reduce runs in
    backward too, and must not become a bucket."""
    dp = [rank % 2, rank % 2 + 2]
    tp = [2 * (rank // 2), 2 * (rank // 2) + 1]
    b = two_step_ddp(rank=rank, world_size=4, pg_ranks=range(4), group_ranks=dp)
    b.doc["distributedInfo"]["pg_config"] += [
        {"pg_name": "1", "pg_desc": "DATA_PARALLEL_GROUP", "pg_size": 2, "ranks": dp},
        {"pg_name": "2", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "pg_size": 2, "ranks": tp}]
    for ev in b.events:  # the DDP all-reduce runs in group "1"
        if ev["name"] == "record_param_comms":
            ev["args"].update({"Process Group Name": "1", "Process Group Description": "DATA_PARALLEL_GROUP"})
    for base in (1000.0, 1100.0):  # + a TP all-reduce in backward, [1035, 1040)
        b.cpu("record_param_comms", base - 3.5, 0.5, tid=AUTOGRAD, **{
            "Collective name": "allreduce", "In msg nelems": 64, "Out msg nelems": 64, "Group size": 2,
            "dtype": "BFloat16", "Process Group Name": "2", "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP",
            "Process Group Ranks": str(tp)})
        b.kernel(AR, base + 35, 5, stream=21, launch_ts=base - 3.2, tid=AUTOGRAD)
    return b.write(tmp_path / f"rank-{rank}.json")


def test_ddp_plus_tp_roles_and_buckets(tmp_path):
    result = diagnose([str(ddp_with_tp(tmp_path, r)) for r in range(4)])
    job = result.job
    assert job["strategy"] == "ddp+tp" and job["dp_strategy"] == "ddp"
    assert {d: v["size"] for d, v in job["parallelism"].items()} == {"dp": 2, "tp": 2}
    roles = {g["description"]: g["role"] for g in job["process_groups"]}
    assert roles == {"default_pg": "world", "DATA_PARALLEL_GROUP": "dp", "TENSOR_MODEL_PARALLEL_GROUP": "tp"}
    assert {g["role"] for g in result.groups} == {"dp", "tp"}
    # 4 ranks x 2 steps: one bucket each, every one the 1000-element DDP all-reduce
    assert len(result.buckets) == 8 and {b["bytes"] for b in result.buckets} == {2000}
    assert {b["group"] for b in result.buckets} == {"1"}


def test_expert_parallel_strategy(tmp_path):
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 990, 200, cat="user_annotation")
    b.kernel("sm90_gemm", 1000, 100, launch_ts=995)
    b.kernel("deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)", 1010, 30, stream=30, launch_ts=996)
    b.kernel("deep_ep::internode_ll::combine<3, 7168>(void*)", 1080, 40, stream=30, launch_ts=997)
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))])
    assert result.job["strategy"] == "expert parallel"
    assert [g["role"] for g in result.groups] == ["ep"]
    assert "deepep dispatch/combine kernels" in result.job["parallelism"]["ep"]["evidence"][0]


def test_hostile_world_size_without_pg_config(tmp_path):
    b = TraceBuilder()
    del b.doc["distributedInfo"]["pg_config"]
    b.doc["distributedInfo"]["world_size"] = 10**15
    b.kernel(AR, 1000, 10, stream=20)
    result = diagnose([str(b.write(tmp_path / "rank-0.json"))], report=False)
    # not a job size: ignored with a warning (a group of 10^15 ranks is never materialised)
    assert result.job["world_size"] is None and result.ranks[0].process_groups == []
    assert any("world_size 1000000000000000 is not a plausible job size" in w for w in result.warnings)
