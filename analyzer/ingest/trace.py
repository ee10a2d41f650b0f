"""The columnar per-rank container every analysis reads (one per trace file).

Columns are numpy arrays; strings are interned into ``strings`` and referenced by index, so a
rank of a million kernels costs tens of MB, not a JSON tree. Times are int64 nanoseconds on the
trace's own clock (Kineto writes µs with three decimals: nanosecond precision is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from analyzer.ingest.shapes import ShapeOps, empty_shape_ops


class GpuKind(IntEnum):
    """What a GPU activity is; decides which union it joins (docs: README "Definitions")."""

    COMPUTE = 0  # any kernel that is not communication
    COMM = 1  # NCCL / RCCL kernels
    MEMORY = 2  # memcpy / memset
    SYNC = 3  # CUDA sync markers recorded on a stream


class Marker(IntEnum):
    """CPU-side ranges that tell step, phase and collective of the GPU work they launch."""

    STEP = 0  # ProfilerStep#N
    BACKWARD = 1  # autograd::engine::evaluate_function, FSDP backward hooks
    OPTIMIZER = 2  # Optimizer.step#..., Optimizer.zero_grad#...
    FORWARD = 3  # DistributedDataParallel.forward, FSDP forward annotations
    COMM_PARAMS = 4  # record_param_comms (collective metadata)
    COMM_OP = 5  # nccl:* / gloo:* / c10d:: ops (Input Dims carry message sizes)
    FSDP_UNIT = 6  # FSDP2 "FSDP::... (fqn)" annotations naming a module
    HOST_SYNC = 7  # the host blocked on the device: cuda*Synchronize, sync memcpy, aten::item
    HOST_INPUT = 8  # the host fetching the next batch: enumerate(DataLoader)#...
    FRAMEWORK = 9  # parallelism markers: Megatron's TP autograd functions, pipeline schedules, MoE dispatch
    HOST_INFLATED = 10  # an ordinary host op far past its usual length (analyzer.ingest.hostops)
    ANNOTATION = 11  # any other user annotation (record_function): steps where no ProfilerStep is


@dataclass
class GpuEvents:
    ts: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    stream: np.ndarray  # int64
    kind: np.ndarray  # int8 GpuKind
    name: np.ndarray  # int32 index into RankTrace.strings
    correlation: np.ndarray  # int64, -1 when absent

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, index: np.ndarray) -> "GpuEvents":
        return GpuEvents(*(getattr(self, f)[index] for f in GPU_FIELDS))


GPU_FIELDS = ("ts", "end", "stream", "kind", "name", "correlation")


@dataclass
class Launches:
    """CPU launch calls (cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync...), by correlation."""

    correlation: np.ndarray  # int64, sorted
    ts: np.ndarray  # int64 ns
    thread: np.ndarray  # int32 index into RankTrace.threads
    end: np.ndarray  # int64 ns: when the call returned (a copy to pageable memory blocks the host)


@dataclass
class Markers:
    ts: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    thread: np.ndarray  # int32
    kind: np.ndarray  # int8 Marker
    name: np.ndarray  # int32 index into strings
    external_id: np.ndarray  # int64, -1 when absent
    # Collective metadata by marker row (record_param_comms / nccl:* ops only).
    comm_args: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class RankTrace:
    path: str
    rank: int
    rank_source: str  # "distributedInfo" | "file name" | "single file"
    world_size: int | None
    host: str | None
    backend: str | None
    nccl_version: str | None
    process_groups: list[dict[str, Any]]  # {name, description, ranks, size}
    devices: list[dict[str, Any]]  # {id, name, total_mem_bytes}
    strings: list[str]
    threads: list[str]
    gpu: GpuEvents
    launches: Launches
    markers: Markers
    # Collective metadata recorded on the kernels themselves (newer Kineto), by GPU event row.
    kernel_comm_args: dict[int, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    event_count: int = 0
    # The CPU ops whose recorded shapes tell their FLOPs (analyzer.ingest.shapes)
    shape_ops: ShapeOps = field(default_factory=empty_shape_ops)
    flow_events: int = 0  # launch -> GPU work arrows ("ac2g"): none in a filtered trace
    runtime_calls: int = 0  # CUDA/HIP runtime and driver calls, the launches among them
    host_op_medians: dict[str, float] = field(default_factory=dict)  # µs, of the HOST_INFLATED ops' names
