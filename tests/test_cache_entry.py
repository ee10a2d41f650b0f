"""The cache entry codec (analyzer.run.entry): any plain summary comes back equal, with the same
types (ints stay ints, floats floats, NaN NaN) and key order; coded columns share their objects."""

import math

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

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
        rows[-1] = {"kind": rows[-1]["kind"]}  # another shape: the rows are kept as a list
    fields = {"rank": 3, "metrics": {"span_us": 1.0}, "collectives": rows}  # decoded last
    back = entry.decode(entry.encode(fields, VERSION), VERSION)
    assert _same(back, fields)


def test_coded_columns_share_their_values():
    group = {"name": "0", "ranks": [0, 1]}
    rows = [{"kind": "allreduce", "group": dict(group), "dur_us": float(i)} for i in range(5)]
    back = entry.decode(entry.encode({"collectives": rows}, VERSION), VERSION)["collectives"]
    assert back == rows
    assert len({id(row["group"]) for row in back}) == 1 and len({id(row["kind"]) for row in back}) == 1
    stored = msgspec.msgpack.decode(entry.encode({"collectives": rows}, VERSION))["rows"]
    assert stored["tables"] == [["allreduce"], [group], None]


def test_other_format_or_unencodable_values():
    raw = entry.encode({"collectives": []}, VERSION)
    assert entry.decode(raw, VERSION) == {"collectives": []}
    assert entry.decode(raw, VERSION + 1) is None
    assert entry.encode({"comms_id": 2**70}, VERSION) is None  # beyond MessagePack: not cached


def test_numpy_scalars_and_tuples_come_back_plain():
    """The summary is encoded as the map left it (no plain-data copy first): numpy scalars come
    back as the Python numbers they hold, tuples as lists, as the copy used to make them."""
    import numpy as np

    rows = [{"bytes": np.int64(4096), "dur_us": np.float64(1.5), "on_gpu": np.bool_(True), "ranks": (0, 1),
             "lat": np.float32(0.25)}]
    fields = {"rank": np.int32(3), "steps": [{"step": np.int64(7), "window_ns": (1, 2)}], "collectives": rows}
    back = entry.decode(entry.encode(fields, VERSION), VERSION)
    assert _same(back, {"rank": 3, "steps": [{"step": 7, "window_ns": [1, 2]}],
                        "collectives": [{"bytes": 4096, "dur_us": 1.5, "on_gpu": True, "ranks": [0, 1], "lat": 0.25}]})
    assert entry.encode({"collectives": [{"x": np.zeros(3)}]}, VERSION) is None  # not a scalar: not cached


def test_equal_but_distinct_objects_share_one_code():
    """Codes are by encoding: rows holding equal strings or groups as separate objects get one
    table entry; 1 and 1.0-like lookalikes in a dict stay apart."""
    rows = [{"kind": "".join(["all", "reduce"]), "group": {"size": 2}} for _ in range(3)]
    rows.append({"kind": "allreduce", "group": {"size": 2.0}})
    stored = msgspec.msgpack.decode(entry.encode({"collectives": rows}, VERSION))["rows"]
    assert stored["tables"][0] == ["allreduce"] and stored["columns"][0] == [0, 0, 0, 0]
    assert stored["columns"][1] == [0, 0, 0, 1]


packed_scalars = st.one_of(scalars, st.tuples(st.integers(0, 7)), st.just(float("-0.0")),
                           st.floats(allow_nan=False).map(lambda x: __import__("numpy").float64(x)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scalars, packed_scalars, groups), min_size=1, max_size=30),
       st.sampled_from([None, 0.5, 7, True, 2**64 - 1]))
def test_packed_rows_come_back_as_they_were(values, uniform):
    """Rows a worker sends by column (entry.pack, for the parent to hold arrays instead of dicts)
    come back with the very values: the same types (bool, int, float, numpy scalars, tuples),
    the same bits (-0.0, NaN), ints beyond 64 bits, mixed columns."""
    rows = [{"bytes": a, "odd": b, "group": g} for a, b, g in values]
    if uniform is not None:  # a column of one number type: packed as an array
        for row in rows:
            row["bytes"] = uniform
    packed = entry.pack(entry.to_columns(rows))
    back = entry.from_columns(packed)
    assert len(back) == len(rows)
    for got, want in zip(back, rows):
        assert list(got) == list(want)
        for key in want:
            assert type(got[key]) is type(want[key]) and repr(got[key]) == repr(want[key])


def test_number_columns_are_packed_as_arrays():
    import numpy as np

    rows = [{"start_us": float(i), "rank": i, "on_gpu": True, "launch_us": None if i else 1.0,
             "comms_id": 2**64 - i, "kind": "allreduce"} for i in range(4)]
    packed = entry.pack(entry.to_columns(rows))
    # None among floats and an int beyond 64 bits stay lists; a string column's codes are an array
    assert [type(c).__name__ for c in packed.columns] == ["ndarray", "ndarray", "ndarray", "list", "list", "ndarray"]
    assert packed.columns[0].dtype == np.float64 and packed.columns[1].dtype == np.int64
    assert packed.tables[5] == ["allreduce"]
    assert entry.from_columns(packed) == rows
