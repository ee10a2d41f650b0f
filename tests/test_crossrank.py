"""Cross-rank matching: waits, transfer time, arrival skew and the straggler."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.job.crossrank import analyze, match


def row(rank, start, dur, step=1, kind="allreduce", group="0", **extra):
    return {"rank": rank, "start_us": start, "dur_us": dur, "step": step, "collective": kind,
            "group": {"name": group, "ranks": [0, 1, 2], "size": 3, "description": "default_pg"},
            "seq": None, "comms_id": None, **extra}


def three_ranks():
    """Two all-reduces per step, transfer 100 µs. Step 1: rank 2 arrives 300 µs after rank 0
    and 200 µs after rank 1 at both; step 2: rank 0 arrives 50 µs late once."""
    rows = []
    for base in (1000.0, 5000.0):
        end = base + 300 + 100
        rows += [row(0, base, end - base), row(1, base + 100, end - base - 100),
                 row(2, base + 300, 100.0)]
    end = 9000.0 + 50 + 100
    rows += [row(0, 9050.0, 100.0, step=2), row(1, 9000.0, 150.0, step=2),
             row(2, 9000.0, 150.0, step=2)]
    return rows


def test_waits_transfer_and_straggler_by_hand():
    rows = three_ranks()
    summary = analyze(rows, world_size=3)
    assert summary["method"] == "order" and summary["matched_collectives"] == 3
    assert [r["wait_us"] for r in rows[:3]] == [300.0, 200.0, 0.0]
    assert [r["wait_us"] for r in rows[6:]] == [0.0, 50.0, 50.0]
    step1, step2 = summary["per_step"]
    assert (step1["step"], step1["last_rank"], step1["wait_caused_us"], step1["max_skew_us"]) == (1, 2, 1000.0, 300.0)
    assert (step2["last_rank"], step2["wait_caused_us"]) == (0, 100.0)
    by_rank = {r["rank"]: r for r in summary["by_rank"]}
    assert by_rank[2]["times_last"] == 2 and by_rank[2]["wait_caused_us"] == 1000.0
    assert by_rank[0]["wait_incurred_us"] == 600.0
    assert summary["top_rank"] == 2 and summary["top_rank_last_share"] == pytest.approx(2 / 3, abs=1e-4)
    assert summary["note"] is None


def test_clock_offset_of_one_host_is_removed():
    # Rank 2's clock runs 10 ms ahead: its starts and ends shift, durations do not.
    plain = three_ranks()
    shifted = copy.deepcopy(plain)
    for r in shifted:
        if r["rank"] == 2:
            r["start_us"] += 10_000.0
    s1, s2 = analyze(plain), analyze(shifted)
    assert [r["wait_us"] for r in shifted] == [r["wait_us"] for r in plain]
    assert s2["per_step"] == s1["per_step"]
    assert [r["clock_offset_us"] for r in s1["by_rank"]] == [0.0, 0.0, 0.0]
    assert [r["clock_offset_us"] for r in s2["by_rank"]] == [0.0, 0.0, 10_000.0]


def test_match_prefers_comms_id_then_seq_and_rejects_duplicates():
    rows = [row(0, 0, 10, comms_id=7, seq=1), row(1, 5, 5, comms_id=7, seq=1),
            row(0, 100, 10, comms_id=8, seq=2), row(1, 103, 7, comms_id=8, seq=2)]
    assert match(rows)[0] == "comms_id"
    per_rank_ids = copy.deepcopy(rows)
    for k, r in enumerate(per_rank_ids):
        r["comms_id"] = k  # ids unique per rank never match: fall back to Seq
    assert match(per_rank_ids)[0] == "seq"
    repeated = copy.deepcopy(rows)
    for r in repeated:
        r["seq"] = 0  # a Seq that repeats on one rank is not an identity: fall back to order
    for r in repeated:
        r["comms_id"] = None
    method, sets = match(repeated)
    assert method == "order" and len(sets) == 2


def test_point_to_point_is_not_matched_by_order():
    rows = [row(0, 0, 10, kind="send"), row(1, 0, 10, kind="recv")]
    assert analyze(rows)["method"] is None
    assert all(r["wait_us"] is None for r in rows)


def test_point_to_point_ids_are_per_rank_counters_not_keys():
    """torch >= 2.12 gives a send / recv a Seq and Comms Id that count one rank's own p2p calls
    on the group (one per coalesced batch): rank 0's send #3 and rank 1's recv #3 need not be one
    transfer, and a batch repeats one value on a rank. Neither pairs p2p rows nor stops the
    job's collectives from being matched by their ids."""
    rows = [row(0, 0, 10, comms_id=7, seq=1), row(1, 5, 5, comms_id=7, seq=1),
            row(0, 100, 10, comms_id=8, seq=2), row(1, 103, 7, comms_id=8, seq=2)]
    # a batched send+recv on rank 0 (one Seq and Comms Id for both), a recv on rank 1 whose
    # per-rank counters happen to equal rank 0's
    rows += [row(0, 200, 30, kind="send", comms_id=99, seq=3), row(0, 200, 30, kind="recv", comms_id=99, seq=3),
             row(1, 150, 80, kind="recv", comms_id=99, seq=3)]
    summary = analyze(rows)
    assert summary["method"] == "comms_id" and summary["matched_collectives"] == 2
    assert [r["wait_us"] for r in rows[:4]] == [5.0, 0.0, 3.0, 0.0]
    assert all(r["wait_us"] is None for r in rows[4:])
    no_ids = copy.deepcopy(rows)
    for r in no_ids[4:]:
        r["comms_id"] = r["seq"] = None  # p2p without ids (torch < 2.12): the collectives' ids still work
    assert match(no_ids)[0] == "comms_id"


def test_one_rank_or_subset():
    rows = [row(0, 0, 10)]
    assert analyze(rows)["method"] is None and rows[0]["wait_us"] is None
    rows = three_ranks()
    assert "lower bounds" in analyze(rows, world_size=128)["note"]


def test_real_traces(real_traces):
    from analyzer.api import DiagnoseOptions, diagnose
    dlrm = diagnose([str(real_traces / "param_dlrm_ddp_8rank")], DiagnoseOptions(workers=1))
    s = dlrm.stragglers
    assert s["method"] == "order" and s["ranks_compared"] == list(range(8))
    matched = [r for r in dlrm.collectives if r["wait_us"] is not None]
    assert matched and all(r["wait_us"] >= 0 for r in matched)
    sampled = diagnose([str(real_traces / "hta_ddp_sampled_128rank")], DiagnoseOptions(workers=1))
    assert "2 of 128" in sampled.stragglers["note"]


# -- the vectorised matcher against a plain-Python reference --------------------------------

def reference_match(rows):
    """The matching rules of the module docstring, one row at a time."""
    def group_key(r):
        g = r.get("group") or {}
        return ("name", str(g["name"])) if g.get("name") is not None else ("unknown", r["collective"])

    def p2p(r):
        return r["collective"] in ("send", "recv", "sendrecv")

    def keys(method):
        if method in ("comms_id", "seq"):  # over the collectives; point-to-point never keyed
            mine = [r for r in rows if not p2p(r)]
            if not mine or any(r[method] is None for r in mine):
                return None
            key = (lambda r: str(r["comms_id"])) if method == "comms_id" else (lambda r: (group_key(r), str(r["seq"])))
            return [None if p2p(r) else key(r) for r in rows]
        out, seen = [None] * len(rows), {}
        for i in sorted(range(len(rows)), key=lambda i: (rows[i]["rank"], rows[i]["start_us"])):
            r = rows[i]
            if r["collective"] in ("send", "recv", "sendrecv"):
                continue
            slot = (r["rank"], group_key(r), r["step"])
            out[i] = (group_key(r), r["step"], seen.get(slot, 0))
            seen[slot] = seen.get(slot, 0) + 1
        return out

    for method in ("comms_id", "seq", "order"):
        k = keys(method)
        if k is None:
            continue
        pairs = [(r["rank"], key) for r, key in zip(rows, k) if key is not None]
        if len(set(pairs)) < len(pairs):
            continue
        sets = {}
        for i, key in enumerate(k):
            if key is not None:
                sets.setdefault(key, []).append(i)
        found = [v for v in sets.values() if len(v) > 1]
        if found:
            return method, found
    return None, []


@st.composite
def collective_rows(draw):
    count = draw(st.integers(1, 40))
    ids = st.one_of(st.none(), st.integers(0, 6), st.integers(2**63, 2**64 - 1), st.sampled_from(["a", "7"]))
    rows = []
    for _ in range(count):
        r = row(draw(st.integers(0, 3)), float(draw(st.integers(0, 20))), 1.0,
                step=draw(st.sampled_from([None, 1, 2])), kind=draw(st.sampled_from(["allreduce", "send", "allgather"])),
                group=draw(st.sampled_from(["0", "1"])))
        r["comms_id"], r["seq"] = draw(ids), draw(ids)
        rows.append(r)
    uniform = draw(st.sampled_from(["as drawn", "ids everywhere", "seq everywhere"]))
    for k, r in enumerate(rows):
        if uniform == "ids everywhere":
            r["comms_id"] = k % 5 + r["rank"] * draw(st.integers(0, 1))
        if uniform == "seq everywhere":
            r["seq"] = k % 4
    return rows


@settings(max_examples=300, deadline=None)
@given(collective_rows())
def test_match_agrees_with_the_reference(rows):
    method, sets = match(rows)
    expected_method, expected_sets = reference_match(rows)
    assert method == expected_method
    assert list(sets.values()) == expected_sets


VALUES = st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: round(v, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(VALUES, VALUES, st.integers(0, 7)), min_size=1, max_size=9), max_size=12))
def test_per_set_figures_equal_the_set_by_set_ones(sets):
    """The sets of one size as the rows of one 2-D array: each set's last arrival, skew,
    median, lags and the member it waited for are the 1-D slice's, bit for bit (ties: the first)."""
    import numpy as np

    from analyzer.job.crossrank import _per_set, _set_medians
    arrivals = np.array([a for s in sets for a, _, _ in s], dtype=float)
    durations = np.array([d for s in sets for _, d, _ in s], dtype=float)
    members = np.array([m for s in sets for _, _, m in s], dtype=np.int64)
    bounds = np.cumsum([0] + [len(s) for s in sets])
    lags, waited = np.empty(len(arrivals)), np.empty(len(arrivals), dtype=np.int64)
    last, skew = _per_set(arrivals, durations, members, bounds, lags, waited)
    for k, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        arrival = arrivals[lo:hi]
        assert last[k] == int(np.argmax(arrival))
        assert repr(skew[k]) == repr(float(arrival.max() - arrival.min()))
        assert [repr(v) for v in lags[lo:hi].tolist()] == [repr(v) for v in (arrival - np.median(arrival)).tolist()]
        assert set(waited[lo:hi].tolist()) == {int(members[lo + int(np.argmin(durations[lo:hi]))])}
        assert repr(float(_set_medians(arrivals, bounds)[k])) == repr(float(np.median(arrival)))


@settings(max_examples=200, deadline=None)
@given(collective_rows(), st.lists(st.integers(1, 9), min_size=40, max_size=40))
def test_row_fields_agree_with_the_per_set_reference(rows, durations):
    """What analyze writes into each row (in row order, from the columns): per matched set the
    wait over the shortest member, the member waited for (None for that member itself, a
    Python int otherwise), the keys in the order unmatched rows get them; None for the rest."""
    for r, d in zip(rows, durations):
        r["dur_us"] = d * 1.5
    _, sets = match(copy.deepcopy(rows))
    analyze(rows)
    expected = {i: (None, None) for i in range(len(rows))}
    for members in sets.values():
        shortest = min(members, key=lambda i: (rows[i]["dur_us"], members.index(i)))
        for i in members:
            peer = rows[shortest]["rank"]
            expected[i] = (round(rows[i]["dur_us"] - rows[shortest]["dur_us"], 3),
                           None if peer == rows[i]["rank"] else peer)
    for i, r in enumerate(rows):
        assert list(r)[-3:] == ["wait_us", "waited_for", "arrival_lag_us"]
        assert (r["wait_us"], r["waited_for"]) == expected[i]
        assert type(r["waited_for"]) in (int, type(None))
        assert (r["arrival_lag_us"] is None) == (r["wait_us"] is None)
