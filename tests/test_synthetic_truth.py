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
        assert g["bytes"] == (w["bytes"] if truth["spec"]["record_comm_sizes"] else None)  # never guessed
        assert g["dtype"] == canonical_dtype(w["dtype"])
        assert g["group"]["name"] == w["group"]
        assert (g["step"], g["phase"], g["stream"]) == (w["step"], w["phase"], w["stream"])
        assert g["dur_us"] == pytest.approx(w["dur_us"], abs=0.002)
        assert g["exposed_us"] == pytest.approx(w["exposed_us"], abs=0.002)


def test_buckets_and_units(job):
    truth, result = job
    strategy = truth["spec"]["strategy"]
    if strategy == "ddp" and truth["ddp_buckets"] is None:  # one all-reduce per gradient
        per_step = truth["comm_per_step"]["allreduce"]["count"]
        assert all(len([b for b in result.buckets if (b["rank"], b["step"]) == key]) == per_step
                   for key in {(b["rank"], b["step"]) for b in result.buckets})
    elif strategy == "ddp":
        want = [b["bytes"] for b in truth["ddp_buckets"]]
        for (rank, step) in {(b["rank"], b["step"]) for b in result.buckets}:
            got = [b["bytes"] for b in result.buckets if (b["rank"], b["step"]) == (rank, step)]
            assert got == want  # bucket 0 (the last layers' gradients) launches first
        assert result.job["dp_strategy"] == "ddp"
        embeddings = truth["spec"].get("embedding_alltoall_mb")  # sharded embeddings: all-to-all
        assert result.job["strategy"] == ("ddp + sharded embeddings" if embeddings else "ddp")
    else:
        assert result.job["dp_strategy"] == strategy
        hybrid = truth["spec"]["sharding"] == "hybrid_shard"
        assert result.job["strategy"] == (f"hsdp ({strategy})" if hybrid else strategy)
        assert result.fsdp_units
        units = truth["fsdp_units"]
        forward = [u for u in result.fsdp_units if u["phase"] == "forward" and u["collective"] == "allgather"
                   and (u["rank"], u["step"]) == (0, result.ranks[0].steps[0]["step"])]
        assert len(forward) == len(units)


LEAVES = ("compute_only_us", "exposed_wait_us", "exposed_transfer_us", "other_gpu_us", "idle_us")


def test_time_breakdown_equals_truth(job):
    """Every rank and step: the step window and its leaves (waiting from the generator's own
    arrival times, idle in the data loader and after a blocking sync from its own host ranges)
    within 1% of the step time."""
    truth, result = job
    ranks = {r.rank: r for r in result.ranks}
    for t in truth["ranks"]:
        steps = {s["step"]: s for s in ranks[t["rank"]].steps}
        for ts in t["steps"]:
            want, got = ts["time_breakdown"], steps[ts["step"]]
            tol = 0.01 * want["step_time_us"]
            where = (t["rank"], ts["step"])
            assert got["step_time_us"] == pytest.approx(want["step_time_us"], abs=tol), where
            tb = got["time_breakdown"]
            for key in LEAVES:
                assert tb[key] == pytest.approx(want[key], abs=tol), (where, key)
            assert tb["idle_by_host"]["input"] == pytest.approx(want["idle_input_us"], abs=tol), where
            assert tb["idle_by_host"]["device_sync"] == pytest.approx(want["idle_device_sync_us"], abs=tol), where
            # idle with work launched and waiting, from the generator's own launch times (the
            # analysis allows 50 µs of launch latency, the generator 2.5 µs: 50 µs per gap at most)
            gaps_tol = tol + 0.05 * max(1, _queued_gaps(want))
            assert tb["idle_queued_us"] == pytest.approx(want["idle_queued_us"], abs=gaps_tol), where
            assert tb["idle_queued_by"]["copy"] == pytest.approx(want["idle_queued_copy_us"], abs=gaps_tol), where
            assert tb["idle_queued_in_sync_us"] == pytest.approx(want["idle_queued_in_sync_us"], abs=gaps_tol), where
            assert tb["idle_by_host"]["contention"] == pytest.approx(want["idle_contention_us"], abs=tol), where


def _queued_gaps(want) -> float:
    """A generous count of the queued gaps of a step (a few per ms of queued idle)."""
    return want["idle_queued_us"] / 100.0
