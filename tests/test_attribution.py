"""Step-time attribution: the leaves add up to the step time on every trace, and equal the
hand-worked figures of small traces (analyzer.rank.attribution, analyzer.job.attribution)."""

import dataclasses

import pytest

from analyzer.api import diagnose
from analyzer.base import intervals as iv
from analyzer.job.attribution import LEAVES, _exposed_set, _exposed_sets
from analyzer.job.typical import steady_steps
from builders import AUTOGRAD, TraceBuilder, two_step_ddp
from conftest import SAMPLES

SAMPLE_JOBS = sorted(str(p) for p in SAMPLES.glob("*/*") if p.is_dir() and p.parent.name != "flight_recorder")
REAL_JOBS = ("hta_ddp_rank0_of_2", "hta_ddp_sampled_128rank", "param_dlrm_ddp_8rank")


def assert_adds_up(result):
    """Every step of every rank, every rank's typical step and the job's: leaves = step time."""
    for rank in result.ranks:
        for step in rank.steps:
            tb = step["time_breakdown"]
            four = tb["compute_only_us"] + tb["exposed_comm_us"] + tb["other_gpu_us"] + tb["idle_us"]
            assert four == pytest.approx(step["step_time_us"], abs=1e-6), (rank.rank, step["step"])
            assert tb["exposed_wait_us"] + tb["exposed_transfer_us"] == pytest.approx(tb["exposed_comm_us"], abs=1e-6)
            # idle = host-caused + queued; each split by its causes
            assert tb["idle_host_us"] + tb["idle_queued_us"] == pytest.approx(tb["idle_us"], abs=2e-3)
            assert sum(tb["idle_by_host"].values()) == pytest.approx(tb["idle_host_us"], abs=2e-3)
            assert sum(tb["idle_queued_by"].values()) == pytest.approx(tb["idle_queued_us"], abs=2e-3)
            assert min(tb["idle_by_host"].values()) >= 0 and min(tb["idle_queued_by"].values()) >= 0
            assert 0 <= tb["idle_queued_in_sync_us"] <= tb["idle_queued_us"] + 1e-6
            assert min(tb[k] for k in LEAVES) >= 0
        if rank.time_breakdown is not None:
            tb = rank.time_breakdown
            assert sum(tb[k] for k in LEAVES) == pytest.approx(tb["step_time_us"], abs=1e-6)
    job = result.attribution
    if job is not None:
        assert sum(job[k] for k in LEAVES) == pytest.approx(job["step_time_us"], abs=1e-6)
        details = job["details"]
        for key in ("by_kind", "by_group", "by_phase"):
            cells = details[key].values()
            assert sum(c["wait_us"] for c in cells) == pytest.approx(job["exposed_wait_us"], abs=0.01)
            assert sum(c["transfer_us"] for c in cells) == pytest.approx(job["exposed_transfer_us"], abs=0.01)
        assert sum(details["wait_by_peer"].values()) <= job["exposed_wait_us"] + 0.01
        assert details["idle_host_us"] + details["idle_queued_us"] == pytest.approx(job["idle_us"], abs=0.01)
        assert sum(details["idle_by_host"].values()) == pytest.approx(details["idle_host_us"], abs=0.01)
        doc = result.to_dict()
        for entry in doc["ranks"]:
            if entry["time_breakdown"]:
                assert entry["step_time_us"] == entry["time_breakdown"]["step_time_us"]


@pytest.mark.parametrize("job", SAMPLE_JOBS, ids=lambda p: p.split("sample_traces/")[-1])
def test_leaves_add_up_on_every_sample_trace(job):
    assert_adds_up(diagnose([job], report=False))


@pytest.mark.parametrize("name", REAL_JOBS)
def test_leaves_add_up_on_every_real_trace(real_traces, name):
    result = diagnose([str(real_traces / name)], report=False)
    assert_adds_up(result)
    assert result.attribution is not None


def test_dlrm_wait_is_for_rank_7_at_the_first_all_to_all(real_traces):
    """The 8-rank DLRM step: 5.7 ms of the 14.5 ms mean step is waiting, mostly in the forward
    all-to-all and mostly for rank 7 (checked against the per-rank kernel durations: rank 7's
    first all-to-all is the shortest, 41 µs, the others' run up to 7.6 ms)."""
    result = diagnose([str(real_traces / "param_dlrm_ddp_8rank")], report=False)
    job = result.attribution
    assert job["step"] == 10 and job["ranks"] == 8
    assert job["exposed_wait_us"] > 20 * job["exposed_transfer_us"]
    peers = job["details"]["wait_by_peer"]
    assert max(peers, key=peers.get) == "7"
    assert job["details"]["by_kind"]["alltoall"]["wait_us"] > job["details"]["by_kind"]["allreduce"]["wait_us"]
    assert "all 8 ranks" in job["wait_source"]


def test_hand_worked_two_rank_ddp(tmp_path):
    """two_step_ddp: steps of 100 µs; forward [0,30), backward [30,70), all-reduce [60,90) on
    rank 0; rank 1's all-reduce runs [80,90) (it arrived last: transfer 10 µs), so rank 0 waits
    [60,80), of which [60,70) is hidden under its backward; then the optimizer [90,95), 5 µs idle.
    Step 1 on rank 0: compute 75 (30 + 40 + 5), wait 10, transfer 10, idle 5 = 100."""
    b0 = two_step_ddp(rank=0)
    b1 = TraceBuilder(rank=1)
    for step, base in ((1, 1000.0), (2, 1100.0)):
        b1.cpu(f"ProfilerStep#{step}", base - 10, 100, cat="user_annotation")
        b1.kernel("sm90_xmma_gemm_bf16<128, 64>", base, 30, launch_ts=base - 8)
        b1.cpu("autograd::engine::evaluate_function: MmBackward0", base - 5, 4, tid=AUTOGRAD)
        b1.kernel("void at::native::elementwise<&>", base + 30, 40, launch_ts=base - 4, tid=AUTOGRAD)
        b1.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", base + 80, 10, stream=20,
                  launch_ts=base - 1.5, tid=AUTOGRAD)
        b1.kernel("multi_tensor_apply_kernel", base + 90, 5, launch_ts=base - 0.5)
    paths = [str(b0.write(tmp_path / "rank-0.json")), str(b1.write(tmp_path / "rank-1.json"))]
    result = diagnose(paths, report=False)
    assert_adds_up(result)
    step1 = result.ranks[0].steps[0]["time_breakdown"]
    assert (step1["compute_only_us"], step1["exposed_wait_us"], step1["exposed_transfer_us"],
            step1["other_gpu_us"], step1["idle_us"]) == (75.0, 10.0, 10.0, 0.0, 5.0)
    # rank 1 waited for nobody: its 10 µs all-reduce is transfer; it idles [70,80) and [95,100)
    r1 = result.ranks[1].steps[0]["time_breakdown"]
    assert (r1["compute_only_us"], r1["exposed_wait_us"], r1["exposed_transfer_us"], r1["idle_us"]) == \
        (75.0, 0.0, 10.0, 15.0)
    # two steps: the last one is the drain (its time is its span), step 1 is typical
    job = result.attribution
    assert job["step"] == 1 and job["excluded_steps"][0]["step"] == 2
    assert job["excluded_steps"][0]["role"] == "drain"
    assert job["details"]["wait_by_peer"] == {"1": 5.0}  # rank 0 waits 10 µs; mean over 2 ranks
    model = result.model
    assert model.exposed_share == pytest.approx((5.0 + 10.0) / 100.0) == job["exposed_share"]
    assert model.step_time_us == job["step_time_us"] and model.step_role(2) == "drain" and model.step_role(1) == "typical"
    # each rank's steps carry their role; rank 0's typical leaves are its step 1
    assert [s.role for s in model.ranks[0].steps] == ["typical", "drain"]
    assert model.ranks[0].typical.exposed_wait_us == 10.0


def host_stall_trace(tmp_path, kind):
    """One rank, three 1,000 µs steps: a 400 µs kernel, then a 600 µs gap in which the host is
    in the data loader (kind="input") or returns from a cudaStreamSynchronize that drained the
    GPU and then runs Python (kind="sync")."""
    b = TraceBuilder(rank=0, world_size=1, pg_ranks=(0,))
    for step in range(3):
        base = 10_000.0 + 1000 * step
        b.cpu(f"ProfilerStep#{step}", base - 5, 1000, cat="user_annotation")
        b.kernel("sm90_xmma_gemm_bf16<128, 64>", base, 400, launch_ts=base - 2)
        if kind == "input":
            b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base + 400, 590,
                  cat="user_annotation")
        else:
            b.cpu("cudaStreamSynchronize", base + 1, 405, cat="cuda_runtime")
    return [str(b.write(tmp_path / f"rank-0-{kind}.json"))]


@pytest.mark.parametrize("kind,cause", [("input", "input"), ("sync", "device_sync")])
def test_idle_split_by_host_activity(tmp_path, kind, cause):
    result = diagnose(host_stall_trace(tmp_path, kind), report=False)
    assert_adds_up(result)
    step = result.ranks[0].steps[0]["time_breakdown"]
    assert step["idle_us"] == 600.0
    expected = 590.0 if kind == "input" else 600.0
    assert step["idle_by_host"][cause] == expected
    assert step["idle_by_host"]["unknown"] == pytest.approx(600.0 - expected)
    assert result.attribution["wait_source"].startswith("not measured")


def test_steady_steps():
    kept, excluded = steady_steps({1: 300.0, 2: 100.0, 3: 102.0, 4: 98.0, 5: 50.0}, 5)
    assert kept == [2, 3, 4]
    assert [(e["step"], e["reason"].split(":")[0]) for e in excluded] == [(1, "warm-up"), (5, "drain")]
    kept, excluded = steady_steps({7: 100.0}, 7)
    assert kept == [7] and excluded == []


def test_one_rank_waiting_is_an_alpha_beta_estimate(real_traces):
    """Rank 0 of 2 alone: no cross-rank matching, so waiting is estimated per all-reduce as its
    time beyond the α-β model on the group's fitted link, and the breakdown says so."""
    result = diagnose([str(real_traces / "hta_ddp_rank0_of_2")], report=False)
    job = result.attribution
    assert job["wait_source"].startswith("estimated")
    rows = [c for c in result.collectives if c.get("wait_estimated_us")]
    assert rows and all(c["wait_us"] is None and 0 < c["wait_estimated_us"] < c["dur_us"] for c in rows)
    assert job["details"]["wait_by_peer"] == {"estimated (α-β)": job["exposed_wait_us"]}
    assert 0 < job["exposed_wait_us"] < job["exposed_wait_us"] + job["exposed_transfer_us"]


def test_rank_breakdown_is_its_typical_steps_figures_even_when_steps_share_a_dict():
    """Each rank's time_breakdown is the typical step's figures as its split left them (the
    details are built for that step only, after it is chosen): also when the steps share one
    time_breakdown dict (bench/bench_reduce.py's tiled steps do), which later steps overwrite."""
    from analyzer.job.attribution import attribute_job
    job = next(j for j in SAMPLE_JOBS if j.endswith("ddp_healthy_8r"))
    result = diagnose([job], report=False)
    expected = {rank.rank: rank.time_breakdown for rank in result.ranks}
    typical = result.attribution["step"]
    for rank in result.ranks:
        entry = next(s for s in rank.steps if s["step"] == typical)
        assert {k: entry["time_breakdown"][k] for k in LEAVES} == {k: rank.time_breakdown[k] for k in LEAVES}
        assert rank.time_breakdown["details"]["wait_by_peer"] == entry["time_breakdown"]["wait_by_peer"]
    shared = {}
    for rank in result.ranks:  # the typical step and every later one share its dict
        for step in rank.steps:
            if step["step"] >= typical and "window_ns" in step:
                step["time_breakdown"] = shared.setdefault(rank.rank, step["time_breakdown"])
    again = dataclasses.replace(result)  # the diagnosed Result is frozen: attribute a new one of its parts
    attribute_job(again)
    assert again.attribution["step"] == typical
    assert {rank.rank: rank.time_breakdown for rank in again.ranks} == expected


def _row_intervals(starts, durs, waits):
    """A _RowIntervals of rows (start, dur, wait) in ns, made as its constructor makes one."""
    import numpy as np

    from analyzer.job.attribution import _RowIntervals

    order = np.lexsort((durs, starts))
    start, dur, wait = (np.asarray(a, dtype=np.int64)[order] for a in (starts, durs, waits))
    end = start + dur
    rows = object.__new__(_RowIntervals)
    rows.rows = [{"row": int(i)} for i in order]
    before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]])
    rows.start, rows.longest = start, int(dur.max())
    rows.own_start = np.minimum(np.maximum(start, before), end)
    rows.own_end = end
    rows.wait_end = np.clip(start + wait, rows.own_start, end)
    return rows


def _step_sets(cuts, gaps):
    """Canonical sets in disjoint windows between sorted ``cuts``, one per window, some empty."""
    import numpy as np

    from analyzer.base import intervals as iv

    sets = []
    for lo, hi, gap in zip(cuts, cuts[1:], gaps):
        points = np.arange(lo, hi, max(1, gap), dtype=np.int64)
        sets.append(iv.union(points[::2][: len(points[1::2])], points[1::2]))
    return sets


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=40),
       st.lists(st.integers(0, 2400), min_size=2, max_size=12, unique=True), st.lists(st.integers(1, 90), min_size=11,
                                                                                      max_size=11), st.randoms())
def test_split_all_is_split_of_each_step(rows, cuts, gaps, rnd):
    """The one-pass split of a rank's steps gives each step exactly what split() of its set
    gives (same rows, owned and waiting ns), whatever the order of the steps; overlapping sets
    take the step-by-step path and agree too."""
    table = _row_intervals(*zip(*rows))
    sets = _step_sets(sorted(cuts), gaps)
    rnd.shuffle(sets)
    assert table.split_all(sets) == [table.split(s) for s in sets]
    if len(sets) > 1:  # a set repeated: not disjoint
        assert table.split_all(sets + sets[:1]) == [table.split(s) for s in sets + sets[:1]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-2**62, 2**62), max_size=8), max_size=6), st.integers(0, 2**61))
def test_exposed_sets_of_a_rank_equal_the_sets_step_by_step(flats, origin):
    """attribute_job reads all of a rank's steps at once: the same sets and totals as one step at
    a time (wrapping int64 sums alike; lists of odd length go step by step and fail alike)."""
    try:
        plain = [_exposed_set(flat, origin) for flat in flats]
    except ValueError:
        with pytest.raises(ValueError):
            _exposed_sets(flats, origin)
        return
    sets, totals = _exposed_sets(flats, origin)
    assert [(a.tolist(), b.tolist()) for a, b in sets] == [(a.tolist(), b.tolist()) for a, b in plain]
    assert totals == [iv.total(s) for s in plain]
    assert all(type(t) is int for t in totals)
