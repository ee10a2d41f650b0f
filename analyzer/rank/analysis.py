"""Everything tracecliff measures on one rank, computed in one worker from one file.

This is the "map" half of the job: it needs only that rank's trace, so ranks run in parallel
workers and only this compact summary (not the event arrays) travels back.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.base.gc_pause import paused_gc
from analyzer.base.rowtable import RowTable
from analyzer.rank.comms import collectives_for_rank, kernels_of_launching_ops
from analyzer.ingest.catalog import DEFAULT_COMM_PATTERN
from analyzer.ingest.classify import FRAMEWORK_MARKERS, framework_marker
from analyzer.ingest.loader import load_rank_trace
from analyzer.ingest.parallel import load_rank_trace_parallel
from analyzer.rank.attribution import RankTimeline, idle_split_note, step_window
from analyzer.rank.checks import partial_result_warnings
from analyzer.rank.flops import compute_steps
from analyzer.rank.memory import rank_memory
from analyzer.rank.recompute import recompute
from analyzer.rank.steps import step_figures
from analyzer.rank.workload import workload_evidence
from analyzer.rank.timeline import (NO_STEP, PHASES, Attribution, attribute, breakdown, exposed_by_phase,
                                    step_source, step_windows)
from analyzer.ingest.trace import GpuEvents, GpuKind, Marker, RankTrace


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
    # one row per collective (analyzer.rank.comms), by column (a list of dicts given is read as one);
    # after the reduce, the rank's rows of the job's table
    collectives: RowTable
    markers_seen: dict[str, int]
    gpu_event_count: int
    event_count: int
    warnings: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None  # kernels of chosen steps, for the HTML report
    # Per step (str(number)): its exposed-communication intervals on this rank's clock, for the
    # job analysis's wait/transfer split (analyzer.job.attribution), flat: [start_ns, end_ns,
    # start_ns, end_ns, ...], one list per step rather than one small list per interval (a
    # 64-rank job's cached entries held 750,000 of those: half their decode and conversion).
    exposed_intervals: dict[str, list[int]] = field(default_factory=dict)
    # The typical step's time breakdown, set by the job analysis (analyzer.job.attribution).
    time_breakdown: dict[str, Any] | None = None
    # FLOPs from recorded shapes and their GPU time per step (analyzer.rank.flops; None: the
    # trace holds none of the ops), and the typical step's compute figures the job analysis
    # makes of them (analyzer.job.compute: the ``ranks[].compute`` contract).
    compute_steps: dict[str, Any] | None = None
    compute: dict[str, Any] | None = None
    # The kernels of every step, for the report's step timeline (RankOptions.keep_kernels): this
    # run's alone, never cached (analyzer.run.cache) nor written to the result.
    kernels: RankKernels | None = field(default=None, repr=False, compare=False)
    # Measured memory per step from the allocator's events (analyzer.rank.memory), for the job's
    # ``memory`` section (analyzer.job.memory), which is what the result writes and reads back.
    memory: dict[str, Any] | None = None


@dataclass(frozen=True, eq=False)
class RankKernels:
    """GPU kernels by column, as the report's step timeline reads them (``kernels_timeline``).
    The map sends a rank's back with its summary so that the report need not decode the trace a
    second time to draw one step (issue 13); compact for that trip: numpy columns (pickled as
    raw buffers, ~22 bytes a kernel) and, in the map's, only the kernel names used."""

    ts: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    stream: np.ndarray  # ints
    kind: np.ndarray  # int8 GpuKind
    name: np.ndarray  # ints, index into ``strings``
    step: np.ndarray  # ints, ProfilerStep number or NO_STEP
    phase: np.ndarray  # int8 index into PHASES
    strings: list[str]

    def take(self, rows: np.ndarray) -> RankKernels:
        return RankKernels(self.ts[rows], self.end[rows], self.stream[rows], self.kind[rows], self.name[rows],
                           self.step[rows], self.phase[rows], self.strings)

    @property
    def nbytes(self) -> int:
        return (sum(column.nbytes for column in (self.ts, self.end, self.stream, self.kind, self.name, self.step,
                                                 self.phase))
                + sum(map(sys.getsizeof, self.strings)))


RANK_METRICS = ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us",
                "idle_us", "overlap_pct")
# RankAnalysis fields kept in each ``ranks[]`` entry as they are (the metrics are flattened).
_RANK_FIELDS = ("rank", "path", "rank_source", "host", "world_size", "steps", "phases", "gpu_event_count",
                "backend", "nccl_version", "process_groups", "devices", "first_gpu_ns", "markers_seen",
                "event_count", "time_breakdown")


def rank_entry(r: RankAnalysis) -> dict[str, Any]:
    """A rank as its ``ranks[]`` entry of the JSON document."""
    out = {key: getattr(r, key) for key in _RANK_FIELDS}
    out.update({k: r.metrics[k] for k in RANK_METRICS})
    out["rank_warnings"] = r.warnings
    # The typical step's time when the job analysis chose one (its time_breakdown adds up to it).
    out["step_time_us"] = r.time_breakdown["step_time_us"] if r.time_breakdown else mean_step_time(r)
    for key in _COMPUTE_FIELDS:  # written when the trace has ops with FLOPs (issue 29)
        if getattr(r, key) is not None:
            out[key] = getattr(r, key)
    return out


_COMPUTE_FIELDS = ("compute", "compute_steps")


def rank_from_entry(entry: dict[str, Any], rows: list[dict[str, Any]]) -> RankAnalysis:
    known = {f.name for f in fields(RankAnalysis)}
    values: dict[str, Any] = {key: entry.get(key) for key in _RANK_FIELDS + _COMPUTE_FIELDS if key in known}
    values.update(metrics={k: entry.get(k) for k in RANK_METRICS}, collectives=rows,
                  warnings=list(entry.get("rank_warnings") or []))
    for key, empty in (("process_groups", []), ("devices", []), ("markers_seen", {}), ("steps", []),
                       ("phases", {}), ("gpu_event_count", 0), ("event_count", 0)):
        if values.get(key) is None:
            values[key] = type(empty)()
    return RankAnalysis(**values)


def mean_step_time(r: RankAnalysis) -> float | None:
    times = [s["step_time_us"] for s in r.steps]
    return round(sum(times) / len(times), 3) if times else None


@dataclass(frozen=True)
class RankOptions:
    comm_pattern: str = DEFAULT_COMM_PATTERN  # analyzer.ingest.catalog.comm_pattern(user patterns)
    max_inflate_bytes: int = 8 * 10**9
    steps: tuple[int, ...] | None = None  # ProfilerStep numbers to keep (None: all)
    keep_timeline: bool = False
    keep_kernels: bool = False  # RankAnalysis.kernels, for the report's step timeline


def analyze_rank_file(path: str, options: RankOptions, origin_ns: int | None = None,
                      two_cores: bool = False) -> RankAnalysis:
    """``two_cores``: decode on this process and a helper (analyzer.ingest.parallel), for a job
    whose only rank would otherwise leave a core idle. The cyclic collector is paused: the
    decode and analysis make hundreds of thousands of objects and no cycles, and a collection
    would scan them all (~25 ms, a twentieth of a collective-heavy rank's map); what survives
    (the summary) goes to the oldest generation unscanned, as the cache's entries do."""
    with paused_gc(long_lived=True):
        return analyze_rank(_load(path, options, two_cores), options, origin_ns)


# The trace the main process loaded last, for the report's step timeline: a job whose map ran
# in this process (one rank) would otherwise decode the whole file a second time to draw one
# step (issue 13: a third of a one-rank `--format json` run) when the map kept no kernels of it
# (RankAnalysis.kernels: past their memory budget, or a caller that asked for none). One slot,
# keyed by the file's stat identity (a rewritten file is read again), emptied when it is used,
# when the report is drawn (``forget_loaded``) and when the next load starts; pool and Dask
# workers keep nothing between ranks.
_LAST_LOADED: dict[tuple, RankTrace] = {}


def _load(path: str, options: RankOptions, two_cores: bool) -> RankTrace:
    key = _load_key(path, options)
    trace = _LAST_LOADED.pop(key, None) if key else None
    _LAST_LOADED.clear()
    if trace is not None:
        return trace
    load = load_rank_trace_parallel if two_cores else load_rank_trace
    trace = load(Path(path), options.comm_pattern, options.max_inflate_bytes)
    if key and _main_process():
        _LAST_LOADED[key] = trace
    return trace


def forget_loaded() -> None:
    """Empty the slot: the report's step timeline is drawn (from kernels the map kept, which
    leave the slot unused) and the trace is not needed again."""
    _LAST_LOADED.clear()


def _main_process() -> bool:
    """Not a pool or Dask worker: ``multiprocessing.parent_process() is None``, without importing
    multiprocessing (~8 ms) into a process that never did (one not started by it)."""
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None


def step_timeline_file(path: str, options: RankOptions, origin_ns: int) -> dict[str, Any]:
    """``RankAnalysis.timeline`` of the kernels of ``options.steps`` (all when None), without the
    rest of the analysis: what the report's step timeline needs of a rank it shows when the map
    kept no ``RankAnalysis.kernels`` of it. A one-rank job finds the trace in the slot above;
    elsewhere the file is decoded again (the decode is nearly all of the cost)."""
    trace = _load(path, options, two_cores=False)
    return kernels_timeline(_kernels(trace.gpu, attribute(trace), trace.strings), options.steps, origin_ns)


def kernels_timeline(kernels: RankKernels, steps: tuple[int, ...] | None, origin_ns: int,
                     used_names: bool = True) -> dict[str, Any]:
    """``RankAnalysis.timeline`` of the kernels of ``steps`` (all when None), times from
    ``origin_ns``. ``used_names``: only the kernel names used are kept (``strings`` re-indexed),
    so that the result is small enough to travel back from a worker and to cache."""
    if steps is not None:
        kernels = kernels.take(np.flatnonzero(np.isin(kernels.step, np.asarray(steps, dtype=np.int64))))
    names, strings = kernels.name, kernels.strings
    if used_names:
        used, names = np.unique(kernels.name, return_inverse=True)
        strings = [strings[i] for i in used.tolist()]
    return {
        "start_us": np.round((kernels.ts - origin_ns) / 1000.0, 3).tolist(),
        "dur_us": np.round((kernels.end - kernels.ts) / 1000.0, 3).tolist(),
        "stream": kernels.stream.tolist(),
        "kind": kernels.kind.tolist(),
        "name": names.reshape(-1).tolist(),
        "step": kernels.step.tolist(),
        "phase": kernels.phase.tolist(),
        "strings": list(strings),
        "phases": list(PHASES),
    }


def _kernels(gpu: GpuEvents, att: Attribution, strings: list[str]) -> RankKernels:
    return RankKernels(gpu.ts, gpu.end, gpu.stream, gpu.kind, gpu.name, att.step, att.phase, strings)


def kept_kernels(gpu: GpuEvents, att: Attribution, strings: list[str]) -> RankKernels:
    """What the report's step timeline can show of a rank, compactly (``RankAnalysis.kernels``):
    the kernels of its steps (a rank with steps is shown one step at a time, never its
    unstepped kernels; one without, whole), small ints in the narrowest type that holds them,
    and only the kernel names used."""
    kernels = _kernels(gpu, att, strings)
    stepped = att.step != NO_STEP
    if stepped.any() and not stepped.all():
        kernels = kernels.take(np.flatnonzero(stepped))
    used, names = np.unique(kernels.name, return_inverse=True)
    return replace(kernels, stream=_narrow(kernels.stream), name=_narrow(names.reshape(-1)),
                   step=_narrow(kernels.step), strings=[strings[i] for i in used.tolist()])


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integers in the narrowest of int8/16/32 that holds them (as they are when none does)."""
    if len(values):
        low, high = int(values.min()), int(values.max())
        for dtype in (np.int8, np.int16, np.int32):
            if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
                return values.astype(dtype)
    return values


def _load_key(path: str, options: RankOptions) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None  # the load reports it
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, options.comm_pattern,
            options.max_inflate_bytes)


def analyze_rank(trace: RankTrace, options: RankOptions, origin_ns: int | None = None) -> RankAnalysis:
    att = attribute(trace)
    kernels_of_launching_ops(trace, att)  # before any figure: they are communication
    warnings = list(trace.warnings)
    gpu, keep = trace.gpu, None
    recorded_gpu = len(gpu) > 0
    if options.steps is not None:
        keep = np.isin(att.step, np.asarray(options.steps, dtype=np.int64))
        missing = sorted(set(options.steps) - set(arrays.unique(att.step[keep]).tolist()))
        if missing:
            shown = missing if len(missing) <= 20 else f"{missing[:20]} and {len(missing) - 20:,} more"
            warnings.append(f"requested step(s) {shown} not found in this trace")
        gpu = gpu.take(np.flatnonzero(keep))
        rows = np.flatnonzero(keep)
        att = att.take(rows)
        trace = _with_gpu(trace, gpu, rows)
    # The rank's time origin: its first GPU activity (a CPU-only trace: its first marked CPU op).
    marked = trace.markers.ts[trace.markers.kind != Marker.ANNOTATION]
    first_gpu = int(gpu.ts.min()) if len(gpu) else (int(marked.min()) if len(marked) else None)
    origin = origin_ns if origin_ns is not None else (first_gpu or 0)
    if len(gpu) == 0 and recorded_gpu:  # --steps selected none of the steps holding GPU work
        warnings.append("no GPU activity in the selected step(s): GPU metrics are zero")
    elif len(gpu) == 0 and trace.unread_device_events:  # named by the ingest's warning
        warnings.append("no GPU activity read, though events under unknown categories look like device work: "
                        "GPU metrics are zero, not measured")
    elif len(gpu) == 0:
        warnings.append("no GPU activity in this trace (CPU-only profile?): GPU metrics are zero "
                        "and communication is reported from CPU-side ops only")
    elif not (gpu.kind == GpuKind.COMM).any():
        warnings.append("no communication kernels found (nothing matched the catalog of `tracecliff explain "
                        "communication` or --comm-kernel): communication is zero for this rank")
    if len(gpu) and (att.launch_thread < 0).all():
        warnings.append("GPU events have no CPU-side link (correlation): step and phase are unknown")
    exposed: dict[str, list[int]] = {}
    steps = _per_step(trace, att, gpu, exposed)
    note = step_source(trace).note if len(gpu) else None
    if note:  # steps from other annotations, or the whole trace: said with every step's figures
        warnings.append(note)
        for entry in steps:
            entry["step_source"] = note
    elif len(gpu) and not steps and not (trace.markers.kind == Marker.STEP).any():
        warnings.append("no ProfilerStep#N markers: per-step metrics unavailable")
    analysis = RankAnalysis(
        path=trace.path, rank=trace.rank, rank_source=trace.rank_source,
        world_size=trace.world_size, host=trace.host, backend=trace.backend,
        nccl_version=trace.nccl_version, process_groups=trace.process_groups, devices=trace.devices,
        first_gpu_ns=first_gpu, metrics=breakdown(gpu), steps=steps,
        phases=exposed_by_phase(gpu, att.phase),
        collectives=RowTable.from_dicts(collectives_for_rank(trace, att, origin, warnings)),
        markers_seen=_markers_seen(trace), gpu_event_count=len(gpu), event_count=trace.event_count,
        warnings=warnings, exposed_intervals=exposed,
        timeline=_timeline(trace, att, origin) if options.keep_timeline else None,
        kernels=kept_kernels(gpu, att, trace.strings) if options.keep_kernels else None,
        compute_steps=compute_steps(trace, gpu, att.launch_ts, att.launch_thread, options.steps),
        memory=rank_memory(trace, options.steps),
    )
    analysis.memory["recompute"] = recompute(trace, gpu, att.launch_ts, att.launch_thread)
    if len(gpu) == 0 and not analysis.collectives:
        warnings.append("no collective found in the CPU-side ops either (record_param_comms, c10d::*, "
                        "gloo:*): communication is unknown, not zero")
    analysis.warnings += partial_result_warnings(gpu, att, steps, analysis.collectives,
                                                 "step" if note else "ProfilerStep")
    return analysis


def _with_gpu(trace: RankTrace, gpu, rows: np.ndarray) -> RankTrace:
    """The trace restricted to GPU rows ``rows`` (sorted): kernel args re-keyed to the new rows."""
    return replace(trace, gpu=gpu, kernel_comm_args=trace.kernel_comm_args.rekeyed(rows))


def _per_step(trace: RankTrace, att, gpu, exposed: dict[str, list[int]]) -> list[dict[str, Any]]:
    steps = step_figures(trace.strings, gpu, att)
    firsts = {entry["step"]: entry.pop("first_ns") for entry in steps}
    # Step time: from this step's first GPU activity to the next step's (the gap before the next
    # step is this step's stall); the last step has no successor, so its span stands in.
    for entry, nxt in zip(steps, steps[1:] + [None]):
        if nxt is not None and nxt["step"] == entry["step"] + 1:
            entry["step_time_us"] = round((firsts[nxt["step"]] - firsts[entry["step"]]) / 1000.0, 3)
        else:
            entry["step_time_us"] = entry["span_us"]
    timeline = RankTimeline(trace, gpu, att.launch_ts, att.phase) if steps else None
    if steps:
        _attribute_steps(trace, timeline, steps, firsts, exposed)
    cpu_numbers, cpu_starts, cpu_ends = step_windows(trace)
    cpu = {int(n): round((int(e) - int(s)) / 1000.0, 3) for n, s, e in zip(cpu_numbers, cpu_starts, cpu_ends)}
    cpu_start = {int(n): int(s) for n, s in zip(cpu_numbers, cpu_starts)}
    for entry in steps:
        entry["cpu_step_us"] = cpu.get(entry["step"])
    with_cpu = [entry for entry in steps if entry["step"] in cpu_start]
    if with_cpu:
        befores = timeline.host_before(np.array([cpu_start[entry["step"]] for entry in with_cpu], dtype=np.int64),
                                       np.array([firsts[entry["step"]] for entry in with_cpu], dtype=np.int64))
        for entry, before in zip(with_cpu, befores):
            entry["time_breakdown"]["host_before_us"] = before
    # When backward began on the CPU (first autograd function of the step, else the first
    # backward launch): the origin of DDP's gradient-ready (bucket launch) times. CPU-only
    # traces have no step entries (no GPU metrics), hence no offsets.
    by_number = {entry["step"]: entry for entry in steps}
    for number, begun in zip(cpu_numbers.tolist(), _first_within(trace, Marker.BACKWARD, cpu_starts, cpu_ends)):
        if begun is not None and number in by_number:
            by_number[number]["backward_launch_ns"] = begun
    return steps


def _first_within(trace: RankTrace, kind: Marker, starts: np.ndarray, ends: np.ndarray) -> list[int | None]:
    """The first start of a ``kind`` marker in each [starts[k], ends[k]], or None."""
    begins = np.sort(trace.markers.ts[trace.markers.kind == kind])
    if not len(begins):
        return [None] * len(starts)
    idx = np.searchsorted(begins, starts, side="left")
    first = begins[np.minimum(idx, len(begins) - 1)]
    found = (idx < len(begins)) & (first <= ends)
    return [value if ok else None for value, ok in zip(first.tolist(), found.tolist())]


def _attribute_steps(trace: RankTrace, timeline: RankTimeline, steps: list[dict[str, Any]], firsts: dict[int, int],
                     exposed: dict[str, list[int]]) -> None:
    """Each step's time breakdown over its window (analyzer.rank.attribution)."""
    windows = [step_window(firsts[entry["step"]], entry["step_time_us"]) for entry in steps]
    starts, ends = (np.array(bounds, dtype=np.int64) for bounds in zip(*windows))
    for entry, window, (leaves, intervals) in zip(steps, windows, timeline.steps(starts, ends)):
        entry["time_breakdown"] = leaves
        entry["window_ns"] = list(window)
        exposed[str(entry["step"])] = intervals
    note = idle_split_note(trace, [entry["time_breakdown"] for entry in steps])
    if note:  # said with every step's split (the job quotes the typical step's)
        for entry in steps:
            entry["time_breakdown"]["idle_split_note"] = note


def _markers_seen(trace: RankTrace) -> dict[str, int]:
    """Counts of the framework markers present: the evidence for strategy detection."""
    # Each distinct name is judged once, weighted by how many markers bear it.
    ids, counts = np.unique(trace.markers.name[trace.markers.kind != Marker.ANNOTATION], return_counts=True)
    names = [(trace.strings[i], n) for i, n in zip(ids.tolist(), counts.tolist())]
    seen = {
        "ddp_forward": sum(n for name, n in names if name == "DistributedDataParallel.forward"),
        "fsdp1": sum(n for name, n in names if name.startswith("FullyShardedDataParallel.")),
        "fsdp2": sum(n for name, n in names if name.startswith("FSDP::")),
        "profiler_steps": int((trace.markers.kind == Marker.STEP).sum()),
        "optimizer": int((trace.markers.kind == Marker.OPTIMIZER).sum()),
    }
    seen.update(workload_evidence(trace))  # training or inference (analyzer.rank.workload)
    for family, _ in FRAMEWORK_MARKERS:  # parallelism evidence (analyzer.job.parallelism)
        seen[family] = 0
    for name, n in names:
        family = framework_marker(name)
        if family:
            seen[family] += n
    if trace.unread_device_events:  # only where there are some: other results stay as they were
        seen["unread_device_events"] = trace.unread_device_events
    return seen


def _timeline(trace: RankTrace, att, origin: int) -> dict[str, Any]:
    return kernels_timeline(_kernels(trace.gpu, att, trace.strings), None, origin, used_names=False)
