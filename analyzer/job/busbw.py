"""A process group's bus bandwidth: the one figure the job model, the text and HTML reports, the
JSON, the gate (``busbw_gbps:<group>``) and the diff quote (models.md §2, "Bus bandwidth of a
job"; docs/ci.md).

A collective's busbw is nccl-tests' ``S · busbw_factor(kind, N) / t`` over its *transfer* time t,
and it has one only where t is measured (``analyzer.job.commfit.transfer_measured``: matched
across every member of its group, the wait for the last member taken out; never a send or recv,
never a CPU-side op). A group's figure is the bus bytes of its measured collectives over their
transfer time, ``Σ S·factor / Σ t`` (the time-weighted mean of their busbw: the rate its
transfers achieved), over the **typical step** (issue 24's one figure; the steady steps when the
typical step has none of them, and says so; the whole trace when the run has no steps). Its
samples, the gate's noise, are the same figure per rank and steady step.

Groups go by their label (``group_label``: the description, else the name), as the gate's
metric names do: several groups of one label (the tensor-parallel groups of a job) make one
figure. Where no collective of a group has a measured transfer, the figure is None and
``basis`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from analyzer.job.columns import CollectiveColumns
from analyzer.job.commfit import P2P, busbw_factor, group_size, has_bus_model, modelled, transfer_measured, waits
from analyzer.job.crossrank import group_key, matched_ranks
from analyzer.model import formulas as models

STEP, TRACE = "step", "trace"  # the figure's scope: a step's, or the whole trace's (no steps)


@dataclass(frozen=True)
class GroupBusbw:
    """The bus bandwidth of the groups of one label (GB/s), what it covers, and its samples."""

    gbps: float | None  # None: not measured (``basis`` says why)
    basis: str  # what the figure is, in words (or why there is none)
    scope: str  # STEP | TRACE
    collectives: int  # the measured collectives (one per rank) it is the figure of
    samples: tuple[tuple[int, Any, float], ...]  # (rank, step, the figure of that rank-step): steady steps

    @property
    def measured(self) -> bool:
        return self.gbps is not None


def group_busbw(view: CollectiveColumns, label_of: Callable[[Mapping[str, Any] | None], str | None],
                typical_step: Any = None, steady_steps: tuple[Any, ...] = ()) -> dict[str, GroupBusbw]:
    """The figure of each group label of ``view``'s rows (``label_of``: a group's label), over
    ``typical_step`` and its samples over ``steady_steps`` (None: no step breakdown)."""
    if not view.n:
        return {}
    labels = [label_of(g) if isinstance(g, dict) else None for g in view.group.names]
    names = sorted({label for label in labels if label is not None})
    code_of = {label: code for code, label in enumerate(names)}
    label_code = np.array([code_of.get(label, -1) for label in labels], dtype=np.int64)[view.group.codes]
    measured = transfer_measured(view)
    bus_bytes, transfer = _bus_bytes(view), view.dur - waits(view)
    steps = view.step
    step_of = np.array([steps.names.index(s) if s in steps.names else -2 for s in steady_steps], dtype=np.int64)
    typical_code = steps.names.index(typical_step) if typical_step in steps.names else -2
    out = {}
    one_rank = np.array([group_size(g) == 1 for g in view.group.names], dtype=bool)[view.group.codes]
    for code, label in enumerate(names):
        rows = label_code == code
        if one_rank[rows].all():  # a group of one rank moves nothing over a link (NCCL copies locally)
            continue
        hit = rows & measured
        if not hit.any():
            out[label] = _unmeasured(view, rows)
            continue
        out[label] = _figure(view, hit, bus_bytes, transfer, typical_step, typical_code, steady_steps, step_of)
    return out


def _bus_bytes(view: CollectiveColumns) -> np.ndarray:
    """S · busbw_factor(kind, N) of each row (NaN where the kind or N has no factor)."""
    codes, factors = view.group_keys(lambda row: _factor(row["collective"], group_size(row.get("group"))))
    return view.size * np.array(factors, dtype=float)[codes]


def _factor(kind: str, n: int) -> float:
    return busbw_factor(kind, n) if has_bus_model(kind, n or None) else float("nan")


def _figure(view: CollectiveColumns, hit: np.ndarray, bus_bytes: np.ndarray, transfer: np.ndarray,
            typical_step: Any, typical_code: int, steady_steps: tuple[Any, ...], step_of: np.ndarray) -> GroupBusbw:
    """The figure over the measured rows ``hit`` of one label, and its steady samples."""
    members = int(matched_ranks(view)[hit].max())
    groups = len(np.unique(view.group_keys(group_key)[0][hit]))  # by name (a loaded Result's rows share no dicts)
    what = (f"Σ bus bytes / Σ transfer time of {{n}} collective kernel(s), each matched on all {members} members"
            + (f" of its group ({groups} groups of this name)" if groups > 1 else ""))
    if typical_step is None:  # one sample per rank, its whole trace
        rows = np.flatnonzero(hit)
        return GroupBusbw(_rate(bus_bytes, transfer, rows), "whole trace (no step breakdown): "
                          + what.format(n=len(rows)), TRACE, len(rows), _samples(view, hit, bus_bytes, transfer))
    steady = hit & np.isin(view.step.codes, step_of)
    samples = _samples(view, steady, bus_bytes, transfer)
    in_typical = np.flatnonzero(hit & (view.step.codes == typical_code))
    if len(in_typical):
        return GroupBusbw(_rate(bus_bytes, transfer, in_typical),
                          f"typical step {typical_step}: " + what.format(n=len(in_typical)), STEP,
                          len(in_typical), samples)
    rows = np.flatnonzero(steady)
    if len(rows):
        found = {view.step.at(int(i)) for i in rows}
        return GroupBusbw(_rate(bus_bytes, transfer, rows),
                          f"steady steps {', '.join(str(s) for s in steady_steps if s in found)} "
                          f"(none in typical step {typical_step}): " + what.format(n=len(rows)), STEP, len(rows),
                          samples)
    return GroupBusbw(None, f"not measured in the steady steps: its {int(hit.sum())} collective(s) with a measured "
                            "transfer lie in the warm-up, drain or outlier steps, or outside any step",
                      STEP, 0, ())


def _samples(view: CollectiveColumns, rows: np.ndarray, bus_bytes: np.ndarray,
             transfer: np.ndarray) -> tuple[tuple[int, Any, float], ...]:
    """The figure of each (rank, step) of ``rows`` (a mask), in rank order, then the steps' order
    of first appearance: sums per (rank, step) in one pass (a long job has thousands)."""
    index = np.flatnonzero(rows)
    if not len(index):
        return ()
    ranks, rank_of = np.unique(view.rank[index], return_inverse=True)
    n_steps = len(view.step.names)
    keys, inverse = np.unique(rank_of.reshape(-1) * n_steps + view.step.codes[index], return_inverse=True)
    inverse = inverse.reshape(-1)
    bus = np.bincount(inverse, weights=bus_bytes[index], minlength=len(keys))
    time = np.bincount(inverse, weights=transfer[index], minlength=len(keys))
    return tuple((int(ranks[key // n_steps]), view.step.names[key % n_steps], models.algbw_gbps(b, t))
                 for key, b, t in zip(keys.tolist(), bus.tolist(), time.tolist()))


def _rate(bus_bytes: np.ndarray, transfer: np.ndarray, rows: np.ndarray) -> float:
    """GB/s of the rows together: their bus bytes over their transfer time (``algbw`` of the sums)."""
    return models.algbw_gbps(float(bus_bytes[rows].sum()), float(transfer[rows].sum()))


def _unmeasured(view: CollectiveColumns, rows: np.ndarray) -> GroupBusbw:
    """Why no collective of ``rows`` (one label's) has a measured transfer: the first condition
    of ``transfer_measured`` that none of them meets."""
    return GroupBusbw(None, "not measured: " + _why(view, rows), STEP, 0, ())


def _why(view: CollectiveColumns, rows: np.ndarray) -> str:
    gpu = rows & view.on_gpu
    if not gpu.any():
        return "no GPU collective kernel (an op's duration on the host is no transfer time)"
    sized = gpu & (view.size > 0)
    if not sized.any():
        return "no GPU collective of a known size"
    kinds = {view.kind.names[c] for c in np.unique(view.kind.codes[sized]).tolist()}
    sizes = {group_size(view.group.names[c]) for c in np.unique(view.group.codes[sized]).tolist()}
    if kinds <= set(P2P):
        return ("send/recv only: a point-to-point kernel's time includes waiting for its peer, and the traces "
                "do not pair each send with its recv, so no transfer time is measured")
    if not any(modelled(kind) for kind in kinds - set(P2P)):
        return f"no collective kind with a bus-bandwidth factor ({', '.join(sorted(kinds))})"
    if 0 in sizes and len(sizes) == 1:
        return "the group's size is unknown: no bus-bandwidth factor"
    ranks = len(np.unique(view.rank[sized]))
    size = max(sizes)
    if ranks < size:
        return (f"{ranks} of the group's {size} members' traces given: each collective's wait for the members "
                "not given is unknown, so its transfer time is too")
    if not (matched_ranks(view)[sized] > 0).any():
        return ("its collectives could not be matched across ranks (no Comms Id, Seq or consistent order): "
                "their waits for the last member are unknown")
    return f"no collective matched on all {size} members of the group"
