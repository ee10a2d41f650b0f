"""Job-level analyses run after the per-rank results are combined: topology, hardware, cross-rank
waits and stragglers, per-collective bandwidth, per-group α/β, MFU.

``analyze_job(result, options)`` stores them in the Result (``topology``, ``hardware``,
``groups``, ``stragglers``, ``collective_summary``, ``attribution``, ``mfu``) and each rank's
``time_breakdown``, and adds ``algbw_gbps``,
``busbw_gbps``, ``bound`` and ``wait_us`` to every row of ``result.collectives``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.base.memo import held
from analyzer.base.rowtable import Coded, Numbers
from analyzer.job import commfit
from analyzer.job import crossrank
from analyzer.job.attribution import attribute_job
from analyzer.job.columns import Categorical, CollectiveColumns
from analyzer.job.model import group_label
from analyzer.base.errors import ConfigError
from analyzer.model.hardware import HardwareAssumptions, resolve_hardware
from analyzer.model.link import hardware_link
from analyzer.job.parallelism import role_key
from analyzer.job.compute import analyze_compute
from analyzer.job.memory import job_checkpointing, job_memory
from analyzer.job.mfu import compute_mfu, job_peak, job_step_times
from analyzer.job.topology import Topology, build_topology


def analyze_job(result: Any, options: Any) -> None:
    """The job's sections, once, in the order they read each other: the job model
    (analyzer.job.model) and the digest of the rows are read from them, so neither may exist
    before (they would hold figures of a job not yet analysed) and each section is final
    before the first figure of the model that reads it is asked for: the typical step and each
    rank's facts once ``attribute_job`` has run (the bus bandwidth reads them), the compute
    figures (``model.compute``, read by no step here) once ``mfu`` is set."""
    if held(result, "job_model") or held(result, "collective_digest") or result.collective_digest is not None:
        raise ValueError("analyze_job runs once, on a Result fresh from build_result: its job model or digest "
                         "was already read from sections not yet analysed")
    topology = build_topology(result.ranks, getattr(options, "gpus_per_node", None))
    hardware = resolve_job_hardware(result.ranks, topology, options)
    world = result.job.get("world_size")
    view = CollectiveColumns.of(result)
    # Ranks of one host read one clock (its host name, else the torchrun layout's node)
    clock_of = {r.rank: topology.node_of(r.rank) for r in result.ranks}
    stragglers = crossrank.analyze(result.collectives, world, view, clock_of)
    groups = fit_groups(result.collectives, topology, hardware, result.job.get("group_roles") or {}, view)
    result.topology = topology.to_dict()
    result.hardware = hardware.to_dict()
    result.stragglers = stragglers
    result.groups = groups
    result.collective_summary = commfit.summarize(result.collectives, view)
    attribute_job(result)  # the typical step: what the memory, bus bandwidth and compute figures are of
    if any(r.memory is not None for r in result.ranks) or result.memory is None:  # a saved result keeps its own
        typical_step = (result.attribution or {}).get("step")
        result.memory = job_memory(result.ranks, typical_step)
        result.job["activation_checkpointing"] = job_checkpointing(result.ranks, typical_step)
    write_group_busbw(result)
    from_shapes = analyze_compute(result, hardware)
    n_gpus = world or result.job.get("ranks_given")
    result.mfu = compute_mfu(job_step_times(result.ranks), getattr(options, "model_params", None),
                             getattr(options, "tokens_per_step", None), n_gpus,
                             job_peak(result.ranks, hardware), from_shapes)


def write_group_busbw(result: Any) -> None:
    """Each group's bus bandwidth into its ``groups`` entry, as the job model defines it
    (analyzer.job.busbw: the typical step's, over the collectives whose transfer is measured):
    ``busbw_gbps`` and what it is (``busbw_basis``), or why there is none. ``busbw_median_gbps``,
    the figure's name before it was the typical step's, holds the same value."""
    figures = result.model.group_busbw
    for entry in result.groups:
        figure = figures.get(group_label(entry) or "")
        value = None if figure is None or figure.gbps is None else round(figure.gbps, 3)
        entry["busbw_gbps"] = entry["busbw_median_gbps"] = value
        entry["busbw_basis"] = figure.basis if figure is not None else "group unknown: no bus bandwidth"


def resolve_job_hardware(ranks: list[Any], topology: Topology, options: Any) -> HardwareAssumptions:
    devices = next((r.devices for r in ranks if r.devices), [])
    overrides = {"gpu": getattr(options, "gpu", None),
                 "nics_per_node": getattr(options, "nics_per_node", None),
                 "nic_gbps": getattr(options, "nic_gbps", None)}
    if topology.gpus_per_node_source == "--gpus-per-node":
        overrides["gpus_per_node"] = topology.gpus_per_node
    measured = topology.gpus_per_node if topology.gpus_per_node_source == "host names" else None
    try:
        return resolve_hardware([d.get("name") for d in devices],
                                [d.get("total_mem_bytes") for d in devices],
                                overrides, gpus_per_node=measured)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def fit_groups(rows: list[dict[str, Any]], topology: Topology, hardware: HardwareAssumptions,
               roles: dict[str, str] | None = None, view: CollectiveColumns | None = None) -> list[dict[str, Any]]:
    """One entry per process group with collectives, with its ``role`` (analyzer.job.parallelism);
    annotates the rows with bandwidths and bound, by column (and keeps their arrays in the view).
    ``view``: the rows' columns when the caller has them."""
    view = view if view is not None else CollectiveColumns(rows)
    key_code, keys = view.group_keys(crossrank.group_key)
    order = np.argsort(key_code, kind="stable")  # each group's rows together, in row order
    bounds_at = np.searchsorted(key_code[order], np.arange(len(keys) + 1))
    members = {key: order[bounds_at[code]:bounds_at[code + 1]] for code, key in enumerate(keys)}
    busbw_column = np.full(view.n, np.nan)
    algbw_column = np.full(view.n, np.nan)
    bound_column = np.zeros(view.n, dtype=np.int64)  # commfit.BOUNDS codes
    measured = commfit.transfer_measured(view)
    groups = []
    for key in sorted(members, key=str):
        index = members[key]
        first = view.row(int(index[0]))
        group = first.get("group") or {}
        n = group.get("size")
        label = topology.label_group(group.get("ranks"))
        fallback = hardware_link(hardware, bool(label["cross_node"]), label["ranks_per_node"])
        cols = commfit.GroupColumns([], view, index, measured[index])
        gpu = cols.on_gpu & (cols.sizes > 0)  # GPU collectives of a known, non-zero size
        given = len(unique_ints(view.rank[index]))  # members whose traces hold the group's rows
        if n and given < n:
            # A member's trace is missing: a kernel's duration is its transfer plus the wait for
            # members not seen, which cannot be told apart; a fit on them learns the waiting.
            # Only kernels whose transfer is measured (none without every member) may teach it.
            gpu &= cols.measured
        if not n:
            ab = commfit.AlphaBeta(None, None, "group size unknown: no α/β", "none")
        elif not gpu.any() and given < n:
            ab = commfit.AlphaBeta(fallback[0], fallback[1], commfit.unfitted_partial(fallback[2], given, n),
                                   "profile" if fallback[1] is not None else "none")
        elif not gpu.any():
            ab = commfit.AlphaBeta(None, None, "no GPU collectives with a known size", "none")
        else:
            ab = commfit.fit_alpha_beta(Categorical(cols.kind.codes[gpu], cols.kind.names),
                                        cols.sizes[gpu], cols.transfer[gpu], n, fallback)
        s_star = ab.s_star_bytes
        busbw, bound_column[index], algbw_column[index] = commfit.annotate_group(None, n, s_star, cols)
        busbw_column[index] = np.array(busbw, dtype=float)  # None: NaN
        groups.append({
            "name": group.get("name") if key[0] != "unknown" else None,
            "description": group.get("description"),
            "ranks": group.get("ranks"), "size": n,
            "role": (roles or {}).get(role_key(first), "unknown"),
            "nodes": label["nodes"], "cross_node": label["cross_node"],
            "collectives": len(index),
            "kinds": sorted(cols.present_kinds()),
            "alpha_us": ab.alpha_us, "beta_gbps": ab.beta_gbps,
            "s_star_bytes": None if s_star is None else round(s_star, 1),
            "fit": ab.fit, "fit_source": ab.source,
        })
    view.set("busbw_gbps", busbw_column)
    view.set("algbw_gbps", algbw_column)
    view.set("bound", bound_column)
    # the rows' keys, in this order: None where NaN (round keeps NaN: the NaN are the Nones)
    view.write("algbw_gbps", Numbers(algbw_column.copy(), np.isnan(algbw_column)))
    view.write("busbw_gbps", Numbers(busbw_column.copy(), np.isnan(busbw_column)))
    view.write("bound", Coded(bound_column.astype(np.uint8), list(commfit.BOUNDS), True))
    return groups
