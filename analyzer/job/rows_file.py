"""The rows file: every collective row of a large result, by column, in Parquet (the
``tracecliff[parquet]`` extra: pyarrow).

A result of more than ``JSON_ROWS`` collective rows keeps only its most exposed ones in the
JSON, with the digest every view quotes (analyzer.job.digest); all its rows go here, next to
the JSON (``result.json`` -> ``result.collectives.parquet``), which names the file and its
SHA-256. ``load_result`` reads it only when the rows are asked for (``result.collectives``,
``collectives_df()``, the what-if), and checks the digest first: a file that is not this
result's (moved, truncated, replaced) is one line naming it, never rows of another run.

Parquet, because every tool that reads tables reads it (pandas, Polars, DuckDB, Spark) with
its types, and a column at a time. Without pyarrow the JSON is still complete for every view;
only the rows file is not written (the JSON says so and why).

The rows come back exactly as written: every key of every row (a key some rows lack is absent
from those rows again), ints as ints (int64, uint64, or decimal text beyond), floats as
floats (NaN kept), None as null, strings dictionary-coded, process groups as a code into the
distinct group dicts (member lists included) kept once in the file's metadata. Nothing in the
file is ever unpickled or evaluated: its metadata is JSON read by msgspec into a typed Struct,
its columns are checked against that description before a value is read.
"""

from __future__ import annotations

import hashlib
import threading
from itertools import repeat
from operator import is_
from pathlib import Path
from typing import Any, Callable

import msgspec
import numpy as np

from analyzer.base.errors import InputError
from analyzer.base.rowtable import Coded, Numbers, RowTable, as_table

FORMAT = 1  # of the file's own description (its metadata key ``tracecliff``)
META_KEY = b"tracecliff"
EXTRA = "pip install 'tracecliff[parquet]'"
# The columns of the human-readable group fields (the exact group dicts are in the metadata).
GROUP_FIELDS = (("group", "name"), ("group_size", "size"), ("group_description", "description"))
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


class ParquetColumn(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    key: str  # the rows' key
    encoding: str  # int64 | uint64 | int_text | float | bool | str | null | json | group
    column: str  # the Parquet column holding it
    present: str | None = None  # a bool column: rows that have the key (None: all of them)


class Description(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    rows: int
    columns: list[ParquetColumn]
    groups: list[Any]  # the distinct process-group values, by code


ENCODINGS = {"int64", "uint64", "int_text", "float", "bool", "str", "null", "json", "group"}


def file_for(json_path: str | Path) -> Path:
    """Where the rows of the result at ``json_path`` go: beside it, ``.json`` (``.json.gz``)
    replaced by ``.collectives.parquet``."""
    path = Path(json_path)
    name = path.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    return path.with_name(name + ".collectives.parquet")


def available() -> bool:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- writing
def write(path: str | Path, rows: Any, view: Any = None) -> str:
    """Write ``rows`` (a RowTable, or a list of dicts) to ``path`` (atomically: a temporary file renamed over it); returns the
    file's SHA-256. ``view``: the rows' columns (analyzer.job.columns), whose values are taken
    as they are. Needs pyarrow (``available()``)."""
    return start_write(path, rows, view)()


def start_write(path: str | Path, rows: Any, view: Any = None) -> Callable[[], str]:
    """``write``, its Parquet encoding, compression and writing left to a thread (pyarrow and
    the file system release the GIL: a large result's JSON is made meanwhile); returns the call
    that waits for it and gives the SHA-256 (or raises what the writing raised)."""
    import pyarrow as pa

    arrays, columns, groups = _columns(rows, view)
    description = Description(FORMAT, len(rows), columns, groups)
    # from_arrays: ``pa.table(dict)`` would import pandas (0.7 s) to ask whether it was given a frame
    table = pa.Table.from_arrays(list(arrays.values()), names=list(arrays))
    table = table.replace_schema_metadata({META_KEY: msgspec.json.encode(description)})
    outcome: dict[str, Any] = {}

    def encode_and_write() -> None:
        try:
            outcome["sha256"] = _encode_and_write(table, path)
        except BaseException as exc:  # noqa: BLE001 - raised again by the waiting call
            outcome["error"] = exc
    worker = threading.Thread(target=encode_and_write, name="tracecliff-rows-file", daemon=True)
    worker.start()

    def wait() -> str:
        worker.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["sha256"]
    return wait


def _encode_and_write(table: Any, path: str | Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analyzer.base.output import write_atomic
    sink = pa.BufferOutputStream()
    strings = [field.name for field in table.schema if pa.types.is_dictionary(field.type)]
    pq.write_table(table, sink, compression="zstd", use_dictionary=strings, write_statistics=False)
    data = sink.getvalue()
    write_atomic(path, memoryview(data))
    return hashlib.sha256(memoryview(data)).hexdigest()


def _columns(rows: Any, view: Any) -> tuple[dict[str, Any], list[ParquetColumn], list[Any]]:
    """The Arrow arrays of the rows' keys, their description and the distinct groups. A key the
    job's columns (``view``, analyzer.job.columns) already hold is taken from them; the others
    from the rows' table (analyzer.base.rowtable: a 1,024-rank job has 2 million rows), a
    column at a time. The keys in the order the rows' dicts give them: the first row's, then
    each key of a later row with more keys that is not among them yet."""
    table = as_table(rows)
    arrays: dict[str, Any] = {}
    columns: list[ParquetColumn] = []
    groups: list[Any] = []
    for n, key in enumerate(_key_order(table)):
        taken = _from_view(view, key)
        if taken is None and key != "group":
            taken = _from_column(table, key)
        if taken is not None:
            encoding, array, nulls, values = taken
        else:
            values = table.values(key)
            nulls = values.count(None)
        present = None
        if nulls:
            has = table.has(key)
            if has is not None and not has.all():
                present = f"present.{n}"
                arrays[present] = _buffers("bool", has)
        if key == "group":
            codes, groups = _group_codes(values) if taken is None else values
            arrays["group_code"] = _buffers("int32", codes)
            for name, field in GROUP_FIELDS:
                arrays[name] = _array([g.get(field) if isinstance(g, dict) else None for g in groups], codes)
            columns.append(ParquetColumn(key, "group", "group_code", present))
        else:
            if taken is None:
                encoding, array = _encoded(values)
            name = key if not key.startswith(("present.", "group", "column.")) else f"column.{n}"
            arrays[name] = array
            columns.append(ParquetColumn(key, encoding, name, present))
    return arrays, columns, groups


def _key_order(table: RowTable) -> list[Any]:
    """The keys as a pass over the rows' dicts finds them: the first row's keys, then, whenever
    a row has more keys than those found so far (a row has them in the table's order), its keys
    not found yet. Rows are told apart by which keys they lack (a few patterns): the first row
    of each pattern is the only one that can add keys."""
    if not table.n:
        return []
    lacking = list(table.absent)
    pattern = np.zeros(table.n, dtype=np.int64)
    for bit, key in enumerate(lacking):
        pattern |= table.absent[key].astype(np.int64) << bit
    _, first = np.unique(pattern, return_index=True)
    shapes = [[key for k, key in enumerate(table.keys) if not (key in table.absent and table.absent[key][i])]
              for i in np.sort(first).tolist()]
    keys = list(shapes[0])
    seen = set(keys)
    for shape in shapes[1:]:
        # a row counts the keys found so far that it has: it adds keys only when it has more
        if len(shape) > sum(key in seen for key in shape):
            for key in shape:
                if key not in seen:
                    keys.append(key)
                    seen.add(key)
    return keys


def _from_view(view: Any, key: str) -> tuple[str, Any, int, Any] | None:
    """(encoding, array, how many rows have None, the values for the group column) of a key the
    job's columns hold exactly: process groups and categories by their objects, times and
    bandwidths as the floats they are (None as NaN), sizes as whole numbers below 2**53, ranks.
    None: read the key from the rows."""
    if view is None or not view.n:
        return None
    if key == "group":  # the view's codes of the group objects, coded again by value
        codes, groups = _distinct_by_value(view.group.names)
        row_codes = codes[view.group.codes]
        nulls = int(sum(np.count_nonzero(row_codes == c) for c, g in enumerate(groups) if g is None))
        return "group", None, nulls, (row_codes, groups)
    if key in _CATEGORIES:
        return _category(getattr(view, _CATEGORIES[key]))
    if key in _FLOATS:
        data = getattr(view, _FLOATS[key]) if _FLOATS[key] else view.extra.get(key)
        if data is None:
            return None
        missing = np.isnan(data)
        nulls = int(missing.sum())
        return "float", _buffers("float", data, missing if nulls else None), nulls, None
    if key == "rank":
        return "int64", _buffers("int64", view.rank), 0, None
    if key == "bytes":
        size = view.size
        missing = np.isnan(size)
        known = size[~missing]
        if len(known) and (float(np.abs(known).max()) >= 2.0 ** 53 or not np.array_equal(known, np.rint(known))):
            return None
        nulls = int(missing.sum())
        data = np.where(missing, 0, size).astype(np.int64)
        return "int64", _buffers("int64", data, missing if nulls else None), nulls, None
    if key in ("comms_id", "seq"):  # the rows' own values, kept by the view
        if (from_table := _from_column(view.rows, key)) is not None:
            return from_table
        values = getattr(view, key)
        encoding, array = _encoded(values)
        return encoding, array, values.count(None), None
    if key == "waited_for" and "waited_for" in view.extra:
        peers = view.extra["waited_for"]  # -1: none
        missing = peers < 0
        nulls = int(missing.sum())
        return "int64", _buffers("int64", peers, missing if nulls else None), nulls, None
    if key == "bound" and "bound" in view.extra:
        from analyzer.job.commfit import BOUNDS
        return _category(_Coded(view.extra["bound"], list(BOUNDS)))
    return None


def _from_column(table: RowTable, key: str) -> tuple[str, Any, int, None] | None:
    """``_encoded`` of a key's values (encoding, array, how many rows have None) from the
    table's column where its form decides them: numbers of one type, strings by code (a row
    lacking the key counts as None, as ``dict.get`` gives). None: read the values."""
    col = table.column(key)
    if col is None:
        return None
    missing = col.none if isinstance(col, Numbers) else None
    if isinstance(col, Coded) and col.by_value:
        used = [code for code in col.used().tolist()]
        table_values = [col.table[code] for code in used if col.table[code] is not None]
        if not table_values or not all(type(v) is str for v in table_values):
            return None
        position = np.zeros(len(col.table), dtype=np.int32)
        position[[code for code in used if col.table[code] is not None]] = np.arange(len(table_values))
        is_none = np.array([value is None for value in col.table], dtype=bool)[col.codes]
        missing = _with_absent(table, key, is_none)
        codes = position[col.codes]
        codes[missing] = 0  # as _encoded codes None
        return "str", _dictionary(codes, table_values, missing if missing.any() else None), int(missing.sum()), None
    if not isinstance(col, Numbers):
        return None
    missing = _with_absent(table, key, np.zeros(col.n, dtype=bool) if missing is None else missing)
    if missing.all():
        return None  # no value: _encoded's null column
    mask = missing if missing.any() else None
    kind = col.data.dtype.kind
    if kind == "f":
        data = col.data if mask is None else np.where(mask, np.nan, col.data)
        return "float", _buffers("float", data, mask), int(missing.sum()), None
    if kind == "b":
        data = col.data if mask is None else np.where(mask, False, col.data)
        return "bool", _buffers("bool", data, mask), int(missing.sum()), None
    if kind in "iu":
        data = col.data if mask is None else np.where(mask, 0, col.data).astype(col.data.dtype)
        return ("int64" if kind == "i" else "uint64"), _buffers("int64" if kind == "i" else "uint64", data, mask), \
            int(missing.sum()), None
    return None


def _with_absent(table: RowTable, key: str, missing: np.ndarray) -> np.ndarray:
    absent = table.absent.get(key)
    return missing if absent is None else missing | absent


# The view's columns (analyzer.job.columns.CollectiveColumns) a key is read from: its own
# attribute, or (None) the column the job analysis wrote (``view.extra``).
_CATEGORIES = {"collective": "kind", "phase": "phase", "library": "library", "step": "step"}
_FLOATS = {"start_us": "start", "dur_us": "dur", "launch_us": "launch", "wait_us": None, "arrival_lag_us": None,
           "busbw_gbps": None, "algbw_gbps": None, "exposed_us": None}


class _Coded:
    def __init__(self, codes: np.ndarray, names: list[Any]) -> None:
        self.codes, self.names = codes, names


def _category(categories: Any) -> tuple[str, Any, int, Any] | None:
    """A categorical column of strings (None allowed), else of whole numbers (the step)."""
    names = categories.names
    kinds = set(map(type, names)) - {type(None)}
    missing_codes = [code for code, name in enumerate(names) if name is None]
    missing = np.isin(categories.codes, missing_codes) if missing_codes else None
    nulls = int(missing.sum()) if missing is not None else 0
    if kinds <= {str}:
        table = [name for name in names if name is not None]
        position = np.array([0 if name is None else table.index(name) for name in names], dtype=np.int32)
        return "str", _dictionary(position[categories.codes], table, missing), nulls, None
    if kinds == {int} and all(_INT64[0] <= name <= _INT64[1] for name in names if name is not None):
        values = np.array([0 if name is None else name for name in names], dtype=np.int64)
        return "int64", _buffers("int64", values[categories.codes], missing), nulls, None
    return None


def _group_codes(values: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """Codes of the rows' group values: rows share their group objects, so each distinct
    object is encoded once, and equal values (the same JSON) get one code."""
    ids = list(map(id, values))
    objects = dict(zip(ids, values))  # held in ``values``: the ids stay unique
    codes, distinct = _distinct_by_value(list(objects.values()))
    code_of_id = dict(zip(objects, codes.tolist()))
    return np.fromiter(map(code_of_id.__getitem__, ids), dtype=np.int32, count=len(ids)), distinct


def _distinct_by_value(objects: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """(each object's code, the distinct values by code): objects equal by their JSON share one."""
    code_of_text: dict[bytes, int] = {}
    distinct: list[Any] = []
    codes = np.empty(len(objects), dtype=np.int32)
    for i, value in enumerate(objects):
        code = codes[i] = code_of_text.setdefault(msgspec.json.encode(value), len(distinct))
        if code == len(distinct):
            distinct.append(value)
    return codes, distinct


def _array(per_code: list[Any], codes: np.ndarray) -> Any:
    """The column of ``per_code[code]`` for each row's code: a dictionary column of strings,
    else the values' own column taken by code."""
    kinds = set(map(type, per_code)) - {type(None)}
    if kinds <= {str}:
        table = [v for v in dict.fromkeys(per_code) if v is not None]
        position = np.array([0 if v is None else table.index(v) for v in per_code], dtype=np.int32)
        missing = np.array([v is None for v in per_code], dtype=bool)
        return _dictionary(position[codes], table, missing[codes] if missing.any() else None)
    ints = kinds == {int} and all(_INT64[0] <= v <= _INT64[1] for v in per_code if v is not None)
    if not ints:  # a group field of another type (a hostile trace's): its values, row by row
        return _encoded([per_code[code] for code in codes.tolist()])[1]
    missing = np.array([v is None for v in per_code], dtype=bool)
    values = np.array([0 if v is None else v for v in per_code], dtype=np.int64)
    return _buffers("int64", values[codes], missing[codes] if missing.any() else None)


def _encoded(values: list[Any]) -> tuple[str, Any]:
    """(encoding, Arrow array) of one key's values, exact: see the module's docstring."""
    import pyarrow as pa
    kinds = set(map(type, values))
    nulls = type(None) in kinds
    kinds.discard(type(None))
    mask = np.fromiter(map(is_, values, repeat(None)), dtype=bool, count=len(values)) if nulls else None
    if not kinds:
        return "null", pa.nulls(len(values))
    if kinds == {float}:
        return "float", _buffers("float", np.array(values, dtype=np.float64), mask)  # None: NaN, masked
    if kinds == {bool}:
        return "bool", _buffers("bool", np.array(values, dtype=bool) if mask is None else
                                np.array([bool(v) for v in values], dtype=bool), mask)
    if kinds == {int}:
        if mask is None:
            try:  # no None: read as int64 at once
                return "int64", _buffers("int64", np.fromiter(values, dtype=np.int64, count=len(values)))
            except OverflowError:
                pass
        data = np.array(values, dtype=object)
        if mask is not None:
            data[mask] = 0
        for encoding in ("int64", "uint64"):
            try:
                return encoding, _buffers(encoding, data.astype(encoding), mask)
            except OverflowError:
                continue
        return "int_text", _texts([None if v is None else str(v) for v in values])
    if kinds == {str}:
        table = list(dict.fromkeys(values))
        if mask is not None:
            table.remove(None)
        code_of = {value: code for code, value in enumerate(table)}
        code_of[None] = 0  # masked
        codes = np.fromiter(map(code_of.__getitem__, values), dtype=np.int32, count=len(values))
        return "str", _dictionary(codes, table, mask)
    # mixed numbers, lists, dicts: each value's JSON (NaN and infinities tagged)
    return "json", _texts([None if v is None else _json(v) for v in values])


# Arrow arrays are made from their buffers: ``pa.array`` would import pandas (0.7 s) to ask
# whether it was given a pandas object.
_TYPES = {"float": "float64", "int64": "int64", "uint64": "uint64", "int32": "int32", "bool": "bool_"}


def _buffers(kind: str, data: np.ndarray, mask: np.ndarray | None = None) -> Any:
    import pyarrow as pa
    arrow_type = getattr(pa, _TYPES[kind])()
    validity = None
    if mask is not None and mask.any():
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    if kind == "bool":
        payload = pa.py_buffer(np.packbits(data, bitorder="little"))
    else:
        payload = pa.py_buffer(np.ascontiguousarray(data, dtype=_TYPES[kind].rstrip("_")))
    return pa.Array.from_buffers(arrow_type, len(data), [validity, payload],
                                 null_count=int(mask.sum()) if validity is not None else 0)


def _texts(values: list[str | None], large: bool = True) -> Any:
    """A string column (None: null); ``large``: 64-bit offsets (a column of any size)."""
    import pyarrow as pa
    mask = np.fromiter(map(is_, values, repeat(None)), dtype=bool, count=len(values))
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64 if large else np.int32)
    offsets[1:] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little")) if mask.any() else None
    kind = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(offsets),
                                                                  pa.py_buffer(b"".join(encoded))],
                                 null_count=int(mask.sum()))


def _dictionary(codes: np.ndarray, table: list[str], mask: np.ndarray | None = None) -> Any:
    """A dictionary column: each row's code into ``table`` (strings), null where ``mask``."""
    import pyarrow as pa
    return pa.DictionaryArray.from_arrays(_buffers("int32", codes, mask), _texts(table, large=False))


_JSON = msgspec.json.Encoder()


def _json(value: Any) -> str:
    return _JSON.encode(_tagged(value)).decode("utf-8")


def _tagged(value: Any) -> Any:
    """JSON has no NaN or infinity: a float that is one is written as {"float": "nan"}."""
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return {"float": repr(value)}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        return {k: _tagged(v) for k, v in value.items()}
    return value


def _untagged(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("float"), str) and value["float"] in ("nan", "inf", "-inf"):
            return float(value["float"])
        return {k: _untagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


# ---------------------------------------------------------------- reading
def check(path: Path, expected_sha256: str | None, source: Any) -> None:
    """The file at ``path`` is the rows file the result at ``source`` names: present, and of
    the digest it records. One line naming the file otherwise."""
    if not path.is_file():
        raise InputError(path, f"the rows file of {source} is not there (moved or deleted?): "
                               "its collective rows cannot be read")
    if expected_sha256 is not None and sha256(path) != expected_sha256:
        raise InputError(path, f"not the rows file of {source}: its SHA-256 differs from the one the "
                               "result records (truncated, replaced or from another run)")


def read(path: Path, count: int) -> list[dict[str, Any]]:
    """The rows written to ``path`` (``count`` of them, as its result says), exactly as written.
    Any problem with the file is one InputError line naming it."""
    table, description = _open(path, count)
    return _rows(table, description, path)


def frame(path: Path, count: int, columns: tuple[str, ...]) -> Any:
    """The rows as a pandas DataFrame of ``columns`` (analyzer.job.frames.COLLECTIVE_COLUMNS:
    the group as its name, size and description), read column by column."""
    import pandas as pd
    table, description = _open(path, count)
    by_key = {c.key: c for c in description.columns}
    data: dict[str, Any] = {}
    for name in columns:
        if name in dict(GROUP_FIELDS) and "group" in by_key:
            values = table.column(name).to_pylist()
        elif name in by_key:
            values = _values(table, by_key[name], description, path)
        else:
            values = [None] * count
        data[name] = values
    return pd.DataFrame({name: pd.Series(data[name], dtype=_dtype(data[name])) for name in columns},
                        columns=list(columns))


def _dtype(values: list[Any]) -> Any:
    """The dtype pandas infers for these values in a frame built from row dicts."""
    import pandas as pd
    return pd.Series(values).dtype if values else object


def _open(path: Path, count: int) -> tuple[Any, Description]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(path, f"reading a rows file needs pyarrow: {EXTRA}") from None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise InputError(path, f"not a readable Parquet rows file: {str(exc).splitlines()[0][:200]}") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise InputError(path, "not a tracecliff rows file (no tracecliff description in its metadata)")
    try:
        description = msgspec.json.decode(raw, type=Description)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(path, f"damaged rows file description: {exc}") from None
    _check_schema(table, description, count, path)
    return table, description


def _check_schema(table: Any, description: Description, count: int, path: Path) -> None:
    """Every column the description names is there, of the type its encoding needs, and the
    file holds the rows its result counts."""
    import pyarrow as pa
    if description.format != FORMAT:
        raise InputError(path, f"rows file format {description.format} is not one this tracecliff reads ({FORMAT})")
    if description.rows != count or table.num_rows != count:
        raise InputError(path, f"holds {table.num_rows} rows, its result counts {count}")
    expected = {"int64": pa.types.is_int64, "uint64": pa.types.is_uint64, "float": pa.types.is_float64,
                "bool": pa.types.is_boolean, "null": pa.types.is_null, "int_text": pa.types.is_large_string,
                "json": pa.types.is_large_string, "group": pa.types.is_int32,
                "str": lambda t: pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)}
    names = set(table.column_names)
    for column in description.columns:
        if column.encoding not in ENCODINGS:
            raise InputError(path, f"column {column.column!r}: unknown encoding {column.encoding!r}")
        for name in (column.column, column.present):
            if name is not None and name not in names:
                raise InputError(path, f"column {name!r} is missing")
        kind = table.schema.field(column.column).type
        if not expected[column.encoding](kind):
            raise InputError(path, f"column {column.column!r}: {kind} is not {column.encoding}")
        if column.present is not None and not pa.types.is_boolean(table.schema.field(column.present).type):
            raise InputError(path, f"column {column.present!r} is not bool")


def _values(table: Any, column: ParquetColumn, description: Description, path: Path) -> list[Any]:
    """One key's values as Python objects (None where null)."""
    data = table.column(column.column).combine_chunks()
    n = len(data)
    encoding = column.encoding
    if encoding == "null":
        return [None] * n
    nulls = data.null_count
    if encoding == "group":
        codes = data.to_numpy(zero_copy_only=False)
        if nulls or (n and (int(codes.min()) < 0 or int(codes.max()) >= len(description.groups))):
            raise InputError(path, "column 'group_code': a code out of range")
        return list(map(description.groups.__getitem__, codes.tolist()))
    if encoding == "str":
        indices = data.indices.fill_null(0).to_numpy(zero_copy_only=False).tolist()
        dictionary = data.dictionary.to_pylist()
        if indices and (min(indices) < 0 or max(indices) >= len(dictionary)) and dictionary:
            raise InputError(path, f"column {column.column!r}: a code out of range")
        values = list(map(dictionary.__getitem__, indices)) if dictionary else [None] * n
    elif encoding in ("int64", "uint64", "float", "bool"):
        values = data.fill_null(False if encoding == "bool" else 0).to_numpy(zero_copy_only=False).tolist()
    elif encoding == "int_text":
        try:
            values = [None if v is None else int(v) for v in data.to_pylist()]
        except ValueError:
            raise InputError(path, f"column {column.column!r}: not an integer") from None
    else:  # json
        try:
            values = [None if v is None else _untagged(msgspec.json.decode(v)) for v in data.to_pylist()]
        except msgspec.DecodeError:
            raise InputError(path, f"column {column.column!r}: a value that is not JSON") from None
    if nulls and encoding not in ("int_text", "json"):
        for i in np.flatnonzero(data.is_null().to_numpy(zero_copy_only=False)).tolist():
            values[i] = None
    return values


def _rows(table: Any, description: Description, path: Path) -> list[dict[str, Any]]:
    """Row dicts with their keys in sorted order (as a JSON result's rows read back)."""
    columns = sorted(description.columns, key=lambda c: c.key)
    keys = [c.key for c in columns]
    if len(set(keys)) != len(keys):
        raise InputError(path, "the description names a key twice")
    values = [_values(table, c, description, path) for c in columns]
    count = description.rows
    rows = [dict(zip(keys, row)) for row in zip(*values)] if keys else [{} for _ in range(count)]
    for c in columns:
        if c.present is not None:
            has = table.column(c.present).combine_chunks().fill_null(False).to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(~has).tolist():
                del rows[i][c.key]
    return rows

