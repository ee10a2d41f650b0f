"""The DDP gradient buckets and FSDP units of a job: functions of its collective rows (one per
backward all-reduce, all-gather or reduce-scatter of the data-parallel groups), made by the
reduce (analyzer.job.reduce) and, for a saved large result that does not store them
(analyzer.job.large), again from its rows file."""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any

import msgspec
import numpy as np

from analyzer.job.columns import CollectiveColumns, distinct_rows, round_list
from analyzer.job.parallelism import data_parallel_mask
from analyzer.rank.comms import fsdp_units


class Bucket(msgspec.Struct, gc=False):
    """One DDP gradient bucket of ``Result.buckets`` (``gradient_buckets``):
    read like the dict its JSON is (``b["bytes"]``, ``b.get("launch_us")``), at a sixth of a
    dict's memory (a 1,024-rank job has millions). Fields in sorted order: it encodes to the
    bytes of the dict; ``Result.to_dict()`` gives the dicts (plain JSON types)."""

    bytes: Any
    dtype: Any
    dur_us: Any
    exposed_us: Any
    group: Any
    index: int
    launch_offset_us: Any
    launch_us: Any
    rank: int
    start_us: Any
    step: Any

    def __getitem__(self, key: str) -> Any:
        if key in _BUCKET_FIELDS:
            return getattr(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _BUCKET_FIELDS else default

    def __contains__(self, key: object) -> bool:
        return key in _BUCKET_FIELDS


_BUCKET_FIELDS = frozenset(Bucket.__struct_fields__)


def derived_records(result: Any) -> tuple[list[Bucket], list[dict[str, Any]]]:
    """(DDP buckets, FSDP units) of a Result from its rows, as ``build_result`` makes them: a
    saved large result stores neither (analyzer.job.large)."""
    rows = result.collectives
    view = CollectiveColumns.of(result)
    job = result.job
    data_parallel = data_parallel_mask(view, job.get("group_roles") or {})
    strategy = str(job.get("dp_strategy") or "unknown")
    units = fsdp_units([rows[i] for i in np.flatnonzero(data_parallel).tolist()]) if strategy.startswith("fsdp") else []
    buckets = gradient_buckets(view, data_parallel, backward_starts(result.ranks, int(job.get("time_origin_ns") or 0))) \
        if strategy in ("ddp", "unknown") else []
    return buckets, units


def gradient_buckets(view: CollectiveColumns, keep: np.ndarray,
                     backward_start_us: dict[tuple[int, Any], float]) -> list[Bucket]:
    """DDP buckets: each step's backward all-reduces (of the rows ``keep`` selects) in launch
    order (bucket 0 fills first), steps by rank then step number (steps without a number last).
    ``backward_start_us[(rank, step)]``: when backward began on the CPU, the origin of each
    bucket's ``launch_offset_us`` (how long after backward started the bucket was ready)."""
    chosen = keep & view.kind.isin(("allreduce",)) & view.phase.isin(("backward",))
    rows = np.flatnonzero(chosen)
    if not len(rows):
        return []
    numbered = np.array([isinstance(v, int) for v in view.step.names], dtype=bool)
    step_number = np.array([v if isinstance(v, int) else 0 for v in view.step.names], dtype=np.int64)
    step = view.step.codes[rows]
    # (rank, step) pairs in order of first appearance: ties of the sort key (unnumbered steps)
    pair_row, _, pair = distinct_rows([view.rank[rows], step])
    # when backward began, looked up once per (rank, step) rather than once per bucket
    pair_keys = zip(view.rank[rows[pair_row]].tolist(), map(view.step.names.__getitem__, step[pair_row].tolist()))
    pair_origin = np.array(list(map(backward_start_us.get, pair_keys, repeat(np.nan))), dtype=np.float64)
    launch, start = view.launch[rows], view.start[rows]
    ready = np.where(np.isnan(launch), start, launch)
    order = np.lexsort((np.arange(len(rows)), start, ready, pair, step_number[step], ~numbered[step],
                        view.rank[rows]))
    rows, pair, step = rows[order], pair[order], step[order]
    first = np.r_[True, pair[1:] != pair[:-1]]
    index = np.arange(len(rows)) - np.maximum.accumulate(np.where(first, np.arange(len(rows)), 0))
    ranks = view.rank[rows].tolist()
    steps = list(map(view.step.names.__getitem__, step.tolist()))
    since_backward = view.launch[rows] - pair_origin[pair]
    offsets: list[float | None] = round_list(since_backward)  # type: ignore[assignment]
    for i in np.flatnonzero(np.isnan(since_backward)).tolist():
        offsets[i] = None  # no backward start or no launch time
    table = view.rows

    def field(key: str) -> list[Any]:
        col = table.column(key)
        if col is None or key in table.absent:  # a key a row lacks: as row[key] raises
            return list(map(itemgetter(key), table.dicts(rows)))
        return col.take(rows).values()
    # One C-level pass per field, no Python step per bucket (a 64-rank job has 200,000 of them).
    return list(map(Bucket, field("bytes"), field("dtype"), field("dur_us"), field("exposed_us"),
                    _group_names(view, rows), index.tolist(), offsets, field("launch_us"),
                    ranks, field("start_us"), steps))


def _group_names(view: CollectiveColumns, rows: np.ndarray) -> list[Any]:
    """``row["group"]["name"]`` of the rows, once per group object."""
    codes = view.group.codes[rows]
    names = {code: view.group.names[code]["name"] for code in np.unique(codes).tolist()}
    return list(map(names.__getitem__, codes.tolist()))


def backward_starts(ranks: list[Any], origin_ns: int) -> dict[tuple[int, int], float]:
    return {(r.rank, s["step"]): round((s["backward_launch_ns"] - origin_ns) / 1000.0, 3)
            for r in ranks for s in r.steps if s.get("backward_launch_ns") is not None}
