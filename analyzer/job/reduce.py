"""The reduce: the ranks' summaries combined into one job Result (job facts, collectives on one
clock, DDP buckets, FSDP units, warnings)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np

from analyzer import __version__
from analyzer.base.errors import InputError
from analyzer.base.memo import seed
from analyzer.base.rowtable import Coded, Numbers, RowSubset, RowTable, as_table, code_type, column
from analyzer.job.columns import CollectiveColumns, round_array, round_list
from analyzer.rank.comms import shared_groups
from analyzer.job.parallelism import data_parallel_mask, infer_parallelism
from analyzer.job.buckets import backward_starts, gradient_buckets
from analyzer.job.result import Result
from analyzer.rank.analysis import RankAnalysis
from analyzer.rank.comms import fsdp_units
from analyzer.rank.workload import job_workload


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
    _same_backend(results)
    _same_groups(results)
    return sorted(results, key=lambda r: r.rank)


def _same_backend(results: list[RankAnalysis]) -> None:
    """The default group's backend (distributedInfo.backend) is one per job: every rank
    initialises the same default group, whatever its host clock or GPU."""
    first: dict[str, str] = {}
    for r in results:
        if r.backend:
            first.setdefault(str(r.backend).strip().lower()[:40], r.path)
    if len(first) > 1:
        detail = ", ".join(f"{path}={backend!r}" for backend, path in first.items())
        raise InputError(results[0].path, f"traces from different jobs: the default group's backend differs ({detail})")


def _same_groups(results: list[RankAnalysis]) -> None:
    """Torch names each process group once per job (its creation number or hash), and each
    rank lists the groups it belongs to (distributedInfo.pg_config). So one name holding two
    member lists that share a rank cannot be one job. Two disjoint lists under one name are
    allowed: a recorder naming groups by role (every TP group "tp") still partitions the ranks.
    Linear in the listed members: each (name, rank) pair remembers the one list that holds it."""
    owner: dict[tuple[str, int], tuple[tuple[int, ...], str]] = {}
    checked: set[tuple[str, tuple[int, ...]]] = set()  # a list seen once is not walked again
    for r in results:
        for group in r.process_groups:
            name, ranks = group.get("name"), group.get("ranks")
            if name is None or not ranks or (name, members := tuple(sorted(ranks))) in checked:
                continue
            checked.add((name, members))
            for member in members:
                held = owner.setdefault((name, member), (members, r.path))
                if held[0] != members:
                    raise InputError(r.path, f"traces from different jobs: process group {name[:40]!r} holds "
                                             f"ranks {_ranks_text(list(members))} here but "
                                             f"{_ranks_text(list(held[0]))} in {held[1]}")


def build_result(ranks: list[RankAnalysis], options: Any) -> Result:
    origin = min((r.first_gpu_ns for r in ranks if r.first_gpu_ns is not None), default=0)
    tables = []
    for r in ranks:
        shift = ((r.first_gpu_ns or origin) - origin) / 1000.0
        table = as_table(r.collectives)
        for key in ("start_us", "launch_us"):
            _shift(table, key, shift)
        tables.append(table)
        if r.timeline is not None:
            r.timeline["start_us"] = round_list(np.asarray(r.timeline["start_us"], dtype=float) + shift)
    sizes = [t.n for t in tables]
    collectives = RowTable.concat(tables, consume=True)  # each rank's columns let go of as they are copied
    del tables
    order = _row_order(collectives)  # by (rank, start_us, collective), stable
    if order is not None:
        collectives = collectives.take(order)
    share_groups(collectives)
    _rank_subsets(ranks, collectives, sizes, order)
    view = CollectiveColumns(collectives)  # read once here, shared by the job analyses and rules
    warnings = _job_warnings(ranks)
    job = job_facts(ranks, options, origin, view)
    job.update(infer_parallelism(ranks, collectives, job["dp_strategy"], job["world_size"], view))
    # DDP buckets and FSDP units come from the data-parallel groups only: a tensor-parallel
    # all-reduce is no gradient bucket, a kernel of another library no FSDP unit.
    data_parallel = data_parallel_mask(view, job["group_roles"])
    result = Result(
        inputs=[{"path": r.path, "rank": r.rank} for r in ranks],
        ranks=ranks, job=job, collectives=collectives, buckets=[],
        fsdp_units=fsdp_units(collectives.dicts(np.flatnonzero(data_parallel)))
        if job["dp_strategy"].startswith("fsdp") else [],
        warnings=warnings,
    )
    seed(result, "collective_columns", view, collectives)  # CollectiveColumns.of(result) is this one
    if job["dp_strategy"] in ("ddp", "unknown"):
        result.buckets = gradient_buckets(view, data_parallel, backward_starts(ranks, origin))
    return result


def _shift(table: RowTable, key: str, shift: float) -> None:
    """``row[key] = round(row[key] + shift, 3)`` where the value is known, over the column."""
    col = table.column(key)
    if col is None:
        return
    if isinstance(col, Numbers) and col.data.dtype.kind in "fiu":
        table.set(key, Numbers(round_array(col.data.astype(np.float64) + shift), col.none), table.has(key))
        return
    values = col.values()
    known = np.flatnonzero(np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=len(values)))
    shifted = round_list(np.array([values[i] for i in known.tolist()], dtype=float) + shift)
    for i, value in zip(known.tolist(), shifted):
        values[i] = value
    table.set(key, column(values), table.has(key))


def _row_order(table: RowTable) -> np.ndarray | None:
    """The order that sorts the rows by (rank, start_us, collective) as Python's stable sort
    does; None when they are in it already."""
    if not table.n:
        return None
    rank, start, kind = (table.column(key) for key in ("rank", "start_us", "collective"))
    simple = (isinstance(rank, Numbers) and rank.none is None and rank.data.dtype.kind in "iu"
              and isinstance(start, Numbers) and start.none is None and start.data.dtype.kind in "fiu"
              and not np.isnan(start.data.astype(np.float64)).any()
              and isinstance(kind, Coded) and all(type(name) is str for name in kind.table)
              and not {"rank", "start_us", "collective"} & set(table.absent))
    if simple:  # the kinds by the order of their names
        names = kind.table  # type: ignore[union-attr]
        position = np.empty(len(names), dtype=np.int64)
        position[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        order = np.lexsort((position[kind.codes], start.data, rank.data))  # type: ignore[union-attr]
    else:
        keys = list(zip(table.values("rank"), table.values("start_us"), table.values("collective")))
        order = np.array(sorted(range(table.n), key=keys.__getitem__), dtype=np.int64)
    return None if (order == np.arange(table.n)).all() else order


def _rank_subsets(ranks: list[RankAnalysis], table: RowTable, sizes: list[int], order: np.ndarray | None) -> None:
    """Each rank's rows are its part of the job's table from now on (read from it: the columns
    the job analyses add are a rank's too, as when the rows were shared dicts)."""
    source = np.repeat(np.arange(len(ranks)), sizes)
    if order is not None:
        source = source[order]
    by_rank = np.argsort(source, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(source, minlength=len(ranks)))]
    for k, r in enumerate(ranks):
        r.collectives = RowSubset(table, by_rank[bounds[k]:bounds[k + 1]])  # type: ignore[assignment]


def share_groups(table: RowTable) -> None:
    """Give equal ``group`` dicts (same keys in the same order, same values) one object, as
    ``analyzer.rank.comms.share_groups`` does for rows: each rank's group objects are its own."""
    col = table.column("group")
    if col is None or not table.n:
        return
    if not isinstance(col, Coded) or col.by_value:
        values = col.values()
        shared = shared_groups(list(dict(zip(map(id, values), values)).values()))
        if shared:
            table.set("group", column([shared.get(id(v), v) for v in values]), table.has("group"))
        return
    used = col.used()
    objects = [col.table[code] for code in used.tolist()]
    shared = shared_groups(objects)
    kept: list[Any] = []
    code_of: dict[int, int] = {}
    for obj in objects:
        obj = shared.get(id(obj), obj)
        if id(obj) not in code_of:
            code_of[id(obj)] = len(kept)
            kept.append(obj)
    recode = np.zeros(len(col.table), dtype=np.int64)
    recode[used] = [code_of[id(shared.get(id(obj), obj))] for obj in objects]
    table.set("group", Coded(recode[col.codes].astype(code_type(len(kept))), kept, False), table.has("group"))


def _job_warnings(ranks: list[RankAnalysis]) -> list[str]:
    warnings = []
    world = next((r.world_size for r in ranks if r.world_size), None)
    if world and len(ranks) < world:
        warnings.append(f"{len(ranks)} of {world} ranks given: cross-rank figures cover only these ranks")
    warnings.extend(_disagreements(ranks))
    for r in ranks:
        warnings.extend(f"rank {r.rank} ({r.path}): {w}" for w in r.warnings)
    return warnings


def _disagreements(ranks: list[RankAnalysis]) -> list[str]:
    """One warning per fact the ranks of one job should share but do not (issue 41): the GPU
    model (each rank's figures then use its own: analyzer.model.hardware.for_device) and the
    NCCL version (the job's figures then use the first rank's)."""
    facts = {"GPU": lambda r: (r.devices[0].get("name") if r.devices else None),
             "NCCL version": lambda r: r.nccl_version}
    warnings = []
    for what, read in facts.items():
        seen: dict[str, list[int]] = {}
        for r in ranks:
            value = read(r)
            if value:
                seen.setdefault(str(value)[:80], []).append(r.rank)
        if len(seen) > 1:
            listed = "; ".join(f"{value!r} on rank(s) {_ranks_text(members)}" for value, members in seen.items())
            uses = ("each rank's hardware figures (MFU's peak, its memory) use its own GPU" if what == "GPU" else
                    "the job's figures use rank " + str(ranks[0].rank) + "'s")
            warnings.append(f"the ranks disagree on the {what} ({listed}): traces of different machines or "
                            f"jobs? {uses}")
    return warnings


def _job_gpu(ranks: list[RankAnalysis], devices: list[dict[str, Any]]) -> dict[str, Any]:
    """``gpu`` and ``gpu_mem_bytes``: the one GPU of the job; where ranks run on different GPUs
    (each rank's first device) ``"mixed: 4× A, 4× B"`` (ranks per GPU, most first) and the
    smallest device memory, the one every rank's work must fit in."""
    own = [(r.devices[0].get("name"), r.devices[0].get("total_mem_bytes")) for r in ranks if r.devices]
    names = Counter(str(name)[:80] for name, _ in own if name)
    if len(names) < 2:
        return {"gpu": devices[0]["name"] if devices else None,
                "gpu_mem_bytes": devices[0]["total_mem_bytes"] if devices else None}
    listed = ", ".join(f"{count}\u00d7 {name}" for name, count in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])))
    memories = [memory for _, memory in own if memory]
    return {"gpu": "mixed: " + listed, "gpu_mem_bytes": min(memories) if memories else None}


def _ranks_text(members: list[int]) -> str:
    shown = ", ".join(map(str, members[:8]))
    return shown + (f" and {len(members) - 8} more" if len(members) > 8 else "")


def job_facts(ranks: list[RankAnalysis], options: Any, origin_ns: int,
              view: CollectiveColumns | None = None) -> dict[str, Any]:
    seen = {k: sum(r.markers_seen.get(k, 0) for r in ranks) for k in ("ddp_forward", "fsdp1", "fsdp2")}
    # The markers first: the rows' kinds (a pass over every row) only when no marker decides.
    if seen["fsdp2"]:
        strategy = "fsdp2"
    elif seen["fsdp1"]:
        strategy = "fsdp1"
    elif seen["ddp_forward"]:
        strategy = "ddp"
    elif {"allgather", "reduce_scatter"} <= (set(view.kind.names) if view is not None
                                             else {row["collective"] for r in ranks for row in r.collectives}):
        strategy = "fsdp"
    else:
        strategy = "unknown"
    devices = next((r.devices for r in ranks if r.devices), [])
    hosts = sorted({r.host for r in ranks if r.host})
    return {
        "strategy": strategy,  # replaced by the combination's name (analyzer.job.parallelism)
        "dp_strategy": strategy,
        "workload": job_workload([r.markers_seen for r in ranks]),  # training | inference | None
        "world_size": next((r.world_size for r in ranks if r.world_size), None),
        "ranks_given": len(ranks),
        "hosts": hosts,
        **_job_gpu(ranks, devices),
        "devices_per_node": len(devices) or None,
        "nccl_version": next((r.nccl_version for r in ranks if r.nccl_version), None),
        "backend": next((r.backend for r in ranks if r.backend), None),
        "time_origin_ns": origin_ns,
        "tool": {"name": "tracecliff", "version": __version__},
    }
