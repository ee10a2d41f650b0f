"""The analyzer recovers the truth the generator built into every synthetic sample job."""

import json

import pytest

from analyzer.api import diagnose
from analyzer.rank.comms import canonical_dtype
from conftest import SAMPLES

# the data-parallel simulator's jobs (analyzer.synth.parallel's: tests/test_parallel_synthetic.py)
JOBS = sorted(p.parent.name for p in (SAMPLES / "synthetic").glob("*/truth.json")
              if "model" in json.loads(p.read_text()))
METRICS = ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us")


@pytest.fixture(scope="module", params=JOBS)
def job(request):
    folder = SAMPLES / "synthetic" / request.param
    truth = json.loads((folder / "truth.json").read_text())
    result = diagnose([str(folder / "rank-*.json.gz")])
    return truth, result


def test_sample_jobs_exist():
    assert len(JOBS) >= 10


def test_rank_and_step_metrics(job):
    truth, result = job
    ranks = {r.rank: r for r in result.ranks}
    assert sorted(ranks) == [t["rank"] for t in truth["ranks"]]
    for t in truth["ranks"]:
        got = ranks[t["rank"]]
        assert got.host == (t["host"] if truth["topology"]["host_name_in_trace"] else None)
        for key in METRICS:
            assert got.metrics[key] == pytest.approx(t[key], abs=0.002), (t["rank"], key)
        assert got.metrics["overlap_pct"] == pytest.approx(t["overlap_pct"], abs=0.001)
        assert got.phases == pytest.approx(t["phases"], abs=0.002)
        steps = {s["step"]: s for s in got.steps}
        assert sorted(steps) == [s["step"] for s in t["steps"]]
        for ts in t["steps"]:
            for key in METRICS:
                assert steps[ts["step"]][key] == pytest.approx(ts[key], abs=0.002), (t["rank"], ts["step"], key)


def test_collectives(job):
    truth, result = job
    cols = truth["collectives"]["columns"]
    want = sorted((dict(zip(cols, row)) for row in truth["collectives"]["rows"]),
                  key=lambda r: (r["rank"], r["start_us"]))
    got = sorted((c for c in result.collectives), key=lambda r: (r["rank"], r["start_us"]))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["collective"] == w["name"]
        assert g["bytes"] == w["bytes"]
        assert g["dtype"] == canonical_dtype(w["dtype"])
        assert g["group"]["name"] == w["group"]
        assert (g["step"], g["phase"], g["stream"]) == (w["step"], w["phase"], w["stream"])
        assert g["dur_us"] == pytest.approx(w["dur_us"], abs=0.002)
        assert g["exposed_us"] == pytest.approx(w["exposed_us"], abs=0.002)


def test_buckets_and_units(job):
    truth, result = job
    strategy = truth["spec"]["strategy"]
    if strategy == "ddp":
        want = [b["bytes"] for b in truth["ddp_buckets"]]
        for (rank, step) in {(b["rank"], b["step"]) for b in result.buckets}:
            got = [b["bytes"] for b in result.buckets if (b["rank"], b["step"]) == (rank, step)]
            assert got == want  # bucket 0 (the last layers' gradients) launches first
        assert result.job["strategy"] == "ddp"
    else:
        assert result.job["dp_strategy"] == strategy
        hybrid = truth["spec"]["sharding"] == "hybrid_shard"
        assert result.job["strategy"] == (f"hsdp ({strategy})" if hybrid else strategy)
        assert result.fsdp_units
        units = truth["fsdp_units"]
        forward = [u for u in result.fsdp_units if u["phase"] == "forward" and u["collective"] == "allgather"
                   and (u["rank"], u["step"]) == (0, result.ranks[0].steps[0]["step"])]
        assert len(forward) == len(units)
