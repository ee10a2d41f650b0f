"""The reduce's columns: the job's collective rows as one columnar view (``CollectiveColumns``)
that the job analyses and rules share, and the helpers that turn arrays back into the rows'
Python values exactly as the row-by-row code produced them."""

from __future__ import annotations

from functools import cached_property
from itertools import repeat
from operator import is_not
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.base.memo import memo
from analyzer.base.rowtable import Coded, Column, Numbers, RowTable

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


def round_array(values: np.ndarray, digits: int = 3) -> np.ndarray:
    """``round_list`` as an array (float64): the same floats, without a Python float per value."""
    values = np.asarray(values, dtype=np.float64)
    scale = 10.0 ** digits
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = values * scale
        out = np.rint(scaled) / scale
        margin = np.abs(scaled - np.floor(scaled) - 0.5)
        sure = (margin > np.abs(scaled) * 2.0 ** -51) & (np.abs(scaled) < _EXACT_LIMIT) | ~np.isfinite(values)
    out = np.where(np.isfinite(values), out, values)  # NaN and ±inf as round() leaves them
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
    return cached_property(lambda view: table_categorical(view.rows, key))


def table_categorical(table: RowTable, key: str) -> Categorical:
    """``categorical`` of the rows' ``key`` values (None where a row lacks it), from the table's
    column: a coded column of strings or a column of ints without a Python step per row."""
    col = table.column(key)
    if col is not None and key not in table.absent:
        if isinstance(col, Coded) and col.by_value:  # distinct values already: first appearances
            used = col.used()
            renumber = np.zeros(len(col.table), dtype=np.int64)
            renumber[used] = np.arange(len(used))
            return Categorical(renumber[col.codes], [col.table[code] for code in used.tolist()])
        if isinstance(col, Numbers) and col.data.dtype.kind in "iu":
            return _int_categorical(col)
    return categorical(table.values(key), table.n)


def _int_categorical(col: Numbers) -> Categorical:
    """``categorical`` of a column of ints (None allowed): equal ints are one value."""
    distinct, inverse = unique_ints(col.data, return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int64)
    names: list[Any] = distinct.tolist()
    if col.none is not None:
        inverse[col.none] = len(names)
        names.append(None)
    if not len(inverse):
        return Categorical(inverse, [])
    first = np.full(len(names), len(inverse), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(inverse)))
    used = np.flatnonzero(first < len(inverse))
    used = used[np.argsort(first[used], kind="stable")]
    renumber = np.zeros(len(names), dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return Categorical(renumber[inverse], [names[code] for code in used.tolist()])


class CollectiveColumns:
    """The job's collective rows as columns, shared by the job analyses and the rules: numpy
    arrays per field (row order), strings as categorical codes, process groups as codes of the
    group objects (rows share them: ``analyzer.rank.comms.share_groups``), nullable numbers as
    NaN plus a mask. ``rows`` is the table the rows are kept in (analyzer.base.rowtable), the
    Result's ``collectives``: the fields the analyses add (``wait_us``, ``arrival_lag_us``...)
    are written into it as columns (``write``) and kept here in their array form (``extra``),
    so later readers read neither from the rows.

    Built by the reduce (``build_result``), or by ``of(result)`` for a Result without one; valid
    while the rows' read fields (rank, times, kind, phase, library, group, step, bytes) are not
    replaced."""

    def __init__(self, rows: RowTable | list[dict[str, Any]]) -> None:
        # rows given as dicts: read into a table, and what the analyses write written into them too
        self.dicts = None if isinstance(rows, RowTable) else rows
        self.rows = rows if isinstance(rows, RowTable) else RowTable.from_dicts(rows)
        self.n = len(self.rows)
        self.extra: dict[str, np.ndarray] = {}

    # Each column is read from the table on first use: a consumer pays only for what it reads.
    @cached_property
    def rank(self) -> np.ndarray:
        return self._exact("rank", np.int64)

    @cached_property
    def start(self) -> np.ndarray:
        return self._exact("start_us", np.float64)

    @cached_property
    def dur(self) -> np.ndarray:
        return self._exact("dur_us", np.float64)

    def _exact(self, key: str, dtype: Any) -> np.ndarray:
        """A field every row has as a number, as ``dtype`` (read-only: the table's own array
        where it is of that type)."""
        col = self.rows.column(key)
        if isinstance(col, Numbers) and col.none is None and key not in self.rows.absent:
            data = col.data if col.data.dtype == dtype else col.data.astype(dtype)
        else:
            data = np.fromiter(self.rows.values(key), dtype=dtype, count=self.n)
        data = data.view()
        data.flags.writeable = False
        return data

    @cached_property
    def launch(self) -> np.ndarray:
        """``launch_us``, NaN where unknown."""
        return self.nullable("launch_us")

    @cached_property
    def size(self) -> np.ndarray:
        """``bytes`` as float64, NaN where unknown."""
        return self.nullable("bytes")

    def nullable(self, key: str) -> np.ndarray:
        """A numeric field as float64, NaN where it is None or absent."""
        col = self.rows.column(key)
        if isinstance(col, Numbers) and col.data.dtype.kind in "fiu":
            out = col.floats()
            if key in self.rows.absent:
                out[self.rows.absent[key]] = np.nan
            return out
        return _nullable(self.rows.values(key))

    @cached_property
    def on_gpu(self) -> np.ndarray:
        col = self.rows.column("on_gpu")
        if isinstance(col, Numbers) and col.data.dtype == np.bool_ and col.none is None \
                and "on_gpu" not in self.rows.absent:
            data = col.data.view()
            data.flags.writeable = False
            return data
        return np.fromiter(map(bool, self.rows.values("on_gpu")), dtype=bool, count=self.n)

    @cached_property
    def comms_id(self) -> list[Any]:
        """The rows' ``comms_id`` values as they are (the cross-rank matching's first key)."""
        return self.rows.values("comms_id")

    @cached_property
    def seq(self) -> list[Any]:
        """The rows' ``seq`` values as they are."""
        return self.rows.values("seq")

    def whole_numbers(self, key: str) -> np.ndarray | None:
        """A field every row has as an int of 64 bits (no None), as its array; else None."""
        col = self.rows.column(key)
        if isinstance(col, Numbers) and col.none is None and col.data.dtype.kind in "iu" \
                and key not in self.rows.absent:
            return col.data
        return None

    @cached_property
    def module_known(self) -> np.ndarray:
        col = self.rows.column("module")
        if isinstance(col, Coded):
            known = np.array([value is not None for value in col.table], dtype=bool)[col.codes]
        else:
            known = np.fromiter(map(is_not, self.rows.values("module"), repeat(None)), dtype=bool, count=self.n)
        if "module" in self.rows.absent:
            known &= ~self.rows.absent["module"]
        return known

    # Strings and other repeated values as (code per row, distinct values by code).
    kind = _categorical("collective")
    phase = _categorical("phase")
    library = _categorical("library")
    step = _categorical("step")  # None included

    @cached_property
    def group(self) -> Categorical:
        """Code of each row's process-group object (the rows share them), in order of first
        appearance; ``group.names[code]`` is the group dict."""
        col = self.rows.column("group")
        if isinstance(col, Coded) and "group" not in self.rows.absent:  # one entry per object already
            used = col.used()
            renumber = np.zeros(len(col.table), dtype=np.int64)
            renumber[used] = np.arange(len(used))
            return Categorical(renumber[col.codes], [col.table[code] for code in used.tolist()])
        groups = self.rows.values("group")
        codes, _ = categorical(map(id, groups), self.n)  # the objects are held: ids stay unique
        first = unique_ints(codes, return_index=True)[1]
        return Categorical(codes, [groups[i] for i in first.tolist()])

    @classmethod
    def of(cls, result: Any) -> "CollectiveColumns":
        """The view of ``result.collectives``, built on first use (or by the reduce) and kept
        with the Result (analyzer.base.memo); made again when its rows are replaced or resized."""
        rows = result.collectives
        return memo(result, "collective_columns", lambda: cls(rows), rows, valid=lambda view: view.n == len(rows))

    def set(self, name: str, values: np.ndarray) -> None:
        """A column the analyses computed, in its array form (``write`` puts it in the rows)."""
        self.extra[name] = values

    def write(self, key: str, col: Column, present: np.ndarray | None = None) -> None:
        """``row[key] = value`` of every row (``present``: of those rows), by column."""
        self.rows.set(key, col, present)
        if self.dicts is not None:
            chosen = range(self.n) if present is None else np.flatnonzero(present).tolist()
            values = col.values()
            for i in chosen:
                self.dicts[i][key] = values[i]

    def written(self, name: str) -> np.ndarray:
        """A numeric field the job analysis writes (``wait_us``, ``arrival_lag_us``,
        ``busbw_gbps``), NaN where None: the writer's column, else read from the rows (a Result
        loaded from its JSON)."""
        if name not in self.extra:
            self.extra[name] = self.nullable(name)
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
            pair_code[k] = codes.setdefault(key_of(self.row(int(first[k]))), len(codes))
        return pair_code[inverse], list(codes)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as its dict."""
        return self.rows.row(i)

    @cached_property
    def _group_kind_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first row of each distinct (group, kind) pair, each row's pair number): one sort
        serves every ``group_keys`` (several analyses ask, each with its own key)."""
        pair = self.group.codes * len(self.kind.names) + self.kind.codes
        _, first, inverse = unique_ints(pair, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)


def _nullable(values: list[Any]) -> np.ndarray:
    """Numbers as float64, NaN where a value is None (``np.isnan`` is its mask)."""
    if values and values[0] is None and values.count(None) == len(values):
        return np.full(len(values), np.nan)  # a field no row has: numpy converts None slowly
    try:
        return np.array(values, dtype=np.float64)  # None becomes NaN
    except (TypeError, ValueError, OverflowError):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


# A mixed-radix number stays below this (int64 holds it; the next digit may still be added).
_RADIX_LIMIT = 2 ** 62


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct tuples of several non-negative code columns: (first row of each, its count,
    each row's tuple number), tuples numbered in order of first appearance."""
    combined = tuple_numbers(columns)
    if not len(combined):
        return combined, combined.copy(), combined.copy()
    _, first, inverse, counts = unique_ints(combined, return_index=True, return_inverse=True, return_counts=True)
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
    return unique_ints(values, return_inverse=True)[1].reshape(-1)


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


def group_label(group: Mapping[str, Any] | None) -> str | None:
    """The name a group goes by in breakdowns, metric names and diffs: its description, else its
    name (descriptions such as ``default_pg`` stay the same when the job is rerun at another scale)."""
    if not group:
        return None
    label = group.get("description") or group.get("name")
    return str(label) if label not in (None, "") else None
