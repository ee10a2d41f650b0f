"""The columnar per-rank container every analysis reads (one per trace file).

Columns are numpy arrays; strings are interned into ``strings`` and referenced by index, so a
rank of a million kernels costs tens of MB, not a JSON tree. Times are int64 nanoseconds on the
trace's own clock (Kineto writes µs with three decimals: nanosecond precision is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterator

import numpy as np

from analyzer.ingest.memory import MemoryEvents
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
    HOST_ALLOC = 12  # the host in the device allocator: cudaFree / hipFree / cudaMalloc ..., empty_cache


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


# A collective's metadata repeats (its group, kind, element counts, dtype, recorded shapes);
# only its sequence number and communicator id are its own.
CommShape = tuple  # (keys before seq, keys after comms_id, ranks tuple or None, recorded shapes)


@dataclass(eq=False)
class CommArgs:
    """Collective metadata of the rows (GPU events or CPU markers) that carry any, as columns:
    each row's combination of repeating fields (``shape``: an index into ``shapes``, each
    normalised once, analyzer.ingest.columns), its ``Seq`` (int64, -1: none) and its ``Comms Id``
    (uint64 where ``has_comms_id``). ``rows`` ascending. Read as ``{row: metadata dict}``:
    ``get(row)`` gives the dict each such row has always had (the few readers of one row); the
    per-collective readers (analyzer.rank.comms) take the columns."""

    rows: np.ndarray  # int64, ascending
    shape: np.ndarray  # int32 index into shapes
    seq: np.ndarray  # int64, -1 when absent
    comms_id: np.ndarray  # uint64
    has_comms_id: np.ndarray  # bool
    shapes: list[CommShape]

    @classmethod
    def empty(cls) -> "CommArgs":
        return cls(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.uint64),
                   np.empty(0, bool), [])

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.tolist())

    def __contains__(self, row: object) -> bool:
        return self.position(row) >= 0  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CommArgs):
            other = other.to_dict()
        return isinstance(other, dict) and self.to_dict() == other

    __hash__ = None  # type: ignore[assignment]

    def position(self, row: int) -> int:
        """Index of ``row`` in the columns, -1 when it carries no metadata."""
        at = int(np.searchsorted(self.rows, row))
        return at if at < len(self.rows) and self.rows[at] == row else -1

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`position` of each of ``rows`` (-1 in ``rows``: none)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.rows, rows), max(len(self.rows) - 1, 0))
        found = (rows >= 0) & (self.rows[at] == rows) if len(self.rows) else np.zeros(len(rows), bool)
        return np.where(found, at, -1)

    def get(self, row: int, default: Any = None) -> Any:
        at = self.position(row)
        return default if at < 0 else self.at(at)

    def at(self, position: int) -> dict[str, Any] | None:
        """The metadata dict of the row at ``position`` (-1: None): the repeating fields before
        ``seq``, ``seq``, ``comms_id``, the rest, the ranks (a list of its own), recorded shapes."""
        if position < 0:
            return None
        head, tail, ranks, shapes = self.shapes[self.shape[position]]
        info = head.copy()
        if self.seq[position] >= 0:
            info["seq"] = int(self.seq[position])
        if self.has_comms_id[position]:
            info["comms_id"] = int(self.comms_id[position])
        info.update(tail)
        if ranks is not None:
            info["pg_ranks"] = list(ranks)
        if shapes:
            info.update(shapes)
        return info

    def items(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return ((row, self.at(k)) for k, row in enumerate(self.rows.tolist()))  # type: ignore[misc]

    def to_dict(self) -> dict[int, dict[str, Any]]:
        return dict(self.items())

    def combination_keys(self, positions: np.ndarray) -> list[int]:
        """A number per position telling apart what the metadata merge reads (its repeating
        fields, whether it has a ``seq`` and a ``comms_id``), not their values; 0: none."""
        pos = np.maximum(positions, 0)
        keys = (self.shape[pos].astype(np.int64) * 4 + (self.seq[pos] >= 0) * 2 + self.has_comms_id[pos] + 1) \
            if len(self.rows) else np.zeros(len(positions), np.int64)
        return np.where(positions >= 0, keys, 0).tolist()

    def has_seq(self, position: int) -> bool:
        return position >= 0 and bool(self.seq[position] >= 0)

    def values(self, key: str, positions: np.ndarray) -> np.ndarray:
        """``seq`` or ``comms_id`` of each position as Python ints (None: absent or no row), an
        object array."""
        out = np.full(len(positions), None, dtype=object)
        pos = np.maximum(positions, 0)
        if not len(self.rows):
            return out
        if key == "seq":
            present = (positions >= 0) & (self.seq[pos] >= 0)
            out[present] = self.seq[pos[present]].tolist()
        else:
            present = (positions >= 0) & self.has_comms_id[pos]
            out[present] = self.comms_id[pos[present]].tolist()
        return out

    def take(self, keep: np.ndarray, rows: np.ndarray) -> "CommArgs":
        """The positions ``keep`` (ascending in ``rows``), re-keyed to ``rows``."""
        return CommArgs(rows.astype(np.int64), self.shape[keep], self.seq[keep], self.comms_id[keep],
                        self.has_comms_id[keep], self.shapes)

    def rekeyed(self, kept_rows: np.ndarray) -> "CommArgs":
        """The metadata after the rows were restricted to ``kept_rows`` (sorted old rows): row
        ``kept_rows[i]`` becomes row ``i``."""
        at = np.searchsorted(kept_rows, self.rows)
        found = at < len(kept_rows)
        found[found] = kept_rows[at[found]] == self.rows[found]
        return self.take(np.flatnonzero(found), at[found])


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
    comm_args: CommArgs = field(default_factory=CommArgs.empty)


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
    kernel_comm_args: CommArgs = field(default_factory=CommArgs.empty)
    warnings: list[str] = field(default_factory=list)
    event_count: int = 0
    # The CPU ops whose recorded shapes tell their FLOPs (analyzer.ingest.shapes)
    shape_ops: ShapeOps = field(default_factory=empty_shape_ops)
    flow_events: int = 0  # launch -> GPU work arrows ("ac2g"): none in a filtered trace
    runtime_calls: int = 0  # CUDA/HIP runtime and driver calls, the launches among them
    # Events of unknown categories that look like device work (not read): no "CPU-only" while any
    unread_device_events: int = 0
    host_op_medians: dict[str, float] = field(default_factory=dict)  # µs, of the HOST_INFLATED ops' names
    memory: MemoryEvents = field(default_factory=MemoryEvents.empty)  # the allocator's events (profile_memory)
