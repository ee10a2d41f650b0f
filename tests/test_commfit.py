"""algbw / busbw per collective, the lower-envelope α/β fit per group, latency/bandwidth bound."""

import dataclasses

import numpy as np
import pytest

from analyzer.job import commfit
from analyzer.job.columns import Categorical
from analyzer.model import formulas as models
from analyzer.api import DiagnoseOptions, diagnose
from analyzer.synth import SCENARIOS, write_job

PROFILE = (0.8, 450.0, "hardware profile (test)")


def test_busbw_of_the_models_md_example():
    # all-reduce of 25 MB on 8 GPUs over NVLink 4: 14 x 0.8 µs + 1.75 x 25e6 B / 450 GB/s = 108.4 µs
    t = 14 * 0.8 + 1.75 * 25e6 / 450e3
    alg, bus = commfit.bandwidths("allreduce", 25_000_000, t, 8)
    assert alg == pytest.approx(25e6 / t / 1e3)
    assert bus == pytest.approx(alg * 1.75)
    assert commfit.bandwidths("allgather", 8_000_000, 100.0, 8)[1] == pytest.approx(80 * 7 / 8)
    assert commfit.bandwidths("send", 1000, 1.0, 2) == pytest.approx((1.0, 1.0))
    assert commfit.bandwidths("allreduce", None, 1.0, 8) == (None, None)
    assert commfit.bandwidths("barrier", 10, 1.0, 8) == (pytest.approx(0.01), None)


def inflated_points(alpha, beta, n, seed=0):
    """Ring all-reduces and all-gathers of 24 sizes, 20 repeats each; durations = model time
    + waits (exponential, mean 3x the model time) on 80% of them: what a trace looks like."""
    rng = np.random.default_rng(seed)
    kinds, sizes, times = [], [], []
    for size in np.geomspace(4e3, 2e8, 24).astype(int):
        for k in range(20):
            kind = "allreduce" if k % 2 else "allgather"
            t = models.collective_time(kind, size, n, alpha, beta)
            wait = rng.exponential(3 * t) if rng.random() < 0.8 else 0.0
            kinds.append(kind)
            sizes.append(int(size))
            times.append(t + wait)
    return kinds, sizes, times


@pytest.mark.parametrize("alpha,beta,n", [(0.8, 450.0, 8), (12.0, 45.0, 16), (12.0, 360.0, 64)])
def test_lower_envelope_recovers_alpha_beta_where_least_squares_does_not(alpha, beta, n):
    kinds, sizes, times = inflated_points(alpha, beta, n)
    fit = commfit.fit_alpha_beta(kinds, sizes, times, n, PROFILE)
    assert fit.source == "fit" and "lower-envelope" in fit.fit
    assert fit.alpha_us == pytest.approx(alpha, rel=0.02)
    assert fit.beta_gbps == pytest.approx(beta, rel=0.02)
    assert fit.s_star_bytes == pytest.approx(models.crossover_bytes(alpha, beta), rel=0.04)
    # The naive alternative, a least-squares line through the same normalised points:
    x = [s * models.busbw_factor(k, n) / commfit.hops(k, n) for k, s in zip(kinds, sizes)]
    y = [t / commfit.hops(k, n) for k, t in zip(kinds, times)]
    slope, _ = np.polyfit(x, y, 1)
    assert 1e-3 / slope < 0.5 * beta  # waits halve (or worse) the least-squares β


def test_fewer_than_three_sizes_uses_the_profile_alpha_and_measures_beta():
    n = 8
    t = models.collective_time("allgather", 1e8, n, 0.8, 200.0)
    fit = commfit.fit_alpha_beta(["allgather"] * 3, [10**8] * 3, [t, t * 1.5, t * 3], n, PROFILE)
    assert fit.source == "profile-alpha" and "only 1 distinct message size" in fit.fit
    assert (fit.alpha_us, fit.beta_gbps) == (0.8, pytest.approx(200.0, rel=1e-3))
    tiny = commfit.fit_alpha_beta(["allreduce"], [8], [2.0], n, PROFILE)
    assert (tiny.alpha_us, tiny.beta_gbps, tiny.source) == (0.8, 450.0, "profile")
    assert "too short" in tiny.fit


def test_times_that_do_not_grow_with_size_fall_back():
    fit = commfit.fit_alpha_beta(["allreduce"] * 3, [1000, 10**6, 10**8], [500.0, 400.0, 300.0], 8, PROFILE)
    assert (fit.alpha_us, fit.beta_gbps, fit.source) == (0.8, 450.0, "profile")
    assert "do not follow" in fit.fit


def test_bound_compares_bytes_per_hop_with_s_star():
    s_star = models.crossover_bytes(0.8, 450.0)  # 360 KB
    # ring all-reduce on 8: latency-bound iff S/8 < S*, i.e. S < 2.88 MB
    assert commfit.bound_of("allreduce", 2_800_000, 8, s_star) == "latency-bound"
    assert commfit.bound_of("allreduce", 2_900_000, 8, s_star) == "bandwidth-bound"
    assert commfit.bound_of("broadcast", 350_000, 8, s_star) == "latency-bound"
    assert commfit.bound_of("allreduce", None, 8, s_star) is None
    assert commfit.bound_of("allreduce", 10**6, 1, s_star) is None


def test_summary_per_group_collective_and_size_bucket():
    rows = [{"group": {"name": "0"}, "collective": "allreduce", "bytes": b, "dur_us": d, "wait_us": w,
             "busbw_gbps": bw, "bound": "bandwidth-bound"}
            for b, d, w, bw in ((3 << 20, 110.0, 10.0, 50.0), (3 << 20, 100.0, None, 60.0),
                                (5 << 20, 200.0, 0.0, 70.0))]
    rows.append({"group": {"name": "0"}, "collective": "allreduce", "bytes": None, "dur_us": 1.0})
    first, second = commfit.summarize(rows)
    assert (first["size_bucket"], first["count"], first["transfer_us_min"], first["transfer_us_median"]) == \
        ("2 MiB-4 MiB", 2, 100.0, 100.0)
    assert (first["busbw_gbps_median"], first["busbw_gbps_max"]) == (55.0, 60.0)
    assert (second["size_bucket"], second["count"]) == ("4 MiB-8 MiB", 1)


@pytest.fixture(scope="module")
def two_node_ddp(tmp_path_factory):
    spec = dataclasses.replace(SCENARIOS["ddp_2node_16r_healthy"], n_layers=2, steps=2)
    folder = write_job(spec, tmp_path_factory.mktemp("ddp2n"))
    return spec, diagnose(sorted(str(p) for p in folder.glob("rank-*.json.gz")), DiagnoseOptions(workers=2))


def test_synthetic_job_groups_recover_the_generator_links(two_node_ddp):
    spec, result = two_node_ddp
    (group,) = result.groups
    assert {"name", "description", "ranks", "size", "nodes", "cross_node", "alpha_us", "beta_gbps",
            "s_star_bytes", "fit", "busbw_gbps", "busbw_basis", "busbw_median_gbps"} <= set(group)
    assert group["ranks"] == list(range(16)) and group["description"] == "default_pg"
    assert {"algbw_gbps", "busbw_gbps", "bound", "wait_us"} <= set(result.collectives[0])
    assert (group["size"], group["nodes"], group["cross_node"], group["fit_source"]) == (16, 2, True, "fit")
    # cross-node ring: α_nic, β = min(NVLink, 8 NICs x 45 GB/s)
    assert group["alpha_us"] == pytest.approx(spec.nic_alpha_us, rel=0.05)
    assert group["beta_gbps"] == pytest.approx(min(spec.nvlink_gbps, spec.nics_per_node * spec.nic_gbps), rel=0.03)
    assert group["busbw_gbps"] == group["busbw_median_gbps"] <= group["beta_gbps"] * 1.01
    for row in result.collectives:
        transfer = row["dur_us"] - row["wait_us"]
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / transfer / 1e3, rel=1e-3)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 15 / 16, rel=1e-3)
        assert row["bound"] == commfit.bound_of("allreduce", row["bytes"], 16, group["s_star_bytes"])
        assert row["wait_us"] >= 0


@pytest.mark.parametrize("n", [None, 1, 2, 8])
@pytest.mark.parametrize("s_star", [None, 0.0, 3e5])
def test_group_annotation_matches_the_per_row_model(n, s_star):
    """commfit.annotate_group (a group's rows at once) = commfit.bandwidths and bound_of row by row."""
    rows = [{"collective": kind, "bytes": size, "dur_us": dur, "wait_us": wait, "on_gpu": on_gpu}
            for kind in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "send", "barrier")
            for size, dur, wait, on_gpu in ((2**20, 100.0, 20.0, True), (None, 50.0, None, True),
                                            (3 * 10**9 + 7, 8000.5, None, False), (4096, 0.0, None, True),
                                            (1, 30.0, 30.0, True))]
    _, codes, _ = commfit.annotate_group(rows, n, s_star)
    assert [commfit.BOUNDS[c] for c in codes.tolist()] == [r["bound"] for r in rows]
    for r in rows:
        # a CPU-side row's duration is no transfer time: no bandwidth from it
        time = r["dur_us"] - (r["wait_us"] or 0.0) if r["on_gpu"] else None
        alg, bus = commfit.bandwidths(r["collective"], r["bytes"], time, n)
        assert r["algbw_gbps"] == (None if alg is None else round(alg, 4)), r
        assert r["busbw_gbps"] == (None if bus is None else round(bus, 4)), r
        assert r["bound"] == commfit.bound_of(r["collective"], r["bytes"], n, s_star), r


@pytest.mark.parametrize("case", ["envelope", "few sizes", "flat"])
def test_fit_takes_arrays_as_it_takes_lists(case):
    """fit_groups hands the sizes and times over as arrays (NaN for no size, as None is)."""
    if case == "envelope":
        kinds, sizes, times = inflated_points(12.0, 45.0, 16)
    elif case == "few sizes":
        kinds, sizes, times = ["allgather"] * 4, [10**8, 10**8, None, 10**6], [900.0, 950.0, 3.0, 20.0]
    else:
        kinds, sizes, times = ["allreduce"] * 3, [1000, 10**6, 10**8], [500.0, 400.0, 300.0]
    plain = commfit.fit_alpha_beta(kinds, sizes, times, 16, PROFILE)
    arrays = commfit.fit_alpha_beta(kinds, np.array([np.nan if v is None else v for v in sizes], dtype=float),
                                    np.array(times), 16, PROFILE)
    assert repr(arrays) == repr(plain)
    # as codes of the job's kinds (fit_groups): kinds of other groups among the names change nothing
    names = ["send", "alltoall"] + sorted(set(kinds)) + ["broadcast"]
    codes = Categorical(np.array([names.index(k) for k in kinds], dtype=np.int64), names)
    assert repr(commfit.fit_alpha_beta(codes, sizes, times, 16, PROFILE)) == repr(plain)
