"""Gate and diff metrics of a run: read from a result document (``diagnose --format json``).

A *run* is either trace paths (diagnosed here) or a saved result file; :func:`load_run` takes
either. Metrics are sampled per (rank, step) and aggregated over steps and ranks together:

| metric | per (rank, step) sample | better |
|---|---|---|
| ``step_time_us`` | the step's time (README "Definitions") | lower |
| ``exposed_comm_pct`` | 100 · exposed comm (waiting + transfer) / step time, over the step window | lower |
| ``overlap_pct`` | 100 · overlap / comm (steps with communication only) | higher |
| ``idle_pct`` | 100 · GPU idle in the step window / step time | lower |
| ``mfu`` | model FLOPs utilization, a fraction (0..1), from ``doc["mfu"]`` | higher |
| ``busbw_gbps:<group>`` | nccl-tests bus bandwidth of each collective in the group | higher |

A rank without ProfilerStep markers contributes one sample over its whole trace (span in place of
step time) to the percentages; ``step_time_us`` is then unavailable for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.job.model import group_label  # noqa: F401  (re-exported: the diff and gate use it)

AGGREGATIONS = ("median", "max", "min", "p90")
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
    MetricSpec("mfu", "fraction", "higher", "model FLOPs utilization"),
)}


@dataclass(frozen=True)
class Sample:
    rank: int | None
    step: int | None
    value: float


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


# ---------------------------------------------------------------- samples


def extract_samples(doc: dict[str, Any]) -> dict[str, list[Sample]]:
    """Every metric available in ``doc`` with its samples (metrics without samples are absent)."""
    samples: dict[str, list[Sample]] = {name: [] for name in ("step_time_us", "exposed_comm_pct",
                                                               "overlap_pct", "idle_pct")}
    for rank in doc.get("ranks") or []:
        for name, found in _rank_samples(rank).items():
            samples[name].extend(found)
    samples["mfu"] = mfu_samples(doc)
    samples.update(busbw_samples(doc))
    return {name: found for name, found in sorted(samples.items()) if found}


def step_records(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (rank, step) with a positive step time: the windows every metric and the
    diff's decomposition are taken over. A rank without steps gives one record, its whole trace
    (span as the step time, ``step`` None)."""
    records = []
    for rank in doc.get("ranks") or []:
        steps = rank.get("steps") or []
        windows = steps if steps else [{**rank, "step": None, "step_time_us": rank.get("span_us")}]
        for entry in windows:
            time = _num(entry.get("step_time_us"))
            if time is not None and time > 0:
                records.append({**entry, "rank": rank.get("rank"), "step_time_us": time})
    return records


def _rank_samples(rank: dict[str, Any]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {"step_time_us": [], "exposed_comm_pct": [], "overlap_pct": [],
                                    "idle_pct": []}
    for entry in step_records({"ranks": [rank]}):
        number, step, time = entry["rank"], entry["step"], entry["step_time_us"]
        if step is not None:
            out["step_time_us"].append(Sample(number, step, time))
        # The step's time breakdown when the job analysis made one (analyzer.job.attribution:
        # the one definition of exposed and idle shares), else the step's launched work.
        tb = entry.get("time_breakdown") or {}
        exposed = _num(tb.get("exposed_comm_us", entry.get("exposed_comm_us")))
        busy = _num(entry.get("busy_us"))
        idle = _num(tb["idle_us"]) if "idle_us" in tb else (None if busy is None else max(time - busy, 0.0))
        if exposed is not None:
            out["exposed_comm_pct"].append(Sample(number, step, 100.0 * exposed / time))
        if idle is not None:
            out["idle_pct"].append(Sample(number, step, 100.0 * idle / time))
        if (_num(entry.get("comm_us")) or 0.0) > 0 and _num(entry.get("overlap_pct")) is not None:
            out["overlap_pct"].append(Sample(number, step, float(entry["overlap_pct"])))
    return out


def mfu_samples(doc: dict[str, Any]) -> list[Sample]:
    """MFU from ``doc["mfu"]``: per-step entries when given, else the job's single figure.
    Accepts a fraction (``mfu``) or a percentage (``mfu_pct``)."""
    section = doc.get("mfu")
    if section is None:
        return []
    if _num(section) is not None:
        return [Sample(None, None, float(section))]
    if not isinstance(section, dict):
        return []
    per_step = section.get("steps") or section.get("per_step") or []
    found = [Sample(e.get("rank"), e.get("step"), v) for e in per_step if isinstance(e, dict)
             for v in [_mfu_value(e)] if v is not None]
    if found:
        return found
    value = _mfu_value(section)
    return [Sample(None, None, value)] if value is not None else []


def _mfu_value(entry: dict[str, Any]) -> float | None:
    for key, scale in (("mfu", 1.0), ("mfu_mean", 1.0), ("value", 1.0), ("mfu_pct", 0.01)):
        value = _num(entry.get(key))
        if value is not None:
            return value * scale
    return None


def busbw_samples(doc: dict[str, Any]) -> dict[str, list[Sample]]:
    """``busbw_gbps:<group>`` per collective: the row's ``busbw_gbps`` when the analysis gave
    one, else nccl-tests busbw from its bytes and duration (models.busbw_gbps)."""
    from analyzer.model.formulas import COLLECTIVE_KINDS, busbw_gbps
    out: dict[str, list[Sample]] = {}
    for row in doc.get("collectives") or []:
        label = group_label(row.get("group"))
        if label is None:
            continue
        value = _num(row.get("busbw_gbps"))
        if value is None:
            size, dur = _num(row.get("bytes")), _num(row.get("dur_us"))
            n = (row.get("group") or {}).get("size")
            if not size or not dur or dur <= 0 or not n or row.get("collective") not in COLLECTIVE_KINDS:
                continue
            value = busbw_gbps(row["collective"], size, dur, int(n))
        out.setdefault(f"{GROUP_METRIC}:{label}", []).append(Sample(row.get("rank"), row.get("step"), value))
    if not out:  # no per-collective figures: the group summary (one sample per group)
        for group in doc.get("groups") or []:
            label, value = group_label(group), _num(group.get("busbw_median_gbps"))
            if label is not None and value is not None:
                out[f"{GROUP_METRIC}:{label}"] = [Sample(None, None, value)]
    return out


def summarize(doc: dict[str, Any], how: str = "median") -> dict[str, float]:
    return {name: aggregate([s.value for s in found], how) for name, found in extract_samples(doc).items()}


def unavailable_reason(doc: dict[str, Any], name: str) -> str:
    """Why a known metric has no value in this run (for the gate's message)."""
    if name == "mfu":
        return "MFU unknown for this run (needs the model size: --model-params / recorded shapes)"
    if name.startswith(GROUP_METRIC + ":"):
        groups = sorted({g for g in (group_label(r.get("group")) for r in doc.get("collectives") or []) if g})
        return f"no collective with a known size in group {name.partition(':')[2]!r} " \
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


def as_document(run: Any) -> dict[str, Any]:
    """The JSON document of a run: a Result's serialization, or the document itself."""
    return run.to_dict() if hasattr(run, "to_dict") else run
