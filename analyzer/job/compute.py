"""Is the compute itself slow? The typical step's FLOPs from recorded shapes, their achieved
throughput and MFU, per rank and for the job (issue 29; models.md §6).

The map counted every leaf op's FLOPs and its kernels' time per step (analyzer.rank.flops:
``RankAnalysis.compute_steps``). Here, once the typical step is chosen, each rank's figures of
that step become ``ranks[].compute``:

- ``flops_per_step``: every counted op's FLOPs, whether or not its kernels were linked to it;
- ``by_family`` (gemm, attention, conv, other) and ``by_bucket`` (FLOPs per op in decades):
  FLOPs, the GPU time of the ops whose kernels were found, their TFLOP/s and their share of the
  peak (their time at the peak of each op's dtype over their time, so bf16 and fp32 ops are each
  held to their own peak);
- ``mfu``: the step's FLOPs at peak over the step's time; ``compute_mfu``: over the step's
  compute time (the union of its compute kernels), how busy the math units are while computing;
- ``unknown_gpu_us``: the GPU time of ops whose shapes gave no FLOPs (not counted anywhere).

The job's figures (the ``mfu`` section's ``from_shapes``) are the ranks' means over the typical
step's time (the one step time, analyzer.job.model). The typed view of both is ``JobCompute``
(``result.model.compute``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from analyzer.model import formulas as models
from analyzer.model.hardware import HardwareAssumptions, for_device
from analyzer.job.typical import median_step
from analyzer.base.units import shape_text

FAMILIES = ("gemm", "attention", "conv", "other")
TOP_SHAPES = 24  # the shapes ``ranks[].compute`` lists (most GPU time first)
SOURCE = ("FLOPs of the leaf ops from their recorded shapes (Input Dims, Input type, Concrete Inputs; "
          "models.md §6); time: the durations of the compute kernels each op launched")


def flop_bucket(flops_each: float | None) -> str:
    """The decade an op's FLOPs fall in, as a label ("10-100 GFLOP"); "merged" when unknown."""
    if flops_each is None or not flops_each > 0:
        return "0 FLOP" if flops_each == 0 else "merged"
    exponent = int(math.floor(math.log10(flops_each) + 1e-9))
    for unit, scale in (("PFLOP", 15), ("TFLOP", 12), ("GFLOP", 9), ("MFLOP", 6), ("kFLOP", 3), ("FLOP", 0)):
        if exponent >= scale:
            low = 10 ** (exponent - scale)
            return f"{low:g}-{10 * low:g} {unit}"
    return "<1 FLOP"


def bucket_floor(label: str) -> float:
    """The lower bound of a ``flop_bucket`` label (for ordering), 0 when it has none."""
    scales = {"PFLOP": 1e15, "TFLOP": 1e12, "GFLOP": 1e9, "MFLOP": 1e6, "kFLOP": 1e3, "FLOP": 1.0}
    try:
        low, unit = label.split(" ", 1)
        return float(low.split("-", 1)[0]) * scales[unit]
    except (ValueError, KeyError):
        return 0.0


class _Peaks:
    """The hardware's dense peak of each dtype, and the time FLOPs take at it."""

    def __init__(self, hardware: HardwareAssumptions | None) -> None:
        self.hardware = hardware

    def value(self, dtype: str | None) -> float | None:
        if self.hardware is None:
            return None
        value = self.hardware.peak_of(dtype).value
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def ideal_us(self, flops: float, dtype: str | None) -> float | None:
        peak = self.value(dtype)
        return models.time_at_peak_us(flops, peak) if peak else None


def step_of(compute_steps: Mapping[str, Any] | None, typical_step: Any) -> tuple[str | None, str]:
    """(the key of the step the figures are of, why that step): the job's typical step, else
    (no GPU steps, e.g. a CPU-only trace) the median of the recorded ProfilerSteps."""
    steps = (compute_steps or {}).get("steps") or {}
    if typical_step is not None:
        return (str(typical_step) if str(typical_step) in steps else None), "typical step"
    numbered = sorted(int(k) for k in steps if k != "none")
    if numbered:  # no step times (CPU-only ProfilerSteps): the middle step by its number
        return str(median_step({n: float(n) for n in numbered})), "median recorded ProfilerStep (no typical step)"
    return ("none" if "none" in steps else None), "the whole trace (no ProfilerStep markers)"


def rank_compute(compute_steps: Mapping[str, Any] | None, typical_step: Any, step_time_us: float | None,
                 compute_us: float | None, hardware: HardwareAssumptions | None) -> dict[str, Any] | None:
    """``ranks[].compute`` of one rank (see the module docstring); None when its trace holds
    none of the ops FLOPs are counted for."""
    if not compute_steps:
        return None
    key, chosen = step_of(compute_steps, typical_step)
    if key is None and typical_step is not None:
        return None  # this rank's trace lacks the typical step (or ran none of the ops in it)
    entry = (compute_steps.get("steps") or {}).get(key) if key is not None else None
    shapes, unknown = (entry or {}).get("shapes") or [], (entry or {}).get("unknown") or {}
    peaks = _Peaks(hardware)
    rows = [_shape_figures(row, peaks) for row in shapes]
    flops = _exact(sum(row["flops"] for row in rows))
    timed = any(row["timed_count"] for row in rows) or bool(unknown.get("timed_ops"))
    ideal = _sum_known([peaks.ideal_us(row["flops"], row["dtype"]) for row in rows]) if rows else None
    dtypes = _by_dtype(rows)
    peak = flops / (ideal * 1e6) if ideal else None
    out: dict[str, Any] = {
        "step": int(key) if key not in (None, "none") else None, "step_source": chosen,
        "flops_per_step": flops,
        "by_family": {family: _group([r for r in rows if r["family"] == family]) for family in FAMILIES},
        "by_bucket": _buckets(rows),
        "unknown_gpu_us": round(float(unknown.get("gpu_us") or 0.0), 3),
        "unknown_ops": int(unknown.get("ops") or 0),
        "unknown_reasons": dict(unknown.get("by_reason") or {}),
        "dtype": max(dtypes, key=lambda d: (dtypes[d], d)) if dtypes else None,
        "flops_by_dtype": dtypes,
        "peak_tflops": round(peak, 3) if peak else None,
        "step_time_us": step_time_us, "compute_us": compute_us,
        "mfu": _fraction(ideal, step_time_us) if timed else None,
        "compute_mfu": _fraction(ideal, compute_us) if timed else None,
        "ideal_us": round(ideal, 6) if ideal is not None else None,
        "shapes": rows[:TOP_SHAPES],
        "ops_seen": dict(compute_steps.get("ops_seen") or {}),
        "source": SOURCE + "; peak: " + _peak_sources(dtypes, peaks),
        "time_source": "GPU kernels" if timed else "none: no GPU kernels were linked to the ops "
                                                  "(CPU-only trace?): FLOPs counted, no throughput",
    }
    if ideal is not None and len(_known_peak(dtypes, peaks)) < len(dtypes):
        out["note"] = ("FLOPs of dtypes without a peak (" + ", ".join(sorted(set(dtypes) - set(_known_peak(dtypes, peaks))))
                       + ") are left out of the MFU")
    return out


def _exact(value: float) -> float:
    return int(value) if float(value).is_integer() else float(value)


def _fraction(ideal_us: float | None, time_us: float | None) -> float | None:
    if ideal_us is None or not time_us:
        return None
    return round(models.flops_utilization(ideal_us, time_us), 6)


def _sum_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _shape_figures(row: Mapping[str, Any], peaks: _Peaks) -> dict[str, Any]:
    """One shape row with its throughput, share of peak and bucket."""
    gpu_us, timed_flops = float(row.get("gpu_us") or 0.0), row.get("timed_flops") or 0
    ideal = peaks.ideal_us(timed_flops, row.get("dtype")) if timed_flops else None
    out = {key: row.get(key) for key in ("op", "family", "dtype", "dims", "count", "flops_each", "flops",
                                         "timed_count", "timed_flops", "gpu_us", "note")}
    out["bucket"] = flop_bucket(row.get("flops_each"))
    out["tflops_per_s"] = round(models.achieved_tflops(timed_flops, gpu_us), 3) if gpu_us > 0 else None
    out["ideal_us"] = round(ideal, 6) if ideal is not None else None
    out["pct_of_peak"] = round(100.0 * ideal / gpu_us, 2) if ideal is not None and gpu_us > 0 else None
    return out


def _group(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """FLOPs, GPU time, TFLOP/s and share of peak of a set of shape rows."""
    flops = _exact(sum(r["flops"] for r in rows))
    timed = sum(r["timed_flops"] for r in rows)
    gpu_us = sum(r["gpu_us"] for r in rows)
    ideal = _sum_known([r["ideal_us"] for r in rows if r["gpu_us"] > 0])
    known_gpu = sum(r["gpu_us"] for r in rows if r["ideal_us"] is not None)
    return {"flops": flops, "ops": sum(r["count"] for r in rows), "timed_flops": _exact(timed),
            "gpu_us": round(gpu_us, 3),
            "tflops_per_s": round(models.achieved_tflops(timed, gpu_us), 3) if gpu_us > 0 else None,
            "pct_of_peak": round(100.0 * ideal / known_gpu, 2) if ideal is not None and known_gpu > 0 else None,
            "ideal_us": round(ideal, 6) if ideal is not None else None}


def _buckets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, FLOPs-per-op decade), largest ops first."""
    keys = sorted({(r["family"], r["bucket"]) for r in rows},
                  key=lambda k: (FAMILIES.index(k[0]) if k[0] in FAMILIES else 9, -bucket_floor(k[1]), k[1]))
    return [{"family": family, "bucket": bucket,
             **_group([r for r in rows if (r["family"], r["bucket"]) == (family, bucket)])}
            for family, bucket in keys]


def _by_dtype(rows: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        key = r["dtype"] or "unknown"
        out[key] = out.get(key, 0) + r["flops"]
    return {k: _exact(v) for k, v in sorted(out.items())}


def _known_peak(dtypes: Mapping[str, float], peaks: _Peaks) -> list[str]:
    return [d for d in dtypes if peaks.value(d)]


def _peak_sources(dtypes: Mapping[str, float], peaks: _Peaks) -> str:
    if peaks.hardware is None or not dtypes:
        return "unknown"
    parts = []
    for dtype in sorted(dtypes, key=lambda d: -dtypes[d]):
        peak = peaks.hardware.peak_of(dtype)
        parts.append(f"{dtype} {peak.value:g} TFLOPS ({peak.source})" if peak.value else f"{dtype}: {peak.source}")
    return "; ".join(parts)


def shape_rows(result: Any) -> list[dict[str, Any]]:
    """Every distinct (op, shape, dtype) of every rank and step with its throughput and share
    of peak (the rows of ``Result.compute_df()``)."""
    model = result.model
    own = rank_hardware(result.ranks, model.hardware)
    rows = []
    for rank in result.ranks:
        peaks = _Peaks(own[rank.rank])
        for key, entry in ((rank.compute_steps or {}).get("steps") or {}).items():
            step = int(key) if key != "none" else None
            for row in entry.get("shapes") or []:
                figures = _shape_figures(row, peaks)
                rows.append({"rank": rank.rank, "step": step, "role": model.step_role(step), **figures,
                             "shape": shape_text(row.get("dims"))})
    return rows


# ---------------------------------------------------------------- the job's figures

def analyze_compute(result: Any, hardware: HardwareAssumptions) -> dict[str, Any] | None:
    """Set every rank's ``compute`` (its figures of the typical step) and return the job's
    (the ``mfu`` section's ``from_shapes``). Runs after the typical step is chosen."""
    model = result.model
    typical = model.typical
    own = rank_hardware(result.ranks, hardware)
    for rank in result.ranks:
        facts = model.rank(rank.rank)
        step = facts.step(typical.step) if facts is not None and typical is not None else None
        leaves = facts.typical if facts is not None else None
        rank.compute = rank_compute(rank.compute_steps, typical.step if typical else None,
                                    leaves.step_time_us if leaves is not None else None,
                                    step.compute_us if step is not None and step.compute_us else None,
                                    own[rank.rank])
    return job_compute(result.ranks, typical.step if typical else None, model.step_time_us)


def rank_hardware(ranks: list[Any], hardware: HardwareAssumptions) -> dict[int, HardwareAssumptions]:
    """Each rank's hardware: the job's, with the rank's own GPU (its first device) where the
    ranks' GPUs differ, so its FLOPs are held to its own peak."""
    by_device: dict[tuple[Any, Any], HardwareAssumptions] = {}
    own = {}
    for r in ranks:
        device = r.devices[0] if r.devices else {}
        key = (device.get("name"), device.get("total_mem_bytes"))
        if key not in by_device:
            by_device[key] = for_device(hardware, *key)
        own[r.rank] = by_device[key]
    return own


def job_compute(ranks: list[Any], typical_step: Any, step_time_us: float | None) -> dict[str, Any] | None:
    """The ``mfu`` section's ``from_shapes``: the ranks' typical-step figures combined (FLOPs
    and time at peak averaged over ranks, then over the one step time)."""
    docs = [(r.rank, r.compute) for r in ranks if r.compute]
    if not docs:
        return None
    n = len(docs)
    flops = sum(d["flops_per_step"] for _, d in docs) / n
    ideal = [d["ideal_us"] for _, d in docs if d.get("ideal_us") is not None]
    compute = [d["compute_us"] for _, d in docs if d.get("compute_us")]
    timed = any(d.get("mfu") is not None for _, d in docs)
    mean_ideal = sum(ideal) / len(ideal) if len(ideal) == n else None
    mean_compute = sum(compute) / len(compute) if len(compute) == n else None
    step_source = docs[0][1].get("step_source")
    families = {family: _combined([d["by_family"][family] for _, d in docs]) for family in FAMILIES}
    return {
        "step": typical_step if typical_step is not None else docs[0][1].get("step"),
        "step_source": step_source,
        "ranks": n,
        "flops_per_step": _exact(round(flops, 3)) if n > 1 else docs[0][1]["flops_per_step"],
        "step_time_us": step_time_us,
        "compute_us": round(mean_compute, 3) if mean_compute is not None else None,
        "mfu": _fraction(mean_ideal, step_time_us) if timed else None,
        "compute_mfu": _fraction(mean_ideal, mean_compute) if timed else None,
        "peak_tflops": round(flops / (mean_ideal * 1e6), 3) if mean_ideal else None,
        "dtype": _dominant([d for _, d in docs]),
        "by_family": families,
        "unknown_gpu_us": round(sum(d["unknown_gpu_us"] for _, d in docs) / n, 3),
        "per_rank": [{"rank": rank, "flops_per_step": d["flops_per_step"], "mfu": d.get("mfu"),
                      "compute_mfu": d.get("compute_mfu")} for rank, d in docs],
        "source": ("mean over ranks of each rank's FLOPs of the step at the peak of their dtype, over the job's "
                   "typical step time (mfu) and over its compute time (compute_mfu); " + docs[0][1]["source"]),
    }


def _combined(cells: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-rank family (or bucket) figures summed over ranks, with the rates made again."""
    timed = sum(c["timed_flops"] for c in cells)
    gpu_us = sum(c["gpu_us"] for c in cells)
    ideal = _sum_known([c.get("ideal_us") for c in cells])
    n = max(len(cells), 1)
    return {"flops": _exact(round(sum(c["flops"] for c in cells) / n, 3)),
            "ops": round(sum(c["ops"] for c in cells) / n, 3), "timed_flops": _exact(round(timed / n, 3)),
            "gpu_us": round(gpu_us / n, 3),
            "tflops_per_s": round(models.achieved_tflops(timed, gpu_us), 3) if gpu_us > 0 else None,
            "pct_of_peak": round(100.0 * ideal / gpu_us, 2) if ideal is not None and gpu_us > 0 else None,
            "ideal_us": round(ideal / n, 6) if ideal is not None else None}


def _dominant(docs: list[Mapping[str, Any]]) -> str | None:
    totals: dict[str, float] = {}
    for d in docs:
        for dtype, flops in (d.get("flops_by_dtype") or {}).items():
            totals[dtype] = totals.get(dtype, 0) + flops
    return max(totals, key=lambda k: (totals[k], k)) if totals else None


# ---------------------------------------------------------------- typed view (result.model.compute)

@dataclass(frozen=True)
class Throughput:
    """FLOPs, the GPU time of the ops that launched kernels, their TFLOP/s and % of peak."""

    flops: float
    ops: float
    gpu_us: float
    tflops_per_s: float | None
    pct_of_peak: float | None

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Throughput:
        return cls(doc.get("flops") or 0, doc.get("ops") or 0, float(doc.get("gpu_us") or 0.0),
                   doc.get("tflops_per_s"), doc.get("pct_of_peak"))


@dataclass(frozen=True)
class ShapeFigures:
    """One distinct (op, shape, dtype) of the typical step."""

    op: str
    family: str
    dtype: str | None
    dims: Mapping[str, Any] | None
    count: int
    flops_each: float | None
    gpu_us: float
    tflops_per_s: float | None
    pct_of_peak: float | None
    bucket: str
    timed_flops: float = 0

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> ShapeFigures:
        return cls(str(doc.get("op")), str(doc.get("family")), doc.get("dtype"), doc.get("dims"),
                   int(doc.get("count") or 0), doc.get("flops_each"), float(doc.get("gpu_us") or 0.0),
                   doc.get("tflops_per_s"), doc.get("pct_of_peak"), str(doc.get("bucket") or ""),
                   doc.get("timed_flops") or 0)

    def dim(self, name: str) -> int | None:
        value = (self.dims or {}).get(name)
        return value if isinstance(value, int) else None


@dataclass(frozen=True)
class RankCompute:
    rank: int
    step: int | None
    flops_per_step: float
    families: Mapping[str, Throughput]
    buckets: tuple[tuple[str, str, Throughput], ...]  # (family, bucket, figures)
    shapes: tuple[ShapeFigures, ...]
    unknown_gpu_us: float
    mfu: float | None
    compute_mfu: float | None
    dtype: str | None
    peak_tflops: float | None
    unknown_reasons: Mapping[str, int]
    # every distinct shape of the step (``shapes`` lists the TOP_SHAPES with most GPU time)
    step_shapes: tuple[ShapeFigures, ...] = ()

    @classmethod
    def of(cls, rank: int, doc: Mapping[str, Any], step_shapes: tuple[ShapeFigures, ...] = ()) -> RankCompute:
        return cls(rank, doc.get("step"), doc.get("flops_per_step") or 0,
                   {f: Throughput.of((doc.get("by_family") or {}).get(f) or {}) for f in FAMILIES},
                   tuple((b["family"], b["bucket"], Throughput.of(b)) for b in doc.get("by_bucket") or []),
                   tuple(ShapeFigures.of(s) for s in doc.get("shapes") or []),
                   float(doc.get("unknown_gpu_us") or 0.0), doc.get("mfu"), doc.get("compute_mfu"),
                   doc.get("dtype"), doc.get("peak_tflops"), dict(doc.get("unknown_reasons") or {}), step_shapes)


@dataclass(frozen=True)
class JobCompute:
    """The job's compute of the typical step (``mfu.from_shapes``) and each rank's."""

    step: int | None
    flops_per_step: float
    step_time_us: float | None
    compute_us: float | None
    mfu: float | None
    compute_mfu: float | None
    peak_tflops: float | None
    dtype: str | None
    families: Mapping[str, Throughput]
    unknown_gpu_us: float
    ranks: tuple[RankCompute, ...]
    source: str

    @classmethod
    def of(cls, section: Mapping[str, Any] | None, ranks: list[Any],
           hardware: HardwareAssumptions | None = None) -> JobCompute | None:
        if not section:
            return None
        per_rank = tuple(RankCompute.of(r.rank, r.compute, _step_shapes(r, hardware)) for r in ranks if r.compute)
        return cls(section.get("step"), section.get("flops_per_step") or 0, section.get("step_time_us"),
                   section.get("compute_us"), section.get("mfu"), section.get("compute_mfu"),
                   section.get("peak_tflops"), section.get("dtype"),
                   {f: Throughput.of((section.get("by_family") or {}).get(f) or {}) for f in FAMILIES},
                   float(section.get("unknown_gpu_us") or 0.0), per_rank, str(section.get("source") or ""))

    @property
    def counted(self) -> bool:
        """Whether any op's shapes gave FLOPs (not: every op is unknown, e.g. record_shapes off)."""
        return any(f.ops for f in self.families.values())

    @property
    def unknown_reasons(self) -> dict[str, int]:
        """Why ops gave no FLOPs, summed over ranks."""
        out: dict[str, int] = {}
        for rank in self.ranks:
            for reason, n in rank.unknown_reasons.items():
                out[reason] = out.get(reason, 0) + n
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def timed(self) -> bool:
        """Whether any op's kernels were found (else: FLOPs only, no throughput)."""
        return any(f.gpu_us > 0 for f in self.families.values())

    def buckets(self, family: str = "gemm") -> list[tuple[str, Throughput]]:
        """A family's FLOPs-per-op decades over all ranks (largest first), rates made again."""
        cells: dict[str, list[Throughput]] = {}
        for rank in self.ranks:
            for fam, bucket, figures in rank.buckets:
                if fam == family:
                    cells.setdefault(bucket, []).append(figures)
        out = []
        for bucket in sorted(cells, key=lambda b: -bucket_floor(b)):
            parts = cells[bucket]
            out.append((bucket, _throughput_sum(parts, len(self.ranks) or 1)))
        return out


def _step_shapes(rank: Any, hardware: HardwareAssumptions | None) -> tuple[ShapeFigures, ...]:
    """Every shape of the step a rank's ``compute`` is of, with its throughput and share of peak."""
    key = rank.compute.get("step")
    entry = ((rank.compute_steps or {}).get("steps") or {}).get("none" if key is None else str(key)) or {}
    peaks = _Peaks(hardware)
    return tuple(ShapeFigures.of(_shape_figures(row, peaks)) for row in entry.get("shapes") or [])


def _throughput_sum(parts: list[Throughput], n: int) -> Throughput:
    gpu = sum(p.gpu_us for p in parts)
    timed_flops = sum((p.tflops_per_s or 0.0) * p.gpu_us * 1e6 for p in parts)
    with_peak = [p for p in parts if p.pct_of_peak is not None and p.gpu_us > 0]
    pct = (sum(p.pct_of_peak * p.gpu_us for p in with_peak) / sum(p.gpu_us for p in with_peak)) if with_peak else None
    return Throughput(sum(p.flops for p in parts) / n, sum(p.ops for p in parts) / n, gpu / n,
                      models.achieved_tflops(timed_flops, gpu) if gpu > 0 else None,
                      round(pct, 2) if pct is not None else None)
