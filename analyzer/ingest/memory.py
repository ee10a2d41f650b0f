"""The caching allocator's ``[memory]`` instant events (``profile_memory=True``), as columns.

PyTorch's profiler writes one instant event per allocation and free: ``Bytes`` (negative for
a free), and since 2021 the device's ``Total Allocated`` / ``Total Reserved`` after it, with
``Device Type`` (0 CPU, 1 CUDA; ROCm devices report as CUDA) and ``Device Id``. Their category
varies (``cpu_instant_event`` today, none in 2021-era traces), so they are found by name among
the events of the categories the column builder does not read otherwise. Each batch is reduced
at once to five numeric columns (~40 bytes an event: a rank of millions of allocations costs
tens of MB), read in the pass that reads every other event.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import count
from operator import attrgetter, itemgetter
from typing import Any, Callable

import numpy as np

from analyzer.base.limits import MAX_DEVICE_BYTES
from analyzer.ingest.schema import Event

MEMORY_EVENT = "[memory]"
MEMORY_CAT = "cpu_instant_event"  # today's category of the allocator's events (a CPU op category)
_FIELDS = ("ts", "thread", "delta", "allocated", "reserved", "device_type", "device_id")
_DTYPES = (np.int64, np.int32, np.float64, np.float64, np.float64, np.int16, np.int32)
_NAME, _ARGS = attrgetter("name"), attrgetter("args")
_ARG = {key: attrgetter(key) for key in ("alloc_bytes", "total_allocated", "total_reserved", "device_type",
                                         "device_id")}
_TS = attrgetter("ts")


@dataclass
class MemoryEvents:
    """One row per allocator event, in trace order then sorted by time (stable): ``ts`` int64 ns,
    ``thread`` an index into ``RankTrace.threads``, ``delta`` / ``allocated`` / ``reserved``
    bytes as float64 (exact below 2**53; NaN: not recorded), ``device_type`` / ``device_id``
    (-1: not recorded)."""

    ts: np.ndarray
    thread: np.ndarray
    delta: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    device_type: np.ndarray
    device_id: np.ndarray

    @classmethod
    def empty(cls) -> "MemoryEvents":
        return cls(*(np.empty(0, dtype) for dtype in _DTYPES))

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, rows: np.ndarray) -> "MemoryEvents":
        return MemoryEvents(*(getattr(self, f)[rows] for f in _FIELDS))


class MemoryBuilder:
    """The allocator events of each batch (the column builder hands it the events of the
    categories it does not read, and ``cpu_instant_event``), exported and merged like the
    other columns (analyzer.ingest.parallel)."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []
        self.rejected = 0  # sizes no device holds (beyond MAX_DEVICE_BYTES): read as unknown

    def add(self, events: list[Event], floats: Callable[[list[Any]], np.ndarray],
            thread_ids: Callable[[list[Event]], np.ndarray]) -> None:
        """``floats``: the column builder's tolerant float conversion (None, text: NaN);
        ``thread_ids``: its interned threads."""
        if not events:
            return
        # One C-level pass over the names; then only the allocator events are read.
        table: defaultdict = defaultdict(count().__next__)
        codes = np.fromiter(map(table.__getitem__, map(_NAME, events)), dtype=np.int64, count=len(events))
        code = table.get(MEMORY_EVENT)
        if code is None:
            return
        rows = np.flatnonzero(codes == code)
        events = list(itemgetter(*rows.tolist())(events)) if len(rows) > 1 else [events[int(rows[0])]]
        args = list(map(_ARGS, events))
        if None in args:  # no args: nothing to read
            present = [i for i, a in enumerate(args) if a is not None]
            events, args = [events[i] for i in present], [args[i] for i in present]
        ts = floats(list(map(_TS, events)))
        keep = np.isfinite(ts) & (np.abs(ts) < 2**52)
        columns = [floats(list(map(_ARG[key], args))) for key in _ARG]  # C-level maps, one a field
        if not keep.all():
            idx = np.flatnonzero(keep)
            events, ts, columns = [events[i] for i in idx.tolist()], ts[idx], [c[idx] for c in columns]
        if not len(ts):
            return
        for k in range(3):  # a size no device holds is no size: unknown, and counted
            wild = np.abs(columns[k]) > MAX_DEVICE_BYTES
            if k:  # a total held below zero is no total either
                wild |= columns[k] < 0
            if wild.any():
                self.rejected += int(wild.sum())
                columns[k] = np.where(wild, np.nan, columns[k])
        whole = np.floor(ts)
        ns = whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000.0).astype(np.int64)
        kinds = [np.where(np.isfinite(c) & (np.abs(c) < 2**15), c, -1).astype(dtype)
                 for c, dtype in ((columns[3], np.int16), (columns[4], np.int32))]
        self._parts.append((ns, thread_ids(events), columns[0], columns[1], columns[2], *kinds))

    def export(self) -> dict[str, Any]:
        return {"parts": self._parts, "rejected": self.rejected}

    def merge(self, part: dict[str, Any], threads: np.ndarray) -> None:
        """Another builder's batches, its thread ids re-interned (``threads[old] = new``)."""
        self._parts += [(ts, threads[thread], *rest) for ts, thread, *rest in part["parts"]]
        self.rejected += part["rejected"]

    def finish(self, warnings: list[str]) -> MemoryEvents:
        if self.rejected:
            warnings.append(f"{self.rejected} allocator ([memory]) value(s) beyond any device's memory "
                            "or below zero (Bytes / Total Allocated / Total Reserved): read as unknown")
        if not self._parts:
            return MemoryEvents.empty()
        columns = [np.concatenate([part[k] for part in self._parts]).astype(dtype, copy=False)
                   for k, dtype in enumerate(_DTYPES)]
        self._parts = []
        order = np.argsort(columns[0], kind="stable")  # the file's order among equal times
        return MemoryEvents(*(c[order] for c in columns))
