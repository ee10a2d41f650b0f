"""A cached rank summary as bytes and back: msgspec MessagePack of plain data (never pickle:
decoding runs no code), the collective rows by column.

The rows are the map's ``RowTable`` (analyzer.base.rowtable): each column stored as it is held,
a number column as its array's bytes (and the rows where it is None), a coded column as its
codes' bytes and its table of distinct values (strings, the process-group dicts), any other
column as its list of values. Decoding makes the same table again: the arrays read from the
bytes, no Python object per row. MessagePack keeps what JSON loses (ints vs floats as written,
NaN, non-string keys), so a hit gives the rows exactly as the map computed them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from analyzer.base.gc_pause import paused_gc
from analyzer.base.rowtable import Coded, Column, Numbers, Objects, RowTable, as_table

# The array types a stored column may have (numbers, and codes into a table).
_DTYPES = frozenset({"<f8", "<i8", "<u8", "|b1", "|u1", "<u2", "<u4"})


class StoredColumn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One column: ``numbers`` (``data``: the array's bytes of ``dtype``; ``none``: the rows
    that hold None, bit-packed), ``coded`` (``data``: the codes; ``table``: the values by code;
    ``by_value``: strings told apart by value) or ``objects`` (``table``: every row's value)."""
    form: str
    dtype: str | None = None
    data: bytes | None = None
    none: bytes | None = None
    table: list[Any] | None = None
    by_value: bool = True


class StoredRows(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[Any]
    count: int
    columns: list[StoredColumn]
    absent: dict[int, bytes]  # by the key's position: the rows that lack it, bit-packed


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    rank: dict[str, Any]  # the summary's fields; "collectives" is in ``rows`` when given
    rows: StoredRows | None = None


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


def encode(fields: dict[str, Any], version: int) -> bytes | None:
    """The entry of a summary's fields (plain data, tuples and numpy scalars allowed; the
    collective rows a RowTable, or a list of dicts); None when MessagePack cannot hold a value
    (an int beyond 64 bits from a hostile trace): the rank is then not cached."""
    rows = fields.get("collectives")
    try:
        stored = None
        if rows is not None:
            stored = stored_rows(as_table(rows))
            fields = {k: v for k, v in fields.items() if k != "collectives"}
        return _ENCODER.encode(Entry(version, fields, stored))
    except (msgspec.EncodeError, OverflowError, TypeError, ValueError):
        return None


def decode(raw: bytes, version: int) -> dict[str, Any] | None:
    """The summary's fields, or None for a damaged entry or one of another format."""
    try:
        with paused_gc():  # fresh objects, no cycles
            entry = _DECODER.decode(raw)
            if entry.format != version:
                return None
            fields = entry.rank
            if entry.rows is not None:
                fields["collectives"] = table_of(entry.rows)
    except (msgspec.DecodeError, ValueError, IndexError, TypeError):
        return None
    return fields


def stored_rows(table: RowTable) -> StoredRows:
    position = {key: k for k, key in enumerate(table.keys)}
    return StoredRows(list(table.keys), table.n, [_stored(table.columns[key]) for key in table.keys],
                      {position[key]: np.packbits(mask).tobytes() for key, mask in table.absent.items()})


def _stored(col: Column) -> StoredColumn:
    if isinstance(col, Numbers):
        return StoredColumn("numbers", col.data.dtype.str, col.data.tobytes(),
                            None if col.none is None else np.packbits(col.none).tobytes())
    if isinstance(col, Coded):
        return StoredColumn("coded", col.codes.dtype.str, col.codes.tobytes(), table=col.table, by_value=col.by_value)
    return StoredColumn("objects", table=col.values())


def table_of(stored: StoredRows) -> RowTable:
    """The RowTable again (ValueError: a damaged entry)."""
    n = stored.count
    if len(stored.keys) != len(stored.columns) or n < 0:
        raise ValueError("damaged entry: columns do not match keys")
    columns = {key: _column(col, n) for key, col in zip(stored.keys, stored.columns)}
    absent = {}
    for k, bits in stored.absent.items():
        if not 0 <= k < len(stored.keys):
            raise ValueError("damaged entry: an absent key out of range")
        absent[stored.keys[k]] = _mask(bits, n)
    return RowTable(list(stored.keys), columns, n, absent)


def _column(col: StoredColumn, n: int) -> Column:
    if col.form == "objects" and col.table is not None and len(col.table) == n:
        return Objects(col.table)
    if col.dtype not in _DTYPES or col.data is None:
        raise ValueError("damaged entry: a column of no known form")
    data = np.frombuffer(col.data, dtype=np.dtype(col.dtype))
    if len(data) != n:
        raise ValueError("damaged entry: columns of different lengths")
    if col.form == "numbers":
        return Numbers(data, None if col.none is None else _mask(col.none, n))
    if col.form == "coded" and col.table is not None:
        if data.dtype.kind not in "iu":
            raise ValueError("damaged entry: codes that are not whole numbers")
        if n and (int(data.max()) >= len(col.table) or int(data.min()) < 0):
            raise ValueError("damaged entry: code out of range")
        return Coded(data, col.table, col.by_value)
    raise ValueError("damaged entry: a column of no known form")


def _mask(bits: bytes, n: int) -> np.ndarray:
    mask = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=n).astype(bool)
    if len(mask) != n:
        raise ValueError("damaged entry: a mask of another length")
    return mask
