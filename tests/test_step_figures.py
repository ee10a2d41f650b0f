"""The per-step figures computed for every step at once (analyzer.rank.steps.step_figures, issue
13) are the step-by-step ones: same keys in the same order, same values and types.

The reference below is the per-step loop as it was before: ``breakdown``, ``exposed_by_phase``
and the step facts of each step's own events."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.ingest.trace import GpuEvents, GpuKind
from analyzer.rank import steps as steps_module
from analyzer.rank.steps import _is_low_precision, step_figures
from analyzer.rank.timeline import BACKWARD, NO_STEP, PHASES, Attribution, breakdown, exposed_by_phase

STRINGS = ["sm90_gemm_bf16", "elementwise_kernel", "ncclAllReduce", "flash_fwd_bfloat16_t", "Memcpy HtoD"]


def plain_step_facts(strings, gpu, phase):
    compute = gpu.kind == GpuKind.COMPUTE
    windows = {}
    for code, name in enumerate(PHASES):
        mask = compute & (phase == code)
        if not mask.any():
            continue
        union = iv.union(gpu.ts[mask], gpu.end[mask])
        windows[name] = {"start_ns": int(gpu.ts[mask].min()), "end_ns": int(gpu.end[mask].max()),
                         "compute_us": round(iv.total(union) / 1000.0, 3)}
    low = np.zeros(len(gpu), dtype=bool)
    names = gpu.name[compute]
    if len(names):
        low_names = [i for i in arrays.unique(names).tolist() if _is_low_precision(strings[i])]
        low[np.flatnonzero(compute)[np.isin(names, low_names)]] = True
    low_us = iv.total(iv.union(gpu.ts[low], gpu.end[low])) / 1000.0 if low.any() else 0.0
    return {"phase_windows": windows, "low_precision_compute_us": round(low_us, 3)}


def plain_step_figures(strings, gpu, att):
    """One step at a time, as _per_step did."""
    out = []
    for number in sorted(int(s) for s in arrays.unique(att.step) if s != NO_STEP):
        rows = np.flatnonzero(att.step == number)
        sub = gpu.take(rows)
        entry = {"step": number}
        entry.update(breakdown(sub))
        entry["phases"] = exposed_by_phase(sub, att.phase[rows])
        entry.update(plain_step_facts(strings, sub, att.phase[rows]))
        entry["first_ns"] = int(sub.ts.min())
        backward = (att.phase[rows] == BACKWARD) & (att.launch_thread[rows] >= 0)
        entry["backward_launch_ns"] = int(att.launch_ts[rows][backward].min()) if backward.any() else None
        out.append(entry)
    return out


events = st.lists(st.tuples(st.integers(0, 3000), st.integers(-5, 400), st.sampled_from([0, 1, 2]),
                            st.integers(0, len(STRINGS) - 1), st.sampled_from([NO_STEP, 3, 4, 5, 9]),
                            st.integers(0, len(PHASES) - 1), st.integers(-1, 1), st.integers(0, 3000)),
                  max_size=60)


def build(rows, origin):
    cols = list(zip(*rows)) if rows else [()] * 8
    ts = np.array(cols[0], dtype=np.int64) + origin
    gpu = GpuEvents(ts, ts + np.array(cols[1], dtype=np.int64), np.zeros(len(ts), np.int64),
                    np.array(cols[2], dtype=np.int8), np.array(cols[3], dtype=np.int32), np.full(len(ts), -1, np.int64))
    att = Attribution(np.array(cols[7], dtype=np.int64) + origin, np.array(cols[6], dtype=np.int32),
                      np.array(cols[4], dtype=np.int64), np.array(cols[5], dtype=np.int8))
    return gpu, att


def assert_same(got, want):
    assert got == want
    assert repr(got) == repr(want)  # same types (int, not numpy) and key order


@settings(max_examples=400, deadline=None)
@given(events, st.sampled_from([0, 1_700_000_000_000_000_000]))
def test_every_step_at_once_is_step_by_step(rows, origin):
    gpu, att = build(rows, origin)
    assert_same(step_figures(STRINGS, gpu, att), plain_step_figures(STRINGS, gpu, att))


@settings(max_examples=200, deadline=None)
@given(events, st.sampled_from([1, 500, 3000]))
def test_steps_beyond_the_lanes_span_are_computed_a_few_at_a_time(rows, limit):
    gpu, att = build(rows, 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steps_module, "LANES_SPAN_NS", limit)
        assert_same(step_figures(STRINGS, gpu, att), plain_step_figures(STRINGS, gpu, att))
