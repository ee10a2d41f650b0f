"""The job model: a diagnosed job's facts as frozen, typed objects, built once from the Result
after the job analyses (``JobModel.of(result)``) and read by every view: the rules and the
verdict, the what-if, the gate and the diff, the renderers and the notebook API.

Each derived figure is defined here, once:

- the **typical step** (``TypicalStep``): which step, why it was chosen, the role of every other
  step (steady, warm-up, drain, outlier), and its time in five leaves (``Leaves``: compute only,
  waiting for late peers, exposed transfer, other GPU work, idle) with the exposed and idle shares;
- each rank's leaves of every step (``RankFacts``, ``RankStep``);
- each process group's role, nodes, link (the one ``Link`` rule, analyzer.model.link) and bus
  bandwidth (``GroupFacts``; the typical step's, over the collectives whose transfer time is
  measured: analyzer.job.busbw);
- each rank's lateness and the waiting it causes the others (``RankLateness``);
- the hardware (``HardwareAssumptions``), the topology, and the collectives as columns;
- the typical step's compute: FLOPs from recorded shapes, TFLOP/s per op family and shape,
  MFU (``compute``: ``analyzer.job.compute.JobCompute``).

Dicts exist only at the edges: the Result's sections are the JSON document these objects are
read from (so a saved result gives the same model), and the DataFrames are made from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping, Protocol

from analyzer.base.numbers import sourced_figure
from analyzer.base.units import fmt_us
from analyzer.job.busbw import GroupBusbw, figures as busbw_figures
from analyzer.job.columns import CollectiveColumns, group_label  # noqa: F401  (group_label: re-exported)
from analyzer.job.compute import JobCompute
from analyzer.job.topology import Topology, build_topology
from analyzer.job.typical import DRAIN, OUTLIER, STEADY, TYPICAL, UNMEASURED, WARM_UP  # noqa: F401  (re-exported)
from analyzer.rank.workload import WORKLOAD_TEXT
from analyzer.model.hardware import HardwareAssumptions, resolve_hardware
from analyzer.model.link import Link, group_link



class JobSections(Protocol):
    """What the model reads of a ``analyzer.job.result.Result``: its sections. Typed by shape,
    not by importing the Result, which builds its model lazily (``Result.model``): result.py
    imports this module, never the other way round, so the two form no import circle."""

    @property
    def job(self) -> dict[str, Any]: ...
    @property
    def ranks(self) -> Any: ...
    @property
    def attribution(self) -> dict[str, Any] | None: ...
    @property
    def mfu(self) -> dict[str, Any] | None: ...
    @property
    def stragglers(self) -> dict[str, Any] | None: ...
    @property
    def topology(self) -> dict[str, Any] | None: ...
    @property
    def hardware(self) -> dict[str, Any] | None: ...
    @property
    def groups(self) -> list[dict[str, Any]] | None: ...
    @property
    def recoverable(self) -> dict[str, Any] | None: ...
    @property
    def model(self) -> JobModel: ...

# The five leaves of a step; they add up to its time (analyzer.job.attribution).
LEAVES = ("compute_only_us", "exposed_wait_us", "exposed_transfer_us", "other_gpu_us", "idle_us")
LEAF_NAMES = {"compute_only_us": "compute only", "exposed_wait_us": "waiting for late peers",
              "exposed_transfer_us": "exposed transfer", "other_gpu_us": "other GPU work", "idle_us": "GPU idle"}
# The leaves where the GPU does no useful work: what findings can give back.
LOST_LEAVES = ("exposed_wait_us", "exposed_transfer_us", "idle_us")
# The ``wait_by_peer`` key of waiting estimated from the α-β model (analyzer.job.attribution).
ESTIMATED_PEER = "estimated (α-β)"

# What the host was doing while its GPU idled, nothing launched (analyzer.rank.attribution).
HOST_ACTIVITY = {"input": "the data loader", "device_sync": "a blocking device sync",
                 "allocator": "the device allocator (cudaFree / hipFree / cudaMalloc ..., each free a device sync)",
                 "contention": "host ops running far beyond their usual length (CPU contention)",
                 "fsdp": "FSDP's own hooks", "launch": "launching kernels one by one",
                 "unknown": "Python or other host work"}
# What the launched work waited on (analyzer.rank.attribution.QUEUED_CAUSES), in words: the
# findings' and the views' (rules.gpu_idle_queued, rules.host; reports.text, reports.html).
WAITED_ON = {"copy": "a copy", "collective": "a collective", "graph": "the work of a CUDA graph launch",
             "event": "an event (another stream's, another GPU's or the host's work)"}


def wait_words(source: str | None) -> str:
    """What the waiting leaf holds, in words, by the typical step's ``wait_source``: with
    members' traces missing, the time beyond the link model's transfer is waiting or contention
    (a link slower than the model's), not only late peers."""
    text = str(source or "")
    if text.startswith("estimated") and "ranks' traces given" in text:
        return "waiting or contention beyond the link model's transfer"
    return "waiting for late peers"

# A step's role in the job: TYPICAL, STEADY, WARM_UP, DRAIN, OUTLIER, UNMEASURED (chosen in
# analyzer.job.typical, imported above).
STEP_ROLES = (TYPICAL, STEADY, WARM_UP, DRAIN, OUTLIER, UNMEASURED)
# A rank last at this share of the matched collectives or more is consistently last.
CONSISTENTLY_LAST = 0.5


@dataclass(frozen=True)
class Leaves:
    """One step's time in its five leaves (µs); ``step_time_us`` is their sum (for the job's
    typical step, the sum of the rounded means over ranks)."""

    step_time_us: float
    compute_only_us: float
    exposed_wait_us: float
    exposed_transfer_us: float
    other_gpu_us: float
    idle_us: float

    @classmethod
    def of(cls, figures: Mapping[str, Any]) -> Leaves:
        return cls(float(figures["step_time_us"]), *(float(figures[leaf]) for leaf in LEAVES))

    def leaf(self, name: str) -> float:
        if name not in LEAVES:
            raise KeyError(name)
        return float(getattr(self, name))

    @property
    def exposed_us(self) -> float:
        """Exposed communication: waiting for late peers + exposed transfer."""
        return self.exposed_wait_us + self.exposed_transfer_us

    @property
    def lost_us(self) -> float:
        """Exposed communication + idle: the step's time the GPU does no useful work."""
        return self.exposed_us + self.idle_us

    def share(self, us: float) -> float | None:
        """``us`` as a fraction of this step (None for a zero-length step)."""
        return us / self.step_time_us if self.step_time_us else None

    def pct(self, us: float) -> float | None:
        """``us`` as a percentage of this step (None for a zero-length step): a rank's leaf as
        the text per-rank table and the HTML per-rank bars quote it."""
        return 100 * us / self.step_time_us if self.step_time_us else None

    @property
    def exposed_share(self) -> float | None:
        return self.share(self.exposed_us)

    @property
    def idle_share(self) -> float | None:
        return self.share(self.idle_us)


@dataclass(frozen=True)
class Split:
    """Exposed communication of one label (a collective kind, group, phase): waiting + transfer."""

    wait_us: float
    transfer_us: float

    @property
    def exposed_us(self) -> float:
        return self.wait_us + self.transfer_us


@dataclass(frozen=True)
class Details:
    """The finer leaves of a step: its exposed communication by collective kind, process group,
    phase and kind × phase; its waiting by the peer waited for; its idle by what the host did."""

    by_kind: Mapping[str, Split]
    by_group: Mapping[str, Split]
    by_phase: Mapping[str, Split]
    by_kind_phase: Mapping[str, Split]
    wait_by_peer: Mapping[str, float]
    idle_by_host: Mapping[str, float]  # the host-caused part of idle, by what the host was doing
    idle_queued_by: Mapping[str, float] = field(default_factory=dict)  # the queued part, by what it waited on
    idle_host_us: float | None = None  # None: a result saved before the split (all idle counted the host's)
    idle_queued_us: float | None = None
    # the host's own work (idle_by_host's unknown) by the phase of the work it launched next
    idle_unknown_by_phase: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, doc: Mapping[str, Any] | None) -> Details:
        doc = doc or {}

        def splits(key: str) -> dict[str, Split]:
            return {label: Split(float(cell["wait_us"]), float(cell["transfer_us"]))
                    for label, cell in (doc.get(key) or {}).items()}

        def figures(key: str) -> dict[str, float]:
            return {label: float(value) for label, value in (doc.get(key) or {}).items()}
        def number(key: str) -> float | None:
            return None if doc.get(key) is None else float(doc[key])
        return cls(splits("by_kind"), splits("by_group"), splits("by_phase"), splits("by_kind_phase"),
                   figures("wait_by_peer"), figures("idle_by_host"), figures("idle_queued_by"),
                   number("idle_host_us"), number("idle_queued_us"), figures("idle_unknown_by_phase"))


@dataclass(frozen=True)
class ExcludedStep:
    step: int
    role: str  # warm-up | drain | outlier
    reason: str


@dataclass(frozen=True)
class TypicalStep:
    """The job's typical step: a steady one, its leaves the mean over the ranks that have it."""

    step: int
    leaves: Leaves
    ranks: int
    steady_steps: tuple[int, ...]
    excluded: tuple[ExcludedStep, ...]
    details: Details
    wait_source: str

    @property
    def step_time_us(self) -> float:
        return self.leaves.step_time_us

    @property
    def exposed_share(self) -> float | None:
        return self.leaves.exposed_share

    @property
    def idle_share(self) -> float | None:
        return self.leaves.idle_share

    def role(self, step: Any) -> str:
        if step == self.step:
            return TYPICAL
        try:
            return self._roles.get(step, UNMEASURED)
        except TypeError:  # an unhashable step number (a hostile saved result's): no role
            return UNMEASURED

    @cached_property
    def _roles(self) -> dict[Any, str]:
        """The role of each step other than the typical one (a job has one per rank-step to tell)."""
        roles = {}
        for e in reversed(self.excluded):  # the first of equal steps wins, as a search in order would
            roles[e.step] = e.role
        roles.update(dict.fromkeys(self.steady_steps, STEADY))
        return roles

    @property
    def reason(self) -> str:
        """Why this step: in words, for the views that say which step they quote."""
        left_out = "; ".join(f"step {e.step} {e.role}" for e in self.excluded)
        return (f"the steady step whose time (mean over ranks) is nearest the median of the "
                f"{len(self.steady_steps)} steady step(s)" + (f" (left out: {left_out})" if left_out else ""))


@dataclass(frozen=True)
class RankStep:
    """One rank's step: its time, its role in the job and, where the job analysis made them, its
    leaves and finer leaves; the whole-window figures as measured (µs)."""

    rank: int
    step: int
    role: str
    step_time_us: float
    leaves: Leaves | None
    wait_by_peer: Mapping[str, float]
    idle_by_host: Mapping[str, float]
    compute_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    busy_us: float
    overlap_pct: float | None
    # windows[phase] = (start_us, end_us, compute_us) of the phase's compute kernels, in job
    # time (the collective rows' clock)
    windows: Mapping[str, tuple[float, float, float]]
    low_precision_compute_us: float
    cpu_step_us: float | None  # the ProfilerStep range on the CPU
    forward_attention_kernels: int  # one per transformer block and forward pass (analyzer.rank.steps)
    # idle with work launched and waiting (the rest of idle is the host's: ``idle_by_host``);
    # None: a result saved before the split
    idle_queued_us: float | None = None

    @property
    def overlap_share(self) -> float | None:
        """The step's communication time hidden under compute (None: no communication)."""
        return self.overlap_us / self.comm_us if self.comm_us > 0 else None


@dataclass(frozen=True)
class RankFacts:
    """One rank: its host, its steps, and its leaves of the job's typical step."""

    rank: int
    host: str | None
    path: str
    steps: tuple[RankStep, ...]
    typical: Leaves | None  # its leaves of the job's typical step (None: it lacks that step)
    typical_details: Details | None
    span_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    busy_us: float = 0.0  # whole trace, as the four above
    compute_us: float = 0.0
    idle_us: float = 0.0  # its GPU span with nothing running, whole trace (analyzer.rank.timeline)

    def step(self, number: Any) -> RankStep | None:
        return next((s for s in self.steps if s.step == number), None)

    def span_pct(self, us: float) -> float | None:
        """``us`` as a percentage of its GPU span, whole trace (None: no GPU span): the text
        per-rank whole-trace table and the HTML per-rank bars of a job without a typical step."""
        return 100.0 * us / self.span_us if self.span_us else None

    # its whole trace in leaves, for a job without a typical step (the HTML per-rank bars)
    @property
    def compute_only_us(self) -> float:
        """Its compute not overlapped by communication, over the whole trace."""
        return max(self.compute_us - self.overlap_us, 0.0)

    @property
    def other_gpu_us(self) -> float:
        """Its GPU busy time that is neither compute nor exposed communication (copies, memsets)."""
        return max(self.busy_us - self.compute_us - self.exposed_comm_us, 0.0)

    @property
    def exposed_share(self) -> float | None:
        """Its exposed communication over its whole GPU span, as ``WholeTrace``'s of one rank
        (None: no GPU span): the gate's per-rank samples of the whole-trace fallback."""
        return self.exposed_comm_us / self.span_us if self.span_us > 0 else None

    @property
    def overlap_share(self) -> float | None:
        """Its communication hidden under compute over the whole trace (None: no communication)."""
        return self.overlap_us / self.comm_us if self.comm_us > 0 else None


@dataclass(frozen=True)
class WholeTrace:
    """The job's figures when it has no typical step (no step breakdown): each rank's whole GPU
    span, mean over the ranks with GPU activity; the shares are the figures' ratios, as the
    typical step's (mean exposed / mean span = Σ exposed / Σ span). The one fallback every
    view and the gate quote (``JobModel.whole_trace``)."""

    ranks: int
    span_us: float
    exposed_us: float
    busy_us: float
    comm_us: float
    overlap_us: float
    # the mean of the ranks' measured idle (``RankFacts.idle_us``: span - busy, in ns, by the
    # rank analysis): one route to idle, not mean span - mean busy worked out again here
    idle_us: float

    @property
    def exposed_share(self) -> float | None:
        return self.exposed_us / self.span_us if self.span_us > 0 else None

    @property
    def idle_share(self) -> float | None:
        return self.idle_us / self.span_us if self.span_us > 0 else None

    @property
    def overlap_share(self) -> float | None:
        """Communication hidden under compute over the whole trace (None: no communication)."""
        return self.overlap_us / self.comm_us if self.comm_us > 0 else None

    @classmethod
    def of(cls, ranks: tuple[RankFacts, ...]) -> WholeTrace | None:
        active = [r for r in ranks if r.span_us > 0]
        if not active:
            return None
        n = len(active)
        return cls(n, *(sum(getattr(r, key) for r in active) / n
                        for key in ("span_us", "exposed_comm_us", "busy_us", "comm_us", "overlap_us", "idle_us")))


@dataclass(frozen=True)
class GroupFacts:
    """A process group with collectives: its role, where it runs and its link."""

    name: str | None
    label: str | None  # the name it goes by in breakdowns, metrics and diffs (analyzer.job.attribution.group_label)
    description: str | None
    ranks: tuple[int, ...] | None
    size: int | None
    role: str
    nodes: int | None
    cross_node: bool | None
    kinds: tuple[str, ...]
    collectives: int
    link: Link | None  # the fit of its collectives, else the hardware profile's
    fit: str
    fit_source: str
    # the bus bandwidth of its label's groups in the typical step, or why there is none
    # (analyzer.job.busbw: the one figure text, HTML, JSON, gate and diff quote)
    busbw: GroupBusbw | None
    beta_gbps: float | None = None  # its α-β fit's β (``groups[].beta_gbps``), None: no fit

    @property
    def busbw_gbps(self) -> float | None:
        return self.busbw.gbps if self.busbw is not None else None

    def beta_pct(self, busbw_gbps: float | None) -> float | None:
        """A bus bandwidth as a percentage of the group's fitted β (None: no figure or no β): the
        HTML collective tables' "% of β" of each (kind, size bucket) line."""
        return 100 * busbw_gbps / self.beta_gbps if busbw_gbps is not None and self.beta_gbps else None


@dataclass(frozen=True)
class RankLateness:
    """How late a rank arrives at the matched collectives, and the waiting it causes (µs, whole
    trace, summed over the others): analyzer.job.crossrank."""

    rank: int
    times_last: int
    wait_caused_us: float
    wait_incurred_us: float
    clock_offset_us: float


@dataclass(frozen=True)
class HostSidePer:
    """The collectives only the host's ops record, per ``basis`` (each rank and step where the
    rows have steps, else each rank's whole trace): per kind, in order of first appearance,
    (kind, count per basis, bytes per basis; None: no size known)."""

    basis: str
    per: int
    kinds: tuple[tuple[str, float, float | None], ...]

    @classmethod
    def of(cls, host: Mapping[str, Any]) -> HostSidePer:
        per = max(host["windows"], host["ranks"], 1)
        basis = "rank and step" if host["windows"] else "rank (whole trace)"
        return cls(basis, per, tuple((kind, count / per, size / per if size else None) for kind, count, size in host["kinds"]))


def cached_at_peak_bytes(step: Mapping[str, Any]) -> int | None:
    """A rank-step's memory cached by the allocator but unused at its allocated peak: reserved
    at the peak less allocated (the ``memory`` section's step, analyzer.rank.memory); None: no
    reserved figure. The text memory table's and ``memory_df``'s "cached"."""
    reserved = step.get("reserved_at_peak_bytes")
    return None if reserved is None else reserved - (step.get("peak_allocated_bytes") or 0)


class JobModel:
    """The typed facts of one diagnosed job (see the module docstring). Build it with
    ``JobModel.of(result)``: once per Result, after the job analyses."""

    def __init__(self, result: JobSections):
        self._result = result
        job = result.job
        self.world_size: int = int(job.get("world_size") or len(result.ranks) or 1)
        self.ranks_given: int = len(result.ranks)
        self.strategy: str = str(job.get("strategy") or "unknown")
        self.dp_strategy: str = str(job.get("dp_strategy") or job.get("strategy") or "unknown")
        self.workload: str | None = job.get("workload")  # training | inference | None (analyzer.rank.workload)
        self.parallelism: Mapping[str, int | None] = {
            dim: (entry or {}).get("size") for dim, entry in (job.get("parallelism") or {}).items()}

    @cached_property
    def typical(self) -> TypicalStep | None:
        return _typical(self._result.attribution)

    @cached_property
    def ranks(self) -> tuple[RankFacts, ...]:
        origin = int(self._result.job.get("time_origin_ns") or 0)
        return tuple(_rank_facts(r, self.typical, origin) for r in self._result.ranks)

    @cached_property
    def compute(self) -> JobCompute | None:
        """The typical step's FLOPs from recorded shapes, their throughput and MFU (the ``mfu``
        section's ``from_shapes`` and each rank's ``compute``); None: no op gave FLOPs."""
        return JobCompute.of((self._result.mfu or {}).get("from_shapes"), self._result.ranks, self.hardware)

    @cached_property
    def lateness(self) -> tuple[RankLateness, ...]:
        return _lateness(self._result.stragglers)

    @classmethod
    def of(cls, result: JobSections) -> JobModel:
        """The Result's model, built on first use and kept with it (``Result.model``)."""
        return result.model

    @property
    def workload_text(self) -> str:
        """The workload in words, with what tells it (analyzer.rank.workload)."""
        return WORKLOAD_TEXT.get(self.workload or "", "unknown (the trace cannot tell)")

    @cached_property
    def whole_trace(self) -> WholeTrace | None:
        """The figures without a typical step (``WholeTrace``); None: no rank has GPU activity."""
        return WholeTrace.of(self.ranks)

    # ---------------------------------------------------------------- the typical step's figures
    @property
    def step_time_us(self) -> float | None:
        """The job's step time: the typical step's, mean over ranks. Every view quotes it."""
        return self.typical.step_time_us if self.typical else None

    def step_pct(self, us: float | None) -> float | None:
        """``us`` as a percentage of the job's step time (a finding's gain, the findings' joint
        gain); None: no figure or no typical step. The one formula every view quotes."""
        step = self.step_time_us
        return 100 * us / step if us is not None and step else None

    @property
    def exposed_share(self) -> float | None:
        return self.typical.exposed_share if self.typical else None

    @property
    def idle_share(self) -> float | None:
        return self.typical.idle_share if self.typical else None

    @property
    def overlap_share(self) -> float | None:
        """The typical step's communication hidden under compute: overlap / communication time,
        each summed over the ranks that measured the step (None: no communication in it)."""
        steps = [s for s in self.rank_steps() if s.role == TYPICAL and s.comm_us > 0]
        comm = sum(s.comm_us for s in steps)
        return sum(s.overlap_us for s in steps) / comm if comm else None

    @property
    def gpu_events(self) -> int:
        """GPU activities recorded over all the ranks given (0: CPU-only traces)."""
        return sum(int(r.gpu_event_count or 0) for r in self._result.ranks)

    @property
    def unread_device_events(self) -> int:
        """Events of unknown categories that look like device work, over all the ranks given:
        with GPU work unread, a trace without GPU events is not called CPU-only."""
        return sum(int((r.markers_seen or {}).get("unread_device_events", 0)) for r in self._result.ranks)

    @property
    def step_source(self) -> str | None:
        """How the typical step was found where it is no ProfilerStep (an annotation, the whole
        trace), else None."""
        return (self._result.attribution or {}).get("step_source")

    @property
    def idle_split_note(self) -> str | None:
        """Why the typical step's split of idle into host-caused and queued is unreliable, or None."""
        return (self._result.attribution or {}).get("idle_split_note")

    def step_role(self, step: Any) -> str:
        return self.typical.role(step) if self.typical else UNMEASURED

    def rank(self, number: int) -> RankFacts | None:
        return next((r for r in self.ranks if r.rank == number), None)

    def rank_steps(self) -> Iterator[RankStep]:
        for rank in self.ranks:
            yield from rank.steps

    def steady_windows(self) -> set[tuple[int, Any]]:
        """The (rank, step) of every typical or steady rank-step."""
        return {(s.rank, s.step) for s in self.rank_steps() if s.role in (TYPICAL, STEADY)}

    # ---------------------------------------------------------------- job-wide facts
    @cached_property
    def topology(self) -> Topology:
        result = self._result
        if result.topology:
            return Topology.from_dict(result.topology, result.job.get("world_size"))
        return build_topology(result.ranks)

    @cached_property
    def hardware(self) -> HardwareAssumptions:
        """The hardware the job analysis resolved (the user's --gpu / --nics-per-node / --nic-gbps
        included); resolved here from the devices only for a Result without job analyses."""
        result = self._result
        if result.hardware:
            return HardwareAssumptions.from_dict(result.hardware)
        devices = next((r.devices for r in result.ranks if r.devices), [])
        names = [d.get("name") for d in devices if d.get("name")]
        memory = [d.get("total_mem_bytes") for d in devices if d.get("name")]
        return resolve_hardware(names, memory or None, gpus_per_node=self.topology.gpus_per_node)

    @cached_property
    def groups(self) -> tuple[GroupFacts, ...]:
        return tuple(self._group(g) for g in self._result.groups or [])

    def group(self, name: Any) -> GroupFacts | None:
        """The group of this name (``groups[].name``; str or int), None when unknown."""
        return self._groups_by_name.get(None if name is None else str(name))

    @cached_property
    def _groups_by_name(self) -> dict[str | None, GroupFacts]:
        return {(None if g.name is None else str(g.name)): g for g in self.groups}

    @cached_property
    def collectives(self) -> CollectiveColumns:
        return CollectiveColumns.of(self._result)

    @property
    def digest(self) -> dict[str, Any]:
        """What the views quote from every collective row (analyzer.job.digest): saved with a
        large result, else computed from the rows."""
        from analyzer.job.digest import collective_digest
        return collective_digest(self._result)

    @property
    def size_edges(self) -> tuple[float, ...]:
        """The edges (bytes) of the size buckets the digest's collective tables count by
        (analyzer.job.digest.SIZE_EDGES): bucket i is [edge i-1, edge i), the last one past the
        edges, one more "size unknown"."""
        from analyzer.job.digest import SIZE_EDGES
        return SIZE_EDGES

    @cached_property
    def scatter_frames(self) -> dict[str, dict[str, Any] | None]:
        """Per group name of the digest, its α-β scatter's frame: the axes' decades, the fit's
        line and S* (analyzer.job.digest.scatter_frame; None: fewer than two points)."""
        from analyzer.job.digest import scatter_frame
        fits = {str(g.get("name")): g for g in self._result.groups or [] if isinstance(g, dict)}
        return {entry["name"]: scatter_frame(entry["scatter"], fits.get(entry["name"])) for entry in self.digest["groups"]}

    @cached_property
    def group_totals(self) -> dict[str, tuple[float, float]]:
        """Per group name of the digest, (time, exposed time) of its collectives over every step
        of the trace (µs): the sums of its (kind, size bucket) lines, in their order
        (analyzer.job.digest.group_totals). Not the diff's totals, which count the steady steps."""
        from analyzer.job.digest import group_totals
        return group_totals(self.digest["groups"])

    @cached_property
    def host_side(self) -> HostSidePer | None:
        """The host-side collectives (the digest's ``host_side``) per rank and step, else per
        rank (whole trace); None: every collective ran on the GPU."""
        host = self.digest["host_side"]
        return None if not host else HostSidePer.of(host)

    @cached_property
    def joint_claims(self) -> tuple[Claim, ...]:
        """Each finding's part of the joint estimate as the job analysis wrote it (the
        ``recoverable`` section's ``findings``: ``Recoverable.to_dict``), in gain order; a saved
        result reads back the same. Empty: no joint estimate."""
        section = getattr(self._result, "recoverable", None)
        if not isinstance(section, dict):
            return ()
        return tuple(Claim(str(f.get("rule")), float(f.get("gain_us") or 0.0), dict(f.get("counted_us") or {}),
                           dict(f.get("shared_us") or {}))
                     for f in section.get("findings") or [] if isinstance(f, dict))

    @property
    def worked_examples(self) -> dict[str, float]:
        """The models appendix's worked figures (analyzer.model.formulas.worked_examples): the
        same for every job, computed by the formulas the analyses use."""
        from analyzer.model.formulas import worked_examples
        return worked_examples()

    @cached_property
    def group_busbw(self) -> dict[str, GroupBusbw]:
        """Each group label's bus bandwidth (analyzer.job.busbw): the typical step's, over the
        collectives whose transfer time is measured; its samples per rank and steady step. From
        the digest's sums (a saved large result's too: no rows read)."""
        return busbw_figures(self.digest["busbw"])

    def consistently_last(self) -> dict[int, str]:
        """rank -> why: the ranks that arrive last at least half the matched collectives (the
        arrival order alone, whether or not straggler-rank could run: a CPU-only job's, a hung
        job's history). Not a verdict: straggler-rank decides who is a straggler."""
        section = self._result.stragglers or {}
        matched = section.get("matched_collectives") or 0
        out = {}
        for late in self.lateness:
            share = late.times_last / matched if matched else 0.0
            if share >= CONSISTENTLY_LAST:
                out[late.rank] = (f"last to arrive at {100 * share:.0f}% of matched collectives, causing "
                                  f"{fmt_us(late.wait_caused_us)} of waiting on the others in all")
        return dict(sorted(out.items()))

    def caused_waiting_us(self, rank: int) -> float:
        """The waiting rank ``rank`` caused the others over the whole trace (0 when unknown)."""
        return next((late.wait_caused_us for late in self.lateness if late.rank == rank), 0.0)

    def _group(self, g: Mapping[str, Any]) -> GroupFacts:
        ranks = tuple(g["ranks"]) if g.get("ranks") else None
        size = g.get("size")
        nodes = g.get("nodes")
        link = None
        if size:
            members = len(ranks) if ranks else int(size)
            link = group_link(g, self.hardware, int(size), int(nodes or 1), members)
        return GroupFacts(g.get("name"), group_label(g), g.get("description"), ranks, size,
                          str(g.get("role") or "unknown"), nodes, g.get("cross_node"), tuple(g.get("kinds") or ()),
                          int(g.get("collectives") or 0), link, str(g.get("fit") or ""), str(g.get("fit_source") or ""),
                          self.group_busbw.get(group_label(g) or ""), sourced_figure(g.get("beta_gbps")))


def leaf_names(leaves: Any) -> list[str]:
    """The names of the leaves a finding recovers (``recovers``'s keys), in the step's order."""
    return [LEAF_NAMES[leaf] for leaf in LEAVES if leaf in (leaves or {})]


def _typical(section: Mapping[str, Any] | None) -> TypicalStep | None:
    if not section or not section.get("step_time_us"):
        return None
    excluded = tuple(ExcludedStep(e["step"], e.get("role") or _role_of_reason(e.get("reason")), str(e.get("reason") or ""))
                     for e in section.get("excluded_steps") or [])
    return TypicalStep(section["step"], Leaves.of(section), int(section.get("ranks") or 0),
                       tuple(section.get("steady_steps") or ()), excluded, Details.of(section.get("details")),
                       str(section.get("wait_source") or ""))


def _role_of_reason(reason: Any) -> str:
    """The role a saved result's excluded step had before ``role`` was written (its reason's
    first word: "drain: ...", "warm-up: ...", "outlier: ...")."""
    word = str(reason or "").split(":", 1)[0].strip()
    return word if word in (WARM_UP, DRAIN, OUTLIER) else OUTLIER


def _rank_facts(rank: Any, typical: TypicalStep | None, origin_ns: int) -> RankFacts:
    steps = tuple(_rank_step(rank.rank, s, typical, origin_ns) for s in rank.steps)
    tb = rank.time_breakdown
    metrics = rank.metrics
    return RankFacts(rank.rank, rank.host, rank.path, steps, Leaves.of(tb) if tb else None,
                     Details.of(tb.get("details")) if tb else None, float(metrics.get("span_us") or 0.0),
                     float(metrics.get("comm_us") or 0.0), float(metrics.get("overlap_us") or 0.0),
                     float(metrics.get("exposed_comm_us") or 0.0), float(metrics.get("busy_us") or 0.0),
                     float(metrics.get("compute_us") or 0.0), float(metrics.get("idle_us") or 0.0))


def _rank_step(rank: int, entry: Mapping[str, Any], typical: TypicalStep | None, origin_ns: int) -> RankStep:
    tb = entry.get("time_breakdown") or {}
    leaves = Leaves(float(entry["step_time_us"]), *(float(tb[leaf]) for leaf in LEAVES)) \
        if "exposed_wait_us" in tb and entry.get("step_time_us") is not None else None
    role = typical.role(entry["step"]) if typical else UNMEASURED
    if leaves is None and role in (TYPICAL, STEADY):
        role = UNMEASURED  # this rank has no breakdown of the step
    return RankStep(rank, entry["step"], role, float(entry.get("step_time_us") or 0.0), leaves,
                    dict(tb.get("wait_by_peer") or {}), dict(tb.get("idle_by_host") or {}),
                    float(entry.get("compute_us") or 0.0), float(entry.get("comm_us") or 0.0),
                    float(entry.get("overlap_us") or 0.0), float(entry.get("exposed_comm_us") or 0.0),
                    float(entry.get("busy_us") or 0.0), entry.get("overlap_pct"),
                    {phase: ((w["start_ns"] - origin_ns) / 1000.0, (w["end_ns"] - origin_ns) / 1000.0, w["compute_us"])
                     for phase, w in (entry.get("phase_windows") or {}).items()},
                    float(entry.get("low_precision_compute_us") or 0.0), entry.get("cpu_step_us"),
                    int(entry.get("forward_attention_kernels") or 0),
                    None if tb.get("idle_queued_us") is None else float(tb["idle_queued_us"]))


def _lateness(section: Mapping[str, Any] | None) -> tuple[RankLateness, ...]:
    return tuple(RankLateness(int(b["rank"]), int(b.get("times_last") or 0), float(b.get("wait_caused_us") or 0.0),
                              float(b.get("wait_incurred_us") or 0.0), float(b.get("clock_offset_us") or 0.0))
                 for b in (section or {}).get("by_rank") or [])


# ---------------------------------------------------------------- what the findings recover
@dataclass(frozen=True)
class Claim:
    """The part of one finding's gain the joint estimate counts, leaf by leaf, and the part it
    does not because earlier findings (larger gains) already claimed that leaf's time."""

    rule: str
    gain_us: float
    counted_us: Mapping[str, float]
    shared_us: Mapping[str, float]

    @property
    def shared_total_us(self) -> float:
        """Its gain other findings already claimed, over every leaf it shares (the HTML joint note)."""
        return sum(self.shared_us.values())


@dataclass(frozen=True)
class Recoverable:
    """What the findings together could give back per typical step (µs): each finding's gain
    split over the leaves it recovers (``Finding.recovers``), a leaf's time counted once however
    many findings claim it (in gain order), and the lost time never beyond what the typical step
    loses (exposed communication + idle, ``lost_bound_us``); compute a finding would save
    (a slow rank's kernels) is counted apart, against the compute-only leaf.

    ``replayed_us``: what every finding's fix applied at once saves on the replay of the
    measured job (analyzer.whatif.counterfactual; the findings in ``replayed``) plus what the
    leaves count of the findings the replay cannot express; the joint estimate is that, as far
    as the typical step's leaves hold it (the leaf count above). None: the job cannot be
    replayed, and the joint estimate is the leaf count."""

    step_time_us: float
    claims: tuple[Claim, ...]
    lost_bound_us: float
    replayed_us: float | None = None
    replayed: tuple[str, ...] = ()

    @property
    def sum_us(self) -> float:
        """The findings' gains added up, as if they shared no time."""
        return sum(c.gain_us for c in self.claims)

    def counted(self, leaves: tuple[str, ...]) -> float:
        return sum(v for c in self.claims for leaf, v in c.counted_us.items() if leaf in leaves)

    @property
    def _leaf_lost_us(self) -> float:
        return min(self.counted(LOST_LEAVES), self.lost_bound_us)

    @property
    def _scale(self) -> float:
        """The replayed joint estimate over the leaf count (1 without a replay, never above 1)."""
        leaf = self._leaf_lost_us + self.counted(("compute_only_us", "other_gpu_us"))
        if self.replayed_us is None or leaf <= 0.0:
            return 1.0
        return max(0.0, min(1.0, self.replayed_us / leaf))

    @property
    def lost_us(self) -> float:
        """Exposed communication and idle the findings together recover (≤ ``lost_bound_us``)."""
        return self._leaf_lost_us * self._scale

    @property
    def compute_us(self) -> float:
        return self.counted(("compute_only_us", "other_gpu_us")) * self._scale

    @property
    def joint_us(self) -> float:
        return self.lost_us + self.compute_us

    @property
    def replayed_all(self) -> bool:
        """Whether the replay applied every finding's fix that has a gain."""
        return self.replayed_us is not None and set(self.replayed) >= {c.rule for c in self.claims if c.gain_us > 0}

    @property
    def source(self) -> str:
        if self.replayed_us is None:
            return "the findings' gains over the typical step's leaves, each leaf counted once (the job cannot be replayed)"
        if self.replayed_all:
            return "all fixes together, replayed (as far as the typical step's leaves hold it)"
        return ("all fixes together, replayed where the replay expresses the fix ("
                + ", ".join(self.replayed) + "), the others' gains counted over the typical step's leaves "
                "(as far as the leaves hold it)")

    @property
    def shared(self) -> list[tuple[str, str, float]]:
        """(rule, leaf, µs) of each gain not counted again because other findings claim that time."""
        return [(c.rule, leaf, v) for c in self.claims for leaf, v in sorted(c.shared_us.items()) if v > 0.05]

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_us": round(self.step_time_us, 3), "sum_us": round(self.sum_us, 1),
                "joint_us": round(self.joint_us, 1), "source": self.source,
                "replayed_us": None if self.replayed_us is None else round(self.replayed_us, 1),
                "replayed_rules": list(self.replayed), "replayed_all": self.replayed_all, "lost_us": round(self.lost_us, 1),
                "compute_us": round(self.compute_us, 1), "lost_bound_us": round(self.lost_bound_us, 3),
                "findings": [{"rule": c.rule, "gain_us": round(c.gain_us, 1),
                              "counted_us": {k: round(v, 1) for k, v in sorted(c.counted_us.items())},
                              "shared_us": {k: round(v, 1) for k, v in sorted(c.shared_us.items()) if v > 0.05}}
                             for c in self.claims]}


def split_gain(gain_us: float, leaves: Mapping[str, float] | tuple[str, ...] | str, typical: TypicalStep | None
               ) -> dict[str, float]:
    """A finding's gain as µs per leaf of the typical step, given as such or over the named
    leaves in the order named (a bucket fix gives back exposed transfer first, then waiting);
    each part at most that leaf's time in the typical step (mean over ranks): a fix cannot give
    back more of a leaf than the step has. What the leaves cannot hold is in none of them (the
    parts then add up to less than the gain; rules.engine caps the rule's own estimate at their
    sum). Without a typical step nothing bounds them: the last leaf holds what remains."""
    if isinstance(leaves, Mapping):
        given = {leaf: float(v) for leaf, v in leaves.items() if leaf in LEAVES}
        return given if typical is None else {leaf: min(v, typical.leaves.leaf(leaf)) for leaf, v in given.items()}
    names = [leaves] if isinstance(leaves, str) else [leaf for leaf in leaves if leaf in LEAVES]
    if gain_us <= 0:  # nothing to give back: the leaf the fix is about, with none of it
        return {names[0]: 0.0} if names else {}
    out: dict[str, float] = {}
    left = gain_us
    for i, leaf in enumerate(names):
        last = i == len(names) - 1
        take = left if typical is None and last else min(left, typical.leaves.leaf(leaf) if typical else 0.0)
        if take > 0 or not out and last:
            out[leaf] = take
        left -= take
    return out


def recoverable(typical: TypicalStep, findings: list[Mapping[str, Any]],
                replay: tuple[float, tuple[str, ...]] | None = None) -> Recoverable:
    """The joint estimate of ``findings`` (in the order given: largest gain first) on the
    typical step: each takes what is left of the leaves it recovers; ``replay``: (what the
    fixes of the findings it names save replayed at once, those findings' rules), to which the
    others' counted leaves are added (``Recoverable.replayed_us``)."""
    left = {leaf: typical.leaves.leaf(leaf) for leaf in LEAVES}
    claims = []
    for f in findings:
        gain, parts = f.get("estimated_gain_us"), f.get("recovers") or {}
        if not gain or not parts:
            continue
        counted, shared = {}, {}
        for leaf, want in parts.items():
            take = min(float(want), left.get(leaf, 0.0))
            left[leaf] = left.get(leaf, 0.0) - take
            counted[leaf], shared[leaf] = take, float(want) - take
        claims.append(Claim(str(f.get("rule")), float(gain), counted, shared))
    if replay is None:
        return Recoverable(typical.step_time_us, tuple(claims), typical.leaves.lost_us)
    together, rules = replay
    rest = sum(sum(c.counted_us.values()) for c in claims if c.rule not in rules)
    return Recoverable(typical.step_time_us, tuple(claims), typical.leaves.lost_us, together + rest, rules)
