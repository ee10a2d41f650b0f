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
    assert f["ranks"] == sorted(e["late_ranks"]) == late == stalled  # late_ranks: the greedy order
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


def _truth_caused(job: str) -> dict[int, float]:
    """Each rank's caused waiting from the generator's own collectives: per collective (group,
    seq), the member that started last, and the other members' waits (dur - transfer), summed
    over the analysis's steady steps."""
    from analyzer.synth.truth import collective_rows
    truth = json.loads((SAMPLES / "synthetic" / job / "truth.json").read_text())
    steady = set(finding(f"synthetic/{job}", "straggler-rank")["evidence"]["steady_steps"])
    sets: dict = {}
    for row in collective_rows(truth):
        if row["step"] in steady:
            sets.setdefault((row["group"], row["seq"]), []).append(row)
    caused: dict[int, float] = {}
    for members in sets.values():
        last = max(members, key=lambda r: r["start_us"])
        caused[last["rank"]] = caused.get(last["rank"], 0.0) + sum(m["wait_us"] for m in members if m is not last)
    return caused


def test_late_ranks_ordered_by_the_waiting_they_cause():
    """Rank 1 (30 ms every other step) and rank 3 (18 ms every step) are both named, with their
    shares of the waiting close to the generator's, rank 1 causing more of it; in the greedy
    order rank 3 comes first (fixing it alone saves more: it stalls every step); rank 2 (5 ms)
    starts late but is never the last: not entry skew, since with them fixed it sets the pace
    (the generator: 63.7 ms with its stall alone left, 58.4 ms with none)."""
    f = finding("synthetic/ddp_two_late_ranks", "straggler-rank")
    e = f["evidence"]
    assert e["late_ranks"] == [3, 1] and f["ranks"] == [1, 3]
    alone = {p["rank"]: p["gain_alone_us"] for p in e["per_rank"]}
    assert alone[3] > alone[1] > 0.0
    caused = _truth_caused("ddp_two_late_ranks")
    total = sum(caused.values())
    for rank in (1, 3):
        assert e["caused_wait_share_direct"][str(rank)] == pytest.approx(caused[rank] / total, abs=0.1)
    assert list(e["caused_wait_direct_us"])[:2] == ["1", "3"]
    assert not e["entry_skew"] and e["next_after_named"]["2"] == pytest.approx(5000, rel=0.1)
    assert "then rank 2 would set the pace" in f["summary"]
    # the gain: the others' wait for them in the typical step, split into the waiting for them
    # (mean over the ranks, as the leaf) and the late ranks' own idle, at most the step's idle
    typical = diagnosed("synthetic/ddp_two_late_ranks").model.typical
    in_typical = dict(e["caused_wait_by_step"])[typical.step]
    assert e["wait_measured_in"] == f"typical step {typical.step}"
    assert sum(f["recovers"].values()) == pytest.approx(f["estimated_gain_us"], abs=0.2)
    # the replay's saving (both fixed) over the leaves: at most the waiting for them, the rest idle
    assert f["estimated_gain_us"] == pytest.approx(e["prediction"]["gain_us"], abs=0.1)
    assert f["recovers"]["exposed_wait_us"] <= sum(in_typical.get(str(r), 0.0) for r in (1, 3)) + 0.2
    assert f["recovers"].get("idle_us", 0.0) <= typical.leaves.idle_us + 0.05


def test_dlrm_names_the_rank_that_causes_the_waiting(real_traces):
    """param_dlrm_ddp_8rank: rank 7 is the last arrival at 5 of 8 collectives and causes ~3/4 of
    the waiting (independently: 35.5 of the 46.8 ms summed kernel waits); ranks 2 and 6 start
    the step late (1.3-2.9 ms) but are never last: with rank 7 on time, the latest of them sets
    the pace, so the replay names them after rank 7 (fixing 7 alone saves a fraction of what
    fixing the set does) rather than as entry skew."""
    f = finding("real/param_dlrm_ddp_8rank", "straggler-rank")
    e = f["evidence"]
    assert e["late_ranks"][0] == 7 and {2, 6} <= set(e["late_ranks"]) and f["ranks"] == sorted(e["late_ranks"])
    assert 0.7 < e["caused_wait_share_direct"]["7"] < 0.85
    first = e["per_rank"][0]
    assert first["rank"] == 7 and first["gain_alone_us"] < 0.5 * e["prediction"]["gain_us"]
    assert not set(e["entry_skew"]) & set(map(str, e["late_ranks"]))
