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
    """The rank's GPU unions and host ranges, built once and clipped per step window."""

    def __init__(self, trace: RankTrace, gpu: GpuEvents, launch_ts: np.ndarray):
        kind = gpu.kind
        self.compute = _union(gpu, kind == GpuKind.COMPUTE)
        self.comm = _union(gpu, kind == GpuKind.COMM)
        self.busy = iv.union(gpu.ts, gpu.end)
        m = trace.markers
        self.input = _marker_union(m, Marker.HOST_INPUT)
        self.sync = _marker_union(m, Marker.HOST_SYNC)
        # Launch time of the GPU work that starts first at or after each instant: the work that
        # ended an idle gap (a gap ends where the next work starts).
        order = np.argsort(gpu.ts, kind="stable")
        self._next_ts, self._next_launch = gpu.ts[order], launch_ts[order]

    def step(self, start: int, end: int) -> tuple[dict[str, Any], iv.IntervalSet]:
        """(leaves in µs + idle causes, the exposed-communication intervals) of [start, end)."""
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
        return out, comm

    def host_before(self, cpu_start: int, first_gpu: int) -> dict[str, float]:
        """µs the host spent in the data loader / blocking syncs between the step's CPU start
        and its first GPU activity: a stall that delays the step's entry (it lies in no window)."""
        if first_gpu <= cpu_start:
            return {"input": 0.0, "device_sync": 0.0}
        return {"input": ns_to_us(iv.total(iv.clip(self.input, cpu_start, first_gpu))),
                "device_sync": ns_to_us(iv.total(iv.clip(self.sync, cpu_start, first_gpu)))}

    def _idle_causes(self, idle: iv.IntervalSet) -> dict[str, int]:
        """Nanoseconds of idle per host cause; they add up to the idle total."""
        rest = idle
        found = {}
        found["input"], rest = _take(rest, self.input)
        found["device_sync"], rest = _take(rest, self._sync_gaps(rest))
        found["launch"], rest = _take(rest, self._launch_gaps(idle))  # whole gaps, not their rest
        found["unknown"] = iv.total(rest)
        return found

    def _sync_gaps(self, gaps: iv.IntervalSet) -> iv.IntervalSet:
        """Inside a blocking call, or the whole of a gap that began while the host was in one."""
        starts, ends = gaps
        if not len(starts) or not len(self.sync[0]):
            return iv.EMPTY
        inside = iv.covered_length(self.sync, starts - 1, starts) > 0  # host blocked as the GPU drained
        near = iv.clip(self.sync, int(starts[0]), int(ends[-1]))
        return iv.union(np.concatenate([starts[inside], near[0]]), np.concatenate([ends[inside], near[1]]))

    def _launch_gaps(self, gaps: iv.IntervalSet) -> iv.IntervalSet:
        """Short gaps ended by work that was launched after the gap began."""
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


def _take(rest: iv.IntervalSet, cause: iv.IntervalSet) -> tuple[int, iv.IntervalSet]:
    """(ns of ``rest`` covered by ``cause``, what is left of ``rest``)."""
    taken = iv.intersect(rest, cause)
    return iv.total(taken), iv.subtract(rest, taken)


def _union(gpu: GpuEvents, mask: np.ndarray) -> iv.IntervalSet:
    return iv.union(gpu.ts[mask], gpu.end[mask])


def _marker_union(m, kind: Marker) -> iv.IntervalSet:
    rows = m.kind == kind
    return iv.union(m.ts[rows], m.end[rows])
