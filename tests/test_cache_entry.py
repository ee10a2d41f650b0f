"""The cache entry codec (analyzer.run.entry): any plain summary comes back equal, with the same
types (ints stay ints, floats floats, NaN NaN) and key order; coded columns share their objects."""

import math
import pickle

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base.rowtable import RowTable
from analyzer.run import entry

VERSION = 7
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.sampled_from(["allreduce", "bf16", "backward", ""]), st.text(max_size=4))
groups = st.one_of(st.none(), st.fixed_dictionaries({"name": st.sampled_from(["0", "1"]),
                                                     "ranks": st.lists(st.integers(0, 7), max_size=3)}))


def _same(a, b):
    """Equal, with the same types and dict key order all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scalars, scalars, groups), max_size=30), st.booleans())
def test_rows_round_trip(values, ragged):
    rows = [{"bytes": a, "kind": b, "group": g} for a, b, g in values]
    if ragged and rows:
        rows[-1] = {"kind": rows[-1]["kind"]}  # another shape: the keys it lacks stay absent
    fields = {"rank": 3, "metrics": {"span_us": 1.0}, "collectives": rows}  # decoded last
    back = entry.decode(entry.encode(fields, VERSION), VERSION)
    table = back.pop("collectives")
    assert isinstance(table, RowTable)  # the rows by column, as the map keeps them
    assert _same(list(table), rows) and _same(back, {"rank": 3, "metrics": {"span_us": 1.0}})


def test_coded_columns_share_their_values():
    """A string column is stored as its distinct strings and a code per row; a group column as
    its distinct group objects (the map's rows share their rank's: analyzer.rank.comms), which
    the decoded rows share again."""
    group = {"name": "0", "ranks": [0, 1]}
    rows = [{"kind": "allreduce", "group": group, "dur_us": float(i)} for i in range(5)]
    back = list(entry.decode(entry.encode({"collectives": rows}, VERSION), VERSION)["collectives"])
    assert back == rows
    assert len({id(row["group"]) for row in back}) == 1 and len({id(row["kind"]) for row in back}) == 1
    stored = msgspec.msgpack.decode(entry.encode({"collectives": rows}, VERSION))["rows"]
    forms = {key: column[0] for key, column in zip(stored["keys"], stored["columns"])}
    assert forms == {"kind": "coded", "group": "coded", "dur_us": "numbers"}
    tables = {key: column[4] for key, column in zip(stored["keys"], stored["columns"])}
    assert tables["kind"] == ["allreduce"] and tables["group"] == [group]


def test_other_format_or_unencodable_values():
    raw = entry.encode({"collectives": []}, VERSION)
    assert list(entry.decode(raw, VERSION)["collectives"]) == []
    assert entry.decode(raw, VERSION + 1) is None
    assert entry.encode({"comms_id": 2**70}, VERSION) is None  # beyond MessagePack: not cached
    assert entry.encode({"collectives": [{"comms_id": 2**70}]}, VERSION) is None


def test_numpy_scalars_and_tuples_come_back_plain():
    """The summary is encoded as the map left it (no plain-data copy first): numpy scalars come
    back as the Python numbers they hold, tuples as lists, as the copy used to make them."""
    import numpy as np

    rows = [{"bytes": np.int64(4096), "dur_us": np.float64(1.5), "on_gpu": np.bool_(True), "ranks": (0, 1),
             "lat": np.float32(0.25)}]
    fields = {"rank": np.int32(3), "steps": [{"step": np.int64(7), "window_ns": (1, 2)}], "collectives": rows}
    back = entry.decode(entry.encode(fields, VERSION), VERSION)
    back["collectives"] = list(back["collectives"])
    assert _same(back, {"rank": 3, "steps": [{"step": 7, "window_ns": [1, 2]}],
                        "collectives": [{"bytes": 4096, "dur_us": 1.5, "on_gpu": True, "ranks": [0, 1], "lat": 0.25}]})
    assert entry.encode({"collectives": [{"x": np.zeros(3)}]}, VERSION) is None  # not a scalar: not cached


def test_equal_strings_share_one_code_and_lookalikes_stay_apart():
    """Strings are coded by value (equal strings held as separate objects get one table entry);
    group dicts by object, so 2 and 2.0 in lookalike groups stay apart, types and all."""
    rows = [{"kind": "".join(["all", "reduce"]), "group": {"size": 2}} for _ in range(3)]
    rows.append({"kind": "allreduce", "group": {"size": 2.0}})
    stored = msgspec.msgpack.decode(entry.encode({"collectives": rows}, VERSION))["rows"]
    kind = stored["columns"][stored["keys"].index("kind")]
    assert kind[4] == ["allreduce"] and set(kind[2]) == {0}  # one code, one byte a row
    back = list(entry.decode(entry.encode({"collectives": rows}, VERSION), VERSION)["collectives"])
    assert _same(back, rows)


packed_scalars = st.one_of(scalars, st.tuples(st.integers(0, 7)), st.just(float("-0.0")),
                           st.floats(allow_nan=False).map(lambda x: __import__("numpy").float64(x)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scalars, packed_scalars, groups), min_size=1, max_size=30),
       st.sampled_from([None, 0.5, 7, True, 2**64 - 1]))
def test_pickled_tables_come_back_as_they_were(values, uniform):
    """Rows a worker sends the parent as their table (pickled: analyzer.run.cache.analyze_and_pack)
    come back with the very values: the same types (bool, int, float, numpy scalars, tuples),
    the same bits (-0.0, NaN), ints beyond 64 bits, mixed columns."""
    rows = [{"bytes": a, "odd": b, "group": g} for a, b, g in values]
    if uniform is not None:  # a column of one number type: held as an array
        for row in rows:
            row["bytes"] = uniform
    back = list(pickle.loads(pickle.dumps(RowTable.from_dicts(rows))))
    assert len(back) == len(rows)
    for got, want in zip(back, rows):
        assert list(got) == list(want)
        for key in want:
            assert type(got[key]) is type(want[key]) and repr(got[key]) == repr(want[key])


def test_number_columns_are_arrays():
    import numpy as np

    rows = [{"start_us": float(i), "rank": i, "on_gpu": True, "launch_us": None if i else 1.0,
             "comms_id": 2**64 - i, "kind": "allreduce"} for i in range(4)]
    table = RowTable.from_dicts(rows)
    # None among floats is a mask beside the array; an int beyond 64 bits keeps the values
    assert [type(c).__name__ for c in table.columns.values()] == ["Numbers", "Numbers", "Numbers", "Numbers",
                                                                  "Objects", "Coded"]
    assert table.columns["start_us"].data.dtype == np.float64 and table.columns["rank"].data.dtype == np.int64
    assert table.columns["kind"].table == ["allreduce"]
    back = entry.decode(entry.encode({"collectives": rows}, VERSION), VERSION)
    assert back is None  # 2**64 is beyond MessagePack: not cached
    rows = [dict(row, comms_id=2**64 - 1 - row["rank"]) for row in rows]
    assert list(entry.decode(entry.encode({"collectives": rows}, VERSION), VERSION)["collectives"]) == rows
