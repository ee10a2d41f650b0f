"""Scaling what-if: project a measured job onto another configuration.

``project(result, Scenario(...)) -> Projection`` needs a Result that went through
:func:`analyzer.job.analysis.analyze_job` (``diagnose`` does it). Compute is taken as measured
(weak scaling: the same work per GPU); only communication is re-modelled.

Every collective keeps its measured transfer time scaled by the model ratio
``T_model(target link, N') / T_model(measured link, N)`` (models.md §2; α/β fitted per group,
else the hardware profile); collectives whose size or kind is unknown keep their measured
duration. Then, per rank and step:

- DDP: the bucket pipeline of models.md §4 (:func:`analyzer.model.formulas.ddp_bucket_pipeline`) with
  the measured gradient-ready times (a bucket's all-reduce start when its stream was idle, else
  interpolated in bytes between such anchors and the end of backward) and backward end; the step
  changes by the change of the exposed tail. ``--bucket-mb`` re-buckets the measured buckets.
- FSDP: a replay of the measured schedule in *compute-progress* time (wall time minus exposed
  communication): each collective is issued at its measured progress point (its start when its
  stream was idle; the end of the previous exposed all-gather for a prefetched one; else
  interpolated) and is needed by compute at its measured point (its end when exposed; the next
  prefetch for a hidden all-gather; the end of backward for reduce-scatters and all-reduces);
  compute stalls by however late a collective is. The step changes by (new stalls − measured
  exposed communication).
- FSDP units (``--fsdp-units N``): the measured all-gathers and reduce-scatters replaced by N
  units of equal size (models.md §5: the per-layer wrap policy a single-unit job lacks), each
  all-gathered one unit ahead of its share of the measured forward / backward compute and
  reduce-scattered when its share of backward is done, replayed as above; each new collective
  keeps the measured ones' ratio to the α-β model. From DDP, the gradient buckets regrouped into
  N units (one per transformer block) instead of one unit per bucket.
- Across strategies: FSDP -> DDP all-reduces each unit's gradients (ready where its
  reduce-scatter was issued) through the bucket pipeline; DDP -> FSDP takes each gradient bucket
  as one unit and replays prefetched all-gathers, reduce-scatters and HSDP all-reduces on the
  measured forward / backward compute. Sharded optimizers' compute scales with the shard size.

Waiting for late ranks is not carried over: each rank's own schedule is projected and a step
takes as long as its slowest rank.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from analyzer.base import intervals as iv
from analyzer.base.memo import memo
from analyzer.base.rowtable import Numbers, RowTable
from analyzer.model import formulas as models
from analyzer.job.columns import CollectiveColumns, categorical, distinct_rows
from analyzer.model.link import Link, cross_node_beta, node_nic_gbps
from analyzer.whatif import compute as compute_scaling
from analyzer.job.ddp import bucket_ready_array, gradient_pieces, interpolate_ready, rebucket
from analyzer.base.errors import ConfigError
from analyzer.base.limits import MAX_FSDP_UNITS

STRATEGY_CHOICES = ("ddp", "fsdp-full", "fsdp-grad-op", "hsdp")
_EPS_US = 2.0  # a kernel starting within this of its stream predecessor's end was queued behind it
_GRAD_REDUCTIONS = ("reduce_scatter", "allreduce")


@dataclass(frozen=True)
class Scenario:
    """A target configuration; None keeps the measured value."""

    gpus: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    nics_per_node: int | None = None
    nic_gbps: float | None = None  # one NIC's achievable one-way GB/s
    strategy: str | None = None  # ddp | fsdp-full | fsdp-grad-op | hsdp
    bucket_mb: float | None = None  # DDP bucket_cap_mb (MiB)
    model_params: float | None = None
    tokens_per_step: float | None = None  # whole job's, measured configuration
    trace_nics_per_node: int | None = None  # NICs per node of the *measured* job
    fsdp_units: int | None = None  # FSDP: this many units of equal size (a per-layer wrap policy)
    # keep the global batch (strong scaling): each GPU's work scales by measured / target GPUs,
    # its compute with the efficiency measured per shape (analyzer.whatif.compute)
    strong_scaling: bool = False


@dataclass
class Projection:
    measured: dict[str, Any]
    projected: dict[str, Any]
    assumptions: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the measured run's (what diagnose says of its input)

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "projected": self.projected,
                "assumptions": self.assumptions, "notes": self.notes, "warnings": self.warnings}


def _value(value: Any, origin: str, source: str) -> dict[str, Any]:
    return {"value": value, "origin": origin, "source": source}


# ---------------------------------------------------------------- configuration and links
@dataclass(frozen=True)
class Config:
    strategy: str
    gpus: int
    gpus_per_node: int
    nodes: int
    nics_per_node: int
    nic_gbps: float | None
    intra: Link | None
    nic_alpha_us: float | None

    def link(self, members_per_node: float, nodes: int) -> Link | None:
        """α/β of a group (models.md §2); None when the hardware is unknown."""
        if nodes <= 1:
            return self.intra
        if self.intra is None or self.nic_gbps is None or self.nic_alpha_us is None:
            return None
        return Link(self.nic_alpha_us, cross_node_beta(self.intra.beta_gbps, self.nics_per_node, self.nic_gbps,
                                                       members_per_node, self.gpus_per_node))

    def role_group(self, role: str) -> tuple[int, int, float]:
        """(size, nodes, members per node) of the group a role's collectives use."""
        if role == "replicate":
            return self.nodes, self.nodes, 1.0
        if role == "shard" and self.strategy == "hsdp":
            return min(self.gpus, self.gpus_per_node), 1, float(min(self.gpus, self.gpus_per_node))
        return self.gpus, self.nodes, self.gpus / self.nodes


def measured_strategy(result: Any) -> str:
    index = GroupIndex(result)
    strategy = result.job.get("dp_strategy") or result.job.get("strategy", "unknown")  # data parallel
    if strategy == "ddp":
        return "ddp"
    # by column: each projection asks, and the rows are tens of thousands
    columns = CollectiveColumns.of(result)
    gathers = columns.kind.isin(("allgather",))
    if strategy == "unknown" and not gathers.any():
        return "ddp"
    replicate = np.array([index.role({"group": group}) == "replicate" for group in columns.group.names], dtype=bool)
    if (columns.kind.isin(("allreduce",)) & replicate[columns.group.codes]).any():
        return "hsdp"
    if (gathers & columns.phase.isin(("backward",))).any():
        return "fsdp-full"
    return "fsdp-grad-op"


class GroupIndex:
    """The ``groups`` entry of a collective row, and the role of its group: ``world`` (every
    rank), ``shard`` (inside one node), ``replicate`` (one rank per node), else ``other``."""

    def __init__(self, result: Any):
        self.world = result.job.get("world_size")
        # analyze_job keys its groups by name (the rows of one group may differ in ranks detail)
        self.by_name = {str(g["name"]): g for g in (result.groups or []) if g["name"] is not None}

    def entry(self, row: dict[str, Any]) -> dict[str, Any] | None:
        name = (row.get("group") or {}).get("name")
        return None if name is None else self.by_name.get(str(name))

    def role(self, row: dict[str, Any]) -> str:
        entry = self.entry(row)
        if entry is None or not entry.get("size"):
            return "other"
        if entry["size"] == self.world:
            return "world"
        if entry.get("nodes") and entry["nodes"] > 1 and entry["size"] == entry["nodes"]:
            return "replicate"
        if entry.get("nodes") == 1:
            return "shard"
        return "other"


def _best_fit(result: Any, cross: bool) -> dict[str, Any] | None:
    fitted = [g for g in (result.groups or [])
              if g.get("fit_source") in ("fit", "profile-alpha") and g.get("cross_node") is cross]
    return max(fitted, key=lambda g: (g["collectives"], str(g["name"]))) if fitted else None


def measured_config(result: Any, scenario: Scenario, notes: list[str]) -> tuple[Config, dict[str, Any]]:
    model = result.model  # the typed hardware and topology (analyzer.job.model)
    hw, topo = model.hardware, model.topology
    gpus = result.job.get("world_size") or result.job.get("ranks_given")
    g = topo.gpus_per_node
    nodes = max(1, math.ceil(gpus / g))
    assumptions: dict[str, Any] = {
        "measured_gpus": _value(gpus, "measured", "trace world_size"),
        "measured_gpus_per_node": _value(g, "measured" if topo.gpus_per_node_source != "default" else "default",
                                         topo.gpus_per_node_source),
        "measured_nodes": _value(nodes, "measured", "ceil(gpus / gpus_per_node)"),
    }
    intra_fit = _best_fit(result, False)
    if intra_fit:
        intra = Link(intra_fit["alpha_us"], intra_fit["beta_gbps"])
        origin, source = "measured", f"fit of group {intra_fit['name']} ({intra_fit['fit']})"
    elif hw.intra_node_gbps.value is not None:
        intra = Link(hw.intra_node_alpha_us.value, hw.intra_node_gbps.value)
        origin, source = hw.intra_node_gbps.origin, hw.intra_node_gbps.source
    else:
        intra = None
        origin, source = "unknown", "no α/β fit and no GPU profile (pass --gpu)"
        notes.append("intra-node link unknown: collectives keep their measured durations")
    assumptions["intra_alpha_us"] = _value(intra and intra.alpha_us, origin, source)
    assumptions["intra_beta_gbps"] = _value(intra and intra.beta_gbps, origin, source)

    nic_alpha, nic_gbps, nics = hw.nic_alpha_us.value, hw.nic_gbps.value, hw.nics_per_node.value
    nic_src = {key: (getattr(hw, key).origin, getattr(hw, key).source)
               for key in ("nic_alpha_us", "nic_gbps", "nics_per_node")}
    cross_fit = _best_fit(result, True)
    if scenario.trace_nics_per_node:
        nics = scenario.trace_nics_per_node
        nic_src["nics_per_node"] = ("user", "--nics-per-node")
    if cross_fit:
        node_bw = node_nic_gbps(cross_fit["beta_gbps"], cross_fit["size"] / cross_fit["nodes"], g)
        nic_alpha = cross_fit["alpha_us"]
        nic_src["nic_alpha_us"] = ("measured", f"fit of cross-node group {cross_fit['name']}")
        if intra is None or cross_fit["beta_gbps"] >= 0.95 * intra.beta_gbps:
            notes.append("cross-node busbw reaches the intra-node link: NIC bandwidth not measurable")
        else:
            if not scenario.trace_nics_per_node and nic_gbps:
                nics = int(min(g, max(1, round(node_bw / nic_gbps))))
                nic_src["nics_per_node"] = ("measured", f"inferred: fitted node NIC bandwidth {node_bw:.1f} "
                                                        f"GB/s / {nic_gbps:g} GB/s per NIC")
            nic_gbps = node_bw / nics
            nic_src["nic_gbps"] = ("measured", f"fit of cross-node group {cross_fit['name']}: "
                                               f"{node_bw:.1f} GB/s per node / {nics} NIC(s)")
    for key, value in (("nic_alpha_us", nic_alpha), ("nic_gbps", nic_gbps), ("nics_per_node", nics)):
        assumptions[f"measured_{key}"] = _value(value, *nic_src[key])
    strategy = measured_strategy(result)
    assumptions["measured_strategy"] = _value(
        strategy, "measured", f"trace markers ({result.job.get('strategy')}) and collectives: HYBRID_SHARD = "
        "all-reduces in a one-GPU-per-node group; SHARD_GRAD_OP = no backward all-gathers (as a root-only unit)")
    config = Config(strategy, gpus, g, nodes, int(nics), nic_gbps, intra, nic_alpha)
    return config, assumptions


def target_config(base: Config, scenario: Scenario, assumptions: dict[str, Any]) -> Config:
    g = scenario.gpus_per_node or base.gpus_per_node
    if scenario.gpus and scenario.nodes:
        gpus, nodes = scenario.gpus, scenario.nodes
        if gpus != nodes * min(g, gpus) and not (nodes == 1 and gpus <= g):
            raise ConfigError(f"--gpus {gpus} does not equal --nodes {nodes} x --gpus-per-node {g}")
    elif scenario.nodes:
        nodes, gpus = scenario.nodes, scenario.nodes * g
    else:
        gpus = scenario.gpus or base.gpus
        nodes = max(1, math.ceil(gpus / g))
        if gpus > g and gpus % g:
            raise ConfigError(f"--gpus {gpus} does not fill whole nodes of {g} GPUs")
    strategy = scenario.strategy or base.strategy
    if strategy not in STRATEGY_CHOICES:
        raise ConfigError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGY_CHOICES)}")
    target = replace(base, strategy=strategy, gpus=gpus, gpus_per_node=g, nodes=nodes,
                     nics_per_node=scenario.nics_per_node or base.nics_per_node,
                     nic_gbps=scenario.nic_gbps or base.nic_gbps)
    for key, given in (("gpus", scenario.gpus or scenario.nodes), ("gpus_per_node", scenario.gpus_per_node),
                       ("nodes", scenario.nodes or scenario.gpus), ("nics_per_node", scenario.nics_per_node),
                       ("nic_gbps", scenario.nic_gbps), ("strategy", scenario.strategy)):
        value = getattr(target, key)
        assumptions[key] = _value(value, "user" if given else "measured",
                                  "what-if option" if given else "as measured")
    return target


# ---------------------------------------------------------------- per-collective durations
def _model_time(kind: str, size: float, n: int, link: Link) -> float:
    return models.collective_time(kind, size, n, link.alpha_us, link.beta_gbps)


def _measured_link(entry: dict[str, Any] | None, base: Config) -> tuple[Link | None, int] | None:
    if entry is None or not entry.get("size"):
        return None
    if entry.get("alpha_us") is not None and entry.get("beta_gbps"):
        return Link(entry["alpha_us"], entry["beta_gbps"]), entry["size"]
    nodes = entry.get("nodes") or 1
    return base.link(entry["size"] / nodes, nodes), entry["size"]


_NO_GROUP: dict[str, Any] = {}  # a row without a group, read as one without a name


def _ratio_keys(rows: list[dict[str, Any]], role: str | None) -> list[tuple]:
    """What ``Durations.ratio`` of each row depends on (one comprehension: thousands of rows)."""
    return [(None if (name := (row.get("group") or _NO_GROUP).get("name")) is None else str(name),
             row["collective"], row.get("bytes"), bool(row.get("on_gpu")), role) for row in rows]


@dataclass(frozen=True)
class _Transfers:
    """Collective rows as the columns ``Durations.of_rows`` reads: the measured duration, the
    transfer time (the duration less the wait for late ranks), and the index of each row's
    ratio key among the distinct ones, each with one representative row (role: the row's own)."""

    duration: np.ndarray
    transfer: np.ndarray
    key_index: np.ndarray
    representatives: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]]) -> _Transfers:
        index: dict[tuple, int] = {}
        keys = np.array([index.setdefault(key, len(index)) for key in _ratio_keys(rows, None)], dtype=np.intp)
        first = np.unique(keys, return_index=True)[1]  # keys are numbered in order of first use
        duration = np.array([row["dur_us"] for row in rows], dtype=float)
        return cls(duration, duration - _waits(rows), keys, tuple(rows[i] for i in first.tolist()))

    @classmethod
    def of_columns(cls, columns: CollectiveColumns, index: np.ndarray) -> _Transfers:
        """``of`` the rows at ``index`` of ``columns``, their ratio keys told apart by column:
        the group's name (once per group object), the kind, the bytes, on GPU."""
        keys, first = ratio_keys(columns, index)
        duration = columns.dur[index]  # only the representatives made as dicts
        return cls(duration, duration - _waits_at(columns, index), keys, tuple(_rows_at(columns.rows, index[first])))


def ratio_keys(columns: CollectiveColumns, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's ratio key among the distinct ones, the first row of each key) of the rows at
    ``index``: told apart by column (the group's name, once per group object; the kind, the
    bytes, on GPU), as ``Durations.ratio`` depends on them."""
    names = categorical([None if (name := (group or _NO_GROUP).get("name")) is None else str(name)
                         for group in columns.group.names], len(columns.group.names)).codes
    size = np.unique(columns.size[index], return_inverse=True)[1].reshape(-1)  # bytes: ints or None (NaN)
    _, _, keys = distinct_rows([names[columns.group.codes[index]], columns.kind.codes[index], size,
                                columns.on_gpu[index].astype(np.int64)])
    return keys.astype(np.intp), np.unique(keys, return_index=True)[1]


def _waits(rows: list[dict[str, Any]]) -> np.ndarray:
    """Each row's ``wait_us``, 0 where none."""
    return np.array([wait or 0.0 for wait in map(dict.get, rows, repeat("wait_us"))], dtype=float)


def _waits_at(columns: CollectiveColumns, index: np.ndarray) -> np.ndarray:
    """``_waits`` of the rows at ``index``, read by column: 0 where a row has none (None, absent,
    0 or -0.0, as ``wait or 0.0``)."""
    col = columns.rows.column("wait_us")
    if not isinstance(col, Numbers) or col.data.dtype.kind not in "fiu":
        values = columns.rows.values("wait_us")
        return np.array([values[i] or 0.0 for i in index.tolist()], dtype=float)
    out = col.data[index].astype(np.float64)
    out[out == 0.0] = 0.0  # -0.0 too
    if col.none is not None:
        out[col.none[index]] = 0.0
    if "wait_us" in columns.rows.absent:
        out[columns.rows.absent["wait_us"][index]] = 0.0
    return out


class Durations:
    """Projected duration of each measured collective row (µs)."""

    def __init__(self, result: Any, base: Config, target: Config):
        self.base, self.target = base, target
        self.groups = GroupIndex(result)
        self.kept = 0
        self._ratios: dict[tuple, float | None] = {}
        self._new: dict[tuple, float] = {}

    def role(self, row: dict[str, Any]) -> str:
        role = self.groups.role(row)
        if row["collective"] in ("allgather", "reduce_scatter") and role == "world":
            return "shard"
        return role

    def ratio(self, row: dict[str, Any], role: str | None = None) -> float | None:
        """T_model(target) / T_model(measured) of a row, None when it cannot be modelled. It
        depends on the row's group, kind, size and role only: computed once per distinct one
        (a step repeats the same collectives, and the scaling curve projects the job ten times)."""
        key = _ratio_keys([row], role)[0]
        if key not in self._ratios:
            self._ratios[key] = self._ratio(row, role)
        return self._ratios[key]

    def _ratio(self, row: dict[str, Any], role: str | None) -> float | None:
        kind, size = row["collective"], row.get("bytes")
        measured = _measured_link(self.groups.entry(row), self.base)
        if kind not in models.COLLECTIVE_KINDS or not size or measured is None or not row.get("on_gpu"):
            return None
        link, n = measured
        role = role or self.role(row)
        if role == "other":
            return 1.0
        size_t, nodes_t, per_node = self.target.role_group(role)
        target_link = self.target.link(per_node, nodes_t)
        if link is None or target_link is None:
            return None
        before = _model_time(kind, size, n, link)
        after = _model_time(kind, size, size_t, target_link)
        return after / before if before > 0 else None

    def of(self, row: dict[str, Any], role: str | None = None) -> float:
        """Transfer time scaled by the model ratio; unmodelled rows keep their duration."""
        wait = row.get("wait_us") or 0.0
        ratio = self.ratio(row, role)
        if ratio is None:
            self.kept += 1
            return row["dur_us"]
        # Waiting for late ranks is not carried over: the late rank's own schedule (no wait)
        # is projected too, and the job's step is the slowest rank's.
        return (row["dur_us"] - wait) * ratio

    def of_rows(self, rows: _Transfers) -> np.ndarray:
        """``of`` of every row at once: the ratio per distinct key, then one array product."""
        ratios = np.array([np.nan if r is None else r for r in map(self.ratio, rows.representatives)], dtype=float)
        ratio = ratios[rows.key_index]
        kept = np.isnan(ratio)
        self.kept += int(kept.sum())
        return np.where(kept, rows.duration, rows.transfer * ratio)

    def new(self, kind: str, size: float, role: str) -> float:
        """Model time of a collective on the target's ``role`` group, once per distinct one (the
        re-bucketed and cross-strategy projections ask for the same sizes at every step)."""
        key = (kind, size, role)
        if key not in self._new:
            size_t, nodes_t, per_node = self.target.role_group(role)
            link = self.target.link(per_node, nodes_t)
            if link is None:
                raise ConfigError("the projected link is unknown: pass --gpu (and --nic-gbps)")
            self._new[key] = _model_time(kind, size, size_t, link)
        return self._new[key]


# ---------------------------------------------------------------- schedule helpers
def _us(ns: int | None, origin_ns: int) -> float | None:
    return None if ns is None else (ns - origin_ns) / 1000.0


def _phase_end(step: dict[str, Any], phase: str, origin_ns: int) -> float | None:
    window = (step.get("phase_windows") or {}).get(phase)
    return _us(window["end_ns"], origin_ns) if window else None


# ---------------------------------------------------------------- DDP
@dataclass(frozen=True)
class _DdpSchedule:
    """One rank-step of DDP: its backward all-reduces (launch order), their estimated
    gradient-ready times, the end of backward compute and the measured exposed tail (µs)."""

    buckets: Sequence[dict[str, Any]]
    sizes: list[float]
    ready: list[float]
    backward_end: float
    measured_tail: float
    index: np.ndarray | None = None  # the buckets' rows in the Result's collectives, when known

    @cached_property
    def transfers(self) -> _Transfers:
        """The buckets' all-reduces, for Durations.of_rows (on first use: the projections that
        keep the measured buckets read them all at once, ``_DdpBatch``)."""
        return _Transfers.of(self.buckets)


def _ddp_schedule(buckets: Sequence[dict[str, Any]], step: dict[str, Any], origin_ns: int,
                  at: tuple[CollectiveColumns, np.ndarray] | None = None) -> _DdpSchedule | None:
    """The schedule of one rank-step's backward all-reduces on the GPU (``buckets``, in start
    order); ``at``: the Result's columns and the buckets' rows there, to read them by column."""
    if not buckets:
        return None
    if at is None:
        starts = np.array(list(map(itemgetter("start_us"), buckets)), dtype=float)
        durations = np.array(list(map(itemgetter("dur_us"), buckets)), dtype=float)
        sizes = np.array([float(size or 0.0) for size in map(itemgetter("bytes"), buckets)])
        launch = np.array([np.nan if t is None else t for t in map(dict.get, buckets, repeat("launch_us"))], dtype=float)
    else:  # bytes and launch times are numbers or None (NaN in the columns)
        columns, index = at
        starts, durations, sizes, launch = (columns.start[index], columns.dur[index], columns.size[index],
                                            columns.launch[index])
        sizes = np.where(np.isnan(sizes), 0.0, sizes)
    ends = starts + durations
    backward_end = _phase_end(step, "backward", origin_ns)
    if backward_end is None:
        backward_end = float(ends[-1]) - sum(r["exposed_us"] or 0.0 for r in buckets)
    ready = bucket_ready_array(starts, ends, sizes, launch, ~np.isnan(launch), backward_end)
    return _DdpSchedule(buckets, sizes.tolist(), ready.tolist(), backward_end,
                        max(0.0, float(ends.max()) - backward_end), None if at is None else at[1])


def _ddp_step(measured: _RankStep, durations: Durations, scenario: Scenario,
              compute_ratio: float = 1.0) -> tuple[float, float] | None:
    """(measured exposed tail, projected exposed tail) of one rank's step, µs. ``compute_ratio``
    (strong scaling): backward compute takes that share of its measured time, so the gradients
    are ready sooner after backward starts (their ready times and backward's end scaled toward
    its start)."""
    ddp = measured.ddp
    if ddp is None:
        return None
    ready = ddp.ready
    if scenario.bucket_mb:
        ready, times = _rebucket(measured, durations, scenario.bucket_mb)
    else:
        times = durations.of_rows(ddp.transfers)
    end = ddp.backward_end
    start = _phase_start(measured.step, "backward", measured.origin_ns) if compute_ratio != 1.0 else None
    if start is not None and start <= end:
        ready = [start + (r - start) * compute_ratio for r in ready]
        end = start + (end - start) * compute_ratio
    return ddp.measured_tail, models.ddp_bucket_pipeline_of_times(ready, times, end).exposed_tail_us


def _phase_start(step: dict[str, Any], phase: str, origin_ns: int) -> float | None:
    window = (step.get("phase_windows") or {}).get(phase)
    return _us(window["start_ns"], origin_ns) if window else None


@dataclass(frozen=True)
class _DdpBatch:
    """Every rank-step's DDP schedule at once, for the projections that keep the measured
    buckets (the scaling curve's): the buckets' all-reduces of all steps as one ``_Transfers``
    and the steps grouped by bucket count, each group's ready times one 2-D array."""

    measured_tails: list[float | None]  # per rank-step, in ``Measured.steps`` order (None: no schedule)
    transfers: _Transfers
    groups: tuple[tuple[list[int], np.ndarray, np.ndarray, np.ndarray], ...]  # (positions, rows, ready, backward end)

    @classmethod
    def of(cls, schedules: list[_DdpSchedule | None], columns: CollectiveColumns | None = None) -> _DdpBatch:
        """``columns``: the Result's, when every schedule knows its buckets' rows there."""
        by_count: dict[int, list[tuple[int, int, _DdpSchedule]]] = {}  # (position, first row, schedule)
        total = 0
        for position, ddp in enumerate(schedules):
            if ddp is not None:
                by_count.setdefault(len(ddp.buckets), []).append((position, total, ddp))
                total += len(ddp.buckets)
        groups = []
        for count, members in by_count.items():
            rows = np.array([first for _, first, _ in members], dtype=np.intp)[:, None] + np.arange(count)
            groups.append(([position for position, _, _ in members], rows,
                           np.array([ddp.ready for _, _, ddp in members], dtype=float),
                           np.array([ddp.backward_end for _, _, ddp in members], dtype=float)))
        indexed = [ddp.index for ddp in schedules if ddp is not None]
        if columns is not None and all(index is not None for index in indexed):
            transfers = _Transfers.of_columns(columns, np.concatenate(indexed) if indexed else np.zeros(0, np.intp))
        else:
            transfers = _Transfers.of([row for ddp in schedules if ddp is not None for row in ddp.buckets])
        return cls([None if ddp is None else ddp.measured_tail for ddp in schedules], transfers, tuple(groups))

    def changes(self, durations: Durations) -> list[tuple[float, float] | None] | None:
        """``_ddp_step`` of every rank-step without re-bucketing, or None when some step's
        numbers are not what the pipeline accepts (the per-step path then says why)."""
        times = durations.of_rows(self.transfers)
        out: list[tuple[float, float] | None] = [None] * len(self.measured_tails)
        for positions, rows, ready, ends in self.groups:
            step_times = times[rows]
            if not (np.isfinite(ready).all() and np.isfinite(ends).all()
                    and (np.isfinite(step_times) & (step_times >= 0)).all()):
                return None
            for p, tail in zip(positions, models.ddp_exposed_tails(ready, step_times, ends)):
                out[p] = (self.measured_tails[p], tail)
        return out


def _ddp_to_fsdp_step(measured: _RankStep, durations: Durations, target: Config,
                      units: int | None = None) -> tuple[float, float] | None:
    """FSDP from a DDP trace, each gradient bucket taken as one FSDP unit (parameters in the
    gradients' dtype), or with ``units`` the buckets regrouped into that many units
    (``_regroup``): forward compute shared among units by bytes, backward compute between
    consecutive gradient-ready times; all-gathers prefetched one unit ahead (and again in
    backward unless SHARD_GRAD_OP), reduce-scatter when a unit's gradients are ready (HSDP: then
    an all-reduce of the shard across nodes); compute stalls from the replay."""
    ddp, origin_ns = measured.ddp, measured.origin_ns
    windows = measured.step.get("phase_windows") or {}
    if ddp is None or any(s <= 0 for s in ddp.sizes) or "forward" not in windows or "backward" not in windows:
        return None
    forward_start = _us(windows["forward"]["start_ns"], origin_ns)
    backward_start = _us(windows["backward"]["start_ns"], origin_ns)
    sizes, ready_times = (list(ddp.sizes), list(ddp.ready)) if not units else _regroup(ddp.sizes, ddp.ready, units)
    total = sum(sizes)
    unit_sizes = sizes[::-1]  # forward order: the last bucket holds the first layers
    compute_starts = forward_start + np.concatenate(
        ([0.0], np.cumsum([windows["forward"]["compute_us"] * s / total for s in unit_sizes])[:-1]))
    items: list[_Item] = []
    for u, size in enumerate(unit_sizes):
        issue = compute_starts[u - 1] if u else forward_start
        items.append(_Item(None, "allgather", "fsdp", issue, compute_starts[u],
                           durations.new("allgather", size, "shard")))
    backward_starts = [backward_start] + ready_times[:-1]
    shard_group = min(target.gpus, target.gpus_per_node) if target.strategy == "hsdp" else target.gpus
    for i, (size, ready) in enumerate(zip(sizes, ready_times)):
        if target.strategy != "fsdp-grad-op":
            issue = backward_starts[i - 1] if i else backward_start
            items.append(_Item(None, "allgather", "fsdp", issue, backward_starts[i],
                               durations.new("allgather", size, "shard")))
        items.append(_Item(None, "reduce_scatter", "fsdp", ready, ddp.backward_end,
                           durations.new("reduce_scatter", size, "shard"), final=True))
        if target.strategy == "hsdp" and target.nodes > 1:
            items.append(_Item(None, "allreduce", "replicate", ready, ddp.backward_end,
                               durations.new("allreduce", size / shard_group, "replicate"),
                               depends=len(items) - 1, final=True))
    items = _in_issue_order(items)
    return ddp.measured_tail, _replay(items)


def _regroup(sizes: list[float], ready: list[float], units: int) -> tuple[list[float], list[float]]:
    """DDP's gradient buckets (launch order) as ``units`` FSDP units of about equal bytes (a unit
    ends with the bucket that brings it closest to its share; its gradients are ready with that
    bucket's). The
    first bucket holds the last parameters registered (the output head), which FSDP keeps in its
    root unit with the embeddings and reduces last: its bytes join the last unit."""
    head, rest, rest_ready = sizes[0], list(sizes[1:]), list(ready[1:])
    if not rest:
        return [head], [ready[0]]
    total = sum(rest)
    cumulative = np.cumsum(rest).tolist()
    grouped: list[float] = []
    grouped_ready: list[float] = []
    for k, r in enumerate(rest_ready):
        share = total * (len(grouped) + 1) / units  # where the next unit should end
        last = k == len(rest) - 1
        # close the unit here when it reached its share, or when the next bucket would overshoot it more
        if last or cumulative[k] >= share * (1 - 1e-9) or cumulative[k + 1] - share > share - cumulative[k]:
            grouped.append(cumulative[k] - sum(grouped))
            grouped_ready.append(r)
    grouped[-1] += head
    return grouped, grouped_ready


def _in_issue_order(items: list[_Item]) -> list[_Item]:
    """Sort by issue point (a stream runs its work in that order), keeping dependencies."""
    order = sorted(range(len(items)), key=lambda i: (items[i].issue, i))
    position = {old: new for new, old in enumerate(order)}
    return [replace(items[i], depends=None if items[i].depends is None else position[items[i].depends])
            for i in order]


def _rebucket(measured: _RankStep, durations: Durations, bucket_mb: float) -> tuple[list[float], list[float]]:
    """(ready time, all-reduce time) of each new bucket (``_RankStep.rebucketed``); the
    all-reduce times keep the measured transfers' median ratio to the model."""
    ddp = measured.ddp
    if any(s <= 0 for s in ddp.sizes):
        raise ConfigError("--bucket-mb needs the size of every gradient bucket; the trace lacks some")
    ratios = [(r["dur_us"] - (r.get("wait_us") or 0.0)) / durations.new("allreduce", s, "world")
              for r, s in zip(ddp.buckets, ddp.sizes)]
    new_ready, new_sizes = measured.rebucketed(bucket_mb)
    residual = float(np.median(ratios))
    return new_ready, [durations.new("allreduce", s, "world") * residual for s in new_sizes]


def _fsdp_to_ddp_step(measured: _RankStep, durations: Durations, scenario: Scenario) -> tuple[float, float] | None:
    """DDP from an FSDP trace: every FSDP stall goes; the gradients (reduce-scatter inputs, ready
    where each reduce-scatter was issued, in compute-progress time) are all-reduced in DDP
    buckets through the bucket pipeline against the end of backward. A unit's gradients are
    never split: DDP does not split a tensor, and a unit's tensor sizes are not in the trace."""
    fsdp = measured.fsdp
    if fsdp is None:
        return None
    comm, issue = fsdp.comm, fsdp.issue
    reductions = [k for k, r in enumerate(comm) if r["collective"] == "reduce_scatter" and r["phase"] == "backward"]
    if not reductions or any(not comm[k].get("bytes") for k in reductions):
        return None
    # DDP's default: 25 MiB buckets after a 1 MiB first one; an explicit bucket_cap_mb fills the first too
    cap = (scenario.bucket_mb or 25.0) * models.MIB
    ready, sizes = rebucket([float(comm[k]["bytes"]) for k in reductions], [issue[k] for k in reductions], cap,
                            None if scenario.bucket_mb else models.FIRST_BUCKET_BYTES)
    times = [durations.new("allreduce", s, "world") for s in sizes]
    feed = iter(times)
    pipeline = models.ddp_bucket_pipeline(ready, sizes, fsdp.p_backward, lambda _size: next(feed))
    return fsdp.measured_exposed, pipeline.exposed_tail_us


# ---------------------------------------------------------------- FSDP replay
@dataclass
class _Item:
    row: dict[str, Any] | None
    kind: str
    stream: Any
    issue: float  # compute-progress point
    need: float
    duration: float
    depends: int | None = None  # index of another item it waits for
    final: bool = False  # needed by the end-of-backward wait (after every issue at that point)
    measured_end: float = 0.0  # a measured row's end, in progress time


_NS = 1000.0  # µs to ns: the interval algebra works on integers


class _Progress:
    """P(t) = t − exposed communication before t (exposure taken at the end of each kernel), of
    one point (a call) or of many at once (``many``: the same integer nanoseconds and float
    operations per point, by prefix sums over the exposed intervals instead of a pass each)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        exposed = [(r["start_us"] + r["dur_us"] - (r["exposed_us"] or 0.0), r["start_us"] + r["dur_us"])
                   for r in rows if (r.get("exposed_us") or 0.0) > 0]
        self.starts: np.ndarray | None = None
        self.total = 0.0
        if exposed:
            starts, ends = iv.union(np.array([round(a * _NS) for a, _ in exposed], dtype=np.int64),
                                    np.array([round(b * _NS) for _, b in exposed], dtype=np.int64))
            self.starts, self.lengths = starts, ends - starts
            self.before = np.concatenate(([0], np.cumsum(self.lengths)[:-1]))  # exposed before each interval
            self.total = float(self.lengths.sum()) / _NS

    def __call__(self, t: float) -> float:
        if self.starts is None:
            return t
        cut = np.clip(round(t * _NS) - self.starts, 0, self.lengths)
        return t - float(cut.sum()) / _NS

    def many(self, times: list[float]) -> list[float]:
        """``[self(t) for t in times]``."""
        if self.starts is None:
            return list(times)
        t = np.asarray(times, dtype=float)
        with np.errstate(invalid="ignore"):
            scaled = np.rint(t * _NS)  # Python's round: half to even
        if not (np.isfinite(scaled).all() and (np.abs(scaled) < 2.0**62).all()):
            return [self(value) for value in times]
        if not len(self.starts):  # every exposure was of zero length
            return (t - 0.0).tolist()
        ns = scaled.astype(np.int64)
        # the intervals that start at or before t: all but the last lie wholly before it
        last = np.searchsorted(self.starts, ns, side="right") - 1
        at = np.maximum(last, 0)
        cut = np.where(last >= 0, self.before[at] + np.minimum(ns - self.starts[at], self.lengths[at]), 0)
        return (t - cut.astype(float) / _NS).tolist()


def _progress(rows: list[dict[str, Any]]) -> tuple[_Progress, float]:
    """(P, the exposed communication in all) of ``rows`` (``_Progress``)."""
    progress = _Progress(rows)
    return progress, progress.total


@dataclass(frozen=True)
class _FsdpSchedule:
    """One rank-step's GPU collectives (start order) in compute-progress time (``_progress``):
    the measured exposed communication, the ends of backward and forward, each collective's
    issue point and end, and the collective it waited for (``_comm_dependencies``)."""

    comm: list[dict[str, Any]]
    measured_exposed: float
    p_backward: float
    p_forward: float | None  # the end of forward, when the step has one
    issue: list[float]
    ends: list[float]  # each collective's end in progress time
    depends: list[int | None]


def _fsdp_schedule(rows: Sequence[dict[str, Any]], step: dict[str, Any], origin_ns: int) -> _FsdpSchedule | None:
    comm = sorted((r for r in rows if r.get("on_gpu")), key=lambda r: (r["start_us"], str(r["stream"])))
    if not comm:
        return None
    progress, measured_exposed = _progress(comm)
    backward_end = _phase_end(step, "backward", origin_ns)
    ends = [r["start_us"] + r["dur_us"] for r in comm]
    p_backward = progress(backward_end if backward_end is not None else max(ends))
    forward_end = _phase_end(step, "forward", origin_ns)
    p_ends = progress.many(ends)
    return _FsdpSchedule(comm, measured_exposed, p_backward,
                         None if forward_end is None else progress(forward_end),
                         _issue_points(comm, ends, progress.many([r["start_us"] for r in comm]), p_ends),
                         p_ends, _comm_dependencies(comm, ends))


def _fsdp_step(measured: _RankStep, durations: Durations, base: Config, target: Config) -> tuple[float, float] | None:
    plan = measured.fsdp_plan(base.strategy, target.strategy, durations)
    if plan is None:
        return None
    replayed = durations.of_rows(plan.transfers).tolist()  # the measured collectives, projected
    shards = min(target.gpus, target.gpus_per_node)  # HYBRID_SHARD: the shard's share of each all-reduce
    added = iter(durations.new("allreduce", size / shards, "replicate") for size in plan.added)
    times = [replayed[k] if k >= 0 else next(added) for k in plan.measured]
    return measured.fsdp.measured_exposed, plan.order.run(plan.items, times)  # type: ignore[union-attr]


@dataclass(frozen=True)
class _FsdpPlan:
    """One rank-step's FSDP replay for one (measured, projected) strategy pair, built once for
    every projection of the job: the items (the measured collectives replayed, in start order,
    and the HYBRID_SHARD all-reduces added after each reduce-scatter) with their issue and need
    points, streams and dependencies, and the replay's event order. Only their durations
    change with the projected size and links: the measured ones' as one array
    (``Durations.of_rows`` of ``transfers``), the added ones' from the model (``added``)."""

    items: list[_Item]  # durations unset
    measured: list[int]  # each item's index among the replayed measured collectives, -1: an added one
    transfers: _Transfers  # the replayed measured collectives, in item order
    added: list[float]  # the reduce-scatter's bytes of each added HYBRID_SHARD all-reduce, in item order
    order: _ReplayOrder


def _fsdp_plan(measured: _RankStep, durations: Durations, base_strategy: str,
               target_strategy: str) -> _FsdpPlan | None:
    fsdp = measured.fsdp
    if fsdp is None:
        return None
    comm, issue, depends, p_backward = fsdp.comm, fsdp.issue, fsdp.depends, fsdp.p_backward
    items: list[_Item] = []
    item_of: dict[int, int] = {}
    replayed: list[int] = []  # comm index of each measured item
    measured_items: list[int] = []
    added: list[float] = []
    for k, r in enumerate(comm):
        role = durations.role(r)
        if target_strategy == "fsdp-grad-op" and base_strategy != "fsdp-grad-op" \
                and r["collective"] == "allgather" and r["phase"] == "backward":
            continue  # SHARD_GRAD_OP keeps the parameters gathered after forward
        if target_strategy != "hsdp" and role == "replicate":
            continue  # no replicate all-reduce outside HYBRID_SHARD
        item_of[k] = len(items)
        measured_items.append(len(replayed))
        replayed.append(k)
        items.append(_Item(r, r["collective"], r["stream"], issue[k], 0.0, 0.0,
                           depends=item_of.get(depends[k]) if depends[k] is not None else None,
                           measured_end=fsdp.ends[k]))
        if (target_strategy == "hsdp" and base_strategy != "hsdp" and r["collective"] == "reduce_scatter"
                and r.get("bytes")):
            measured_items.append(-1)
            added.append(r["bytes"])
            items.append(_Item(None, "allreduce", "replicate", issue[k], p_backward, 0.0, depends=len(items) - 1,
                               final=True))
    _need_points(items, p_backward, fsdp.p_forward)
    return _FsdpPlan(items, measured_items, _Transfers.of([comm[k] for k in replayed]), added,
                     _ReplayOrder.of(items))


def _fsdp_units_step(measured: _RankStep, durations: Durations, target: Config,
                     units: int) -> tuple[float, float] | None:
    """FSDP with ``units`` units of equal size in place of the measured ones (models.md §5): the
    step's parameter bytes (its forward all-gathers' outputs) and gradient bytes (its backward
    reduce-scatters' inputs) split evenly, so are the measured forward and backward compute (in
    compute-progress time, ``_progress``). Unit u's forward all-gather is issued when unit u−1
    starts computing (prefetch; the first where the measured one was) and needed when unit u
    starts; in backward (not under SHARD_GRAD_OP) each unit is all-gathered again one unit ahead,
    the first at the end of forward (FSDP's root pre-backward prefetch), and reduce-scattered
    when its share of backward ends (HYBRID_SHARD: then all-reduced across nodes); every
    reduction is needed by the end of backward. A new collective takes the α-β model's time for
    its size on the target's link times the measured ones' median ratio to that model (their
    projected duration over the model's), so the model's residual on this job is kept. Other
    collectives are left as measured. (measured exposed time of the replaced collectives, stalls)."""
    fsdp = measured.fsdp
    windows = measured.step.get("phase_windows") or {}
    if fsdp is None or "forward" not in windows or "backward" not in windows:
        return None
    comm = fsdp.comm
    roles = [durations.role(r) for r in comm]
    replaced = [k for k, r in enumerate(comm)
                if r["collective"] in ("allgather", "reduce_scatter") or (r["collective"] == "allreduce"
                                                                          and roles[k] == "replicate")]
    gathers = [k for k in replaced if comm[k]["collective"] == "allgather" and comm[k]["phase"] == "forward"]
    reductions = [k for k in replaced if comm[k]["collective"] == "reduce_scatter" and comm[k]["phase"] == "backward"]
    if not gathers or not reductions or any(not comm[k].get("bytes") for k in gathers + reductions):
        return None
    progress = _progress(comm)[0]  # the schedule's own (fsdp.p_backward, fsdp.issue are on it)
    replaced_exposed = _progress([comm[k] for k in replaced])[1]
    forward_start = _us(windows["forward"]["start_ns"], measured.origin_ns)
    backward_start = _us(windows["backward"]["start_ns"], measured.origin_ns)
    f0, b0, b1 = progress(forward_start), progress(backward_start), fsdp.p_backward
    f1 = fsdp.p_forward if fsdp.p_forward is not None else b0
    if not (f0 <= f1 <= b0 <= b1):
        return None

    def residual(indices: list[int], kind: str) -> float:
        # measured duration projected onto the target / the model's time for its size there
        return float(np.median([durations.of(comm[k], roles[k]) / durations.new(kind, comm[k]["bytes"], roles[k])
                                for k in indices]))

    ag_time = durations.new("allgather", sum(comm[k]["bytes"] for k in gathers) / units, "shard") \
        * residual(gathers, "allgather")
    rs_bytes = sum(comm[k]["bytes"] for k in reductions) / units
    rs_time = durations.new("reduce_scatter", rs_bytes, "shard") * residual(reductions, "reduce_scatter")
    forward = [f0 + (f1 - f0) * u / units for u in range(units + 1)]  # unit u computes [forward[u], forward[u+1]]
    backward = [b0 + (b1 - b0) * j / units for j in range(units + 1)]  # in backward order
    items: list[_Item] = []
    for u in range(units):
        issue = forward[u - 1] if u else min(f0, min(fsdp.issue[k] for k in gathers))
        items.append(_Item(None, "allgather", "fsdp", issue, forward[u], ag_time))
    replicate = target.strategy == "hsdp" and target.nodes > 1
    if replicate:
        shard_group = min(target.gpus, target.gpus_per_node)
        measured_ar = [k for k in replaced if comm[k]["collective"] == "allreduce" and comm[k].get("bytes")]
        ar_time = durations.new("allreduce", rs_bytes / shard_group, "replicate") \
            * (residual(measured_ar, "allreduce") if measured_ar else 1.0)
    for j in range(units):
        if target.strategy != "fsdp-grad-op":
            items.append(_Item(None, "allgather", "fsdp", backward[j - 1] if j else f1, backward[j], ag_time))
        items.append(_Item(None, "reduce_scatter", "fsdp", backward[j + 1], b1, rs_time, final=True))
        if replicate:
            items.append(_Item(None, "allreduce", "replicate", backward[j + 1], b1, ar_time,
                               depends=len(items) - 1, final=True))
    return replaced_exposed, _replay(_in_issue_order(items))


def _comm_dependencies(comm, ends) -> list[int | None]:
    """A collective that starts, on an idle stream, as another stream's collective ends was
    waiting for it (HYBRID_SHARD's all-reduce after the reduce-scatter): index of that one."""
    order = sorted(range(len(comm)), key=lambda j: ends[j])
    sorted_ends = [ends[j] for j in order]
    out: list[int | None] = []
    last_end: dict[Any, float] = {}
    for k, r in enumerate(comm):
        start = r["start_us"]
        found = None
        if start > last_end.get(r["stream"], -math.inf) + _EPS_US:
            lo, hi = bisect_left(sorted_ends, start - _EPS_US), bisect_right(sorted_ends, start)
            candidates = [order[i] for i in range(lo, hi)
                          if order[i] < k and comm[order[i]]["stream"] != r["stream"]]
            found = max(candidates, key=lambda j: (ends[j], j)) if candidates else None
        out.append(found)
        last_end[r["stream"]] = max(last_end.get(r["stream"], -math.inf), ends[k])
    return out


def _issue_points(comm, ends, p_starts, p_ends) -> list[float]:
    """Each collective's issue point in progress time (``p_starts``, ``p_ends``: its start and
    end there): its start when its stream was idle before it; a prefetching all-gather's, the
    end of the exposed all-gather before it; else interpolated in bytes (``interpolate_ready``)."""
    by_stream: dict[Any, list[int]] = {}
    for k, r in enumerate(comm):
        by_stream.setdefault(r["stream"], []).append(k)
    issue = [0.0] * len(comm)
    for indices in by_stream.values():
        known: list[float | None] = []
        last_exposed_ag = None
        for pos, k in enumerate(indices):
            r = comm[k]
            idle = pos == 0 or r["start_us"] > ends[indices[pos - 1]] + _EPS_US
            if idle:
                known.append(p_starts[k])
            elif r["collective"] == "allgather" and last_exposed_ag is not None:
                known.append(p_ends[last_exposed_ag])  # prefetch issued right after the wait
            else:
                known.append(None)
            if r["collective"] == "allgather":
                last_exposed_ag = k if _waited_for(r) else None
        weights = [float(comm[k].get("bytes") or 1.0) for k in indices]
        upper = [p_starts[k] for k in indices]
        for k, value in zip(indices, interpolate_ready(known, weights, upper, None)):
            issue[k] = value
    return issue


def _waited_for(row: dict[str, Any]) -> bool:
    """Compute waited for this collective: its exposed part is more than the gaps between
    kernels that any long collective overlaps (20 µs or 2% of it, whichever is larger)."""
    return (row.get("exposed_us") or 0.0) > max(20.0, 0.02 * row["dur_us"])


def _copy_out_rate(items: list[_Item], gathers: list[int]) -> float:
    """µs per byte between the end of an all-gather that compute waited for and the issue of the
    next prefetch (FSDP2 copies the gathered unit out before prefetching the next one; FSDP1
    gives ~0): median over such pairs whose second all-gather found its stream idle."""
    rates = []
    for a, b in zip(gathers, gathers[1:]):
        first, second = items[a].row, items[b].row
        if first["phase"] != second["phase"] or not _waited_for(first) or not first.get("bytes"):
            continue
        if second["start_us"] <= first["start_us"] + first["dur_us"] + _EPS_US:
            continue  # queued behind the first: its issue point is not measured
        lag = items[b].issue - items[a].measured_end
        if lag >= 0:
            rates.append(lag / first["bytes"])
    return float(np.median(rates)) if rates else 0.0


def _need_points(items: list[_Item], p_backward: float, p_forward: float | None) -> None:
    gathers = [i for i, item in enumerate(items) if item.row is not None and item.kind == "allgather"]
    copy_out = _copy_out_rate(items, gathers)
    later_of: dict[int, float] = {}  # each all-gather's next one of the same phase: its issue point
    next_in: dict[Any, float] = {}
    for j in reversed(gathers):
        phase = items[j].row["phase"]  # type: ignore[index]
        if phase in next_in:
            later_of[j] = next_in[phase]
        next_in[phase] = items[j].issue
    for i, item in enumerate(items):
        r = item.row
        if r is None:
            continue
        end = item.measured_end
        if item.kind in _GRAD_REDUCTIONS and r["phase"] == "backward":
            item.need = max(end, p_backward)
            item.final = True
        elif item.kind == "allgather" and not _waited_for(r):
            later = later_of.get(i)
            phase_end = p_backward if r["phase"] == "backward" else (p_forward if p_forward is not None else end)
            next_issue = later - copy_out * (r.get("bytes") or 0) if later is not None else phase_end
            item.need = max(end, next_issue)
        else:
            item.need = end


def _replay(items: list[_Item]) -> float:
    """Compute stalls (µs) when each collective is issued at its progress point plus the stalls
    so far, runs when its stream is free, and is needed at its need point."""
    return _ReplayOrder.of(items).run(items, [item.duration for item in items])


@dataclass(frozen=True)
class _ReplayOrder:
    """What a replay's order depends on, and not its durations: the events (issue and need
    points) in the order they happen, and each item's stream predecessor (a stream runs its work
    in issue order)."""

    events: list[tuple[float, int, int]]
    previous: list[int]  # -1: the first on its stream

    @classmethod
    def of(cls, items: list[_Item]) -> _ReplayOrder:
        # At one progress point, waits for all-gathers come before issues (a prefetch is issued
        # after the wait for the previous unit), the end-of-backward wait after them; a
        # collective is always issued before it is waited for.
        events = sorted([(item.issue, 1, i) for i, item in enumerate(items)]
                        + [(item.need, 2 if item.final else 0, i) for i, item in enumerate(items)])
        previous = [-1] * len(items)
        last_on: dict[Any, int] = {}
        for i, item in enumerate(items):
            if item.stream in last_on:
                previous[i] = last_on[item.stream]
            last_on[item.stream] = i
        return cls(events, previous)

    def run(self, items: list[_Item], durations: list[float]) -> float:
        """The compute stalls (µs) of ``items`` with these ``durations`` (items are not changed)."""
        stall = 0.0
        end = [0.0] * len(items)
        stream_free: dict[Any, float] = {}
        issued = [False] * len(items)
        previous = self.previous

        def issue(i: int) -> None:  # once per item, its stream predecessor and dependency first
            issued[i] = True
            item = items[i]
            if previous[i] >= 0 and not issued[previous[i]]:
                issue(previous[i])
            start = max(item.issue + stall, stream_free.get(item.stream, -math.inf))
            if item.depends is not None:
                if not issued[item.depends]:
                    issue(item.depends)
                start = max(start, end[item.depends])
            end[i] = start + durations[i]
            stream_free[item.stream] = end[i]

        for point, order, i in self.events:
            if not issued[i]:
                issue(i)
            if order != 1:
                stall += max(0.0, end[i] - (point + stall))
        return stall


# ---------------------------------------------------------------- entry point
class _RankStep:
    """One measured rank-step as every projection reads it: its collective rows and, built on
    first use, its DDP schedule or FSDP replay inputs (they do not depend on the scenario)."""

    def __init__(self, rank: int, step: dict[str, Any], rows: Sequence[dict[str, Any]],
                 backward_allreduces: Sequence[dict[str, Any]] | None = None, reduction_index: np.ndarray | None = None,
                 *, origin_ns: int, columns: CollectiveColumns | None = None, waits: float | None = None):
        self.rank, self.step, self.rows, self.origin_ns = rank, step, rows, origin_ns
        self.columns = columns  # the Result's, which reduction_index indexes
        self.reduction_index = reduction_index  # the all-reduces' rows in the Result's collectives
        self.waits = sum([w or 0.0 for w in map(dict.get, rows, repeat("wait_us"))]) if waits is None else waits
        # in start order (sorted stably, as by start and rank: one rank)
        self.backward_allreduces = backward_allreduces if backward_allreduces is not None else sorted(
            [r for r in rows if r["collective"] == "allreduce" and r["phase"] == "backward" and r.get("on_gpu")],
            key=itemgetter("start_us", "rank"))
        self._rebucketed: dict[float, tuple[list[float], list[float]]] = {}
        self._plans: dict[tuple, _FsdpPlan | None] = {}

    def rebucketed(self, bucket_mb: float) -> tuple[list[float], list[float]]:
        """(ready time, bytes) of the DDP buckets with cap ``bucket_mb``: the measured buckets
        as ≤ 1 MiB gradient pieces (analyzer.job.ddp, as the bucket rules do) re-bucketed.
        Once per cap: the fix series of the scaling curve has one cap at every GPU count."""
        if bucket_mb not in self._rebucketed:
            ddp = self.ddp
            assert ddp is not None
            window = (self.step.get("phase_windows") or {}).get("backward")
            start = _us(window["start_ns"], self.origin_ns) if window else ddp.ready[0]
            piece_sizes, piece_ready = gradient_pieces(ddp.sizes, ddp.ready, start)
            self._rebucketed[bucket_mb] = rebucket(piece_sizes, piece_ready, bucket_mb * models.MIB)
        return self._rebucketed[bucket_mb]

    @cached_property
    def ddp(self) -> _DdpSchedule | None:
        at = None if self.columns is None or self.reduction_index is None else (self.columns, self.reduction_index)
        return _ddp_schedule(self.backward_allreduces, self.step, self.origin_ns, at)

    @cached_property
    def fsdp(self) -> _FsdpSchedule | None:
        return _fsdp_schedule(self.rows, self.step, self.origin_ns)

    def fsdp_plan(self, base_strategy: str, target_strategy: str, durations: Durations) -> _FsdpPlan | None:
        """The FSDP replay of this rank-step for a strategy pair (``_FsdpPlan``), once per pair:
        it depends on the result (its groups' roles) and the strategies, never on the projected
        size or links."""
        key = (base_strategy, target_strategy)
        if key not in self._plans:
            self._plans[key] = _fsdp_plan(self, durations, base_strategy, target_strategy)
        return self._plans[key]


class Measured:
    """The measured side of one Result's projections, built once and shared by every
    ``project`` of it (the scaling curve projects the job ten times, each finding's fix twice):
    every rank-step in rank, step order, and the schedules and replay plans made from them on
    first use. ``Measured.of(result)`` keeps one on the Result for the run; it serves that
    Result only, and is made again when its collective rows are replaced."""

    def __init__(self, result: Any):
        self.result = result
        self.rows = result.collectives  # the list it was made from

    @classmethod
    def of(cls, result: Any) -> Measured:
        """The Measured kept with ``result`` (analyzer.base.memo: made on first use, and again
        when its collective rows are replaced)."""
        return memo(result, "whatif_measured", lambda: cls(result), result.collectives)

    @cached_property
    def steps(self) -> list[_RankStep]:  # on first use: project() checks the result first
        origin = self.result.job["time_origin_ns"]
        rows_by = _rows_by_rank_step(self.result)
        none: tuple[list[dict[str, Any]], list[dict[str, Any]], np.ndarray, float] = ([], [], np.zeros(0, np.intp), 0)
        columns = CollectiveColumns.of(self.result) if self.result.collectives else None
        return [_RankStep(rank.rank, step, *entry[:3], waits=entry[3], origin_ns=origin, columns=columns)
                for rank in self.result.ranks for step in rank.steps
                for entry in (rows_by.get((rank.rank, step["step"]), none),)]

    @cached_property
    def ddp_batch(self) -> _DdpBatch:
        return _DdpBatch.of([rank_step.ddp for rank_step in self.steps],
                            CollectiveColumns.of(self.result) if self.result.collectives else None)


def _rows_by_rank_step(result: Any) -> dict[tuple, tuple[_LazyRows, _LazyRows, np.ndarray, float]]:
    """(rows, backward all-reduces on the GPU, their index, the rows' summed waits) of each
    (rank, step) of the collective rows, rows in their order, all-reduces in start order: grouped
    and sorted by column (``CollectiveColumns``), the rows made as dicts only where read (the
    scaling curve reads none but the representatives of the DDP buckets' ratio keys)."""
    rows = result.collectives
    if not rows:
        return {}
    columns = CollectiveColumns.of(result)
    first, counts, number = distinct_rows([columns.rank - int(columns.rank.min()), columns.step.codes])
    order = np.argsort(number, kind="stable")
    backward = columns.kind.isin(("allreduce",)) & columns.phase.isin(("backward",)) & columns.on_gpu
    waits = _waits_at(columns, order).tolist()  # in group order
    ranks, steps = columns.rank[first].tolist(), [columns.step.names[code] for code in columns.step.codes[first].tolist()]
    out = {}
    for start, count, rank, step in zip((np.cumsum(counts) - counts).tolist(), counts.tolist(), ranks, steps):
        index = order[start:start + count]
        reductions = index[backward[index]]
        reductions = reductions[np.argsort(columns.start[reductions], kind="stable")]
        # summed in row order from 0, as sum() of the rows' waits
        out[(rank, step)] = (_LazyRows(rows, index), _LazyRows(rows, reductions), reductions,
                             sum(waits[start:start + count]))
    return out


class _LazyRows(Sequence):
    """The collective rows at ``index`` of a Result's rows, made as dicts on first read; their
    count without making them."""

    def __init__(self, rows: Any, index: np.ndarray) -> None:
        self._source, self._index = rows, index

    def __len__(self) -> int:
        return len(self._index)

    @cached_property
    def _rows(self) -> list[dict[str, Any]]:
        return _rows_at(self._source, self._index)

    def __getitem__(self, item: Any) -> Any:
        return self._rows[item]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


def _rows_at(rows: Any, index: np.ndarray) -> list[dict[str, Any]]:
    if isinstance(rows, RowTable):  # the rows kept by column: their dicts made in column passes
        return rows.dicts(index)
    if len(index) < 2:
        return [rows[i] for i in index.tolist()]
    return list(itemgetter(*index.tolist())(rows))


def project(result: Any, scenario: Scenario = Scenario(), measured: Measured | None = None) -> Projection:
    """Project the measured job onto ``scenario`` (None fields: as measured). ``measured``:
    the ``Measured(result)`` shared by several projections of the same result."""
    if measured is None:
        measured = Measured(result)
    elif measured.result is not result:
        raise ValueError("project(): `measured` was built from another result")
    if result.groups is None:
        raise ConfigError("project() needs a Result from diagnose() (job analyses missing)")
    beyond = [d for d in ("tp", "pp", "ep", "cp") if d in (result.job.get("parallelism") or {})]
    if beyond:  # its TP/PP/EP communication would be taken for DDP/FSDP traffic
        raise ConfigError(f"the what-if models data-parallel jobs only; this one also has {', '.join(beyond)} "
                          f"(strategy {result.job.get('strategy')}): not projected")
    notes: list[str] = []
    base, assumptions = measured_config(result, scenario, notes)
    target = target_config(base, scenario, assumptions)
    _check_supported(base, target, scenario)
    durations = Durations(result, base, target)
    optimizer_factor = _optimizer_factor(base, target)
    scaled = _strong_scaling(result, scenario, base, target, notes)
    as_measured, projected = [], []
    unmodelled = 0
    batched = None
    if base.strategy == "ddp" and target.strategy == "ddp" and not scenario.bucket_mb and scaled is None:
        kept = durations.kept
        batched = measured.ddp_batch.changes(durations)
        if batched is None:
            durations.kept = kept  # the per-step path counts again
    for position, rank_step in enumerate(measured.steps):
        if batched is not None:
            change = batched[position]
        elif scenario.fsdp_units and base.strategy == "ddp":
            change = _ddp_to_fsdp_step(rank_step, durations, target, scenario.fsdp_units)
        elif scenario.fsdp_units:
            change = _fsdp_units_step(rank_step, durations, target, scenario.fsdp_units)
        elif base.strategy == "ddp" and target.strategy == "ddp":
            ratio = scaled[rank_step.rank].ratio if scaled is not None and rank_step.rank in scaled else 1.0
            change = _ddp_step(rank_step, durations, scenario, ratio)
        elif base.strategy == "ddp":
            change = _ddp_to_fsdp_step(rank_step, durations, target)
        elif target.strategy == "ddp":
            change = _fsdp_to_ddp_step(rank_step, durations, scenario)
        else:
            change = _fsdp_step(rank_step, durations, base, target)
        if change is None:
            unmodelled += 1
        before, after = change if change is not None else (0.0, 0.0)
        step, rank = rank_step.step, rank_step.rank
        optimizer = ((step.get("phase_windows") or {}).get("optimizer") or {}).get("compute_us", 0.0)
        extra_compute = optimizer * (optimizer_factor - 1.0)
        if scaled is not None and rank in scaled:  # strong scaling: the batch's compute, at its shapes' efficiency
            extra_compute += step["compute_us"] * (scaled[rank].ratio - 1.0)
        exposed = step.get("exposed_comm_us") or 0.0
        as_measured.append((step["step"], rank, step["step_time_us"], exposed, step["compute_us"], rank_step.waits))
        projected.append((step["step"], rank, step["step_time_us"] - before + after + extra_compute,
                          max(0.0, exposed - before + after), step["compute_us"] + extra_compute, 0.0))
    if not as_measured:
        raise ConfigError("no profiler steps in the trace: nothing to project")
    if any(entry[5] for entry in as_measured):
        notes.append("waiting for late ranks is not carried over: every rank's own schedule is "
                     "projected and the step is the slowest rank's (measured wait_us is per rank-step)")
    if scenario.fsdp_units and base.strategy == "ddp":
        notes.append(f"FSDP units: the gradient buckets regrouped into {scenario.fsdp_units} units of about equal "
                     "bytes, the first bucket (the output head) reduced with the last unit (FSDP's root)")
    elif scenario.fsdp_units:
        notes.append(f"FSDP units rebuilt: {scenario.fsdp_units} units of equal size share the measured "
                     "parameter and gradient bytes and the measured forward / backward compute, each "
                     "all-gathered one unit ahead (prefetch) and reduce-scattered after its backward")
    if base.strategy == "ddp" and target.strategy != "ddp":
        notes.append("FSDP projected from DDP: each gradient bucket taken as one FSDP unit, with its "
                     "forward compute in proportion to its bytes; real FSDP reduces its root unit "
                     "(embeddings, head) last, which makes it slower than this when the network is slow")
    if base.strategy != "ddp" and target.strategy == "ddp":
        notes.append("FSDP's own copy kernels (all-gather copy-in/out, reduce-scatter chunk-cat) stay in "
                     "the measured compute: the DDP step is over-estimated by their time")
    if unmodelled:
        what = "backward all-reduces (DDP buckets)" if base.strategy == "ddp" else "GPU collectives"
        notes.append(f"{unmodelled} rank-step(s) have no {what}: their step time is kept as measured")
    if durations.kept:
        notes.append(f"{durations.kept} collective(s) without a modelled size/kind keep their measured duration")
    _assumption_notes(assumptions, scenario, target, optimizer_factor)
    if scaled is not None:
        assumptions["compute"] = _value("strong scaling", "derived", compute_scaling.SOURCE)
    m, p = _summary(as_measured), _summary(projected)
    if scaled is not None:
        p["compute_model"] = _compute_model(scaled)
    m["gpus"], p["gpus"] = base.gpus, target.gpus
    p["scaling_efficiency"] = round(m["step_time_us"] / p["step_time_us"], 4) if p["step_time_us"] else None
    _mfu(result, scenario, base, target, m, p, assumptions)
    return Projection(m, p, assumptions, notes + _groups_note(target), list(result.warnings or []))


def _check_supported(base: Config, target: Config, scenario: Scenario) -> None:
    if scenario.fsdp_units is not None:
        if target.strategy == "ddp":
            raise ConfigError("--fsdp-units applies to FSDP (the projected strategy is DDP)")
        if not 1 <= scenario.fsdp_units <= MAX_FSDP_UNITS:  # the replay's cost follows it (issue 30)
            raise ConfigError(f"--fsdp-units must be 1 to {MAX_FSDP_UNITS:,}")
    elif base.strategy == "fsdp-grad-op" and target.strategy in ("fsdp-full", "hsdp"):
        raise ConfigError("cannot add backward all-gathers to a SHARD_GRAD_OP trace")
    if base.strategy == "hsdp" and target.strategy == "fsdp-grad-op":
        raise ConfigError("cannot project HYBRID_SHARD onto SHARD_GRAD_OP")
    if scenario.bucket_mb and target.strategy != "ddp":
        raise ConfigError("--bucket-mb applies to DDP only")
    if target.strategy == "hsdp" and target.gpus % target.gpus_per_node:
        raise ConfigError("HYBRID_SHARD needs whole nodes")


def _strong_scaling(result: Any, scenario: Scenario, base: Config, target: Config,
                    notes: list[str]) -> dict[int, Any] | None:
    """Each rank's compute at its new share of the global batch (analyzer.whatif.compute), or
    None (weak scaling, or no FLOPs to measure the efficiency on: then said in a note)."""
    if not scenario.strong_scaling or target.gpus == base.gpus:
        return None
    scaled = compute_scaling.strong_scaling(result, base.gpus / target.gpus)
    if scaled is None:
        notes.append("strong scaling asked, but the job has no FLOPs from recorded shapes with GPU kernels: "
                     "compute kept as measured (weak scaling)")
        return None
    notes.append("strong scaling: communication overlap as measured; a shorter backward hides less of the "
                 "gradient all-reduce than this projects")
    return scaled


def _compute_model(scaled: dict[int, Any]) -> dict[str, Any]:
    """The compute projection's figures (mean over ranks, µs): measured, had compute scaled
    perfectly with the work, and with the efficiency measured per shape."""
    rows = list(scaled.values())

    def mean(key: str) -> float:
        return round(float(np.mean([getattr(r, key) for r in rows])), 3)
    return {"factor": rows[0].factor, "measured_us": mean("measured_us"), "flop_kernels_us": mean("flop_kernels_us"),
            "optimizer_us": mean("optimizer_us"), "perfect_scaling_us": mean("perfect_us"),
            "projected_us": mean("projected_us"), "source": compute_scaling.SOURCE}


def _optimizer_factor(base: Config, target: Config) -> float:
    """Sharded optimizers update 1/shard of the parameters: their compute scales with it."""
    def shard(config: Config) -> int:
        if config.strategy == "ddp":
            return 1
        return min(config.gpus, config.gpus_per_node) if config.strategy == "hsdp" else config.gpus
    return shard(base) / shard(target)


def _summary(entries: list[tuple]) -> dict[str, Any]:
    by_step: dict[int, list[tuple]] = {}
    for entry in entries:
        by_step.setdefault(entry[0], []).append(entry)
    slowest = [max(e[2] for e in group) for group in by_step.values()]
    return {"step_time_us": round(float(np.mean(slowest)), 3),
            "exposed_comm_us": round(float(np.mean([e[3] for e in entries])), 3),
            "compute_us": round(float(np.mean([e[4] for e in entries])), 3),
            "wait_us": round(float(np.mean([e[5] for e in entries])), 3),
            "steps": len(by_step), "rank_steps": len(entries)}


def _mfu(result, scenario, base, target, m, p, assumptions) -> None:
    psi = scenario.model_params or (result.mfu or {}).get("model_params")
    tokens = scenario.tokens_per_step or (result.mfu or {}).get("tokens_per_step")
    peak = result.model.hardware.peak_tflops.to_dict()
    assumptions["model_params"] = _value(psi, "user" if psi else "unknown", "--model-params")
    assumptions["tokens_per_step"] = _value(tokens, "user" if tokens else "unknown",
                                            "--tokens-per-step (measured configuration; weak scaling)")
    assumptions["peak_tflops"] = peak
    # weak scaling: the job's tokens grow with the GPUs; strong scaling keeps them
    grow = 1.0 if scenario.strong_scaling else target.gpus / base.gpus
    for side, config, scale in ((m, base, 1.0), (p, target, grow)):
        if psi and tokens and peak["value"] and side["step_time_us"]:
            tokens_per_s = tokens * scale / (side["step_time_us"] * 1e-6)
            side["mfu"] = round(models.mfu(tokens_per_s, psi, config.gpus, peak["value"]), 6)
        else:
            side["mfu"] = None


def _assumption_notes(assumptions, scenario, target, optimizer_factor) -> None:
    assumptions["bucket_cap_mb"] = _value(scenario.bucket_mb, "user", "--bucket-mb (first bucket 1 MiB)") \
        if scenario.bucket_mb else _value(None, "measured", "measured buckets")
    if scenario.fsdp_units:
        assumptions["fsdp_units"] = _value(scenario.fsdp_units, "user", "--fsdp-units (units of equal size, "
                                           "all-gathered one ahead, reduce-scattered after their backward)")
    assumptions["compute"] = _value("measured", "measured",
                                    "per-GPU compute as measured (weak scaling; --strong-scaling keeps the global "
                                    f"batch instead); optimizer compute x {optimizer_factor:g} for the shard size")
    intra = target.intra
    assumptions["intra_link"] = _value(intra and {"alpha_us": intra.alpha_us, "beta_gbps": intra.beta_gbps},
                                       assumptions["intra_beta_gbps"]["origin"], assumptions["intra_beta_gbps"]["source"])
    cross = target.link(target.gpus_per_node, 2)
    assumptions["cross_node_link"] = _value(
        cross and {"alpha_us": cross.alpha_us, "beta_gbps": round(cross.beta_gbps, 3)}, "derived",
        f"min(β_intra, {target.nics_per_node} NIC(s) x {target.nic_gbps} GB/s x members per node / "
        f"{target.gpus_per_node}) (models.md §2)")


def _groups_note(target: Config) -> list[str]:
    roles = ["replicate", "shard"] if target.strategy == "hsdp" else ["world"]
    out = []
    for role in roles:
        size, nodes, per_node = target.role_group(role)
        link = target.link(per_node, nodes)
        out.append(f"projected {role} group: {size} ranks on {nodes} node(s), "
                   + (f"α {link.alpha_us:.2f} µs, β {link.beta_gbps:.1f} GB/s" if link else "link unknown"))
    return out


def link_ratios(result: Any, scenario: Scenario) -> np.ndarray:
    """Per collective row (the Result's columns' order): its transfer on ``scenario``'s links over
    its measured one, T_model(target) / T_model(measured) by α-β (``Durations.ratio``, models.md
    §2); 1 where it cannot be modelled (its size, kind or link unknown): the slow-link input the
    replay's link counterfactual applies (analyzer.whatif.counterfactual)."""
    base, assumptions = measured_config(result, scenario, [])
    durations = Durations(result, base, target_config(base, scenario, assumptions))
    columns = CollectiveColumns.of(result)
    keys, first = ratio_keys(columns, np.arange(columns.n))  # one row dict per distinct key, not per row
    ratios = np.array([np.nan if r is None else r for r in map(durations.ratio, _rows_at(columns.rows, first))],
                      dtype=float)
    return np.nan_to_num(ratios[keys], nan=1.0)
