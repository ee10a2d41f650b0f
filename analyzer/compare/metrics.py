"""Gate and diff metrics of a run, read from its job model (analyzer.job.model): the same
figures the verdict, the text and the HTML quote.

Each metric has one value, the *typical* figure (the default aggregate: the verdict's), and its
samples over the steady steps (one per rank and steady step: the typical step and the other
steady ones; warm-up, drain and outlier steps are never a sample), which the other aggregates
(median, max, min, p90) and the noise estimates read:

| metric | typical figure | sample per (rank, steady step) | better |
|---|---|---|---|
| ``step_time_us`` | the typical step's time, mean over ranks | the step's time | lower |
| ``exposed_comm_pct`` | 100 · exposed share of the typical step | 100 · (waiting + transfer) / step time | lower |
| ``idle_pct`` | 100 · idle share of the typical step | 100 · GPU idle / step time | lower |
| ``overlap_pct`` | 100 · overlap / comm over the typical step's ranks | 100 · overlap / comm (steps with communication) | higher |
| ``mfu`` | the typical step's model-parameter MFU (``doc["mfu"]``, needs the flags) | per step | higher |
| ``shapes_mfu`` | the typical step's MFU from recorded shapes (``mfu.from_shapes``) | FLOPs at peak / step time | higher |
| ``gemm_tflops`` | the typical step's GEMM TFLOP/s (recorded shapes), over its ranks | the rank-step's GEMMs | higher |
| ``busbw_gbps:<group>`` | median over the group's GPU collectives | each GPU collective (never a CPU op's duration) | higher |

A run without a step breakdown (no ProfilerStep markers) has no ``step_time_us``; its shares are
the whole trace's, one sample per rank, and say so in their basis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.job.model import STEADY, TYPICAL, group_label  # noqa: F401  (group_label: re-exported for the diff)

# "typical": the job model's figure (the verdict's); the rest over the steady samples.
AGGREGATIONS = ("typical", "median", "max", "min", "p90")
DEFAULT_AGGREGATE = "typical"
GROUP_METRIC = "busbw_gbps"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    better: str  # "lower" | "higher"
    description: str


BASE_METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("step_time_us", "µs", "lower", "training step time"),
    MetricSpec("exposed_comm_pct", "%", "lower", "exposed communication / step time"),
    MetricSpec("overlap_pct", "%", "higher", "communication hidden under compute / communication"),
    MetricSpec("idle_pct", "%", "lower", "GPU idle / step time"),
    MetricSpec("mfu", "fraction", "higher", "model FLOPs utilization (6Ψ per token, --model-params)"),
    MetricSpec("shapes_mfu", "fraction", "higher", "MFU of the FLOPs the recorded shapes count"),
    MetricSpec("gemm_tflops", "TFLOP/s", "higher", "achieved GEMM throughput (recorded shapes)"),
)}


@dataclass(frozen=True)
class Sample:
    rank: int | None
    step: int | None
    value: float


@dataclass(frozen=True)
class Metric:
    """One metric of a run: its typical figure, the steady samples, and what the figure is."""

    name: str
    typical: float
    samples: tuple[Sample, ...]
    basis: str  # e.g. "typical step 5, mean over 8 ranks"

    def value(self, how: str = DEFAULT_AGGREGATE) -> float:
        if how == "typical" or not self.samples:
            return self.typical
        return aggregate([s.value for s in self.samples], how)

    def described(self, how: str = DEFAULT_AGGREGATE) -> str:
        """What ``value(how)`` is, in words (for a gate message)."""
        if how == "typical" or not self.samples:
            return self.basis
        return f"{how} of {len(self.samples)} steady sample(s)"


def metric_spec(name: str) -> MetricSpec | None:
    """The spec of a metric name, ``busbw_gbps:<group>`` included; None when unknown."""
    if name in BASE_METRICS:
        return BASE_METRICS[name]
    prefix, _, group = name.partition(":")
    if prefix == GROUP_METRIC and group:
        return MetricSpec(name, "GB/s", "higher", f"bus bandwidth of group {group}")
    return None


def aggregate(values: list[float] | np.ndarray, how: str) -> float:
    """median | max | min | p90 (90th percentile, linear interpolation between samples)."""
    data = np.asarray(values, dtype=np.float64)
    if how == "median":
        return float(np.median(data))
    if how == "max":
        return float(data.max())
    if how == "min":
        return float(data.min())
    if how == "p90":
        return float(np.percentile(data, 90))
    raise ValueError(f"unknown aggregation {how!r}")


# ---------------------------------------------------------------- metrics of a run


def run_metrics(run: Any) -> dict[str, Metric]:
    """Every metric ``run`` (a Result) can give, by name (metrics it cannot measure are absent)."""
    model = run.model
    out: dict[str, Metric] = {}
    steady = [s for s in model.rank_steps() if s.role in (TYPICAL, STEADY) and s.leaves and s.step_time_us > 0]
    typical = model.typical
    if typical is not None and steady:
        basis = f"typical step {typical.step}, mean over {typical.ranks} rank(s)"
        out["step_time_us"] = Metric("step_time_us", typical.step_time_us,
                                     tuple(Sample(s.rank, s.step, s.step_time_us) for s in steady), basis)
        out["exposed_comm_pct"] = Metric("exposed_comm_pct", 100.0 * (typical.exposed_share or 0.0), tuple(
            Sample(s.rank, s.step, 100.0 * s.leaves.exposed_us / s.step_time_us) for s in steady), basis)
        out["idle_pct"] = Metric("idle_pct", 100.0 * (typical.idle_share or 0.0), tuple(
            Sample(s.rank, s.step, 100.0 * s.leaves.idle_us / s.step_time_us) for s in steady), basis)
        with_comm = [s for s in steady if s.comm_us > 0]
        in_typical = [s for s in with_comm if s.role == TYPICAL]
        if in_typical:
            out["overlap_pct"] = Metric(
                "overlap_pct", 100.0 * sum(s.overlap_us for s in in_typical) / sum(s.comm_us for s in in_typical),
                tuple(Sample(s.rank, s.step, 100.0 * s.overlap_us / s.comm_us) for s in with_comm),
                f"typical step {typical.step}, overlap / comm over its {len(in_typical)} rank(s)")
    else:
        out.update(_whole_trace(model))
    mfu = _mfu(run.mfu, typical.step if typical else None)
    if mfu is not None:
        out["mfu"] = mfu
    out.update(_compute_metrics(run, steady))
    out.update(_busbw(run))
    return dict(sorted(out.items()))


def _whole_trace(model: Any) -> dict[str, Metric]:
    """Shares over each rank's whole trace (one sample per rank) when no step breakdown exists."""
    ranks = [r for r in model.ranks if r.span_us > 0]
    if not ranks:
        return {}
    basis = f"whole trace, no step breakdown: mean over {len(ranks)} rank(s)"
    exposed = tuple(Sample(r.rank, None, 100.0 * r.exposed_comm_us / r.span_us) for r in ranks)
    out = {"exposed_comm_pct": Metric("exposed_comm_pct", float(np.mean([s.value for s in exposed])), exposed, basis)}
    comm = [r for r in ranks if r.comm_us > 0]
    if comm:
        overlap = tuple(Sample(r.rank, None, 100.0 * r.overlap_us / r.comm_us) for r in comm)
        out["overlap_pct"] = Metric("overlap_pct", 100.0 * sum(r.overlap_us for r in comm) / sum(r.comm_us for r in comm),
                                    overlap, basis)
    return out


def _mfu(section: Any, typical_step: Any) -> Metric | None:
    """MFU from the ``mfu`` section: the typical step's entry, else the mean it states."""
    if not isinstance(section, dict):
        return None
    per_step = [e for e in section.get("per_step") or [] if isinstance(e, dict) and _num(e.get("mfu")) is not None]
    samples = tuple(Sample(None, e.get("step"), float(e["mfu"])) for e in per_step)
    at_typical = next((s.value for s in samples if s.step == typical_step), None)
    if at_typical is not None:
        return Metric("mfu", at_typical, samples, f"typical step {typical_step}")
    mean = _num(section.get("mfu_mean"))
    return None if mean is None else Metric("mfu", mean, samples, "mean over steps")


def _compute_metrics(run: Any, steady: list[Any]) -> dict[str, Metric]:
    """``shapes_mfu`` and ``gemm_tflops``: the job model's typical-step figures (recorded shapes),
    with one sample per steady rank-step made the same way (analyzer.job.compute)."""
    from analyzer.job.compute import rank_compute
    model = run.model
    compute = model.compute
    if compute is None or not compute.timed:
        return {}
    hardware, by_rank = model.hardware, {r.rank: r for r in run.ranks}
    mfu_samples, gemm_samples = [], []
    for s in steady:
        rank = by_rank.get(s.rank)
        doc = rank_compute(rank.compute_steps if rank else None, s.step, s.step_time_us, s.compute_us or None, hardware)
        if doc is None or doc["step"] != s.step:
            continue
        if doc["mfu"] is not None:
            mfu_samples.append(Sample(s.rank, s.step, doc["mfu"]))
        if doc["by_family"]["gemm"]["tflops_per_s"] is not None:
            gemm_samples.append(Sample(s.rank, s.step, doc["by_family"]["gemm"]["tflops_per_s"]))
    basis = f"typical step {compute.step}, recorded shapes, {len(compute.ranks)} rank(s)"
    out = {}
    if compute.mfu is not None:
        out["shapes_mfu"] = Metric("shapes_mfu", compute.mfu, tuple(mfu_samples), basis)
    gemm = compute.families["gemm"].tflops_per_s
    if gemm is not None:
        out["gemm_tflops"] = Metric("gemm_tflops", gemm, tuple(gemm_samples), basis)
    return out


def _busbw(run: Any) -> dict[str, Metric]:
    """``busbw_gbps:<group>``: the bus bandwidth the job analysis gave each GPU collective of
    the group (analyzer.job.commfit); a CPU-side op's duration is no transfer time, never a sample."""
    view = run.model.collectives
    if not view.n:
        return {}
    busbw = view.written("busbw_gbps")
    rows = np.flatnonzero(view.on_gpu & ~np.isnan(busbw))
    by_label: dict[str, list[Sample]] = {}
    collectives = run.collectives
    for i in rows.tolist():
        row = collectives[i]
        label = group_label(row.get("group"))
        if label is not None:
            by_label.setdefault(label, []).append(Sample(row.get("rank"), row.get("step"), float(busbw[i])))
    return {f"{GROUP_METRIC}:{label}": Metric(f"{GROUP_METRIC}:{label}", float(np.median([s.value for s in found])),
                                              tuple(found), f"median of {len(found)} GPU collective(s)")
            for label, found in by_label.items()}


def unavailable_reason(run: Any, name: str) -> str:
    """Why a known metric has no value in this run (for the gate's message)."""
    if name == "mfu":
        return "model-parameter MFU unknown for this run (needs --model-params and --tokens-per-step)"
    if name in ("shapes_mfu", "gemm_tflops"):
        return "no FLOPs from recorded shapes with GPU kernels (profile with record_shapes=True)"
    if name.startswith(GROUP_METRIC + ":"):
        groups = sorted({g for g in (group_label(r.get("group")) for r in run.collectives) if g})
        return f"no GPU collective with a known size in group {name.partition(':')[2]!r} " \
               f"(groups seen: {', '.join(groups) or 'none'})"
    if name == "step_time_us":
        return "no ProfilerStep#N markers: per-step times unavailable"
    if name == "overlap_pct":
        return "no communication on the GPU"
    return "no GPU activity"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# ---------------------------------------------------------------- runs


