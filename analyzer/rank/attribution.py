"""Step-time attribution on one rank: every nanosecond of a step window goes to exactly one leaf.

A step's window is [its first GPU activity, the next step's first GPU activity) (the last step:
its GPU span), so the leaves add up to the step's ``step_time_us`` exactly. Leaves, in priority
order (an instant covered by several kinds of work counts once, in the first that covers it):

- ``compute_only``: a compute kernel runs (whatever else runs beside it);
- ``exposed_comm``: a communication kernel runs and no compute does (split later, with the other
  ranks' traces, into waiting for late peers and transfer: analyzer.job.attribution);
- ``other_gpu``: only copies, memsets or stream syncs run;
- ``idle``: nothing runs on the GPU. Idle is split by what the CPU trace shows the host doing:
  ``input`` (inside ``enumerate(DataLoader)…``), ``device_sync`` (inside a blocking call such as
  ``cudaStreamSynchronize`` / ``aten::item``, or a gap that began while the host was blocked in
  one: the sync drained the queue, so nothing was queued behind it), ``launch`` (a short gap
  before work the host launched only after the GPU went idle: launch overhead), ``unknown``.

Times are absolute nanoseconds on the rank's clock; the exposed-communication intervals are kept
(``exposed_ns``) so the job analysis can split them by the cross-rank wait of each collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.base import intervals as iv
from analyzer.ingest.trace import GpuEvents, GpuKind, Marker, RankTrace
from analyzer.rank.timeline import ns_to_us

LEAVES = ("compute_only_us", "exposed_comm_us", "other_gpu_us", "idle_us")
IDLE_CAUSES = ("input", "device_sync", "launch", "unknown")
# A gap up to this long before work launched after the GPU went idle is the host's launch
# latency (a kernel launch costs ~5-20 µs of CPU): the host issues kernels no faster than they run.
LAUNCH_GAP_NS = 100_000


def step_window(first_ns: int, step_time_us: float) -> tuple[int, int]:
    """[start, end) ns of a step whose first GPU activity is ``first_ns``."""
    return first_ns, first_ns + int(round(step_time_us * 1000))


class RankTimeline:
    """The rank's GPU unions and host ranges, built once and clipped to every step window."""

    def __init__(self, trace: RankTrace, gpu: GpuEvents, launch_ts: np.ndarray):
        kind = gpu.kind
        self.compute = _union(gpu, kind == GpuKind.COMPUTE)
        self.exposed = iv.subtract(_union(gpu, kind == GpuKind.COMM), self.compute)
        self.busy = iv.union(gpu.ts, gpu.end)
        m = trace.markers
        self.input = _marker_union(m, Marker.HOST_INPUT)
        self.sync = _marker_union(m, Marker.HOST_SYNC)
        # Idle: what busy leaves of a window; the rest, which the causes after the data loader
        # share: what busy and the data loader leave.
        self.idle = iv.gaps(self.busy)
        self.rest = iv.gaps(iv.union(np.concatenate([self.busy[0], self.input[0]]),
                                     np.concatenate([self.busy[1], self.input[1]])))
        # Launch time of the GPU work that starts first at or after each instant: the work that
        # ended an idle gap (a gap ends where the next work starts).
        order = np.argsort(gpu.ts, kind="stable")
        self._next_ts, self._next_launch = gpu.ts[order], launch_ts[order]

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
        causes = self._idle_causes(starts, ends_at_least, (ends_at_least - starts) - busy)
        window, exposed_starts, exposed_ends = iv.clip_each(self.exposed, starts, ends_at_least)
        flat = np.stack([exposed_starts, exposed_ends], axis=1).ravel().tolist()
        cuts = (2 * np.searchsorted(window, np.arange(len(starts) + 1))).tolist()
        out = []
        for k, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
            idle_ns = (end - start) - busy_ns[k]
            found = {cause: ns[k] for cause, ns in causes.items()}
            found["unknown"] = idle_ns - sum(found.values())
            out.append(({
                "compute_only_us": ns_to_us(compute_ns[k]),
                "exposed_comm_us": ns_to_us(comm_ns[k]),
                "other_gpu_us": ns_to_us(busy_ns[k] - compute_ns[k] - comm_ns[k]),
                "idle_us": ns_to_us(idle_ns),
                "idle_by_host": {cause: ns_to_us(ns) for cause, ns in found.items()},
            }, flat[cuts[k]:cuts[k + 1]]))
        return out

    def host_before(self, cpu_starts: np.ndarray, first_gpus: np.ndarray) -> list[dict[str, float]]:
        """For each step: µs the host spent in the data loader / blocking syncs between its CPU
        start and its first GPU activity (none when that comes first): a stall that delays the
        step's entry (it lies in no window)."""
        ends = np.maximum(first_gpus, cpu_starts)
        input_ns = iv.covered_length(self.input, cpu_starts, ends).tolist()
        sync_ns = iv.covered_length(self.sync, cpu_starts, ends).tolist()
        return [{"input": ns_to_us(i), "device_sync": ns_to_us(s)} for i, s in zip(input_ns, sync_ns)]

    def _idle_causes(self, starts: np.ndarray, ends: np.ndarray, idle_ns: np.ndarray) -> dict[str, list[int]]:
        """Nanoseconds of idle per host cause in each window (``idle_ns`` of idle in each), in
        priority order, but unknown (what is left): the data loader's; then what blocking calls
        cover of each piece of the rest, all of a piece that began while the host was blocked in
        one (the sync drained the queue); then the rest of a short idle gap ended by work
        launched after it began."""
        n = len(starts)
        window, rest_starts, rest_ends = iv.clip_each(self.rest, starts, ends)
        length = rest_ends - rest_starts
        blocked = iv.covered_length(self.sync, rest_starts - 1, rest_starts) > 0  # host blocked as the GPU drained
        synced = np.where(blocked, length, iv.covered_length(self.sync, rest_starts, rest_ends))
        launch = self._launch_gap(window, rest_starts, starts, ends)
        return {"input": (idle_ns - _per_window(window, length, n)).tolist(), "device_sync": _per_window(window, synced, n).tolist(),
                "launch": _per_window(window, np.where(launch, length - synced, 0), n).tolist()}

    def _launch_gap(self, window: np.ndarray, inside: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Is the idle gap around each instant ``inside`` (in window ``window``) short and ended
        by work that was launched after it began? Whole gaps: the data loader's and the syncs'
        parts of a gap count towards its length."""
        if not len(self._next_ts):
            return np.zeros(len(inside), dtype=bool)
        gap = np.searchsorted(self.busy[0], inside, side="right")  # the busy intervals before it
        gap_start = np.maximum(self.idle[0][gap], starts[window])
        gap_end = np.minimum(self.idle[1][gap], ends[window])
        idx = np.searchsorted(self._next_ts, gap_end, side="left")
        has_next = idx < len(self._next_ts)
        launch = np.where(has_next, self._next_launch[np.minimum(idx, len(self._next_ts) - 1)], -1)
        return ((gap_end - gap_start) <= LAUNCH_GAP_NS) & has_next & (launch >= gap_start)


def _per_window(window: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Sums of ``values`` by ``window`` (ascending), in whole nanoseconds, for windows 0..n-1."""
    prefix = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return np.diff(prefix[np.searchsorted(window, np.arange(n + 1))])


def _union(gpu: GpuEvents, mask: np.ndarray) -> iv.IntervalSet:
    return iv.union(gpu.ts[mask], gpu.end[mask])


def _marker_union(m, kind: Marker) -> iv.IntervalSet:
    rows = m.kind == kind
    return iv.union(m.ts[rows], m.end[rows])
