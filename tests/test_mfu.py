"""MFU / HFU per step (models.md §6)."""

import pytest

from analyzer.job.mfu import compute_mfu

PEAK_H100 = {"value": 989, "origin": "profile", "source": "test"}


def test_models_md_worked_example():
    # 4,200 tokens/s per GPU on a 7B model, H100: 176.4 TFLOPS per GPU = 17.8% MFU.
    # 8 GPUs, one step per second -> 33,600 tokens per step.
    out = compute_mfu({1: 1e6, 2: 1e6}, 7e9, 4200 * 8, 8, PEAK_H100)
    (first, second) = out["per_step"]
    assert first["achieved_tflops_per_gpu"] == pytest.approx(176.4)
    assert first["mfu"] == pytest.approx(176.4 / 989, abs=1e-6)
    assert round(100 * first["mfu"], 1) == 17.8
    assert first["hfu_with_recompute"] == pytest.approx(first["mfu"] * 8 / 6, abs=1e-6)
    assert out["mfu_mean"] == pytest.approx(first["mfu"], abs=1e-6)
    assert "--tokens-per-step" in out["source"]


def test_step_time_scales_mfu():
    out = compute_mfu({1: 1e6, 2: 2e6}, 7e9, 33600, 8, PEAK_H100)
    assert out["per_step"][1]["mfu"] == pytest.approx(out["per_step"][0]["mfu"] / 2, abs=1e-6)


@pytest.mark.parametrize("psi,tokens,peak", [(None, 1000, 989), (7e9, None, 989), (7e9, 1000, None)])
def test_missing_inputs_give_no_number_and_say_why(psi, tokens, peak):
    out = compute_mfu({1: 1e6}, psi, tokens, 8, {"value": peak, "origin": "unknown", "source": ""})
    assert out["mfu_mean"] is None and out["per_step"] == [] and out["source"] is None
    assert out["note"].startswith("model-parameter MFU needs")


def test_diagnose_reports_mfu_per_step(tmp_path, capsys):
    import dataclasses
    import json

    from analyzer.cli.main import main
    from analyzer.synth import SCENARIOS, write_job

    spec = dataclasses.replace(SCENARIOS["ddp_healthy_8r"], n_layers=1, steps=2)
    files = sorted(str(p) for p in write_job(spec, tmp_path).glob("rank-*.json.gz"))
    tokens = spec.world_size * spec.micro_batch * spec.seq_len
    with pytest.raises(SystemExit) as code:
        main(["diagnose", *files, "--format", "json", "--model-params", "1e9", "--tokens-per-step", str(tokens)])
    assert code.value.code in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    mfu = doc["mfu"]
    assert mfu["peak_tflops"]["value"] == 989 and mfu["n_gpus"] == 8
    assert [s["step"] for s in mfu["per_step"]] == [5, 6]
    for entry in mfu["per_step"]:
        times = [s["step_time_us"] for r in doc["ranks"] for s in r["steps"] if s["step"] == entry["step"]]
        step_s = sum(times) / len(times) / 1e6
        assert entry["mfu"] == pytest.approx(tokens / step_s * 6e9 / (8 * 989e12), rel=1e-4)
