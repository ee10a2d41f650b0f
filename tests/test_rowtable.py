"""analyzer.base.rowtable: a RowTable gives back exactly the dicts it was made of (the same keys,
values of the same type and bits, the very shared objects), and its operations (take, concat,
set) equal the same operations on the list of dicts."""

from __future__ import annotations

import math
import pickle
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base.rowtable import RowTable, column, concat_columns, merged_keys

SHARED = [{"name": "0", "ranks": [0, 1]}, {"name": "1", "ranks": [2, 3]}, {"name": "0", "ranks": [0, 1]}]
KEYS = ["rank", "collective", "start_us", "seq", "group", "on_gpu", "odd"]


def _exact(value):
    """A value with its type and a float's bits: equal exactly when the values are."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return ("dict", id(value))
    if isinstance(value, list):
        return ("list", id(value))
    return (type(value).__name__, value)


def _rows_exact(rows):
    return [[(key, _exact(value)) for key, value in row.items()] for row in rows]


numbers = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1, True, False, 2**63, 2**64 - 1, -2**63]))
values = st.one_of(st.none(), numbers, st.sampled_from(["allreduce", "allgather", "", "x" * 40]),
                   st.sampled_from(range(len(SHARED))).map(SHARED.__getitem__))


def _column_values(kind):
    """Values mostly of one type, as real columns are, sometimes with None or others mixed in."""
    base = {"int": st.integers(min_value=-2**64, max_value=2**64), "float": st.floats(),
            "bool": st.booleans(), "str": st.sampled_from(["a", "b", "c"]),
            "group": st.sampled_from(range(len(SHARED))).map(SHARED.__getitem__)}[kind]
    return st.one_of(base, base, base, st.none(), values)


@st.composite
def row_lists(draw):
    kinds = {key: draw(st.sampled_from(["int", "float", "bool", "str", "group"])) for key in KEYS}
    count = draw(st.integers(min_value=0, max_value=30))
    rows = []
    for _ in range(count):
        keys = [key for key in KEYS if draw(st.integers(0, 9)) > 0]  # a key sometimes absent
        if draw(st.booleans()) and len(keys) > 1:  # sometimes in another order
            keys = draw(st.permutations(keys))
        rows.append({key: draw(_column_values(kinds[key])) for key in keys})
    return rows


def _subsequence(short, long):
    it = iter(long)
    return all(key in it for key in short)


@settings(max_examples=300, deadline=None)
@given(row_lists())
def test_rows_come_back_exactly(rows):
    table = RowTable.from_dicts(rows)
    made = table.dicts()
    assert len(table) == len(rows) and len(made) == len(rows)
    assert _rows_exact([{k: r[k] for k in sorted(r)} for r in made]) == \
        _rows_exact([{k: r[k] for k in sorted(r)} for r in rows])
    for original, again in zip(rows, made):
        if _subsequence(list(original), table.keys):  # the key order too, where the table can keep it
            assert list(again) == list(original)
    assert _rows_exact(list(table)) == _rows_exact(made)
    for i in range(len(rows)):
        assert _rows_exact([table[i]]) == _rows_exact([made[i]])
    assert _rows_exact(table[1:5]) == _rows_exact(made[1:5])
    for key in table.keys:
        assert [_exact(v) for v in table.values(key)] == [_exact(r.get(key)) for r in rows]
    again = pickle.loads(pickle.dumps(table))
    assert [[(k, type(v), v if not isinstance(v, float) or not math.isnan(v) else "nan") for k, v in r.items()]
            for r in again] == [[(k, type(v), v if not isinstance(v, float) or not math.isnan(v) else "nan")
                                 for k, v in r.items()] for r in made]


@settings(max_examples=200, deadline=None)
@given(row_lists(), row_lists(), st.data())
def test_take_and_concat_are_the_list_operations(first, second, data):
    a, b = RowTable.from_dicts(first), RowTable.from_dicts(second)
    both = RowTable.concat([a, b])
    assert _rows_exact([{k: r[k] for k in sorted(r)} for r in both]) == \
        _rows_exact([{k: r[k] for k in sorted(r)} for r in first + second])
    if first:
        index = data.draw(st.lists(st.integers(0, len(first) - 1), max_size=40))
        taken = a.take(np.array(index, dtype=np.int64))
        assert _rows_exact(taken.dicts()) == _rows_exact([a.dicts()[i] for i in index])


@settings(max_examples=200, deadline=None)
@given(row_lists(), st.data())
def test_set_is_setitem_on_every_row(rows, data):
    table = RowTable.from_dicts(rows)
    expected = table.dicts()
    key = data.draw(st.sampled_from(KEYS + ["wait_us", "bound"]))
    new = data.draw(st.lists(values, min_size=len(rows), max_size=len(rows)))
    some = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    if data.draw(st.booleans()):
        table.set(key, column(new))
        for row, value in zip(expected, new):
            row[key] = value
    else:
        table.set(key, column(new), np.array(some, dtype=bool))
        for row, value, on in zip(expected, new, some):
            if on:
                row[key] = value
    got = table.dicts()
    assert _rows_exact([{k: r[k] for k in sorted(r)} for r in got]) == \
        _rows_exact([{k: r[k] for k in sorted(r)} for r in expected])


@given(st.lists(values, max_size=30), st.lists(values, max_size=30))
def test_columns_concatenate_to_the_values(first, second):
    got = concat_columns([column(first), column(second)]).values()
    assert [_exact(v) for v in got] == [_exact(v) for v in first + second]


def test_forms_of_columns():
    assert column([1.5, -0.0]).data.dtype == np.float64
    assert column([1, None, 3]).data.dtype == np.int64 and column([1, None, 3]).values() == [1, None, 3]
    assert column([2**64 - 1, 0]).data.dtype == np.uint64
    assert type(column([2**64, 0])).__name__ == "Objects"
    assert type(column([1, 1.0])).__name__ == "Objects"
    group = {"name": "0"}
    coded = column([group, group, None])
    assert coded.values()[0] is group and coded.values()[1] is group and len(coded.table) == 2


def test_merged_keys_keep_each_order():
    assert merged_keys([["a", "b", "d"], ["a", "b", "c", "d"]]) == ["a", "b", "c", "d"]
    assert merged_keys([["a", "c"], ["b", "c"]]) == ["b", "a", "c"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["int", "float", "bool", "str"]).flatmap(lambda kind: st.lists(_column_values(kind), max_size=40)),
       st.lists(st.booleans(), max_size=40))
def test_rows_file_columns_from_the_table_equal_those_from_the_values(column_values, lacking):
    """The rows file's encoding of a key read from its table column (analyzer.job.rows_file:
    ``_from_column``) is the one of the values themselves (``_encoded``: its docstring's exact
    forms), a row lacking the key read as None."""
    import pytest

    from analyzer.job import rows_file
    if not rows_file.available():
        pytest.skip("needs pyarrow (tracecliff[parquet])")
    rows = [{} if k < len(lacking) and lacking[k] else {"key": value} for k, value in enumerate(column_values)]
    rows = [dict(row, other=1) for row in rows]
    table = RowTable.from_dicts(rows)
    taken = rows_file._from_column(table, "key")
    if taken is None:
        return  # read from the values: nothing to compare
    encoding, array, nulls, _ = taken
    values = [row.get("key") for row in rows]
    want_encoding, want = rows_file._encoded(values)
    assert (encoding, nulls) == (want_encoding, values.count(None))
    assert array.type == want.type and array.null_count == want.null_count
    assert repr(array.to_pylist()) == repr(want.to_pylist())
    if encoding == "str":  # the dictionary's order too (the file's bytes)
        assert array.dictionary.to_pylist() == want.dictionary.to_pylist()
        assert array.indices.to_pylist() == want.indices.to_pylist()


def test_rows_file_keys_in_the_order_a_pass_over_the_dicts_finds_them():
    from analyzer.job.rows_file import _key_order
    rows = [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1, "c": 3, "b": 2, "d": 4}, {"a": 1, "b": 2, "e": 5}]
    table = RowTable.from_dicts(rows)
    found: list = list(rows[0])
    for row in rows:
        found += [key for key in row if key not in found]
    assert _key_order(table) == found
