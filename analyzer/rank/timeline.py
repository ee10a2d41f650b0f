"""Per-rank GPU timelines: step and phase of every GPU activity, and the time breakdown.

Definitions (HTA's, so the numbers can be checked against it):
span = last GPU activity end - first GPU activity start; busy = union of all GPU activity;
compute = union of compute kernels over all streams; comm = union of communication kernels;
overlap = compute ∩ comm; exposed comm = comm - overlap; idle = span - busy;
overlap_pct = 100 * overlap / comm (0 when there is no communication).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.ingest.classify import step_number
from analyzer.ingest.trace import GpuEvents, GpuKind, Marker, RankTrace
from analyzer.rank.workload import forward_only

PHASES = ("forward", "backward", "optimizer", "other")
FORWARD, BACKWARD, OPTIMIZER, OTHER = range(4)
NO_STEP = -1


@dataclass
class Attribution:
    """Per GPU event: where and when the CPU launched it, its step and its phase."""

    launch_ts: np.ndarray  # int64 ns, -1 when the event has no CPU-side link
    launch_thread: np.ndarray  # int32, -1 when unlinked
    step: np.ndarray  # int64 ProfilerStep number, NO_STEP when outside every step
    phase: np.ndarray  # int8 index into PHASES

    def take(self, index: np.ndarray) -> "Attribution":
        return Attribution(self.launch_ts[index], self.launch_thread[index], self.step[index], self.phase[index])


def ns_to_us(value: int | float) -> float:
    return round(float(value) / 1000.0, 3)


def breakdown(gpu: GpuEvents) -> dict[str, float]:
    """The HTA-compatible time breakdown of a set of GPU activities, in µs."""
    if len(gpu) == 0:
        return {k: 0.0 for k in ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us",
                                  "exposed_comm_us", "idle_us", "overlap_pct")}
    busy = iv.union(gpu.ts, gpu.end)
    compute = _union_of(gpu, GpuKind.COMPUTE)
    comm = _union_of(gpu, GpuKind.COMM)
    span = int(gpu.end.max() - gpu.ts.min())
    return breakdown_of(span, iv.total(busy), iv.total(compute), iv.total(comm), iv.total(iv.intersect(compute, comm)))


def breakdown_of(span: int, busy_ns: int, compute_ns: int, comm_ns: int, overlap_ns: int) -> dict[str, float]:
    """``breakdown`` from its nanosecond totals (the per-step figures compute them for every
    step at once: analyzer.rank.steps)."""
    return {
        "span_us": ns_to_us(span),
        "busy_us": ns_to_us(busy_ns),
        "compute_us": ns_to_us(compute_ns),
        "comm_us": ns_to_us(comm_ns),
        "overlap_us": ns_to_us(overlap_ns),
        "exposed_comm_us": ns_to_us(comm_ns - overlap_ns),
        "idle_us": ns_to_us(span - busy_ns),
        "overlap_pct": round(100.0 * overlap_ns / comm_ns, 4) if comm_ns else 0.0,
    }


def _union_of(gpu: GpuEvents, kind: GpuKind) -> iv.IntervalSet:
    mask = gpu.kind == kind
    return iv.union(gpu.ts[mask], gpu.end[mask])


def compute_union(gpu: GpuEvents) -> iv.IntervalSet:
    return _union_of(gpu, GpuKind.COMPUTE)


def exposed_by_phase(gpu: GpuEvents, phase: np.ndarray) -> dict[str, float]:
    """Communication time not hidden under compute, split by the phase that launched it."""
    compute = compute_union(gpu)
    result = {}
    for code, name in enumerate(PHASES):
        mask = (gpu.kind == GpuKind.COMM) & (phase == code)
        comm = iv.union(gpu.ts[mask], gpu.end[mask])
        result[name] = ns_to_us(iv.total(iv.subtract(comm, compute)))
    return result


def attribute(rank: RankTrace) -> Attribution:
    launch_ts, launch_thread = _link_launches(rank)
    step, phase = locate(rank, launch_ts, launch_thread, rank.gpu.kind != GpuKind.MEMORY)
    linked = launch_thread >= 0
    if len(linked) and not linked.all():
        _fill_unlinked_by_stream(rank.gpu, step, linked)
        _fill_unlinked_by_stream(rank.gpu, phase, linked)
    return Attribution(launch_ts, launch_thread, step, phase)


def locate(rank: RankTrace, ts: np.ndarray, thread: np.ndarray,
           model_work: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Step and phase of CPU points (launch calls, collective ops); thread -1 = unknown;
    ``model_work``: which points launch the model's own work (not copies; default: all)."""
    step = _steps(rank, ts, thread)
    return step, _phases(rank, ts, thread, step, model_work)


def _link_launches(rank: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """Launch call of each GPU event through its correlation id."""
    corr = rank.gpu.correlation
    table = rank.launches.correlation
    ts = np.full(len(corr), -1, dtype=np.int64)
    thread = np.full(len(corr), -1, dtype=np.int32)
    if len(table) == 0 or len(corr) == 0:
        return ts, thread
    idx = np.clip(np.searchsorted(table, corr), 0, len(table) - 1)
    hit = (table[idx] == corr) & (corr >= 0)
    ts[hit] = rank.launches.ts[idx[hit]]
    thread[hit] = rank.launches.thread[idx[hit]]
    return ts, thread


@dataclass(frozen=True)
class StepSource:
    """Where a rank's steps come from: its ProfilerStep ranges; without them, but with GPU work,
    the repeats of one user annotation (each step from one's start to the next's: PARAM's
    ``measure|forward``, a loop's own ``record_function``), else the whole trace as step 0."""

    numbers: np.ndarray  # int64
    starts: np.ndarray  # int64 ns
    ends: np.ndarray  # int64 ns, inclusive
    threads: frozenset[int]  # the threads that run the steps (not autograd's)
    how: str  # "ProfilerStep" | "annotation" | "optimizer" | "whole trace"
    name: str | None = None  # the annotation's or the optimizer marker's

    @property
    def note(self) -> str | None:
        """How the steps were found, where they are not ProfilerSteps (said with the figures)."""
        if self.how == "annotation":
            return (f"no ProfilerStep#N markers: the {len(self.numbers)} repeats of the annotation {self.name!r} "
                    "are the steps (each from one's start to the next's)")
        if self.how == "optimizer":
            return (f"no ProfilerStep#N markers: the {len(self.numbers)} iterations between the {len(self.numbers) + 1} "
                    f"repeats of the optimizer's {self.name!r} are the steps (each from one's start to the next's)")
        if self.how == "whole trace":
            return "no ProfilerStep#N markers nor a repeating annotation: the whole trace is analysed as one step (0)"
        return None


def step_windows(rank: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numbers, starts, ends) of the steps (``step_source``), sorted by start."""
    source = step_source(rank)
    return source.numbers, source.starts, source.ends


def step_source(rank: RankTrace) -> StepSource:
    """The rank's steps: ProfilerStep ranges, else (GPU work without them) the repeats of one
    annotation that repeats at most once an iteration (as often as the optimizer, or once
    more), else the iterations between the optimizer's repeats, else the whole trace."""
    m = rank.markers
    rows = np.flatnonzero(m.kind == Marker.STEP)
    numbers = np.array([step_number(rank.strings[m.name[r]]) for r in rows], dtype=object)
    ok = np.array([n is not None for n in numbers], dtype=bool)
    rows = rows[ok] if len(rows) else rows
    numbers = np.array([n for n in numbers[ok]], dtype=np.int64) if len(rows) else np.empty(0, np.int64)
    starts, ends = m.ts[rows], m.end[rows]
    order = np.argsort(starts, kind="stable")
    threads = frozenset(arrays.unique(m.thread[m.kind == Marker.STEP]).tolist())
    if len(rows) or not len(rank.gpu):
        return StepSource(numbers[order], starts[order], ends[order], threads, "ProfilerStep")
    annotation, optimizer = _repeating_annotation(rank), _optimizer_iterations(rank)
    # An annotation repeating more often than the optimizer marks something inside the iteration
    # (a layer, a micro-batch): the optimizer's repeats are then the iterations.
    if optimizer is not None and (annotation is None or len(annotation.numbers) > len(optimizer.numbers) + 2):
        return optimizer
    return annotation or _whole_trace(rank)


def _repeating_annotation(rank: RankTrace) -> StepSource | None:
    """The user annotation (or forward range) that repeats, never overlapping itself on its
    thread, and launches the most GPU work inside its repeats (at least one launch a repeat on
    average): each repeat starts a step that lasts until the next one starts."""
    m = rank.markers
    launches = np.sort(rank.launches.ts)
    candidates = np.flatnonzero(np.isin(m.kind, (Marker.ANNOTATION, Marker.FORWARD)))
    best = None
    for name, thread, rows in _repeats(m, candidates):
        inside = int((np.searchsorted(launches, m.end[rows], side="right")
                      - np.searchsorted(launches, m.ts[rows], side="left")).sum())
        key = (inside, len(rows), -int(m.ts[rows][0]), rank.strings[name])
        if inside >= len(rows) and (best is None or key > best[0]):
            best = (key, name, thread, rows)
    if best is None:
        return None
    _, name, thread, rows = best
    starts = m.ts[rows]
    ends = np.append(starts[1:] - 1, _extent(rank)[1])
    return StepSource(np.arange(len(rows), dtype=np.int64), starts, ends, frozenset({thread}), "annotation",
                      rank.strings[name])


def _repeats(m, candidates: np.ndarray):
    """(name, thread, rows by start) of each marker name among ``candidates`` that repeats on a
    thread at least twice, never overlapping itself there."""
    for name in arrays.unique(m.name[candidates]).tolist():
        for thread in arrays.unique(m.thread[candidates][m.name[candidates] == name]).tolist():
            rows = candidates[(m.name[candidates] == name) & (m.thread[candidates] == thread)]
            rows = rows[np.argsort(m.ts[rows], kind="stable")]
            if len(rows) >= 2 and not (m.ts[rows][1:] < m.end[rows][:-1]).any():
                yield name, thread, rows


def _optimizer_iterations(rank: RankTrace) -> StepSource | None:
    """The iterations between the repeats of an optimizer marker (``Optimizer.step#...`` first,
    then ``Optimizer.zero_grad#...`` or another optimizer range), on one thread, never overlapping
    itself, with GPU work launched in between: n repeats give n - 1 iterations, each from one
    repeat's start to the next's (the work before the first and after the last is in no step)."""
    m = rank.markers
    launches = np.sort(rank.launches.ts)
    candidates = np.flatnonzero(m.kind == Marker.OPTIMIZER)
    best = None
    for name, thread, rows in _repeats(m, candidates):
        starts = m.ts[rows]
        inside = int((np.searchsorted(launches, starts[1:]) - np.searchsorted(launches, starts[:-1])).sum())
        key = (rank.strings[name].startswith("Optimizer.step#"), len(rows), -int(starts[0]), rank.strings[name])
        if inside >= len(rows) - 1 and (best is None or key > best[0]):
            best = (key, name, thread, starts)
    if best is None:
        return None
    _, name, thread, starts = best
    # Each window ends where the next begins (inclusive ends: a launch at that instant belongs to
    # the later window, the one starting at or before it last), so its length is the repeats' gap.
    return StepSource(np.arange(len(starts) - 1, dtype=np.int64), starts[:-1], starts[1:], frozenset({thread}),
                      "optimizer", rank.strings[name])


def _whole_trace(rank: RankTrace) -> StepSource:
    low, high = _extent(rank)
    # The steps' thread: the one that launched most of the GPU work.
    threads, counts = np.unique(rank.launches.thread, return_counts=True)
    main = frozenset({int(threads[np.argmax(counts)])}) if len(threads) else frozenset()
    return StepSource(np.zeros(1, np.int64), np.array([low], np.int64), np.array([high], np.int64), main,
                      "whole trace")


def _extent(rank: RankTrace) -> tuple[int, int]:
    """The first and last instant of the rank's GPU work, launches and CPU ranges (ns)."""
    lows = [a.min() for a in (rank.gpu.ts, rank.launches.ts, rank.markers.ts) if len(a)]
    highs = [a.max() for a in (rank.gpu.end, rank.launches.ts, rank.markers.end) if len(a)]
    return int(min(lows)), int(max(highs))


def steps_of_points(rank: RankTrace, ts: np.ndarray) -> np.ndarray:
    """The ProfilerStep number of CPU points (ns), NO_STEP outside every step."""
    return _steps(rank, ts, np.zeros(len(ts), dtype=np.int32))


def _steps(rank: RankTrace, launch_ts: np.ndarray, launch_thread: np.ndarray) -> np.ndarray:
    numbers, starts, ends = step_windows(rank)
    step = np.full(len(launch_ts), NO_STEP, dtype=np.int64)
    if len(numbers) == 0 or len(launch_ts) == 0:
        return step
    linked = launch_thread >= 0
    idx = np.searchsorted(starts, launch_ts, side="right") - 1
    inside = linked & (idx >= 0) & (launch_ts <= ends[np.maximum(idx, 0)])
    step[inside] = numbers[idx[inside]]
    return step


def _fill_unlinked_by_stream(gpu: GpuEvents, values: np.ndarray, linked: np.ndarray) -> None:
    """GPU work with no CPU link takes the value of the previous linked work on its stream
    (a stream runs in order, so that is the step/phase it was queued in)."""
    for stream in arrays.unique(gpu.stream[~linked]):
        rows = np.flatnonzero(gpu.stream == stream)  # gpu is sorted by start
        have = linked[rows]
        if not have.any():
            continue
        last = np.maximum.accumulate(np.where(have, np.arange(len(rows)), -1))
        fill = ~have & (last >= 0)
        values[rows[fill]] = values[rows[last[fill]]]


def _phases(rank: RankTrace, launch_ts: np.ndarray, launch_thread: np.ndarray,
            step: np.ndarray, model_work: np.ndarray | None = None) -> np.ndarray:
    phase = np.full(len(launch_ts), OTHER, dtype=np.int8)
    linked = launch_thread >= 0
    if not linked.any():
        return phase
    m = rank.markers
    decided = np.zeros(len(launch_ts), dtype=bool)
    step_threads = set(step_source(rank).threads)
    for marker, code in ((Marker.OPTIMIZER, OPTIMIZER), (Marker.BACKWARD, BACKWARD), (Marker.FORWARD, FORWARD)):
        inside = _inside_marker(m, marker, launch_ts, launch_thread) & ~decided
        phase[inside] = code
        decided |= inside
    # Autograd runs backward on its own thread (one per device): work launched there is backward.
    backward_threads = set(arrays.unique(m.thread[m.kind == Marker.BACKWARD]).tolist()) - step_threads
    if backward_threads:
        on_bwd = np.isin(launch_thread, list(backward_threads)) & linked & ~decided
        phase[on_bwd] = BACKWARD
        decided |= on_bwd
    _forward_before_backward(phase, decided, linked, launch_ts, step)
    if forward_only(rank):  # forward passes only (inference, a forward-only or compiled trace)
        phase[linked & ~decided & (step != NO_STEP) & (True if model_work is None else model_work)] = FORWARD
    return phase


def _forward_before_backward(phase, decided, linked, launch_ts, step) -> None:
    """Within a step, undecided work launched before the first backward launch is forward."""
    for number in arrays.unique(step[linked & (step != NO_STEP)]):
        in_step = linked & (step == number)
        bwd = in_step & (phase == BACKWARD)
        first_bwd = launch_ts[bwd].min() if bwd.any() else None
        if first_bwd is None:
            continue
        early = in_step & ~decided & (launch_ts < first_bwd)
        phase[early] = FORWARD


def _inside_marker(markers, kind: Marker, ts: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Is each (thread, ts) launch inside any marker of ``kind`` on the same thread?"""
    result = np.zeros(len(ts), dtype=bool)
    rows = markers.kind == kind
    for tid in arrays.unique(markers.thread[rows]):
        sel = rows & (markers.thread == tid)
        merged = iv.union(markers.ts[sel], markers.end[sel])
        query = np.flatnonzero(thread == tid)
        if len(query):
            q = ts[query]
            idx = np.searchsorted(merged[0], q, side="right") - 1
            ok = (idx >= 0) & (q <= merged[1][np.maximum(idx, 0)])
            result[query[ok]] = True
    return result


def innermost_marker(markers, kind: Marker, ts: np.ndarray, thread: np.ndarray, lookback: int = 4) -> np.ndarray:
    """Row of the innermost marker of ``kind`` on the launch's thread that contains it, or -1."""
    found = np.full(len(ts), -1, dtype=np.int64)
    rows_all = np.flatnonzero(markers.kind == kind)
    for tid in arrays.unique(markers.thread[rows_all]):
        rows = rows_all[markers.thread[rows_all] == tid]  # sorted by start
        query = np.flatnonzero(thread == tid)
        if not len(query):
            continue
        q = ts[query]
        idx = np.searchsorted(markers.ts[rows], q, side="right") - 1
        pending = np.ones(len(query), dtype=bool)
        for back in range(lookback):  # nested same-kind ranges are rare and shallow
            cand = idx - back
            valid = pending & (cand >= 0)
            safe = rows[np.maximum(cand, 0)]
            hit = valid & (markers.end[safe] >= q)
            found[query[hit]] = safe[hit]
            pending &= ~hit
            if not pending.any():
                break
    return found
