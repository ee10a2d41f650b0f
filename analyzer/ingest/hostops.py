"""Host ops running far beyond their usual length: the sign of a descheduled host process (CPU
contention), for the idle attribution (analyzer.rank.attribution).

An ordinary host op (a kernel launch, an allocation, an ATen op) takes about the same time every
time it runs; when one takes ``INFLATED_RATIO`` times its name's median and at least
``INFLATED_MIN_US``, its thread was not running (preempted by other threads or processes), and
the GPU idles for it. Ops whose length follows their work or that wait on purpose (copies,
syncs, collectives, the data loader, the ranges that hold whole passes) are not ordinary.

Built alongside the columns (analyzer.ingest.columns.ColumnBuilder), batch by batch: each op's
name and duration (8 bytes an op, for the medians) and the few ops of ``INFLATED_MIN_US`` or more
in full; at the end, those of them past their name's median become markers of kind
``HOST_INFLATED``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from analyzer.ingest.classify import HOST_SYNC_NAMES
from analyzer.ingest.trace import Marker

INFLATED_RATIO = 20.0
INFLATED_MIN_US = 1000.0
INFLATED_MIN_COUNT = 10  # fewer runs of a name than this: no usual length to compare with

# Ops whose length is their work or a wait (never inflated by themselves).
_NOT_ORDINARY_PREFIXES = (
    "cudaMemcpy", "cuMemcpy", "hipMemcpy", "cudaMemset", "cuMemset", "hipMemset", "cudaMalloc", "cudaFree",
    "cuMemAlloc", "cuMemFree", "hipMalloc", "hipFree", "cudaStreamWaitEvent", "cudaGraphLaunch",
    "aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::item",
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique", "aten::cpu",
    "record_param_comms", "nccl:", "gloo:", "c10d::", "mpi:", "ucc:", "enumerate(", "ProfilerStep#",
    "Optimizer.", "autograd::engine::evaluate_function", "DistributedDataParallel", "FSDP::",
    "FullyShardedDataParallel", "## ", "Torch-Compiled Region", "CompiledFunction", "aten::_foreach",
    "aten::_fused_", "Memcpy", "Memset",
)


@lru_cache(maxsize=65536)
def ordinary_host_op(name: Any) -> bool:
    """Whether a CPU op or runtime call of this name takes about the same time every run."""
    return isinstance(name, str) and bool(name) and name not in HOST_SYNC_NAMES \
        and not name.startswith(_NOT_ORDINARY_PREFIXES)


class HostOpDurations:
    """Durations of the ordinary host ops of one rank, batch by batch (see the module)."""

    def __init__(self, names) -> None:
        """``names``: an empty string table of its own (analyzer.ingest.columns.Interner)."""
        self.names = names
        self._durations: list[tuple[np.ndarray, np.ndarray]] = []  # (name, µs) per batch
        self._long: list[tuple[np.ndarray, ...]] = []  # (name, start ns, end ns, thread) per batch

    @property
    def strings(self) -> list[str]:
        return self.names.strings

    def _id(self, name: str) -> int:
        return self.names._id(name)

    def add(self, events: list, codes: np.ndarray, uniques: list[Any], host_rows: np.ndarray,
            durations: np.ndarray, times, thread_ids) -> None:
        """One batch: ``codes`` / ``uniques`` its names factorized, ``host_rows`` the rows of
        host-op categories, ``durations`` every row's (µs, NaN when odd), ``times(events) ->
        (start, end, valid)`` and ``thread_ids(events)`` the column builder's, for the long ops."""
        table = np.array([self._id(u) if ordinary_host_op(u) else -1 for u in uniques], dtype=np.int32)
        ids = table[codes] if len(codes) else np.empty(0, np.int32)
        dur = durations
        ok = host_rows & (ids >= 0) & np.isfinite(dur) & (dur >= 0) & (dur < 2**52)
        rows = np.flatnonzero(ok)
        if not len(rows):
            return
        self._durations.append((ids[rows], dur[rows].astype(np.float32)))
        long = rows[dur[rows] >= INFLATED_MIN_US]
        if len(long):
            chosen = [events[i] for i in long.tolist()]
            start, end, valid = times(chosen)
            self._long.append((ids[long][valid], start[valid], end[valid], thread_ids(chosen)[valid]))

    def export(self) -> dict[str, Any]:
        return {"strings": self.strings, "durations": self._durations, "long": self._long}

    def merge(self, part: dict[str, Any], threads: np.ndarray) -> None:
        """Another builder's batches (its ``export``); ``threads``: its thread ids in this one's."""
        names = np.array([self._id(s) for s in part["strings"]] or [0], dtype=np.int32)
        self._durations += [(names[ids], dur) for ids, dur in part["durations"]]
        self._long += [(names[ids], start, end, threads[thread]) for ids, start, end, thread in part["long"]]

    def inflated(self, intern) -> tuple[tuple[np.ndarray, ...], dict[str, float]]:
        """The long ops past ``INFLATED_RATIO`` times their name's median, as marker columns
        (start, end, thread, kind, name interned with ``intern``, external id), and the median of
        each of their names (µs)."""
        empty = np.empty(0, np.int64)
        none = (empty, empty, empty.astype(np.int32), empty.astype(np.int8), empty.astype(np.int32), empty)
        if not self._long:
            return none, {}
        ids, start, end, thread = (np.concatenate(c) for c in zip(*self._long))
        names = np.unique(ids)
        all_ids = np.concatenate([d[0] for d in self._durations])
        all_dur = np.concatenate([d[1] for d in self._durations])
        pick = np.isin(all_ids, names)
        medians = _medians(all_ids[pick], all_dur[pick])
        usual = np.array([medians.get(int(i), (np.inf, 0))[0] for i in ids.tolist()])
        count = np.array([medians.get(int(i), (np.inf, 0))[1] for i in ids.tolist()])
        dur_us = (end - start) / 1000.0
        keep = (count >= INFLATED_MIN_COUNT) & (dur_us >= INFLATED_RATIO * usual) & (dur_us >= INFLATED_MIN_US)
        if not keep.any():
            return none, {}
        kept = ids[keep]
        name_ids = np.array([intern(self.strings[i]) for i in kept.tolist()], dtype=np.int32)
        columns = (start[keep], end[keep], thread[keep].astype(np.int32),
                   np.full(int(keep.sum()), Marker.HOST_INFLATED, np.int8), name_ids,
                   np.full(int(keep.sum()), -1, np.int64))
        return columns, {self.strings[i]: round(float(medians[i][0]), 3) for i in np.unique(kept).tolist()}


def _medians(ids: np.ndarray, durations: np.ndarray) -> dict[int, tuple[float, int]]:
    """{name: (median duration, count)} of each name among ``ids``."""
    order = np.lexsort((durations, ids))
    ids, durations = ids[order], durations[order].astype(np.float64)
    names, first, counts = np.unique(ids, return_index=True, return_counts=True)
    low = durations[first + (counts - 1) // 2]
    high = durations[first + counts // 2]
    return {int(n): (float(m), int(c)) for n, m, c in zip(names.tolist(), ((low + high) / 2).tolist(), counts.tolist())}
