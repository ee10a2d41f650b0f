"""Load one trace file into a RankTrace: read, decode, detect rank/host, build columns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analyzer.errors import InputError
from analyzer.ingest.classify import DEFAULT_COMM_PATTERN, KernelClassifier
from analyzer.ingest.columns import (
    Interner,
    build_gpu_events,
    build_launches,
    build_markers,
    parse_ranks,
    split_by_category,
    to_int,
)
from analyzer.ingest.files import DEFAULT_MAX_INFLATE_BYTES, read_trace_bytes
from analyzer.ingest.schema import TRACE_DECODER, TraceFile
from analyzer.trace import RankTrace

# rank-3, rank_3, rank3, worker3, worker_3, trainer-3, proc3 ... (the last match wins: dirs first)
_RANK_IN_NAME = re.compile(r"(?:rank|worker|trainer|proc|process|gpu)[-_]?(\d+)", re.IGNORECASE)


def decode_trace(path: Path, data: bytes) -> TraceFile:
    try:
        doc = TRACE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(path, f"not a Kineto trace: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc}") from None
    if isinstance(doc, list):
        doc = TraceFile(traceEvents=doc)
    if doc.traceEvents is None:
        raise InputError(path, "not a Kineto trace: no traceEvents list")
    if not doc.traceEvents:
        raise InputError(path, "empty traceEvents: the profiler recorded nothing")
    return doc


def rank_from_name(path: Path) -> int | None:
    matches = _RANK_IN_NAME.findall(path.name)
    return int(matches[-1]) if matches else None


def load_rank_trace(path: Path, comm_pattern: str = DEFAULT_COMM_PATTERN,
                    max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES) -> RankTrace:
    data = read_trace_bytes(path, max_inflate_bytes)
    doc = decode_trace(path, data)
    del data
    return build_rank_trace(path, doc, comm_pattern)


def build_rank_trace(path: Path, doc: TraceFile, comm_pattern: str = DEFAULT_COMM_PATTERN) -> RankTrace:
    warnings: list[str] = []
    info = doc.distributedInfo
    groups = split_by_category(doc.traceEvents)
    event_count = len(doc.traceEvents)
    doc.traceEvents = None  # drop the decoded tree as soon as it is split
    names, threads = Interner(), Interner()
    gpu, kernel_args = build_gpu_events(groups, names, KernelClassifier(comm_pattern), warnings)
    launches = build_launches(groups, threads, warnings, np.unique(gpu.correlation))
    markers = build_markers(groups, names, threads, warnings)
    rank, source = _rank_of(path, info)
    return RankTrace(
        path=str(path),
        rank=rank,
        rank_source=source,
        world_size=_positive(info.world_size) if info else None,
        host=_host_of(doc),
        backend=info.backend if info else None,
        nccl_version=info.nccl_version if info else None,
        process_groups=_process_groups(info),
        devices=_devices(doc),
        strings=names.strings,
        threads=threads.strings,
        gpu=gpu,
        launches=launches,
        markers=markers,
        kernel_comm_args=kernel_args,
        warnings=warnings,
        event_count=event_count,
    )


def _positive(value: Any) -> int | None:
    number = to_int(value)
    return number if number > 0 else None


def _rank_of(path: Path, info: Any) -> tuple[int, str]:
    if info is not None:
        rank = to_int(info.rank)
        if rank >= 0:
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


def _process_groups(info: Any) -> list[dict[str, Any]]:
    if info is None or not info.pg_config:
        return []
    groups = []
    for pg in info.pg_config:
        ranks = parse_ranks(pg.ranks)
        size = to_int(pg.pg_size)
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
        devices.append({"id": to_int(dev.id), "name": dev.name, "total_mem_bytes": mem if mem > 0 else None})
    return devices
