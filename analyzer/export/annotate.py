"""Annotated traces: each rank's trace rewritten with extra tracks that Perfetto UI and
chrome://tracing show above the original rows:

- ``exposed communication``: the intervals where communication runs with no compute under it,
  named after the collective in flight;
- ``steps`` and ``phases``: each ProfilerStep's GPU window and, per step, the forward / backward
  / optimizer / other windows (first to last GPU activity the phase launched);
- ``findings``: each finding's time windows on that rank (``evidence["time_windows"]`` entries
  ``{start_us, end_us | dur_us, rank?}`` when the rule gives them, else the GPU windows of the
  finding's steps).

The tracks are complete ('X') events on a new process id with ``process_name`` /
``thread_name`` metadata; overlapping windows go to extra rows of the same track. The original
events and every other key are written back unchanged. Times: the analysis keeps µs relative to
``job.time_origin_ns`` (ns, each rank on its own clock); they are turned back into the trace's
own µs clock through integer nanoseconds, so a boundary lands on the kernel edge it came from.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analyzer.base import intervals as iv
from analyzer.base.errors import InputError
from analyzer.ingest.trace import GpuKind

CATEGORY = "tracecliff"
PROCESS_NAME = "tracecliff annotations"
TRACKS = ("exposed communication", "findings", "steps", "phases")
LANE_STRIDE = 100  # tid = 1 + track index × LANE_STRIDE + lane


# ---------------------------------------------------------------- clock


def to_trace_ns(rel_us: np.ndarray | list[float], origin_ns: int) -> np.ndarray:
    """µs relative to the job's time origin (3 decimals: whole ns) -> the trace's int64 ns."""
    return np.rint(np.asarray(rel_us, dtype=np.float64) * 1000.0).astype(np.int64) + np.int64(origin_ns)


def ns_to_trace_us(ns: int) -> float:
    """Kineto writes µs with 3 decimals; the reader turns them back into the same ns."""
    whole, frac = divmod(int(ns), 1000)
    return whole + frac / 1000.0


# ---------------------------------------------------------------- tracks


def exposed_windows(timeline: dict[str, Any], origin_ns: int) -> list[dict[str, Any]]:
    """Communication not under compute, as disjoint windows named after the collective."""
    from analyzer.rank.comms import collective_from_kernel_name
    start = to_trace_ns(timeline["start_us"], origin_ns)
    end = start + np.rint(np.asarray(timeline["dur_us"], dtype=np.float64) * 1000.0).astype(np.int64)
    kind = np.asarray(timeline["kind"], dtype=np.int8)
    comm, compute = kind == GpuKind.COMM, kind == GpuKind.COMPUTE
    exposed = iv.subtract(iv.union(start[comm], end[comm]), iv.union(start[compute], end[compute]))
    if len(exposed[0]) == 0:
        return []
    # The comm kernel in flight at each window's start: of those started by then, the one
    # reaching furthest (a running arg-max over end times sorted by start).
    rows = np.flatnonzero(comm)
    rows = rows[np.argsort(start[rows], kind="stable")]
    ends = end[rows]
    running = np.maximum.accumulate(ends)
    reach = np.maximum.accumulate(np.where(ends == running, np.arange(len(rows)), 0))
    at = np.searchsorted(start[rows], exposed[0], side="right") - 1
    names, steps, phases = timeline["strings"], timeline["step"], timeline["phases"]
    windows = []
    for s, e, k in zip(exposed[0].tolist(), exposed[1].tolist(), at.tolist()):
        row = int(rows[reach[k]])
        kernel = names[timeline["name"][row]]
        collective = collective_from_kernel_name(kernel) or "communication"
        windows.append({"name": f"exposed {collective}", "start_ns": s, "end_ns": e,
                        "args": {"collective": collective, "kernel": kernel, "exposed_us": (e - s) / 1000.0,
                                 "step": steps[row] if steps[row] >= 0 else None,
                                 "phase": phases[timeline["phase"][row]]}})
    return windows


def step_and_phase_windows(timeline: dict[str, Any], origin_ns: int,
                           steps_info: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """GPU window of each step, and of each (step, phase) inside it."""
    start = to_trace_ns(timeline["start_us"], origin_ns)
    end = start + np.rint(np.asarray(timeline["dur_us"], dtype=np.float64) * 1000.0).astype(np.int64)
    step = np.asarray(timeline["step"], dtype=np.int64)
    phase = np.asarray(timeline["phase"], dtype=np.int64)
    info = {s["step"]: s for s in steps_info}
    step_rows, phase_rows = [], []
    for number in np.unique(step[step >= 0]).tolist():
        mask = step == number
        facts = info.get(number, {})
        step_rows.append({"name": f"ProfilerStep#{number}", "start_ns": int(start[mask].min()),
                          "end_ns": int(end[mask].max()), "step": number,
                          "args": {k: facts.get(k) for k in ("step_time_us", "compute_us", "exposed_comm_us",
                                                             "idle_us", "overlap_pct") if k in facts}})
        for code, name in enumerate(timeline["phases"]):
            inner = mask & (phase == code)
            if inner.any():
                phase_rows.append({"name": name, "start_ns": int(start[inner].min()), "end_ns": int(end[inner].max()),
                                   "args": {"step": number, "phase": name,
                                            "exposed_comm_us": (facts.get("phases") or {}).get(name)}})
    return step_rows, phase_rows


def finding_windows(findings: list[dict[str, Any]], rank: int, origin_ns: int,
                    step_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step = {row["step"]: row for row in step_rows}
    windows = []
    for finding in findings:
        ranks = finding.get("ranks") or []
        if ranks and rank not in ranks:
            continue
        label = f"[{finding.get('severity')}] {finding.get('rule')}: {finding.get('title') or ''}".rstrip(": ")
        args = {k: finding.get(k) for k in ("rule", "severity", "summary", "estimated_gain_us")}
        explicit = _explicit_windows(finding, rank, origin_ns)
        if explicit:
            windows += [{"name": label, "start_ns": s, "end_ns": e, "args": args} for s, e in explicit]
            continue
        chosen = [by_step[s] for s in finding.get("steps") or [] if s in by_step] or \
            (step_rows if not finding.get("steps") else [])
        windows += [{"name": label, "start_ns": w["start_ns"], "end_ns": w["end_ns"], "args": args} for w in chosen]
    return windows


def _explicit_windows(finding: dict[str, Any], rank: int, origin_ns: int) -> list[tuple[int, int]]:
    found = []
    for w in (finding.get("evidence") or {}).get("time_windows") or []:
        if not isinstance(w, dict) or not isinstance(w.get("start_us"), (int, float)):
            continue
        if w.get("rank") is not None and w["rank"] != rank:
            continue
        end_us = w.get("end_us")
        if not isinstance(end_us, (int, float)):
            end_us = w["start_us"] + (w.get("dur_us") or 0.0)
        start, end = to_trace_ns([w["start_us"], end_us], origin_ns).tolist()
        if end > start:
            found.append((start, end))
    return found


def assign_lanes(windows: list[dict[str, Any]]) -> list[int]:
    """Greedy interval partitioning: the first row whose last window ended by this start, so
    no row holds overlapping slices (viewers nest or hide those)."""
    order = sorted(range(len(windows)), key=lambda i: (windows[i]["start_ns"], windows[i]["end_ns"]))
    lane_end: list[int] = []
    lanes = [0] * len(windows)
    for i in order:
        w = windows[i]
        lane = next((k for k, last in enumerate(lane_end) if last <= w["start_ns"]), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(w["end_ns"])
        lane_end[lane] = w["end_ns"]
        lanes[i] = lane
    return lanes


def track_events(tracks: dict[str, list[dict[str, Any]]], pid: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": PROCESS_NAME}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
    ]
    for index, track in enumerate(TRACKS):
        windows = tracks.get(track, [])
        lanes = assign_lanes(windows)
        for lane in range(max(lanes, default=-1) + 1):
            tid = 1 + index * LANE_STRIDE + lane
            title = track if lane == 0 else f"{track} ({lane + 1})"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": title}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for w, lane in sorted(zip(windows, lanes), key=lambda p: (p[0]["start_ns"], p[1])):
            events.append({"ph": "X", "cat": CATEGORY, "name": w["name"], "pid": pid,
                           "tid": 1 + index * LANE_STRIDE + lane, "ts": ns_to_trace_us(w["start_ns"]),
                           "dur": (w["end_ns"] - w["start_ns"]) / 1000.0,
                           "args": {k: v for k, v in w["args"].items() if v is not None}})
    return events


# ---------------------------------------------------------------- files


def output_paths(files: list[Path], outdir: Path) -> dict[Path, Path]:
    """Where each input's annotated copy goes; refuses to write over any input."""
    target = outdir.resolve()
    names: dict[str, Path] = {}
    for f in files:
        if f.name in names:
            raise InputError(f, f"file name also used by {names[f.name]}: both would be written to "
                                f"{outdir / f.name}; annotate them separately")
        names[f.name] = f
        if f.resolve().parent == target:
            raise InputError(f, f"-o {outdir} is this input's own directory: refusing to write over "
                                "the input (choose another OUTDIR)")
    return {f: outdir / f.name for f in files}


class _PidOnly(msgspec.Struct, gc=False):
    pid: Any = None


def annotated_trace(path: Path, tracks: dict[str, list[dict[str, Any]]]) -> bytes:
    """The file's bytes with the track events appended to its event list: every original event
    and every other top-level value is copied byte for byte (msgspec.Raw), never re-encoded.
    gzip in, gzip out (decided by content, as the reader does)."""
    from analyzer.ingest.files import GZIP_MAGIC, read_trace_bytes
    with open(path, "rb") as handle:
        gz = handle.read(2) == GZIP_MAGIC
    data = read_trace_bytes(path)
    try:
        out = _spliced(data, tracks)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # ingest accepted it: unlikely
        raise InputError(path, f"cannot rewrite this trace: {exc}") from None
    return gzip.compress(out, compresslevel=6, mtime=0) if gz else out


def _spliced(data: bytes, tracks: dict[str, list[dict[str, Any]]]) -> bytes:
    if data.lstrip()[:1] == b"[":  # a bare event array (the Trace Event Format allows it)
        return _append(msgspec.json.decode(data, type=msgspec.Raw), tracks)
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    if "traceEvents" not in top:
        raise msgspec.ValidationError("no traceEvents")
    top["traceEvents"] = msgspec.Raw(_append(top["traceEvents"], tracks))
    return msgspec.json.encode(top)


def _append(events: msgspec.Raw, tracks: dict[str, list[dict[str, Any]]]) -> bytes:
    raw = bytes(events)
    pids = [e.pid for e in msgspec.json.decode(raw, type=list[_PidOnly])]
    pid = max((p for p in pids if isinstance(p, int) and not isinstance(p, bool)), default=0) + 1
    added = msgspec.json.encode(track_events(tracks, pid))[1:-1]
    body = raw[:raw.rindex(b"]")]
    if not added:
        return raw
    return body + (b"," if body[1:].strip() else b"") + added + b"]"


def write_annotated(result: Any, files: list[Path], targets: dict[Path, Path], outdir: Path) -> list[dict[str, Any]]:
    """Write one annotated copy of each rank's trace (``targets``: input -> output path, from
    ``output_paths``); the Result must have kept its ranks' timelines. Returns what was written."""
    from analyzer.base.output import write_atomic
    origin = int(result.job.get("time_origin_ns") or 0)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(outdir, f"cannot create the output directory: {exc.strerror or exc}") from None
    by_path = {Path(f).resolve(): t for f, t in targets.items()}
    written = []
    for rank in result.ranks:
        tracks = rank_tracks(rank, result.findings, origin)
        target = by_path[Path(rank.path).resolve()]
        write_atomic(target, annotated_trace(Path(rank.path), tracks), [str(f) for f in files])
        written.append({"rank": rank.rank, "input": rank.path, "output": str(target),
                        "windows": {k: len(v) for k, v in tracks.items()}})
    return written


def rank_tracks(rank, findings: list[dict[str, Any]], origin_ns: int) -> dict[str, list[dict[str, Any]]]:
    timeline = rank.timeline or {}
    if not timeline.get("start_us"):
        return {track: [] for track in TRACKS}
    steps, phases = step_and_phase_windows(timeline, origin_ns, rank.steps)
    return {"exposed communication": exposed_windows(timeline, origin_ns),
            "findings": finding_windows(findings, rank.rank, origin_ns, steps),
            "steps": steps, "phases": phases}
