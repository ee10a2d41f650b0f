"""FLOPs from recorded shapes against the generator's truth (issue 29): the generator knows every
GEMM's m, n, k and every attention's sizes (analyzer.synth.compute, its own count, and each op's
kernels); tracecliff reads them back from the record_shapes-style args. FLOPs per step exact,
TFLOP/s per family within 1%, every GEMM shape found with its count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.synth import SCENARIOS, JobSpec, write_job

JOBS = {
    "ddp": replace(SCENARIOS["ddp_healthy_8r"], n_layers=2, steps=3, world_size=4, gpus_per_node=4),
    "fsdp_bias": JobSpec(strategy="fsdp2", n_layers=2, hidden=2048, seq_len=1024, world_size=4, gpus_per_node=4,
                         steps=3, bias=True),
    "small_gemms": JobSpec(n_layers=2, hidden=1024, seq_len=512, micro_batch=1, world_size=2, gpus_per_node=2,
                           steps=3, gemm_half_flops=2e11, gpu="A100"),
    "fp32": JobSpec(n_layers=1, hidden=1024, seq_len=512, world_size=2, gpus_per_node=2, steps=2, gemm_dtype="fp32"),
}


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request, tmp_path_factory):
    spec = JOBS[request.param]
    out = write_job(spec, tmp_path_factory.mktemp(request.param))
    import json
    truth = json.loads((out / "truth.json").read_text())
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))
    return spec, truth, result


def test_flops_per_step_are_exact(job):
    spec, truth, result = job
    steps = truth["compute"]["steps"]
    for rank in result.ranks:
        got = rank.compute_steps["steps"]
        assert set(got) == set(steps)
        for number, want in steps.items():
            shapes = got[number]["shapes"]
            assert got[number]["unknown"]["ops"] == 0
            assert sum(r["flops"] for r in shapes) == want["flops"]
            for family, cell in want["families"].items():
                assert sum(r["flops"] for r in shapes if r["family"] == family) == cell["flops"]
                assert sum(r["count"] for r in shapes if r["family"] == family) == cell["ops"]


def test_tflops_per_family_within_one_percent(job):
    spec, truth, result = job
    typical = result.model.typical.step
    want = truth["compute"]["steps"][str(typical)]["families"]
    for rank in result.ranks:
        figures = rank.compute["by_family"]
        for family, cell in want.items():
            true_tflops = cell["flops"] / (cell["gpu_us"][rank.rank] * 1e6)
            assert figures[family]["tflops_per_s"] == pytest.approx(true_tflops, rel=0.01)
            assert figures[family]["gpu_us"] == pytest.approx(cell["gpu_us"][rank.rank], rel=1e-6)
        assert rank.compute["flops_per_step"] == truth["compute"]["steps"][str(typical)]["flops"]
        assert rank.compute["dtype"] == spec.gemm_dtype


def test_every_gemm_shape_is_found(job):
    spec, truth, result = job
    typical = str(result.model.typical.step)
    for rank in result.ranks:
        rows = rank.compute_steps["steps"][typical]["shapes"]
        found = {}
        for r in rows:
            if r["family"] == "gemm":
                key = (r["dims"]["m"], r["dims"]["n"], r["dims"]["k"])
                found[key] = found.get(key, 0) + r["count"]
                assert r["dims"]["b"] == 1
        want = {}
        for s in truth["compute"]["steps"][typical]["gemm_shapes"]:
            want[(s["m"], s["n"], s["k"])] = want.get((s["m"], s["n"], s["k"]), 0) + s["count"]
        assert found == want


def test_mfu_is_the_steps_flops_at_peak_over_its_time(job):
    spec, truth, result = job
    compute = result.model.compute
    peak = spec.gpu_model.peak_fp32_tflops if spec.gemm_dtype == "fp32" else spec.gpu_model.peak_bf16_tflops
    flops = truth["compute"]["steps"][str(result.model.typical.step)]["flops"]
    step_us = result.model.step_time_us
    if spec.gemm_dtype == "fp32":  # fp32 GEMMs at the fp32 peak, the bf16 attention at the bf16 one
        fams = truth["compute"]["steps"][str(result.model.typical.step)]["families"]
        ideal_us = fams["gemm"]["flops"] / (peak * 1e6) + fams["attention"]["flops"] / (spec.gpu_model.peak_bf16_tflops * 1e6)
    else:
        ideal_us = flops / (peak * 1e6)
    assert compute.mfu == pytest.approx(ideal_us / step_us, rel=1e-4)
    assert compute.flops_per_step == flops
    assert 0 < compute.mfu < compute.compute_mfu < 1


def test_gemm_efficiency_falls_with_size_when_the_generator_says_so(tmp_path):
    spec = JOBS["small_gemms"]
    out = write_job(spec, tmp_path)
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))
    buckets = result.model.compute.buckets("gemm")
    rates = [b[1].tflops_per_s for b in buckets]  # largest GEMMs first
    assert len(rates) >= 2 and rates == sorted(rates, reverse=True)
    for _, figures in buckets:
        assert figures.pct_of_peak < 100 * spec.gemm_efficiency


def test_gate_and_diff_metrics_from_shapes(job):
    """shapes_mfu and gemm_tflops: the typical step's figures, one sample per steady rank-step
    made the same way."""
    from analyzer.compare.metrics import run_metrics
    spec, truth, result = job
    metrics = run_metrics(result)
    compute = result.model.compute
    assert metrics["shapes_mfu"].typical == compute.mfu
    assert metrics["gemm_tflops"].typical == compute.families["gemm"].tflops_per_s
    typical = [s for s in metrics["shapes_mfu"].samples if s.step == compute.step]
    by_rank = {r.rank: r for r in compute.ranks}
    assert len(typical) == len(compute.ranks) and all(s.value == by_rank[s.rank].mfu for s in typical)
    steady = {(s.rank, s.step) for s in result.model.rank_steps() if s.role in ("typical", "steady")}
    assert {(s.rank, s.step) for s in metrics["gemm_tflops"].samples} == steady


def test_compute_df(job):
    from analyzer.job import frames
    spec, truth, result = job
    df = result.compute_df()
    assert list(df.columns) == list(frames.COMPUTE_COLUMNS)
    totals = df.groupby(["rank", "step"])["flops"].sum()
    for (_, step), flops in totals.items():
        assert flops == truth["compute"]["steps"][str(step)]["flops"]
    typical = df[df["role"] == "typical"]
    assert set(typical["step"]) == {result.model.typical.step}
    gemm = typical[typical["family"] == "gemm"]
    assert (gemm["gpu_us"] > 0).all() and (gemm["pct_of_peak"] > 0).all()


def test_compute_df_without_shapes_has_the_columns(tmp_path):
    from analyzer.job import frames
    out = write_job(JobSpec(n_layers=1, hidden=1024, seq_len=512, world_size=2, gpus_per_node=2, steps=2,
                            record_shapes=False), tmp_path)
    df = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1)).compute_df()
    assert list(df.columns) == list(frames.COMPUTE_COLUMNS) and len(df) == 0
