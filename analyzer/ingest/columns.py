"""Turn decoded events into the columnar RankTrace.

Per-event work happens only in C-level passes (``map(attrgetter)``, ``np.fromiter``,
``pandas.factorize``); Python-level logic runs once per *unique* name, thread or category.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from itertools import count
from operator import attrgetter, itemgetter
from typing import Any, Sequence

import numpy as np
import pandas as pd

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
NO_ARGS = EventArgs()

_get = {name: attrgetter(name) for name in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}


def factorize(values) -> tuple[np.ndarray, list[Any]]:
    """Codes and uniques of an iterable of hashables, in first-seen order, entirely at C level:
    a defaultdict whose factory is a C counter assigns a code on first sight."""
    table: defaultdict = defaultdict(count().__next__)
    codes = np.fromiter(map(table.__getitem__, values), dtype=np.int64)
    return codes, list(table)


def _take(items: Sequence[Any], index: np.ndarray) -> list[Any]:
    if len(index) == 0:
        return []
    if len(index) == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def split_by_category(events: list[Event]) -> dict[str, list[Event]]:
    """Events of the categories tracecliff reads, grouped by category (one C-level pass).

    Kineto writes these categories as complete ('X') events; an event of them without a
    duration (a B/E pair or an instant from another generator) is dropped later with a
    warning, so no separate pass over 'ph' is needed."""
    cat_codes, cat_values = factorize(map(_get["cat"], events))
    groups = {}
    for code, value in enumerate(cat_values):
        if value in GPU_ACTIVITY_CATS or value in LAUNCH_CATS or value in CPU_OP_CATS:
            groups[value] = _take(events, np.flatnonzero(cat_codes == code))
    return groups


def times_ns(events: list[Event], warnings: list[str], what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, valid mask) in int64 ns; events with missing, non-finite or negative
    ts/dur are marked invalid (and counted in a warning) instead of poisoning the sums."""
    ts = _floats(list(map(_get["ts"], events)))
    dur = _floats(list(map(_get["dur"], events)))
    valid = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0)
    bad = int(len(events) - valid.sum())
    if bad:
        warnings.append(f"{bad} {what} event(s) with missing, non-numeric, NaN/Infinity or negative "
                        "ts/dur were ignored")
    ts = np.where(valid, ts, 0.0)
    dur = np.where(valid, dur, 0.0)
    start = _us_to_ns(ts)
    return start, start + np.rint(dur * 1000.0).astype(np.int64), valid


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    # Split whole µs from the fraction so the ×1000 keeps every nanosecond a float64 holds.
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _floats(values: list[Any]) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError):
        # Odd traces (None, numbers as strings, booleans): vectorised coercion, bad -> NaN.
        series = pd.Series(values, dtype=object)
        series[series.map(type) == bool] = None
        return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _ints(values: list[Any]) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        floats = _floats(values)
        out = np.full(len(values), MISSING, dtype=np.int64)
        ok = np.isfinite(floats) & (np.abs(floats) < 2**62)
        out[ok] = floats[ok].astype(np.int64)
        return out


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


def _args_of(events: list[Event]) -> list[EventArgs]:
    args = list(map(_get["args"], events))
    if None in args:
        args = [a if a is not None else NO_ARGS for a in args]
    return args


class Interner:
    """One string table per rank; strings are factorized per column, then merged (few uniques)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.strings: list[str] = []

    def ids(self, values: list[Any]) -> np.ndarray:
        if not values:
            return np.empty(0, dtype=np.int32)
        codes, uniques = factorize(values)
        table = np.array([self._id(_text(u)) for u in uniques], dtype=np.int32)
        return table[codes]

    def _id(self, text: str) -> int:
        idx = self.index.get(text)
        if idx is None:
            idx = self.index[text] = len(self.strings)
            self.strings.append(text)
        return idx


def thread_ids(events: list[Event], threads: Interner) -> np.ndarray:
    """Interned "pid:tid" per event, formatting each distinct pair once."""
    if not events:
        return np.empty(0, dtype=np.int32)
    pair_codes, pairs = factorize(zip(map(_get["pid"], events), map(_get["tid"], events)))
    labels = [threads._id(f"{pid}:{tid}") for pid, tid in pairs]
    return np.asarray(labels, dtype=np.int32)[pair_codes]


def build_gpu_events(groups: dict[str, list[Event]], interner: Interner, classifier: KernelClassifier,
                     warnings: list[str]) -> tuple[GpuEvents, dict[int, dict[str, Any]]]:
    events = [e for cat in sorted(GPU_ACTIVITY_CATS) for e in groups.get(cat, ())]
    start, end, valid = times_ns(events, warnings, "GPU")
    args = _args_of(events)
    stream = _ints(list(map(attrgetter("stream"), args)))
    no_stream = stream == MISSING
    if no_stream.any():  # fall back to the row (tid) the event is drawn on
        tids = _ints([_tid_stream(events[i]) for i in np.flatnonzero(no_stream)])
        stream[no_stream] = tids
    # CUDA sync markers without a stream (context sync) are not stream activity (as HTA).
    valid &= stream >= 0
    names = interner.ids(list(map(_get["name"], events)))
    cats = interner.ids(list(map(_get["cat"], events)))
    pair_codes, pairs = factorize(zip(cats.tolist(), names.tolist()))
    table = np.asarray([classifier(interner.strings[c], interner.strings[n]) for c, n in pairs], dtype=np.int8)
    kind = table[pair_codes] if len(events) else np.empty(0, dtype=np.int8)
    correlation = _ints(list(map(attrgetter("correlation"), args)))
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


def build_launches(groups: dict[str, list[Event]], threads: Interner, warnings: list[str],
                   wanted: np.ndarray | None = None) -> Launches:
    """Launch calls by correlation id; with ``wanted`` (the GPU events' correlation ids, sorted)
    only the calls that launched recorded GPU work are kept (most of them), cheaply."""
    events = [e for cat in sorted(LAUNCH_CATS) for e in groups.get(cat, ())]
    correlation = _ints(list(map(attrgetter("correlation"), _args_of(events))))
    keep = correlation >= 0
    if wanted is not None:
        keep &= np.isin(correlation, wanted)
    rows = np.flatnonzero(keep)
    events = _take(events, rows)
    correlation = correlation[rows]
    start, _, valid = times_ns(events, warnings, "CUDA runtime")
    thread = thread_ids(events, threads)
    order = np.flatnonzero(valid)[np.argsort(correlation[valid], kind="stable")]
    return Launches(correlation[order], start[order], thread[order])


def build_markers(groups: dict[str, list[Event]], interner: Interner, threads: Interner,
                  warnings: list[str]) -> Markers:
    events = [e for cat in sorted(CPU_OP_CATS) for e in groups.get(cat, ())]
    names_all = list(map(_get["name"], events))
    codes, uniques = factorize(names_all)
    unique_kind = np.array([_marker_kind(u) for u in uniques], dtype=np.int8)
    kind_all = unique_kind[codes] if len(events) else np.empty(0, np.int8)
    rows = np.flatnonzero(kind_all >= 0)
    events = _take(events, rows)
    kind = kind_all[rows]
    start, end, valid = times_ns(events, warnings, "CPU op")
    keep = np.flatnonzero(valid)
    names = interner.ids(list(map(_get["name"], events)))
    thread = thread_ids(events, threads)
    external = _ints(list(map(attrgetter("external_id"), _args_of(events))))
    order = keep[np.lexsort((-end[keep], start[keep]))]
    markers = Markers(start[order], end[order], thread[order], kind[order], names[order], external[order])
    for row, source in enumerate(order):
        if kind[source] in (4, 5):  # Marker.COMM_PARAMS, Marker.COMM_OP
            info = comm_args_of(events[source].args)
            if info:
                markers.comm_args[row] = info
    return markers


def _marker_kind(name: Any) -> int:
    kind = marker_kind(name) if isinstance(name, str) else None
    return -1 if kind is None else int(kind)


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
