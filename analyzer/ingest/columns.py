"""Turn decoded events into the columnar RankTrace (no per-event work beyond one split pass)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from analyzer.ingest.classify import (
    CPU_OP_CATS,
    GPU_ACTIVITY_CATS,
    LAUNCH_CATS,
    KernelClassifier,
    marker_kind,
)
from analyzer.ingest.schema import Event, EventArgs
from analyzer.trace import GpuEvents, GpuKind, Launches, Markers

MISSING = -1


def split_by_category(events: list[Event]) -> dict[str, list[Event]]:
    """One pass over all events: complete ('X') events grouped by category."""
    groups: dict[str, list[Event]] = defaultdict(list)
    skipped = 0
    for event in events:
        if event.ph == "X":
            groups[event.cat].append(event)
        elif event.ph is None:
            skipped += 1
    groups["__no_ph__"] = [None] * skipped  # only counted, for a warning
    return groups


def times_ns(events: list[Event], warnings: list[str], what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, valid mask) in int64 ns; events with missing, non-finite or negative
    ts/dur are marked invalid (and counted in a warning) instead of poisoning the sums."""
    ts = _floats((e.ts for e in events), len(events))
    dur = _floats((e.dur for e in events), len(events))
    valid = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
    bad = int(len(events) - valid.sum())
    if bad:
        warnings.append(f"{bad} {what} event(s) with missing, non-numeric, NaN/Infinity or negative ts/dur were ignored")
    ts = np.where(valid, ts, 0.0)
    dur = np.where(valid, dur, 0.0)
    start = _us_to_ns(ts)
    return start, start + np.rint(dur * 1000.0).astype(np.int64), valid


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    # Split whole µs from the fraction so the ×1000 keeps every nanosecond a float64 holds.
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _floats(values: Iterable[Any], count: int) -> np.ndarray:
    values = list(values)
    try:
        return np.fromiter(values, dtype=np.float64, count=count)
    except (TypeError, ValueError):
        return np.array([_to_float(v) for v in values], dtype=np.float64)


def _to_float(value: Any) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def to_int(value: Any, default: int = MISSING) -> int:
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return int(number) if math.isfinite(number) else default


def _ints(values: Iterable[Any], count: int) -> np.ndarray:
    values = list(values)
    try:
        return np.fromiter((MISSING if v is None else v for v in values), dtype=np.int64, count=count)
    except (TypeError, ValueError, OverflowError):
        return np.array([to_int(v) for v in values], dtype=np.int64)


class Interner:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.strings: list[str] = []

    def ids(self, names: Iterable[Any]) -> np.ndarray:
        table = self.index
        out = []
        append = out.append
        for name in names:
            key = name if isinstance(name, str) else ("" if name is None else str(name))
            idx = table.get(key)
            if idx is None:
                idx = table[key] = len(self.strings)
                self.strings.append(key)
            append(idx)
        return np.asarray(out, dtype=np.int32)

    def id(self, name: str) -> int:
        return int(self.ids([name])[0])


def build_gpu_events(groups: dict[str, list[Event]], interner: Interner, classifier: KernelClassifier,
                     warnings: list[str]) -> tuple[GpuEvents, dict[int, dict[str, Any]]]:
    events = [e for cat in sorted(GPU_ACTIVITY_CATS) for e in groups.get(cat, ())]
    start, end, valid = times_ns(events, warnings, "GPU")
    args = [e.args for e in events]
    stream = _ints((a.stream if a is not None and a.stream is not None else _tid_stream(e)
                    for a, e in zip(args, events)), len(events))
    on_stream = stream >= 0
    if events and not on_stream.all():
        # CUDA sync markers without a stream (context sync) are not stream activity (as HTA).
        valid &= on_stream
    kind = np.fromiter((classifier(e.cat, _text(e.name)) for e in events), dtype=np.int8, count=len(events))
    names = interner.ids(e.name for e in events)
    correlation = _ints((a.correlation if a is not None else None for a in args), len(events))
    keep = np.flatnonzero(valid)
    gpu = GpuEvents(start, end, stream, kind, names, correlation).take(keep)
    order = np.lexsort((gpu.end, gpu.ts))
    gpu = gpu.take(order)
    kept_rows = keep[order]
    kernel_args = {}
    for row in np.flatnonzero(gpu.kind == GpuKind.COMM):
        info = comm_args_of(args[kept_rows[row]])
        if info:
            kernel_args[int(row)] = info
    return gpu, kernel_args


def _tid_stream(event: Event) -> int | None:
    return event.tid if isinstance(event.tid, int) else None


def build_launches(groups: dict[str, list[Event]], threads: Interner, warnings: list[str]) -> Launches:
    events = [e for cat in sorted(LAUNCH_CATS) for e in groups.get(cat, ())
              if e.args is not None and e.args.correlation is not None]
    start, _, valid = times_ns(events, warnings, "CUDA runtime")
    correlation = _ints((e.args.correlation for e in events), len(events))
    thread = threads.ids(_thread_key(e) for e in events)
    keep = np.flatnonzero(valid & (correlation >= 0))
    order = np.argsort(correlation[keep], kind="stable")
    rows = keep[order]
    return Launches(correlation[rows], start[rows], thread[rows])


def _thread_key(event: Event) -> str:
    return f"{event.pid}:{event.tid}"


def build_markers(groups: dict[str, list[Event]], interner: Interner, threads: Interner,
                  warnings: list[str]) -> Markers:
    events, kinds = [], []
    for cat in sorted(CPU_OP_CATS):
        for event in groups.get(cat, ()):
            kind = marker_kind(event.name) if isinstance(event.name, str) else None
            if kind is not None:
                events.append(event)
                kinds.append(kind)
    start, end, valid = times_ns(events, warnings, "CPU op")
    keep = np.flatnonzero(valid)
    kind = np.asarray(kinds, dtype=np.int8)
    names = interner.ids(e.name for e in events)
    thread = threads.ids(_thread_key(e) for e in events)
    external = _ints((e.args.external_id if e.args is not None else None for e in events), len(events))
    order = keep[np.lexsort((-end[keep], start[keep]))]
    markers = Markers(start[order], end[order], thread[order], kind[order], names[order], external[order])
    for row, source in enumerate(order):
        if kind[source] in (4, 5):  # Marker.COMM_PARAMS, Marker.COMM_OP
            info = comm_args_of(events[source].args)
            if info:
                markers.comm_args[row] = info
    return markers


def comm_args_of(args: EventArgs | None) -> dict[str, Any]:
    """Collective metadata of one event's args, normalised; empty when it has none."""
    if args is None:
        return {}
    info: dict[str, Any] = {}
    if args.collective_name:
        info["collective"] = args.collective_name
    for key in ("in_nelems", "out_nelems", "group_size", "seq", "comms_id"):
        value = to_int(getattr(args, key))
        if value >= 0:
            info[key] = value
    if args.dtype:
        info["dtype"] = args.dtype
    if args.pg_name is not None:
        info["pg_name"] = str(args.pg_name)
    if args.pg_desc:
        info["pg_desc"] = args.pg_desc
    ranks = parse_ranks(args.pg_ranks)
    if ranks is not None:
        info["pg_ranks"] = ranks
    if len(args.input_dims):
        # Kept raw-decoded: which argument holds the message depends on the op (see comms).
        info["input_dims"] = _decode_raw(args.input_dims)
        info["input_types"] = _decode_raw(args.input_type)
    return info


def _decode_raw(raw: Any) -> Any:
    if raw is None or not len(raw):
        return None
    try:
        return json.loads(bytes(raw))
    except (ValueError, TypeError):
        return None


def parse_ranks(value: Any) -> list[int] | None:
    """Ranks of a process group: a list of ints, or the string form ``"[0, 1]"`` (dynolog)."""
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return list(value)
    return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))
