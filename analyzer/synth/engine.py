"""A small CPU/GPU-stream simulator, vectorised over ranks.

Every rank runs the same program, so each recorded event holds one start time per rank (numpy
int64, nanoseconds). CPU threads advance as they enter ops and launch work; each GPU stream runs
its work in order: a kernel starts when it has been launched, its stream is free and the events
it waits on have happened. A collective additionally ends, on every member of its group, at the
latest member's start plus its transfer time, so early ranks wait for late ones.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

LAUNCH_LATENCY_NS = 2_500  # runtime call start -> earliest kernel start
STREAM_GAP_US = 1.2  # a queued kernel starts ~1 µs after the previous one on its stream ends
CUDA_LAUNCH_KERNEL, CUDA_LAUNCH_KERNEL_EXC, CUDA_MEMCPY_ASYNC, CUDA_MEMSET_ASYNC = 211, 430, 41, 51
CUDA_EVENT_RECORD, CUDA_STREAM_WAIT_EVENT, CUDA_STREAM_SYNCHRONIZE = 135, 147, 131
CUDA_FREE = 22  # cudaFree_v3020


@dataclass
class CpuRange:
    name: str
    cat: str  # cpu_op | user_annotation
    thread: str  # main | autograd
    start: np.ndarray
    ext: int
    args: dict
    end: np.ndarray | None = None
    comm: "CollectiveCall | None" = None  # record_param_comms carries the collective's args
    recorded: bool = True  # False: a range the program keeps (a step) that the trace does not show


@dataclass
class RuntimeCall:
    name: str
    thread: str
    start: np.ndarray
    dur: np.ndarray
    corr: int
    ext: int
    cbid: int
    launches_gpu: bool
    blocks: bool = False  # the host waits in the call for the device (a copy to pageable memory)
    descheduled: bool = False  # the thread lost its core during the call (CPU contention)


@dataclass
class GpuEvent:
    name: str
    cat: str  # kernel | gpu_memcpy | gpu_memset
    kind: str  # compute | comm | memory
    stream: int
    start: np.ndarray
    dur: np.ndarray
    corr: int
    ext: int
    step: int
    phase: str
    args: dict
    comm: "CollectiveCall | None" = None
    # The op whose FLOPs this kernel does (Engine.work when it was launched): the truth's own
    # count of FLOPs and their kernels' time (never rendered into the trace).
    work: "Work | None" = None


@dataclass(frozen=True)
class Work:
    """A leaf op's FLOPs as the generator issued them: its family, the sizes it multiplied, and
    its FLOPs counted by the convention of models.md §6 (2·m·n·k; attention 4·b·h·s²·d, half
    when causal, backward 2.5×), worked out here from the generator's own sizes."""

    op: str
    family: str  # gemm | attention
    dtype: str
    flops: float
    shape: tuple  # gemm: (m, n, k); attention: (b, heads, seq, head_dim, backward)


@dataclass
class GpuAnnotation:
    name: str
    stream: int
    start: np.ndarray
    dur: np.ndarray
    ext: int


@dataclass
class CollectiveCall:
    """Everything known about one collective, shared by its CPU op, kernel and the truth."""

    kind: str  # allreduce | allgather | reduce_scatter
    c10d_name: str  # record_param_comms "Collective name"
    dtype: str  # bf16 | fp32 ...
    in_nelems: int
    out_nelems: int
    size_bytes: int  # S of the cost model
    role: str  # world | shard | replicate
    transfer_ns: int
    ready: np.ndarray | None = None
    labels: np.ndarray | None = None
    seq_index: int = 0  # position among this role's collectives in the profile
    seq: int = 0  # ProcessGroupNCCL sequence number ("Seq"), set once the run is complete
    tag: dict = field(default_factory=dict)  # bucket / unit for the truth


class Engine:
    def __init__(self, world_size: int, seed: int, noise: float, launch_us: float, op_us: float):
        self.world_size = world_size
        self.rng = np.random.default_rng(seed)
        self.noise = noise
        self.launch_us = launch_us
        self.op_us = op_us
        threads = ("main", "autograd", "loader")  # loader: a data loader's prefetching thread
        self.cpu = {name: np.zeros(world_size, np.int64) for name in threads}
        self.tail: dict[int, np.ndarray] = {}
        self.stack: dict[str, list[CpuRange]] = {name: [] for name in threads}
        self.cpu_ranges: list[CpuRange] = []
        self.runtime: list[RuntimeCall] = []
        self.gpu: list[GpuEvent] = []
        self.annotations: list[GpuAnnotation] = []
        self.collectives: list[CollectiveCall] = []
        self.step = 0
        self.phase = "other"
        self._next_ext = 1
        self._next_corr = 19_761  # CUPTI correlation ids count from process start, not from the profile
        self._role_counts: dict[str, int] = {}
        self.work: Work | None = None  # the leaf op with FLOPs being issued (analyzer.synth.compute)
        # CPU contention: every `every`-th runtime call of the training threads loses its core
        # for `us` (Program sets it from the spec; 0: none).
        self.contention_us, self.contention_every, self._calls = 0.0, 1, 0

    # ---- time helpers ---------------------------------------------------------------------
    def jitter_ns(self, us: float | np.ndarray, sigma: float | None = None) -> np.ndarray:
        """us (scalar or per rank) as ns with seeded multiplicative noise, at least 1 ns."""
        sigma = self.noise if sigma is None else sigma
        factor = 1.0 + sigma * self.rng.standard_normal(self.world_size)
        ns = np.rint(np.asarray(us, dtype=float) * 1e3 * np.clip(factor, 0.5, 1.5))
        return np.maximum(ns.astype(np.int64), 1)

    def stream_tail(self, stream: int) -> np.ndarray:
        return self.tail.setdefault(stream, np.zeros(self.world_size, np.int64))

    def queue_free(self, stream: int) -> np.ndarray:
        """When the stream can start its next kernel: after the previous one, plus a small gap."""
        return self.stream_tail(stream) + self.jitter_ns(STREAM_GAP_US, 0.3)

    def advance(self, thread: str, us: float) -> None:
        self.cpu[thread] = self.cpu[thread] + self.jitter_ns(us, 0.1)

    # ---- CPU ranges -----------------------------------------------------------------------
    @contextmanager
    def op(self, name: str, thread: str = "main", cat: str = "cpu_op", args: dict | None = None):
        rec = CpuRange(name, cat, thread, self.cpu[thread].copy(), self._ext(), dict(args or {}))
        self.cpu_ranges.append(rec)
        self.stack[thread].append(rec)
        self.advance(thread, self.op_us)
        try:
            yield rec
        finally:
            self.advance(thread, self.op_us * 0.3)
            rec.end = self.cpu[thread].copy()
            self.stack[thread].pop()

    def annotation(self, name: str, thread: str = "main"):
        return self.op(name, thread, cat="user_annotation")

    def _ext(self) -> int:
        self._next_ext += 1
        return self._next_ext - 1

    def _linked_ext(self, thread: str) -> int:
        """Kineto links GPU work to the innermost enclosing cpu_op (else the innermost range)."""
        stack = self.stack[thread]
        for rec in reversed(stack):
            if rec.cat == "cpu_op":
                return rec.ext
        return stack[-1].ext if stack else 0

    def _runtime(self, name: str, thread: str, cbid: int, launches_gpu: bool, us: float | None = None,
                 sigma: float = 0.15):
        self._next_corr += 1
        start = self.cpu[thread].copy()
        dur = self.jitter_ns(self.launch_us if us is None else us, sigma)
        descheduled = False
        if self.contention_us and thread != "loader":
            self._calls += 1
            if self._calls % self.contention_every == 0:
                dur, descheduled = dur + self.jitter_ns(self.contention_us, 0.1), True
        call = RuntimeCall(name, thread, start, dur, self._next_corr - 1, self._linked_ext(thread), cbid, launches_gpu,
                           descheduled=descheduled)
        self.runtime.append(call)
        self.cpu[thread] = start + dur
        return call

    # ---- GPU work -------------------------------------------------------------------------
    def launch(
        self,
        name: str,
        stream: int,
        dur_ns: np.ndarray,
        thread: str = "main",
        kind: str = "compute",
        cat: str = "kernel",
        args: dict | None = None,
        after: np.ndarray | None = None,
    ) -> GpuEvent:
        api, cbid = {
            "kernel": ("cudaLaunchKernel", CUDA_LAUNCH_KERNEL),
            "gpu_memcpy": ("cudaMemcpyAsync", CUDA_MEMCPY_ASYNC),
            "gpu_memset": ("cudaMemsetAsync", CUDA_MEMSET_ASYNC),
        }[cat]
        if kind == "comm":
            api, cbid = "cudaLaunchKernelExC", CUDA_LAUNCH_KERNEL_EXC
        call = self._runtime(api, thread, cbid, True)
        start = np.maximum(call.start + LAUNCH_LATENCY_NS, self.queue_free(stream))
        if after is not None:
            start = np.maximum(start, after)
        event = GpuEvent(name, cat, kind, stream, start, np.asarray(dur_ns, np.int64), call.corr, call.ext,
                         self.step, self.phase, dict(args or {}), work=self.work if kind == "compute" else None)
        self.tail[stream] = start + event.dur
        self.gpu.append(event)
        return event

    def copy_from_pageable(self, name: str, stream: int, nbytes: float, host_gbps: float, pcie_gbps: float,
                           thread: str) -> GpuEvent:
        """cudaMemcpyAsync from pageable host memory: the driver first stages the bytes into a
        pinned buffer (a host memcpy at ``host_gbps``; the calling thread sits in the call
        meanwhile), then the DMA runs on the stream at ``pcie_gbps``: the copy, launched at the
        call, cannot start before its bytes are staged, whatever the GPU is doing."""
        call = self._runtime("cudaMemcpyAsync", thread, CUDA_MEMCPY_ASYNC, True, nbytes / (host_gbps * 1e3),
                             self.noise)  # a bulk host memcpy runs at a steady rate
        staged = call.start + call.dur
        start = np.maximum(staged, self.queue_free(stream))
        event = GpuEvent(name, "gpu_memcpy", "memory", stream, start, self.jitter_ns(2.0 + nbytes / (pcie_gbps * 1e3)),
                         call.corr, call.ext, self.step, self.phase, {"bytes": int(nbytes)})
        self.tail[stream] = start + event.dur
        self.gpu.append(event)
        return event

    def copy_to_pageable(self, name: str, stream: int, nbytes: float, pcie_gbps: float, thread: str) -> GpuEvent:
        """cudaMemcpyAsync to pageable host memory: the copy runs once the stream's earlier work
        is done, and the call returns only when it has completed (and the bytes are copied out
        of the staging buffer): the host waits for the device."""
        call = self._runtime("cudaMemcpyAsync", thread, CUDA_MEMCPY_ASYNC, True)
        call.blocks = True
        start = np.maximum(call.start + LAUNCH_LATENCY_NS, self.queue_free(stream))
        event = GpuEvent(name, "gpu_memcpy", "memory", stream, start, self.jitter_ns(1.5 + nbytes / (pcie_gbps * 1e3)),
                         call.corr, call.ext, self.step, self.phase, {"bytes": int(nbytes)})
        self.tail[stream] = start + event.dur
        self.gpu.append(event)
        done = start + event.dur + 2_000
        call.dur = np.maximum(call.dur, done - call.start)
        self.cpu[thread] = call.start + call.dur
        return event

    def record_event(self, stream: int, thread: str = "main") -> np.ndarray:
        """cudaEventRecord: the time everything enqueued on the stream so far is done."""
        self._runtime("cudaEventRecord", thread, CUDA_EVENT_RECORD, False, 1.0)
        return self.stream_tail(stream).copy()

    def depend_on(self, stream: int, thread: str = "main") -> np.ndarray:
        """cudaEventRecord on `stream` + cudaStreamWaitEvent on another: returns when the other
        stream may proceed (everything enqueued on `stream` so far is done)."""
        ready = self.record_event(stream, thread)
        self._runtime("cudaStreamWaitEvent", thread, CUDA_STREAM_WAIT_EVENT, False, 1.0)
        return ready

    def wait_event(self, stream: int, when: np.ndarray, thread: str = "main") -> None:
        """cudaStreamWaitEvent: later work on the stream starts no earlier than `when`."""
        self._runtime("cudaStreamWaitEvent", thread, CUDA_STREAM_WAIT_EVENT, False, 1.0)
        self.tail[stream] = np.maximum(self.stream_tail(stream), when)

    def synchronize(self, stream: int, thread: str = "main") -> None:
        """cudaStreamSynchronize: the CPU blocks until the stream is idle."""
        call = self._runtime("cudaStreamSynchronize", thread, CUDA_STREAM_SYNCHRONIZE, False, 2.0)
        done = np.maximum(call.start + call.dur, self.stream_tail(stream) + 3_000)
        call.dur = done - call.start
        self.cpu[thread] = done

    def device_free(self, free_us, thread: str = "main") -> None:
        """cudaFree with the caching allocator off: the call first waits for the whole device
        (every stream) to drain, an implicit device sync, then frees for ``free_us`` (per rank)."""
        call = self._runtime("cudaFree", thread, CUDA_FREE, False, 2.0)
        drained = np.max(list(self.tail.values()), axis=0) if self.tail else call.start
        done = np.maximum(call.start + call.dur, drained + 3_000) + np.rint(np.asarray(free_us) * 1e3).astype(np.int64)
        call.dur = done - call.start
        self.cpu[thread] = done

    def collective(self, name: str, stream: int, call: CollectiveCall, thread: str) -> GpuEvent:
        """Launch an NCCL kernel: start_r = max(launched, stream free, ready); every member of the
        group ends at the latest member's start plus the transfer time."""
        launch = self._runtime("cudaLaunchKernelExC", thread, CUDA_LAUNCH_KERNEL_EXC, True)
        start = np.maximum(launch.start + LAUNCH_LATENCY_NS, self.queue_free(stream))
        start = np.maximum(start, call.ready)
        latest = np.full(int(call.labels.max()) + 1, np.iinfo(np.int64).min)
        np.maximum.at(latest, call.labels, start)
        end = latest[call.labels] + call.transfer_ns
        call.seq_index = self._role_counts.get(call.role, 0)
        self._role_counts[call.role] = call.seq_index + 1
        event = GpuEvent(name, "kernel", "comm", stream, start, end - start, launch.corr, launch.ext,
                         self.step, self.phase, {}, call)
        self.tail[stream] = end
        self.gpu.append(event)
        self.collectives.append(call)
        return event

    def annotate_gpu(self, name: str, ext: int, events: list[GpuEvent]) -> None:
        """gpu_user_annotation over the GPU work a user annotation launched (Kineto pads 1 ns)."""
        if not events:
            return
        start = np.min([e.start for e in events], axis=0)
        end = np.max([e.start + e.dur for e in events], axis=0)
        self.annotations.append(GpuAnnotation(name, events[0].stream, start - 1, end - start + 2, ext))
