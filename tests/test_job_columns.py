"""The reduce's column helpers give exactly what the row-by-row code gave (analyzer.job.columns,
commfit.size_buckets): the JSON output of a speed change must be byte-identical."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.job import commfit
from analyzer.job.columns import keys_per_group, round_list
from analyzer.rank.comms import share_groups
from analyzer.job.crossrank import group_key
from analyzer.job.parallelism import role_key

finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite | st.floats() | st.integers(-10**9, 10**9).map(lambda k: k / 2000), max_size=50),
       st.integers(0, 6))
def test_round_list_is_pythons_round(values, digits):
    got = round_list(np.array(values, dtype=float), digits)
    assert [repr(v) for v in got] == [repr(round(float(v), digits)) for v in values]


def test_round_list_halfway_and_edges():
    # decimal halves (2.675 is stored below the half, 0.0005 above), signed zero, huge, non-finite
    values = [2.675, 0.0005, 0.0015, -0.0005, -0.0001, 1e300, 2.0 ** 52 + 0.5, float("nan"), float("inf"),
              123456.7895, 66592.3365]
    assert [repr(v) for v in round_list(np.array(values))] == [repr(round(v, 3)) for v in values]
    rng = np.random.default_rng(7)
    halves = rng.integers(-10**9, 10**9, 20000) / 1000 + 0.0005  # near-ties everywhere
    assert round_list(halves) == [round(float(v), 3) for v in halves]


def _rows():
    g0 = {"name": "0", "description": "default_pg", "ranks": [0, 1], "size": 2}
    g0_copy = {"name": "0", "description": "default_pg", "ranks": [0, 1], "size": 2}
    g0_reordered = {"description": "default_pg", "name": "0", "ranks": [0, 1], "size": 2}
    by_ranks = {"name": None, "ranks": [0, 1], "size": 2}
    return [{"collective": "allreduce", "group": g0}, {"collective": "allreduce", "group": g0_copy},
            {"collective": "allgather", "group": g0_reordered}, {"collective": "send", "group": {}},
            {"collective": "recv", "group": {}}, {"collective": "allreduce", "group": by_ranks},
            {"collective": "broadcast", "group": by_ranks}]


def test_keys_per_group_matches_the_row_keys():
    rows = _rows()
    for key_of in (role_key, group_key):
        assert keys_per_group(rows, key_of) == [key_of(r) for r in rows]
    # a group without name or ranks keys on the collective: never memoised per group object
    assert keys_per_group(rows, role_key)[3:5] == ["unknown:send", "unknown:recv"]


def test_share_groups_shares_only_equal_groups_in_the_same_key_order():
    rows = _rows()
    before = [dict(r["group"]) for r in rows]
    share_groups(rows)
    assert rows[0]["group"] is rows[1]["group"]  # equal content, one object
    assert rows[2]["group"] is not rows[0]["group"]  # same items, other key order: JSON differs
    assert rows[5]["group"] is rows[6]["group"]
    assert [r["group"] for r in rows] == before and list(rows[2]["group"]) == list(before[2])
    odd = [{"group": {"name": ["a"], "size": 2}}, {"group": {"name": ["a"], "size": 2}}]  # unhashable name
    share_groups(odd)
    assert odd[0]["group"] is odd[1]["group"]


def test_size_buckets_match_size_bucket():
    rng = np.random.default_rng(3)
    sizes = np.concatenate([rng.uniform(0, 4, 5000), rng.uniform(0, 1e13, 5000), 2.0 ** np.arange(53),
                            2.0 ** np.arange(53) - 1, 2.0 ** np.arange(1, 53) - 0.5, [2.0 ** 60, 0.0]])
    assert commfit.size_buckets(sizes).tolist() == [commfit.size_bucket(int(s)) for s in sizes]


def test_summarize_cells_against_a_plain_grouping():
    """Cells by (group name, kind, power-of-two bucket) with counts and extremes, by hand."""
    rng = np.random.default_rng(5)
    groups = [{"name": "0", "ranks": [0, 1]}, {"name": "1", "ranks": [0, 1]}, None]
    rows = []
    for _ in range(400):
        rows.append({"collective": ["allreduce", "allgather"][int(rng.integers(2))],
                     "group": groups[int(rng.integers(3))],
                     "bytes": None if rng.random() < 0.1 else int(rng.integers(1, 1 << 30)),
                     "dur_us": float(rng.uniform(1, 100)), "wait_us": float(rng.uniform(0, 1)),
                     "busbw_gbps": None, "bound": None})
    out = commfit.summarize(rows)
    expected: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bytes"] is not None:
            name = (r["group"] or {}).get("name")
            expected.setdefault((str(name), r["collective"], r["bytes"].bit_length() - 1), []).append(r)
    assert [(c["group"] if c["group"] is None else str(c["group"]), c["collective"], c["count"]) for c in out] == \
        [(None if k[0] == "None" else k[0], k[1], len(v)) for k, v in sorted(expected.items())]
    for cell, (_, members) in zip(out, sorted(expected.items())):
        assert cell["bytes_min"] == min(r["bytes"] for r in members)
        assert cell["transfer_us_min"] == round(min(r["dur_us"] - r["wait_us"] for r in members), 3)
