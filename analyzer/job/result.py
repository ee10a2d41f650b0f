"""The one Result every consumer reads (rules, what-if, gate, diff, renderers) and its JSON
serialization, the contract of ``diagnose --format json`` (schema_version 1). Other tools rely on
it: add keys, never rename or remove them without bumping SCHEMA_VERSION.

``Result.to_dict()`` and ``Result.from_dict()`` round-trip: a saved result is a Result again, so
``diagnose result.json --format html`` renders the very bytes the traces gave."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec

from analyzer import __version__
from analyzer.rank.analysis import RankAnalysis

SCHEMA_VERSION = 1
RANK_METRICS = ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us",
                "idle_us", "overlap_pct")
# RankAnalysis fields kept in each ``ranks[]`` entry as they are (the metrics are flattened).
_RANK_FIELDS = ("rank", "path", "rank_source", "host", "world_size", "steps", "phases", "gpu_event_count",
                "backend", "nccl_version", "process_groups", "devices", "first_gpu_ns", "markers_seen",
                "event_count", "time_breakdown")


@dataclass
class Result:
    """Everything ``diagnose`` knows about one job. Sections are plain data (JSON types)."""

    inputs: list[dict[str, Any]]
    ranks: list[RankAnalysis]
    job: dict[str, Any]
    collectives: list[dict[str, Any]]
    buckets: list[dict[str, Any]]
    fsdp_units: list[dict[str, Any]]
    findings: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # job analysis (analyzer.job.analysis)
    topology: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    groups: list[dict[str, Any]] | None = None
    stragglers: dict[str, Any] | None = None
    collective_summary: list[dict[str, Any]] | None = None
    mfu: dict[str, Any] | None = None
    # the typical step's time breakdown, mean over ranks (analyzer.job.attribution)
    attribution: dict[str, Any] | None = None
    # rules (analyzer.rules.engine)
    rules: list[dict[str, Any]] | None = None
    verdict: str | None = None
    # report sections (analyzer.job.step_timeline, analyzer.whatif.scaling, analyzer.job.hta)
    timeline: dict[str, Any] | None = None
    scaling: dict[str, Any] | None = None
    hta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return result_to_dict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Result":
        return result_from_dict(doc)

    def __repr__(self) -> str:
        world = self.job.get("world_size") or len(self.ranks)
        return (f"<Result {len(self.ranks)} of {world} rank(s), strategy {self.job.get('strategy')}, "
                f"{len(self.collectives)} collectives, {len(self.findings)} finding(s)>")


_SECTIONS = ("topology", "hardware", "groups", "stragglers", "collective_summary", "mfu", "attribution", "rules", "verdict",
             "timeline", "scaling", "hta")


def result_to_dict(result: Result) -> dict[str, Any]:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tracecliff", "version": __version__},
        "inputs": result.inputs,
        "job": result.job,
        "ranks": [_rank(r) for r in result.ranks],
        "collectives": result.collectives,
        "buckets": result.buckets,
        "fsdp_units": result.fsdp_units,
        "findings": result.findings,
        "warnings": result.warnings,
    }
    for key in _SECTIONS:
        value = getattr(result, key)
        if value is not None:
            doc[key] = value
    return doc


def result_from_dict(doc: dict[str, Any]) -> Result:
    """The Result a ``result_to_dict`` document holds (its rank entries carry every field)."""
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in doc.get("collectives") or []:
        rows_by_rank.setdefault(row["rank"], []).append(row)
    ranks = [_rank_from(entry, rows_by_rank.get(entry["rank"], [])) for entry in doc.get("ranks") or []]
    sections = {key: doc.get(key) for key in _SECTIONS}
    return Result(inputs=list(doc.get("inputs") or []), ranks=ranks, job=dict(doc.get("job") or {}),
                  collectives=list(doc.get("collectives") or []), buckets=list(doc.get("buckets") or []),
                  fsdp_units=list(doc.get("fsdp_units") or []), findings=list(doc.get("findings") or []),
                  warnings=list(doc.get("warnings") or []), **sections)


def _rank(r: RankAnalysis) -> dict[str, Any]:
    out = {key: getattr(r, key) for key in _RANK_FIELDS}
    out.update({k: r.metrics[k] for k in RANK_METRICS})
    out["rank_warnings"] = r.warnings
    # The typical step's time when the job analysis chose one (its time_breakdown adds up to it).
    out["step_time_us"] = r.time_breakdown["step_time_us"] if r.time_breakdown else mean_step_time(r)
    return out


def _rank_from(entry: dict[str, Any], rows: list[dict[str, Any]]) -> RankAnalysis:
    known = {f.name for f in fields(RankAnalysis)}
    values = {key: entry.get(key) for key in _RANK_FIELDS if key in known}
    values.update(metrics={k: entry.get(k) for k in RANK_METRICS}, collectives=rows,
                  warnings=list(entry.get("rank_warnings") or []))
    for key, empty in (("process_groups", []), ("devices", []), ("markers_seen", {}), ("steps", []),
                       ("phases", {}), ("gpu_event_count", 0), ("event_count", 0)):
        if values.get(key) is None:
            values[key] = type(empty)()
    return RankAnalysis(**values)


def mean_step_time(r) -> float | None:
    times = [s["step_time_us"] for s in r.steps]
    return round(sum(times) / len(times), 3) if times else None


def dumps(doc: dict[str, Any]) -> str:
    """Canonical bytes: sorted keys, no NaN/Infinity (they become null), one-space indent,
    trailing newline. msgspec's encoder: a 64-rank job's 300 MB result in seconds, not minutes."""
    try:
        raw = _ENCODER.encode(doc)
    except (TypeError, ValueError, msgspec.EncodeError):
        raw = _ENCODER.encode(_clean(doc))  # unusual keys or values: normalise, then encode
    return msgspec.json.format(raw, indent=1).decode("utf-8") + "\n"


def _numpy_scalar(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__}")


# order="sorted" sorts every dict's keys; NaN and ±Infinity encode as null.
_ENCODER = msgspec.json.Encoder(enc_hook=_numpy_scalar, order="sorted")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _clean(value.item())  # numpy scalar
    return value
