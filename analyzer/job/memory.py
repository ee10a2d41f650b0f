"""The job's ``memory`` section, and whether a fix that changes memory fits.

``memory.ranks[]`` is each rank's measured memory per step (analyzer.rank.memory). The job's
``peak_allocated_bytes`` / ``peak_reserved_bytes`` are the highest of any rank in any analysed
step: what a change must fit beside (one definition, quoted by the text, HTML, gate and diff).

A fix that changes memory carries ``evidence.memory`` (:func:`fit`): the peak after the fix,
from the measured peak (absolute figures: the allocator's totals) plus the bytes the fix adds,
else from the models (docs/models.md §3: the static state of the new strategy), against the
device's memory less a margin (docs/models.md §9, analyzer.model.formulas.fits_device): 10% of
the device beside a measured peak, 20% beside a modelled one.
"""

from __future__ import annotations

from typing import Any

from analyzer.base.units import fmt_bytes
from analyzer.model.formulas import MEASURED_MARGIN, MODELLED_MARGIN, fits_device

NOT_RECORDED = "no allocator events: profile with profile_memory=True"


SERIES_RANKS = 8  # ranks whose typical step the report draws (the fullest first)


def job_memory(ranks: list[Any], typical_step: int | None = None) -> dict[str, Any]:
    """The section from the ranks' map summaries (``RankAnalysis.memory``). Each step's drawn
    series is kept for the typical step (else the step of the highest peak) of the
    ``SERIES_RANKS`` fullest ranks only: the section's size follows the ranks, not the events."""
    recorded = [dict(r.memory, rank=r.rank) for r in ranks if r.memory and r.memory.get("recorded")]
    if not recorded:
        return {"recorded": False, "why": NOT_RECORDED, "ranks": []}
    recorded.sort(key=lambda m: m["rank"])
    drawn = _drawn_step(recorded, typical_step)
    fullest = sorted(recorded, key=lambda m: (-max((s["peak_allocated_bytes"] or 0) for s in m["steps"] or [{
        "peak_allocated_bytes": 0}]), m["rank"]))[:SERIES_RANKS]
    keep = {m["rank"] for m in fullest}
    for m in recorded:
        m["steps"] = [_without_series(s) if s["step"] != drawn or m["rank"] not in keep else s for s in m["steps"]]
    out: dict[str, Any] = {"recorded": True, "ranks": recorded,
                           "relative": any(m["relative"] for m in recorded),
                           "ranks_recorded": len(recorded), "ranks_without": sorted(
                               r.rank for r in ranks if not (r.memory and r.memory.get("recorded")))}
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        rank, step, value = _highest(recorded, key)
        out[key] = value
        out[key.replace("_bytes", "_at")] = None if value is None else {"rank": rank, "step": step}
    sizes = [m["device_bytes"] for m in recorded if m.get("device_bytes")]
    out["device_bytes"] = min(sizes) if sizes else None
    out["drawn_step"] = drawn
    return out


def _drawn_step(recorded: list[dict[str, Any]], typical_step: int | None) -> int | None:
    numbers = {s["step"] for m in recorded for s in m["steps"]}
    if typical_step in numbers:
        return typical_step
    _, step, _ = _highest(recorded, "peak_allocated_bytes")
    return step


def _without_series(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k != "series"}


def _highest(recorded: list[dict[str, Any]], key: str) -> tuple[int | None, int | None, int | None]:
    best: tuple[int | None, int | None, int | None] = (None, None, None)
    for m in recorded:
        for s in m["steps"]:
            value = s.get(key)
            if value is not None and (best[2] is None or value > best[2]):
                best = (m["rank"], s["step"], value)
    return best


def measured_peak(section: dict[str, Any] | None) -> int | None:
    """The job's measured peak as a fit reads it (reserved where recorded, else allocated);
    None when not recorded, or relative (Bytes only: not comparable with the device)."""
    if not section or not section.get("recorded") or section.get("relative"):
        return None
    peak = section.get("peak_reserved_bytes")
    return peak if peak is not None else section.get("peak_allocated_bytes")


def fit(section: dict[str, Any] | None, device_bytes: float | None, added_bytes: float | None,
        modelled_peak_bytes: float | None = None, added_source: str = "") -> dict[str, Any]:
    """``evidence.memory`` of a fix: ``fits`` (None: could not check, ``why``), ``peak_bytes``
    after the fix, ``added_bytes``, ``device_bytes``, ``margin`` (a fraction of the device) and
    ``how`` (measured / modelled)."""
    measured = measured_peak(section)
    device = (section or {}).get("device_bytes") or device_bytes
    out: dict[str, Any] = {"added_bytes": None if added_bytes is None else round(added_bytes),
                           "added_source": added_source, "device_bytes": device}
    if measured is not None and added_bytes is not None:
        peak, how, margin = measured + added_bytes, "measured", MEASURED_MARGIN
        out["measured_peak_bytes"] = measured
    elif modelled_peak_bytes is not None:
        peak, how, margin = modelled_peak_bytes, "modelled", MODELLED_MARGIN
    else:
        why = ("the bytes the fix adds are unknown" if added_bytes is None else
               "memory not recorded (profile with profile_memory=True) and no model of the peak"
               if measured_peak(section) is None and not (section or {}).get("relative") else
               "only Bytes recorded (relative figures: the peak is not comparable with the device)")
        out.update(fits=None, peak_bytes=None, margin=None, how=None, why=why)
        return out
    out.update(peak_bytes=round(peak), margin=margin, how=how)
    if not device:
        out.update(fits=None, why="the device's memory is unknown (no deviceProperties, no hardware profile)")
    else:
        out["fits"] = fits_device(max(peak, 0.0), device, margin)
        out["text"] = fit_text(out)
    return out


def fit_text(memory: dict[str, Any]) -> str:
    """One clause for a finding's sentence."""
    if memory.get("fits") is None:
        return f"whether it fits is unknown ({memory.get('why')})"
    verb = "fits" if memory["fits"] else "does NOT fit"
    return (f"it {verb}: {memory['how']} peak {fmt_bytes(memory['peak_bytes'])} of the {fmt_bytes(memory['device_bytes'])} "
            f"device (keeping {memory['margin']:.0%} free)")


def fix_memory(facts: Any, added_bytes: float | None, modelled_peak_bytes: float | None = None,
               source: str = "", frees_only: bool = False) -> dict[str, Any]:
    """``evidence.memory`` of a rule's fix (``facts``: the rules' JobFacts): :func:`fit` on the
    job's measured memory and the device's memory (the trace's, else the hardware profile's).
    ``frees_only``: the fix can only lower the peak, so it fits whatever its size."""
    device = facts.job.get("gpu_mem_bytes") or facts.hardware.memory_bytes.value
    section = facts.result.memory
    if frees_only and (added_bytes is None or added_bytes <= 0):
        measured = measured_peak(section)
        peak = None if measured is None or added_bytes is None else measured + added_bytes
        return {"fits": True, "peak_bytes": None if peak is None else round(peak),
                "added_bytes": None if added_bytes is None else round(added_bytes), "added_source": source,
                "device_bytes": (section or {}).get("device_bytes") or device, "margin": None,
                "how": "measured" if peak is not None else "by construction",
                "why": "the fix only frees memory", "text": "it only frees memory"}
    return fit(section, device, added_bytes, modelled_peak_bytes, source)


def fits_verdict(finding: dict[str, Any]) -> bool | None:
    """Whether a finding's fix fits (None: it changes no memory, or could not be checked)."""
    memory = (finding.get("evidence") or {}).get("memory")
    return memory.get("fits") if isinstance(memory, dict) else None


def bucket_cap_memory(facts: Any, gradient_bytes: float) -> dict[str, Any]:
    """``evidence.memory`` of a new ``bucket_cap_mb``: DDP's buckets hold every gradient once
    whatever their size (their total is the gradient bytes), so the cap adds nothing; the
    modelled peak is DDP's static state 16Ψ, Ψ from the bucketed gradient bytes."""
    from analyzer.model import formulas as models
    from analyzer.rank.comms import DTYPE_BYTES
    dtypes = [c["dtype"] for c in facts.data_parallel_collectives if c["collective"] == "allreduce" and c["dtype"]]
    elem = DTYPE_BYTES.get(dtypes[0]) if dtypes else None
    psi = gradient_bytes / elem if elem and gradient_bytes else None
    return fix_memory(facts, 0.0, models.ddp_memory_bytes(psi) if psi else None,
                      "DDP's buckets hold each gradient once, whatever the cap: no bytes added"
                      + (f"; modelled peak 16Ψ, Ψ = {psi:,.0f} from the bucketed gradients" if psi else ""))


def recorded_ranks(section: dict[str, Any] | None, absolute: bool = False) -> list[dict[str, Any]]:
    """The ranks with measured memory (``absolute``: only those whose figures are the
    allocator's totals, comparable with the device), for the memory rules."""
    if not section or not section.get("recorded"):
        return []
    return [m for m in section["ranks"] if m["steps"] and not (absolute and m["relative"])]


def share_text(value: float | None, of: float | None) -> str:
    """"22.0 of 80.0 GB (28%)": a peak against the device, as the memory findings say it."""
    if not value or not of:
        return fmt_bytes(value)
    return f"{value / 1e9:,.1f} of {of / 1e9:,.1f} GB ({100 * value / of:.0f}%)"


def not_checked(section: dict[str, Any] | None) -> str:
    """Why a memory rule that needs allocator totals on a GPU could not look."""
    if not section or not section.get("recorded"):
        return NOT_RECORDED
    return ("the allocator's figures are relative (host memory counted from the profiler's start, or Bytes "
            "only): not comparable with a GPU's memory")


def job_checkpointing(ranks: list[Any], typical_step: int | None) -> dict[str, Any]:
    """``job.activation_checkpointing``: whether forward ops re-run inside backward (or
    checkpoint frames) on any rank, and what recompute costs a step: the mean over ranks of the
    typical step's (else every step's mean) GPU time of those ops (their host time on a
    CPU-only trace, and ``basis`` says which)."""
    found = [(r.rank, r.memory["recompute"]) for r in ranks if r.memory and r.memory.get("recompute")]
    detected = [(rank, rec) for rank, rec in found if rec["forward_ops_in_backward"] or rec["frames"]]
    if not detected:
        return {"detected": False, "recompute_us": None,
                "evidence": {"ranks_checked": len(found), "forward_ops_in_backward": 0, "frames": 0}}
    gpu = any(s["gpu_us"] for _, rec in detected for s in rec["steps"].values())
    key = "gpu_us" if gpu else "host_us"
    per_rank = []
    for _, rec in detected:
        steps = rec["steps"]
        chosen = [steps[str(typical_step)]] if str(typical_step) in steps else list(steps.values())
        if chosen:
            per_rank.append(sum(s[key] for s in chosen) / len(chosen))
    return {"detected": True, "recompute_us": round(sum(per_rank) / len(per_rank), 3) if per_rank else None,
            "basis": ("GPU time of the kernels of the forward ops re-run in backward (linear, attention, "
                      "convolution; their elementwise neighbours are not counted)" if gpu else
                      "host time in the forward ops re-run in backward (no GPU kernels linked)"),
            "step": typical_step if any(str(typical_step) in rec["steps"] for _, rec in detected) else None,
            "evidence": {"ranks": [rank for rank, _ in detected],
                         "forward_ops_in_backward": sum(rec["forward_ops_in_backward"] for _, rec in detected),
                         "frames": sum(rec["frames"] for _, rec in detected),
                         "per_step": {str(rank): rec["steps"] for rank, rec in detected[:SERIES_RANKS]}}}
