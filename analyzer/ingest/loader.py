"""Load one trace file into a RankTrace: read, decode, detect rank/host, build columns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from analyzer.base.errors import InputError
from analyzer.base.limits import MAX_DEVICE_BYTES, MAX_WORLD
from analyzer.ingest.classify import DEFAULT_COMM_PATTERN, KernelClassifier
from analyzer.ingest.columns import MISSING, ColumnBuilder, parse_ranks, to_int
from analyzer.ingest.files import DEFAULT_MAX_INFLATE_BYTES, iter_trace_chunks
from analyzer.ingest.schema import TraceFile
from analyzer.ingest.stream import Decoding, TooLong, decode_stream
from analyzer.ingest.trace import RankTrace

# rank-3, rank_3, rank3, worker3, worker_3, trainer-3, proc3 ... (the last match wins: dirs first)
_RANK_IN_NAME = re.compile(r"(?:rank|worker|trainer|proc|process|gpu)[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    """The rank a file name gives (``rank-3.json``); None when it gives none, or one no world
    holds (the caller says so)."""
    matches = _RANK_IN_NAME.findall(path.name)
    if not matches or len(matches[-1]) > 7:  # 7 digits hold every rank below MAX_WORLD
        return None
    rank = int(matches[-1])
    return rank if rank < MAX_WORLD else None


def load_rank_trace(path: Path, comm_pattern: str = DEFAULT_COMM_PATTERN,
                    max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES) -> RankTrace:
    """Stream the file: inflate and decode it in batches, folding each into the columns, so
    peak memory follows the columns (tens of bytes an event), not the JSON (hundreds)."""
    builder = ColumnBuilder(KernelClassifier(comm_pattern))
    chunks = iter_trace_chunks(path, max_inflate_bytes)
    try:
        meta, decoding = decode_stream(path, chunks, builder.add)
    except TooLong:
        raise  # refused as soon as seen: the rest of the file is not read
    except InputError:
        for _ in chunks:  # a damaged file (truncated gzip, bomb) is the problem to report, not
            pass          # the JSON error it causes further on
        raise
    return rank_trace_of(path, meta, builder, decoding)


def rank_trace_of(path: Path, meta: TraceFile, builder: ColumnBuilder, decoding: Decoding) -> RankTrace:
    if builder.event_count == 0:
        raise InputError(path, "empty traceEvents: the profiler recorded nothing")
    warnings: list[str] = []
    if decoding.replaced_utf8:
        warnings.append("the trace holds bytes that are not valid UTF-8: replaced by U+FFFD in names "
                        "(times and sizes are unaffected)")
    if decoding.replaced_huge:
        warnings.append(f"the trace holds numbers beyond any value a field can have (first at "
                        f"{decoding.replaced_huge[0]}): read as null")
    if decoding.replaced_nonfinite:
        warnings.append("the trace holds NaN/Infinity literals (not JSON): read as null, so events "
                        "whose ts or dur was one are ignored")
    info = meta.distributedInfo
    if info is None:
        warnings.append("no distributedInfo in the trace: world size and process groups are unknown")
    gpu, kernel_args, launches, markers = builder.finish(warnings)
    world = _world_size(info, warnings)
    rank, source = _rank_of(path, info, world, warnings)
    return RankTrace(
        path=str(path),
        rank=rank,
        rank_source=source,
        world_size=world,
        host=_host_of(meta),
        backend=info.backend if info else None,
        nccl_version=info.nccl_version if info else None,
        process_groups=_process_groups(info, world, warnings),
        devices=_devices(meta, warnings),
        strings=builder.names.strings,
        threads=builder.threads.strings,
        gpu=gpu,
        launches=launches,
        markers=markers,
        kernel_comm_args=kernel_args,
        warnings=warnings,
        event_count=builder.event_count,
        shape_ops=builder.finish_shapes(),
        flow_events=builder.counts["flow"],
        runtime_calls=builder.counts["runtime"],
        unread_device_events=sum(builder.unread.values()),
        host_op_medians=builder.host_op_medians,
        memory=builder.memory.finish(warnings),
    )


def _rank_of(path: Path, info: Any, world: int | None, warnings: list[str]) -> tuple[int, str]:
    """The rank: ``distributedInfo.rank``, else the file name's. A rank no job can have
    (negative, not below the world size, or beyond any) is said and not used."""
    if info is not None and info.rank is not None:
        rank = to_int(info.rank, None)  # type: ignore[arg-type]
        default = None if world else _default_group_size(info)
        limit = world or default or MAX_WORLD
        if rank is not None and 0 <= rank < limit:
            return rank, "distributedInfo"
        shown = info.rank if rank is None else rank
        job = (f"this job (world size {world})" if world else
               f"this job (its default group, distributedInfo.pg_config, holds {default})" if default else "any job")
        warnings.append(f"distributedInfo.rank {str(shown)[:40]!s} is not a rank of {job}: ignored, "
                        "the rank comes from the file name")
    from_name = rank_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    if _RANK_IN_NAME.search(path.name):
        warnings.append(f"the file name's rank number {_RANK_IN_NAME.findall(path.name)[-1][:40]} is beyond any job: "
                        "ignored")
    return -1, "unknown"  # resolved by the job loader (rank 0 when it is the only file)


def _default_group_size(info: Any) -> int | None:
    """The size of the default process group (every rank of the job) in ``pg_config``, where
    the trace gives no world size; None when it declares none or a size no job has."""
    for pg in info.pg_config or ():
        if pg.pg_desc == "default_pg" or str(pg.pg_name) == "0":
            size = to_int(pg.pg_size, None)  # type: ignore[arg-type]
            return size if size is not None and 0 < size <= MAX_WORLD else None
    return None


def _host_of(doc: TraceFile) -> str | None:
    info = doc.distributedInfo
    for value in (info.host_name if info else None, info.hostname if info else None,
                  doc.host_name, doc.hostname):
        if value:
            return str(value)
    return None


def _world_size(info: Any, warnings: list[str]) -> int | None:
    """``distributedInfo.world_size``; one beyond ``MAX_WORLD`` (no cluster has that many GPUs),
    zero or negative is bad input, not a job: said, and the world size is unknown."""
    if info is None or info.world_size is None:
        return None
    world = to_int(info.world_size, None)  # type: ignore[arg-type]
    if world is None or not 0 < world <= MAX_WORLD:
        warnings.append(f"distributedInfo.world_size {str(info.world_size if world is None else world)[:40]} "
                        f"is not a plausible job size (1 to {MAX_WORLD:,}): ignored")
        return None
    return world


def _process_groups(info: Any, world: int | None, warnings: list[str]) -> list[dict[str, Any]]:
    if info is None:
        return []
    if not info.pg_config and world:
        # No pg_config (older torch, other recorders): the default group is still the world.
        return [{"name": "0", "description": "default_pg", "ranks": list(range(world)), "size": world,
                 "backend": info.backend, "source": "distributedInfo.world_size (no pg_config)"}]
    if not info.pg_config:
        return []
    groups = []
    limit = world or MAX_WORLD
    for i, pg in enumerate(info.pg_config):
        ranks = parse_ranks(pg.ranks)
        if ranks is not None and not all(0 <= r < limit for r in ranks):
            bad = next(r for r in ranks if not 0 <= r < limit)
            warnings.append(f"distributedInfo.pg_config[{i}].ranks holds {str(bad)[:40]}, not a rank of "
                            f"{'this job (world size ' + str(world) + ')' if world else 'any job'}: "
                            "the group's members are unknown")
            ranks = None
        size = to_int(pg.pg_size)
        if pg.pg_size is not None and not 0 <= size <= limit:
            warnings.append(f"distributedInfo.pg_config[{i}].pg_size {str(pg.pg_size)[:40]} is not a group size of "
                            f"{'this job (world size ' + str(world) + ')' if world else 'any job'}: ignored")
            size = MISSING
        if ranks is None and world and size == world and (pg.pg_desc == "default_pg" or str(pg.pg_name) == "0"):
            # torch writes a large group's ranks cut to its first 30 ("[0, 1, ..., ...]"); the
            # default group of a world of `size` is every rank
            ranks = list(range(world))
        groups.append({
            "name": None if pg.pg_name is None else str(pg.pg_name),
            "description": pg.pg_desc,
            "ranks": ranks,
            "size": size if size > 0 else (len(ranks) if ranks else None),
            "backend": pg.backend_config,
        })
    return groups


def _devices(doc: TraceFile, warnings: list[str]) -> list[dict[str, Any]]:
    devices = []
    for i, dev in enumerate(doc.deviceProperties or []):
        mem = to_int(dev.totalGlobalMem)
        if dev.totalGlobalMem is not None and not 0 <= mem <= MAX_DEVICE_BYTES:  # unknown, not 2**70 bytes
            warnings.append(f"deviceProperties[{i}].totalGlobalMem {str(dev.totalGlobalMem)[:40]} is not the memory "
                            "of any device: ignored")
            mem = MISSING
        # a name written as a number is still a name (the JSON contract: a string)
        name = None if dev.name is None else str(dev.name)
        devices.append({"id": to_int(dev.id), "name": name, "total_mem_bytes": mem if mem > 0 else None})
    return devices
