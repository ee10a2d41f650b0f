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
| ``peak_allocated_bytes`` | the highest peak allocated memory of any rank in any step (``memory``; allocator events) | the rank-step's peak | lower |
| ``peak_reserved_bytes`` | the same, reserved by the caching allocator | the rank-step's peak | lower |
| ``busbw_gbps:<group>`` | the typical step's bus bytes / transfer time of the group's measured collectives (analyzer.job.busbw) | the same per rank-step | higher |

A run without a step breakdown (no ProfilerStep markers) has no ``step_time_us``; its shares are
the whole trace's, one sample per rank, and say so in their basis (``scope`` "trace").

Besides the figures, the checks the gate makes of them, defined here once: the run's own spread
(``spread``: the robust σ of its figure from one steady step to the next, the ranks' structural
offsets removed), why a metric is missing from a run
(``unavailable_reason``) and whether a figure is physically possible (``implausible``; a bus
bandwidth above its link's peak: ``busbw_ceiling``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.job.model import STEADY, TYPICAL, group_label  # noqa: F401  (group_label: re-exported for the diff)
from analyzer.base.numbers import finite

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
    # How a change is measured against a baseline: "share" (a percentage of the step:
    # in percentage points) or "relative" (in % of the baseline figure); ``floor``: the smallest
    # change that can count, in the metric's unit (points for a share; docs/ci.md says why)
    compare: str = "relative"
    floor: float = 0.0


# Smallest changes that count (docs/ci.md, "Noise-aware thresholds"): a step-time change under
# 10 µs is within launch jitter and the traces' 1 µs timestamps; busbw under 0.5 GB/s and MFU
# under half a point are below what a rerun of the same job reproduces. Shares take their floor
# from the configuration (``max_regression_pp``).
STEP_TIME_FLOOR_US = 10.0
BUSBW_FLOOR_GBPS = 0.5
MFU_FLOOR = 0.005
GEMM_TFLOPS_FLOOR = 1.0  # TFLOP/s: below what a rerun of the same GEMMs reproduces
MEMORY_FLOOR_BYTES = 64 * 2**20  # the allocator rounds to 2 MiB segments; workspaces vary by tens of MiB

BASE_METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("step_time_us", "µs", "lower", "training step time", "relative", STEP_TIME_FLOOR_US),
    MetricSpec("exposed_comm_pct", "%", "lower", "exposed communication / step time", "share"),
    MetricSpec("overlap_pct", "%", "higher", "communication hidden under compute / communication", "share"),
    MetricSpec("idle_pct", "%", "lower", "GPU idle / step time", "share"),
    MetricSpec("mfu", "fraction", "higher", "model FLOPs utilization (6Ψ per token, --model-params)", "relative", MFU_FLOOR),
    MetricSpec("shapes_mfu", "fraction", "higher", "MFU of the FLOPs the recorded shapes count", "relative", MFU_FLOOR),
    MetricSpec("gemm_tflops", "TFLOP/s", "higher", "achieved GEMM throughput (recorded shapes)", "relative",
               GEMM_TFLOPS_FLOOR),
    MetricSpec("peak_allocated_bytes", "B", "lower", "peak allocated GPU memory (allocator events)", "relative",
               MEMORY_FLOOR_BYTES),
    MetricSpec("peak_reserved_bytes", "B", "lower", "peak memory reserved by the caching allocator", "relative",
               MEMORY_FLOOR_BYTES),
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
    scope: str = "step"  # "step": of the typical step; "trace": of the whole trace (no step markers)

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
        return MetricSpec(name, "GB/s", "higher", f"bus bandwidth of group {group}", "relative", BUSBW_FLOOR_GBPS)
    return None


METRIC_NAMES = (*BASE_METRICS, f"{GROUP_METRIC}:<group>")  # for messages: every name the gate knows


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
            Sample(s.rank, s.step, 100.0 * (s.leaves.exposed_share or 0.0)) for s in steady), basis)
        out["idle_pct"] = Metric("idle_pct", 100.0 * (typical.idle_share or 0.0), tuple(
            Sample(s.rank, s.step, 100.0 * (s.leaves.idle_share or 0.0)) for s in steady), basis)
        with_comm = [s for s in steady if s.comm_us > 0]
        in_typical = [s for s in with_comm if s.role == TYPICAL]
        if in_typical and model.overlap_share is not None:
            out["overlap_pct"] = Metric(
                "overlap_pct", 100.0 * model.overlap_share,
                tuple(Sample(s.rank, s.step, 100.0 * (s.overlap_share or 0.0)) for s in with_comm),
                f"typical step {typical.step}, overlap / comm over its {len(in_typical)} rank(s)")
    else:
        out.update(_whole_trace(model))
    mfu = _mfu(run.mfu, typical.step if typical else None)
    if mfu is not None:
        out["mfu"] = mfu
    out.update(_compute_metrics(run, steady))
    out.update(_busbw(run))
    out.update(_memory(run.memory, {(s.rank, s.step) for s in steady}))
    return dict(sorted(out.items()))


def _memory(section: Any, steady: set[tuple[int, int]]) -> dict[str, Metric]:
    """``peak_allocated_bytes`` / ``peak_reserved_bytes``: the ``memory`` section's job figure
    (the highest of any rank in any step: the one every view quotes), with a sample per rank
    and steady step (none in a run without a step breakdown: its noise is then unknown)."""
    if not isinstance(section, dict) or not section.get("recorded"):
        return {}
    out = {}
    relative = " (relative: above what was held when the profiler started)" if section.get("relative") else ""
    for name in ("peak_allocated_bytes", "peak_reserved_bytes"):
        figure = finite(section.get(name))
        if figure is None:
            continue
        pairs = [(m["rank"], s["step"], s.get(name)) for m in section.get("ranks") or [] for s in m.get("steps") or []
                 if finite(s.get(name)) is not None]
        kept = [p for p in pairs if (p[0], p[1]) in steady]  # warm-up, drain and outliers are never a sample
        out[name] = Metric(name, figure, tuple(Sample(r, st, float(v)) for r, st, v in kept),
                           f"highest of any rank in any step{relative}")
    return out


def _whole_trace(model: Any) -> dict[str, Metric]:
    """Shares over each rank's whole trace (one sample per rank) when no step breakdown exists."""
    whole = model.whole_trace  # the one fallback the views quote too (analyzer.job.model.WholeTrace)
    if whole is None or whole.exposed_share is None:
        return {}
    ranks = [r for r in model.ranks if r.span_us > 0]
    basis = f"whole trace, no step breakdown: mean over {whole.ranks} rank(s)"
    exposed = tuple(Sample(r.rank, None, 100.0 * r.exposed_share) for r in ranks)  # the model's share
    out = {"exposed_comm_pct": Metric("exposed_comm_pct", 100.0 * whole.exposed_share, exposed, basis, "trace")}
    comm = [r for r in ranks if r.comm_us > 0]
    if comm and whole.overlap_share is not None:
        overlap = tuple(Sample(r.rank, None, 100.0 * r.overlap_share) for r in comm)
        out["overlap_pct"] = Metric("overlap_pct", 100.0 * whole.overlap_share, overlap, basis, "trace")
    return out


def _mfu(section: Any, typical_step: Any) -> Metric | None:
    """MFU from the ``mfu`` section: the typical step's entry, else the mean it states."""
    if not isinstance(section, dict):
        return None
    per_step = [e for e in section.get("per_step") or [] if isinstance(e, dict) and finite(e.get("mfu")) is not None]
    samples = tuple(Sample(None, e.get("step"), float(e["mfu"])) for e in per_step)
    at_typical = next((s.value for s in samples if s.step == typical_step), None)
    if at_typical is not None:
        return Metric("mfu", at_typical, samples, f"typical step {typical_step}")
    mean = finite(section.get("mfu_mean"))
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
    """``busbw_gbps:<group>``: the job model's bus bandwidth of each group label that has one
    (analyzer.job.busbw: the typical step's, over the collectives whose transfer time is
    measured, never a CPU-side op's duration), with its samples per rank and steady step."""
    out = {}
    for label, figure in run.model.group_busbw.items():
        if figure.gbps is not None:
            name = f"{GROUP_METRIC}:{label}"
            out[name] = Metric(name, figure.gbps, tuple(Sample(rank, step, value) for rank, step, value in figure.samples),
                               figure.basis, figure.scope)
    return out


def unmeasured_metrics(run: Any) -> dict[str, str]:
    """The metrics whose subject ``run`` has but cannot measure, with why (the gate says so and
    does not gate them): each group whose bus bandwidth no collective's transfer time gives."""
    return {f"{GROUP_METRIC}:{label}": figure.basis for label, figure in sorted(run.model.group_busbw.items())
            if figure.gbps is None}


# A σ needs this many step-to-step changes of the figure (three steady steps): from one change
# alone its estimate is anywhere between a tenth and three times the true σ (90% of the time), and
# one odd step (the first profiled step's shorter window on ddp_straggler, 2.3% off the next)
# would set the step-time threshold at 10.3% (docs/ci.md, "Noise-aware thresholds").
NOISE_MIN_CHANGES = 2


@dataclass(frozen=True)
class Spread:
    """How much a metric's figure moves from one steady step to the next in one run (its noise).

    ``sigma`` is in the metric's unit; None when the run has too few steady steps to measure it
    by (fewer than NOISE_MIN_CHANGES + 1, or a whole-trace figure): the noise is then unknown,
    not 0."""

    sigma: float | None
    changes: int  # the step-to-step changes sigma is made of
    steps: int  # the steady steps they come from


def spread(metric: Metric) -> Spread:
    """The noise of ``metric``'s figure: σ of a steady step's figure, from how much the figure
    moves between consecutive steady steps with the ranks' structural offsets removed.

    A rank's value in a step is its sample (a bus bandwidth's: the median of the rank-step's
    collectives, which mix sizes the same way each step). Between two consecutive steady steps,
    each rank present in both changes by its own difference, which no constant offset of that
    rank (a straggler, a pipeline stage, a TP or DP role) survives; the mean of those over the
    ranks is the change of the figure itself, a mean over ranks: ranks that vary independently
    (a stall that moves from rank to rank) average out in it, as they do in the figure. σ = 1.4826
    × the median absolute change / √2: the σ of a normal distribution whose step-to-step changes
    these are (the median, so that one odd step does not set it; about zero rather than about
    their median, so that a drift between the steps counts as noise, as it does between two
    windows of a run). ``Spread.sigma`` is None below NOISE_MIN_CHANGES changes."""
    by_rank_step: dict[tuple[Any, Any], list[float]] = {}
    for s in metric.samples:
        if s.step is not None and math.isfinite(s.value):
            by_rank_step.setdefault((s.rank, s.step), []).append(s.value)
    value = {key: float(np.median(v)) for key, v in by_rank_step.items()}
    steps = sorted({step for _, step in value}, key=lambda n: (not isinstance(n, int), n if isinstance(n, int) else 0, str(n)))
    changes = []
    for before, after in zip(steps, steps[1:]):
        ranks = [r for (r, step) in value if step == after and (r, before) in value]
        if ranks:
            changes.append(float(np.mean([value[(r, after)] - value[(r, before)] for r in ranks])))
    if len(changes) < NOISE_MIN_CHANGES:
        return Spread(None, len(changes), len(steps))
    return Spread(float(1.4826 * np.median(np.abs(changes)) / math.sqrt(2.0)), len(changes), len(steps))


def requested_steps_missing(run: Any, steps: Any) -> dict[int, list[int]]:
    """``{step: [ranks without it]}`` for each of the requested ``steps`` (``--steps``) that some
    rank of ``run`` does not hold (every rank: the traces do not have it)."""
    if not steps:
        return {}
    # the ranks' own steps, not the job model: diagnose asks before the job analysis, and the
    # model is built once, after it
    held = {r.rank: {s.get("step") for s in r.steps} for r in run.ranks}
    missing = {int(step): sorted(rank for rank, have in held.items() if step not in have) for step in steps}
    return {step: ranks for step, ranks in missing.items() if ranks}


def selected_nothing(run: Any, steps: Any) -> bool:
    """Whether ``--steps`` selected no step at all: none of the requested steps is in any rank."""
    missing = requested_steps_missing(run, steps)
    ranks = len(run.ranks)
    return bool(steps) and len(missing) == len(set(steps)) and all(len(r) == ranks for r in missing.values())


def steps_text(steps: Any) -> str:
    """3 -> "step 3"; [3, 4, 5, 9] -> "steps 3-5, 9"."""
    numbers = sorted(set(int(s) for s in steps))
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"step{'s' if len(numbers) > 1 else ''} {text}"


def has_gpu_activity(run: Any) -> bool:
    """Whether any rank of ``run`` recorded GPU activity (a CPU-only profile has none)."""
    return any(r.gpu_event_count for r in run.ranks) or any(s.busy_us > 0 for s in run.model.rank_steps())


def no_gpu_reason(run: Any, who: str) -> str:
    """Why ``run`` (no GPU activity read) has no GPU steps: a CPU-only profile, or device work
    under categories tracecliff does not know (never called CPU-only)."""
    if run.model.unread_device_events:
        return (f"no GPU steps in {who} (no GPU activity read: events under unknown categories look like device "
                "work, see its warnings)")
    return f"no GPU steps in {who} (no GPU activity in its traces: a CPU-only profile?)"


def unavailable_reason(run: Any, name: str, steps: Any = None, who: str = "the run") -> str:
    """Why a known metric has no value in ``run`` (for the gate's message); ``steps``: the
    ProfilerStep numbers the run was asked for (``--steps``), ``who``: how to name the run."""
    missing = requested_steps_missing(run, steps)
    if steps and selected_nothing(run, steps):
        return f"{steps_text(missing)} not in the traces (--steps selected nothing)"
    if not has_gpu_activity(run):
        return no_gpu_reason(run, who)
    if name == "mfu":
        return "model-parameter MFU unknown for this run (needs --model-params and --tokens-per-step)"
    if name in ("shapes_mfu", "gemm_tflops"):
        return "no FLOPs from recorded shapes with GPU kernels (profile with record_shapes=True)"
    if name.startswith(GROUP_METRIC + ":"):
        label = name.partition(":")[2]
        groups = sorted(set(run.model.digest["labels"]) | {g.label for g in run.model.groups if g.label})
        if label not in groups:
            return f"group {label} absent from {who} (groups: {', '.join(groups) or 'none'})"
        figure = run.model.group_busbw.get(label)
        return f"bus bandwidth of group {label} {figure.basis}" if figure is not None else \
            f"no GPU collective with a known size in group {label!r}"
    if name == "step_time_us":
        if not any(r.steps for r in run.model.ranks):
            return "no ProfilerStep#N markers: per-step times unavailable"
        return "no steady step measured on the GPU"
    if name == "overlap_pct":
        return "no communication on the GPU"
    return "no GPU activity"


# ---------------------------------------------------------------- physically possible figures

# A bus bandwidth above its link's peak by more than this is no measurement (docs/ci.md,
# "Physically possible numbers"): NVLink SHARP (NVLS) and in-network reductions report busbw a
# few % above the one-way link rate (each GPU sends its data once; the switch reduces), and the
# traces' µs timestamps shorten a short kernel by up to a microsecond; 25 % covers both.
PEAK_MARGIN = 1.25


def busbw_ceiling(run: Any, label: str) -> tuple[float | None, str]:
    """(GB/s, how) the highest bus bandwidth group ``label`` of ``run`` can reach: the intra-node
    link's one-way peak (hardware profile) inside a node; across nodes, at most twice the node's
    NICs' line rate (a tree or in-network reduction sends each byte through the network once
    each way, where a ring's busbw counts it twice), never above the intra-node link; times
    PEAK_MARGIN. None when the profile does not know the link (an unknown GPU, CPU-only)."""
    hardware = run.model.hardware
    intra = finite(hardware.intra_node_gbps.value)
    if intra is None:
        return None, "link peak unknown (no hardware profile for this GPU)"
    group = next((g for g in run.model.groups if g.label == label), None)
    link = str(hardware.intra_node_link.value or "intra-node link")
    if group is None or group.cross_node is not True:
        peak, how = intra, f"{link} {intra:g} GB/s one-way"
    else:
        nics = finite(hardware.nics_per_node.value) or 1.0
        per_nic = max(finite(hardware.nic_line_rate_gbit.value) or 0.0, 8 * (finite(hardware.nic_gbps.value) or 0.0)) / 8
        network = 2 * nics * per_nic
        peak = min(intra, network) if network else intra
        how = (f"2 x {nics:g} NIC(s) x {per_nic:g} GB/s per node" if network and network < intra
               else f"{link} {intra:g} GB/s one-way")
    return peak * PEAK_MARGIN, f"{how}, x {PEAK_MARGIN:g} margin"


def implausible(run: Any, name: str, value: float) -> str | None:
    """Why ``value`` of metric ``name`` cannot be a measurement of ``run`` (None: it can): a
    share outside 0-100 %, a step time not positive or longer than a rank's whole trace, an MFU
    outside (0, 1], a bus bandwidth not positive or above its link's peak."""
    spec = metric_spec(name)
    if spec is None:
        return None
    if not math.isfinite(value):
        return f"{value} is not a number"
    if spec.compare == "share" and not 0.0 <= value <= 100.0:
        return f"{value:.2f}% is outside 0-100% of the step"
    if name == "step_time_us":
        spans = [r.span_us for r in run.model.ranks if r.span_us > 0]
        if value <= 0:
            return f"step time {value:g} µs is not positive"
        if spans and value > max(spans) * 1.001:  # rounding of the two figures
            return f"step time {value:,.1f} µs is longer than any rank's whole trace ({max(spans):,.1f} µs)"
    if name == "mfu" and not 0.0 < value <= 1.0:
        return f"MFU {value:.4f} is outside (0, 1]"
    if name.startswith(GROUP_METRIC + ":"):
        if value <= 0:
            return f"{value:g} GB/s is not positive"
        ceiling, how = busbw_ceiling(run, name.partition(":")[2])
        if ceiling is not None and value > ceiling:
            return f"{value:,.1f} GB/s is above the link's peak {ceiling:,.1f} GB/s ({how})"
    return None




# ---------------------------------------------------------------- runs


