"""The JSON contract of ``diagnose --format json`` as typed definitions, and its JSON Schema
(``tracecliff schema``). The Structs mirror ``Result.to_dict()`` (analyzer.job.result); the
findings are the Result's own ``Finding`` dataclass. Objects accept keys not listed here (the
contract lets later versions add keys; renaming or removing one bumps ``SCHEMA_VERSION``), and a
value the trace may lack is nullable.

Check a saved result in Python with ``msgspec.json.decode(data, type=ResultDocument)`` or with
any JSON Schema validator against ``result_schema()``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec

from analyzer.job.large import LARGE_SCHEMA_VERSION
from analyzer.job.result import SCHEMA_VERSION, Finding


class Tool(msgspec.Struct):
    name: str
    version: str


class Input(msgspec.Struct):
    path: str
    rank: int


class Parallelism(msgspec.Struct):
    """One parallelism dimension: its size and the evidence for it (analyzer.job.parallelism)."""

    size: int | None
    evidence: list[str] = []


class JobProcessGroup(msgspec.Struct):
    """A process group of the job, with its role (dp, dp_shard, dp_replicate, tp, pp, ep, cp, ...)."""

    key: str
    name: str | None
    role: str
    description: str | None = None
    ranks: list[int] | None = None
    size: int | None = None
    evidence: str | None = None
    collectives: dict[str, int] = {}


class ActivationCheckpointing(msgspec.Struct):
    """``job.activation_checkpointing`` (analyzer.job.memory.job_checkpointing)."""
    detected: bool
    recompute_us: float | None = None  # a step's recompute (µs), the mean over the ranks it was detected on
    basis: str | None = None  # what recompute_us measures (GPU time of the re-run ops' kernels, or host time)
    step: int | None = None
    evidence: dict[str, Any] = {}


class JobDoc(msgspec.Struct):
    world_size: int | None
    strategy: str  # the combination, e.g. "ddp", "fsdp2+tp", "megatron tp", "expert parallel"
    dp_strategy: str | None = None  # the data-parallel part: ddp, fsdp1, fsdp2, fsdp, unknown
    workload: str | None = None  # training | inference | None: cannot tell (analyzer.rank.workload)
    activation_checkpointing: ActivationCheckpointing | None = None
    parallelism: dict[str, Parallelism] = {}
    process_groups: list[JobProcessGroup] = []
    group_roles: dict[str, str] = {}
    backend: str | None = None
    hosts: list[str] = []
    ranks_given: int | None = None
    gpu: str | None = None
    gpu_mem_bytes: int | None = None
    devices_per_node: int | None = None
    nccl_version: str | None = None
    time_origin_ns: int | None = None
    tool: Tool | None = None


class Step(msgspec.Struct):
    """One ProfilerStep of one rank (µs; ``phases``: exposed communication by phase)."""

    step: int
    step_time_us: float | None
    span_us: float
    busy_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    idle_us: float
    overlap_pct: float
    phases: dict[str, float]
    cpu_step_us: float | None = None
    low_precision_compute_us: float | None = None
    forward_attention_kernels: int | None = None  # one per transformer block and forward pass; absent: none
    backward_launch_ns: int | None = None
    phase_windows: dict[str, dict[str, Any]] | None = None
    window_ns: list[int] | None = None  # [first GPU activity, next step's] on the rank's clock
    time_breakdown: dict[str, Any] | None = None  # the step's leaves (analyzer.rank.attribution)
    step_source: str | None = None  # how the step was found where it is no ProfilerStep (analyzer.rank.timeline)


class ProcessGroupDoc(msgspec.Struct):
    name: str
    ranks: list[int] | None = None
    size: int | None = None
    description: str | None = None
    backend: str | None = None


class TimeBreakdown(msgspec.Struct):
    """A typical step in five leaves that add up to ``step_time_us`` (µs), with the finer leaves
    in ``details`` (by peer waited for, collective kind, group, phase; idle split into host-caused
    ``idle_host_us``, by host activity ``idle_by_host``, its unknown part by the phase of the work
    launched next ``idle_unknown_by_phase``, and queued ``idle_queued_us``, by what it waited on
    ``idle_queued_by``, the ops that waited ``idle_queued_ops``)."""

    step_time_us: float
    compute_only_us: float
    exposed_wait_us: float
    exposed_transfer_us: float
    other_gpu_us: float
    idle_us: float
    step: int | None = None
    details: dict[str, Any] = {}
    wait_source: str | None = None


class ExcludedStepDoc(msgspec.Struct):
    """A step left out of the typical step's choice, with its role and why."""

    step: int
    reason: str
    role: Literal["warm-up", "drain", "outlier"] | None = None  # None: a result written before roles


class AttributionDoc(TimeBreakdown):
    """The job's typical step: the leaves averaged over ranks, with the steady steps it was
    chosen from and the steps left out (warm-up, drain, outliers) with the reason."""

    ranks: int | None = None
    steady_steps: list[int] = []
    excluded_steps: list[ExcludedStepDoc] = []
    exposed_share: float | None = None
    idle_share: float | None = None
    # How the steps were found where they are no ProfilerSteps (a repeating annotation, the
    # whole trace), and why the idle split into host-caused and queued is unreliable (a
    # filtered trace): analyzer.rank.timeline / analyzer.rank.attribution.
    step_source: str | None = None
    idle_split_note: str | None = None


class FamilyCompute(msgspec.Struct):
    """FLOPs of one op family (or FLOPs-per-op bucket) in the typical step; the GPU time of its
    ops that launched kernels, their TFLOP/s and share of the peak of each op's dtype (%)."""

    flops: float
    gpu_us: float
    tflops_per_s: float | None
    pct_of_peak: float | None
    ops: float | None = None
    timed_flops: float | None = None
    ideal_us: float | None = None  # the timed FLOPs' time at peak
    family: str | None = None  # by_bucket rows
    bucket: str | None = None


class RankComputeDoc(msgspec.Struct):
    """``ranks[].compute``: the typical step's FLOPs from recorded shapes (analyzer.job.compute);
    ``mfu`` / ``compute_mfu`` are fractions, ``pct_of_peak`` percent."""

    flops_per_step: float
    by_family: dict[str, FamilyCompute]
    unknown_gpu_us: float
    mfu: float | None
    compute_mfu: float | None
    dtype: str | None
    peak_tflops: float | None
    source: str
    step: int | None = None
    step_source: str | None = None
    by_bucket: list[FamilyCompute] = []
    unknown_ops: int = 0
    unknown_reasons: dict[str, int] = {}
    flops_by_dtype: dict[str, float] = {}
    step_time_us: float | None = None
    compute_us: float | None = None
    ideal_us: float | None = None
    shapes: list[dict[str, Any]] = []
    ops_seen: dict[str, int] = {}
    time_source: str | None = None
    note: str | None = None


class RankDoc(msgspec.Struct):
    """One rank's whole-trace metrics (µs) and what its trace says about the job."""

    rank: int
    path: str
    rank_source: str
    world_size: int | None
    host: str | None
    backend: str | None
    nccl_version: str | None
    first_gpu_ns: int | None
    span_us: float | None
    busy_us: float | None
    compute_us: float | None
    comm_us: float | None
    overlap_us: float | None
    exposed_comm_us: float | None
    idle_us: float | None
    overlap_pct: float | None
    step_time_us: float | None
    steps: list[Step]
    phases: dict[str, float]
    process_groups: list[ProcessGroupDoc]
    devices: list[dict[str, Any]]
    markers_seen: dict[str, int]
    gpu_event_count: int
    event_count: int
    rank_warnings: list[str]
    time_breakdown: TimeBreakdown | None = None  # the rank's typical step
    compute: RankComputeDoc | None = None  # the typical step's FLOPs (absent: no op with FLOPs in the trace)
    compute_steps: dict[str, Any] | None = None  # the map's FLOPs and GPU time per step (analyzer.rank.flops)


class CollectiveGroup(msgspec.Struct):
    name: str | None  # None: the trace does not say (older PyTorch)
    size: int | None = None
    ranks: list[int] | None = None
    description: str | None = None


Bound = Literal["latency-bound", "bandwidth-bound"]


class Collective(msgspec.Struct):
    """One collective on one rank (µs from the job's time origin; bandwidths GB/s)."""

    rank: int
    step: int | None  # None: outside every ProfilerStep (a trace without step markers)
    phase: str
    collective: str
    group: CollectiveGroup
    start_us: float
    dur_us: float
    launch_us: float | None
    exposed_us: float | None
    bytes: int | None
    dtype: str | None
    size_source: str | None  # None: no source gave the message size
    on_gpu: bool
    seq: int | None = None
    comms_id: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    stream: int | None = None
    module: str | None = None
    kernel: str | None = None
    wait_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    bound: Bound | None = None
    library: str | None = None  # who moved the bytes: nccl, rccl, deepep, gloo, ... (communication catalog)
    collective_source: str | None = None
    waited_for: int | None = None  # the member this rank's wait was for (cross-rank matching)
    arrival_lag_us: float | None = None  # arrival after the group's median member (clocks aligned)
    wait_estimated_us: float | None = None  # α-β estimate of the wait when not every rank is given
    # a send's / receive's [kind, peer's global rank, tag] members (analyzer.rank.p2p); absent
    # where the trace does not name the peer, and on every collective
    peers: list[list[str | int | None]] | None = None


class BucketDoc(msgspec.Struct):
    """A DDP gradient all-reduce (bucket ``index`` of a step)."""

    rank: int
    step: int | None  # None: outside every ProfilerStep (a trace without step markers)
    index: int
    group: str | None
    start_us: float
    dur_us: float
    bytes: int | None
    dtype: str | None
    exposed_us: float | None
    launch_us: float | None = None
    launch_offset_us: float | None = None


class FsdpUnit(msgspec.Struct):
    rank: int
    step: int | None  # None: outside every ProfilerStep (a trace without step markers)
    index: int
    collective: str
    phase: str
    start_us: float
    dur_us: float
    bytes: int | None
    exposed_us: float | None
    on_gpu: bool
    module: str | None = None


class GroupDoc(msgspec.Struct):
    """A process group with its α-β fit (α µs, β GB/s one-way, S* = α·β bytes). A trace that
    does not name its groups gives one entry whose name, size and layout are None."""

    name: str | None
    size: int | None
    ranks: list[int] | None
    nodes: int | None
    cross_node: bool | None
    kinds: list[str]
    collectives: int
    alpha_us: float | None
    beta_gbps: float | None
    s_star_bytes: float | None
    busbw_median_gbps: float | None  # the same value as busbw_gbps (its name before it was a step's Σ / Σ)
    fit: str
    fit_source: str
    description: str | None = None
    role: str | None = None  # dp, dp_shard, dp_replicate, tp, pp, ep, cp, ... (analyzer.job.parallelism)
    # the bus bandwidth of the groups of its label (description, else name) in the typical step:
    # Σ S·factor / Σ transfer time of the collectives matched on every member (analyzer.job.busbw);
    # None: not measured, and busbw_basis says why
    busbw_gbps: float | None = None
    busbw_basis: str | None = None


class CollectiveSummary(msgspec.Struct):
    group: str | None
    collective: str
    size_bucket: str
    count: int
    bytes_min: int | None
    bytes_max: int | None
    transfer_us_min: float | None
    transfer_us_median: float | None
    busbw_gbps_median: float | None
    busbw_gbps_max: float | None
    bound: Bound | None


class SourcedDoc(msgspec.Struct):
    """A hardware or model value and where it came from (measured / profile / user / default)."""

    value: str | int | float | None
    origin: str
    source: str


class TopologyDoc(msgspec.Struct):
    gpus_per_node: int | None
    gpus_per_node_source: str
    n_nodes: int | None
    hosts: list[str]
    rank_hosts: dict[str, str]
    node_of_rank: dict[str, str] | None
    notes: list[str]


class Stragglers(msgspec.Struct):
    method: str | None
    matched_collectives: int
    ranks_compared: list[int]
    note: str | None
    per_step: list[dict[str, Any]] = []
    by_rank: list[dict[str, Any]] = []
    top_rank: int | None = None
    top_rank_last_share: float | None = None
    top_rank_wait_caused_us: float | None = None


class ShapesMfu(msgspec.Struct):
    """MFU from recorded shapes: the ranks' typical-step FLOPs at the peak of their dtype over
    the typical step's time (``mfu``) and its compute time (``compute_mfu``), fractions."""

    flops_per_step: float
    mfu: float | None
    compute_mfu: float | None
    by_family: dict[str, FamilyCompute]
    source: str
    step: int | None = None
    step_source: str | None = None
    ranks: int | None = None
    step_time_us: float | None = None
    compute_us: float | None = None
    peak_tflops: float | None = None
    dtype: str | None = None
    unknown_gpu_us: float = 0.0
    per_rank: list[dict[str, Any]] = []


class Mfu(msgspec.Struct):
    """Model-parameter MFU (the section's own keys: 6Ψ per token from the flags) and, in
    ``from_shapes``, the MFU of the FLOPs the recorded shapes count."""

    mfu_mean: float | None
    n_gpus: int | None
    per_step: list[dict[str, Any]]
    model_params: float | None = None
    tokens_per_step: float | None = None
    peak_tflops: SourcedDoc | None = None
    source: str | None = None
    note: str | None = None
    label: str | None = None
    from_shapes: ShapesMfu | None = None


RuleStatusName = Literal["fired", "passed", "disabled", "not_applicable", "not_evaluated"]


class RuleStatus(msgspec.Struct):
    rule: str
    code: str
    status: RuleStatusName
    reason: str | None = None


class RecoveredBy(msgspec.Struct):
    """One finding's gain in the joint estimate: what it counts per leaf, and the time of it
    other findings (larger gains) already claimed."""

    rule: str
    gain_us: float
    counted_us: dict[str, float]
    shared_us: dict[str, float] = {}


class RecoverableDoc(msgspec.Struct):
    """What the findings together recover per typical step (µs; analyzer.job.model.Recoverable):
    a leaf's time counted once however many findings claim it; ``lost_us`` (exposed communication
    and idle) never beyond ``lost_bound_us``; ``compute_us`` (a slow rank's kernels) apart."""

    step_time_us: float
    sum_us: float
    joint_us: float
    lost_us: float
    compute_us: float
    lost_bound_us: float
    findings: list[RecoveredBy]
    source: str | None = None  # how the joint estimate was made (a result saved before: the leaf count)
    replayed_us: float | None = None
    replayed_rules: list[str] = []
    replayed_all: bool = False


class MemoryStep(msgspec.Struct):
    """One step's measured memory on a rank (analyzer.rank.memory), bytes."""

    step: int
    events: int
    peak_allocated_bytes: int | None
    start_allocated_bytes: int | None
    end_allocated_bytes: int | None
    peak_at: dict[str, Any] | None
    headroom_bytes: int | None
    peak_reserved_bytes: int | None = None


class MemoryRank(msgspec.Struct):
    rank: int
    recorded: bool
    device: str
    relative: bool
    device_bytes: int | None
    steps: list[MemoryStep]


class Memory(msgspec.Struct):
    """Measured memory from the allocator's events (analyzer.job.memory)."""

    recorded: bool
    ranks: list[MemoryRank]
    why: str | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_bytes: int | None = None


class Section(msgspec.Struct):
    """A report section (step timeline, scaling curve, HTA deep dive): its data when
    ``available``, else ``why`` it is not."""

    available: bool
    why: str | None = None
    note: str | None = None


class _Document(msgspec.Struct, tag_field="schema_version"):
    """What every version of ``diagnose --format json`` holds (``schema_version`` tells them apart)."""

    tool: Tool
    inputs: list[Input]
    job: JobDoc
    collectives: list[Collective]
    findings: list[Finding]
    warnings: list[str]
    topology: TopologyDoc | None = None
    hardware: dict[str, SourcedDoc] | None = None
    groups: list[GroupDoc] | None = None
    stragglers: Stragglers | None = None
    collective_summary: list[CollectiveSummary] | None = None
    mfu: Mfu | None = None
    attribution: AttributionDoc | None = None
    rules: list[RuleStatus] | None = None
    verdict: str | None = None
    recoverable: RecoverableDoc | None = None
    timeline: Section | None = None
    scaling: Section | None = None
    hta: Section | None = None
    memory: Memory | None = None


class ResultDocument(_Document, tag=SCHEMA_VERSION, kw_only=True):
    """``diagnose --format json``: one diagnosed job, every collective row in it."""

    ranks: list[RankDoc]
    buckets: list[BucketDoc]
    fsdp_units: list[FsdpUnit]


class StepColumns(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's steps by column (analyzer.job.large): ``columns[path]`` one value per step, a
    nested field by its dotted path (``time_breakdown.idle_us``); ``absent[path]``: the steps
    (positions) that lack it. Read back into ``Step`` objects, each checked."""

    count: Annotated[int, msgspec.Meta(ge=0)]
    columns: dict[str, list[Any]]
    absent: dict[str, list[Annotated[int, msgspec.Meta(ge=0)]]] = {}


class LargeRank(RankDoc, kw_only=True):
    """A rank of a large result: its steps by column (``step_columns``; ``steps`` when a step
    has a key the columns cannot name)."""

    steps: list[Step] = []
    step_columns: StepColumns | None = None


class CollectiveRows(msgspec.Struct):
    """How many collective rows a large result has, how many its JSON holds (the most exposed:
    ``chosen_by``) and how many it leaves out; the rows file beside the JSON that holds them
    all and its SHA-256, or why there is none; the DDP buckets and FSDP units of the rows (not
    written: worked out from the rows file)."""

    count: Annotated[int, msgspec.Meta(ge=0)]
    in_json: Annotated[int, msgspec.Meta(ge=0)]
    left_out: Annotated[int, msgspec.Meta(ge=0)]
    chosen_by: str
    file: Annotated[str, msgspec.Meta(pattern=r"^(?!\.)[^/\\]+$")] | None
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None
    why: str | None = None
    buckets: Annotated[int, msgspec.Meta(ge=0)] = 0
    fsdp_units: Annotated[int, msgspec.Meta(ge=0)] = 0


SizeLine = tuple[str, int, int, float, float, Optional[float], list[str], Optional[float]]
ScatterPoint = tuple[float, float, str, float, float, int, int, float]


class Scatter(msgspec.Struct, forbid_unknown_fields=True):
    total: Annotated[int, msgspec.Meta(ge=0)]
    points: list[ScatterPoint]


class DigestGroup(msgspec.Struct, forbid_unknown_fields=True):
    """One process group of the HTML report's collective tables: its first row's group, its
    rows, whether any ran on the GPU, one line per (kind, size bucket): kind, bucket, count,
    total µs, exposed µs, waiting µs, bounds, median busbw; the α-β scatter's points: x, y,
    kind, bytes, transfer µs, ring steps, N, waiting µs."""

    name: str
    group: CollectiveGroup
    count: Annotated[int, msgspec.Meta(ge=0)]
    on_gpu: bool
    lines: list[SizeLine]
    scatter: Scatter


class TopExposed(msgspec.Struct, forbid_unknown_fields=True):
    gpu: Annotated[int, msgspec.Meta(ge=0)]
    shown: Annotated[int, msgspec.Meta(ge=0)]
    rows: list[Collective]


class HostSide(msgspec.Struct, forbid_unknown_fields=True):
    count: Annotated[int, msgspec.Meta(ge=0)]
    libraries: list[str]
    ranks: Annotated[int, msgspec.Meta(ge=0)]
    windows: Annotated[int, msgspec.Meta(ge=0)]
    kinds: list[tuple[str, float, float]]
    longest: list[Collective]


# a sum of bus bytes (≥ 0) or of transfer time (> 0: the figure divides by it), finite
BusBytes = Annotated[float, msgspec.Meta(ge=0, le=1.7976931348623157e308)]
TransferTime = Annotated[float, msgspec.Meta(gt=0, le=1.7976931348623157e308)]


class BusbwSums(msgspec.Struct, forbid_unknown_fields=True):
    """Σ S·factor and Σ transfer time of a group label's measured collectives in the typical
    step (``over``; else the steady ``steps``, else the whole ``trace``), how many, on how many
    matched members, in how many groups (analyzer.job.busbw.group_sums)."""

    over: Literal["typical", "steady", "trace"]
    steps: list[int]
    collectives: Annotated[int, msgspec.Meta(ge=1)]
    members: Annotated[int, msgspec.Meta(ge=0)]
    groups: Annotated[int, msgspec.Meta(ge=1)]
    bus_bytes: BusBytes
    transfer_us: TransferTime


class BusbwEntry(msgspec.Struct, forbid_unknown_fields=True):
    """What a group label's bus bandwidth is made of (analyzer.job.busbw): its sums (None: not
    measured, ``why`` says why) and per rank and steady step [rank, step, Σ S·factor, Σ t]."""

    label: str
    step: Optional[int]
    sums: Optional[BusbwSums]
    samples: list[tuple[Annotated[int, msgspec.Meta(ge=0)], Optional[int], BusBytes, TransferTime]]
    why: Optional[str]


class Totals(msgspec.Struct, forbid_unknown_fields=True):
    """The diff's sums per (group label, collective) over the steady windows: label, kind,
    count, bytes, rows without a size, time µs, exposed µs, waiting µs, the first row's group."""

    windows: Annotated[int, msgspec.Meta(ge=1)]
    per: str
    cells: list[tuple[str, str, int, float, int, float, float, Optional[float], Optional[CollectiveGroup]]]


class Digest(msgspec.Struct, forbid_unknown_fields=True):
    """What the views quote from every collective row (analyzer.job.digest)."""

    groups: list[DigestGroup]
    top_exposed: TopExposed
    host_side: HostSide | None
    busbw: list[BusbwEntry]
    labels: list[str]
    totals: Totals


class LargeResultDocument(_Document, tag=LARGE_SCHEMA_VERSION, kw_only=True):
    """``diagnose --format json`` of a large job (more than analyzer.job.large.JSON_ROWS
    collective rows): ``collectives`` holds the most exposed of them, the rows file all."""

    ranks: list[LargeRank]
    collective_rows: CollectiveRows
    collective_digest: Digest


AnyResultDocument = Union[ResultDocument, LargeResultDocument]


def result_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``diagnose --format json``: a result of either
    schema_version (1: every row in it; 3: a large result)."""
    schema = versioned_schema(AnyResultDocument, "result", "tracecliff diagnose --format json", LARGE_SCHEMA_VERSION,
                              f"{SCHEMA_VERSION} or {LARGE_SCHEMA_VERSION}")
    # Each version's definition applies by its schema_version (if/then: a validator then names
    # the key at fault; the union's anyOf would only say that neither version matched).
    versions = {SCHEMA_VERSION: "ResultDocument", LARGE_SCHEMA_VERSION: "LargeResultDocument"}
    schema.pop("anyOf", None)
    schema.pop("discriminator", None)
    schema.update(type="object", required=["schema_version"],
                  properties={"schema_version": {"enum": list(versions)}},
                  allOf=[{"if": {"properties": {"schema_version": {"const": version}}},
                          "then": {"$ref": f"#/$defs/{name}"}} for version, name in versions.items()])
    return schema


def versioned_schema(struct: Any, name: str, title: str, version: int = SCHEMA_VERSION,
                     versions: str | None = None) -> dict[str, Any]:
    """``struct``'s JSON Schema with the draft, an id carrying ``version`` and a title naming the
    schema_version(s) it describes."""
    schema = msgspec.json.schema(struct)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://tracecliff.dev/schema/{name}-v{version}.json",
            "title": f"{title} (schema_version {versions or version})", **schema}
