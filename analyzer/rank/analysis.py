"""Everything tracecliff measures on one rank, computed in one worker from one file.

This is the "map" half of the job: it needs only that rank's trace, so ranks run in parallel
workers and only this compact summary (not the event arrays) travels back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.rank.comms import collectives_for_rank
from analyzer.ingest.catalog import DEFAULT_COMM_PATTERN
from analyzer.ingest.classify import FRAMEWORK_MARKERS, framework_marker
from analyzer.ingest.loader import load_rank_trace
from analyzer.ingest.parallel import load_rank_trace_parallel
from analyzer.rank.checks import partial_result_warnings
from analyzer.rank.steps import step_facts
from analyzer.rank.timeline import BACKWARD, NO_STEP, PHASES, attribute, breakdown, exposed_by_phase, step_windows
from analyzer.ingest.trace import GpuKind, Marker, RankTrace


@dataclass
class RankAnalysis:
    path: str
    rank: int
    rank_source: str
    world_size: int | None
    host: str | None
    backend: str | None
    nccl_version: str | None
    process_groups: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    first_gpu_ns: int | None
    metrics: dict[str, float]
    steps: list[dict[str, Any]]
    phases: dict[str, float]
    collectives: list[dict[str, Any]]
    markers_seen: dict[str, int]
    gpu_event_count: int
    event_count: int
    warnings: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None  # kernels of chosen steps, for the HTML report


@dataclass(frozen=True)
class RankOptions:
    comm_pattern: str = DEFAULT_COMM_PATTERN  # analyzer.ingest.catalog.comm_pattern(user patterns)
    max_inflate_bytes: int = 8 * 10**9
    steps: tuple[int, ...] | None = None  # ProfilerStep numbers to keep (None: all)
    keep_timeline: bool = False


def analyze_rank_file(path: str, options: RankOptions, origin_ns: int | None = None,
                      two_cores: bool = False) -> RankAnalysis:
    """``two_cores``: decode on this process and a helper (analyzer.ingest.parallel), for a job
    whose only rank would otherwise leave a core idle."""
    load = load_rank_trace_parallel if two_cores else load_rank_trace
    trace = load(Path(path), options.comm_pattern, options.max_inflate_bytes)
    return analyze_rank(trace, options, origin_ns)


def analyze_rank(trace: RankTrace, options: RankOptions, origin_ns: int | None = None) -> RankAnalysis:
    att = attribute(trace)
    warnings = list(trace.warnings)
    gpu, keep = trace.gpu, None
    if options.steps is not None:
        keep = np.isin(att.step, np.asarray(options.steps, dtype=np.int64))
        missing = sorted(set(options.steps) - set(np.unique(att.step[keep]).tolist()))
        if missing:
            warnings.append(f"requested step(s) {missing} not found in this trace")
        gpu = gpu.take(np.flatnonzero(keep))
        rows = np.flatnonzero(keep)
        att = att.take(rows)
        trace = _with_gpu(trace, gpu, rows)
    # The rank's time origin: its first GPU activity (a CPU-only trace: its first marked CPU op).
    first_gpu = int(gpu.ts.min()) if len(gpu) else (int(trace.markers.ts.min()) if len(trace.markers.ts) else None)
    origin = origin_ns if origin_ns is not None else (first_gpu or 0)
    if len(gpu) == 0:
        warnings.append("no GPU activity in this trace (CPU-only profile?): GPU metrics are zero "
                        "and communication is reported from CPU-side ops only")
    elif not (gpu.kind == GpuKind.COMM).any():
        warnings.append("no communication kernels found (nothing matched the catalog of `tracecliff explain "
                        "communication` or --comm-kernel): communication is zero for this rank")
    if len(gpu) and (att.launch_thread < 0).all():
        warnings.append("GPU events have no CPU-side link (correlation): step and phase are unknown")
    steps = _per_step(trace, att, gpu)
    if len(gpu) and not steps and not (trace.markers.kind == Marker.STEP).any():
        warnings.append("no ProfilerStep#N markers: per-step metrics unavailable")
    analysis = RankAnalysis(
        path=trace.path, rank=trace.rank, rank_source=trace.rank_source,
        world_size=trace.world_size, host=trace.host, backend=trace.backend,
        nccl_version=trace.nccl_version, process_groups=trace.process_groups, devices=trace.devices,
        first_gpu_ns=first_gpu, metrics=breakdown(gpu), steps=steps,
        phases=exposed_by_phase(gpu, att.phase),
        collectives=collectives_for_rank(trace, att, origin),
        markers_seen=_markers_seen(trace), gpu_event_count=len(gpu), event_count=trace.event_count,
        warnings=warnings,
        timeline=_timeline(trace, att, origin) if options.keep_timeline else None,
    )
    analysis.warnings += partial_result_warnings(gpu, att, steps, analysis.collectives)
    return analysis


def _with_gpu(trace: RankTrace, gpu, rows: np.ndarray) -> RankTrace:
    """The trace restricted to GPU rows ``rows`` (sorted): kernel args re-keyed to the new rows."""
    args = {}
    for old, value in trace.kernel_comm_args.items():  # few: communication kernels only
        new = int(np.searchsorted(rows, old))
        if new < len(rows) and rows[new] == old:
            args[new] = value
    return replace(trace, gpu=gpu, kernel_comm_args=args)


def _per_step(trace: RankTrace, att, gpu) -> list[dict[str, Any]]:
    numbers = sorted(int(s) for s in np.unique(att.step) if s != NO_STEP)
    steps = []
    firsts = {}
    for number in numbers:
        rows = np.flatnonzero(att.step == number)
        sub = gpu.take(rows)
        entry = {"step": number}
        entry.update(breakdown(sub))
        entry["phases"] = exposed_by_phase(sub, att.phase[rows])
        entry.update(step_facts(trace.strings, sub, att.phase[rows]))
        firsts[number] = int(sub.ts.min())
        backward = (att.phase[rows] == BACKWARD) & (att.launch_thread[rows] >= 0)
        entry["backward_launch_ns"] = int(att.launch_ts[rows][backward].min()) if backward.any() else None
        steps.append(entry)
    # Step time: from this step's first GPU activity to the next step's (the gap before the next
    # step is this step's stall); the last step has no successor, so its span stands in.
    for entry, nxt in zip(steps, steps[1:] + [None]):
        if nxt is not None and nxt["step"] == entry["step"] + 1:
            entry["step_time_us"] = round((firsts[nxt["step"]] - firsts[entry["step"]]) / 1000.0, 3)
        else:
            entry["step_time_us"] = entry["span_us"]
    cpu_numbers, cpu_starts, cpu_ends = step_windows(trace)
    cpu = {int(n): round((int(e) - int(s)) / 1000.0, 3) for n, s, e in zip(cpu_numbers, cpu_starts, cpu_ends)}
    for entry in steps:
        entry["cpu_step_us"] = cpu.get(entry["step"])
    # When backward began on the CPU (first autograd function of the step, else the first
    # backward launch): the origin of DDP's gradient-ready (bucket launch) times. CPU-only
    # traces have no step entries (no GPU metrics), hence no offsets.
    m = trace.markers
    bwd_starts = m.ts[m.kind == Marker.BACKWARD]
    for number, start, end in zip(cpu_numbers, cpu_starts, cpu_ends):
        inside = bwd_starts[(bwd_starts >= start) & (bwd_starts <= end)]
        if len(inside):
            entry = next((e for e in steps if e["step"] == int(number)), None)
            if entry is not None:
                entry["backward_launch_ns"] = int(inside.min())
    return steps


def _markers_seen(trace: RankTrace) -> dict[str, int]:
    """Counts of the framework markers present: the evidence for strategy detection."""
    names = [trace.strings[i] for i in trace.markers.name]
    seen = {
        "ddp_forward": sum(n == "DistributedDataParallel.forward" for n in names),
        "fsdp1": sum(n.startswith("FullyShardedDataParallel.") for n in names),
        "fsdp2": sum(n.startswith("FSDP::") for n in names),
        "profiler_steps": int((trace.markers.kind == Marker.STEP).sum()),
        "optimizer": int((trace.markers.kind == Marker.OPTIMIZER).sum()),
    }
    for family, _ in FRAMEWORK_MARKERS:  # parallelism evidence (analyzer.job.parallelism)
        seen[family] = 0
    for name in names:
        family = framework_marker(name)
        if family:
            seen[family] += 1
    return seen


def _timeline(trace: RankTrace, att, origin: int) -> dict[str, Any]:
    gpu = trace.gpu
    return {
        "start_us": np.round((gpu.ts - origin) / 1000.0, 3).tolist(),
        "dur_us": np.round((gpu.end - gpu.ts) / 1000.0, 3).tolist(),
        "stream": gpu.stream.tolist(),
        "kind": gpu.kind.tolist(),
        "name": gpu.name.tolist(),
        "step": att.step.tolist(),
        "phase": att.phase.tolist(),
        "strings": list(trace.strings),
        "phases": list(PHASES),
    }
