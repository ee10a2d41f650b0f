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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.ingest.trace import GpuEvents, GpuKind, Launches, Marker, Markers
from analyzer.rank.attribution import LAUNCH_GAP_NS, LAUNCH_LATENCY_NS, QUEUED_CAUSES, RankTimeline
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
    """RankTimeline one window at a time, its idle split by plain loops over the gaps: each gap
    between busy stretches is the host's until the launch (+ latency) of the earliest-launched
    work that ends it, queued after; the host part by the data loader, blocking syncs (and whole
    stretches that began while blocked), short gaps before late launches, the rest."""

    def __init__(self, trace, gpu, launch_ts, phase):
        kind = gpu.kind
        self.gpu, self.launch_ts = gpu, launch_ts
        self.compute = _union(gpu, kind == GpuKind.COMPUTE)
        self.comm = _union(gpu, kind == GpuKind.COMM)
        self.busy = iv.union(gpu.ts, gpu.end)
        m = trace.markers
        self.input = _marker_union(m, Marker.HOST_INPUT)
        self.sync = _marker_union(m, Marker.HOST_SYNC)
        self.gaps = []  # (start, end, launch or -1, cause, phase) of each gap between busy stretches
        starts, ends = self.busy
        for gap_start, gap_end in zip(ends[:-1].tolist(), starts[1:].tolist()):
            ending = [i for i in range(len(gpu)) if int(gpu.ts[i]) == gap_end]
            known = [i for i in ending if launch_ts[i] >= 0]
            row = min(known, key=lambda i: (int(launch_ts[i]), i)) if known else ending[0]
            cause = {GpuKind.COMM: "collective", GpuKind.MEMORY: "copy"}.get(GpuKind(int(gpu.kind[row])), "event")
            self.gaps.append((gap_start, gap_end, int(launch_ts[row]) if known else -1, cause, int(phase[row])))

    def step(self, start, end):
        compute = iv.clip(self.compute, start, end)
        comm = iv.subtract(iv.clip(self.comm, start, end), compute)
        busy = iv.clip(self.busy, start, end)
        compute_ns, comm_ns, busy_ns = iv.total(compute), iv.total(comm), iv.total(busy)
        idle_ns = (end - start) - busy_ns
        split = self._split(start, end)
        by_host = {k: ns_to_us(v) for k, v in split["host"].items()}
        out = {
            "compute_only_us": ns_to_us(compute_ns),
            "exposed_comm_us": ns_to_us(comm_ns),
            "other_gpu_us": ns_to_us(busy_ns - compute_ns - comm_ns),
            "idle_us": ns_to_us(idle_ns),
            "idle_by_host": by_host,
            "idle_unknown_by_phase": {k: ns_to_us(v) for k, v in split["own"].items()},
            "idle_host_us": ns_to_us(idle_ns - sum(split["queued"].values())),
            "idle_queued_us": ns_to_us(sum(split["queued"].values())),
            "idle_queued_by": {k: ns_to_us(v) for k, v in split["queued"].items()},
            "idle_queued_in_sync_us": ns_to_us(split["in_sync"]),
            # causes by their longest-waiting op (here each cause's one op "k"), ties in QUEUED_CAUSES' order
            "idle_queued_ops": {cause: {"k": ns_to_us(ns)} for cause, ns in sorted(
                split["queued"].items(), key=lambda kv: (-kv[1], QUEUED_CAUSES.index(kv[0]))) if ns},
            "idle_unlinked_us": ns_to_us(split["unlinked"]),
            "queued_copies_us": ns_to_us(split["copies"]),
        }
        return out, np.stack(comm, axis=1).ravel().tolist()

    def host_before(self, cpu_start, first_gpu):
        if first_gpu <= cpu_start:
            return {"input": 0.0, "device_sync": 0.0}
        return {"input": ns_to_us(iv.total(iv.clip(self.input, cpu_start, first_gpu))),
                "device_sync": ns_to_us(iv.total(iv.clip(self.sync, cpu_start, first_gpu)))}

    def _ends_gap(self, i):
        """Whether GPU event i is the one the vectorised code takes as ending its gap: of the
        events starting there, the earliest launched (unknown launches last, then row order)."""
        ts = int(self.gpu.ts[i])
        same = [j for j in range(len(self.gpu)) if int(self.gpu.ts[j]) == ts]
        known = [j for j in same if self.launch_ts[j] >= 0]
        chosen = min(known, key=lambda j: (int(self.launch_ts[j]), j)) if known else same[0]
        return chosen == i

    def _split(self, start, end):
        host, queued = [], {"graph": [], "collective": [], "copy": [], "event": []}
        unlinked = []
        by_phase = [[] for _ in PHASES]
        for gap_start, gap_end, launch, cause, phase in self.gaps:
            cut = gap_end if launch < 0 else min(max(launch + LAUNCH_LATENCY_NS, gap_start), gap_end)
            host.append((gap_start, cut))
            by_phase[phase].append((gap_start, cut))
            queued[cause].append((cut, gap_end))
            if launch < 0:
                unlinked.append((gap_start, gap_end))
        host_set = _set(host)
        rest = iv.subtract(host_set, self.input)
        blocked = [(s, e) for s, e in zip(rest[0].tolist(), rest[1].tolist())
                   if iv.total(iv.clip(self.sync, s - 1, s))]
        synced = iv.intersect(rest, iv.union(np.concatenate([_set(blocked)[0], self.sync[0]]),
                                             np.concatenate([_set(blocked)[1], self.sync[1]])))
        rest = iv.subtract(rest, synced)
        late = []
        for s, e in zip(*(a.tolist() for a in iv.clip(rest, start, end))):
            gap_start, gap_end, launch, _, _ = next(g for g in self.gaps if g[0] <= s < g[1])
            if min(gap_end, end) - max(gap_start, start) <= LAUNCH_GAP_NS and launch >= gap_start:
                late.append((s, e))
        launched = _set(late)

        def within(ranges):
            return iv.total(iv.clip(ranges, start, end)) if end > start else 0

        found = {"input": within(host_set) - within(iv.subtract(host_set, self.input)),
                 "device_sync": within(synced), "allocator": 0, "contention": 0, "fsdp": 0, "launch": within(launched)}
        waits = {cause: within(_set(parts)) for cause, parts in queued.items()}
        idle_ns = (end - start) - iv.total(iv.clip(self.busy, start, end))
        found["unknown"] = idle_ns - sum(found.values()) - sum(waits.values())
        # the rest by the phase of the work ending its gap, less its short gaps; idle outside every gap: other
        own = {name: within(iv.intersect(rest, _set(parts))) - within(iv.intersect(launched, _set(parts)))
               for name, parts in zip(PHASES, by_phase)}
        own["other"] += found["unknown"] - sum(own.values())
        copies = [(int(self.gpu.ts[i]), int(self.gpu.end[i])) for i in range(len(self.gpu))
                  if self.gpu.kind[i] == GpuKind.MEMORY
                  and any(g[1] == self.gpu.ts[i] and g[3] == "copy" and g[2] >= 0
                          and min(max(g[2] + LAUNCH_LATENCY_NS, g[0]), g[1]) < g[1] for g in self.gaps)
                  and self._ends_gap(i)]
        alone = iv.subtract(iv.subtract(_set(copies), self.compute), iv.subtract(self.comm, self.compute))
        return {"host": found, "own": own, "queued": waits, "unlinked": within(_set(unlinked)), "copies": within(alone),
                "in_sync": within(iv.intersect(_set([p for parts in queued.values() for p in parts]), self.sync))}


def _set(pairs):
    pairs = [(s, e) for s, e in pairs if e > s]
    return iv.union(np.array([s for s, _ in pairs], np.int64), np.array([e for _, e in pairs], np.int64))


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


def timeline_trace(kernels, kinds, launches, host_input, host_sync, jitter, phases=(3,)):
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
    none = np.zeros(0, np.int64)
    phase = np.array((list(phases) * len(kernels))[:len(kernels)], dtype=np.int8)
    return SimpleNamespace(markers=markers, strings=["k"], launches=Launches(none, none, none.astype(np.int32), none)), \
        gpu, launch_ts, phase


@settings(max_examples=400, deadline=None)
@given(spans, st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=5),
       st.lists(st.integers(0, 8), min_size=1, max_size=5), spans, spans,
       st.lists(st.tuples(st.integers(-10, 210), st.integers(-20, 80)), min_size=1, max_size=8),
       st.integers(-3, 3), st.lists(st.integers(-1, 1), min_size=1, max_size=5),
       st.lists(st.integers(0, len(PHASES) - 1), min_size=1, max_size=5))
# one window queued behind two causes, the later one longer: the longer one's cause comes first
@example(kernels=[(84, 1), (82, 1), (0, 1)], kinds=[1, 0], launches=[0], host_input=[], host_sync=[],
         windows=[(81, 6)], skew=1, jitter=[0], phases=[0])
def test_every_window_at_once_is_window_by_window(kernels, kinds, launches, host_input, host_sync, windows, skew,
                                                  jitter, phases):
    trace, gpu, launch_ts, phase = timeline_trace(kernels, kinds, launches, host_input, host_sync, jitter, phases)
    starts = np.array([s * SCALE + skew for s, _ in windows], dtype=np.int64)
    ends = starts + np.array([n * SCALE // 3 for _, n in windows], dtype=np.int64)
    plain = PlainTimeline(trace, gpu, launch_ts, phase)
    want = [plain.step(start, end) for start, end in zip(starts.tolist(), ends.tolist())]
    timeline = RankTimeline(trace, gpu, launch_ts, phase)
    assert_same(timeline.steps(starts, ends), want)
    # The same windows as (CPU start, first GPU activity) pairs, either way round.
    want = [plain.host_before(start, end) for start, end in zip(starts.tolist(), ends.tolist())]
    assert_same(timeline.host_before(starts, ends), want)


@settings(max_examples=200, deadline=None)
@given(spans, st.lists(st.tuples(st.integers(-10, 210), st.integers(-20, 80)), min_size=1, max_size=8))
def test_first_marker_within_each_window(backward, windows):
    trace, _, _, _ = timeline_trace([], [0], [0], [], backward, [0])
    trace.markers.kind[:] = Marker.BACKWARD
    starts = np.array([s * SCALE for s, _ in windows], dtype=np.int64)
    ends = starts + np.array([n * SCALE for _, n in windows], dtype=np.int64)
    begins = trace.markers.ts
    want = []
    for start, end in zip(starts, ends):  # as _per_step did
        inside = begins[(begins >= start) & (begins <= end)]
        want.append(int(inside.min()) if len(inside) else None)
    assert_same(_first_within(trace, Marker.BACKWARD, starts, ends), want)
