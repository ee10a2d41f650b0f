"""Turn decoded events into the columnar RankTrace.

Per-event work happens only in C-level passes (``map(attrgetter)``, ``np.fromiter``,
``pandas.factorize``); Python-level logic runs once per *unique* name, thread or category.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from functools import lru_cache
from itertools import chain, count
from operator import attrgetter, itemgetter
from typing import Any, Callable, Sequence

import numpy as np

from analyzer.base import arrays
from analyzer.base.limits import MAX_COMMS_ID, MAX_DEVICE_BYTES, MAX_DURATION_US, MAX_ID, MAX_WORLD
from analyzer.ingest.classify import (
    CPU_OP_CATS,
    ANNOTATION_CAT,
    FLOW_CATS,
    GPU_ACTIVITY_CATS,
    HOST_OP_CATS,
    IGNORED_CATS,
    LAUNCH_CATS,
    LEGACY_CATS,
    OPERATOR_CAT,
    KernelClassifier,
    operator_category,
    marker_kind,
    step_number,
)
from analyzer.ingest.hostops import HostOpDurations
from analyzer.ingest.memory import MEMORY_CAT, MemoryBuilder
from analyzer.ingest.p2p import P2P_ARG_NAMES
from analyzer.ingest.schema import Event, EventArgs
from analyzer.ingest.shapes import ShapeOps, ShapeOpsBuilder
from analyzer.ingest.trace import CommArgs, GpuEvents, GpuKind, Launches, Marker, Markers

MISSING = -1
NO_ARGS = EventArgs()

_get = {name: attrgetter(name) for name in ("cat", "name", "pid", "tid", "ts", "dur", "args")}


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


def split_by_category(events: list[Event], counts: dict[str, int] | None = None,
                      unread: dict[str, int] | None = None,
                      others: list[Event] | None = None) -> dict[str, list[Event]]:
    """Events of the categories tracecliff reads, grouped by category (one C-level pass), the old
    Kineto names (``LEGACY_CATS``, "Operator") under today's; ``counts``: the number of flow
    events (``FLOW_CATS``), added to ``counts["flow"]``; ``unread``: the events of unknown
    categories that look like device work (:func:`_device_like`), counted by category;
    ``others``: given, the events of every category not read, not counted as flows and not
    known to hold nothing (``IGNORED_CATS``) are appended to it (the allocator's ``[memory]`` events are among them: analyzer.ingest.memory).

    Kineto writes these categories as complete ('X') events; an event of them without a
    duration (a B/E pair or an instant from another generator) is dropped later with a
    warning, so no separate pass over 'ph' is needed."""
    cat_codes, cat_values = factorize(map(_get["cat"], events))
    groups: dict[str, list[Event]] = {}
    unknown = []
    for code, value in enumerate(cat_values):  # once per distinct category: a dict lookup each
        cat = LEGACY_CATS.get(value, value) if isinstance(value, str) else value
        if cat in READ_CATS:
            _add_group(groups, cat, _take(events, np.flatnonzero(cat_codes == code)))
        elif cat == OPERATOR_CAT:
            _split_operators(groups, _take(events, np.flatnonzero(cat_codes == code)))
        elif counts is not None and cat in FLOW_CATS:
            counts["flow"] = counts.get("flow", 0) + int(np.count_nonzero(cat_codes == code))
        elif cat not in IGNORED_CATS:  # python_function & co. hold no allocator event: not copied
            if others is not None:
                others += _take(events, np.flatnonzero(cat_codes == code))
            if isinstance(cat, str):
                unknown.append(code)
    if unread is not None and unknown:
        _count_unread(events, cat_codes, cat_values, unknown, unread)
    return groups


READ_CATS = GPU_ACTIVITY_CATS | LAUNCH_CATS | CPU_OP_CATS
_DEVICE_SAMPLE = 32  # events of an unknown category looked at: its first few tell what it holds
_UNKNOWN_EXAMINED = 64  # unknown categories looked at, the largest first: the cost follows the size only


def _count_unread(events: list[Event], cat_codes: np.ndarray, cat_values: list[Any], unknown: list[int],
                  unread: dict[str, int]) -> None:
    """Add to ``unread`` the events of the unknown categories (codes ``unknown``) whose first
    events look like device work (:func:`_device_like`); in one pass over the codes, however
    many categories a trace invents."""
    sizes = np.bincount(cat_codes, minlength=len(cat_values))
    chosen = sorted(unknown, key=lambda code: (-int(sizes[code]), code))[:_UNKNOWN_EXAMINED]
    rows = np.flatnonzero(np.isin(cat_codes, chosen))
    rows = rows[np.argsort(cat_codes[rows], kind="stable")]  # each category's rows together, in order
    begins = np.searchsorted(cat_codes[rows], sorted(chosen))
    for code, begin in zip(sorted(chosen), begins.tolist()):
        if _device_like(_take(events, rows[begin:begin + min(_DEVICE_SAMPLE, int(sizes[code]))])):
            unread[cat_values[code]] = unread.get(cat_values[code], 0) + int(sizes[code])


def _add_group(groups: dict[str, list[Event]], cat: str, events: list[Event]) -> None:
    if cat in groups:  # an old and a new name in one trace (merged traces)
        groups[cat] = groups[cat] + events
    else:
        groups[cat] = events


def _split_operators(groups: dict[str, list[Event]], events: list[Event]) -> None:
    """Old "Operator" events as today's ``cpu_op`` and ``user_annotation`` (``operator_category``,
    judged once per distinct name), each in the trace's order."""
    codes, names = factorize(map(_get["name"], events))
    annotation = np.array([operator_category(n) == ANNOTATION_CAT for n in names], dtype=bool)[codes] if names \
        else np.zeros(0, dtype=bool)
    for cat, rows in ((ANNOTATION_CAT, np.flatnonzero(annotation)), ("cpu_op", np.flatnonzero(~annotation))):
        if len(rows):
            _add_group(groups, cat, _take(events, rows))


def _device_like(events: list[Event]) -> bool:
    """Whether events look like device work: on a GPU stream (a ``stream`` arg, a "stream N"
    row), correlated to a runtime launch, or named as CUDA kernels are (``void f<T>(...)``)."""
    for event in events:
        args = event.args
        if args is not None and (args.stream is not None or args.correlation is not None):
            return True
        if isinstance(event.tid, str) and event.tid.startswith("stream"):
            return True
        if isinstance(event.name, str) and event.name.startswith("void "):
            return True
    return False


def times_ns(events: list[Event]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, valid mask) in int64 ns; events with missing, non-finite or negative
    ts/dur are marked invalid (the caller counts them for a warning) instead of poisoning sums."""
    ts = _column(events, _get["ts"], np.float64)
    dur = _column(events, _get["dur"], np.float64)
    # Beyond 2**52 µs (143 years) a time no longer fits int64 ns once summed, and no event
    # lasts longer than MAX_DURATION_US (a week): out of range.
    valid = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (np.abs(ts) < 2**52) & (dur <= MAX_DURATION_US)
    ts = np.where(valid, ts, 0.0)
    dur = np.where(valid, dur, 0.0)
    start = _us_to_ns(ts)
    return start, start + np.rint(dur * 1000.0).astype(np.int64), valid



def _us_to_ns(us: np.ndarray) -> np.ndarray:
    # Split whole µs from the fraction so the ×1000 keeps every nanosecond a float64 holds.
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _column(events: list[Event], getter: Callable[[Event], Any], dtype, rejected: Rejected | None = None,
            field: str = "") -> np.ndarray:
    """One field of every event as an array, straight from a C-level map (no list in between);
    odd values (None, strings, integers beyond int64) take the tolerant path, which counts in
    ``rejected[field]`` the integer values it could not read."""
    try:
        return np.fromiter(map(getter, events), dtype=dtype, count=len(events))
    except (TypeError, ValueError, OverflowError, AttributeError):
        values = [_safe_get(getter, e) for e in events]
        return _floats(values) if dtype == np.float64 else _ints(values, rejected, field)


def _safe_get(getter: Callable[[Event], Any], event: Event) -> Any:
    try:
        return getter(event)
    except AttributeError:  # "args.x" on an event without args
        return None


def _floats(values: list[Any]) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError):
        # Odd traces (None, numbers as strings, booleans): vectorised coercion, bad -> NaN.
        import pandas as pd  # only for odd traces: keeps ~0.5 s of import off every run

        series = pd.Series(values, dtype=object)
        series[series.map(type) == bool] = None
        return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


class Rejected(dict):
    """Values of a field that were present but unusable (non-numeric, beyond int64, implausible),
    by field: ``{field: [count, first value]}``; each field becomes one warning naming it."""

    def add(self, field: str, count: int, example: Any) -> None:
        if count:
            seen = self.setdefault(field, [0, example])
            seen[0] += count

    def merge(self, other: dict[str, list]) -> None:
        for field, (seen, example) in other.items():
            self.add(field, seen, example)

    def warnings(self, what: str) -> list[str]:
        return [f"{seen} {what} with a non-numeric, out-of-range or implausible {field} (e.g. {_shown(example)}): "
                "read as unknown" for field, (seen, example) in sorted(self.items())]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _ints(values: list[Any], rejected: Rejected | None = None, field: str = "") -> np.ndarray:
    """int64 of each value, MISSING where it is absent, non-numeric or beyond int64 (counted in
    ``rejected[field]``, absent ones excepted). Integers are read exactly, whatever their size."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        floats = _floats(values)
        out = np.full(len(values), MISSING, dtype=np.int64)
        ok = np.isfinite(floats) & (np.abs(floats) < 2.0**63)
        out[ok] = floats[ok].astype(np.int64)
        # A double holds integers exactly to 2**53: wider ones are taken from the value itself.
        for i in np.flatnonzero(ok & (np.abs(floats) >= 2.0**53)).tolist():
            if type(values[i]) is int:  # noqa: E721  (bool is no id)
                ok[i] = -MAX_ID - 1 <= values[i] <= MAX_ID
                out[i] = values[i] if ok[i] else MISSING
        if rejected is not None:
            bad = int(len(values) - ok.sum()) - values.count(None)
            if bad:
                rejected.add(field, bad, values[int(np.argmax(~ok & np.fromiter(
                    (v is not None for v in values), dtype=bool, count=len(values))))])
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


_ARG_CORRELATION = attrgetter("args.correlation")
_ARG_EXTERNAL_ID = attrgetter("args.external_id")


def _joined(groups: dict[str, list[Event]], cats) -> list[Event]:
    return list(chain.from_iterable(groups.get(cat, ()) for cat in sorted(cats)))


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

    def ids_of_codes(self, codes: np.ndarray, uniques: list[Any]) -> np.ndarray:
        """Ids of factorized values: the uniques that occur are interned in order of first
        occurrence among ``codes`` (the order :meth:`ids` of the values would meet them)."""
        if not len(codes):
            return np.empty(0, dtype=np.int32)
        present, first = np.unique(codes, return_index=True)
        table = np.zeros(len(uniques), dtype=np.int32)
        for code in present[np.argsort(first, kind="stable")].tolist():
            table[code] = self._id(_text(uniques[code]))
        return table[codes]

    def _id(self, text: str) -> int:
        idx = self.index.get(text)
        if idx is None:
            idx = self.index[text] = len(self.strings)
            self.strings.append(text)
        return idx


def thread_ids(events: list[Event], threads: Interner) -> np.ndarray:
    """Interned "pid:tid" per event, formatting each distinct pair once: one C-level pass
    factorizes the (pid, tid) tuples (cheaper than two passes and a numeric combination)."""
    if not events:
        return np.empty(0, dtype=np.int32)
    pair_codes, pairs = factorize(map(_PID_TID, events))
    labels = [threads._id(f"{pid}:{tid}") for pid, tid in pairs]
    return np.asarray(labels, dtype=np.int32)[pair_codes]


_PID_TID = attrgetter("pid", "tid")


class ColumnBuilder:
    """One rank's columns, built from batches of events (streaming ingest) and finished once.

    Each batch is split by category and reduced at once to compact arrays of its valid rows
    (plus the collective args of the few communication rows), so the decoded events of a batch
    can be dropped before the next one is read."""

    def __init__(self, classifier: KernelClassifier) -> None:
        self.classifier = classifier
        self.names, self.threads = Interner(), Interner()
        self.event_count = 0
        # Flow events (launch -> kernel arrows) and runtime calls seen: a trace with neither
        # flows nor runtime calls beyond the launches was filtered (analyzer.rank.attribution).
        self.counts = {"flow": 0, "runtime": 0}
        self.invalid = {"GPU": 0, "CUDA runtime": 0, "CPU op": 0}
        self.unread: dict[str, int] = {}  # device-looking events of unknown categories, by category
        self.rejected = Rejected()
        self._gpu: list[tuple[np.ndarray, ...]] = []
        self._launches: list[tuple[np.ndarray, ...]] = []
        self._markers: list[tuple[np.ndarray, ...]] = []
        self._gpu_args = CommArgsBuilder()  # by row among all kept GPU rows so far
        self._marker_args = CommArgsBuilder()
        self._gpu_rows = self._marker_rows = 0
        self.shapes = ShapeOpsBuilder()  # the CPU ops whose shapes tell their FLOPs
        self.host_ops = HostOpDurations(Interner())  # for the inflated host ops (analyzer.ingest.hostops)
        self.host_op_medians: dict[str, float] = {}
        self.memory = MemoryBuilder()  # the allocator's [memory] events (analyzer.ingest.memory)

    def add(self, events: list[Event]) -> None:
        self.event_count += len(events)
        others: list[Event] = []
        groups = split_by_category(events, self.counts, self.unread, others)
        self.memory.add(others + groups.get(MEMORY_CAT, []), _floats, lambda rows: thread_ids(rows, self.threads))
        self._add_gpu(groups)
        self._add_launches(_joined(groups, LAUNCH_CATS))
        # Runtime calls join the CPU ops for the markers: a cudaStreamSynchronize is a host range.
        cats = sorted((CPU_OP_CATS | LAUNCH_CATS).intersection(groups))  # the order of _joined
        sizes = [len(groups[cat]) for cat in cats]
        host_rows = np.repeat([cat in HOST_OP_CATS for cat in cats], sizes).astype(bool)
        annotations = np.repeat([cat == ANNOTATION_CAT for cat in cats], sizes).astype(bool)
        self._add_markers(_joined(groups, CPU_OP_CATS | LAUNCH_CATS), host_rows, annotations)

    def _add_gpu(self, groups: dict[str, list[Event]]) -> None:
        cats = sorted(GPU_ACTIVITY_CATS.intersection(groups))  # the order of _joined
        events = _joined(groups, cats)
        if not events:
            return
        start, end, valid = times_ns(events)
        args = _args_of(events)
        stream = _ints(list(map(attrgetter("stream"), args)), self.rejected, "args.stream")
        no_stream = stream == MISSING
        if no_stream.any():  # fall back to the row (tid) the event is drawn on
            stream[no_stream] = _ints([_tid_stream(events[i]) for i in np.flatnonzero(no_stream)], self.rejected, "tid")
        self.invalid["GPU"] += int(len(events) - valid.sum())
        # CUDA sync markers without a stream (context sync) are not stream activity (as HTA).
        keep = np.flatnonzero(valid & (stream >= 0))
        names = self.names.ids(list(map(_get["name"], events)))
        kind = self._gpu_kinds(names, cats, [len(groups[cat]) for cat in cats])
        correlation = _ints(list(map(attrgetter("correlation"), args)), self.rejected, "args.correlation")
        self._gpu.append((start[keep], end[keep], stream[keep], kind[keep], names[keep], correlation[keep]))
        comm = np.flatnonzero(kind[keep] == GpuKind.COMM)
        self._gpu_args.add(_take(args, keep[comm]), comm + self._gpu_rows, self.rejected)
        self._gpu_rows += len(keep)

    def _gpu_kinds(self, names: np.ndarray, cats: list[str], sizes: list[int]) -> np.ndarray:
        """GpuKind of rows grouped by category (``sizes`` rows of each of ``cats``, in order):
        the category of a row is known from its group, so only the names are read per row and
        the classifier runs once per distinct name of each category."""
        for cat in cats:  # interned after the names, as a pass over the rows' categories did
            self.names._id(cat)
        strings = self.names.strings
        kind = np.empty(len(names), dtype=np.int8)
        table = np.zeros(len(strings), dtype=np.int8)
        for cat, stop, size in zip(cats, np.cumsum(sizes).tolist(), sizes):
            rows = names[stop - size:stop]
            present = arrays.unique(rows).tolist()
            table[present] = [self.classifier(cat, strings[n]) for n in present]
            kind[stop - size:stop] = table[rows]
        return kind

    def _add_launches(self, events: list[Event]) -> None:
        self.counts["runtime"] += len(events)
        correlation = _column(events, _ARG_CORRELATION, np.int64, self.rejected, "args.correlation")
        rows = np.flatnonzero(correlation >= 0)
        if not len(rows):
            return
        events = _take(events, rows)
        # The duration: how long the host sat in the call (a copy to pageable memory blocks).
        start, end, valid = times_ns(events)
        self.invalid["CUDA runtime"] += int(len(events) - valid.sum())
        thread = thread_ids(events, self.threads)
        self._launches.append((correlation[rows][valid], start[valid], thread[valid], end[valid]))

    def _add_markers(self, events: list[Event], host_rows: np.ndarray, annotations: np.ndarray) -> None:
        if not events:
            return
        codes, uniques = factorize(map(_get["name"], events))
        self._add_shape_ops(events, codes, uniques)
        self.host_ops.add(events, codes, uniques, host_rows, _column(events, _get["dur"], np.float64), times_ns,
                          lambda chosen: thread_ids(chosen, self.threads))
        unique_kind = np.array([_marker_kind(u) for u in uniques], dtype=np.int8)
        kind_all = unique_kind[codes]
        # The user's own annotations: where a trace has no ProfilerStep, repeating ones mark steps.
        kind_all[(kind_all < 0) & annotations] = Marker.ANNOTATION
        rows = np.flatnonzero(kind_all >= 0)
        events = _take(events, rows)
        kind = kind_all[rows]
        start, end, valid = times_ns(events)
        self.invalid["CPU op"] += int(len(events) - valid.sum())
        keep = np.flatnonzero(valid)
        names = self.names.ids_of_codes(codes[rows], uniques)  # the names are factorized already
        thread = thread_ids(events, self.threads)
        external = _column(events, _ARG_EXTERNAL_ID, np.int64, self.rejected, "args.External id")
        self._markers.append((start[keep], end[keep], thread[keep], kind[keep], names[keep], external[keep]))
        comm = np.flatnonzero((kind[keep] == 4) | (kind[keep] == 5))  # COMM_PARAMS, COMM_OP
        self._marker_args.add(_args_of(_take(events, keep[comm])), comm + self._marker_rows, self.rejected)
        self._marker_rows += len(keep)

    def _add_shape_ops(self, events: list[Event], codes: np.ndarray, uniques: list[Any]) -> None:
        """The CPU ops whose recorded shapes tell their FLOPs (analyzer.ingest.shapes), from
        the names factorized for the markers."""
        self.shapes.add(events, codes, uniques, times_ns, lambda rows: thread_ids(rows, self.threads),
                        lambda rows: _column(rows, _ARG_EXTERNAL_ID, np.int64))

    def export(self) -> dict[str, Any]:
        """This builder's batches as plain data (arrays, lists, dicts), for :meth:`merge` in
        another process (analyzer.ingest.parallel)."""
        return {"names": self.names.strings, "threads": self.threads.strings, "gpu": self._gpu,
                "launches": self._launches, "markers": self._markers, "gpu_args": self._gpu_args.export(),
                "marker_args": self._marker_args.export(), "gpu_rows": self._gpu_rows,
                "marker_rows": self._marker_rows, "invalid": self.invalid, "rejected": dict(self.rejected),
                "event_count": self.event_count, "shapes": self.shapes.export(), "counts": self.counts,
                "unread": self.unread,
                "host_ops": self.host_ops.export(), "memory": self.memory.export()}

    def merge(self, part: dict[str, Any]) -> None:
        """Append another builder's batches (its :meth:`export`) as if they had been added here:
        its string ids are re-interned in its own first-seen order, which is the order this
        builder would have met them in, so the tables come out identical."""
        names = np.array([self.names._id(s) for s in part["names"]] or [0], dtype=np.int32)
        threads = np.array([self.threads._id(s) for s in part["threads"]] or [0], dtype=np.int32)
        self._gpu += [(start, end, stream, kind, names[name], corr)
                      for start, end, stream, kind, name, corr in part["gpu"]]
        self._launches += [(corr, start, threads[thread], end) for corr, start, thread, end in part["launches"]]
        self._markers += [(start, end, threads[thread], kind, names[name], external)
                          for start, end, thread, kind, name, external in part["markers"]]
        self._gpu_args.merge(part["gpu_args"], self._gpu_rows)
        self._marker_args.merge(part["marker_args"], self._marker_rows)
        self._gpu_rows += part["gpu_rows"]
        self._marker_rows += part["marker_rows"]
        for what, bad in part["invalid"].items():
            self.invalid[what] += bad
        self.rejected.merge(part["rejected"])
        self.event_count += part["event_count"]
        self.shapes.merge(part["shapes"], threads)
        for what, seen in part["counts"].items():
            self.counts[what] += seen
        for cat, seen in part["unread"].items():
            self.unread[cat] = self.unread.get(cat, 0) + seen
        self.host_ops.merge(part["host_ops"], threads)
        self.memory.merge(part["memory"], threads)

    def finish_shapes(self) -> ShapeOps:
        return self.shapes.finish()

    def finish(self, warnings: list[str]) -> tuple[GpuEvents, CommArgs, Launches, Markers]:
        for what, bad in self.invalid.items():
            if bad:
                warnings.append(f"{bad} {what} event(s) with missing, non-numeric, NaN/Infinity, negative or out-of-range "
                                "ts/dur were ignored")
        warnings += self.rejected.warnings("event(s)")
        warnings += self.unread_warnings()
        gpu, kernel_args = self._finish_gpu(warnings)
        return gpu, kernel_args, self._finish_launches(arrays.unique(gpu.correlation)), self._finish_markers(warnings)

    def unread_warnings(self) -> list[str]:
        """One warning naming the unknown categories whose events look like device work."""
        if not self.unread:
            return []
        largest = sorted(self.unread.items(), key=lambda item: (-item[1], item[0]))
        named = ", ".join(f"{_shown(cat)} ({seen:,})" for cat, seen in largest[:6])
        more = f" and {len(largest) - 6:,} more" if len(largest) > 6 else ""
        return [f"{sum(self.unread.values()):,} event(s) under categories tracecliff does not know look like device "
                f"work (a GPU stream, a launch correlation or a kernel's name): {named}{more}; not read, so the GPU "
                "figures leave them out"]

    def _finish_gpu(self, warnings: list[str]) -> tuple[GpuEvents, CommArgs]:
        columns, kept = _unique_rows(self._gpu, (np.int64, np.int64, np.int64, np.int8, np.int32, np.int64),
                                     warnings, "GPU event(s) (same stream, start, end, name and correlation)")
        self._gpu = []
        order = kept[np.lexsort((columns[1][kept], columns[0][kept]))]
        gpu = GpuEvents(*(c[order] for c in columns))
        return gpu, self._gpu_args.finish(order)

    def _finish_launches(self, wanted: np.ndarray) -> Launches:
        correlation, start, thread, end = _concat(self._launches, (np.int64, np.int64, np.int32, np.int64))
        self._launches = []
        # Only the calls that launched recorded GPU work matter (most of them).
        rows = np.flatnonzero(np.isin(correlation, wanted))
        rows = rows[np.argsort(correlation[rows], kind="stable")]
        return Launches(correlation[rows], start[rows], thread[rows], end[rows])

    def _finish_markers(self, warnings: list[str]) -> Markers:
        inflated, self.host_op_medians = self.host_ops.inflated(self.names._id)
        if len(inflated[0]):
            self._markers.append(inflated)
        columns, kept = _unique_rows(self._markers, (np.int64, np.int64, np.int32, np.int8, np.int32, np.int64),
                                     warnings, "CPU op(s) (same thread, start, end and name)")
        self._markers = []
        start, end = columns[0], columns[1]
        order = kept[np.lexsort((-end[kept], start[kept]))]
        markers = Markers(*(c[order] for c in columns))
        markers.comm_args = self._marker_args.finish(order)
        warnings += self._unnumbered_steps(markers)
        return markers

    def _unnumbered_steps(self, markers: Markers) -> list[str]:
        """A warning for the ProfilerStep markers whose number no step can have (checked once
        per distinct name): they mark no step."""
        names = arrays.unique(markers.name[markers.kind == Marker.STEP]).tolist()
        bad = [self.names.strings[n] for n in names if step_number(self.names.strings[n]) is None]
        if not bad:
            return []
        count = int(np.isin(markers.name, [self.names.index[b] for b in bad]).sum())
        return [f"{count} ProfilerStep marker(s) whose step number is no number or out of range "
                f"(0 to 2**53-1; e.g. {_shown(bad[0])}): they mark no step"]


def _unique_rows(parts, dtypes, warnings: list[str], what: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The batches' columns joined, and the rows to keep: exact duplicates (a trace merged or
    written twice) count once, so they double no time, collective or bucket."""
    columns = _concat(parts, dtypes)
    kept = _first_of_duplicates(columns)
    if len(kept) < len(columns[0]):
        warnings.append(f"{len(columns[0]) - len(kept)} duplicate {what} were dropped: each counts once")
    return columns, kept


def _concat(parts: list[tuple[np.ndarray, ...]], dtypes: tuple) -> list[np.ndarray]:
    if not parts:
        return [np.empty(0, dtype=d) for d in dtypes]
    return [np.concatenate([p[i] for p in parts]).astype(d, copy=False) for i, d in enumerate(dtypes)]


def _first_of_duplicates(columns: list[np.ndarray]) -> np.ndarray:
    """Rows to keep, ascending: the first of each group of rows equal in every column."""
    count = len(columns[0])
    if count < 2:
        return np.arange(count)
    order = np.lexsort(columns[::-1])  # stable: among equal rows the earliest comes first
    same = np.ones(count - 1, dtype=bool)
    for column in columns:
        ranked = column[order]
        same &= ranked[1:] == ranked[:-1]
    drop = np.zeros(count, dtype=bool)
    drop[order[1:][same]] = True
    return np.flatnonzero(~drop)


def _tid_stream(event: Event) -> int | None:
    """The stream of GPU work written without a ``stream`` arg: its row, an int or "stream N"
    (Kineto's row name; PyTorch 1.9's kernels carry only it)."""
    tid = event.tid
    if isinstance(tid, str) and tid.startswith("stream ") and tid[7:].isdigit() and len(tid) < 20:
        return int(tid[7:])
    return tid if isinstance(tid, int) else None


def _marker_kind(name: Any) -> int:
    kind = marker_kind(name) if isinstance(name, str) else None
    return -1 if kind is None else int(kind)


class CommArgsBuilder:
    """The collective metadata of one kind of rows (GPU events or CPU markers), batch by batch,
    as columns (``CommArgs``): each distinct combination of repeating fields is normalised once
    (:func:`_comm_shape`) and numbered; ``Seq`` and ``Comms Id`` become arrays. No dict per
    collective (issue 28: a dict per row cost 0.07 s of a collective-heavy rank)."""

    def __init__(self) -> None:
        self.index: dict[tuple, int] = {}  # a combination's fields -> its number
        self.keys: list[tuple | None] = []  # by number (None: unhashable fields, numbered per row)
        self.shapes: list[tuple] = []
        self.empty: list[bool] = []  # by number: the combination alone gives no metadata
        self.parts: list[tuple[np.ndarray, ...]] = []  # (rows, shape, seq, comms id, has comms id)

    def add(self, args: list[EventArgs], rows: np.ndarray, rejected: Rejected | None = None) -> None:
        """The args of the events at ``rows`` (most hold no collective metadata: skipped in
        C-level passes); unusable values counted in ``rejected`` as :func:`comm_args_of` does."""
        if not args:
            return
        unset = np.fromiter(map(_NO_META.__eq__, map(_META_FIELDS, args)), dtype=bool, count=len(args))
        keep = np.flatnonzero(~unset)
        if not len(keep):
            return
        args, rows = _take(args, keep), rows[keep]
        shape = self._codes(_shape_fields(args))
        seq, _ = _id_column(list(map(_SEQ, args)), "seq", rejected)
        comms_id, has_comms_id = _id_column(list(map(_COMMS_ID, args)), "comms_id", rejected)
        self._count_bad(shape, rejected)
        empty = np.array(self.empty, dtype=bool)[shape]
        kept = np.flatnonzero(~empty | (seq >= 0) | has_comms_id)  # an empty dict is no metadata
        if len(kept):
            self.parts.append((rows[kept].astype(np.int64), shape[kept], seq[kept], comms_id[kept], has_comms_id[kept]))

    def _codes(self, fields: list[tuple]) -> np.ndarray:
        try:
            local, uniques = factorize(fields)
        except TypeError:  # a list of ranks (unhashable): those rows numbered one by one
            local, uniques = factorize(f if _hashable(f) else _Unhashable(f) for f in fields)
        return np.array([self._number(u) for u in uniques], dtype=np.int32)[local]

    def _number(self, fields: Any) -> int:
        if isinstance(fields, _Unhashable):
            return self._append(None, _comm_shape.__wrapped__(fields.fields))
        number = self.index.get(fields)
        if number is None:
            number = self.index[fields] = self._append(fields, _comm_shape(fields))
        return number

    def _append(self, key: tuple | None, shape: tuple) -> int:
        head, tail, ranks, shapes, _ = shape
        self.keys.append(key)
        self.shapes.append(shape)
        self.empty.append(not (head or tail or ranks is not None or shapes))
        return len(self.shapes) - 1

    def _count_bad(self, shape: np.ndarray, rejected: Rejected | None) -> None:
        """The unusable repeating fields, once per row that holds them (in order of first
        appearance, so each field's example is its first row's)."""
        if rejected is None:
            return
        present, first, counts = np.unique(shape, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        for code, rows in zip(present[order].tolist(), counts[order].tolist()):
            for field, value in self.shapes[code][4]:
                rejected.add(field, rows, value)

    def export(self) -> dict[str, Any]:
        return {"keys": self.keys, "shapes": self.shapes, "parts": self.parts}

    def merge(self, part: dict[str, Any], row_offset: int) -> None:
        """Another builder's batches (:meth:`export`), its rows after ``row_offset``: its
        combinations numbered again here."""
        numbers = np.array([self._append(None, shape) if key is None else self._number(key)
                            for key, shape in zip(part["keys"], part["shapes"])] or [0], dtype=np.int32)
        self.parts += [(rows + row_offset, numbers[shape], seq, comms_id, has)
                       for rows, shape, seq, comms_id, has in part["parts"]]

    def finish(self, order: np.ndarray) -> CommArgs:
        """The metadata after the rows were reordered (and some dropped) by ``order``."""
        if not self.parts or not len(order):
            return CommArgs.empty()
        rows, shape, seq, comms_id, has = (np.concatenate(column) for column in zip(*self.parts))
        self.parts = []
        new_row = np.full(max(int(order.max()), int(rows.max())) + 1, -1, dtype=np.int64)
        new_row[order] = np.arange(len(order))
        new = new_row[rows]
        kept = np.flatnonzero(new >= 0)
        kept = kept[np.argsort(new[kept], kind="stable")]
        return CommArgs(new[kept], shape[kept], seq[kept], comms_id[kept], has[kept],
                        [shape_[:4] for shape_ in self.shapes])


class _Unhashable:
    """Fields that cannot key a table (a list of ranks): a combination of their own."""

    __slots__ = ("fields",)

    def __init__(self, fields: tuple) -> None:
        self.fields = fields


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _shape_fields(args: list[EventArgs]) -> list[tuple]:
    """The repeating fields of each args (``_SHAPE_NAMES``), with the recorded shapes' text
    where there are any (the ``nccl:*`` ops of a job that records shapes; ``Concrete Inputs``
    holds a ``c10d::send``'s peer), and a send's or receive's peer fields (a tuple, last)."""
    fields = list(map(_SHAPE_FIELDS, args))
    dims = list(map(_DIMS, args))
    for i in np.flatnonzero(np.fromiter(map(len, dims), dtype=np.int64, count=len(dims))).tolist():
        fields[i] += (bytes(dims[i]), bytes(args[i].input_type), bytes(args[i].concrete_inputs))
    p2p = np.fromiter(map(P2P_ARG_NAMES.__contains__, map(_NAME, args)), dtype=bool, count=len(args))
    for i in np.flatnonzero(p2p).tolist():
        fields[i] += (_PEER_FIELDS(args[i]),)
    return fields


def _id_column(values: list[Any], key: str, rejected: Rejected | None) -> tuple[np.ndarray, np.ndarray]:
    """(value, present) of a ``Seq`` or ``Comms Id`` field of each args: ints in the field's
    range (``_ARG_LIMITS``; numbers written otherwise read as ints), else absent, and those
    present but unusable counted in ``rejected`` (not -1: it has always meant "none")."""
    name, limit = _ARG_LIMITS[key]
    kinds = set(map(type, values))
    if kinds <= {type(None)}:  # the field is not written (Seq and Comms Id before torch 2.12)
        return np.full(len(values), MISSING if key == "seq" else 0, dtype=np.int64 if key == "seq" else np.uint64), \
            np.zeros(len(values), dtype=bool)
    if kinds == {int}:  # the usual: every one an int, read in one C-level pass (beyond the dtype: below)
        try:
            column = np.fromiter(values, dtype=np.int64 if key == "seq" else np.uint64, count=len(values))
        except OverflowError:
            pass
        else:
            present = column >= 0 if key == "seq" else np.ones(len(values), dtype=bool)
            if rejected is not None and not present.all():
                bad = np.flatnonzero(column < MISSING)  # -1 has always meant "none"
                if len(bad):
                    rejected.add(f"args.{name}", len(bad), values[int(bad[0])])
            return np.where(present, column, MISSING) if key == "seq" else column, present
    ints = [v if type(v) is int or v is None else to_int(v) for v in values]  # noqa: E721  (ints skip the call)
    present = [v is not None and 0 <= v <= limit for v in ints]
    if rejected is not None and not all(present):
        bad = [v for v, ok in zip(ints, present) if not ok and v is not None and (v >= 0 or v < MISSING)]
        if bad:
            rejected.add(f"args.{name}", len(bad), bad[0])
    dtype = np.int64 if key == "seq" else np.uint64
    column = np.array([v if ok else (MISSING if key == "seq" else 0) for v, ok in zip(ints, present)], dtype=dtype)
    return column, np.array(present, dtype=bool)


_SEQ = attrgetter("seq")
_COMMS_ID = attrgetter("comms_id")
_DIMS = attrgetter("input_dims")
_NAME = attrgetter("collective_name")
_PEER_FIELDS = attrgetter("src_rank", "dst_rank", "rank")


def bounded_int(value: Any, limit: int, low: int = 0) -> tuple[int | None, bool]:
    """(the integer of a count or id field, None when absent or unusable; whether it was present
    but unusable: non-numeric, or outside ``[low, limit]``)."""
    if value is None:
        return None, False
    number = to_int(value, None)  # type: ignore[arg-type]
    if number is None or not low <= number <= limit:
        return None, True
    return number, False


# Each collective field's args name (for warnings) and upper bound: an element is at least a
# byte and lives in one device's memory; a group is part of a world.
_ARG_LIMITS = {"in_nelems": ("In msg nelems", MAX_DEVICE_BYTES), "out_nelems": ("Out msg nelems", MAX_DEVICE_BYTES),
               "group_size": ("Group size", MAX_WORLD), "seq": ("Seq", MAX_ID), "comms_id": ("Comms Id", MAX_COMMS_ID)}


def comm_args_of(args: EventArgs | None, rejected: Rejected | None = None) -> dict[str, Any]:
    """Collective metadata of one event's args, normalised; empty when it has none (the
    columns of :class:`CommArgsBuilder` for one event, as its ``CommArgs.get`` reads them)."""
    if args is None:
        return {}
    builder = CommArgsBuilder()
    builder.add([args], np.zeros(1, dtype=np.int64), rejected)
    return builder.finish(np.zeros(1, dtype=np.int64)).get(0, {})


# The fields of a collective's args that repeat between collectives (``seq`` and ``comms_id``
# are per collective), and the same with none set. msgspec decodes none of them as a bool, so
# two tuples compare equal only when every field normalises to the same value (1 == 1.0 both
# give 1).
_SHAPE_NAMES = ("collective_name", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks")
_SHAPE_FIELDS = attrgetter(*_SHAPE_NAMES)
_NO_SHAPE = (None,) * 8
# Every field that makes comm_args_of non-empty, and their values when none is set: one pass
# (the recorded shapes unset are the default Raw(b""), which every decoded event shares).
_META_FIELDS = attrgetter(*_SHAPE_NAMES, "seq", "comms_id", "input_dims")
_NO_META = (None,) * 10 + (NO_ARGS.input_dims,)


@lru_cache(maxsize=1 << 14)
def _comm_shape(fields: tuple) -> tuple[dict[str, Any], dict[str, Any], tuple[int, ...] | None, dict[str, Any],
                                        tuple[tuple[str, Any], ...]]:
    """(keys before ``seq``, keys between ``comms_id`` and the ranks, the ranks, the recorded
    shapes, the (field, value) pairs left out as unusable) of :func:`comm_args_of` for one
    combination of repeating fields, so that its dict keeps the key order it has always had."""
    collective, in_nelems, out_nelems, group_size, dtype, pg_name, pg_desc, pg_ranks = fields[:8]
    head: dict[str, Any] = {}
    bad: list[tuple[str, Any]] = []
    if collective:
        head["collective"] = collective
    for key, raw in (("in_nelems", in_nelems), ("out_nelems", out_nelems), ("group_size", group_size)):
        name, limit = _ARG_LIMITS[key]
        value, unusable = bounded_int(raw, limit)
        if value is not None:
            head[key] = value
        elif unusable and to_int(raw, None) != MISSING:  # type: ignore[arg-type]  (-1 has always meant "none")
            bad.append((f"args.{name}", raw))
    tail: dict[str, Any] = {}
    if dtype:
        tail["dtype"] = dtype
    if pg_name is not None:
        tail["pg_name"] = str(pg_name)
    if pg_desc:
        tail["pg_desc"] = pg_desc
    ranks = parse_ranks(pg_ranks)
    if ranks is not None and not all(0 <= r < MAX_WORLD for r in ranks):
        bad.append(("args.Process Group Ranks", next(r for r in ranks if not 0 <= r < MAX_WORLD)))
        ranks = None  # a rank beyond any world: the group's members are unknown
    peer = fields[-1] if len(fields) > 8 and isinstance(fields[-1], tuple) else None
    if peer is not None:
        tail.update(_peer_keys(peer, bad))
    shapes: dict[str, Any] = {}
    if len(fields) > 9:
        # Kept raw-decoded: which argument holds the message depends on the op (see comms).
        shapes["input_dims"] = _decoded_text(fields[8])
        shapes["input_types"] = _decoded_text(fields[9]) if fields[9] else None
        if fields[10]:  # a c10d::send's peer and tag (analyzer.ingest.p2p)
            shapes["concrete_inputs"] = _decoded_text(fields[10])
    return head, tail, None if ranks is None else tuple(ranks), shapes, tuple(bad)


# A send's / receive's peer fields (``_PEER_FIELDS``) and their keys in its metadata: the
# peer's global rank, and its rank in the group (``Rank``: the peer for send / recv).
_PEER_KEYS = (("src_rank", "Src Rank"), ("dst_rank", "Dst Rank"), ("peer_rank", "Rank"))


def _peer_keys(peer: tuple, bad: list[tuple[str, Any]]) -> dict[str, int]:
    """The usable peer fields of a send / receive; the unusable ones added to ``bad``."""
    out = {}
    for (key, name), raw in zip(_PEER_KEYS, peer):
        value, unusable = bounded_int(raw, MAX_WORLD - 1)
        if value is not None:
            out[key] = value
        elif unusable and to_int(raw, None) != MISSING:  # type: ignore[arg-type]  (-1: none)
            bad.append((f"args.{name}", raw))
    return out


# Collective args repeat: every collective of a group carries the same ranks string, and a
# layer's collectives the same shapes. Each distinct text is parsed once per process (issue 13:
# json.loads per collective was a tenth of a collective-heavy rank), also when the rest of the
# args is not cached (ranks written as a list). Parsed shapes are shared between rows and only
# read; rank lists are copied out per row.
@lru_cache(maxsize=1 << 14)
def _decoded_text(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


def parse_ranks(value: Any) -> list[int] | None:
    """Ranks of a process group: a list of ints, or the string form ``"[0, 1]"`` (dynolog)."""
    if isinstance(value, str):
        ranks = _ranks_of_text(value)
        return None if ranks is None else list(ranks)
    return list(value) if _int_list(value) else None


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value)


@lru_cache(maxsize=1 << 12)
def _ranks_of_text(text: str) -> tuple[int, ...] | None:
    text = text.strip()
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return tuple(value) if _int_list(value) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))
