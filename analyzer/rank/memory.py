"""Measured memory of one rank, per step, from the allocator's events (analyzer.ingest.memory).

The device read is the rank's accelerator (the one with the most allocator events; a CPU-only
trace: the CPU). With ``Total Allocated`` / ``Total Reserved`` recorded the figures are the
allocator's own totals; a trace with ``Bytes`` only (2021-era) gives the running sum of the
changes, which is *relative*: bytes above what was held when the trace started (the model's
weights and optimizer state allocated before profiling began are not in it), and says so.

Per step (its CPU window: ProfilerStep, else the steps the rank's analysis found): peak
allocated and reserved, where the peak is (offset in the step, phase, innermost recorded
range, FSDP unit), allocated at the step's start and end, reserved − allocated at the peak
(cached by the allocator, or fragmented), segment growth and releases (``cudaMalloc`` /
``cudaFree``, ``empty_cache``: changes of ``Total Reserved``) and the headroom to the device's
``totalGlobalMem``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.ingest.classify import fsdp_module_of
from analyzer.ingest.memory import MemoryEvents
from analyzer.ingest.trace import Marker, RankTrace
from analyzer.rank.timeline import PHASES, locate, step_windows

NOT_RECORDED = "no allocator events: profile with profile_memory=True"
# Points of a step's drawn series (the HTML's memory chart): the highest allocated of each of as
# many equal slices of the step, so a rank of millions of events sends back a few hundred numbers.
SERIES_POINTS = 96
_DEVICE_NAMES = {0: "cpu", 1: "cuda"}
# Ranges that tell nothing about where in the step the peak is (the step itself).
_NOT_AN_OP = (Marker.STEP,)


def rank_memory(trace: RankTrace, steps: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The rank's ``memory`` summary (``recorded`` false with the reason when there is none)."""
    events = trace.memory
    if not len(events):
        return {"recorded": False, "why": NOT_RECORDED, "steps": []}
    device_type, device_id, others = _chosen_device(events)
    rows = np.flatnonzero((events.device_type == device_type) & (events.device_id == device_id))
    mine = events.take(rows)
    allocated, relative = _allocated(mine)
    # The CPU allocator's totals count only what was allocated since the profiler started (c10
    # warns of blocks "allocated before the profiling started"): relative as well.
    relative = relative or device_type == 0
    reserved = None if relative or device_type == 0 else _filled(mine.reserved)
    device_bytes = _device_bytes(trace, device_type, device_id)
    numbers, starts, ends = step_windows(trace)
    if steps is not None:
        chosen = np.isin(numbers, np.asarray(steps, dtype=np.int64))
        numbers, starts, ends = numbers[chosen], starts[chosen], ends[chosen]
    per_step = [_step(trace, mine, allocated, reserved, int(n), int(s), int(e), device_bytes, relative)
                for n, s, e in zip(numbers.tolist(), starts.tolist(), ends.tolist())]
    name = _DEVICE_NAMES.get(device_type, f"type {device_type}")
    return {
        "recorded": True,
        "device": name if device_id < 0 else f"{name}:{device_id}",
        "device_type": name,
        "events": len(mine),
        "relative": relative,
        "basis": _basis(mine, device_type),
        "device_bytes": device_bytes,
        "trace_peak_allocated_bytes": _int(np.nanmax(allocated)) if len(allocated) else None,
        "trace_peak_reserved_bytes": _int(np.nanmax(reserved)) if reserved is not None and len(reserved) else None,
        "steps": per_step,
        "other_devices": others,
    }


def _basis(events: MemoryEvents, device_type: int) -> str:
    if not np.isfinite(events.allocated).all():
        return "running sum of Bytes: relative to what was held when the trace started"
    if device_type == 0:
        return "the CPU allocator's Total Allocated: what was allocated since the profiler started"
    return "the allocator's Total Allocated / Total Reserved"


def _chosen_device(events: MemoryEvents) -> tuple[int, int, list[dict[str, Any]]]:
    """The accelerator with the most events, else the CPU; the others, counted."""
    pairs, counts = np.unique(np.stack([events.device_type.astype(np.int64), events.device_id.astype(np.int64)]),
                              axis=1, return_counts=True)
    found = [(int(t), int(i), int(n)) for (t, i), n in zip(pairs.T.tolist(), counts.tolist())]
    found.sort(key=lambda d: (d[0] > 0, d[2], -d[1]), reverse=True)
    kind, ident, _ = found[0]
    others = [{"device": _DEVICE_NAMES.get(t, f"type {t}") + ("" if i < 0 else f":{i}"), "events": n}
              for t, i, n in found[1:]]
    return kind, ident, others


def _allocated(events: MemoryEvents) -> tuple[np.ndarray, bool]:
    """Allocated bytes after each event: the allocator's total where every event has it, else
    the running sum of the changes (relative)."""
    if np.isfinite(events.allocated).all():
        return events.allocated, False
    return np.cumsum(np.nan_to_num(events.delta)), True


def _filled(values: np.ndarray) -> np.ndarray | None:
    """A total carried forward over the events that lack it; None when none has it."""
    finite = np.isfinite(values)
    if not finite.any():
        return None
    last = np.maximum.accumulate(np.where(finite, np.arange(len(values)), 0))
    return np.where(finite[last], values[last], values[np.argmax(finite)])


def _device_bytes(trace: RankTrace, device_type: int, device_id: int) -> int | None:
    if device_type == 0:
        return None  # host memory: deviceProperties describe the GPUs only
    sizes = [d.get("total_mem_bytes") for d in trace.devices if d.get("id") == device_id]
    if not sizes and len(trace.devices) == 1:
        sizes = [trace.devices[0].get("total_mem_bytes")]
    return int(sizes[0]) if sizes and sizes[0] else None


def _step(trace: RankTrace, events: MemoryEvents, allocated: np.ndarray, reserved: np.ndarray | None,
          number: int, start: int, end: int, device_bytes: int | None, relative: bool) -> dict[str, Any]:
    lo = int(np.searchsorted(events.ts, start, side="left"))
    hi = int(np.searchsorted(events.ts, end, side="right"))
    if lo > 0:
        held = float(allocated[lo - 1])
    elif not len(allocated) or not np.isfinite(events.allocated[0]):
        held = 0.0
    else:  # the first event of the trace: what was held before it
        held = float(allocated[0] - np.nan_to_num(events.delta[0]))
    entry: dict[str, Any] = {"step": number, "events": hi - lo, "start_allocated_bytes": _int(held),
                             "peak_reserved_bytes": None}
    if hi == lo:  # nothing allocated or freed: the step held what it started with
        entry.update(peak_allocated_bytes=_int(held), end_allocated_bytes=_int(held), peak_at=None,
                     peak_reserved_bytes=_int(reserved[lo - 1]) if reserved is not None and lo > 0 else None)
    else:
        at = lo + int(np.argmax(allocated[lo:hi]))
        peak = max(float(allocated[at]), held)
        entry.update(peak_allocated_bytes=_int(peak), end_allocated_bytes=_int(allocated[hi - 1]),
                     peak_at=_where(trace, events, at, start) if peak > held else None)
        deltas = events.delta[lo:hi]
        entry.update(allocations=int((deltas > 0).sum()), frees=int((deltas < 0).sum()),
                     allocated_in_step_bytes=_int(np.nansum(np.where(deltas > 0, deltas, 0.0))))
        if reserved is not None:
            entry.update(_reserved(reserved, lo, hi, at))
        entry["series"] = _series(trace, events, allocated, reserved, lo, hi, start, end)
    entry["headroom_bytes"] = _headroom(entry, device_bytes, relative)
    return entry


def _reserved(reserved: np.ndarray, lo: int, hi: int, at: int) -> dict[str, Any]:
    """Reserved figures of a step: peak, at the allocated peak (less allocated: cached), and the
    segments the allocator took from (``cudaMalloc``) and gave back to the driver in it."""
    before = reserved[lo - 1] if lo > 0 else reserved[lo]
    window = np.concatenate([[before], reserved[lo:hi]])
    change = np.diff(window)
    return {"peak_reserved_bytes": _int(window.max()), "reserved_at_peak_bytes": _int(reserved[at]),
            "start_reserved_bytes": _int(before), "end_reserved_bytes": _int(window[-1]),
            "segment_grows": int((change > 0).sum()), "segment_releases": int((change < 0).sum()),
            "released_bytes": _int(-change[change < 0].sum())}


def _series(trace: RankTrace, events: MemoryEvents, allocated: np.ndarray, reserved: np.ndarray | None,
            lo: int, hi: int, start: int, end: int) -> dict[str, Any]:
    """The step's allocated (and reserved) memory over its events: the event of highest
    allocated in each of ``SERIES_POINTS`` slices of equal event counts (allocations bunch where
    the host launches a pass: slices of equal time would merge them), with its phase."""
    count = hi - lo
    slot = np.arange(count) * SERIES_POINTS // max(count, 1)
    values = allocated[lo:hi]
    # the highest of each slice (the first of equals): sort by (slot, −value) and keep each slot's first row
    order = np.lexsort((-values, slot))
    first = order[np.r_[True, slot[order][1:] != slot[order][:-1]]]
    rows = lo + np.sort(first)
    _, phase = locate(trace, events.ts[rows], events.thread[rows])
    return {"offset_us": np.round((events.ts[rows] - start) / 1000.0, 3).tolist(),
            "allocated_bytes": [_int(v) for v in allocated[rows]],
            "reserved_bytes": None if reserved is None else [_int(v) for v in reserved[rows]],
            "phase": [PHASES[int(p)] for p in phase]}


def _headroom(entry: dict[str, Any], device_bytes: int | None, relative: bool) -> int | None:
    """The device's memory less the step's peak (reserved where known: what the allocator
    holds); unknown for relative figures or without the device's size."""
    peak = entry.get("peak_reserved_bytes")
    peak = entry["peak_allocated_bytes"] if peak is None else peak
    if relative or device_bytes is None or peak is None:
        return None
    return int(device_bytes - peak)


def _where(trace: RankTrace, events: MemoryEvents, at: int, start: int) -> dict[str, Any]:
    """Where the peak is: its offset in the step, the phase the rank's markers give the point,
    the innermost range tracecliff keeps around it on its thread, and the FSDP unit."""
    ts, thread = int(events.ts[at]), int(events.thread[at])
    _, phase = locate(trace, np.array([ts], np.int64), np.array([thread], np.int32))
    m = trace.markers
    around = np.flatnonzero((m.thread == thread) & (m.ts <= ts) & (m.end >= ts) & ~np.isin(m.kind, _NOT_AN_OP))
    op = trace.strings[int(m.name[around[np.argmax(m.ts[around])]])] if len(around) else None
    units = around[m.kind[around] == Marker.FSDP_UNIT]
    unit = fsdp_module_of(trace.strings[int(m.name[units[np.argmax(m.ts[units])]])]) if len(units) else None
    return {"offset_us": round((ts - start) / 1000.0, 3), "phase": PHASES[int(phase[0])], "op": op,
            "fsdp_unit": unit}


def _int(value: Any) -> int | None:
    value = float(value)
    return int(round(value)) if np.isfinite(value) else None
