"""Real 4-rank CPU recordings (torch 2.13 + gloo, scripts/record_parallel_cpu_traces.py): DTensor
tensor parallel, torch.distributed.pipelining, FSDP2 + TP on a 2-D mesh. Their process groups
get the roles the recording script set up, and the parallelism sizes its mesh."""

from pathlib import Path

import pytest

from analyzer.api import DiagnoseOptions, diagnose

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_gloo"


def run(job):
    files = sorted(str(p) for p in (SAMPLES / job).glob("rank-*.pt.trace.json.gz"))
    assert len(files) == 4
    return diagnose(files, DiagnoseOptions(workers=1), report=False)


def roles(result):
    return {(g["description"], tuple(g["ranks"] or ())): g["role"] for g in result.job["process_groups"]
            if g["description"]}


def test_dtensor_tensor_parallel():
    result = run("tp")
    # a 1-D mesh over the whole world reuses the default group: only the collectives tell TP
    assert roles(result) == {("default_pg", (0, 1, 2, 3)): "tp"}
    assert result.job["strategy"] == "tp"
    assert result.job["parallelism"]["tp"]["size"] == 4
    assert "DTensor" in result.job["parallelism"]["tp"]["evidence"][0]
    # ColwiseParallel + RowwiseParallel, 4 blocks, 2 active steps: one forward all-reduce
    # (RowwiseParallel output) and one backward all-reduce (ColwiseParallel input grad) per block
    rank0 = [r for r in result.collectives if r["rank"] == 0]
    assert sum(r["phase"] == "forward" for r in rank0) == 8
    assert sum(r["phase"] == "backward" for r in rank0) == 8
    assert result.buckets == [] and result.fsdp_units == []


def test_pipeline_stages():
    result = run("pp")
    assert roles(result) == {("default_pg", (0, 1, 2, 3)): "pp"}
    assert result.job["strategy"] == "pp" and result.job["parallelism"]["pp"]["size"] == 4
    assert any("pipeline schedule ranges" in e for e in result.job["parallelism"]["pp"]["evidence"])
    # GPipe, 4 micro-batches, 2 steps: the first stage only sends activations and receives
    # gradients, the last only receives activations and sends gradients
    by_rank = {r: sorted({c["collective"] for c in result.collectives if c["rank"] == r}) for r in range(4)}
    assert by_rank == {0: ["recv", "send"], 1: ["recv", "send"], 2: ["recv", "send"], 3: ["recv", "send"]}
    assert sum(c["rank"] == 0 and c["collective"] == "send" for c in result.collectives) == 8


def test_fsdp2_plus_tp_on_a_2d_mesh():
    result = run("fsdp2_tp")
    assert roles(result) == {("default_pg", (0, 1, 2, 3)): "world",
                             ("mesh_dp", (0, 2)): "dp_shard", ("mesh_dp", (1, 3)): "dp_shard",
                             ("mesh_tp", (0, 1)): "tp", ("mesh_tp", (2, 3)): "tp"}
    assert result.job["strategy"] == "fsdp2+tp"
    assert {d: v["size"] for d, v in result.job["parallelism"].items()} == {"dp_shard": 2, "tp": 2}
    # gloo records no group per collective: those rows mix the mesh's groups and stay unknown
    unknown = [g for g in result.job["process_groups"] if g["key"].startswith("unknown:")]
    assert unknown and {g["role"] for g in unknown} == {"unknown"}


@pytest.mark.parametrize("job", ["tp", "pp", "fsdp2_tp"])
def test_no_rule_misfires(job):
    assert [f["rule"] for f in run(job).findings] == []
