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

from analyzer.base.arrays import unique_ints
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
    return figures(group_sums(view, label_of, typical_step, steady_steps))


# ---------------------------------------------------------------- the sums (the digest's)
def group_sums(view: CollectiveColumns, label_of: Callable[[Mapping[str, Any] | None], str | None],
               typical_step: Any = None, steady_steps: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """What each group label's figure is made of, from every row: the digest's ``busbw``
    (analyzer.job.digest), saved with a large result so that its figures need no rows. Per label
    (sorted), plain data: ``label``; ``step``, the typical step (None: no step breakdown);
    ``sums`` (None: not measured, and ``why`` says why): ``over`` (``typical``, ``steady`` or
    ``trace``), ``steps`` (the steady steps it covers, for ``steady``), ``collectives``,
    ``members`` (the matched sets' size), ``groups`` (the label's groups with a measured
    transfer), ``bus_bytes`` and ``transfer_us`` (Σ S·factor and Σ t over those collectives, in
    row order); ``samples``: [rank, step, Σ S·factor, Σ t] per rank and steady step (per rank,
    whole trace, without a step breakdown)."""
    if not view.n:
        return []
    labels = [label_of(g) if isinstance(g, dict) else None for g in view.group.names]
    names = sorted({label for label in labels if label is not None})
    code_of = {label: code for code, label in enumerate(names)}
    label_code = np.array([code_of.get(label, -1) for label in labels], dtype=np.int64)[view.group.codes]
    measured = transfer_measured(view)
    bus_bytes, transfer = _bus_bytes(view), view.dur - waits(view)
    steps = view.step
    step_of = np.array([steps.names.index(s) if s in steps.names else -2 for s in steady_steps], dtype=np.int64)
    typical_code = steps.names.index(typical_step) if typical_step in steps.names else -2
    out = []
    one_rank = np.array([group_size(g) == 1 for g in view.group.names], dtype=bool)[view.group.codes]
    for code, label in enumerate(names):
        rows = label_code == code
        if one_rank[rows].all():  # a group of one rank moves nothing over a link (NCCL copies locally)
            continue
        hit = rows & measured
        entry: dict[str, Any] = {"label": label, "step": typical_step, "sums": None, "samples": [], "why": None}
        if hit.any():
            entry.update(_sums(view, hit, bus_bytes, transfer, typical_step, typical_code, steady_steps, step_of))
        else:
            entry["why"] = "not measured: " + _why(view, rows)
        out.append(entry)
    return out


def _bus_bytes(view: CollectiveColumns) -> np.ndarray:
    """S · busbw_factor(kind, N) of each row (NaN where the kind or N has no factor)."""
    codes, factors = view.group_keys(lambda row: _factor(row["collective"], group_size(row.get("group"))))
    return view.size * np.array(factors, dtype=float)[codes]


def _factor(kind: str, n: int) -> float:
    return busbw_factor(kind, n) if has_bus_model(kind, n or None) else float("nan")


def _sums(view: CollectiveColumns, hit: np.ndarray, bus_bytes: np.ndarray, transfer: np.ndarray,
          typical_step: Any, typical_code: int, steady_steps: tuple[Any, ...], step_of: np.ndarray) -> dict[str, Any]:
    """The sums over the measured rows ``hit`` of one label: the typical step's, else the
    steady steps', else the whole trace's (no step breakdown); the samples per rank and step."""
    found = {"members": int(matched_ranks(view)[hit].max()),
             "groups": len(unique_ints(view.group_keys(group_key)[0][hit]))}  # by name: a loaded Result's rows share no dicts
    if typical_step is None:  # one sample per rank, its whole trace
        return {"sums": _over("trace", np.flatnonzero(hit), bus_bytes, transfer) | found,
                "samples": _samples(view, hit, bus_bytes, transfer)}
    steady = hit & np.isin(view.step.codes, step_of)
    samples = _samples(view, steady, bus_bytes, transfer)
    in_typical = np.flatnonzero(hit & (view.step.codes == typical_code))
    if len(in_typical):
        return {"sums": _over("typical", in_typical, bus_bytes, transfer) | found, "samples": samples}
    rows = np.flatnonzero(steady)
    if len(rows):
        held = {view.step.at(int(i)) for i in rows}
        covered = [s for s in steady_steps if s in held]
        return {"sums": _over("steady", rows, bus_bytes, transfer, covered) | found, "samples": samples}
    return {"why": f"not measured in the steady steps: its {int(hit.sum())} collective(s) with a measured "
                   "transfer lie in the warm-up, drain or outlier steps, or outside any step"}


def _over(over: str, rows: np.ndarray, bus_bytes: np.ndarray, transfer: np.ndarray,
          steps: list[Any] | None = None) -> dict[str, Any]:
    """Σ S·factor and Σ t of ``rows``, each added left to right in row order (as Python's ``sum``
    adds: the digest's sums, analyzer.job.digest)."""
    return {"over": over, "steps": steps or [], "collectives": len(rows), "bus_bytes": _ordered_sum(bus_bytes[rows]),
            "transfer_us": _ordered_sum(transfer[rows])}


def _ordered_sum(values: np.ndarray) -> float:
    return float(np.cumsum(values)[-1])  # numpy's sum adds pairwise


def _samples(view: CollectiveColumns, rows: np.ndarray, bus_bytes: np.ndarray,
             transfer: np.ndarray) -> list[list[Any]]:
    """[rank, step, Σ S·factor, Σ t] of each (rank, step) of ``rows`` (a mask), in rank order,
    then the steps' order of first appearance: sums per (rank, step) in one pass, each in row
    order (``bincount`` adds its weights in order; a long job has thousands)."""
    index = np.flatnonzero(rows)
    if not len(index):
        return []
    ranks, rank_of = unique_ints(view.rank[index], return_inverse=True)
    n_steps = len(view.step.names)
    keys, inverse = unique_ints(rank_of.reshape(-1) * n_steps + view.step.codes[index], return_inverse=True)
    inverse = inverse.reshape(-1)
    bus = np.bincount(inverse, weights=bus_bytes[index], minlength=len(keys))
    time = np.bincount(inverse, weights=transfer[index], minlength=len(keys))
    return [[int(ranks[key // n_steps]), view.step.names[key % n_steps], b, t]
            for key, b, t in zip(keys.tolist(), bus.tolist(), time.tolist())]


# ---------------------------------------------------------------- the figures
def figures(sums: list[dict[str, Any]]) -> dict[str, GroupBusbw]:
    """Each label's figure from its sums (``group_sums``: computed from the rows, or a saved
    large result's digest): a fresh run and its saved result give the same figures."""
    return {entry["label"]: _figure(entry) for entry in sums}


def _figure(entry: dict[str, Any]) -> GroupBusbw:
    sums = entry["sums"]
    if sums is None:
        return GroupBusbw(None, entry["why"] or "not measured", STEP, 0, ())
    n = sums["collectives"]
    what = (f"Σ bus bytes / Σ transfer time of {n} collective kernel(s), each matched on all {sums['members']} "
            "members" + (f" of its group ({sums['groups']} groups of this name)" if sums["groups"] > 1 else ""))
    step = entry["step"]
    basis = {"trace": "whole trace (no step breakdown): ", "typical": f"typical step {step}: ",
             "steady": f"steady steps {', '.join(str(s) for s in sums['steps'])} (none in typical step {step}): "}
    samples = tuple((rank, at, models.algbw_gbps(b, t)) for rank, at, b, t in entry["samples"])
    return GroupBusbw(models.algbw_gbps(sums["bus_bytes"], sums["transfer_us"]), basis[sums["over"]] + what,
                      TRACE if sums["over"] == "trace" else STEP, n, samples)


def _why(view: CollectiveColumns, rows: np.ndarray) -> str:
    """Why no collective of ``rows`` (one label's) has a measured transfer: the first condition
    of ``transfer_measured`` that none of them meets."""
    gpu = rows & view.on_gpu
    if not gpu.any():
        return "no GPU collective kernel (an op's duration on the host is no transfer time)"
    sized = gpu & (view.size > 0)
    if not sized.any():
        return "no GPU collective of a known size"
    kinds = {view.kind.names[c] for c in unique_ints(view.kind.codes[sized]).tolist()}
    sizes = {group_size(view.group.names[c]) for c in unique_ints(view.group.codes[sized]).tolist()}
    if kinds <= set(P2P):
        return ("send/recv only: a point-to-point kernel's time includes waiting for its peer, and even a "
                "paired send may end before its data lands, so no transfer time is measured")
    if not any(modelled(kind) for kind in kinds - set(P2P)):
        return f"no collective kind with a bus-bandwidth factor ({', '.join(sorted(kinds))})"
    if 0 in sizes and len(sizes) == 1:
        return "the group's size is unknown: no bus-bandwidth factor"
    ranks = len(unique_ints(view.rank[sized]))
    size = max(sizes)
    if ranks < size:
        return (f"{ranks} of the group's {size} members' traces given: each collective's wait for the members "
                "not given is unknown, so its transfer time is too")
    if not (matched_ranks(view)[sized] > 0).any():
        return ("its collectives could not be matched across ranks (no Comms Id, Seq or consistent order): "
                "their waits for the last member are unknown")
    return f"no collective matched on all {size} members of the group"
