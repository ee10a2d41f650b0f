"""The digest (analyzer.job.digest) gives every view the figures of the row-by-row code it replaced
(tests/digest_oracle.py, as it was on main): the HTML report's collective tables and α-β scatter,
the text view's top and host-side collectives, the gate's bus bandwidth per group and the diff's
totals per (group, collective). On sample jobs of every shape, and on generated rows (hypothesis)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import digest_oracle as oracle
from analyzer.compare import diff, metrics
from analyzer.job import digest as digest_module
from analyzer.job.columns import CollectiveColumns
from analyzer.job.result import _clean, result_to_dict
from analyzer.reports import html, text
from rule_cases_lib import diagnosed

JOBS = ["synthetic/ddp_straggler", "synthetic/fsdp_hybrid_2node", "synthetic/megatron_tp8_2node",
        "synthetic/ddp_alltoall_embeddings", "synthetic/pp_gpipe_4stage", "synthetic/ep_deepep_exposed",
        "cpu_gloo/ddp", "cpu_gloo/pp", "cpu_gloo/fsdp2_tp", "gpu_h200/fsdp2"]


def _same_metrics(new: dict, old: dict) -> None:
    """The gate reads a metric's figure by aggregation, its description, its spread (σ, n) and
    the steps its samples cover: the same from the digest's aggregates and windows."""
    assert new.keys() == old.keys()
    for name in new:
        for how in metrics.AGGREGATIONS:
            assert new[name].value(how) == old[name].value(how), (name, how)
            assert new[name].described(how) == old[name].described(how), (name, how)
        assert metrics.spread(new[name]) == metrics.spread(old[name]), name
        assert {s.step for s in new[name].samples} == {s.step for s in old[name].samples}, name
        assert new[name].basis == old[name].basis and new[name].typical == old[name].typical


@pytest.mark.parametrize("job", JOBS)
def test_views_of_a_sample_job_are_the_row_by_row_figures(job):
    result = diagnosed(job)
    doc = _clean(result_to_dict(result, plain=False))
    assert html._collectives(doc, result.model) == oracle._collectives(doc, result.model)
    plain_doc = result_to_dict(result, plain=False)
    assert text._top_collectives(plain_doc, result.model.digest) == oracle.text_top_collectives(plain_doc)
    _same_metrics(metrics._busbw(result), oracle.busbw_metrics(result))
    assert diff.collective_totals(result) == oracle.collective_totals(result)


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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, min_size=0, max_size=60), st.booleans())
def test_generated_rows_give_the_row_by_row_figures(drawn, matched):
    rows = _rows(drawn)
    view = CollectiveColumns(rows)
    digest = digest_module.plain({"groups": digest_module.html_groups(view),
                                  "top_exposed": digest_module.top_exposed(view, rows),
                                  "host_side": digest_module.host_side(view, rows),
                                  "busbw": digest_module.busbw_samples(view), "labels": digest_module.group_labels(view)})
    model = SimpleNamespace(digest=digest, collectives=view, typical=None)
    doc = {"collectives": rows, "groups": [], "stragglers": {"method": "seq" if matched else None}}
    assert html._collectives(doc, model) == oracle._collectives(doc, model)
    assert text._top_collectives(doc, digest) == oracle.text_top_collectives(doc)
    run = SimpleNamespace(model=model, collectives=rows)
    _same_metrics(metrics._busbw(run), oracle.busbw_metrics(run))


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
    model = SimpleNamespace(digest=digest)
    doc = {"collectives": rows, "groups": [], "stragglers": {}}
    assert html._collectives(doc, model) == oracle._collectives(doc, model)
    assert text._top_collectives(doc, digest) == oracle.text_top_collectives(doc)
