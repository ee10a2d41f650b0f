"""The reduce: the ranks' summaries combined into one job Result (job facts, collectives on one
clock, DDP buckets, FSDP units, warnings)."""

from __future__ import annotations

from dataclasses import replace
from collections import deque
from itertools import compress, repeat
from operator import is_not, itemgetter, setitem
from typing import Any

import numpy as np

from analyzer import __version__
from analyzer.base.errors import InputError
from analyzer.job.columns import CollectiveColumns, round_list
from analyzer.rank.comms import share_groups
from analyzer.job.parallelism import data_parallel_mask, infer_parallelism
from analyzer.job.buckets import backward_starts, gradient_buckets
from analyzer.job.result import Result
from analyzer.rank.analysis import RankAnalysis
from analyzer.rank.comms import fsdp_units


def resolve_ranks(results: list[RankAnalysis]) -> list[RankAnalysis]:
    """Check rank identities across files: unknown ranks, duplicates, world sizes, ranks not
    below the world size."""
    if len(results) == 1 and results[0].rank < 0:
        results[0] = replace(results[0], rank=0, rank_source="single file")
    for r in results:
        if r.rank < 0:
            raise InputError(r.path, "cannot tell the rank: no usable distributedInfo.rank and no rank number "
                                     "in the file name (e.g. rank-3.json)")
    seen: dict[int, str] = {}
    for r in results:
        if r.rank in seen:
            raise InputError(r.path, f"duplicate rank {r.rank}: also in {seen[r.rank]}")
        seen[r.rank] = r.path
    sizes = sorted({r.world_size for r in results if r.world_size})
    if len(sizes) > 1:
        detail = ", ".join(f"{r.path}={r.world_size}" for r in results if r.world_size)
        raise InputError(results[0].path, f"traces from different jobs: world_size differs ({detail})")
    for r in results:  # distributedInfo's rank is checked on reading; a file name's is here
        if sizes and r.rank >= sizes[0]:
            raise InputError(r.path, f"rank {r.rank} (from the {r.rank_source}) is not a rank of this job "
                                     f"(world size {sizes[0]})")
    return sorted(results, key=lambda r: r.rank)


def build_result(ranks: list[RankAnalysis], options: Any) -> Result:
    origin = min((r.first_gpu_ns for r in ranks if r.first_gpu_ns is not None), default=0)
    collectives = []
    for r in ranks:
        shift = ((r.first_gpu_ns or origin) - origin) / 1000.0
        for key in ("start_us", "launch_us"):
            _shift(r.collectives, key, shift)
        collectives.extend(r.collectives)
        if r.timeline is not None:
            r.timeline["start_us"] = round_list(np.asarray(r.timeline["start_us"], dtype=float) + shift)
    collectives.sort(key=itemgetter("rank", "start_us", "collective"))  # (rank, start_us, collective) tuples
    share_groups(collectives)
    view = CollectiveColumns(collectives)  # read once here, shared by the job analyses and rules
    warnings = _job_warnings(ranks)
    job = job_facts(ranks, options, origin)
    job.update(infer_parallelism(ranks, collectives, job["dp_strategy"], job["world_size"], view))
    # DDP buckets and FSDP units come from the data-parallel groups only: a tensor-parallel
    # all-reduce is no gradient bucket, a kernel of another library no FSDP unit.
    data_parallel = data_parallel_mask(view, job["group_roles"])
    result = Result(
        inputs=[{"path": r.path, "rank": r.rank} for r in ranks],
        ranks=ranks, job=job, collectives=collectives, buckets=[],
        fsdp_units=fsdp_units([collectives[i] for i in np.flatnonzero(data_parallel).tolist()])
        if job["dp_strategy"].startswith("fsdp") else [],
        warnings=warnings, collective_columns=view,
    )
    if job["dp_strategy"] in ("ddp", "unknown"):
        result.buckets = gradient_buckets(view, data_parallel, backward_starts(ranks, origin))
    return result


def _shift(rows: list[dict[str, Any]], key: str, shift: float) -> None:
    """``row[key] = round(row[key] + shift, 3)`` where the value is known, over an array (and
    C-level passes over the rows: a 64-rank job has 275,000 of them)."""
    values = list(map(itemgetter(key), rows))
    is_known = list(map(is_not, values, repeat(None)))
    known = list(compress(rows, is_known))
    shifted = np.fromiter(compress(values, is_known), dtype=float, count=len(known)) + shift
    deque(map(setitem, known, repeat(key), round_list(shifted)), maxlen=0)


def _job_warnings(ranks: list[RankAnalysis]) -> list[str]:
    warnings = []
    world = next((r.world_size for r in ranks if r.world_size), None)
    if world and len(ranks) < world:
        warnings.append(f"{len(ranks)} of {world} ranks given: cross-rank figures cover only these ranks")
    for r in ranks:
        warnings.extend(f"rank {r.rank} ({r.path}): {w}" for w in r.warnings)
    return warnings


def job_facts(ranks: list[RankAnalysis], options: Any, origin_ns: int) -> dict[str, Any]:
    seen = {k: sum(r.markers_seen.get(k, 0) for r in ranks) for k in ("ddp_forward", "fsdp1", "fsdp2")}
    # The markers first: the rows' kinds (a pass over every row) only when no marker decides.
    if seen["fsdp2"]:
        strategy = "fsdp2"
    elif seen["fsdp1"]:
        strategy = "fsdp1"
    elif seen["ddp_forward"]:
        strategy = "ddp"
    elif {"allgather", "reduce_scatter"} <= {row["collective"] for r in ranks for row in r.collectives}:
        strategy = "fsdp"
    else:
        strategy = "unknown"
    devices = next((r.devices for r in ranks if r.devices), [])
    hosts = sorted({r.host for r in ranks if r.host})
    return {
        "strategy": strategy,  # replaced by the combination's name (analyzer.job.parallelism)
        "dp_strategy": strategy,
        "world_size": next((r.world_size for r in ranks if r.world_size), None),
        "ranks_given": len(ranks),
        "hosts": hosts,
        "gpu": devices[0]["name"] if devices else None,
        "gpu_mem_bytes": devices[0]["total_mem_bytes"] if devices else None,
        "devices_per_node": len(devices) or None,
        "nccl_version": next((r.nccl_version for r in ranks if r.nccl_version), None),
        "backend": next((r.backend for r in ranks if r.backend), None),
        "time_origin_ns": origin_ns,
        "tool": {"name": "tracecliff", "version": __version__},
    }
