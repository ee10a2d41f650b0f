"""The strong-scaling compute cliff (issue 29): the same global batch on 8 and on 32 GPUs, the
generator's GEMMs running further from peak as they shrink (gemm_half_flops), is a finding of
``tracecliff diff`` with the measured TFLOP/s per size and the fix, its numbers the generator's
own; the same pair with size-independent GEMM efficiency scales well and stays quiet."""

from __future__ import annotations

import json

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.compare.diff import diff_runs
from analyzer.reports.diff_html import DiffHtmlRenderer
from analyzer.reports.diff_text import DiffTextRenderer
from analyzer.synth import JobSpec, write_job

COMMON = dict(n_layers=2, hidden=2048, seq_len=1024, steps=3, gpus_per_node=8)
GLOBAL_BATCH = 64  # sequences per step: 8 per GPU on 8 GPUs, 2 per GPU on 32


def pair(root, half_flops):
    runs = []
    for gpus in (8, 32):
        spec = JobSpec(name=f"g{gpus}", world_size=gpus, micro_batch=GLOBAL_BATCH // gpus, gemm_half_flops=half_flops,
                       **COMMON)
        out = write_job(spec, root / f"{half_flops:g}-{gpus}")
        runs.append((diagnose([str(out)], DiagnoseOptions(workers=1)), json.loads((out / "truth.json").read_text())))
    return runs


@pytest.fixture(scope="module")
def cliff(tmp_path_factory):
    return pair(tmp_path_factory.mktemp("cliff"), 1e11)


@pytest.fixture(scope="module")
def scales_well(tmp_path_factory):
    return pair(tmp_path_factory.mktemp("fine"), 0.0)


def truth_figures(result, truth):
    """(FLOPs per GPU, GEMM TFLOP/s, FLOP kernels µs) of the typical step, mean over ranks."""
    step = truth["compute"]["steps"][str(result.model.typical.step)]
    fams = step["families"]
    gemm_us = sum(fams["gemm"]["gpu_us"]) / len(fams["gemm"]["gpu_us"])
    kernels_us = sum(sum(f["gpu_us"]) / len(f["gpu_us"]) for f in fams.values())
    return step["flops"], fams["gemm"]["flops"] / (gemm_us * 1e6), kernels_us


def test_the_cliff_is_found_with_the_generators_numbers(cliff):
    (base, base_truth), (new, new_truth) = cliff
    doc = diff_runs(base, new)
    c = doc["compute"]
    assert doc["scaling"]["kind"] == c["kind"] == "strong scaling"
    fb, gb, kb = truth_figures(base, base_truth)
    fa, ga, ka = truth_figures(new, new_truth)
    assert c["base"]["flops_per_step"] == fb and c["new"]["flops_per_step"] == fa
    assert c["work_ratio"] == pytest.approx(0.25)  # 8 -> 2 sequences per GPU
    assert c["base"]["gemm"]["tflops_per_s"] == pytest.approx(gb, rel=0.01)
    assert c["new"]["gemm"]["tflops_per_s"] == pytest.approx(ga, rel=0.01)
    assert ga < 0.9 * gb  # the generator's small GEMMs run further from peak
    expected = kb * 0.25 * (new_truth["compute"]["steps"][str(new.model.typical.step)]["flops"] / fa)
    assert c["expected_counted_us"] == pytest.approx(expected, rel=0.01)
    assert c["excess_compute_us"] == pytest.approx(ka - expected, rel=0.02)
    finding = c["finding"]
    assert finding is not None and finding["code"] == "compute-cliff"
    ev = finding["evidence"]
    assert ev["base_gpus"] == 8 and ev["new_gpus"] == 32 and ev["work_per_gpu_ratio"] == pytest.approx(0.25)
    sizes = ev["gemm_tflops_by_size"]
    assert len(sizes) >= 2 and all(row["bucket"] for row in sizes)
    measured = [row[k] for row in sizes for k in ("base_tflops_per_s", "new_tflops_per_s") if row[k] is not None]
    assert max(measured) <= 989 * 0.6  # never above the generator's best efficiency
    for words in ("8 to 32 GPUs", "same global batch", "4.0×", "TFLOP/s"):
        assert words in finding["summary"]
    for words in ("micro-batch", "gradient accumulation", "fewer GPUs", "sequence packing"):
        assert words in finding["fix"]


def test_the_cliff_is_rendered(cliff):
    (base, _), (new, _) = cliff
    doc = diff_runs(base, new)
    text = DiffTextRenderer().render(doc)
    assert "Strong-scaling efficiency" in text and "compute-cliff" in text and "GEMM TFLOP/s by FLOPs per op" in text
    html = DiffHtmlRenderer().render(doc)
    assert 'id="compute"' in html and "Compute does not scale with the per-GPU batch" in html


def test_a_pair_that_scales_well_stays_quiet(scales_well):
    (base, _), (new, _) = scales_well
    c = diff_runs(base, new)["compute"]
    assert c["kind"] == "strong scaling" and c["work_ratio"] == pytest.approx(0.25)
    assert c["finding"] is None
    assert c["gemm_tflops_change"] == pytest.approx(0.0, abs=0.01)
    assert c["counted_ratio"] == pytest.approx(0.25, rel=0.02)
    assert "compute scales with the per-GPU batch" in " ".join(DiffTextRenderer().render(diff_runs(base, new)).split())


def test_weak_scaling_and_runs_without_shapes(cliff, tmp_path):
    (base, _), _ = cliff
    doc = diff_runs(base, base)
    assert doc["compute"]["available"] and doc["compute"]["finding"] is None and doc["scaling"]["kind"] == "same scale"
    bare = write_job(JobSpec(name="bare", world_size=2, gpus_per_node=2, n_layers=1, hidden=1024, seq_len=512,
                             steps=2, record_shapes=False), tmp_path / "bare")
    run = diagnose([str(bare)], DiagnoseOptions(workers=1))
    assert not run.model.compute.counted and run.model.compute.mfu is None
    assert "record_shapes=True" in next(iter(run.model.compute.unknown_reasons))
    from analyzer.reports.text import TextRenderer
    assert "compute: FLOPs unknown (no shapes recorded (profile with record_shapes=True))" in TextRenderer().render(run)
    c = diff_runs(base, run)["compute"]
    assert not c["available"] and "record_shapes" in c["reason"]


def test_the_what_if_uses_the_measured_efficiency_per_shape(cliff, scales_well):
    """Strong scaling 8 -> 32 GPUs projected from the 8-GPU run: compute at the efficiency the
    job measures per GEMM size, not perfect scaling; the step within 10% of the 32-GPU run."""
    from analyzer.whatif.projection import Scenario, project
    for (base, _), (new, _), cliff_pair in ((*cliff, True), (*scales_well, False)):
        projection = project(base, Scenario(gpus=32, strong_scaling=True)).to_dict()
        model = projection["projected"]["compute_model"]
        assert model["factor"] == 0.25
        assert projection["assumptions"]["compute"]["value"] == "strong scaling"
        actual = new.model.compute.compute_us
        if cliff_pair:  # the smaller GEMMs run slower: perfect scaling is too optimistic
            assert model["perfect_scaling_us"] < model["projected_us"] <= actual
            assert abs(model["projected_us"] - actual) < 0.5 * abs(model["perfect_scaling_us"] - actual)
        else:
            assert model["projected_us"] == pytest.approx(actual, rel=0.02)
            assert model["perfect_scaling_us"] == pytest.approx(model["projected_us"], rel=0.01)
        assert projection["projected"]["step_time_us"] == pytest.approx(new.model.step_time_us, rel=0.10)
        weak = project(base, Scenario(gpus=32)).to_dict()
        assert "compute_model" not in weak["projected"]
        assert weak["projected"]["compute_us"] == pytest.approx(projection["measured"]["compute_us"], rel=0.02)


def test_the_what_if_command_takes_strong_scaling(cliff, tmp_path, capsys):
    (base, _), _ = cliff
    saved = tmp_path / "base.json"
    saved.write_text(base.to_json())
    from analyzer.cli.main import main
    with pytest.raises(SystemExit) as code:
        main(["whatif", str(saved), "--gpus", "32", "--strong-scaling"])
    assert code.value.code == 0
    out = capsys.readouterr().out
    assert "Compute at 0.25x the work per GPU (strong scaling" in out and "perfect scaling" in out
