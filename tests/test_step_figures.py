"""The per-step figures computed for every step at once (issue 13) are the step-by-step ones:
same keys in the same order, same values and types.

The references below are the code as it was before: the per-step loop (``breakdown``,
``exposed_by_phase`` and the step facts of each step's own events: analyzer.rank.steps
.step_figures now), the time breakdown and the host's stall before the step of one step at a
time (analyzer.rank.attribution.RankTimeline.steps and .host_before now), and the first backward
marker of each step (analyzer.rank.analysis._first_within now)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.ingest.trace import GpuEvents, GpuKind, Marker, Markers
from analyzer.rank.attribution import LAUNCH_GAP_NS, RankTimeline
from analyzer.rank import steps as steps_module
from analyzer.rank.analysis import _first_within
from analyzer.rank.steps import _is_attention_forward, _is_low_precision, step_figures
from analyzer.rank.timeline import BACKWARD, NO_STEP, PHASES, Attribution, breakdown, exposed_by_phase, ns_to_us

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
    out = {"phase_windows": windows, "low_precision_compute_us": round(low_us, 3)}
    # one forward attention kernel per block: counted in the forward phase, kept only when found
    attention = sum(1 for name, p, k in zip(gpu.name.tolist(), phase.tolist(), gpu.kind.tolist())
                    if k == GpuKind.COMPUTE and p == 0 and _is_attention_forward(strings[name]))
    if attention:
        out["forward_attention_kernels"] = attention
    return out


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


class PlainTimeline:
    """RankTimeline as it was: one window at a time."""

    def __init__(self, trace, gpu, launch_ts):
        kind = gpu.kind
        self.compute = _union(gpu, kind == GpuKind.COMPUTE)
        self.comm = _union(gpu, kind == GpuKind.COMM)
        self.busy = iv.union(gpu.ts, gpu.end)
        m = trace.markers
        self.input = _marker_union(m, Marker.HOST_INPUT)
        self.sync = _marker_union(m, Marker.HOST_SYNC)
        order = np.argsort(gpu.ts, kind="stable")
        self._next_ts, self._next_launch = gpu.ts[order], launch_ts[order]

    def step(self, start, end):
        compute = iv.clip(self.compute, start, end)
        comm = iv.subtract(iv.clip(self.comm, start, end), compute)
        busy = iv.clip(self.busy, start, end)
        idle = iv.subtract((np.array([start], np.int64), np.array([end], np.int64)), busy)
        compute_ns, comm_ns, busy_ns = iv.total(compute), iv.total(comm), iv.total(busy)
        causes = self._idle_causes(idle)
        out = {
            "compute_only_us": ns_to_us(compute_ns),
            "exposed_comm_us": ns_to_us(comm_ns),
            "other_gpu_us": ns_to_us(busy_ns - compute_ns - comm_ns),
            "idle_us": ns_to_us((end - start) - busy_ns),
            "idle_by_host": {k: ns_to_us(v) for k, v in causes.items()},
        }
        return out, np.stack(comm, axis=1).ravel().tolist()

    def host_before(self, cpu_start, first_gpu):
        if first_gpu <= cpu_start:
            return {"input": 0.0, "device_sync": 0.0}
        return {"input": ns_to_us(iv.total(iv.clip(self.input, cpu_start, first_gpu))),
                "device_sync": ns_to_us(iv.total(iv.clip(self.sync, cpu_start, first_gpu)))}

    def _idle_causes(self, idle):
        rest = idle
        found = {}
        found["input"], rest = _take(rest, self.input)
        found["device_sync"], rest = _take(rest, self._sync_gaps(rest))
        found["launch"], rest = _take(rest, self._launch_gaps(idle))
        found["unknown"] = iv.total(rest)
        return found

    def _sync_gaps(self, gaps):
        starts, ends = gaps
        if not len(starts) or not len(self.sync[0]):
            return iv.EMPTY
        inside = iv.covered_length(self.sync, starts - 1, starts) > 0
        near = iv.clip(self.sync, int(starts[0]), int(ends[-1]))
        return iv.union(np.concatenate([starts[inside], near[0]]), np.concatenate([ends[inside], near[1]]))

    def _launch_gaps(self, gaps):
        starts, ends = gaps
        if not len(starts) or not len(self._next_ts):
            return iv.EMPTY
        idx = np.searchsorted(self._next_ts, ends, side="left")
        has_next = idx < len(self._next_ts)
        launch = np.where(has_next, self._next_launch[np.minimum(idx, len(self._next_ts) - 1)], -1)
        short = (ends - starts) <= LAUNCH_GAP_NS
        late = has_next & (launch >= starts)
        keep = short & late
        return starts[keep], ends[keep]


def _take(rest, cause):
    taken = iv.intersect(rest, cause)
    return iv.total(taken), iv.subtract(rest, taken)


def _union(gpu, mask):
    return iv.union(gpu.ts[mask], gpu.end[mask])


def _marker_union(m, kind):
    rows = m.kind == kind
    return iv.union(m.ts[rows], m.end[rows])


# Times in units of 25 µs: gaps fall on both sides of LAUNCH_GAP_NS and on it.
SCALE = 25_000
spans = st.lists(st.tuples(st.integers(0, 200), st.integers(-2, 20)), max_size=25)


def timeline_trace(kernels, kinds, launches, host_input, host_sync, jitter):
    def column(values):
        return np.array(values, dtype=np.int64) * SCALE

    ts = column([s for s, _ in kernels])
    gpu = GpuEvents(ts, ts + column([n for _, n in kernels]), np.zeros(len(ts), np.int64),
                    np.array((kinds * len(kernels))[:len(kernels)], dtype=np.int8), np.zeros(len(ts), np.int32),
                    np.full(len(ts), -1, np.int64))
    launch_ts = ts + column((launches * len(kernels))[:len(kernels)]) - 3 * SCALE
    rows = [(s, n, Marker.HOST_INPUT) for s, n in host_input] + [(s, n, Marker.HOST_SYNC) for s, n in host_sync]
    mts = column([s for s, _, _ in rows])
    # Host ranges may end a nanosecond before or after the GPU work they abut.
    mends = mts + column([n for _, n, _ in rows]) + np.resize(np.array(jitter, dtype=np.int64), len(rows))
    markers = Markers(mts, mends, np.zeros(len(rows), np.int32),
                      np.array([k for _, _, k in rows], dtype=np.int8), np.zeros(len(rows), np.int32),
                      np.full(len(rows), -1, np.int64))
    return SimpleNamespace(markers=markers), gpu, launch_ts


@settings(max_examples=400, deadline=None)
@given(spans, st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=5),
       st.lists(st.integers(0, 8), min_size=1, max_size=5), spans, spans,
       st.lists(st.tuples(st.integers(-10, 210), st.integers(-20, 80)), min_size=1, max_size=8),
       st.integers(-3, 3), st.lists(st.integers(-1, 1), min_size=1, max_size=5))
def test_every_window_at_once_is_window_by_window(kernels, kinds, launches, host_input, host_sync, windows, skew,
                                                  jitter):
    trace, gpu, launch_ts = timeline_trace(kernels, kinds, launches, host_input, host_sync, jitter)
    starts = np.array([s * SCALE + skew for s, _ in windows], dtype=np.int64)
    ends = starts + np.array([n * SCALE // 3 for _, n in windows], dtype=np.int64)
    plain = PlainTimeline(trace, gpu, launch_ts)
    want = [plain.step(start, end) for start, end in zip(starts.tolist(), ends.tolist())]
    timeline = RankTimeline(trace, gpu, launch_ts)
    assert_same(timeline.steps(starts, ends), want)
    # The same windows as (CPU start, first GPU activity) pairs, either way round.
    want = [plain.host_before(start, end) for start, end in zip(starts.tolist(), ends.tolist())]
    assert_same(timeline.host_before(starts, ends), want)


@settings(max_examples=200, deadline=None)
@given(spans, st.lists(st.tuples(st.integers(-10, 210), st.integers(-20, 80)), min_size=1, max_size=8))
def test_first_marker_within_each_window(backward, windows):
    trace, _, _ = timeline_trace([], [0], [0], [], backward, [0])
    trace.markers.kind[:] = Marker.BACKWARD
    starts = np.array([s * SCALE for s, _ in windows], dtype=np.int64)
    ends = starts + np.array([n * SCALE for _, n in windows], dtype=np.int64)
    begins = trace.markers.ts
    want = []
    for start, end in zip(starts, ends):  # as _per_step did
        inside = begins[(begins >= start) & (begins <= end)]
        want.append(int(inside.min()) if len(inside) else None)
    assert_same(_first_within(trace, Marker.BACKWARD, starts, ends), want)
