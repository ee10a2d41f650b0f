"""Load one trace file into a RankTrace: read, decode, detect rank/host, build columns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from analyzer.base.errors import InputError
from analyzer.ingest.classify import DEFAULT_COMM_PATTERN, KernelClassifier
from analyzer.ingest.columns import ColumnBuilder, parse_ranks, to_int
from analyzer.ingest.files import DEFAULT_MAX_INFLATE_BYTES, iter_trace_chunks
from analyzer.ingest.schema import TraceFile
from analyzer.ingest.stream import Decoding, decode_stream
from analyzer.ingest.trace import RankTrace

# rank-3, rank_3, rank3, worker3, worker_3, trainer-3, proc3 ... (the last match wins: dirs first)
_RANK_IN_NAME = re.compile(r"(?:rank|worker|trainer|proc|process|gpu)[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    matches = _RANK_IN_NAME.findall(path.name)
    rank = int(matches[-1]) if matches else None
    return rank if rank is not None and rank < MAX_WORLD else None  # "rank-99999999999999999999": no rank


def load_rank_trace(path: Path, comm_pattern: str = DEFAULT_COMM_PATTERN,
                    max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES) -> RankTrace:
    """Stream the file: inflate and decode it in batches, folding each into the columns, so
    peak memory follows the columns (tens of bytes an event), not the JSON (hundreds)."""
    builder = ColumnBuilder(KernelClassifier(comm_pattern))
    chunks = iter_trace_chunks(path, max_inflate_bytes)
    try:
        meta, decoding = decode_stream(path, chunks, builder.add)
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
    if decoding.replaced_nonfinite:
        warnings.append("the trace holds NaN/Infinity literals (not JSON): read as null, so events "
                        "whose ts or dur was one are ignored")
    info = meta.distributedInfo
    if info is None:
        warnings.append("no distributedInfo in the trace: world size and process groups are unknown")
    gpu, kernel_args, launches, markers = builder.finish(warnings)
    rank, source = _rank_of(path, info, warnings)
    return RankTrace(
        path=str(path),
        rank=rank,
        rank_source=source,
        world_size=_world_size(info, warnings),
        host=_host_of(meta),
        backend=info.backend if info else None,
        nccl_version=info.nccl_version if info else None,
        process_groups=_process_groups(info, _world_size(info, [])),
        devices=_devices(meta),
        strings=builder.names.strings,
        threads=builder.threads.strings,
        gpu=gpu,
        launches=launches,
        markers=markers,
        kernel_comm_args=kernel_args,
        warnings=warnings,
        event_count=builder.event_count,
        flow_events=builder.counts["flow"],
        runtime_calls=builder.counts["runtime"],
        host_op_medians=builder.host_op_medians,
    )


def _positive(value: Any) -> int | None:
    number = to_int(value)
    return number if number > 0 else None


def _rank_of(path: Path, info: Any, warnings: list[str]) -> tuple[int, str]:
    if info is not None:
        rank = to_int(info.rank)
        if rank >= MAX_WORLD:  # no job has that many ranks: bad input, not a rank
            warnings.append(f"distributedInfo.rank {rank} is not a plausible rank: ignored")
        elif rank >= 0:
            return rank, "distributedInfo"
    from_name = rank_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    return -1, "unknown"  # resolved by the job loader (rank 0 when it is the only file)


def _host_of(doc: TraceFile) -> str | None:
    info = doc.distributedInfo
    for value in (info.host_name if info else None, info.hostname if info else None,
                  doc.host_name, doc.hostname):
        if value:
            return str(value)
    return None


MAX_WORLD = 1 << 20  # GPUs: far beyond any job; a larger world_size is bad input, not a job


def _world_size(info: Any, warnings: list[str]) -> int | None:
    world = _positive(info.world_size) if info else None
    if world and world > MAX_WORLD:
        warnings.append(f"distributedInfo.world_size {world} is not a plausible job size: ignored")
        return None
    return world


def _process_groups(info: Any, world: int | None) -> list[dict[str, Any]]:
    if info is None:
        return []
    if not info.pg_config and world:
        # No pg_config (older torch, other recorders): the default group is still the world.
        return [{"name": "0", "description": "default_pg", "ranks": list(range(world)), "size": world,
                 "backend": info.backend, "source": "distributedInfo.world_size (no pg_config)"}]
    if not info.pg_config:
        return []
    groups = []
    for pg in info.pg_config:
        ranks = parse_ranks(pg.ranks)
        size = to_int(pg.pg_size)
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


def _devices(doc: TraceFile) -> list[dict[str, Any]]:
    devices = []
    for dev in doc.deviceProperties or []:
        mem = to_int(dev.totalGlobalMem)
        # a name written as a number is still a name (the JSON contract: a string)
        name = None if dev.name is None else str(dev.name)
        devices.append({"id": to_int(dev.id), "name": name, "total_mem_bytes": mem if mem > 0 else None})
    return devices
