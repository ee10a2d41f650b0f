"""The digest (analyzer.job.digest) gives every view the figures of the row-by-row code it replaced
(tests/digest_oracle.py, as it was on main): the HTML report's collective tables and α-β scatter,
the text view's top and host-side collectives and the diff's totals per (group, collective); and
each group's bus bandwidth (the gate's metric, its samples, why a group has none, the HTML's) as
the oracle works it out row by row. On sample jobs of every shape, and on generated rows
(hypothesis)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import digest_oracle as oracle
from analyzer.compare import diff, metrics
from analyzer.job import digest as digest_module
from analyzer.job.busbw import figures, group_sums
from analyzer.job.columns import CollectiveColumns
from analyzer.job.crossrank import matched_ranks
from analyzer.job.model import HostSidePer, group_label
from analyzer.job.result import _clean, result_to_dict
from analyzer.reports import html, text
from rule_cases_lib import diagnosed

JOBS = ["synthetic/ddp_straggler", "synthetic/fsdp_hybrid_2node", "synthetic/megatron_tp8_2node",
        "synthetic/ddp_alltoall_embeddings", "synthetic/pp_gpipe_4stage", "synthetic/ep_deepep_exposed",
        "cpu_gloo/ddp", "cpu_gloo/pp", "cpu_gloo/fsdp2_tp", "gpu_h200/fsdp2"]


def _same_busbw(run, matched) -> dict:
    """The gate reads a metric's figure by aggregation, its description, its spread (σ, n) and
    its samples, and says why a group it cannot measure is not gated: the same from the digest's
    sums as from the rows, to the last bit."""
    new, unmeasured = metrics._busbw(run), metrics.unmeasured_metrics(run)
    old, old_unmeasured = oracle.busbw_metrics(run, matched)
    assert new.keys() == old.keys() and unmeasured == old_unmeasured
    for name in new:
        for how in metrics.AGGREGATIONS:
            assert new[name].value(how) == old[name].value(how), (name, how)
            assert new[name].described(how) == old[name].described(how), (name, how)
        assert metrics.spread(new[name]) == metrics.spread(old[name]), name
        assert sorted(new[name].samples, key=repr) == sorted(old[name].samples, key=repr), name
        assert (new[name].basis, new[name].typical, new[name].scope) == (old[name].basis, old[name].typical,
                                                                          old[name].scope)
    return oracle.busbw_figures(run, matched)


@pytest.mark.parametrize("job", JOBS)
def test_views_of_a_sample_job_are_the_row_by_row_figures(job):
    result = diagnosed(job)
    doc = _clean(result_to_dict(result, plain=False))
    busbw = _same_busbw(result, matched_ranks(result.model.collectives).tolist())
    assert html._collectives(doc, result.model) == oracle._collectives(doc, result.model, busbw)
    plain_doc = result_to_dict(result, plain=False)
    assert text._top_collectives(plain_doc, result.model) == oracle.text_top_collectives(plain_doc)
    assert diff.collective_totals(result) == oracle.collective_totals(result)


def test_the_sample_jobs_cover_every_kind_of_busbw_figure():
    """The jobs above hold figures of the typical step and groups with none (send/recv only)."""
    kinds = set()
    for job in JOBS:
        for figure in diagnosed(job).model.group_busbw.values():
            kinds.add(figure.basis.split(":")[0].split(" ")[0] if figure.measured else figure.basis[:40])
    assert "typical" in kinds and any(k.startswith("not measured") for k in kinds), kinds


# ---------------------------------------------------------------- generated rows
GROUPS = [{"name": "0", "size": 4, "ranks": [0, 1, 2, 3], "description": "default_pg"},
          {"name": "tp0", "size": 2, "ranks": [0, 1], "description": None},
          {"name": "1", "size": 1, "ranks": [2], "description": ""},
          {"name": None, "size": None},
          {"name": "12", "size": 4},
          {}]
KINDS = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "send", "recv", "barrier", "unknown"]
times = st.one_of(st.just(0.0), st.floats(0.001, 1e6).map(lambda v: round(v, 3)))
maybe = lambda values: st.one_of(st.none(), values)  # noqa: E731

row = st.fixed_dictionaries({
    "rank": st.integers(0, 5), "step": maybe(st.integers(0, 3)), "group": st.sampled_from(range(len(GROUPS))),
    "collective": st.sampled_from(KINDS), "bytes": maybe(st.one_of(st.just(0), st.integers(1, 2**31))),
    "start_us": times, "dur_us": times, "exposed_us": maybe(times), "phase": st.sampled_from(["forward", "backward"]),
    "wait_us": maybe(st.one_of(times, st.floats(-5, 0).map(lambda v: round(v, 3)))),
    "busbw_gbps": maybe(st.floats(0.001, 500).map(lambda v: round(v, 4))),
    "bound": maybe(st.sampled_from(["latency-bound", "bandwidth-bound"])), "on_gpu": st.booleans(),
    "library": maybe(st.sampled_from(["nccl", "gloo"])),
})


def _rows(drawn: list[dict]) -> list[dict]:
    """The rows with their group objects shared, as the reduce leaves them (share_groups)."""
    return [dict(r, group=GROUPS[r["group"]]) for r in drawn]


steps = st.one_of(st.none(), st.tuples(st.integers(0, 3), st.lists(st.integers(0, 3), unique=True, max_size=4)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, min_size=0, max_size=60), st.booleans(), st.data())
def test_generated_rows_give_the_row_by_row_figures(drawn, matched, data):
    """Every view, and the bus bandwidth with rows matched on all members or not (each row's
    matched set size drawn, as the cross-rank matching gives it), over a typical step and steady
    steps (held by the rows or not) or none (no step breakdown)."""
    rows = _rows(drawn)
    view = CollectiveColumns(rows)
    sets = data.draw(st.lists(st.sampled_from([0, 1, 2, 4, 4, 4]), min_size=len(rows), max_size=len(rows)))
    view.set("matched_ranks", np.array(sets, dtype=np.int64))
    chosen = data.draw(steps)
    typical = None if chosen is None else SimpleNamespace(step=chosen[0], steady_steps=tuple(sorted(chosen[1])))
    digest = digest_module.plain({"groups": digest_module.html_groups(view),
                                  "top_exposed": digest_module.top_exposed(view, rows),
                                  "host_side": digest_module.host_side(view, rows), "labels": digest_module.group_labels(view),
                                  "busbw": group_sums(view, group_label, typical and typical.step,
                                                     typical.steady_steps if typical else ())})
    model = SimpleNamespace(digest=digest, collectives=view, typical=typical, group_busbw=figures(digest["busbw"]),
                            **_scatter_model(digest))
    named = {str(g["name"]): g for g in GROUPS if g.get("name") is not None}
    model.group = lambda name: None if name not in named else SimpleNamespace(
        label=group_label(named[name]), busbw=model.group_busbw.get(group_label(named[name]) or ""),
        beta_pct=lambda gbps: None)  # no groups section: no fit, no β
    doc = {"collectives": rows, "groups": [], "stragglers": {"method": "seq" if matched else None}}
    run = SimpleNamespace(model=model, collectives=rows)
    busbw = _same_busbw(run, sets)
    assert html._collectives(doc, model) == oracle._collectives(doc, model, busbw)
    assert text._top_collectives(doc, model) == oracle.text_top_collectives(doc)


# rows most of which have their transfer measured: GPU ring collectives of a known size, their
# wait known and below their duration (the drawn matched set then decides)
measured_row = st.fixed_dictionaries({
    "rank": st.integers(0, 3), "step": st.one_of(st.integers(0, 2), st.just(None)), "group": st.sampled_from([0, 0, 1, 2, 4, 5]),
    "collective": st.sampled_from(["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "send"]),
    "bytes": st.one_of(st.integers(1, 2**31), st.just(None)), "start_us": times,
    "dur_us": st.floats(1, 1e5).map(lambda v: round(v, 3)), "exposed_us": maybe(times), "phase": st.just("backward"),
    "wait_us": st.one_of(st.floats(0, 0.999).map(lambda v: round(v, 3)), st.just(None)),
    "busbw_gbps": st.just(None), "bound": st.just(None), "on_gpu": st.sampled_from([True, True, True, False]),
    "library": st.just("nccl"),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(measured_row, min_size=1, max_size=60), st.data())
def test_generated_measured_rows_give_the_row_by_row_bus_bandwidth(drawn, data):
    """Rows most of which are measured: the figure of the typical step, of the steady steps (none
    in the typical one), of the whole trace, none in the steady steps, and its samples."""
    test_generated_rows_give_the_row_by_row_figures.hypothesis.inner_test(drawn, True, data)


@settings(max_examples=100, deadline=None)
@given(st.lists(row, min_size=0, max_size=40), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=8))
def test_generated_rows_give_the_diffs_totals(drawn, steady):
    rows = _rows(drawn)
    view = CollectiveColumns(rows)
    steps = [SimpleNamespace(rank=r, step=s, role="steady") for r, s in sorted(set(steady))]
    model = SimpleNamespace(rank_steps=lambda: iter(steps), ranks=[SimpleNamespace(rank=r) for r in range(6)],
                            group=lambda name: None)
    digest = digest_module.plain({"totals": digest_module.window_totals(view, set(steady), list(range(6)))})
    model.digest = digest
    run = SimpleNamespace(model=model, collectives=rows, ranks=[SimpleNamespace(rank=r, host=None) for r in range(6)],
                          job={"devices_per_node": 2})
    assert diff.collective_totals(run) == oracle.collective_totals(run)


def _scatter_model(digest: dict) -> dict:
    """What a fake job model gives the HTML collectives and the text host-side collectives of a
    digest without a groups section: the size buckets' edges, each group's scatter frame (no
    fit: no line) and totals, the host-side figures per basis."""
    return {"size_edges": digest_module.SIZE_EDGES,
            "scatter_frames": {g["name"]: digest_module.scatter_frame(g["scatter"], None) for g in digest["groups"]},
            "group_totals": digest_module.group_totals(digest["groups"]),
            "host_side": HostSidePer.of(digest["host_side"]) if digest["host_side"] else None}


def test_the_digest_reads_back_as_it_was_computed():
    """What a fresh run's views read is what a saved result gives: plain JSON data."""
    result = diagnosed("synthetic/ddp_straggler")
    computed = digest_module.collective_digest(result)
    import msgspec
    assert msgspec.json.decode(msgspec.json.encode(computed)) == computed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_rows_thin_the_scatter_as_the_row_by_row_code(seed):
    """Thousands of points per group: the scatter keeps the same points (fastest of each size,
    then evenly spread), the tables the same sums and medians."""
    import random
    draw = random.Random(seed)
    rows = []
    for i in range(6000):
        size = draw.choice([None, 0, draw.randrange(1, 2**30), 2**draw.randrange(10, 28)])
        dur = round(draw.choice([0.0, draw.uniform(1, 5000)]), 3)
        rows.append({"rank": draw.randrange(8), "step": draw.choice([None, 1, 2, 3]), "phase": "backward",
                     "group": GROUPS[draw.randrange(2)], "collective": draw.choice(KINDS[:6]), "bytes": size,
                     "start_us": round(i * 10.0 + draw.random(), 3), "dur_us": dur,
                     "exposed_us": draw.choice([None, 0.0, round(draw.uniform(0, dur), 3)]),
                     "wait_us": draw.choice([None, round(draw.uniform(-1, dur * 1.2), 3)]),
                     "busbw_gbps": draw.choice([None, round(draw.uniform(1, 300), 4)]),
                     "bound": draw.choice([None, "latency-bound", "bandwidth-bound"]), "on_gpu": draw.random() < 0.9,
                     "library": "nccl"})
    view = CollectiveColumns(rows)
    digest = digest_module.plain({"groups": digest_module.html_groups(view),
                                  "top_exposed": digest_module.top_exposed(view, rows),
                                  "host_side": digest_module.host_side(view, rows)})
    assert any(g["scatter"]["total"] > len(g["scatter"]["points"]) for g in digest["groups"])  # thinned
    # no groups section: no bus bandwidth shown, no fit line
    model = SimpleNamespace(digest=digest, group=lambda name: None, **_scatter_model(digest))
    doc = {"collectives": rows, "groups": [], "stragglers": {}}
    assert html._collectives(doc, model) == oracle._collectives(doc, model, {})
    assert text._top_collectives(doc, model) == oracle.text_top_collectives(doc)
