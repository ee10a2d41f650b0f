"""analyzer.model.formulas: every worked example of docs/models.md, hand-worked schedules, properties."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.model import formulas as m
from analyzer.model.link import cross_node_beta

MIB = 2**20
NVL_ALPHA, NVL_BETA = 0.8, 450.0   # NVLink 4, models.md §1
NIC_ALPHA, NIC_BETA = 12.0, 45.0   # 400G NIC measured, models.md §1


# ---------------------------------------------------------------- §1 alpha-beta
def test_crossover_sizes_of_the_table():
    assert m.crossover_bytes(NVL_ALPHA, NVL_BETA) == pytest.approx(360e3, rel=1e-12)
    assert m.crossover_bytes(NIC_ALPHA, NIC_BETA) == pytest.approx(540e3, rel=1e-12)


def test_small_message_over_the_nic_is_latency_bound():
    # models.md: "a 4 KB message over the NIC costs 10 µs + 0.09 µs; 99% of it is α". With the
    # table's α = 12 µs it is 12 µs + 0.089 µs; either way > 99% is α.
    transfer_us = m.alpha_beta_time(4e3, 0.0, NIC_BETA)
    assert transfer_us == pytest.approx(0.0889, abs=5e-5)
    total = m.alpha_beta_time(4e3, NIC_ALPHA, NIC_BETA)
    assert total == pytest.approx(12.0 + 4e3 / 45e9 * 1e6, rel=1e-12)
    assert NIC_ALPHA / total > 0.99
    assert 4e3 < m.crossover_bytes(NIC_ALPHA, NIC_BETA) < 1e6  # latency-bound below S*, not above


def test_at_the_crossover_latency_and_bandwidth_terms_are_equal():
    s_star = m.crossover_bytes(NIC_ALPHA, NIC_BETA)
    assert m.alpha_beta_time(s_star, NIC_ALPHA, NIC_BETA) == pytest.approx(2 * NIC_ALPHA)


# ---------------------------------------------------------------- §2 ring collectives
def test_allreduce_25mb_on_8_gpus_over_nvlink():
    t = m.ring_allreduce_time(25e6, 8, NVL_ALPHA, NVL_BETA)
    assert 14 * NVL_ALPHA == pytest.approx(11.2)
    assert 1.75 * 25e6 / 450e9 * 1e6 == pytest.approx(97.2222, rel=1e-5)
    assert t == pytest.approx(11.2 + 97.2222, rel=1e-5)
    assert round(t) == 108
    # the wrong "27 µs": bidirectional 900 GB/s and no 2(N-1)/N
    wrong = 25e6 / 900e9 * 1e6
    assert t / wrong == pytest.approx(3.9, abs=0.01)


def test_ring_times_of_the_table():
    s, n, a, b = 8e6, 4, 2.0, 100.0
    one_pass = 3 * a + 0.75 * s / (b * 1e3)
    assert m.ring_allgather_time(s, n, a, b) == pytest.approx(one_pass)
    assert m.ring_reduce_scatter_time(s, n, a, b) == pytest.approx(one_pass)
    assert m.ring_alltoall_time(s, n, a, b) == pytest.approx(one_pass)
    assert m.ring_allreduce_time(s, n, a, b) == pytest.approx(2 * one_pass)
    assert m.collective_time("broadcast", s, n, a, b) == pytest.approx(a + s / (b * 1e3))
    assert m.collective_time("reduce", s, n, a, b) == pytest.approx(a + s / (b * 1e3))
    for kind in ("send", "recv", "sendrecv"):
        assert m.collective_time(kind, s, 2, a, b) == pytest.approx(a + 80.0)


def test_dispatcher_covers_every_kind_and_one_rank_costs_nothing():
    assert set(m.COLLECTIVE_KINDS) == {"allreduce", "allgather", "reduce_scatter", "alltoall",
                                       "broadcast", "reduce", "send", "recv", "sendrecv"}
    for kind in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce"):
        assert m.collective_time(kind, 1e6, 1, 5.0, 10.0) == 0.0
    assert m.collective_time("allreduce", 25e6, 8, NVL_ALPHA, NVL_BETA) == \
        m.ring_allreduce_time(25e6, 8, NVL_ALPHA, NVL_BETA)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(m.COLLECTIVE_KINDS), st.one_of(st.integers(0, 2**34), st.floats(0, 1e10)),
       st.integers(1, 4096), st.one_of(st.integers(0, 50), st.floats(0, 50)), st.floats(0.1, 1000))
def test_collective_time_cache_gives_what_the_formula_gives(kind, size, n, alpha, beta):
    """collective_time is cached (a collective-heavy rank asks for ~100 distinct ones ~25,000
    times): a cached answer is the uncached function's, bit for bit, int and float apart."""
    uncached = m.collective_time.__wrapped__
    assert m.collective_time(kind, size, n, alpha, beta) == uncached(kind, size, n, alpha, beta)
    hits = m.collective_time.cache_info().hits
    assert m.collective_time(kind, size, n, alpha, beta) == uncached(kind, size, n, alpha, beta)
    assert m.collective_time.cache_info().hits == hits + 1
    for _ in range(2):  # errors are not cached: each call raises
        with pytest.raises(ValueError):
            m.collective_time(kind, -1.0, n, alpha, beta)


def test_collective_time_cache_keeps_int_and_float_apart():
    m.collective_time.cache_clear()
    assert m.collective_time("allreduce", 1024, 8, 1, 100.0) == m.collective_time("allreduce", 1024.0, 8, 1.0, 100.0)
    assert m.collective_time.cache_info().currsize == 2


def test_ring_latency_grows_linearly():
    # the ring's latency term: 2(N-1)α
    assert m.ring_allreduce_time(0, 1024, 1.0, 1.0) == pytest.approx(2046.0)


def test_busbw_factors_follow_nccl_tests():
    assert m.busbw_factor("allreduce", 8) == pytest.approx(1.75)
    for kind in ("allgather", "reduce_scatter", "alltoall"):
        assert m.busbw_factor(kind, 8) == pytest.approx(0.875)
    for kind in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        assert m.busbw_factor(kind, 8) == 1.0


def test_algbw_and_busbw_of_the_25mb_example():
    t = m.ring_allreduce_time(25e6, 8, NVL_ALPHA, NVL_BETA)
    assert m.algbw_gbps(25e6, t) == pytest.approx(25e6 / (t * 1e-6) / 1e9)
    busbw = m.busbw_gbps("allreduce", 25e6, t, 8)
    # busbw = β · (bandwidth term / total time) = 450 · 97.22 / 108.42
    assert busbw == pytest.approx(450 * 97.2222 / 108.4222, rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["allreduce", "allgather", "reduce_scatter", "alltoall",
                             "broadcast", "reduce"]),
       n=st.integers(2, 512), alpha=st.floats(0.1, 50), beta=st.floats(1, 1000))
def test_busbw_of_a_modelled_ring_is_below_beta_and_tends_to_it(kind, n, alpha, beta):
    small, huge = 1e6, 1e18
    assert m.busbw_gbps(kind, small, m.collective_time(kind, small, n, alpha, beta), n) < beta
    busbw = m.busbw_gbps(kind, huge, m.collective_time(kind, huge, n, alpha, beta), n)
    assert busbw == pytest.approx(beta, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(beta=st.floats(1, 1000), size=st.floats(1e3, 1e12))
def test_large_ring_allreduce_tends_to_two_s_over_beta(beta, size):
    n = 10**6
    t = m.ring_allreduce_time(size, n, 0.0, beta)
    assert t == pytest.approx(2 * size / (beta * 1e3), rel=1e-5)


# ---------------------------------------------------------------- §2 across nodes
def test_cross_node_beta_uses_the_nic_count():
    """The one cross-node rule (analyzer.model.link): the node's NICs shared by the group's
    members on it, capped by the intra-node link."""
    assert cross_node_beta(450, 8, 45, 8, 8) == pytest.approx(360)    # 8 x ~45
    assert cross_node_beta(450, 1, 45, 8, 8) == pytest.approx(45)     # one NIC per node
    assert cross_node_beta(450, 8, 90, 8, 8) == pytest.approx(450)    # capped by NVLink
    assert cross_node_beta(450, 2, 45, 1, 8) == pytest.approx(11.25)  # one member of 8 GPUs: its share


# ---------------------------------------------------------------- §3 volumes and memory
def test_static_memory_7b_on_8_gpus():
    psi = 7e9
    assert m.ddp_memory_bytes(psi) == pytest.approx(112e9)
    assert m.zero1_memory_bytes(psi, 8) == pytest.approx(38.5e9)
    assert m.zero1_memory_bytes(psi, 8) != pytest.approx(49.0e9)
    assert m.zero2_memory_bytes(psi, 8) == pytest.approx(26.25e9)
    assert m.zero3_memory_bytes(psi, 8) == pytest.approx(14e9)
    for strategy, expected in (("ddp", 112e9), ("zero1", 38.5e9), ("fsdp-grad-op", 26.25e9),
                               ("FULL_SHARD", 14e9)):
        assert m.static_memory_bytes(strategy, psi, 8) == pytest.approx(expected)


def test_static_memory_70b_on_64_gpus():
    psi = 70e9
    assert m.zero3_memory_bytes(psi, 64) == pytest.approx(17.5e9)
    assert m.hsdp_memory_bytes(psi, 8) == pytest.approx(140e9)
    assert m.static_memory_bytes("hsdp", psi, 64, gpus_per_node=8) > 80e9  # does not fit


def test_communication_volume_7b_on_8_gpus_bf16():
    psi, bpe, n = 7e9, 2, 8
    ddp = m.ddp_volume_bytes(psi, bpe, n)
    assert ddp == pytest.approx(2 * 7 / 8 * 14e9) == 24.5e9
    assert m.zero3_volume_bytes(psi, bpe, n) == pytest.approx(36.75e9)
    assert m.zero3_volume_bytes(psi, bpe, n) / ddp == pytest.approx(1.5)


def test_fp32_reduce_dtype_doubles_the_reduction_bytes():
    psi, n = 7e9, 8
    assert m.ddp_volume_bytes(psi, 2, n, grad_bytes_per_elem=4) == pytest.approx(49e9)
    # FSDP: the two all-gathers stay bf16, the reduce-scatter doubles
    assert m.zero3_volume_bytes(psi, 2, n, grad_bytes_per_elem=4) == \
        pytest.approx(2 * 12.25e9 + 24.5e9)


# ---------------------------------------------------------------- §4 DDP buckets
def _naive_pipeline(ready, durations, bwd_end):
    starts, ends, prev_end = [], [], -math.inf
    for r, t in zip(ready, durations):
        start = max(r, prev_end)
        starts.append(start)
        prev_end = start + t
        ends.append(prev_end)
    return starts, ends, max(0.0, ends[-1] - bwd_end) if ends else 0.0


def test_bucket_pipeline_hand_worked():
    # buckets ready at 10, 20, 50 µs; all-reduce 15, 10, 20 µs (1 µs per MB); backward ends at 60
    result = m.ddp_bucket_pipeline([10, 20, 50], [15e6, 10e6, 20e6], 60, lambda s: s / 1e6)
    assert result.starts_us == pytest.approx((10, 25, 50))
    assert result.ends_us == pytest.approx((25, 35, 70))
    assert result.exposed_tail_us == pytest.approx(10)
    assert m.ddp_bucket_pipeline([], [], 60, lambda s: 1.0).exposed_tail_us == 0.0


def test_bucket_pipeline_with_the_ring_model():
    # five 25 MB buckets on 8 H100s, each 108.42 µs; ready every 100 µs, backward ends at 500
    t_ar = m.ring_allreduce_time(25e6, 8, NVL_ALPHA, NVL_BETA)
    result = m.ddp_bucket_pipeline([100, 200, 300, 400, 500], [25e6] * 5, 500,
                                   lambda s: m.ring_allreduce_time(s, 8, NVL_ALPHA, NVL_BETA))
    # the queue grows by 8.42 µs per bucket: the last ends at 100 + 5·108.42
    assert result.ends_us[-1] == pytest.approx(100 + 5 * t_ar)
    assert result.exposed_tail_us == pytest.approx(100 + 5 * t_ar - 500)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e3)), min_size=1, max_size=30),
       st.floats(0, 2e4))
def test_bucket_pipeline_closed_form_equals_the_recurrence(buckets, bwd_end):
    ready = [r for r, _ in buckets]
    durations = {float(i): t for i, (_, t) in enumerate(buckets)}
    result = m.ddp_bucket_pipeline(ready, list(durations), bwd_end, lambda s: durations[s])
    starts, ends, tail = _naive_pipeline(ready, list(durations.values()), bwd_end)
    assert result.starts_us == pytest.approx(starts, abs=1e-6)
    assert result.ends_us == pytest.approx(ends, abs=1e-6)
    assert result.exposed_tail_us == pytest.approx(tail, abs=1e-6)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e4, 1e4), st.floats(0, 1e3)), max_size=30), st.floats(-1e4, 2e4))
def test_bucket_pipeline_of_times_is_the_pipeline_of_their_sizes(buckets, bwd_end):
    """The array entry point is the same formula, bit for bit (the what-if's output is compared
    byte for byte before and after it)."""
    ready = [r for r, _ in buckets]
    durations = {float(i): t for i, (_, t) in enumerate(buckets)}
    by_size = m.ddp_bucket_pipeline(ready, list(durations), bwd_end, lambda s: durations[s])
    assert m.ddp_bucket_pipeline_of_times(ready, list(durations.values()), bwd_end) == by_size


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12).flatmap(lambda count: st.lists(
    st.tuples(st.lists(st.tuples(st.floats(-1e4, 1e4), st.floats(0, 1e3)), min_size=count, max_size=count),
              st.floats(-1e4, 2e4)), min_size=1, max_size=6)))
def test_exposed_tails_of_many_pipelines_are_each_pipelines_tail(pipelines):
    """One 2-D call (the scaling curve's thousands of rank-steps) gives each row's
    ``ddp_bucket_pipeline_of_times`` tail bit for bit."""
    ready = np.array([[r for r, _ in buckets] for buckets, _ in pipelines])
    times = np.array([[t for _, t in buckets] for buckets, _ in pipelines])
    ends = np.array([end for _, end in pipelines])
    expected = [m.ddp_bucket_pipeline_of_times(r, t, e).exposed_tail_us for r, t, e in zip(ready, times, ends)]
    assert m.ddp_exposed_tails(ready, times, ends) == expected


@pytest.mark.parametrize("times", [[1.0, -2.0, float("nan")], [1.0, float("nan"), -2.0]])
def test_bucket_pipeline_of_times_says_what_the_per_bucket_check_says(times):
    feed = iter(times)
    with pytest.raises(ValueError) as per_bucket:
        m.ddp_bucket_pipeline([0.0] * 3, [1.0] * 3, 0.0, lambda _size: next(feed))
    with pytest.raises(ValueError, match=re.escape(str(per_bucket.value))):
        m.ddp_bucket_pipeline_of_times([0.0] * 3, times, 0.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.lists(st.floats(0, 500),
       min_size=20, max_size=20), st.floats(10, 1e4))
def test_critical_overlap_bubble_is_a_lower_bound_of_the_pipeline(fractions, durations, t_bwd):
    ready = sorted(f * t_bwd for f in fractions)
    durations = durations[:len(ready)]
    lookup = {float(i): d for i, d in enumerate(durations)}
    tail = m.ddp_bucket_pipeline(ready, list(lookup), t_bwd, lambda s: lookup[s]).exposed_tail_us
    bound = m.critical_overlap(sum(durations), t_bwd, ready[0])
    assert tail >= bound.min_bubble_us - 1e-6
    assert bound.min_bubble_us >= max(0.0, sum(durations) - t_bwd)  # models.md's weaker bound


def test_critical_overlap_hand_worked():
    hidden = m.critical_overlap(60, 100, 30)
    assert hidden.hidden and hidden.min_bubble_us == 0 and hidden.slack_us == pytest.approx(10)
    exposed = m.critical_overlap(80, 100, 30)
    assert not exposed.hidden
    assert exposed.min_bubble_us == pytest.approx(10)    # 30 + 80 − 100
    assert exposed.slack_us == pytest.approx(-10)
    assert m.critical_overlap(150, 100, 0).min_bubble_us == pytest.approx(50)  # T_comm − T_bwd
    with pytest.raises(ValueError):
        m.critical_overlap(10, 100, 150)


def test_assign_buckets_hand_worked():
    sizes = [0.5 * MIB, 0.4 * MIB, 0.3 * MIB, 10 * MIB, 10 * MIB, 10 * MIB, 3 * MIB]
    # first bucket closes at 1.2 MiB ≥ 1 MiB; the second at 30 MiB ≥ 25 MiB (overshoot allowed)
    assert m.assign_buckets(sizes, 25 * MIB) == ((0, 1, 2), (3, 4, 5), (6,))
    assert m.assign_buckets(sizes, 25 * MIB, 25 * MIB) == ((0, 1, 2, 3, 4, 5), (6,))
    assert m.assign_buckets([], 25 * MIB) == ()
    assert m.DEFAULT_BUCKET_CAP_BYTES == 26_214_400 and m.FIRST_BUCKET_BYTES == 1_048_576


def test_assign_buckets_matches_pytorch():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not hasattr(dist, "_compute_bucket_assignment_by_size"):
        pytest.skip("this torch build has no _compute_bucket_assignment_by_size")
    rng = np.random.default_rng(7)
    for _ in range(20):
        numels = rng.integers(1, 4_000_000, size=int(rng.integers(1, 40))).tolist()
        cap, first = int(rng.choice([1, 5, 25])) * MIB, MIB
        tensors = [torch.empty(k, dtype=torch.float32) for k in numels]
        expected, _ = dist._compute_bucket_assignment_by_size(tensors, [first, cap])
        got = m.assign_buckets([4 * k for k in numels], cap, first)
        assert [list(b) for b in got] == expected


def test_bucket_ready_times_and_pipeline_for_cap():
    sizes = [MIB] * 4
    ready = [10.0, 30.0, 20.0, 40.0]
    buckets = m.assign_buckets(sizes, 2 * MIB, 2 * MIB)
    assert buckets == ((0, 1), (2, 3))
    assert m.bucket_ready_times(ready, buckets) == (30.0, 40.0)
    result = m.ddp_pipeline_for_cap(sizes, ready, 40.0, lambda s: s / MIB * 10, 2 * MIB, None)
    assert result.starts_us == pytest.approx((30, 50)) and result.exposed_tail_us == 30


def _grads_every_10us():
    # eight 1 MiB gradients ready at 10, 20, ..., 80 µs; backward ends at 80 µs
    return [MIB] * 8, [10.0 * (k + 1) for k in range(8)], 80.0


def test_best_bucket_cap_hand_worked():
    sizes, ready, bwd_end = _grads_every_10us()
    allreduce = lambda s: 5 + 10 * s / MIB  # noqa: E731  α = 5 µs, 10 µs per MiB
    # cap 1: 15 µs each, e8 = 10 + 8·15 = 130 → 50;  cap 2: 25 µs at 20, 40, 60, 80 → 120 → 40
    # cap 4: 45 µs at 40, 80 → 130 → 50;            cap 8: 85 µs at 80 → 165 → 85
    choice = m.best_bucket_cap(sizes, ready, bwd_end, allreduce, [MIB, 2 * MIB, 4 * MIB, 8 * MIB])
    assert choice.cap_bytes == 2 * MIB
    assert choice.exposed_tail_us == pytest.approx(40)
    assert dict(choice.tails_us) == pytest.approx({MIB: 50, 2 * MIB: 40, 4 * MIB: 50,
                                                   8 * MIB: 85})


def test_best_bucket_cap_breaks_ties_towards_the_larger_cap():
    # four 10 MiB grads ready at 100..400: caps 5 and 10 MiB give the same buckets and tail
    sizes, ready = [10 * MIB] * 4, [100.0, 200.0, 300.0, 400.0]
    choice = m.best_bucket_cap(sizes, ready, 400.0, lambda s: 20 + 5 * s / MIB,
                               [5 * MIB, 10 * MIB, 20 * MIB, 40 * MIB])
    assert choice.cap_bytes == 10 * MIB
    assert choice.exposed_tail_us == pytest.approx(70)
    assert dict(choice.tails_us)[20 * MIB] == pytest.approx(120)
    assert dict(choice.tails_us)[40 * MIB] == pytest.approx(220)


# ---------------------------------------------------------------- §5 FSDP units
@pytest.mark.parametrize("prefetch, ag, expected", [
    (False, 5, dict(ag_starts=(0, 15, 30), compute_starts=(5, 20, 35), exposed=15)),
    (True, 5, dict(ag_starts=(0, 5, 15), compute_starts=(5, 15, 25), exposed=5)),
    (False, 20, dict(ag_starts=(0, 30, 60), compute_starts=(20, 50, 80), exposed=60)),
    (True, 20, dict(ag_starts=(0, 20, 40), compute_starts=(20, 40, 60), exposed=40)),
])
def test_fsdp_unit_schedule_hand_worked(prefetch, ag, expected):
    schedule = m.fsdp_unit_schedule([10, 10, 10], [1, 1, 1], lambda s: ag * s, prefetch)
    assert schedule.ag_starts_us == pytest.approx(expected["ag_starts"])
    assert schedule.ag_ends_us == pytest.approx(tuple(t + ag for t in expected["ag_starts"]))
    assert schedule.compute_starts_us == pytest.approx(expected["compute_starts"])
    assert schedule.compute_ends_us == pytest.approx(
        tuple(t + 10 for t in expected["compute_starts"]))
    assert schedule.exposed_ag_us == pytest.approx(expected["exposed"])


def test_fsdp_single_root_unit_exposes_its_whole_all_gather():
    t_ag = m.ring_allgather_time(14e9, 8, NVL_ALPHA, NVL_BETA)
    for prefetch in (False, True):
        schedule = m.fsdp_unit_schedule([1000.0], [14e9], lambda s: t_ag, prefetch)
        assert schedule.exposed_ag_us == pytest.approx(t_ag)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=20))
def test_fsdp_prefetch_never_exposes_more(units):
    compute = [c for c, _ in units]
    ag_time = {float(i): a for i, (_, a) in enumerate(units)}
    plain = m.fsdp_unit_schedule(compute, list(ag_time), lambda s: ag_time[s], prefetch=False)
    ahead = m.fsdp_unit_schedule(compute, list(ag_time), lambda s: ag_time[s], prefetch=True)
    assert ahead.exposed_ag_us <= plain.exposed_ag_us + 1e-9
    # the first all-gather is always exposed; without prefetch every one is
    assert ahead.exposed_ag_us >= units[0][1] - 1e-9
    assert plain.exposed_ag_us == pytest.approx(sum(a for _, a in units), abs=1e-6)


# ---------------------------------------------------------------- §6 compute
def test_mfu_worked_example():
    psi = 7e9
    assert m.flops_per_token(psi) == 42e9
    assert m.achieved_tflops_per_gpu(4200, psi, 1) == pytest.approx(176.4)
    assert m.achieved_tflops_per_gpu(8 * 4200, psi, 8) == pytest.approx(176.4)
    assert m.mfu(8 * 4200, psi, 8, 989) == pytest.approx(176.4 / 989, rel=1e-12)
    assert round(100 * m.mfu(4200, psi, 1, 989), 1) == 17.8
    assert m.mfu(4200, psi, 1, 989) != pytest.approx(0.52, abs=0.05)


def test_hfu_counts_the_recomputed_forward():
    assert m.hardware_flops_per_token(7e9) == 56e9
    assert m.hfu(4200, 7e9, 1, 989) == pytest.approx(m.mfu(4200, 7e9, 1, 989) * 8 / 6)
    assert m.hfu(4200, 7e9, 1, 989, recompute=False) == pytest.approx(m.mfu(4200, 7e9, 1, 989))


def test_attention_flops_palm():
    layers, seq, d = 32, 4096, 4096
    attention = 12 * layers * seq * d
    assert m.flops_per_token(7e9, layers, seq, d) == pytest.approx(42e9 + attention)
    assert m.hardware_flops_per_token(7e9, layers, seq, d) == pytest.approx(
        56e9 + 16 * layers * seq * d)
    with pytest.raises(ValueError):
        m.flops_per_token(7e9, n_layers=32)


def test_scaling_efficiency():
    assert m.scaling_efficiency(3500, 4200) == pytest.approx(5 / 6)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("call", [
    lambda: m.alpha_beta_time(-1, 1, 1),
    lambda: m.alpha_beta_time(1, -1, 1),
    lambda: m.alpha_beta_time(1, 1, 0),
    lambda: m.alpha_beta_time(float("nan"), 1, 1),
    lambda: m.crossover_bytes(1, float("inf")),
    lambda: m.ring_allreduce_time(1, 0, 1, 1),
    lambda: m.ring_allreduce_time(1, 2.5, 1, 1),
    lambda: m.ring_allreduce_time(1, True, 1, 1),
    lambda: m.collective_time("all_reduce", 1, 2, 1, 1),
    lambda: m.busbw_factor("gather", 2),
    lambda: m.algbw_gbps(1, 0),
    lambda: m.ddp_volume_bytes(-1, 2, 8),
    lambda: m.zero3_memory_bytes(1, 0),
    lambda: m.static_memory_bytes("zero4", 1, 8),
    lambda: m.static_memory_bytes("hsdp", 1, 8),
    lambda: m.ddp_bucket_pipeline([1, 2], [1], 0, lambda s: 1.0),
    lambda: m.ddp_bucket_pipeline([1], [-1], 0, lambda s: 1.0),
    lambda: m.ddp_bucket_pipeline([1], [1], 0, lambda s: -1.0),
    lambda: m.ddp_bucket_pipeline_of_times([1, 2], [1], 0),
    lambda: m.ddp_bucket_pipeline_of_times([1], [float("inf")], 0),
    lambda: m.assign_buckets([1, -2], MIB),
    lambda: m.assign_buckets([1], 0),
    lambda: m.best_bucket_cap([1], [1], 1, lambda s: 1.0, []),
    lambda: m.fsdp_unit_schedule([1, 2], [1], lambda s: 1.0, True),
    lambda: m.mfu(1, 1, 1, 0),
    lambda: m.scaling_efficiency(1, 0),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


_OVERLAP_VALUES = (st.floats(-10.0, 1e7, allow_nan=False) | st.integers(-5, 10**6)
                   | st.sampled_from([0.0, -0.0, float("nan"), float("inf"), True, 10**400]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_OVERLAP_VALUES, _OVERLAP_VALUES, _OVERLAP_VALUES), max_size=12))
def test_critical_overlap_bubbles_equal_the_scalar_bound(steps):
    """The many-steps bound gives each step's min_bubble_us bit for bit, or the scalar's error."""
    def scalar():
        return [m.critical_overlap(c, b, w).min_bubble_us for c, b, w in steps]
    columns = [list(column) for column in zip(*steps)] if steps else [[], [], []]
    try:
        expected = scalar()
    except (ValueError, OverflowError) as exc:
        with pytest.raises(type(exc)) as got:
            m.critical_overlap_bubbles(*columns)
        assert str(got.value) == str(exc)
        return
    assert [repr(v) for v in m.critical_overlap_bubbles(*columns)] == [repr(v) for v in expected]


def test_flops_from_shapes_worked_examples():
    """models.md §6, FLOPs from recorded shapes: the H200 recording's mm, a causal SDPA, a
    convolution, and the H200 DDP step's MFU from its measured figures."""
    models = m
    assert models.gemm_flops(1, 4088, 1024, 8192) == 68_585_259_008  # aten::mm [[4088, 8192], [8192, 1024]]
    assert models.attention_flops(2 * 4, 64, 64, 32, 32) == 4 * 2 * 4 * 64 * 64 * 32
    causal = models.attention_flops(8, 64, 64, 32, 32, models.causal_visible_fraction(64, 64))
    assert causal == 4 * 8 * 64 * 64 * 32 / 2
    assert models.attention_flops(8, 64, 64, 32, 32, 0.5, backward=True) == 2.5 * causal
    assert models.conv_output_size(16, 3, 2, 1, 1) == 8
    assert models.conv_flops(2, [8, 8], 8 * 3 * 3 * 3) == 2 * 2 * 64 * 216
    ideal = models.time_at_peak_us(1_440_290_439_168, 989)
    assert round(100 * models.flops_utilization(ideal, 11872.373), 1) == 12.3
    assert round(100 * models.flops_utilization(ideal, 5767.752), 1) == 25.2
    assert models.expected_compute_us(100.0, 8e12, 2e12) == 25.0
    with pytest.raises(ValueError):
        models.gemm_flops(1, -1, 2, 3)


def test_activation_memory_7b_worked_example():
    """docs/models.md §9: s = 2048, b = 1, h = 4096, a = 32, L = 32."""
    assert m.activation_bytes_per_layer(2048, 1, 4096, 32, flash=False) == 8_388_608 * 114 == 956_301_312
    assert m.activation_bytes_per_layer(2048, 1, 4096, 32) == 8_388_608 * 34 == 285_212_672
    assert m.recompute_activation_bytes_per_layer(2048, 1, 4096) == 16_777_216
    assert 32 * m.activation_bytes_per_layer(2048, 1, 4096, 32, flash=False) / 1e9 == pytest.approx(30.60, abs=0.005)
    assert 32 * m.activation_bytes_per_layer(2048, 1, 4096, 32) / 1e9 == pytest.approx(9.13, abs=0.005)
    state = m.zero3_memory_bytes(7e9, 8)
    assert state == pytest.approx(14e9)
    assert m.fits_device(state + 32 * m.activation_bytes_per_layer(2048, 1, 4096, 32), 80e9, m.MODELLED_MARGIN)
    assert not m.fits_device(m.ddp_memory_bytes(7e9), 80e9, m.MODELLED_MARGIN)
    assert m.fits_device(72e9, 80e9, m.MEASURED_MARGIN) and not m.fits_device(72.1e9, 80e9, m.MEASURED_MARGIN)
