"""straggler-rank and gpu-idle-host-bound against the generator's truth: the set of late ranks,
persistent or rotating, and the cause, on the synthetic host-stall, entry-skew and slow-compute
jobs (analyzer.synth.scenarios)."""

import json

import pytest

from conftest import SAMPLES
from rule_cases_lib import diagnosed


def finding(trace, rule):
    return next(f for f in diagnosed(trace).findings if f["rule"] == rule)


@pytest.mark.parametrize("job, late, pattern, cause, activity", [
    ("ddp_two_hosts_stall", [1, 3], "persistent", "host", "input"),
    ("ddp_rotating_stall", [1, 2, 3], "rotating", "host", "input"),
    ("ddp_host_sync_stall", [3], "persistent", "host", "device_sync"),
    ("ddp_straggler", [5], "persistent", "compute", None),
])
def test_late_ranks_and_cause(job, late, pattern, cause, activity):
    spec = json.loads((SAMPLES / "synthetic" / job / "truth.json").read_text())["spec"]
    stalled = sorted(spec["host_stall_ranks"]) or [spec["straggler_rank"]]
    f = finding(f"synthetic/{job}", "straggler-rank")
    e = f["evidence"]
    assert f["ranks"] == e["late_ranks"] == late == stalled
    assert e["pattern"] == pattern and e["cause"] == cause
    for rank in late:
        assert e["causes"][str(rank)]["cause"] == cause
        assert e["causes"][str(rank)].get("host_activity") == activity
    fix = f["fix"]["text"]
    assert {"input": "DataLoader", "device_sync": "sync", None: "clocks"}[activity] in fix


def test_entry_skew_single_step():
    truth = json.loads((SAMPLES / "synthetic" / "ddp_entry_skew" / "truth.json").read_text())
    first = {r["rank"]: r["steps"][0]["forward_start_us"] for r in truth["ranks"]}
    f = finding("synthetic/ddp_entry_skew", "straggler-rank")
    e = f["evidence"]
    assert e["cause"] == "entry-skew" and all(c["cause"] == "entry-skew" for c in e["causes"].values())
    assert e["main_late_rank"] == max(first, key=first.get)  # the rank that started last
    median = sorted(first.values())[len(first) // 2]
    assert all(first[r] > median for r in f["ranks"])  # every late rank started after the median


@pytest.mark.parametrize("job, ranks, activity", [
    ("ddp_two_hosts_stall", [1, 3], "input"),
    ("ddp_host_sync_stall", [3], "device_sync"),
])
def test_gpu_idle_on_the_stalling_ranks_only(job, ranks, activity):
    f = finding(f"synthetic/{job}", "gpu-idle-host-bound")
    assert f["ranks"] == ranks and f["evidence"]["host_activity"] == activity


def test_one_steady_step_names_no_pattern(real_traces):
    """The DLRM job has one steady step: a rank late in it is neither shown late step after step
    (persistent) nor taking turns (rotating), and the finding says it cannot tell."""
    f = finding("real/param_dlrm_ddp_8rank", "straggler-rank")
    assert f["evidence"]["steady_steps"] == [10] and f["evidence"]["pattern"] == "one step"
    assert "persistent" not in f["summary"] and "cannot be told" in f["summary"]
