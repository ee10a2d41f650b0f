"""A cached rank summary as bytes and back: msgspec MessagePack of plain data (never pickle:
decoding runs no code), the collective rows stored by column.

A cached re-run of a 64-rank job spent as long reading its entries as JSON row dicts as on
the whole reduce after it: 274,560 dicts, each with its own copy of every string and of its
process-group dict (which ``share_groups`` then had to compare, row by row, to share again).
By column, a string or group column is stored as its distinct values plus one code per row,
and decoded back into rows that share those objects; numbers stay plain lists. MessagePack
keeps what JSON loses (ints vs floats as written, NaN, non-string keys), so a hit gives the
rows exactly as the map computed them.

The same columns carry a worker's rows to the parent process (``PackedRows``: number columns
as arrays), which holds them so until the pool is done.
"""

from __future__ import annotations

from collections import defaultdict, deque
from itertools import count, repeat
from typing import Any, NamedTuple

import msgspec
import numpy as np

from analyzer.base.gc_pause import paused_gc
from analyzer.rank.comms import with_room


class RowColumns(msgspec.Struct, forbid_unknown_fields=True):
    """Rows of one shape (the same keys in the same order), by column. ``tables[i]`` None:
    ``columns[i]`` holds the values; else the distinct values, ``columns[i]`` their codes."""
    keys: list[str]
    columns: list[list[Any]]
    tables: list[list[Any] | None]


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    rank: dict[str, Any]  # the summary's fields; "collectives" is in ``rows`` when given
    rows: RowColumns | None = None


def _plain_scalar(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (np.float64 is a float and never gets here);
    anything else msgspec cannot encode is refused."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    raise TypeError(f"cannot cache a {type(value).__name__}")


_DECODER = msgspec.msgpack.Decoder(Entry)
# Tuples encode as arrays (read back as lists, as JSON would), numpy scalars as their numbers:
# the summary is encoded as the map left it, with no plain-data copy of it first.
_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain_scalar)


def encode(fields: dict[str, Any], version: int, columns: RowColumns | None = None) -> bytes | None:
    """The entry of a summary's fields (plain data, tuples and numpy scalars allowed); None when
    MessagePack cannot hold a value (an int beyond 64 bits from a hostile trace): the rank is
    then not cached. ``columns``: ``to_columns`` of its rows, when the caller has it."""
    rows = fields.get("collectives")
    try:
        if columns is None:
            columns = to_columns(rows) if isinstance(rows, list) else None
        if columns is not None:
            fields = {k: v for k, v in fields.items() if k != "collectives"}
        return _ENCODER.encode(Entry(version, fields, columns))
    except (msgspec.EncodeError, OverflowError, TypeError, ValueError):
        return None


def decode(raw: bytes, version: int) -> dict[str, Any] | None:
    """The summary's fields, or None for a damaged entry or one of another format."""
    try:
        with paused_gc():  # a few hundred thousand fresh objects, no cycles
            entry = _DECODER.decode(raw)
            if entry.format != version:
                return None
            fields = entry.rank
            if entry.rows is not None:
                fields["collectives"] = from_columns(entry.rows)
    except (msgspec.DecodeError, ValueError, IndexError, TypeError):
        return None
    return fields


def to_columns(rows: list[Any]) -> RowColumns | None:
    """``rows`` by column, or None when they are not dicts of one shape (kept as a list).
    Per-row work is C-level passes (the map's rows are tens of thousands per rank)."""
    if not rows or not all(map(isinstance, rows, repeat(dict))):
        return None
    keys = list(rows[0])
    if not all(isinstance(key, str) for key in keys) or not all(map(keys.__eq__, map(list, rows))):
        return None
    columns, tables = [], []
    for values in map(list, zip(*map(dict.values, rows))):  # same keys in the same order
        table, codes = _coded(values)
        columns.append(codes if table is not None else values)
        tables.append(table)
    return RowColumns(keys, columns, tables)


_CODED_TYPES = (str, dict, type(None))


def _coded(values: list[Any]) -> tuple[list[Any] | None, list[int]]:
    """(distinct values, one code per value) for a column of strings or dicts (None allowed);
    (None, []) for any other column. Values are told apart by their encoding, so 1, 1.0 and
    True, or dicts with their keys in another order, stay distinct as ``==`` would not. Rows
    share their strings and group dicts, so each distinct object is checked and encoded once."""
    # The types first, in one C-level pass: a number column (most of them, each value its own
    # object) is refused before an id table is built over its values.
    if not all(issubclass(kind, _CODED_TYPES) for kind in set(map(type, values))):
        return None, []
    by_object: defaultdict = defaultdict(count().__next__)
    object_codes = list(map(by_object.__getitem__, map(id, values)))
    objects = dict(zip(map(id, values), values))  # alive in ``values``: the ids stay unique
    distinct = [objects[ident] for ident in by_object]
    table: list[Any] = []
    code_of: dict[bytes, int] = {}
    recode = []
    for value in distinct:
        encoded = _ENCODER.encode(value)
        code = code_of.get(encoded)
        if code is None:
            code = code_of[encoded] = len(table)
            table.append(value)
        recode.append(code)
    return table, list(map(recode.__getitem__, object_codes))


def from_columns(stored: RowColumns | PackedRows) -> list[dict[str, Any]]:
    """The rows again; the rows of a coded column share its table's objects."""
    count = len(stored.columns[0]) if stored.columns else 0
    if not (len(stored.keys) == len(stored.columns) == len(stored.tables) > 0):
        raise ValueError("damaged entry: columns do not match keys")
    columns = []
    for values, table in zip(stored.columns, stored.tables):
        if isinstance(values, np.ndarray):  # packed (PackedRows): the same Python values again
            values = values.tolist()
        if len(values) != count:
            raise ValueError("damaged entry: columns of different lengths")
        if table is not None:
            if values and (min(values) < 0 or max(values) >= len(table)):  # not ints: TypeError
                raise ValueError("damaged entry: code out of range")
            values = list(map(table.__getitem__, values))
        columns.append(values)
    # Copies of one row with room for the job analyses' keys (comms.with_room), filled in
    # C-level passes: no Python frame step per row.
    rows = list(map(dict.copy, repeat(with_room(dict.fromkeys(stored.keys)), count)))
    deque(map(dict.update, rows, map(zip, repeat(stored.keys), zip(*columns))), maxlen=0)
    return rows


class PackedRows(NamedTuple):
    """Rows of one shape by column (as ``RowColumns``) on their way from a worker process to the
    parent: a column of one number type is an array, codes included. The parent holds them so
    until every worker is done (a fifth of the rows' memory as dicts: docs/scale.md), and
    unpacks them with ``from_columns``."""
    keys: list[str]
    columns: list[Any]  # np.ndarray (one number type), else the list of values
    tables: list[list[Any] | None]


def pack(columns: RowColumns) -> PackedRows:
    return PackedRows(columns.keys, [_packed(values) for values in columns.columns], columns.tables)


def _packed(values: list[Any]) -> Any:
    """An array that ``tolist()`` turns back into these values (same types, same bits), or
    the list itself (mixed types, None, ints beyond 64 bits)."""
    kinds = set(map(type, values))
    dtype = _DTYPES.get(kinds.pop()) if len(kinds) == 1 else None
    if dtype is None:
        return values
    try:
        return np.array(values, dtype=dtype)
    except OverflowError:
        return values


_DTYPES = {float: np.float64, int: np.int64, bool: np.bool_}
