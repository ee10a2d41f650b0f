"""Step-time attribution on one rank: every nanosecond of a step window goes to exactly one leaf.

A step's window is [its first GPU activity, the next step's first GPU activity) (the last step:
its GPU span), so the leaves add up to the step's ``step_time_us`` exactly. Leaves, in priority
order (an instant covered by several kinds of work counts once, in the first that covers it):

- ``compute_only``: a compute kernel runs (whatever else runs beside it);
- ``exposed_comm``: a communication kernel runs and no compute does (split later, with the other
  ranks' traces, into waiting for late peers and transfer: analyzer.job.attribution);
- ``other_gpu``: only copies, memsets or stream syncs run;
- ``idle``: nothing runs on the GPU.

Idle is split first by whether the GPU had work. Each idle gap ends where the next GPU work
starts; that work's launch (its runtime call, by correlation id) says whether the host had
issued it: the part of the gap until ``LAUNCH_LATENCY_NS`` after the launch is **host** idle (the
GPU starved: nothing was launched), the rest is **queued** idle (the work was launched and
waited behind a dependency). The host part is split by what the CPU trace shows the host doing:
``input`` (inside ``enumerate(DataLoader)…``), ``device_sync`` (inside a blocking call:
``cudaStreamSynchronize`` / ``cudaEventSynchronize`` / ``aten::item``, a copy to pageable memory
(``cudaMemcpyAsync`` of a "Memcpy DtoH (Device -> Pageable)"), or a gap that began while the host
was blocked in one: the sync drained the queue), ``allocator`` (inside the device allocator's own
calls: ``cudaFree`` / ``hipFree`` / ``cudaMalloc`` / ``cudaHostAlloc`` …, ``empty_cache``, or a gap
that began in one: each free synchronizes the device, which drains the queue as a sync does;
analyzer.ingest.classify.HOST_ALLOC_NAMES), ``contention`` (inside host ops running far
beyond their usual length: the process was descheduled), ``fsdp`` (inside FSDP's own hooks),
``launch`` (a short gap before work launched only after the GPU went idle: launch overhead),
``unknown``; the unknown part is split again by the phase of the work whose launch ended it
(``idle_unknown_by_phase``: forward, backward, optimizer, other): where in the step the host was
busy with its own work. The queued part is split by what the work waited on: ``graph`` (work of a CUDA graph
launch: GPU ops sharing one launch's correlation id), ``collective`` (a communication kernel),
``copy`` (a memcpy / memset), ``event`` (anything else: a stream waiting on an event of another
stream, another GPU or the host).

Times are absolute nanoseconds on the rank's clock; the exposed-communication intervals are kept
(``exposed_ns``) so the job analysis can split them by the cross-rank wait of each collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.ingest.trace import GpuEvents, GpuKind, Marker, RankTrace
from analyzer.rank.timeline import OTHER, PHASES, ns_to_us

LEAVES = ("compute_only_us", "exposed_comm_us", "other_gpu_us", "idle_us")
# The host part of idle, by what the host was doing (in priority order; unknown: the rest).
IDLE_CAUSES = ("input", "device_sync", "allocator", "contention", "fsdp", "launch", "unknown")
# The queued part, by what the launched work waited on (in priority order).
QUEUED_CAUSES = ("graph", "collective", "copy", "event")
# A gap up to this long before work launched after the GPU went idle is the host's launch
# latency (a kernel launch costs ~5-20 µs of CPU): the host issues kernels no faster than they run.
LAUNCH_GAP_NS = 100_000
# Launched work starts on an idle GPU within this (measured: at most 41 µs after the launch call
# began on V100, A100 and H200 traces): until then the gap is still the launch's.
LAUNCH_LATENCY_NS = 50_000
# The copies whose runtime call blocks the host until the copy is done (CUDA: a device-to-host
# copy to pageable memory returns once the copy has completed).
BLOCKING_COPY_PREFIX, BLOCKING_COPY_TAG = "Memcpy DtoH", "Pageable"
# Of the queued ops, how many the breakdown names per step (by queued time).
QUEUED_OPS_SHOWN = 3


def step_window(first_ns: int, step_time_us: float) -> tuple[int, int]:
    """[start, end) ns of a step whose first GPU activity is ``first_ns``."""
    return first_ns, first_ns + int(round(step_time_us * 1000))


class RankTimeline:
    """The rank's GPU unions and host ranges, built once and clipped to every step window: the
    data loader, the blocking calls, the host ops running far beyond their usual length
    (analyzer.ingest.hostops) and FSDP's hooks."""

    def __init__(self, trace: RankTrace, gpu: GpuEvents, launch_ts: np.ndarray, phase: np.ndarray | None = None):
        kind = gpu.kind
        self.strings = trace.strings
        self.compute = _union(gpu, kind == GpuKind.COMPUTE)
        self.exposed = iv.subtract(_union(gpu, kind == GpuKind.COMM), self.compute)
        self.busy = iv.union(gpu.ts, gpu.end)
        m = trace.markers
        self.input = _marker_union(m, Marker.HOST_INPUT)
        self.sync = _blocking_calls(trace, gpu, m)
        self.alloc = _marker_union(m, Marker.HOST_ALLOC)
        alloc = m.kind == Marker.HOST_ALLOC
        self._alloc_calls = (m.ts[alloc], m.end[alloc], m.name[alloc])
        self.contention = _marker_union(m, Marker.HOST_INFLATED)
        self.fsdp = _fsdp_hooks(trace)
        inflated = m.kind == Marker.HOST_INFLATED
        self._inflated = (m.ts[inflated], m.end[inflated], m.name[inflated])
        self._usual = getattr(trace, "host_op_medians", {})
        self._split_gaps(gpu, launch_ts, np.full(len(gpu), OTHER, np.int8) if phase is None else phase)

    def _split_gaps(self, gpu: GpuEvents, launch_ts: np.ndarray, phase: np.ndarray) -> None:
        """Each gap between two busy stretches, cut where the work that ends it could start (its
        launch + the launch latency): before, the host's; after, queued. The work ending a gap:
        of the GPU events starting where the gap ends, the earliest launched."""
        starts, ends = self.busy
        self.gap_start, self.gap_end = ends[:-1], starts[1:]
        unknown = np.iinfo(np.int64).max
        key = np.where(launch_ts >= 0, launch_ts, unknown)
        order = np.lexsort((key, gpu.ts))
        at = np.searchsorted(gpu.ts[order], self.gap_end, side="left")
        first = order[np.minimum(at, max(len(order) - 1, 0))] if len(order) else np.zeros(0, np.int64)
        launch = launch_ts[first] if len(first) else np.zeros(0, np.int64)
        self.gap_launch = launch
        linked = launch >= 0
        split = np.where(linked, np.clip(launch + LAUNCH_LATENCY_NS, self.gap_start, self.gap_end), self.gap_end)
        self.host = _nonempty(self.gap_start, split)
        # the phase of the work that ends each gap: where in the step the host was getting to
        self.gap_phase = phase[first] if len(first) else np.zeros(0, np.int8)
        self.host_by_phase = [_nonempty(self.gap_start[self.gap_phase == code], split[self.gap_phase == code])
                              for code in range(len(PHASES))]
        self.queued_sets = {}
        cause = self.gap_cause = _queued_cause(gpu, first)
        for code, name in enumerate(QUEUED_CAUSES):
            chosen = cause == code
            self.queued_sets[name] = _nonempty(split[chosen], self.gap_end[chosen])
        self.queued = _nonempty(split, self.gap_end)
        self.queued_op = gpu.name[first] if len(first) else np.zeros(0, np.int32)
        # The copies that ended queued gaps, where nothing else runs beside them: a fix that
        # overlaps the copy (pinned memory, prefetch) gives that back too.
        waited = first[(cause == QUEUED_CAUSES.index("copy")) & (self.gap_end > split)]
        copies = iv.union(gpu.ts[waited], gpu.end[waited])
        self.waited_copies = iv.subtract(iv.subtract(copies, self.compute), self.exposed)
        self.unlinked = _nonempty(self.gap_start[~linked], self.gap_end[~linked])

    def steps(self, starts: np.ndarray, ends: np.ndarray) -> list[tuple[dict[str, Any], list[int]]]:
        """For each window [starts[k], ends[k]): (leaves in µs + idle causes, its exposed-
        communication intervals flat: [start, end, start, end, ...]). Every window at once, in
        whole nanoseconds; a window that ends before it starts holds nothing, all of it idle
        (unknown), its leaves still adding up to its length."""
        ends_at_least = np.maximum(ends, starts)
        compute_ns = iv.covered_length(self.compute, starts, ends_at_least).tolist()
        comm_ns = iv.covered_length(self.exposed, starts, ends_at_least).tolist()
        busy = iv.covered_length(self.busy, starts, ends_at_least)
        busy_ns = busy.tolist()
        causes, unknown_by_phase = self._host_causes(starts, ends_at_least)
        queued = {name: iv.covered_length(s, starts, ends_at_least).tolist() for name, s in self.queued_sets.items()}
        in_sync = iv.covered_length(iv.intersect(self.queued, self.sync), starts, ends_at_least).tolist()
        unlinked = iv.covered_length(self.unlinked, starts, ends_at_least).tolist()
        copies = iv.covered_length(self.waited_copies, starts, ends_at_least).tolist()
        ops = self._queued_ops(starts, ends_at_least)
        inflated = self._inflated_ops(starts, ends_at_least) if len(self._inflated[0]) else [{}] * len(starts)
        allocs = self._allocator_calls(starts, ends_at_least) if len(self._alloc_calls[0]) else [{}] * len(starts)
        window, exposed_starts, exposed_ends = iv.clip_each(self.exposed, starts, ends_at_least)
        flat = np.stack([exposed_starts, exposed_ends], axis=1).ravel().tolist()
        cuts = (2 * np.searchsorted(window, np.arange(len(starts) + 1))).tolist()
        out = []
        for k, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
            idle_ns = (end - start) - busy_ns[k]
            by_wait = {name: ns[k] for name, ns in queued.items()}
            found = {cause: ns[k] for cause, ns in causes.items()}
            # what no range explains, and any idle outside every gap (a window past the GPU span)
            found["unknown"] = idle_ns - sum(found.values()) - sum(by_wait.values())
            host_ns = idle_ns - sum(by_wait.values())
            in_phase = {name: ns[k] for name, ns in unknown_by_phase.items()}
            in_phase["other"] += found["unknown"] - sum(in_phase.values())  # idle past the GPU span: no next work
            out.append(({
                "compute_only_us": ns_to_us(compute_ns[k]),
                "exposed_comm_us": ns_to_us(comm_ns[k]),
                "other_gpu_us": ns_to_us(busy_ns[k] - compute_ns[k] - comm_ns[k]),
                "idle_us": ns_to_us(idle_ns),
                "idle_by_host": {cause: ns_to_us(found[cause]) for cause in IDLE_CAUSES},
                "idle_unknown_by_phase": {name: ns_to_us(ns) for name, ns in in_phase.items()},
                "idle_host_us": ns_to_us(host_ns),
                "idle_queued_us": ns_to_us(idle_ns - host_ns),
                "idle_queued_by": {name: ns_to_us(ns) for name, ns in by_wait.items()},
                "idle_queued_in_sync_us": ns_to_us(in_sync[k]),
                "idle_queued_ops": ops[k],
                "idle_unlinked_us": ns_to_us(unlinked[k]),
                "queued_copies_us": ns_to_us(copies[k]),
                **({"inflated_ops": inflated[k]} if inflated[k] else {}),
                **({"allocator_calls": allocs[k]} if allocs[k] else {}),
            }, flat[cuts[k]:cuts[k + 1]]))
        return out

    def _inflated_ops(self, starts: np.ndarray, ends: np.ndarray) -> list[dict[str, dict[str, float]]]:
        """Per window, the inflated host ops in it: the longest run of each name and its usual
        (median) length, µs, the ``QUEUED_OPS_SHOWN`` longest."""
        ts, end, name = self._inflated
        out: list[dict[str, dict[str, float]]] = [{} for _ in range(len(starts))]
        for k, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist())):
            rows = np.flatnonzero((ts < hi) & (end > lo))
            longest: dict[int, int] = {}
            for row in rows.tolist():
                longest[int(name[row])] = max(longest.get(int(name[row]), 0), int(end[row] - ts[row]))
            for n, ns in sorted(longest.items(), key=lambda kv: (-kv[1], self.strings[kv[0]]))[:QUEUED_OPS_SHOWN]:
                label = self.strings[n]
                out[k][label] = {"longest_us": ns_to_us(ns), "usual_us": self._usual.get(label)}
        return out

    def _allocator_calls(self, starts: np.ndarray, ends: np.ndarray) -> list[dict[str, dict[str, float]]]:
        """Per window, the allocator's calls that start in it by name: how many and the host time
        in them (µs, the calls' own lengths: a free waits for the device first), the
        ``QUEUED_OPS_SHOWN`` longest in total."""
        ts, end, name = self._alloc_calls
        out: list[dict[str, dict[str, float]]] = [{} for _ in range(len(starts))]
        order = np.argsort(starts, kind="stable")  # the windows by start (they do not overlap)
        at = np.searchsorted(starts[order], ts, side="right") - 1
        window = order[np.maximum(at, 0)]
        inside = (at >= 0) & (ts < ends[window])
        for k in arrays.unique(window[inside]).tolist():
            rows = inside & (window == k)
            names, index = np.unique(name[rows], return_inverse=True)
            calls = np.bincount(index)
            ns = np.bincount(index, weights=(end[rows] - ts[rows]).astype(np.float64))
            ranked = sorted(zip(names.tolist(), calls.tolist(), ns.tolist()), key=lambda c: (-c[2], self.strings[c[0]]))
            out[k] = {self.strings[n]: {"calls": c, "host_us": ns_to_us(t)} for n, c, t in ranked[:QUEUED_OPS_SHOWN]}
        return out

    def host_before(self, cpu_starts: np.ndarray, first_gpus: np.ndarray) -> list[dict[str, float]]:
        """For each step: µs the host spent in the data loader / blocking syncs between its CPU
        start and its first GPU activity (none when that comes first): a stall that delays the
        step's entry (it lies in no window)."""
        ends = np.maximum(first_gpus, cpu_starts)
        input_ns = iv.covered_length(self.input, cpu_starts, ends).tolist()
        sync_ns = iv.covered_length(self.sync, cpu_starts, ends).tolist()
        return [{"input": ns_to_us(i), "device_sync": ns_to_us(s)} for i, s in zip(input_ns, sync_ns)]

    def _host_causes(self, starts: np.ndarray, ends: np.ndarray) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """Nanoseconds of host idle per cause in each window, in priority order: the data
        loader's; then what blocking calls cover, and all of a stretch that began while the host
        was blocked in one (the sync drained the queue); then the same of the allocator's calls
        (a free synchronizes the device); then what inflated host ops cover, then
        FSDP's hooks; then the rest of a short idle gap ended by work launched after it began
        (unknown, what is left, is the caller's). And what is left in the gaps, by the phase of the
        work that ended each (the caller adds the idle outside every gap to ``other``)."""
        rest = iv.subtract(self.host, self.input)
        sync = _in_or_after(rest, self.sync)
        rest = iv.subtract(rest, sync)
        alloc = _in_or_after(rest, self.alloc)
        rest = iv.subtract(rest, alloc)
        contention = iv.intersect(rest, self.contention)
        rest = iv.subtract(rest, contention)
        fsdp = iv.intersect(rest, self.fsdp)
        rest = iv.subtract(rest, fsdp)
        host = iv.covered_length(self.host, starts, ends)
        out = {"input": host - iv.covered_length(iv.subtract(self.host, self.input), starts, ends)}
        for name, part in (("device_sync", sync), ("allocator", alloc), ("contention", contention), ("fsdp", fsdp)):
            out[name] = iv.covered_length(part, starts, ends)
        launch = self._launch_gaps(rest, starts, ends)
        out["launch"] = launch.sum(axis=0)
        unknown = {name: (iv.covered_length(iv.intersect(rest, self.host_by_phase[code]), starts, ends)
                          - launch[code]).tolist() for code, name in enumerate(PHASES)}
        return {name: values.tolist() for name, values in out.items()}, unknown

    def _launch_gaps(self, rest: iv.IntervalSet, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Nanoseconds of ``rest`` in each window in an idle gap that is short within the window
        and ended by work launched after it began (whole gaps: the data loader's and the syncs'
        parts of a gap count towards its length), by the phase of that work: one row per phase."""
        window, inside, stop = iv.clip_each(rest, starts, ends)
        if not len(inside) or not len(self.gap_end):
            return np.zeros((len(PHASES), len(starts)), dtype=np.int64)
        gap = np.searchsorted(self.gap_end, inside, side="right")  # the gap around each stretch
        gap = np.minimum(gap, len(self.gap_end) - 1)
        gap_start = np.maximum(self.gap_start[gap], starts[window])
        gap_end = np.minimum(self.gap_end[gap], ends[window])
        short = ((gap_end - gap_start) <= LAUNCH_GAP_NS) & (self.gap_launch[gap] >= self.gap_start[gap])
        ns = np.where(short, stop - inside, 0)
        return np.stack([_per_window(window, np.where(self.gap_phase[gap] == code, ns, 0), len(starts))
                         for code in range(len(PHASES))])

    def _queued_ops(self, starts: np.ndarray, ends: np.ndarray) -> list[dict[str, dict[str, float]]]:
        """Per window and what it waited on, the GPU work that waited longest (queued idle before
        it, µs), the first ``QUEUED_OPS_SHOWN`` by time then name; the causes in the order of their
        longest-waiting op (ties: QUEUED_CAUSES' order), so the dict reads most waiting first."""
        window, lo, hi = iv.clip_each(self.queued, starts, ends)
        out: list[dict[str, dict[str, float]]] = [{} for _ in range(len(starts))]
        if not len(window):
            return out
        gap = np.minimum(np.searchsorted(self.gap_end, lo, side="right"), len(self.gap_end) - 1)
        totals: list[dict[tuple[int, int], int]] = [{} for _ in range(len(starts))]
        for k, cause, name, ns in zip(window.tolist(), self.gap_cause[gap].tolist(), self.queued_op[gap].tolist(),
                                      (hi - lo).tolist()):
            totals[k][(cause, name)] = totals[k].get((cause, name), 0) + ns
        for k, by_op in enumerate(totals):
            for (cause, name), ns in sorted(by_op.items(), key=lambda kv: (-kv[1], self.strings[kv[0][1]], kv[0][0])):
                ops = out[k].setdefault(QUEUED_CAUSES[cause], {})
                if len(ops) < QUEUED_OPS_SHOWN:
                    ops[self.strings[name]] = ns_to_us(ns)
        return out


# Above this share of its idle ended by work of unknown launch, a rank's idle split is unreliable.
UNLINKED_SHARE = 0.1


def idle_split_note(trace: RankTrace, breakdowns: list[dict[str, Any]]) -> str | None:
    """Why the rank's split of idle into host-caused and queued cannot be trusted, or None: the
    trace was filtered (no flow events, and no runtime call but the launches of the GPU work it
    kept: the blocking syncs and stream waits the host made are gone), or much of its idle ends
    with work whose launch is not in it (counted as host idle)."""
    reasons = []
    launches = len(trace.launches.correlation)
    if not launches:
        reasons.append("the trace holds no launch of its GPU work (no correlated runtime calls)")
    elif trace.flow_events == 0 and trace.runtime_calls <= launches:
        reasons.append("the trace looks filtered or sampled (no flow events, and no runtime call but the "
                       "launches of the GPU work it kept): the host's blocking syncs and stream waits may be missing")
    idle = sum(tb["idle_us"] for tb in breakdowns)
    unlinked = sum(tb["idle_unlinked_us"] for tb in breakdowns)
    if launches and idle and unlinked > UNLINKED_SHARE * idle:
        reasons.append(f"{100 * unlinked / idle:.0f}% of the GPU idle ends with work whose launch is not in the "
                       "trace (counted as host idle)")
    if not reasons:
        return None
    return "the split of GPU idle into host-caused and queued is unreliable: " + "; ".join(reasons)


def _queued_cause(gpu: GpuEvents, rows: np.ndarray) -> np.ndarray:
    """Index into QUEUED_CAUSES of what each GPU event of ``rows`` waited on."""
    cause = np.full(len(rows), QUEUED_CAUSES.index("event"), dtype=np.int8)
    if not len(rows):
        return cause
    kind = gpu.kind[rows]
    cause[kind == GpuKind.MEMORY] = QUEUED_CAUSES.index("copy")
    cause[kind == GpuKind.COMM] = QUEUED_CAUSES.index("collective")
    # CUPTI gives every op of a graph launch the cudaGraphLaunch call's correlation id
    corr = gpu.correlation
    known = corr[corr >= 0]
    values, counts = np.unique(known, return_counts=True)
    shared = values[counts > 1]
    cause[np.isin(corr[rows], shared) & (corr[rows] >= 0)] = QUEUED_CAUSES.index("graph")
    return cause


def _blocking_calls(trace: RankTrace, gpu: GpuEvents, m) -> iv.IntervalSet:
    """Where the host sat in a call that waits for the device: the blocking-sync markers and the
    runtime calls of copies to pageable memory (matched to their copy by correlation id)."""
    sync = _marker_union(m, Marker.HOST_SYNC)
    names = [i for i in arrays.unique(gpu.name[gpu.kind == GpuKind.MEMORY]).tolist()
             if trace.strings[i].startswith(BLOCKING_COPY_PREFIX) and BLOCKING_COPY_TAG in trace.strings[i]]
    if not names or not len(trace.launches.correlation):
        return sync
    corr = gpu.correlation[np.isin(gpu.name, names) & (gpu.kind == GpuKind.MEMORY)]
    table = trace.launches.correlation
    idx = np.clip(np.searchsorted(table, corr), 0, len(table) - 1)
    hit = idx[(table[idx] == corr) & (corr >= 0)]
    launches = trace.launches
    return iv.union(np.concatenate([sync[0], launches.ts[hit]]), np.concatenate([sync[1], launches.end[hit]]))


def _in_or_after(rest: iv.IntervalSet, calls: iv.IntervalSet) -> iv.IntervalSet:
    """The part of ``rest`` inside ``calls``, and all of each stretch of it that began while the
    host was in one (the call drained the GPU's queue: the idle after it is the call's)."""
    blocked = iv.covered_length(calls, rest[0] - 1, rest[0]) > 0
    cover = iv.union(np.concatenate([rest[0][blocked], calls[0]]), np.concatenate([rest[1][blocked], calls[1]]))
    return iv.intersect(rest, cover)


def _per_window(window: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Sums of ``values`` by ``window`` (ascending), in whole nanoseconds, for windows 0..n-1."""
    prefix = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return np.diff(prefix[np.searchsorted(window, np.arange(n + 1))])


# FSDP's own hooks: FSDP2's "FSDP::…" ranges (pre/post forward, pre/post backward, all-gather
# and reduce-scatter bookkeeping), FSDP1's "FullyShardedDataParallel._…" (the module's own
# forward, "FullyShardedDataParallel.forward", holds its compute and is no hook).
FSDP_HOOK_PREFIXES = ("FSDP::", "FullyShardedDataParallel._")


def _fsdp_hooks(trace: RankTrace) -> iv.IntervalSet:
    m = trace.markers
    hooks = [i for i in arrays.unique(m.name).tolist() if trace.strings[i].startswith(FSDP_HOOK_PREFIXES)]
    rows = np.isin(m.name, hooks) if hooks else np.zeros(len(m.name), dtype=bool)
    return iv.union(m.ts[rows], m.end[rows])


def _nonempty(starts: np.ndarray, ends: np.ndarray) -> iv.IntervalSet:
    """Disjoint sorted intervals with the empty ones left out (a canonical set)."""
    keep = ends > starts
    return np.asarray(starts[keep], np.int64), np.asarray(ends[keep], np.int64)


def _union(gpu: GpuEvents, mask: np.ndarray) -> iv.IntervalSet:
    return iv.union(gpu.ts[mask], gpu.end[mask])


def _marker_union(m, kind: Marker) -> iv.IntervalSet:
    rows = m.kind == kind
    return iv.union(m.ts[rows], m.end[rows])
