"""The reduce's column helpers give exactly what the row-by-row code gave (analyzer.job.columns,
commfit.size_buckets): the JSON output of a speed change must be byte-identical."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.job import commfit
from analyzer.job.columns import CollectiveColumns, distinct_rows, round_list, tuple_numbers
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


def _keys(rows, key_of):
    codes, keys = CollectiveColumns(rows).group_keys(key_of)
    return [keys[k] for k in codes.tolist()]


def test_group_keys_match_the_row_keys():
    rows = _rows()
    for key_of in (role_key, group_key):
        assert _keys(rows, key_of) == [key_of(r) for r in rows]
    # a group without name or ranks keys on the collective: memoised per (group, kind), not per group
    assert _keys(rows, role_key)[3:5] == ["unknown:send", "unknown:recv"]
    codes, keys = CollectiveColumns(rows).group_keys(group_key)
    assert keys == list(dict.fromkeys(group_key(r) for r in rows))  # numbered by first appearance


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


@pytest.mark.parametrize("huge", [False, True])
def test_summarize_cells_against_a_plain_grouping(huge):
    """Cells by (group name, kind, power-of-two bucket) with counts and extremes, by hand (sizes
    beyond 2**53, not exact as floats, too)."""
    rng = np.random.default_rng(5)
    groups = [{"name": "0", "ranks": [0, 1]}, {"name": "1", "ranks": [0, 1]}, None]
    rows = []
    for _ in range(400):
        size = int(rng.integers(1, 1 << 30)) * (2**40 + 1 if huge else 1)
        rows.append({"collective": ["allreduce", "allgather"][int(rng.integers(2))],
                     "group": groups[int(rng.integers(3))],
                     "bytes": None if rng.random() < 0.1 else [size, float(size)][int(rng.integers(2))],
                     "dur_us": float(rng.uniform(1, 100)), "wait_us": float(rng.uniform(0, 1)),
                     "busbw_gbps": None, "bound": None})
    out = commfit.summarize(rows)
    expected: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bytes"] is not None:
            name = (r["group"] or {}).get("name")
            expected.setdefault((str(name), r["collective"], int(r["bytes"]).bit_length() - 1), []).append(r)
    assert [(c["group"] if c["group"] is None else str(c["group"]), c["collective"], c["count"]) for c in out] == \
        [(None if k[0] == "None" else k[0], k[1], len(v)) for k, v in sorted(expected.items())]
    for cell, (_, members) in zip(out, sorted(expected.items())):
        for got, plain in ((cell["bytes_min"], min(r["bytes"] for r in members)),
                           (cell["bytes_max"], max(r["bytes"] for r in members))):
            assert repr(got) == repr(plain)  # the first extreme, int or float as written
        assert cell["transfer_us_min"] == round(min(r["dur_us"] - r["wait_us"] for r in members), 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()), min_size=1, max_size=60))
def test_distinct_rows_numbers_tuples_by_first_appearance(tuples):
    _check_distinct_rows(tuples)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda width: st.lists(
    st.tuples(*[st.integers(-2**63, 2**63 - 1) | st.integers(0, 3)] * width), min_size=1, max_size=40)))
def test_distinct_rows_of_wide_values_stay_exact(tuples):
    _check_distinct_rows(tuples)  # spans and products beyond int64: made dense on the way


def _check_distinct_rows(tuples):
    first, counts, number = distinct_rows([np.array(c, dtype=np.int64) for c in zip(*tuples)])
    seen = list(dict.fromkeys(tuples))
    assert [tuples[i] for i in first.tolist()] == seen
    assert counts.tolist() == [tuples.count(t) for t in seen]
    assert number.tolist() == [seen.index(t) for t in tuples]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda width: st.lists(
    st.tuples(*[st.integers(-2**63, 2**63 - 1) | st.integers(-2, 3)] * width), min_size=1, max_size=40)))
def test_tuple_numbers_order_rows_as_their_tuples(tuples):
    numbers = tuple_numbers([np.array(c, dtype=np.int64) for c in zip(*tuples)]).tolist()
    assert np.argsort(numbers, kind="stable").tolist() == sorted(range(len(tuples)), key=tuples.__getitem__)
    assert all((numbers[i] == numbers[j]) == (tuples[i] == tuples[j])
               for i in range(len(tuples)) for j in range(len(tuples)))


def _random_rows(seed: int, count: int = 300) -> list[dict]:
    """Collective rows of a few ranks, groups (shared objects, one without name or ranks), kinds,
    phases, libraries and steps (None among them), with missing launch times and sizes."""
    rng = np.random.default_rng(seed)
    groups = [{"name": "0", "ranks": [0, 1, 2], "size": 3}, {"name": "7", "ranks": [0, 2], "size": 2},
              {"name": None, "ranks": [1, 2], "size": 2}, {}]
    pick = lambda values: values[int(rng.integers(len(values)))]  # noqa: E731
    rows = []
    for _ in range(count):
        start = round(float(rng.uniform(0, 1e4)), 3)
        rows.append({"rank": int(rng.integers(3)), "step": pick([0, 1, 2, None]), "collective":
                     pick(["allreduce", "allreduce", "allgather", "send"]), "phase": pick(["backward", "forward", None]),
                     "library": pick(["nccl", "nccl", "deepep", None]), "group": pick(groups),
                     "start_us": start, "launch_us": None if rng.random() < 0.2 else pick([start, start - 1.5]),
                     "dur_us": round(float(rng.uniform(1, 50)), 3), "exposed_us": 0.5,
                     "bytes": None if rng.random() < 0.1 else int(rng.integers(1, 1 << 20)), "dtype": "bf16",
                     "on_gpu": bool(rng.random() < 0.9), "module": None,
                     "comms_id": pick([None, 7, 2**64 - 1, "a"]), "seq": pick([None, 3, 4])})
    return rows


def _gradient_buckets_by_row(collectives, backward_start_us):
    """The per-row code the reduce's gradient_buckets replaced (analyzer.rank.comms, before the
    columns): the reference it must equal."""
    by_step = {}
    for row in collectives:
        if row["collective"] == "allreduce" and row["phase"] == "backward":
            by_step.setdefault((row["rank"], row["step"]), []).append(row)
    buckets = []
    step_key = lambda step: (0, step) if isinstance(step, int) else (1, 0)  # noqa: E731
    for (rank, step), rows in sorted(by_step.items(), key=lambda kv: (kv[0][0], step_key(kv[0][1]))):
        rows.sort(key=lambda r: (r["launch_us"] if r["launch_us"] is not None else r["start_us"], r["start_us"]))
        origin = backward_start_us.get((rank, step))
        for index, row in enumerate(rows):
            offset = None
            if origin is not None and row["launch_us"] is not None:
                offset = round(row["launch_us"] - origin, 3)
            buckets.append({"rank": rank, "step": step, "index": index, "bytes": row["bytes"],
                            "launch_offset_us": offset, "dtype": row["dtype"], "launch_us": row["launch_us"],
                            "start_us": row["start_us"], "dur_us": row["dur_us"],
                            "exposed_us": row["exposed_us"], "group": row["group"]["name"]})
    return buckets


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_gradient_buckets_equal_the_per_row_code(seed):
    from analyzer.job.parallelism import data_parallel_mask, is_data_parallel_row
    from analyzer.job.reduce import gradient_buckets
    rows = [r for r in _random_rows(seed) if r["group"]]  # a bucket names its group
    roles = {"0": "dp", "7": "tp", "ranks:1,2": "dp_shard"}
    view = CollectiveColumns(rows)
    keep = data_parallel_mask(view, roles)
    assert keep.tolist() == [is_data_parallel_row(r, roles) for r in rows]
    origins = {(rank, step): 100.25 * rank for rank in range(3) for step in (0, 2, None)}
    chosen = [r for r, k in zip(rows, keep.tolist()) if k]
    buckets = gradient_buckets(view, keep, origins)
    assert [msgspec.to_builtins(b) for b in buckets] == _gradient_buckets_by_row(chosen, origins)
    if buckets:  # read like the dicts they encode as
        first = _gradient_buckets_by_row(chosen, origins)[0]
        assert all(buckets[0][key] == first[key] and key in buckets[0] for key in first)
        assert buckets[0].get("nothing", 7) == 7 and "nothing" not in buckets[0]
        with pytest.raises(KeyError):
            buckets[0]["nothing"]
        assert msgspec.json.encode(list(buckets), order="sorted") == msgspec.json.encode(
            _gradient_buckets_by_row(chosen, origins), order="sorted")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_straggler_lateness_equals_the_per_row_code(seed):
    from types import SimpleNamespace

    from analyzer.rules.straggler_rank import _lateness
    rng = np.random.default_rng(seed)
    rows = _random_rows(seed)
    for row in rows:
        row["arrival_lag_us"] = None if rng.random() < 0.2 else round(float(rng.uniform(-20, 20)), 3)
    expected: dict = {}  # the per-row code _lateness replaced
    for row in rows:
        lag = row["arrival_lag_us"]
        if lag is None or not row["on_gpu"] or row["collective"] == "send":
            continue
        by_rank = expected.setdefault(row["step"], {})
        by_rank[row["rank"]] = max(by_rank.get(row["rank"], 0.0), float(lag))
    got = _lateness(SimpleNamespace(collectives=rows))
    assert got == expected and [list(v) for v in got.values()] == [list(v) for v in expected.values()]
    assert list(got) == list(expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), finite.filter(lambda v: abs(v) < 1e300)), max_size=40))
def test_sequential_sums_are_pythons_sum(pairs):
    from analyzer.job.columns import sequential_sums
    segment = np.array([s for s, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=float)
    got = sequential_sums(values, segment, 6)
    expected = [sum(v for s, v in pairs if s == k) for k in range(6)]
    assert [repr(v) for v in got] == [repr(v) for v in expected]  # types too: an empty sum is int 0


def test_facts_transfer_times_and_step_index_equal_the_per_row_code():
    """On a job of some of its ranks (the α-β cap applies) and of all of them."""
    from pathlib import Path

    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.job.facts import JobFacts
    folder = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic" / "ddp_straggler"
    files = sorted(str(p) for p in folder.glob("rank-*.json*"))
    for given_files in (files[:3], files):
        result = diagnose(given_files, DiagnoseOptions(workers=1))
        facts, rows = JobFacts(result), result.collectives
        assert facts.transfer_times.tolist() == [facts.transfer_time(r) for r in rows]
        index: dict = {}
        for row in rows:
            index.setdefault((row["rank"], row["step"]), []).append(row)
        assert list(facts._collectives_index) == list(index)
        assert all(facts.collectives_of(*key) == value for key, value in index.items())
        for key, value in index.items():
            expected = sum(facts.transfer_time(c) for c in value
                           if c["collective"] == "allreduce" and c["phase"] == "backward")
            assert repr(facts.backward_allreduce_transfer_us.get(key, 0)) == repr(expected)


def test_bucket_fields_read_buckets_and_dicts_alike():
    from analyzer.job.facts import JobFacts
    from analyzer.job.result import Bucket
    as_dicts = [{"bytes": 8, "start_us": 1.5, "launch_us": None}, {"bytes": None, "start_us": 2.5, "launch_us": 1.0}]
    as_buckets = [Bucket(d["bytes"], "bf16", 1.0, 0.0, "0", k, None, d["launch_us"], 0, d["start_us"], 3)
                  for k, d in enumerate(as_dicts)]
    for keys in (("bytes", "start_us", "launch_us"), ("bytes",)):
        expected = [tuple(d[key] for d in as_dicts) for key in keys]
        assert JobFacts.bucket_fields(as_dicts, keys) == expected == JobFacts.bucket_fields(as_buckets, keys)
    assert JobFacts.bucket_fields([], ("bytes", "dtype")) == [(), ()]


def _share_groups_by_row(rows):
    """The per-row code share_groups replaced: the reference it must equal."""
    by_id, by_name = {}, {}
    for row in rows:
        group = row.get("group")
        if not group:
            continue
        shared = by_id.get(id(group))
        if shared is None:
            candidates = by_name.setdefault((str(group.get("name")), str(group.get("size"))), [])
            shared = next((c for c in candidates if c == group and list(c) == list(group)), None)
            if shared is None:
                candidates.append(group)
                shared = group
            by_id[id(group)] = shared
        row["group"] = shared


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=40))
def test_share_groups_equals_the_per_row_code(picks):
    def rows():  # copies and shared objects of equal groups, one in another key order, empty ones
        base = [{"name": "0", "size": 2, "ranks": [0, 1]}, {"name": "1", "size": 2, "ranks": [0, 1]}]
        made = [dict(base[0]), base[0], dict(base[1]), {"size": 2, "name": "0", "ranks": [0, 1]}, {},
                None, base[1], dict(base[0])]
        return [{"group": made[k]} for k in picks]
    ours, reference = rows(), rows()
    share_groups(ours)
    _share_groups_by_row(reference)
    ids_ours = [id(r["group"]) for r in ours]
    ids_reference = [id(r["group"]) for r in reference]
    # the same partition of rows into shared objects, with the same contents
    assert [ids_ours.index(i) for i in ids_ours] == [ids_reference.index(i) for i in ids_reference]
    assert [r["group"] for r in ours] == [r["group"] for r in reference]
    assert [list(r["group"] or ()) for r in ours] == [list(r["group"] or ()) for r in reference]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 1, None, "x"]), st.integers(0, 5)), max_size=40),
       st.booleans())
def test_buckets_by_step_equals_the_per_bucket_grouping(keys, typed):
    """Runs of a step's buckets or scattered ones: {(rank, step): its buckets by index}, the
    steps in order of first appearance."""
    from types import SimpleNamespace
    from analyzer.job.facts import JobFacts
    from analyzer.job.result import Bucket
    buckets = [Bucket(8, "bf16", 1.0, 0.0, "0", index, None, 0.5, rank, 1.5, step) for rank, step, index in keys]
    if not typed:
        buckets = [msgspec.to_builtins(b) for b in buckets]
    expected = {}
    for b in buckets:
        expected.setdefault((b["rank"], b["step"]), []).append(b)
    for rows in expected.values():
        rows.sort(key=lambda b: b["index"])
    facts = JobFacts.__new__(JobFacts)
    facts.result = SimpleNamespace(buckets=buckets)
    got = facts.buckets_by_step()
    assert list(got) == list(expected)
    assert all(a is b for key in got for a, b in zip(got[key], expected[key], strict=True))


def test_flag_and_raw_columns_read_as_the_row_code_did():
    values = [None, True, False, 0, 1, "", "x", [], [0]]
    rows = [{"on_gpu": v, "module": v, "comms_id": v, "seq": v} for v in values] + [{}]
    view = CollectiveColumns(rows)
    assert view.on_gpu.tolist() == [bool(r.get("on_gpu")) for r in rows]
    assert view.module_known.tolist() == [r.get("module") is not None for r in rows]
    assert all(a is b for a, b in zip(view.comms_id, [r.get("comms_id") for r in rows], strict=True))
    assert all(a is b for a, b in zip(view.seq, [r.get("seq") for r in rows], strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.floats() | st.integers(-2**70, 2**70), max_size=12), st.booleans())
def test_nullable_columns_read_none_as_nan(values, keyless):
    """``written`` (and the launch and size columns): NaN where a row's value is None or absent."""
    rows = [{} if keyless and v is None else {"wait_estimated_us": v} for v in values]
    got = CollectiveColumns(rows).written("wait_estimated_us")
    plain = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    assert got.dtype == plain.dtype and got.tobytes() == plain.tobytes()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.none() | st.sampled_from([0, 0.0, 1, 2, 2.5, 7.25, -1.0, 2**60, 2**60 + 1]),
                          st.integers(0, 2), st.sampled_from([1.0, 2.0]), st.booleans()), max_size=25))
def test_text_top_collectives_equal_the_plain_selection(rows):
    """The text view's most exposed GPU collectives (analyzer.job.digest.top_exposed), chosen from
    the exposed column, against the plain filter and sort over every row: the same count, the same
    top rows in the same order (ties in row order; ints beyond a float's precision by their value)."""
    import heapq

    from analyzer.job.digest import TOP_ROWS, top_exposed
    collectives = [{"exposed_us": e, "rank": r, "start_us": s, "on_gpu": g} for e, r, s, g in rows]
    plain = [c for c in collectives if c.get("exposed_us") and c["on_gpu"]]
    got = top_exposed(CollectiveColumns(collectives), collectives)
    assert got["shown"] == len(plain) and got["gpu"] == sum(c["on_gpu"] for c in collectives)
    expected = heapq.nsmallest(TOP_ROWS, plain, key=lambda c: (-c["exposed_us"], c["rank"], c["start_us"]))
    assert [id(c) for c in got["rows"]] == [id(c) for c in expected]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(["allreduce", "reduce_scatter", "allgather"]),
       st.sampled_from(["backward", "forward"]))
def test_data_parallel_of_equals_the_row_filter(seed, kind, phase):
    from types import SimpleNamespace

    from analyzer.job.facts import JobFacts
    rows = _random_rows(seed)
    result = SimpleNamespace(collectives=rows,
                             job={"group_roles": {"0": "dp", "7": "tp", "ranks:1,2": "dp_shard"}})
    facts = JobFacts(result)
    expected = [c for c in facts.data_parallel_collectives if c["collective"] == kind and c["phase"] == phase]
    assert list(facts.data_parallel_of(kind, phase)) == expected  # the rows' dicts, made from the table


def test_summarize_reads_the_fits_bounds_as_the_rows_give_them():
    """The collective summary from the job analysis's columns (sizes, the fits' bound codes)
    equals the one read from the rows alone, on sample jobs."""
    from pathlib import Path

    from analyzer.api import DiagnoseOptions, diagnose
    root = Path(__file__).resolve().parents[1] / "sample_traces"
    for job in (root / "synthetic" / "ddp_straggler", root / "cpu_gloo" / "fsdp2_tp"):
        result = diagnose([str(job)], DiagnoseOptions(workers=1))
        view = CollectiveColumns.of(result)
        assert "bound" in view.extra
        assert commfit.summarize(result.collectives, view) == result.collective_summary
        assert commfit.summarize(result.collectives) == result.collective_summary


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_bucket_table_by_step_groups_as_buckets_by_step(seed):
    """The buckets kept by column (analyzer.job.buckets.BucketTable) group by (rank, step) as
    ``JobFacts.buckets_by_step`` groups the Buckets themselves: the same keys in the same order,
    each step's buckets by index."""
    from types import SimpleNamespace

    from analyzer.job.buckets import BucketTable
    from analyzer.job.facts import JobFacts
    from analyzer.job.parallelism import data_parallel_mask
    from analyzer.job.reduce import gradient_buckets
    rows = [r for r in _random_rows(seed) if r["group"]]
    view = CollectiveColumns(rows)
    keep = data_parallel_mask(view, {"0": "dp", "7": "tp", "ranks:1,2": "dp_shard"})
    table = gradient_buckets(view, keep, {(0, 0): 5.0, (1, 2): 7.5})
    if not isinstance(table, BucketTable):
        return
    made = table.tolist()
    assert made == list(table) and table == made and len(table) == len(made)
    assert [table[i] for i in range(len(table))] == made and table[1:4] == made[1:4]
    expected = JobFacts(SimpleNamespace(buckets=made, collectives=rows,
                                        job={})).buckets_by_step()
    got = table.by_step()
    assert list(got) == list(expected)
    assert all([made[i] for i in got[key].tolist()] == expected[key] for key in expected)
