"""Rows kept by column: what a list of dicts holds (the same keys, the same Python values, ints
as ints, floats bit for bit, None, the very string and dict objects), in a fraction of its
memory, and readable a column at a time without a Python step per row.

A job's collective rows were one dict per row from the map to the JSON: 832 bytes a row with
its float objects (2 million rows at 1,024 ranks: 1.8 GB before the reduce began), and every
job analysis read and wrote them a key at a time. A ``RowTable`` holds each key's values as one
column:

- ``Numbers``: one array of one number type (float64, int64, uint64 or bool) and the rows where
  the value is None: ``tolist()`` gives the very Python values back (the same type, the same
  bits; -0.0 and NaN included);
- ``Coded``: a code per row into a table of distinct objects: strings (and None) told apart by
  value, anything else (the process-group dicts) by identity, so the rows share each object as
  the dicts did;
- ``Objects``: anything else (mixed types, ints beyond 64 bits), as the plain list of values.

A key some rows lack is marked absent there. ``RowTable`` is a read-only sequence of dicts:
``table[i]``, slices and iteration make the dicts (the keys in the table's order, a row's
absent keys left out) only when they are asked for. Writers set whole columns (``set``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import is_, is_not
from typing import Any

import numpy as np

_NUMBER_TYPES: dict[type, Any] = {float: np.float64, int: np.int64, bool: np.bool_}
_ITER_CHUNK = 8192  # rows made into dicts at a time when a table is iterated


class Column:
    """One key's values over the rows."""

    n: int

    def values(self) -> list[Any]:
        """The Python values, one per row."""
        raise NotImplementedError

    def at(self, row: int) -> Any:
        raise NotImplementedError

    def take(self, index: np.ndarray) -> "Column":
        """The values of the rows ``index`` (int array), in that order."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError


class Numbers(Column):
    """Values of one number type (``data``'s), None where ``none`` is True (``none`` None: no
    None at all)."""

    __slots__ = ("data", "none", "n")

    def __init__(self, data: np.ndarray, none: np.ndarray | None = None) -> None:
        self.data = data
        self.none = none if none is not None and none.any() else None
        self.n = len(data)

    def values(self) -> list[Any]:
        if self.none is None:
            return self.data.tolist()
        return np.where(self.none, None, self.data.astype(object)).tolist()

    def at(self, row: int) -> Any:
        if self.none is not None and self.none[row]:
            return None
        return self.data[row].item()

    def take(self, index: np.ndarray) -> "Numbers":
        return Numbers(self.data[index], None if self.none is None else self.none[index])

    def floats(self) -> np.ndarray:
        """The values as float64, NaN where None."""
        out = self.data.astype(np.float64)
        if self.none is not None:
            out[self.none] = np.nan
        return out

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.none is None else self.none.nbytes)


class Coded(Column):
    """A code per row into ``table``; ``by_value``: the table's objects are strings or None,
    distinct by value (else distinct objects, told apart by identity)."""

    __slots__ = ("codes", "table", "by_value", "n")

    def __init__(self, codes: np.ndarray, table: list[Any], by_value: bool) -> None:
        self.codes, self.table, self.by_value = codes, table, by_value
        self.n = len(codes)

    def values(self) -> list[Any]:
        return list(map(self.table.__getitem__, self.codes.tolist()))

    def at(self, row: int) -> Any:
        return self.table[int(self.codes[row])]

    def take(self, index: np.ndarray) -> "Coded":
        return Coded(self.codes[index], self.table, self.by_value)

    def used(self) -> np.ndarray:
        """The codes that some row has, in order of first appearance."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        present = np.zeros(len(self.table), dtype=bool)
        present[self.codes] = True
        if present.sum() == 1:
            return np.flatnonzero(present)
        first = np.full(len(self.table), self.n, dtype=np.int64)
        np.minimum.at(first, self.codes, np.arange(self.n))
        used = np.flatnonzero(present)
        return used[np.argsort(first[used], kind="stable")]

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes


class Objects(Column):
    """Any values, as they are."""

    __slots__ = ("items", "n")

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.n = len(items)

    def values(self) -> list[Any]:
        return list(self.items)

    def at(self, row: int) -> Any:
        return self.items[row]

    def take(self, index: np.ndarray) -> "Objects":
        return Objects(list(map(self.items.__getitem__, index.tolist())))

    @property
    def nbytes(self) -> int:
        return 8 * self.n


def code_type(count: int) -> Any:
    """The smallest unsigned type that holds codes below ``count``."""
    return np.uint8 if count <= 1 << 8 else np.uint16 if count <= 1 << 16 else np.uint32 \
        if count <= 1 << 32 else np.int64


def column(values: list[Any]) -> Column:
    """The column of these Python values (any values: the form depends on their types)."""
    n = len(values)
    kinds = set(map(type, values))
    has_none = type(None) in kinds
    kinds.discard(type(None))
    if len(kinds) == 1 and (kind := next(iter(kinds))) in _NUMBER_TYPES:
        if not has_none:
            data = _array(values, kind)
            if data is not None:
                return Numbers(data)
        else:
            none = np.fromiter(map(is_, values, repeat(None)), dtype=bool, count=n)
            known = _array(list(compress(values, map(is_not, values, repeat(None)))), kind)
            if known is not None:
                data = np.zeros(n, dtype=known.dtype)
                data[~none] = known
                return Numbers(data, none)
        return Objects(values)
    if kinds <= {str}:  # strings (and None): one table entry per distinct value
        table = list(dict.fromkeys(values))
        code_of = {value: code for code, value in enumerate(table)}
        return Coded(np.fromiter(map(code_of.__getitem__, values), dtype=code_type(len(table)), count=n),
                     table, True)
    if kinds <= {dict, list}:  # unhashable objects the rows share: one entry per object
        ids = list(map(id, values))
        objects = dict(zip(ids, values))  # alive in ``values``: the ids stay unique
        code_of = {ident: code for code, ident in enumerate(objects)}
        return Coded(np.fromiter(map(code_of.__getitem__, ids), dtype=code_type(len(objects)), count=n),
                     list(objects.values()), False)
    return Objects(values)


def _array(values: list[Any], kind: type) -> np.ndarray | None:
    """The values (all of type ``kind``) as an array whose ``tolist()`` gives them back, or None
    (ints beyond 64 bits)."""
    if kind is not int:
        return np.array(values, dtype=_NUMBER_TYPES[kind])
    for dtype in (np.int64, np.uint64):
        try:
            return np.array(values, dtype=dtype)
        except OverflowError:
            continue
    return None


def nones(count: int) -> Coded:
    """A column of None."""
    return Coded(np.zeros(count, dtype=np.uint8), [None], True)


def _all_none(col: Column) -> bool:
    return isinstance(col, Coded) and col.table == [None] and type(col.table[0]) is type(None)


class ColumnSequence(Sequence):
    """A read-only sequence of items kept by column (a ``RowTable``'s dicts, a ``BucketTable``'s
    Buckets): ``_made(index)`` makes the items asked for, a chunk at a time when iterated; equal
    to a list or tuple of the same items."""

    n: int

    def _made(self, index: np.ndarray) -> list[Any]:
        raise NotImplementedError

    def _one(self, i: int) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._made(np.arange(self.n)[i])
        return self._one(int(i))

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, self.n, _ITER_CHUNK):
            yield from self._made(np.arange(start, min(start + _ITER_CHUNK, self.n)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ColumnSequence, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class RowTable(ColumnSequence):
    """Rows (dicts) by column; see the module's docstring. ``keys``: every key some row has, in
    the rows' order; ``absent[key]``: the rows that lack ``key`` (only for such keys)."""

    def __init__(self, keys: list[Any], columns: dict[Any, Column], n: int,
                 absent: dict[Any, np.ndarray] | None = None) -> None:
        self.keys = keys
        self.columns = columns
        self.n = n
        self.absent = {key: mask for key, mask in (absent or {}).items() if mask.any()}

    # ------------------------------------------------------------------ making one
    @classmethod
    def from_dicts(cls, rows: list[dict[Any, Any]]) -> "RowTable":
        """The table of these rows (dicts of any keys)."""
        rows = list(rows)
        n = len(rows)
        shapes = list(dict.fromkeys(map(tuple, rows)))  # each distinct key order, once
        keys = merged_keys(shapes)
        if len(shapes) == 1:  # one shape: every row's values in its key order
            columns = list(map(list, zip(*map(dict.values, rows)))) if keys else []
            return cls(keys, dict(zip(keys, map(column, columns))), n)
        absent: dict[Any, np.ndarray] = {}
        made: dict[Any, Column] = {}
        for key in keys:
            made[key] = column(list(map(dict.get, rows, repeat(key))))
            if not all(key in shape for shape in shapes):
                absent[key] = ~np.fromiter(map(dict.__contains__, rows, repeat(key)), dtype=bool, count=n)
        return cls(keys, made, n, absent)

    @classmethod
    def empty(cls) -> "RowTable":
        return cls([], {}, 0)

    @classmethod
    def concat(cls, tables: list["RowTable"], consume: bool = False) -> "RowTable":
        """The rows of ``tables``, one after the other. ``consume``: each source column is let go
        of as soon as it is copied (the sources are left empty): the rows are held about once,
        not twice."""
        tables = [t for t in tables if t.n]
        if not tables:
            return cls.empty()
        keys = merged_keys([t.keys for t in tables])
        columns: dict[Any, Column] = {}
        absent: dict[Any, np.ndarray] = {}
        count = sum(t.n for t in tables)
        for key in keys:
            if any(key not in t.columns or key in t.absent for t in tables):
                absent[key] = np.concatenate([t.absent.get(key, np.zeros(t.n, dtype=bool)) if key in t.columns
                                              else np.ones(t.n, dtype=bool) for t in tables])
            parts = [t.columns.get(key) or nones(t.n) for t in tables]
            if consume:
                for t in tables:
                    t.columns.pop(key, None)
            columns[key] = concat_columns(parts) if len(parts) > 1 else parts[0].take(np.arange(count))
            del parts
        if consume:
            for t in tables:
                t.keys, t.columns, t.absent, t.n = [], {}, {}, 0
        return cls(keys, columns, count, absent)

    def take(self, index: np.ndarray) -> "RowTable":
        """The rows ``index`` (int array), in that order."""
        index = np.asarray(index, dtype=np.int64)
        return RowTable(list(self.keys), {key: col.take(index) for key, col in self.columns.items()}, len(index),
                        {key: mask[index] for key, mask in self.absent.items()})

    # ------------------------------------------------------------------ columns
    def column(self, key: Any) -> Column | None:
        """``key``'s column (None where a row lacks it), or None when no row has it."""
        return self.columns.get(key)

    def values(self, key: Any) -> list[Any]:
        """``row.get(key)`` of every row."""
        col = self.columns.get(key)
        return col.values() if col is not None else [None] * self.n

    def has(self, key: Any) -> np.ndarray | None:
        """Which rows have ``key`` (None: all of them, or none when no row has it)."""
        mask = self.absent.get(key)
        return None if mask is None else ~mask

    def set(self, key: Any, col: Column, present: np.ndarray | None = None) -> None:
        """``row[key] = value`` on every row (``present``: on those rows only, the others
        lacking the key unless they had it): a new key goes after the others, as in a dict."""
        if col.n != self.n:
            raise ValueError(f"a column of {col.n} values for {self.n} rows")
        if present is not None and not present.all():
            if key in self.columns:  # the rows that had the key keep their value
                had = ~self.absent.get(key, np.zeros(self.n, dtype=bool))
                keep = had & ~present
                if keep.any():
                    col = concat_columns([col, self.columns[key]]).take(
                        np.where(keep, np.arange(self.n) + self.n, np.arange(self.n)))
                present = present | had
            if not present.all():
                self.absent[key] = ~present
            else:
                self.absent.pop(key, None)
        else:
            self.absent.pop(key, None)
        if key not in self.columns:
            self.keys.append(key)
        self.columns[key] = col

    def set_values(self, key: Any, values: list[Any]) -> None:
        self.set(key, column(values))

    @property
    def nbytes(self) -> int:
        """The columns' own bytes (not the shared table objects)."""
        return sum(col.nbytes for col in self.columns.values()) + sum(m.nbytes for m in self.absent.values())

    # ------------------------------------------------------------------ dicts
    def row(self, i: int) -> dict[Any, Any]:
        if not -self.n <= i < self.n:
            raise IndexError("row index out of range")
        i %= self.n if self.n else 1
        return {key: self.columns[key].at(i) for key in self.keys if not self._lacks(key, i)}

    def _lacks(self, key: Any, i: int) -> bool:
        mask = self.absent.get(key)
        return mask is not None and bool(mask[i])

    def dicts(self, index: np.ndarray | None = None) -> list[dict[Any, Any]]:
        """The rows (``index``: those rows, in that order) as dicts, made in C-level passes."""
        part = self if index is None else self.take(index)
        if not part.n:
            return []
        values = [part.columns[key].values() for key in part.keys]
        if not part.absent:
            return list(map(dict, map(zip, repeat(part.keys), zip(*values)))) if part.keys \
                else [{} for _ in range(part.n)]
        # rows by which keys they lack (a few patterns), each pattern's rows made at once
        missing = list(part.absent)
        pattern = np.zeros(part.n, dtype=np.int64)
        for bit, key in enumerate(missing):
            pattern |= part.absent[key].astype(np.int64) << bit
        out: list[dict[Any, Any]] = [None] * part.n  # type: ignore[list-item]
        for code in np.unique(pattern).tolist():
            rows = np.flatnonzero(pattern == code)
            lacking = {key for bit, key in enumerate(missing) if code >> bit & 1}
            chosen = [k for k, key in enumerate(part.keys) if key not in lacking]
            keys = [part.keys[k] for k in chosen]
            taken = rows.tolist()
            columns = [list(map(values[k].__getitem__, taken)) for k in chosen]
            made = list(map(dict, map(zip, repeat(keys), zip(*columns)))) if keys else [{} for _ in taken]
            for i, row in zip(taken, made):
                out[i] = row
        return out

    # ------------------------------------------------------------------ a sequence of dicts
    def _made(self, index: np.ndarray) -> list[dict[Any, Any]]:
        return self.dicts(index)

    def _one(self, i: int) -> dict[Any, Any]:
        return self.row(i)

    def __repr__(self) -> str:
        return f"<RowTable of {self.n} rows, {len(self.keys)} keys>"


def merged_keys(shapes: Sequence[Sequence[Any]]) -> list[Any]:
    """Every key of the shapes (key orders), in an order that keeps each shape's: a key new to
    the list goes right after the key before it in its shape (first: at the start)."""
    keys: list[Any] = []
    seen: set[Any] = set()
    for shape in shapes:
        if not seen:
            keys = list(dict.fromkeys(shape))
            seen = set(keys)
            continue
        if len(shape) <= len(keys) and all(key in seen for key in shape):
            continue
        previous = None
        for key in shape:
            if key not in seen:
                at = 0 if previous is None else keys.index(previous) + 1
                keys.insert(at, key)
                seen.add(key)
            previous = key
    return keys


def concat_columns(cols: list[Column]) -> Column:
    """The values of ``cols``, one after the other, in the most compact form that holds them."""
    typed = [c for c in cols if not _all_none(c)]
    if not typed:
        return nones(sum(c.n for c in cols))
    if all(isinstance(c, Numbers) for c in typed) and len({c.data.dtype for c in typed}) == 1:  # type: ignore[attr-defined]
        dtype = typed[0].data.dtype  # type: ignore[attr-defined]
        data = np.concatenate([c.data if isinstance(c, Numbers) else np.zeros(c.n, dtype=dtype) for c in cols])
        nulls = [c.none if isinstance(c, Numbers) else np.ones(c.n, dtype=bool) for c in cols]
        none = None if all(m is None for m in nulls) else np.concatenate(
            [np.zeros(c.n, dtype=bool) if m is None else m for c, m in zip(cols, nulls)])
        return Numbers(data, none)
    if all(isinstance(c, Coded) for c in cols):
        return _concat_coded(cols)  # type: ignore[arg-type]
    return column([value for c in cols for value in c.values()])


def _concat_coded(cols: list[Coded]) -> Coded:
    by_value = all(c.by_value for c in cols if not _all_none(c))
    table: list[Any] = []
    code_of: dict[Any, int] = {}
    parts = []
    for c in cols:
        keys = c.table if by_value else list(map(id, c.table))
        for key, obj in zip(keys, c.table):
            if key not in code_of:
                code_of[key] = len(table)
                table.append(obj)
        recode = np.array([code_of[key] for key in keys], dtype=np.int64)
        parts.append(recode[c.codes] if len(c.codes) else np.zeros(0, dtype=np.int64))
    codes = np.concatenate(parts).astype(code_type(len(table)))
    return Coded(codes, table, by_value)


class RowSubset(Sequence):
    """Some rows of a table (``index``, in that order) as a sequence of dicts, read from the
    table when asked for: columns the table gets later (the job analyses') are read too. A
    rank's rows in the job's table (``RankAnalysis.collectives`` after the reduce)."""

    def __init__(self, table: RowTable, index: np.ndarray) -> None:
        self.source, self.index = table, index

    def table(self) -> RowTable:
        return self.source.take(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self.source.dicts(self.index[i])
        return self.source.row(int(self.index[i]))

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        for start in range(0, len(self.index), _ITER_CHUNK):
            yield from self.source.dicts(self.index[start:start + _ITER_CHUNK])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RowTable, RowSubset, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<RowSubset of {len(self.index)} rows>"


def as_table(rows: Any) -> RowTable:
    """``rows`` as a RowTable: itself, a subset's rows, or a list of dicts made one."""
    if isinstance(rows, RowTable):
        return rows
    if isinstance(rows, RowSubset):
        return rows.table()
    return RowTable.from_dicts(list(rows or []))
