"""The ``mfu`` section: two MFUs that count different things (models.md §6).

- **Model-parameter MFU** (PaLM appendix B), the section's own keys: FLOPs per token ``6Ψ``
  from ``--model-params`` Ψ, tokens per step (the whole job's, i.e. global batch × sequence
  length) from ``--tokens-per-step``; MFU = tokens/s × 6Ψ / (N × bf16 peak). HFU counts ``8Ψ``
  when activations are recomputed; a trace does not say whether they are, so HFU is reported for
  both cases. Without Ψ or tokens nothing is computed: the note says what is missing.
- **MFU from recorded shapes** (``from_shapes``, analyzer.job.compute): the FLOPs the typical
  step's ops did (their shapes, no flags needed), each at the peak of its dtype, over the step's
  time; a recomputed forward counts again there (it ran), so it is nearer HFU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.job.compute import rank_hardware
from analyzer.model import formulas as models


def job_step_times(ranks: list[Any]) -> dict[int, float]:
    """Step number -> mean step time (µs) over the ranks that have the step."""
    times: dict[int, list[float]] = {}
    for r in ranks:
        for s in r.steps:
            if s.get("step_time_us"):
                times.setdefault(s["step"], []).append(float(s["step_time_us"]))
    return {step: float(np.mean(v)) for step, v in sorted(times.items())}


def job_peak(ranks: list[Any], hardware: Any) -> dict[str, Any]:
    """The bf16 peak of the model-parameter MFU's denominator (N × peak): the job's GPU's; ranks
    on different GPUs: the mean of their own peaks, so that N × peak is the sum of the GPUs' peaks."""
    peaks = [h.peak_tflops for h in rank_hardware(ranks, hardware).values()]
    if len({p.value for p in peaks}) <= 1:
        return hardware.peak_tflops.to_dict()
    if any(p.value is None for p in peaks):
        return {"value": None, "origin": "unknown", "source": "the ranks run on different GPUs and one has no "
                "bf16 peak in the hardware profiles"}
    mean = float(np.mean([p.value for p in peaks]))
    return {"value": round(mean, 3), "origin": "profile",
            "source": f"mean of the {len(peaks)} ranks' own GPUs' bf16 peaks (the ranks' GPUs differ)"}


MODEL_PARAMS_LABEL = "model-parameter MFU: 6Ψ per token (--model-params) × tokens per step (--tokens-per-step)"


def compute_mfu(step_times_us: dict[int, float], model_params: float | None,
                tokens_per_step: float | None, n_gpus: int | None,
                peak: dict[str, Any], from_shapes: dict[str, Any] | None = None) -> dict[str, Any]:
    """``peak``: ``{"value": TFLOPS or None, "origin", "source"}`` from the hardware assumptions;
    ``from_shapes``: the job's compute figures (analyzer.job.compute.job_compute), kept as they
    are under that key."""
    missing = [name for name, value in (("--model-params", model_params),
                                        ("--tokens-per-step", tokens_per_step),
                                        ("the number of GPUs", n_gpus),
                                        ("the GPU's peak TFLOPS (pass --gpu)", peak.get("value")))
               if not value]
    out: dict[str, Any] = {"model_params": model_params, "tokens_per_step": tokens_per_step,
                           "n_gpus": n_gpus, "peak_tflops": peak, "label": MODEL_PARAMS_LABEL}
    if from_shapes is not None:
        out["from_shapes"] = from_shapes
    if missing:
        shapes = ("; MFU from the recorded shapes is in from_shapes" if from_shapes is not None else
                  "; no op with recorded shapes gives FLOPs either (profile with record_shapes=True)")
        out.update(source=None, per_step=[], mfu_mean=None,
                   note="model-parameter MFU needs " + ", ".join(missing) + shapes)
        return out
    per_step = []
    for step, time_us in step_times_us.items():
        tokens_per_s = tokens_per_step / (time_us * 1e-6)
        per_step.append({
            "step": step, "step_time_us": round(time_us, 3), "tokens_per_s": round(tokens_per_s, 3),
            "achieved_tflops_per_gpu": round(models.achieved_tflops_per_gpu(tokens_per_s, model_params, n_gpus), 4),
            "mfu": round(models.mfu(tokens_per_s, model_params, n_gpus, peak["value"]), 6),
            "hfu_with_recompute": round(models.hfu(tokens_per_s, model_params, n_gpus, peak["value"],
                                                   recompute=True), 6),
        })
    mean = float(np.mean([s["mfu"] for s in per_step])) if per_step else None
    out.update(source="6Ψ per token from --model-params and --tokens-per-step (global tokens per "
                      "step); step time = mean over ranks", per_step=per_step,
               flops_per_token=models.flops_per_token(model_params),
               mfu_mean=round(mean, 6) if mean is not None else None,
               note="HFU equals MFU without activation recomputation; hfu_with_recompute counts 8Ψ")
    return out
