"""Synthetic jobs beyond data parallelism (analyzer.synth.parallel) against their built-in truth:
roles, parallelism sizes, strategy, libraries and every rank's communication and overlap."""

from pathlib import Path

import json

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.synth.parallel import PARALLEL_SCENARIOS, write_parallel_job

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic"
METRICS = ("compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us", "span_us")


@pytest.fixture(scope="module", params=sorted(PARALLEL_SCENARIOS))
def job(request, tmp_path_factory):
    out = write_parallel_job(PARALLEL_SCENARIOS[request.param], tmp_path_factory.mktemp(request.param))
    truth = json.loads((out / "truth.json").read_text())
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1), report=False)
    return request.param, out, truth, result


def test_roles_sizes_strategy_libraries(job):
    _, _, truth, result = job
    assert result.job["strategy"] == truth["strategy"]
    assert {d: v["size"] for d, v in result.job["parallelism"].items()} == truth["parallelism"]
    roles = result.job["group_roles"]
    assert {key: roles.get(key) for key in truth["roles"]} == truth["roles"]
    assert sorted({c["library"] for c in result.collectives}) == truth["libraries"]
    # every group in the result carries a role, and it is the truth's where the truth names it
    for group in result.groups:
        assert group["role"] != "unknown"


def test_communication_and_overlap_equal_the_truth(job):
    _, _, truth, result = job
    for rank in result.ranks:
        want = truth["ranks"][str(rank.rank)]
        assert {k: rank.metrics[k] for k in METRICS} == pytest.approx({k: want[k] for k in METRICS}, abs=1e-3)


def test_data_parallel_views_ignore_other_roles(job):
    name, _, truth, result = job
    tp_or_ep = {"tp", "ep", "pp"}
    # buckets / units come only from data-parallel groups' NCCL/RCCL collectives
    roles = result.job["group_roles"]
    assert all(roles.get(b["group"]) not in tp_or_ep for b in result.buckets)
    if name == "megatron_tp4_dp2":  # one bucket per layer per rank and step, none from TP
        dp_groups = {key for key, role in truth["roles"].items() if role == "dp"}
        assert len(result.buckets) == 8 * 2 * 4 and {b["group"] for b in result.buckets} == dp_groups
    if name == "ddp_rccl_mi300x":
        assert len(result.buckets) == 8 * 2 * 4
    if name == "fsdp2_tp_2d":  # 4 forward all-gathers and 4 reduce-scatters per rank and step
        assert len(result.fsdp_units) == 8 * 2 * 8
        assert all(u["module"] and u["module"].startswith("layers.") for u in result.fsdp_units)


def test_committed_samples_are_current(job):
    name, out, _, _ = job
    for file in sorted(out.iterdir()):
        assert (SAMPLES / name / file.name).read_bytes() == file.read_bytes(), file.name


@pytest.mark.parametrize("name, fails", [("ep_deepep_exposed", True), ("ep_deepep_overlapped", False)])
def test_gate_counts_non_nccl_communication(name, fails):
    """DeepEP kernels are communication for the gate too: exposed 13.6% vs 1.2% of the step."""
    from analyzer.api import gate
    config = {"gate": {"assertions": {"exposed_comm_pct": ["error", {"max": 10.0, "aggregate": "median"}]}}}
    report, _ = gate([str(SAMPLES / name)], config)
    assert bool(report.failed) is fails and [c.status for c in report.checks if c.kind == "assertion"] == \
        ["fail" if fails else "pass"]


@pytest.mark.parametrize("name", ["megatron_tp4_dp2", "pp_gpipe_4stage", "ep_deepep_exposed"])
def test_whatif_declines_jobs_beyond_data_parallelism(name, capsys):
    from analyzer.cli.main import main
    with pytest.raises(SystemExit) as exit_:
        main(["whatif", str(SAMPLES / name), "--no-cache"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "models data-parallel jobs only" in err and len(err.splitlines()) == 1
    scaling = diagnose([str(SAMPLES / name)], DiagnoseOptions(workers=1)).scaling
    assert scaling["available"] is False and "data-parallel jobs only" in scaling["why"]
