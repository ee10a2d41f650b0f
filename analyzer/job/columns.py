"""The reduce's columns: the job's collective rows as one columnar view (``CollectiveColumns``)
that the job analyses and rules share, and the helpers that turn arrays back into the rows'
Python values exactly as the row-by-row code produced them."""

from __future__ import annotations

from functools import cached_property
from itertools import repeat
from operator import is_not, itemgetter
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

# Beyond 2**50 a scaled value's fraction is no longer exact in a float: round it in Python.
_EXACT_LIMIT = 2.0 ** 50


def round_list(values: np.ndarray, digits: int = 3) -> list[float]:
    """``[round(float(v), digits) for v in values]``, bit for bit, at numpy speed.

    Python rounds the exact binary value half-to-even, then takes the float nearest the decimal
    (``k / 10**digits``). ``rint(v·10**digits) / 10**digits`` divides the same integer k exactly
    rounded, so it agrees whenever ``rint`` picks Python's k: always, except where ``v·10**digits``
    lies within its own rounding error (≤ |v·10**digits|·2⁻⁵³) of a half. Those values, and
    huge ones, are rounded by Python itself (NaN and ±inf stay as they are, as round() leaves them)."""
    values = np.asarray(values, dtype=np.float64)
    scale = 10.0 ** digits
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = values * scale
        out = (np.rint(scaled) / scale).tolist()
        margin = np.abs(scaled - np.floor(scaled) - 0.5)
        sure = (margin > np.abs(scaled) * 2.0 ** -51) & (np.abs(scaled) < _EXACT_LIMIT) | ~np.isfinite(values)
    for i in np.flatnonzero(~sure).tolist():
        out[i] = round(float(values[i]), digits)
    return out


class Categorical(NamedTuple):
    codes: np.ndarray  # int64, one per row
    names: list[Any]  # the distinct values by code

    def isin(self, values: tuple[Any, ...]) -> np.ndarray:
        """Whether each row's value is one of ``values``."""
        return np.isin(self.codes, [code for code, name in enumerate(self.names) if name in values])

    def at(self, row: int) -> Any:
        """The value of one row."""
        return self.names[self.codes[row]]


def categorical(values: Iterable[Any], count: int) -> Categorical:
    """The code of each value (int64) and the distinct values by code, in order of first appearance."""
    values = list(values)
    names = list(dict.fromkeys(values))  # two passes at C speed, no Python loop over the rows
    code_of = {name: code for code, name in enumerate(names)}
    return Categorical(np.fromiter(map(code_of.__getitem__, values), dtype=np.int64, count=count), names)


def _categorical(key: str) -> cached_property:
    """A view column of the rows' ``key`` as a Categorical, read on first use."""
    return cached_property(lambda view: categorical(_field(view.rows, key), view.n))


class CollectiveColumns:
    """The job's collective rows as columns, read once and shared by the job analyses and the
    rules: numpy arrays per field (row order), strings as categorical codes, process groups as
    codes of the group objects (rows share them: ``analyzer.rank.comms.share_groups``), nullable
    numbers as NaN plus a mask. The row dicts stay the JSON and renderer contract; the fields
    the analyses write back (``wait_us``, ``arrival_lag_us``...) are added here as columns by
    their writers too (``set``), so later readers need not read them from the rows again.

    Built by the reduce (``build_result``), or by ``of(result)`` for a Result without one; valid
    while the rows' read fields (rank, times, kind, phase, library, group, step, bytes) are not
    changed in place."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.n = len(rows)
        self.extra: dict[str, np.ndarray] = {}

    # Each column is read from the rows on first use: a consumer pays only for what it reads.
    @cached_property
    def rank(self) -> np.ndarray:
        return np.fromiter(map(itemgetter("rank"), self.rows), dtype=np.int64, count=self.n)

    @cached_property
    def start(self) -> np.ndarray:
        return np.fromiter(map(itemgetter("start_us"), self.rows), dtype=np.float64, count=self.n)

    @cached_property
    def dur(self) -> np.ndarray:
        return np.fromiter(map(itemgetter("dur_us"), self.rows), dtype=np.float64, count=self.n)

    @cached_property
    def launch(self) -> np.ndarray:
        """``launch_us``, NaN where unknown."""
        return _nullable(self.rows, "launch_us")

    @cached_property
    def size(self) -> np.ndarray:
        """``bytes`` as float64, NaN where unknown."""
        return _nullable(self.rows, "bytes")

    @cached_property
    def on_gpu(self) -> np.ndarray:
        return np.fromiter(map(bool, _field(self.rows, "on_gpu")), dtype=bool, count=self.n)

    @cached_property
    def comms_id(self) -> list[Any]:
        """The rows' ``comms_id`` values as they are (the cross-rank matching's first key)."""
        return list(_field(self.rows, "comms_id"))

    @cached_property
    def seq(self) -> list[Any]:
        """The rows' ``seq`` values as they are."""
        return list(_field(self.rows, "seq"))

    @cached_property
    def module_known(self) -> np.ndarray:
        return np.fromiter(map(is_not, _field(self.rows, "module"), repeat(None)), dtype=bool, count=self.n)

    # Strings and other repeated values as (code per row, distinct values by code).
    kind = _categorical("collective")
    phase = _categorical("phase")
    library = _categorical("library")
    step = _categorical("step")  # None included

    @cached_property
    def group(self) -> Categorical:
        """Code of each row's process-group object (the rows share them), in order of first
        appearance; ``group.names[code]`` is the group dict."""
        groups = list(_field(self.rows, "group"))
        codes, _ = categorical(map(id, groups), self.n)  # the objects are held: ids stay unique
        first = np.unique(codes, return_index=True)[1]
        return Categorical(codes, [groups[i] for i in first.tolist()])

    @classmethod
    def of(cls, result: Any) -> "CollectiveColumns":
        """The view of ``result.collectives``, built on first use and kept on the Result."""
        view = result.collective_columns
        if view is None or view.rows is not result.collectives or view.n != len(result.collectives):
            view = result.collective_columns = cls(result.collectives)
        return view

    def set(self, name: str, values: np.ndarray) -> None:
        """A column the analyses computed (also written into the rows where the output needs it)."""
        self.extra[name] = values

    def written(self, name: str) -> np.ndarray:
        """A numeric field the job analysis writes (``wait_us``, ``arrival_lag_us``,
        ``busbw_gbps``), NaN where None: the writer's column, else read from the rows (a Result
        loaded from its JSON)."""
        if name not in self.extra:
            self.extra[name] = _nullable(self.rows, name)
        return self.extra[name]

    def group_keys(self, key_of: Callable[[dict[str, Any]], Any]) -> tuple[np.ndarray, list[Any]]:
        """(code per row, keys by code) of ``key_of(row)`` for a key that depends on the row's
        group object and collective kind only (``crossrank.group_key``, ``parallelism.role_key``):
        computed once per (group, kind) pair; codes numbered in order of first appearance."""
        if not self.n:
            return np.zeros(0, dtype=np.int64), []
        first, inverse = self._group_kind_pairs
        codes: dict[Any, int] = {}
        pair_code = np.empty(len(first), dtype=np.int64)
        for k in np.argsort(first, kind="stable").tolist():  # pairs in order of first appearance
            pair_code[k] = codes.setdefault(key_of(self.rows[int(first[k])]), len(codes))
        return pair_code[inverse], list(codes)

    @cached_property
    def _group_kind_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first row of each distinct (group, kind) pair, each row's pair number): one sort
        serves every ``group_keys`` (several analyses ask, each with its own key)."""
        pair = self.group.codes * len(self.kind.names) + self.kind.codes
        _, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)


def _nullable(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    """A numeric field as float64, NaN where it is None (``np.isnan`` is its mask)."""
    values = list(_field(rows, key))
    if values and values[0] is None and values.count(None) == len(values):
        return np.full(len(values), np.nan)  # a field no row has: numpy converts None slowly
    try:
        return np.array(values, dtype=np.float64)  # None becomes NaN
    except (TypeError, ValueError, OverflowError):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _field(rows: list[dict[str, Any]], key: str) -> Iterator[Any]:
    """``row.get(key)`` of every row (an optional field), at C speed."""
    return map(dict.get, rows, repeat(key))


# A mixed-radix number stays below this (int64 holds it; the next digit may still be added).
_RADIX_LIMIT = 2 ** 62


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct tuples of several non-negative code columns: (first row of each, its count,
    each row's tuple number), tuples numbered in order of first appearance."""
    combined = tuple_numbers(columns)
    if not len(combined):
        return combined, combined.copy(), combined.copy()
    _, first, inverse, counts = np.unique(combined, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    renumber = np.empty(len(order), dtype=np.int64)
    renumber[order] = np.arange(len(order))
    return first[order], counts[order], renumber[inverse.reshape(-1)]


def tuple_numbers(columns: list[np.ndarray]) -> np.ndarray:
    """One non-negative int64 per row, equal exactly where the rows' tuples of ``columns``
    (integers) are and ordered as the tuples are: mixed radix, one digit per column; digits and
    the number are made dense (np.unique keeps their order) only where the product would leave
    int64, so mostly no sort at all."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    if not len(combined):
        return combined
    for column in columns:
        digit = _digit(np.asarray(column, dtype=np.int64))
        radix = int(digit.max()) + 1
        if int(combined.max()) >= _RADIX_LIMIT // radix:
            combined = _dense_codes(combined)
            if int(combined.max()) >= _RADIX_LIMIT // radix:
                digit = _dense_codes(digit)
                radix = int(digit.max()) + 1
        combined = combined * radix + digit
    return combined


def _digit(column: np.ndarray) -> np.ndarray:
    """The column's values from 0: minus its least, or dense codes where that span is huge."""
    low, high = int(column.min()), int(column.max())
    return column - low if high - low < _RADIX_LIMIT else _dense_codes(column)


def _dense_codes(values: np.ndarray) -> np.ndarray:
    return np.unique(values, return_inverse=True)[1].reshape(-1)


def sequential_sums(values: np.ndarray, segment: np.ndarray, segments: int) -> list[float | int]:
    """``sum(values of each segment, in order)`` as Python's ``sum`` gives it (left to right from
    0; an empty segment sums to the int 0): numpy's own sums add pairwise, another rounding.
    ``segment``: each value's segment number (< ``segments``). One vector step per position
    within the segments."""
    order = np.argsort(segment, kind="stable")
    counts = np.bincount(segment, minlength=segments)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    ordered = values[order]
    totals = np.zeros(segments)
    for k in range(int(counts.max()) if segments and len(values) else 0):
        live = np.flatnonzero(counts > k)
        totals[live] += ordered[starts[live] + k]
    return [total if count else 0 for total, count in zip(totals.tolist(), counts.tolist())]
