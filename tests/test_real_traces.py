"""Real multi-GPU traces: every file parses, and the numbers agree with HTA.

The reference table is the one in ../shared/traces/real/README.md (HTA 0.5.0, every event, no
ns rounding); ``test_against_hta_itself`` also runs HTA live as an independent oracle.
"""

import os

import pytest

from analyzer.api import diagnose
from analyzer.ingest.loader import load_rank_trace
from analyzer.rank.timeline import breakdown

# file -> (overlap %, compute µs, idle µs, span µs), from the README of the real traces
HTA_FIGURES = {
    "hta_ddp_rank0_of_2/rank-0.json.gz": (15.61, 115655.8, 503051.0, 660551.0),
    "hta_ddp_sampled_128rank/sampled_rank-0.json.gz": (14.95, 210320.0, 675191.0, 1222847.0),
    "hta_ddp_sampled_128rank/sampled_rank-1.json.gz": (19.93, 271973.0, 651136.0, 1231186.0),
    "param_dlrm_ddp_8rank/worker0_step_12.1694128201545.pt.trace.json": (4.50, 1034.0, 6419.0, 13009.0),
    "param_dlrm_ddp_8rank/worker1_step_12.1694128201556.pt.trace.json": (2.47, 1246.0, 6428.0, 18749.0),
    "param_dlrm_ddp_8rank/worker2_step_12.1694128201554.pt.trace.json": (7.88, 1068.0, 7046.0, 11350.0),
    "param_dlrm_ddp_8rank/worker3_step_12.1694128201557.pt.trace.json": (3.31, 1240.0, 8145.0, 18853.0),
    "param_dlrm_ddp_8rank/worker4_step_12.1694128201547.pt.trace.json": (0.56, 1126.0, 8887.0, 16589.0),
    "param_dlrm_ddp_8rank/worker5_step_12.1694128201549.pt.trace.json": (0.64, 1041.0, 9121.0, 16392.0),
    "param_dlrm_ddp_8rank/worker6_step_12.1694128201553.pt.trace.json": (7.56, 1051.0, 7051.0, 11410.0),
    "param_dlrm_ddp_8rank/worker7_step_12.1694128201553.pt.trace.json": (9.51, 1059.0, 8308.0, 10967.0),
}


def test_every_real_trace_is_listed(real_traces):
    on_disk = {str(p.relative_to(real_traces)) for p in real_traces.rglob("*.json*")}
    assert on_disk == set(HTA_FIGURES)


@pytest.mark.parametrize("name", sorted(HTA_FIGURES))
def test_breakdown_matches_hta_readme(real_traces, name):
    overlap_pct, compute, idle, span = HTA_FIGURES[name]
    got = breakdown(load_rank_trace(real_traces / name).gpu)
    assert got["overlap_pct"] == pytest.approx(overlap_pct, abs=0.05)
    assert got["compute_us"] == pytest.approx(compute, rel=0.005)
    assert got["idle_us"] == pytest.approx(idle, rel=0.005)
    assert got["span_us"] == pytest.approx(span, rel=0.005)
    # internal consistency of the breakdown
    assert got["exposed_comm_us"] == pytest.approx(got["comm_us"] - got["overlap_us"], abs=0.002)
    assert got["idle_us"] == pytest.approx(got["span_us"] - got["busy_us"], abs=0.002)


def test_job_level_ranks_and_collectives(real_traces):
    result = diagnose([str(real_traces / "param_dlrm_ddp_8rank")])
    assert [r.rank for r in result.ranks] == list(range(8))
    assert all(r.rank_source == "distributedInfo" for r in result.ranks)
    per_rank = {}
    for row in result.collectives:
        per_rank.setdefault(row["rank"], []).append(row["collective"])
    # README: per rank 3 AllReduce and 5 SendRecv (all_to_all) kernels
    for rank in range(8):
        assert sorted(per_rank[rank]).count("allreduce") == 3
        assert sorted(per_rank[rank]).count("alltoall") == 5
    sizes = {row["bytes"] for row in result.collectives if row["collective"] == "allreduce"}
    assert None not in sizes  # sizes come from the nccl:* ops' Input Dims
    assert all(row["size_source"] == "Input Dims" for row in result.collectives)


def test_kernel_args_give_sizes_and_groups(real_traces):
    result = diagnose([str(real_traces / "hta_ddp_rank0_of_2")])
    allreduces = [c for c in result.collectives if c["collective"] == "allreduce"]
    assert len(allreduces) == 15  # 5 buckets x 3 steps (README)
    assert all(c["dtype"] == "f32" and c["group"]["ranks"] == [0, 1] for c in allreduces)
    assert all(8e6 <= c["bytes"] <= 31.5e6 * 1.01 for c in allreduces)
    assert len([c for c in result.collectives if c["collective"] == "broadcast"]) == 6
    assert result.job["strategy"] == "ddp"
    buckets = [b for b in result.buckets if b["step"] == result.buckets[0]["step"]]
    assert len(buckets) == 5 and [b["index"] for b in buckets] == list(range(5))


def test_subset_of_ranks_warns(real_traces):
    result = diagnose([str(real_traces / "hta_ddp_sampled_128rank")])
    assert [r.rank for r in result.ranks] == [0, 1]
    assert any("2 of 128 ranks" in w for w in result.warnings)


@pytest.mark.skipif(os.environ.get("TRACECLIFF_SKIP_HTA") == "1", reason="HTA oracle disabled")
@pytest.mark.parametrize("name", ["hta_ddp_rank0_of_2/rank-0.json.gz",
                                  "param_dlrm_ddp_8rank/worker3_step_12.1694128201557.pt.trace.json"])
def test_against_hta_itself(real_traces, name, monkeypatch):
    """Run HTA live (the exact settings of the README) and compare."""
    hta = pytest.importorskip("hta.trace_analysis")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    analysis = hta.TraceAnalysis(trace_files={0: str(real_traces / name)}, trace_dir="",
                                 include_last_profiler_step=True)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    temporal = analysis.get_temporal_breakdown(visualize=False)
    ours = breakdown(load_rank_trace(real_traces / name).gpu)
    assert ours["overlap_pct"] == pytest.approx(float(overlap["comp_comm_overlap_pctg"].iloc[0]), abs=0.05)
    assert ours["compute_us"] == pytest.approx(float(temporal["compute_time(us)"].iloc[0]), rel=0.005)
    assert ours["idle_us"] == pytest.approx(float(temporal["idle_time(us)"].iloc[0]), rel=0.005)
    assert ours["span_us"] == pytest.approx(float(temporal["kernel_time(us)"].iloc[0]), rel=0.005)
