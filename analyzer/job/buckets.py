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

from analyzer.base.arrays import unique_ints
from analyzer.base.rowtable import Coded, Column, ColumnSequence, Numbers, column
from analyzer.job.columns import CollectiveColumns, distinct_rows, round_array
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
_FIELD_ORDER = {name: k for k, name in enumerate(Bucket.__struct_fields__)}


class BucketTable(ColumnSequence):
    """``gradient_buckets``' Buckets kept by column (analyzer.base.rowtable), one column per
    field in ``Bucket``'s order: a read-only sequence of Buckets made as they are read. A
    1,024-rank job has millions of buckets: as Structs with their float objects they held a
    third of the reduce's memory from the combine to the save."""

    def __init__(self, columns: list[Column], count: int) -> None:
        self.columns, self.n = columns, count

    def _one(self, i: int) -> Bucket:
        if not -self.n <= i < self.n:
            raise IndexError("bucket index out of range")
        return Bucket(*(col.at(i % self.n) for col in self.columns))

    def _made(self, index: np.ndarray) -> list[Bucket]:
        return list(map(Bucket, *(col.take(index).values() for col in self.columns)))

    def column(self, field: str) -> Column:
        """The column of a Bucket field."""
        return self.columns[_FIELD_ORDER[field]]

    def values(self, field: str) -> list[Any]:
        """The field of every bucket, in order."""
        return self.column(field).values()

    def by_step(self) -> dict[tuple[int, Any], np.ndarray]:
        """{(rank, step): the positions of its buckets, by ``index``}: the keys in order of first
        appearance, as ``JobFacts.buckets_by_step`` groups the Buckets, without making one."""
        if not self.n:
            return {}
        rank, step = self.column("rank"), self.column("step")
        assert isinstance(rank, Numbers) and isinstance(step, Coded)
        first, _, number = distinct_rows([rank.data - rank.data.min(), step.codes.astype(np.int64)])
        order = np.lexsort((self.column("index").data, number))  # type: ignore[attr-defined]
        bounds = np.searchsorted(number[order], np.arange(len(first) + 1)).tolist()
        keys = zip(rank.data[first].tolist(), map(step.table.__getitem__, step.codes[first].tolist()))
        return {key: order[lo:hi] for key, lo, hi in zip(keys, bounds[:-1], bounds[1:])}

    def tolist(self) -> list[Bucket]:
        return list(self)

    def __repr__(self) -> str:
        return f"<BucketTable of {self.n} buckets>"


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
                     backward_start_us: dict[tuple[int, Any], float]) -> BucketTable | list[Bucket]:
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
    since_backward = view.launch[rows] - pair_origin[pair]
    # round() of each known offset; None where there is no backward start or no launch time
    offsets = Numbers(round_array(since_backward), np.isnan(since_backward))
    table = view.rows

    def field(key: str) -> Column:
        col = table.column(key)
        if col is None or key in table.absent:  # a key a row lacks: as row[key] raises
            return column(list(map(itemgetter(key), table.dicts(rows))))
        return col.take(rows)
    # Each field a column of the rows' values: no Python step per bucket (a 1,024-rank job has
    # millions of them)
    columns = [field("bytes"), field("dtype"), field("dur_us"), field("exposed_us"), _group_names(view, rows),
               Numbers(index.astype(np.int64)), offsets, field("launch_us"), Numbers(view.rank[rows].astype(np.int64)),
               field("start_us"), Coded(step, list(view.step.names), False)]
    return BucketTable(columns, len(rows))


def _group_names(view: CollectiveColumns, rows: np.ndarray) -> Column:
    """``row["group"]["name"]`` of the rows, read once per group object."""
    codes = view.group.codes[rows]
    used = set(unique_ints(codes).tolist())
    names = [group["name"] if k in used else None for k, group in enumerate(view.group.names)]
    return Coded(codes, names, False)


def backward_starts(ranks: list[Any], origin_ns: int) -> dict[tuple[int, int], float]:
    return {(r.rank, s["step"]): round((s["backward_launch_ns"] - origin_ns) / 1000.0, 3)
            for r in ranks for s in r.steps if s.get("backward_launch_ns") is not None}
