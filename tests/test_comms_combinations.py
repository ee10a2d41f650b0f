"""Collective rows built once per distinct combination of their metadata sources (issue 13)
are the rows the row-by-row code built: same keys in the same order, same values and types,
rows of one process group sharing one group dict as before.

The reference below is ``collectives_for_rank`` as it was before: one ``_merge_sources``,
``_GroupLookup.of`` and ``_row`` per communication kernel."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.base import intervals as iv
from analyzer.ingest import loader
from analyzer.ingest.catalog import lookup
from analyzer.ingest.classify import fsdp_module_of
from analyzer.ingest.trace import GpuKind, Marker
from analyzer.rank import comms
from analyzer.rank.timeline import NO_STEP, PHASES, attribute, compute_union, innermost_marker
from tests.builders import MAIN, TraceBuilder


def plain_collectives(rank, att, origin_ns):
    """The row-by-row collectives_for_rank (GPU side)."""
    gpu = rank.gpu
    rows_idx = np.flatnonzero(gpu.kind == GpuKind.COMM)
    m = rank.markers
    ts, thread = att.launch_ts[rows_idx], att.launch_thread[rows_idx]
    params_row = innermost_marker(m, Marker.COMM_PARAMS, ts, thread)
    op_row = innermost_marker(m, Marker.COMM_OP, ts, thread)
    module_row = comms._module_markers(rank, ts, thread)
    covered = iv.covered_length(compute_union(gpu), gpu.ts[rows_idx], gpu.end[rows_idx])
    names = [rank.strings[i] for i in gpu.name[rows_idx].tolist()]
    kernels = [lookup(name) for name in names]
    op_names = [rank.strings[m.name[row]] if row >= 0 else None for row in op_row.tolist()]
    metas = [comms._merge_sources(rank.kernel_comm_args.get(row), m.comm_args.get(params) if params >= 0 else None,
                                  m.comm_args.get(op) if op >= 0 else None, op_name, name, kernel)
             for row, params, op, op_name, name, kernel
             in zip(rows_idx.tolist(), params_row.tolist(), op_row.tolist(), op_names, names, kernels)]
    codes = np.arange(len(metas))
    inferred = comms._kinds_from_stream_order(rank, gpu, rows_idx, metas, kernels, codes, params_row, op_row)
    for k, kind in inferred.items():
        metas[k]["collective"], metas[k]["collective_source"] = kind, "stream order of CPU collectives"
    amd = comms._on_amd(rank)
    groups = comms._GroupLookup(rank)
    dur = gpu.end[rows_idx] - gpu.ts[rows_idx]
    out = []
    for k, meta in enumerate(metas):
        row = rows_idx[k]
        step = int(att.step[row])
        module = int(module_row[k])
        out.append(comms._row(
            rank.rank, meta, groups.of(meta, kernels[k] is not None and kernels[k].library in comms.NCCL_NAMED),
            step=step if step != NO_STEP else None, phase=PHASES[att.phase[row]], stream=int(gpu.stream[row]),
            start_us=round(int(gpu.ts[row] - origin_ns) / 1000.0, 3), dur_us=round(int(dur[k]) / 1000.0, 3),
            exposed_us=round(int(dur[k] - covered[k]) / 1000.0, 3),
            launch_us=round(int(ts[k] - origin_ns) / 1000.0, 3) if thread[k] >= 0 else None, kernel=names[k],
            library=comms._library(kernels[k], amd),
            module=fsdp_module_of(rank.strings[m.name[module]]) if module >= 0 else None, on_gpu=True))
    comms.share_groups(out)
    return out


KERNELS = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
           "ncclDevKernel_AllGather_RING_LL(x)", "ncclKernel_ReduceScatter_RING_LL_Sum_float",
           "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_SendRecv(x)"]
PARAMS = st.fixed_dictionaries({}, optional={
    "Collective name": st.sampled_from(["allreduce", "_allgather_base", "reduce_scatter", "", "barrier"]),
    "In msg nelems": st.sampled_from([1000, 4096, "8", -1]), "Out msg nelems": st.sampled_from([1000, 8192]),
    "Group size": st.sampled_from([2, 4, 1.0]), "dtype": st.sampled_from(["BFloat16", "Float", "", "c10::Half"]),
    "Process Group Name": st.sampled_from(["0", "1", 0, ""]), "Process Group Description": st.sampled_from(
        ["default_pg", "tp", ""]), "Process Group Ranks": st.sampled_from(["[0, 1]", "[0, 1, 2, 3]", "[]", "bad"]),
    "Seq": st.one_of(st.integers(-1, 5), st.just("3")), "Comms Id": st.one_of(st.integers(0, 2**64 - 1), st.just(1.0)),
})
COLLECTIVE = st.fixed_dictionaries({
    "kernel": st.sampled_from(KERNELS), "params": st.one_of(st.none(), PARAMS),
    "op": st.sampled_from([None, "nccl:all_reduce", "c10d::allgather_", "nccl:_all_gather_base"]),
    "dims": st.sampled_from([None, [[4, 8]], [[2, 2], [8]], [[[2], [3]]]]),
    "kernel_args": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "Seq": st.integers(0, 3), "In msg nelems": st.just(64), "dtype": st.just("Float")})),
    "linked": st.booleans(), "stream": st.sampled_from([20, 21]), "fsdp": st.sampled_from([None, "layers.0", "x"]),
    "step": st.sampled_from([1, 2, None]), "dur": st.integers(1, 40),
})
# Odd values a trace may hold in a field, each of a type its schema accepts: equal to the usual
# ones under == (1 == 1.0) but written otherwise, a list for the ranks, strings for numbers.
ODD = {"In msg nelems": [1.0, 1, "1", 2**70, None], "Group size": [2.0, "2", 0, None],
       "Process Group Name": [0, "0", "", None], "Process Group Ranks": [[0, 1], [1], [], "[0,1]", None],
       "dtype": ["", "float", None], "Seq": [2.0, "3", 2**64, -5, None], "Collective name": ["", "allreduce", None]}


def _trace(collectives: list[dict], tmp: Path):
    b = TraceBuilder(pg_ranks=(0, 1))
    for k, c in enumerate(collectives):
        base = 1000.0 + 100 * k
        if c["step"] is not None:
            b.cpu(f"ProfilerStep#{c['step']}", base - 5, 95, cat="user_annotation")
        if c["fsdp"] is not None:
            b.cpu(f"FSDP::all_gather ({c['fsdp']})", base - 4, 4)
        if c["op"] is not None:
            b.cpu(c["op"], base - 3, 2.5, **({"Input Dims": c["dims"], "Input type": ["c10::BFloat16"]}
                                             if c["dims"] is not None else {}))
        if c["params"] is not None:
            b.cpu("record_param_comms", base - 2.5, 1.5, **c["params"])
        b.kernel("sm90_gemm", base, 30, launch_ts=base - 4.5, tid=MAIN)
        b.kernel(c["kernel"], base + 20, c["dur"], stream=c["stream"], launch_ts=base - 2 if c["linked"] else None,
                 **{k: v for k, v in (c["kernel_args"] or {}).items()})
    return loader.load_rank_trace(b.write(tmp / "rank-0.json"))


def _same_rows(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert list(a) == list(b)
        for key in a:
            assert type(a[key]) is type(b[key]) and (a[key] == b[key] or pickle.dumps(a[key]) == pickle.dumps(b[key]))
    # Rows of one group share one dict, as before: the same partition of rows by group object.
    first = {}
    assert [first.setdefault(id(r["group"]), k) for k, r in enumerate(got)] == \
        [first.setdefault(("x", id(r["group"])), k) for k, r in enumerate(expected)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(COLLECTIVE, min_size=1, max_size=14), st.lists(st.tuples(st.integers(0, 20), st.sampled_from(
    sorted(ODD)), st.integers(0, 4)), max_size=4), st.data())
def test_rows_by_combination_match_row_by_row(tmp_path_factory, collectives, odd, data):
    """On generated traces (repeating and varying metadata, kernel args, Input Dims, generic
    kernels left to the stream order, FSDP modules), odd values written in some collectives'
    args included, the rows are the row-by-row code's."""
    for which, key, choice in odd:
        c = collectives[which % len(collectives)]
        c["params"] = {**(c["params"] or {}), key: ODD[key][choice % len(ODD[key])]}
    rank = _trace(collectives, tmp_path_factory.mktemp("t"))
    att = attribute(rank)
    origin = data.draw(st.sampled_from([0, int(rank.gpu.ts.min()), -(2**60)]))
    try:
        expected = plain_collectives(rank, att, origin)
    except (TypeError, AttributeError, ValueError):  # an odd value the row-by-row code refused (which
        with pytest.raises((TypeError, AttributeError, ValueError)):  # it meets first may differ)
            comms.collectives_for_rank(rank, att, origin)
        return
    _same_rows(comms.collectives_for_rank(rank, att, origin), expected)


def test_heavy_repeating_collectives(tmp_path):
    """Many collectives of a few combinations, with per-row seq and Comms Id."""
    params = {"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "Group size": 2,
              "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
              "Process Group Ranks": "[0, 1]"}
    many = [{"kernel": KERNELS[k % 2], "params": {**params, "Seq": k, "Comms Id": 7 * k} if k % 5 else params,
             "op": "nccl:all_reduce", "dims": None, "kernel_args": None, "linked": True, "stream": 20, "fsdp": None,
             "step": 1 + k // 20, "dur": 10} for k in range(60)]
    rank = _trace(many, tmp_path)
    att = attribute(rank)
    got = comms.collectives_for_rank(rank, att, 0)
    _same_rows(got, plain_collectives(rank, att, 0))
    assert [r["seq"] for r in got[:6]] == [None, 1, 2, 3, 4, None]
    assert len({id(r["group"]) for r in got}) == 1
