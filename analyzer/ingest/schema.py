"""Typed msgspec schema of the Kineto trace fields tracecliff reads, and nothing more.

Decoding straight into these structs skips every field we do not name (most of a trace), is
far faster than ``json.loads`` (docs/scale.md) and never builds a generic dict tree. Types are deliberately
lenient where real traces vary (pid/tid as int or string, numbers written as strings, list or
string ``ranks``); values are normalised later, in :mod:`analyzer.ingest.columns`.
"""

from __future__ import annotations

from typing import Optional, Union

import msgspec

Num = Union[int, float, str, None]
IntLike = Union[int, float, str, None]
AnyNum = Union[bool, int, float, str, None]


class EventArgs(msgspec.Struct, gc=False, omit_defaults=True):
    correlation: IntLike = None
    external_id: IntLike = msgspec.field(default=None, name="External id")
    stream: IntLike = None
    # No ``device`` (a kernel's): nothing reads it, and skipping a field is cheaper than storing it.
    # Collective metadata (record_param_comms, and kernels in newer Kineto)
    collective_name: Optional[str] = msgspec.field(default=None, name="Collective name")
    in_nelems: IntLike = msgspec.field(default=None, name="In msg nelems")
    out_nelems: IntLike = msgspec.field(default=None, name="Out msg nelems")
    group_size: IntLike = msgspec.field(default=None, name="Group size")
    dtype: Optional[str] = None
    pg_name: Union[str, int, None] = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Optional[str] = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Union[str, list, None] = msgspec.field(default=None, name="Process Group Ranks")
    seq: IntLike = msgspec.field(default=None, name="Seq")
    comms_id: IntLike = msgspec.field(default=None, name="Comms Id")
    # A send's / receive's peer: its global rank (torch >= 2.5, copied onto kernels by Kineto)
    # and ``Rank``, which record_param_comms gives the peer's rank in the group for send / recv
    # (a collective's own rank otherwise: read for send / recv only, analyzer.ingest.p2p)
    src_rank: IntLike = msgspec.field(default=None, name="Src Rank")
    dst_rank: IntLike = msgspec.field(default=None, name="Dst Rank")
    rank: IntLike = msgspec.field(default=None, name="Rank")
    # Shapes recorded with record_shapes=True (``nccl:*`` ops carry message sizes here)
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    # Scalars and int lists of the same ops as text ("True", "[2, 2]"; torch >= 2.1): an
    # attention's is_causal, a convolution's stride (analyzer.ingest.shapes)
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    # The allocator's ``[memory]`` instant events (profile_memory=True; analyzer.ingest.memory):
    # the change, and the device's totals after it (2021-era traces: ``Bytes`` only)
    # (booleans accepted and read as unknown: one odd value must not reject the trace)
    alloc_bytes: AnyNum = msgspec.field(default=None, name="Bytes")
    total_allocated: AnyNum = msgspec.field(default=None, name="Total Allocated")
    total_reserved: AnyNum = msgspec.field(default=None, name="Total Reserved")
    device_type: AnyNum = msgspec.field(default=None, name="Device Type")
    device_id: AnyNum = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    # No ``ph``: nothing reads it (an event of a category tracecliff reads but without a
    # duration is dropped by its missing ``dur``), and decoding it cost ~8 % of the decode.
    cat: Optional[str] = None
    name: Union[str, int, float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: Num = None
    dur: Num = None
    args: Optional[EventArgs] = None


class PgConfig(msgspec.Struct, gc=False):
    pg_name: Union[str, int, None] = None
    pg_desc: Optional[str] = None
    backend_config: Optional[str] = None
    pg_size: IntLike = None
    ranks: Union[list, str, None] = None


class DistributedInfo(msgspec.Struct, gc=False):
    backend: Optional[str] = None
    rank: IntLike = None
    world_size: IntLike = None
    pg_count: IntLike = None
    pg_config: Union[list[PgConfig], None] = None
    nccl_version: Optional[str] = None
    host_name: Optional[str] = None
    hostname: Optional[str] = None


class DeviceProperties(msgspec.Struct, gc=False):
    id: IntLike = None
    name: Union[str, int, float, None] = None
    totalGlobalMem: IntLike = None
    computeMajor: IntLike = None
    computeMinor: IntLike = None


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: Optional[list[Event]] = None
    distributedInfo: Optional[DistributedInfo] = None
    deviceProperties: Optional[list[DeviceProperties]] = None
    schemaVersion: Union[int, str, None] = None
    baseTimeNanoseconds: IntLike = None
    hostname: Optional[str] = None
    host_name: Optional[str] = None
    pytorch_version: Optional[str] = msgspec.field(default=None, name="pytorch_version")


# A Chrome trace may also be a bare JSON array of events (the "JSON Array Format").
TraceDocument = Union[TraceFile, list[Event]]

TRACE_DECODER = msgspec.json.Decoder(TraceDocument)
