"""gemm-below-peak (TC501)."""

from __future__ import annotations

from typing import Annotated, Any

from analyzer.base.units import fmt_pct, fmt_tflops, fmt_us
from analyzer.base.units import shape_text
from analyzer.job.facts import median
from analyzer.model import formulas as models
from analyzer.rules.evidence_types import Count, Evidence, Pct, Share, Text, Tflops, Us, label
from analyzer.rules.evidence_shared import PredictedStep, RankNumber, TypicalStep
from analyzer.rules.engine import MIN_GAIN_FRACTION, NotEvaluated, Rule, Threshold, register

LOW_PRECISION = ("bf16", "fp16")


class GemmRow(Evidence, frozen=True, forbid_unknown_fields=True):
    """One GEMM shape below its peak."""

    op: Annotated[Text, label("op")]
    shape: Annotated[Text, label("shape")]
    dtype: Annotated[Text, label("dtype")]
    count: Annotated[Count, label("count")]
    gpu_us: Annotated[Us, label("GPU time")]
    tflops_per_s: Annotated[Tflops, label("achieved")]
    pct_of_peak: Annotated[Pct, label("of peak")]


class GemmBelowPeakEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    kind: Annotated[Text, label("kind")]
    rank: RankNumber
    gemms: Annotated[list[GemmRow], label("GEMMs")]
    target_dtype: Annotated[Text, label("target dtype")]
    target_peak_tflops: Annotated[Tflops, label("target peak")]
    reference_efficiency: Annotated[Share, label("reference efficiency")]
    reference_source: Annotated[Text, label("reference from")]
    gemm_time_us: Annotated[Us, label("GEMM time")]
    predicted_gemm_time_us: Annotated[Us, label("predicted GEMM time")]
    step_time_us: TypicalStep
    predicted_step_time_us: PredictedStep


@register
class GemmBelowPeak(Rule):
    """Large matrix multiplies run far below the GPU's peak for a reason the shapes and dtypes
    show: fp32 GEMMs on tensor-core hardware, or low-precision GEMMs with sizes tensor cores
    cannot tile.

    What it detects:
        In the typical step, GEMMs of at least ``min_gemm_flops`` FLOPs each (small ones are
        bound by launch and tile count, not by the math units) whose FLOPs (from the recorded
        shapes, analyzer.job.compute) run (a) in fp32 on the CUDA cores of a GPU whose bf16 /
        fp16 (or TF32) tensor cores are many times faster: the peak itself says they cannot get
        near it, or (b) in bf16 / fp16 with a size not a multiple of 8 (tensor cores need
        16-byte-aligned leading sizes) and at under ``misaligned_share`` of the efficiency the
        job's aligned GEMMs of the same dtype reach.

    Why it matters:
        GEMMs are most of a transformer's FLOPs: an H100 runs fp32 matrix math at 67 TFLOPS on
        CUDA cores and bf16 at 989 on tensor cores (14.8×; TF32: 494.5); a misaligned size
        falls back to slower kernels or wastes padded tiles. The step pays it as compute time no
        scaling change can recover.

    Evidence:
        The GEMMs found (op, m × n × k, dtype, count, GPU time, TFLOP/s, % of peak), the target
        dtype and its peak, the reference efficiency and where it comes from, the kernel time
        they would take, and the typical step's time.

    Fix:
        fp32 where bf16 was meant (other ops already run in bf16): run the layers under
        ``torch.autocast(device_type="cuda", dtype=torch.bfloat16)`` (a module outside the autocast
        region, a ``.float()`` cast, a head kept in fp32). All fp32: allow TF32 for matmuls
        (``torch.set_float32_matmul_precision("high")``), or train in bf16. Misaligned: pad the
        size to a multiple of 64 (a vocabulary of 50,257 to 50,304; hidden sizes, heads × dim).

    References:
        docs/models.md §6 (FLOPs from shapes, achieved TFLOP/s, peaks); NVIDIA, "Matrix
        Multiplication Background User's Guide" (tensor-core alignment); NVIDIA H100 / A100
        datasheets (fp32, TF32, bf16 peaks).
    """

    name = "gemm-below-peak"
    code = "TC501"
    title = "Large GEMMs run on the tensor cores at their dtype's peak"
    failure_title = "Large GEMMs run far below the GPU's peak (fp32 on tensor-core hardware, or misaligned sizes)"
    severity = "warning"
    needs = ("gpu_steps",)
    fix_requires = ()  # its fix follows the GEMMs' own dtype and shapes (no job premise)
    thresholds = {
        "min_gemm_flops": Threshold(1e9, "FLOPs of one GEMM from which it counts as large (FLOPs)", 0.0),
        "reference_efficiency": Threshold(0.6, "share of the target dtype's dense peak a large GEMM reaches, "
                                          "assumed when the job has no large GEMM of that dtype to measure it "
                                          "(cuBLAS on large bf16 GEMMs: 0.6-0.8)", 0.01, 1.0),
        "misaligned_share": Threshold(0.7, "a misaligned bf16/fp16 GEMM fires below this share of the "
                                      "efficiency of the job's aligned GEMMs of its dtype", 0.0, 1.0),
        "min_gain_fraction": MIN_GAIN_FRACTION,
    }
    recovers = ("compute_only_us",)
    references = ("docs/models.md §6", "NVIDIA, Matrix Multiplication Background User's Guide (tensor-core "
                  "alignment)", "NVIDIA H100 and A100 datasheets")

    Evidence = GemmBelowPeakEvidence

    def check(self, ctx):
        compute = ctx.model.compute
        if compute is None or not compute.counted:
            raise NotEvaluated("no FLOPs from recorded shapes (profile with record_shapes=True)")
        if not compute.timed:
            raise NotEvaluated("no GPU kernels linked to the ops with FLOPs")
        hw = ctx.model.hardware
        if not hw.peak_of("bf16").value or not hw.peak_of("fp32").value:
            raise NotEvaluated("the GPU's peaks are unknown (no hardware profile: pass --gpu)")
        t = ctx.thresholds
        per_rank = [self._rank(rank, hw, t) for rank in compute.ranks]
        per_rank = [p for p in per_rank if p is not None]
        if not per_rank:
            return []
        step_us = ctx.model.step_time_us
        gain = median(p["gain_us"] for p in per_rank)
        if not step_us or gain < t["min_gain_fraction"] * step_us:
            return []
        rep = sorted(per_rank, key=lambda p: (p["gain_us"], p["rank"]))[len(per_rank) // 2]
        return [self._finding(ctx, rep, per_rank, gain, step_us, hw)]

    # ------------------------------------------------------------------ one rank
    def _rank(self, rank, hw, t) -> dict[str, Any] | None:
        shapes = rank.step_shapes or rank.shapes
        large = [s for s in shapes if s.family == "gemm" and (s.flops_each or 0) >= t["min_gemm_flops"]
                 and s.gpu_us > 0 and s.timed_flops > 0]
        low = {s.dtype for s in shapes if s.family in ("gemm", "attention") and s.dtype in LOW_PRECISION}
        fp32 = [s for s in large if s.dtype == "fp32"]
        if fp32:
            # no TF32 (V100): fp16 tensor cores; mixed precision in use elsewhere: bf16; else TF32
            target = "fp16" if not hw.peak_of("tf32").value else "bf16" if low else "tf32"
            reference = [s for s in large if s.dtype in LOW_PRECISION and _aligned(s)] if target != "tf32" else \
                [s for s in large if s.dtype == "tf32"]
            return self._gain(rank, "fp32", fp32, target, reference, hw, t, low)
        misaligned = []
        for dtype in LOW_PRECISION:
            aligned = [s for s in large if s.dtype == dtype and _aligned(s)]
            ref = _efficiency(aligned, hw, dtype)
            if ref is None:
                continue  # no aligned GEMM of this dtype to compare with: the physics is not shown
            misaligned += [s for s in large if s.dtype == dtype and not _aligned(s)
                           and _efficiency([s], hw, dtype) < t["misaligned_share"] * ref]
            if misaligned:
                return self._gain(rank, "misaligned", misaligned, dtype, aligned, hw, t, low)
        return None

    @staticmethod
    def _gain(rank, kind, found, target, reference, hw, t, low) -> dict[str, Any] | None:
        peak = hw.peak_of(target).value
        measured = _efficiency(reference, hw, target)
        efficiency = measured if measured is not None else t["reference_efficiency"]
        source = (f"measured: the job's large {target} GEMMs{' with aligned sizes' if kind == 'misaligned' else ''}"
                  if measured is not None else "assumed (threshold reference_efficiency): no large "
                  f"{target} GEMM in the job to measure it on")
        now = sum(s.gpu_us for s in found)
        then = sum(models.time_at_peak_us(s.timed_flops, peak) / efficiency for s in found)
        if then >= now:
            return None
        return {"rank": rank.rank, "step": rank.step, "kind": kind, "found": found, "target": target, "peak": peak,
                "efficiency": efficiency, "source": source, "now_us": now, "then_us": then, "gain_us": now - then,
                "low_precision": sorted(low)}

    # ------------------------------------------------------------------ the finding
    def _finding(self, ctx, rep, per_rank, gain, step_us, hw):
        found, target = rep["found"], rep["target"]
        flops = sum(s.timed_flops for s in found)
        rate = models.achieved_tflops(flops, rep["now_us"])
        if rep["kind"] == "fp32":
            own = hw.peak_of("fp32").value
            what = (f"{sum(s.count for s in found)} large fp32 GEMMs run at {fmt_tflops(rate)} "
                    f"({fmt_pct(100 * rate / own)} of the {fmt_tflops(own)} fp32 peak, "
                    f"{fmt_pct(100 * rate / rep['peak'])} of the {target} tensor-core peak of {fmt_tflops(rep['peak'])})")
            why = (f"while the job's other ops run in {'/'.join(rep['low_precision'])} (these were left out of mixed "
                   "precision)") if rep["low_precision"] else "with no mixed precision in the job"
            torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(target)
            fix = (f"Run these layers in {target} (under torch.autocast, or without the fp32 cast that keeps them out)."
                   if torch_dtype else "Allow TF32 for fp32 matmuls, or train in bf16.")
            snippet = (f'with torch.autocast(device_type="cuda", dtype=torch.{torch_dtype}):\n    loss = model(batch)'
                       if torch_dtype else 'torch.set_float32_matmul_precision("high")  # TF32 tensor cores')
        else:
            what = (f"{sum(s.count for s in found)} large {target} GEMMs with a size not a multiple of 8 run at "
                    f"{fmt_tflops(rate)} ({fmt_pct(100 * rate / rep['peak'])} of peak) while the aligned ones reach "
                    f"{fmt_pct(100 * rep['efficiency'])}")
            why = "(tensor cores tile 16-byte-aligned sizes)"
            fix = "Pad the misaligned size to a multiple of 64 (a vocabulary of 50,257 to 50,304, say)."
            snippet = "vocab_size = (vocab_size + 63) // 64 * 64  # pad; mask the extra logits"
        summary = (f"{what} {why}; at {fmt_pct(100 * rep['efficiency'])} of the {target} peak they would take "
                   f"{fmt_us(rep['then_us'])} instead of {fmt_us(rep['now_us'])}: about {fmt_us(gain)} of the "
                   f"{fmt_us(step_us)} typical step (median over {len(per_rank)} rank(s)).")
        rows = [GemmRow(op=s.op, shape=shape_text(s.dims), dtype=s.dtype, count=s.count, gpu_us=round(s.gpu_us, 1),
                        tflops_per_s=s.tflops_per_s, pct_of_peak=s.pct_of_peak)
                for s in sorted(found, key=lambda s: -s.gpu_us)[:8]]
        evidence = GemmBelowPeakEvidence(
            kind=rep["kind"], rank=rep["rank"], gemms=rows, target_dtype=target,
            target_peak_tflops=rep["peak"], reference_efficiency=round(rep["efficiency"], 4),
            reference_source=rep["source"], gemm_time_us=round(rep["now_us"], 1),
            predicted_gemm_time_us=round(rep["then_us"], 1), step_time_us=round(step_us, 1),
            predicted_step_time_us=round(step_us - gain, 1))
        model = (f"gain = Σ over these GEMMs (rank {rep['rank']}) of measured time − FLOPs / ({target} peak "
                 f"{rep['peak']:g} TFLOPS × efficiency {rep['efficiency']:.2f}) = {fmt_us(rep['now_us'])} − "
                 f"{fmt_us(rep['then_us'])}; the rest of the step as measured (models.md §6)")
        return ctx.finding(summary=summary, ranks=[p["rank"] for p in per_rank],
                           steps=sorted({p["step"] for p in per_rank if p["step"] is not None}), evidence=evidence,
                           estimated_gain_us=gain, model=model, fix_text=fix, fix_snippet=snippet)


def _aligned(shape) -> bool:
    """All of m, n, k multiples of 8 (16 bytes of bf16/fp16: what tensor cores tile)."""
    sizes = [shape.dim(k) for k in ("m", "n", "k")]
    return all(v is not None and v % 8 == 0 for v in sizes)


def _efficiency(shapes, hw, dtype: str) -> float | None:
    """The share of ``dtype``'s peak these GEMMs reach together (their FLOPs at that peak over
    their time), None when there are none."""
    peak = hw.peak_of(dtype).value
    time = sum(s.gpu_us for s in shapes)
    if not shapes or not peak or time <= 0:
        return None
    return models.flops_utilization(models.time_at_peak_us(sum(s.timed_flops for s in shapes), peak), time)
