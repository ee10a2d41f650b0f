"""The timeline section's data: one representative step of a few ranks, lane by lane, downsampled.

Only this section needs per-kernel data. The step and the ranks are planned from per-rank step
summaries (``plan_timeline``); ``report_timeline`` then takes only those ranks' kernels of that
step (from the kernels the map kept, ``RankAnalysis.kernels``; else re-reading the files: in
parallel and cached with the reader analyzer.api passes) and ``draw_timeline`` turns them into
plain JSON-able data, kept in ``Result.timeline``, that ``reports/html.py`` draws.
``timeline_data`` does both when the analyses already kept timelines.

Downsampling is deterministic: a kernel narrower than ``merge_px`` pixels at the page's width is
merged with the other narrow kernels of the same lane and pixel column into one mark (count, total
kernel time and the longest kernel's name are kept); ``merge_px`` doubles until each lane has at
most ``max_marks_per_lane`` marks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import mean
from typing import Any, Callable, Sequence

import numpy as np

from analyzer.base import intervals as iv
from analyzer.base.errors import TracecliffError
from analyzer.rank.analysis import RankOptions, kernels_timeline, step_timeline_file
from analyzer.job.typical import median_step
from analyzer.job.result import straggler_ranks, unavailable

PLOT_WIDTH_PX = 1000
MAX_MARKS_PER_LANE = 800
MAX_LANES_PER_RANK = 6
MAX_RANKS = 3
COMPUTE, COMM, MEMORY, SYNC = range(4)
LANE_KIND = {COMPUTE: "compute", COMM: "NCCL", MEMORY: "memory", SYNC: "sync"}
LANE_ORDER = {"compute": 0, "NCCL": 1, "memory": 2, "sync": 3}


@dataclass(frozen=True)
class TimelinePlan:
    """Which step and which ranks the timeline shows, chosen from per-rank step summaries only, so
    the kernels of just those ranks and that step need to be loaded."""

    step: int | None
    note: str
    ranks: tuple[tuple[int, str], ...]  # (rank, role), the straggler (or slowest) first
    step_time_us: dict[int, float]
    steps_available: tuple[int, ...]


def timeline_data(ranks: Sequence[Any], doc: dict[str, Any], step: int | None = None) -> dict[str, Any]:
    """The representative step (median step time, or ``step``) of up to three ranks, from rank
    analyses that kept their timelines."""
    ranks = [r for r in ranks if r.timeline and len(r.timeline.get("start_us", ())) > 0]
    summaries = [{"rank": r.rank, "steps": r.steps, "span_us": r.metrics.get("span_us")} for r in ranks]
    plan = plan_timeline(summaries, doc, step)
    if plan is None:
        return unavailable("the traces hold no GPU kernels (CPU-only profile?)")
    return draw_timeline({r.rank: r for r in ranks}, plan)


def plan_timeline(summaries: Sequence[dict[str, Any]], doc: dict[str, Any],
                  step: int | None = None) -> TimelinePlan | None:
    """summaries: {rank, steps, span_us} of the ranks with GPU activity (None when there are none)."""
    if not summaries:
        return None
    chosen, note = _choose_step(summaries, step, doc.get("attribution") or {})
    step_time = {s["rank"]: _step_time(s, chosen) for s in summaries}
    picked = _choose_ranks(step_time, straggler_ranks(doc))
    steps = sorted({st["step"] for s in summaries for st in s.get("steps") or []})
    return TimelinePlan(chosen, note, tuple(picked), step_time, tuple(steps))


def draw_timeline(analyses: dict[int, Any], plan: TimelinePlan) -> dict[str, Any]:
    """Lanes, exposed communication and phases of the planned ranks (analyses: rank -> an analysis
    with ``timeline``, possibly holding only the planned step)."""
    events = {rank: _step_events(analyses[rank], plan.step) for rank, _ in plan.ranks}
    starts = [e["start"].min() for e in events.values() if len(e["start"])]
    ends = [(e["start"] + e["dur"]).max() for e in events.values() if len(e["start"])]
    if not starts:
        return unavailable(f"no GPU kernels in step {plan.step} on the chosen ranks")
    t0, t1 = float(min(starts)), float(max(ends))
    span = max(t1 - t0, 1e-3)
    names: dict[str, int] = {}
    rows = [_rank_rows(analyses[rank], rank, role, events[rank], t0, span, names, plan.step_time_us[rank])
            for rank, role in plan.ranks]
    return {
        "available": True, "step": plan.step, "note": plan.note, "t0_us": round(t0, 3), "span_us": round(span, 3),
        "ranks": rows, "names": list(names), "plot_width_px": PLOT_WIDTH_PX,
        "steps_available": list(plan.steps_available),
    }


def _choose_step(summaries: Sequence[dict[str, Any]], step: int | None,
                 typical: dict[str, Any]) -> tuple[int | None, str]:
    """The typical step (the one every figure of the report quotes) unless ``step`` asks for
    another, which is then labelled with its role (warm-up, drain, outlier)."""
    times: dict[int, list[float]] = {}
    for summary in summaries:
        for s in summary.get("steps") or []:
            if isinstance(s.get("step_time_us"), (int, float)):
                times.setdefault(s["step"], []).append(s["step_time_us"])
    if not times:
        return None, "no ProfilerStep markers: the whole trace is shown"
    default, why = typical.get("step"), "the typical step, the one the report's figures quote"
    if default not in times:  # no step breakdown: the median step (analyzer.job.typical), said as such
        default = median_step({n: mean(times[n]) for n in times})
        why = f"median step by step time (mean over ranks) of {len(times)} step(s); no typical step was chosen"
    if step is None:
        return default, why
    if step in times:
        return step, "chosen with --step" + _role_note(step, typical)
    return default, f"step {step} is not in the traces (steps {_ranges(sorted(times))}): showing step {default}, {why}"


def _role_note(step: int, typical: dict[str, Any]) -> str:
    """What a step shown on request is, when it is not the typical one."""
    if step == typical.get("step"):
        return ""
    excluded = next((e for e in typical.get("excluded_steps") or [] if e.get("step") == step), None)
    if excluded:
        return f"; not the typical step {typical.get('step')}: {excluded.get('reason')}"
    if typical.get("step") is not None:
        return f"; a steady step, not the typical step {typical.get('step')}"
    return ""


def _ranges(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers[:12]) + (" …" if len(numbers) > 12 else "")


def _step_time(summary: dict[str, Any], step: int | None) -> float:
    for s in summary.get("steps") or []:
        if s["step"] == step:
            return float(s.get("step_time_us") or s.get("span_us") or 0.0)
    return float(summary.get("span_us") or 0.0)


def _choose_ranks(step_time: dict[int, float], stragglers: dict[int, str]) -> list[tuple[int, str]]:
    order = sorted(step_time, key=lambda k: (step_time[k], k))
    picked: list[tuple[int, str]] = []
    straggler = next((k for k in stragglers if k in step_time), None)
    if straggler is not None:
        picked.append((straggler, "straggler"))
    elif len(order) > 1:
        picked.append((order[-1], "slowest"))
    rest = [k for k in order if k not in {p for p, _ in picked}]
    if rest:
        picked.append((rest[(len(rest) - 1) // 2], "median"))
    rest = [k for k in order if k not in {p for p, _ in picked}]
    if rest and len(picked) < MAX_RANKS:
        picked.append((rest[0], "fastest"))
    return picked


def _step_events(r: Any, step: int | None) -> dict[str, np.ndarray]:
    tl = r.timeline
    cols = {key: np.asarray(tl[key]) for key in ("start_us", "dur_us", "stream", "kind", "name", "step", "phase")}
    mask = np.ones(len(cols["start_us"]), dtype=bool) if step is None else cols["step"] == step
    order = np.argsort(cols["start_us"][mask], kind="stable")
    pick = lambda key: cols[key][mask][order]  # noqa: E731 - local shorthand
    return {"start": pick("start_us").astype(float), "dur": pick("dur_us").astype(float),
            "stream": pick("stream"), "kind": pick("kind").astype(int), "name": pick("name"),
            "phase": pick("phase").astype(int)}


def _rank_rows(r, rank, role, ev, t0, span, names, step_time_us) -> dict[str, Any]:
    strings, phase_names = r.timeline["strings"], r.timeline.get("phases") or []
    lanes, dropped = _lanes(ev, t0, span, strings, names)
    return {
        "rank": rank, "host": r.host, "role": role, "step_time_us": round(step_time_us, 3),
        "lanes": lanes, "lanes_dropped": dropped, "exposed": _exposed(ev, t0, span),
        "phases": _phase_extents(ev, t0, phase_names), "kernels": int(len(ev["start"])),
    }


def _lanes(ev, t0, span, strings, names) -> tuple[list[dict[str, Any]], int]:
    lanes = []
    for stream in np.unique(ev["stream"]):
        on = ev["stream"] == stream
        kinds = ev["kind"][on]
        kind = COMM if (kinds == COMM).any() else COMPUTE if (kinds == COMPUTE).any() else int(kinds.min())
        lanes.append((LANE_ORDER[LANE_KIND.get(kind, "sync")], -int(on.sum()), int(stream), kind, on))
    lanes.sort(key=lambda lane: lane[:3])
    out = []
    for _, _, stream, kind, on in lanes[:MAX_LANES_PER_RANK]:
        marks, merge_px = _downsample(ev["start"][on] - t0, ev["dur"][on], ev["kind"][on], ev["name"][on], span)
        for mark in marks:
            mark["n"] = names.setdefault(str(strings[mark["n"]]), len(names))
        out.append({"stream": stream, "kind": LANE_KIND.get(kind, "other"), "kernels": int(on.sum()),
                    "marks": marks, "merge_px": merge_px})
    return out, max(len(lanes) - MAX_LANES_PER_RANK, 0)


def _downsample(start, dur, kind, name, span) -> tuple[list[dict[str, Any]], float]:
    """Narrow kernels merged per pixel column (deterministic); wide ones kept as they are."""
    merge_px = 1.0
    while True:
        column_us = span * merge_px / PLOT_WIDTH_PX
        narrow = dur < column_us
        # A wide kernel is its own group; narrow ones group by pixel column.
        column = np.floor(start / column_us).astype(np.int64)
        group_key = np.where(narrow, column, -1 - np.arange(len(start)))
        change = np.r_[True, group_key[1:] != group_key[:-1]] if len(start) else np.zeros(0, bool)
        if change.sum() <= MAX_MARKS_PER_LANE:
            break
        merge_px *= 2
    return _marks(start, dur, kind, name, np.cumsum(change) - 1), merge_px


def _marks(start, dur, kind, name, group) -> list[dict[str, Any]]:
    if len(start) == 0:
        return []
    firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    end = start + dur
    lo = np.minimum.reduceat(start, firsts)
    hi = np.maximum.reduceat(end, firsts)
    total = np.add.reduceat(dur, firsts)
    count = np.diff(np.r_[firsts, len(start)])
    # Groups are contiguous, so sorting by (group, -dur) puts each group's longest kernel first.
    longest = np.lexsort((-dur, group))[firsts]
    return [{"s": round(float(a), 3), "e": round(float(b), 3), "d": round(float(t), 3), "c": int(c),
             "k": int(kind[i]), "n": int(name[i])}
            for a, b, t, c, i in zip(lo, hi, total, count, longest)]


def _exposed(ev, t0, span) -> list[list[float]]:
    """Communication not under any compute kernel of the rank, merged across sub-pixel gaps."""
    to_ns = lambda x: np.round(x * 1000.0).astype(np.int64)  # noqa: E731
    start, end = to_ns(ev["start"] - t0), to_ns(ev["start"] + ev["dur"] - t0)
    compute = iv.union(start[ev["kind"] == COMPUTE], end[ev["kind"] == COMPUTE])
    comm = iv.union(start[ev["kind"] == COMM], end[ev["kind"] == COMM])
    exposed_starts, exposed_ends = iv.subtract(comm, compute)
    gap_ns = int(span * 1000.0 / PLOT_WIDTH_PX)
    merged_starts, merged_ends = iv.union(exposed_starts, exposed_ends + gap_ns)
    # Each merged end carries one extra gap; taking the max of the real ends inside removes it.
    last = np.searchsorted(exposed_starts, merged_ends, side="left") - 1
    real_ends = exposed_ends[last] if len(last) else merged_ends
    return [[round(s / 1000.0, 3), round(e / 1000.0, 3)] for s, e in zip(merged_starts.tolist(), real_ends.tolist())]


def _phase_extents(ev, t0, phase_names) -> list[dict[str, Any]]:
    out = []
    for code, name in enumerate(phase_names):
        if name == "other":
            continue
        on = ev["phase"] == code
        if on.any():
            out.append({"phase": name, "s": round(float(ev["start"][on].min() - t0), 3),
                        "e": round(float((ev["start"][on] + ev["dur"][on]).max() - t0), 3)})
    return out


# Reads the step timelines of trace files: (paths, options with the step, time origin) -> one
# ``step_timeline_file`` dict per path. analyzer.api passes the parallel, cached one of
# analyzer.run.executors; the default reads one file after the other in this process.
TimelineReader = Callable[[list[str], RankOptions, int], list[dict[str, Any]]]
# Keeps the step timelines drawn from the map's kernels (paths, options, origin, timelines) where
# a later run finds them as the reader's (analyzer.api: its cache), since that run's cached
# summaries hold no kernels.
TimelineStore = Callable[[list[str], RankOptions, int, list[dict[str, Any]]], None]


def read_one_by_one(paths: list[str], options: RankOptions, origin_ns: int) -> list[dict[str, Any]]:
    return [step_timeline_file(path, options, origin_ns) for path in paths]


@dataclass(frozen=True)
class _Shown:
    """What ``draw_timeline`` reads of a rank it shows (as of a RankAnalysis with a timeline)."""
    host: str | None
    timeline: dict[str, Any]


def report_timeline(doc: dict[str, Any], result: Any, step: int | None, rank_options: RankOptions,
                    read: TimelineReader = read_one_by_one, store: TimelineStore | None = None) -> dict[str, Any]:
    """The timeline section. Kernel lists of every rank would cost memory in proportion to the
    job; the step and ranks are chosen from the per-rank summaries instead, and that step's
    kernels of those ranks are taken from the kernels the map kept (``RankAnalysis.kernels``),
    else read again (unless the Result already kept timelines)."""
    if any(r.timeline for r in result.ranks):
        return timeline_data(result.ranks, doc, step)
    summaries = [{"rank": r["rank"], "steps": r.get("steps") or [], "span_us": r.get("span_us")}
                 for r in doc.get("ranks") or [] if r.get("gpu_event_count")]
    plan = plan_timeline(summaries, doc, step)
    if plan is None:
        return unavailable("the traces hold no GPU kernels (CPU-only profile?)")
    paths = {int(i["rank"]): str(i["path"]) for i in doc.get("inputs") or []}
    missing = [rank for rank, _ in plan.ranks if rank not in paths]
    if missing:
        return unavailable(f"no input file for rank(s) {missing}")
    options = replace(rank_options, keep_timeline=True, steps=None if plan.step is None else (plan.step,))
    origin = int((doc.get("job") or {}).get("time_origin_ns") or 0)
    shown = [rank for rank, _ in plan.ranks]
    timelines = _from_kept_kernels(result.ranks, shown, options.steps, origin,
                                   filtered=rank_options.steps is not None)
    if store and timelines:
        store([paths[rank] for rank in timelines], options, origin, list(timelines.values()))
    again = [rank for rank in shown if rank not in timelines]
    try:
        timelines.update(zip(again, read([paths[rank] for rank in again], options, origin) if again else []))
    except TracecliffError as exc:  # the file changed since it was read: the rest of the page stands
        return unavailable(f"could not read the kernels again: {exc}")
    hosts = {r.rank: r.host for r in result.ranks}
    return draw_timeline({rank: _Shown(hosts.get(rank), timelines[rank]) for rank in shown}, plan)


def _from_kept_kernels(ranks: Sequence[Any], shown: list[int], steps: tuple[int, ...] | None, origin: int,
                       filtered: bool) -> dict[int, dict[str, Any]]:
    """rank -> its step timeline, of the shown ranks whose kernels the map kept: what
    ``step_timeline_file`` reads from the trace, from the same kernels. ``filtered``: the map kept
    only some steps (--steps), so all of the trace (``steps`` None) is not among its kernels."""
    if filtered and steps is None:
        return {}
    kept = {r.rank: r.kernels for r in ranks if getattr(r, "kernels", None) is not None}
    return {rank: kernels_timeline(kept[rank], steps, origin) for rank in shown if rank in kept}
