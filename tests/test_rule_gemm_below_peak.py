"""gemm-below-peak (TC501) on hand-built compute figures: which GEMMs it takes, the target dtype
(bf16 where mixed precision is already in use, TF32 for an all-fp32 job, fp16 on V100), the
reference efficiency (the job's own, else the stated default) and the gain, worked by hand."""

from __future__ import annotations

import pytest

from analyzer.job.compute import RankCompute, ShapeFigures
from analyzer.model.hardware import resolve_hardware
from analyzer.rules.gemm_below_peak import GemmBelowPeak

T = {name: t.default for name, t in GemmBelowPeak.thresholds.items()}


def shape(m, n, k, dtype, gpu_us, family="gemm", count=1):
    flops = 2 * m * n * k
    return ShapeFigures("aten::mm", family, dtype, {"b": 1, "m": m, "n": n, "k": k}, count, flops, gpu_us,
                        flops * count / (gpu_us * 1e6), None, "", flops * count)


def rank(*shapes):
    return RankCompute(0, 5, sum(s.timed_flops for s in shapes), {}, (), shapes, 0.0, None, None, None, None, {},
                       tuple(shapes))


def test_fp32_gemms_in_a_bf16_job_target_bf16_at_the_jobs_own_efficiency():
    hw = resolve_hardware(["NVIDIA H100 80GB HBM3"])
    bf16 = shape(8192, 8192, 8192, "bf16", 1850.0)  # 1.10 TFLOP in 1.85 ms: 594 TFLOP/s, 60% of 989
    fp32 = shape(8192, 4096, 8192, "fp32", 9000.0)
    out = GemmBelowPeak._rank(GemmBelowPeak(), rank(bf16, fp32), hw, T)
    assert out["kind"] == "fp32" and out["target"] == "bf16" and out["low_precision"] == ["bf16"]
    efficiency = bf16.timed_flops / (989 * 1e6) / 1850.0
    assert out["efficiency"] == pytest.approx(efficiency) and out["source"].startswith("measured")
    then = fp32.timed_flops / (989 * 1e6) / efficiency
    assert out["then_us"] == pytest.approx(then) and out["gain_us"] == pytest.approx(9000.0 - then)


def test_an_all_fp32_job_targets_tf32_at_the_stated_efficiency():
    hw = resolve_hardware(["NVIDIA A100-SXM4-80GB"])
    fp32 = shape(4096, 4096, 4096, "fp32", 12000.0)
    out = GemmBelowPeak._rank(GemmBelowPeak(), rank(fp32), hw, T)
    assert out["target"] == "tf32" and out["peak"] == 156 and out["efficiency"] == 0.6
    assert out["source"].startswith("assumed")
    assert out["then_us"] == pytest.approx(fp32.timed_flops / (156e6 * 0.6))


def test_v100_has_no_tf32_the_target_is_fp16():
    hw = resolve_hardware(["Tesla V100-SXM2-32GB"])
    out = GemmBelowPeak._rank(GemmBelowPeak(), rank(shape(4096, 4096, 4096, "fp32", 20000.0)), hw, T)
    assert out["target"] == "fp16" and out["peak"] == 125


def test_small_gemms_tf32_ones_and_aligned_fast_ones_stay_quiet():
    hw = resolve_hardware(["NVIDIA H100 80GB HBM3"])
    small = shape(16, 512, 512, "fp32", 50.0)  # 8.4 MFLOP: below min_gemm_flops
    tf32 = shape(4096, 4096, 4096, "tf32", 400.0)
    aligned = shape(4096, 4096, 4096, "bf16", 230.0)
    assert GemmBelowPeak._rank(GemmBelowPeak(), rank(small, tf32, aligned), hw, T) is None


def test_misaligned_bf16_gemms_against_the_aligned_ones():
    hw = resolve_hardware(["NVIDIA H100 80GB HBM3"])
    aligned = shape(8192, 4096, 4096, "bf16", 460.0)  # 275 GFLOP at ~60% of 989
    slow = shape(8192, 50257, 4096, "bf16", 11000.0)  # 3.37 TFLOP at ~31%
    fast = shape(8192, 50257, 4096, "bf16", 6000.0)  # at ~57%: within misaligned_share of the aligned
    out = GemmBelowPeak._rank(GemmBelowPeak(), rank(aligned, slow), hw, T)
    assert out["kind"] == "misaligned" and out["target"] == "bf16" and out["found"] == [slow]
    assert out["efficiency"] == pytest.approx(aligned.timed_flops / 989e6 / 460.0)
    assert GemmBelowPeak._rank(GemmBelowPeak(), rank(aligned, fast), hw, T) is None
    assert GemmBelowPeak._rank(GemmBelowPeak(), rank(slow), hw, T) is None  # nothing aligned to compare with
