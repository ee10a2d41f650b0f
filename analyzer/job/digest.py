"""What the views quote from the collective rows, worked out once per Result from its columns
(``CollectiveColumns``): the text view's top collectives and host-side ops, the HTML report's
tables and α-β scatter per process group, what each group's bus bandwidth is made of
(analyzer.job.busbw: the job model's, the groups section's, the gate's) and the diff's totals
per (group, collective) over the steady steps.

A saved result of a large job keeps only its most exposed collectives in the JSON (all rows go
to the rows file, analyzer.job.rows_file); it carries this digest instead, so that every view
of it gives the figures of the fresh run without the rows. Every view reads the digest, saved
or computed from the rows in memory: one computation for both. It is plain JSON data, and made
so at once (encoded and decoded), so a fresh run reads exactly what a saved one reads back.

Each figure is the one the row-by-row code gave (tests/test_digest.py compares them): sums
left to right in row order as Python's ``sum`` adds them, medians as ``statistics.median``
and ``np.median`` take them, sorts stable with the same keys.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import msgspec
import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.base.memo import memo
from analyzer.base.numbers import sourced_figure
from analyzer.base.rowtable import RowTable
from analyzer.job.busbw import group_sums
from analyzer.job.columns import CollectiveColumns, categorical, group_label, table_categorical
from analyzer.job.commfit import BOUNDS, hops
from analyzer.model import formulas as models

# The HTML report's collective tables: size buckets by these edges (bytes), and at most this
# many points in each group's α-β scatter (the groups share the total).
SIZE_EDGES = (10e3, 100e3, 1e6, 10e6, 100e6)
MAX_SCATTER_POINTS, MIN_SCATTER_POINTS, SCATTER_POINTS_TOTAL = 600, 60, 3000
# The α-β line of a group's fit through its scatter: this many sizes, evenly in log, across the x axis.
LINE_SIZES = 61
BUSBW_KINDS = frozenset(models.COLLECTIVE_KINDS)
POINT_TO_POINT = ("send", "recv", "sendrecv")
# The text view's "top collectives by exposed time" and "longest host-side collectives".
TOP_ROWS = 5
UNKNOWN_GROUP = "(unknown group)"  # the diff's label of a row without a group label


def collective_digest(result: Any) -> dict[str, Any]:
    """The Result's digest: the saved one, else computed from its rows on first use and kept
    with the Result (analyzer.base.memo)."""
    saved = getattr(result, "collective_digest", None)
    if saved is not None:
        return saved
    return memo(result, "collective_digest", lambda: plain(compute(result)))


def plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists, NaN and ±inf as None, numpy
    scalars as numbers): what the fresh run's views read is what a saved result gives."""
    return msgspec.json.decode(_ENCODER.encode(value))


def _scalar(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()  # a numpy scalar
    raise TypeError(f"cannot encode {type(value).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_scalar, order="sorted")  # as the JSON is written


def compute(result: Any) -> dict[str, Any]:
    view = CollectiveColumns.of(result)
    rows = result.collectives
    model = result.model
    typical = model.typical
    return {"groups": html_groups(view), "top_exposed": top_exposed(view, rows),
            "host_side": host_side(view, rows), "labels": group_labels(view),
            "busbw": group_sums(view, group_label, typical.step if typical else None,
                                typical.steady_steps if typical else ()),
            "totals": window_totals(view, model.steady_windows(), [r.rank for r in model.ranks])}


# ---------------------------------------------------------------- helpers over the columns
def _finite(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(values)


def _or_zero(values: np.ndarray) -> np.ndarray:
    """``value or 0`` of a nullable column (None is NaN)."""
    return np.where(np.isnan(values), 0.0, values)


def _segments(segment: np.ndarray, count: int) -> list[np.ndarray]:
    """The rows of each segment (0..count-1), each in row order."""
    order = np.argsort(segment, kind="stable")
    bounds = np.searchsorted(segment[order], np.arange(count + 1))
    return [order[bounds[k]:bounds[k + 1]] for k in range(count)]


def ordered_sum(values: np.ndarray, start: float | int = 0) -> float | int:
    """``sum(values, start)`` as Python adds floats: left to right (numpy's ``sum`` adds
    pairwise; ``cumsum`` adds in order)."""
    if not len(values):
        return start
    return float(np.cumsum(np.r_[float(start), values])[-1])


def _median(values: np.ndarray) -> float:
    """``statistics.median`` of floats."""
    data = np.sort(values)
    n, mid = len(data), len(data) // 2
    return float(data[mid]) if n % 2 else (float(data[mid - 1]) + float(data[mid])) / 2


def _bound_names(view: CollectiveColumns) -> tuple[np.ndarray, list[Any]]:
    """(code per row, value by code) of the rows' ``bound``: the fits' codes, else the rows'."""
    codes = view.extra.get("bound")
    if codes is not None:
        return codes, list(BOUNDS)
    found = table_categorical(view.rows, "bound")
    return found.codes, found.names


# ---------------------------------------------------------------- the HTML report's tables
def _html_name(group: Any) -> str:
    name = group.get("name") if isinstance(group, dict) else None
    return str(name if name is not None else "unknown")


def _natural(name: str) -> tuple[int, Any]:
    return (0, int(name)) if name.isdigit() else (1, name)


def html_groups(view: CollectiveColumns) -> list[dict[str, Any]]:
    """Per process-group name (natural order): the first row's group, the row count, whether
    any ran on the GPU, one line per (kind, size bucket) and the α-β scatter's points."""
    if not view.n:
        return []
    names = [_html_name(g) for g in view.group.names]
    by_name = categorical(names, len(names))
    name_of_row = by_name.codes[view.group.codes]
    members = _segments(name_of_row, len(by_name.names))
    budget = max(MIN_SCATTER_POINTS, min(MAX_SCATTER_POINTS, SCATTER_POINTS_TOTAL // len(by_name.names)))
    line_kinds = categorical([str(k or "unknown") for k in view.kind.names], len(view.kind.names))
    kind_of_row = line_kinds.codes[view.kind.codes]
    size = view.size
    with np.errstate(invalid="ignore"):
        bucket = np.where(np.isnan(size), len(SIZE_EDGES) + 1, np.searchsorted(SIZE_EDGES, size, side="right"))
    cell = kind_of_row * (len(SIZE_EDGES) + 2) + bucket
    wait = view.written("wait_us")
    busbw = view.written("busbw_gbps")
    exposed = _or_zero(view.written("exposed_us"))
    bound_codes, bound_names = _bound_names(view)
    geometry = _scatter_geometry(view, wait)
    out = []
    width = len(SIZE_EDGES) + 2
    for code in sorted(range(len(by_name.names)), key=lambda c: _natural(by_name.names[c])):
        index = members[code]
        cells = np.flatnonzero(np.bincount(cell[index], minlength=len(line_kinds.names) * width))
        keys = sorted((line_kinds.names[c // width], c % width, c) for c in cells.tolist())
        line_of = _segments(cell[index], len(line_kinds.names) * width)
        lines = []
        for kind, b, c in keys:
            rows = index[line_of[c]]
            waits = wait[rows][_finite(wait[rows])]
            speeds = busbw[rows][_finite(busbw[rows])]
            present = np.flatnonzero(np.bincount(bound_codes[rows], minlength=len(bound_names))).tolist()
            bounds = sorted({str(bound_names[k]) for k in present if bound_names[k]})
            lines.append([kind, int(b), len(rows), ordered_sum(view.dur[rows]), ordered_sum(exposed[rows]),
                          ordered_sum(waits) if len(waits) else None, bounds,
                          _median(speeds) if len(speeds) else None])
        out.append({"name": by_name.names[code], "group": _first_dict_group(view, index) or {}, "count": len(index),
                    "on_gpu": bool(view.on_gpu[index].any()), "lines": lines,
                    "scatter": _scatter(index, geometry, budget)})
    return out


def group_totals(groups: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per group name of ``html_groups``'s entries, (time, exposed time) of its collectives over
    every step of the trace: the sums of its (kind, size bucket) lines, in their order."""
    return {entry["name"]: (sum(line[3] for line in entry["lines"]), sum(line[4] for line in entry["lines"]))
            for entry in groups}


def _first_dict_group(view: CollectiveColumns, index: np.ndarray) -> dict[str, Any] | None:
    for code in view.group.codes[index].tolist():
        if isinstance(view.group.names[code], dict):
            return view.group.names[code]
    return None


class _Geometry:
    """Per row, the α-β scatter's coordinates of a collective the fit can place (``valid``): the
    bytes per ring step x = S·busbw_factor/hops and the transfer time per step y (reports/html)."""

    def __init__(self, valid: np.ndarray, x: np.ndarray, y: np.ndarray, size: np.ndarray, transfer: np.ndarray,
                 steps: np.ndarray, n: np.ndarray, wait: np.ndarray, kind: list[str], kind_rank: np.ndarray,
                 kind_code: np.ndarray) -> None:
        self.valid, self.x, self.y, self.size, self.transfer = valid, x, y, size, transfer
        self.steps, self.n, self.wait, self.kind, self.kind_rank, self.kind_code = steps, n, wait, kind, kind_rank, kind_code


def _scatter_geometry(view: CollectiveColumns, wait_column: np.ndarray) -> _Geometry:
    kinds = [str(k or "") for k in view.kind.names]
    sizes = [g.get("size") if isinstance(g, dict) else None for g in view.group.names]
    # per (kind, group) pair: whether the fit can place it, its busbw factor, hops and N
    pair = view.group.codes * len(kinds) + view.kind.codes
    distinct, inverse = unique_ints(pair, return_inverse=True)
    inverse = inverse.reshape(-1)
    ok, factor, steps, group_n = (np.zeros(len(distinct), dtype=bool), np.ones(len(distinct)),
                                  np.ones(len(distinct)), np.ones(len(distinct)))
    for i, p in enumerate(distinct.tolist()):
        kind, n = kinds[p % len(kinds)], sizes[p // len(kinds)]
        if kind not in BUSBW_KINDS or not isinstance(n, int) or n < 1:
            continue
        hop = hops(kind, n)
        if hop < 1 or (n < 2 and kind not in POINT_TO_POINT):
            continue
        ok[i], factor[i], steps[i], group_n[i] = True, models.busbw_factor(kind, n), hop, n
    size, dur = view.size, view.dur
    with np.errstate(invalid="ignore"):
        valid = ok[inverse] & _finite(size) & (size != 0) & _finite(dur) & (dur != 0)
        wait = np.where(_finite(wait_column), wait_column, 0.0)
        wait = np.where((wait >= 0) & (wait < dur), wait, 0.0)
        transfer = dur - wait
        x = size * factor[inverse] / steps[inverse]
        y = transfer / steps[inverse]
    order = sorted(range(len(kinds)), key=kinds.__getitem__)
    kind_rank = np.empty(len(kinds), dtype=np.int64)
    kind_rank[order] = np.arange(len(kinds))
    return _Geometry(valid, x, y, size, transfer, steps[inverse], group_n[inverse], wait, kinds,
                     kind_rank[view.kind.codes], view.kind.codes)


def _scatter(index: np.ndarray, g: _Geometry, budget: int) -> dict[str, Any]:
    """The group's points sorted as (x, y, kind, row) tuples sort, thinned to ``budget`` (the
    fastest point of each size first, then the rest evenly), each with its tip's figures."""
    rows = index[g.valid[index]]
    order = np.lexsort((rows, g.kind_rank[rows], g.y[rows], g.x[rows]))
    rows = rows[order]
    total = len(rows)
    if total > budget:
        rows = rows[_thinned(g.x[rows], budget)]
    points = [[x, y, g.kind[k], s, t, int(h), int(n), w] for x, y, k, s, t, h, n, w in zip(
        g.x[rows].tolist(), g.y[rows].tolist(), g.kind_code[rows].tolist(), g.size[rows].tolist(),
        g.transfer[rows].tolist(), g.steps[rows].tolist(), g.n[rows].tolist(), g.wait[rows].tolist())]
    return {"total": total, "points": points}


def scatter_frame(scatter: dict[str, Any], fit: Any) -> dict[str, Any] | None:
    """The frame of a group's α-β scatter (``scatter``: its digest entry; ``fit``: its
    ``groups[]`` entry, analyzer.job.commfit): the decades its axes span, down to α and S*/10 so
    the line's latency floor and its knee are visible, and the fit's line y = α + x/β across
    them: ``LINE_SIZES`` sizes evenly in log between the x decades, each with its α-β time
    (analyzer.model.formulas.alpha_beta_time), those within the y decades; and S* (the fit's,
    else α·β). None with fewer than two points."""
    points = scatter["points"]
    if scatter["total"] < 2:
        return None
    fit = fit if isinstance(fit, dict) else {}
    s_star = sourced_figure(fit.get("s_star_bytes"))
    alpha, beta = sourced_figure(fit.get("alpha_us")), sourced_figure(fit.get("beta_gbps"))
    xs = [p[0] for p in points] + ([s_star / 10] if s_star else [])
    ys = [p[1] for p in points] + ([alpha] if alpha else [])
    xlo, xhi = _log_bounds(min(xs), max(xs))
    ylo, yhi = _log_bounds(min(ys), max(ys))
    frame: dict[str, Any] = {"x_decades": [xlo, xhi], "y_decades": [ylo, yhi], "line": None, "s_star": None}
    if alpha is not None and beta:
        line = []
        for i in range(LINE_SIZES):
            size = 10 ** (xlo + (xhi - xlo) * i / (LINE_SIZES - 1))
            t = models.alpha_beta_time(size, alpha, beta)
            if 10 ** ylo <= t <= 10 ** yhi:
                line.append([size, t])
        frame["line"] = line
        frame["s_star"] = s_star or models.crossover_bytes(alpha, beta)
    return frame


def _log_bounds(lo: float, hi: float) -> tuple[int, int]:
    a, b = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
    return a, b if b > a else a + 1


def _thinned(x: np.ndarray, budget: int) -> np.ndarray:
    """Positions kept of sorted points: the first of each x (the lower envelope the α-β fit
    rests on) spread evenly, then the others evenly, in sorted order."""
    fastest = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])
    keep = _evenly(fastest, budget)
    others = np.ones(len(x), dtype=bool)
    others[keep] = False
    chosen = np.zeros(len(x), dtype=bool)
    chosen[keep] = True
    chosen[_evenly(np.flatnonzero(others), budget - len(keep))] = True
    return np.flatnonzero(chosen)


def _evenly(items: np.ndarray, count: int) -> np.ndarray:
    """``[items[int(i * len(items) / count)] for i in range(count)]`` (all of them when fewer)."""
    if count <= 0:
        return items[:0]
    if len(items) <= count:
        return items
    return items[(np.arange(count) * len(items) / count).astype(np.int64)]


# ---------------------------------------------------------------- the text view
def top_exposed(view: CollectiveColumns, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU collectives with exposed time: how many, and the ``TOP_ROWS`` most exposed (ties:
    rank, start, row order)."""
    exposed = view.written("exposed_us")
    with np.errstate(invalid="ignore"):
        chosen = np.flatnonzero(view.on_gpu & ~np.isnan(exposed) & (exposed != 0))
    return {"gpu": int(view.on_gpu.sum()), "shown": len(chosen),
            "rows": _top(rows, chosen, exposed, lambda c: (-c["exposed_us"], c["rank"], c["start_us"]))}


def _top(rows: list[dict[str, Any]], chosen: np.ndarray, values: np.ndarray, key: Any) -> list[dict[str, Any]]:
    """``heapq.nsmallest(TOP_ROWS, chosen rows, key)`` (ties in row order), over the rows whose
    value (as a float) is at least the TOP_ROWS-th largest: a float is never above a larger
    exact value, so no row of the top is left out, and the rows' own values order them."""
    if len(chosen) > TOP_ROWS:
        threshold = np.partition(values[chosen], len(chosen) - TOP_ROWS)[len(chosen) - TOP_ROWS]
        chosen = chosen[values[chosen] >= threshold]
    chosen_rows = rows.dicts(chosen) if isinstance(rows, RowTable) else list(map(rows.__getitem__, chosen.tolist()))
    return heapq.nsmallest(TOP_ROWS, chosen_rows, key=key)


def host_side(view: CollectiveColumns, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The collectives only the host's ops record: libraries, ranks, (rank, step) windows, count
    and bytes per kind (in order of first appearance), and the ``TOP_ROWS`` longest."""
    index = np.flatnonzero(~view.on_gpu)
    if not len(index):
        return None
    libraries = sorted({str(view.library.names[c] or "unknown") for c in unique_ints(view.library.codes[index]).tolist()})
    step_known = np.array([s is not None for s in view.step.names], dtype=bool)
    stepped = index[step_known[view.step.codes[index]]]
    windows = len(unique_ints(view.rank[stepped] * len(view.step.names) + view.step.codes[stepped]))
    size = view.size[index]
    kinds = []
    kind_codes = view.kind.codes[index]
    first = unique_ints(kind_codes, return_index=True)[1]
    for code in kind_codes[np.sort(first)].tolist():
        mine = kind_codes == code
        sizes = np.where(np.isnan(size[mine]), 0.0, size[mine])
        kinds.append([view.kind.names[code], float(mine.sum()), ordered_sum(sizes, 0.0)])
    longest = _top(rows, index, view.dur, lambda c: (-c["dur_us"], c["rank"], c["start_us"]))
    return {"count": len(index), "libraries": libraries, "ranks": len(unique_ints(view.rank[index])),
            "windows": windows, "kinds": kinds, "longest": longest}


# ---------------------------------------------------------------- the gate
def group_labels(view: CollectiveColumns) -> list[str]:
    """The group labels of the rows (sorted; none for a row without one)."""
    return sorted({label for label in map(group_label, view.group.names) if label})


# ---------------------------------------------------------------- the diff
def window_totals(view: CollectiveColumns, windows: set[tuple[int, Any]], given_ranks: list[int]) -> dict[str, Any]:
    """Per (group label, collective), over the rows inside the run's steady (rank, step)
    ``windows`` (each given rank's whole trace when the run has no step breakdown): count,
    bytes (and how many rows have no size), time, exposed time and the exposed part spent
    waiting, summed in row order; with the number of windows and what a window is
    (analyzer.compare.diff)."""
    ranks = unique_ints(view.rank)
    rank_code = np.searchsorted(ranks, view.rank)  # each row's rank, numbered
    if not windows:
        given = set(given_ranks)
        keep = np.isin(ranks, sorted(given))[rank_code]
        count, per = max(len(given), 1), "rank"
    else:
        step_index = {name: code for code, name in enumerate(view.step.names)}
        steady = np.zeros((len(ranks), len(view.step.names)), dtype=bool)  # (rank, step) in a window
        found = [(rank, step_index[step]) for rank, step in windows if step in step_index]
        if found and len(ranks):
            window_rank = np.array([rank for rank, _ in found], dtype=np.int64)
            at = np.minimum(np.searchsorted(ranks, window_rank), len(ranks) - 1)
            known = ranks[at] == window_rank
            steady[at[known], np.array([code for _, code in found], dtype=np.int64)[known]] = True
        keep = steady[rank_code, view.step.codes] if view.n else np.zeros(0, dtype=bool)
        count, per = len(windows), "steady rank-step"
    rows = np.flatnonzero(keep)
    labels = [group_label(g) or UNKNOWN_GROUP for g in view.group.names]
    label_codes = categorical(labels, len(labels))
    kinds = [k or "unknown" for k in view.kind.names]
    kind_codes = categorical(kinds, len(kinds))
    cell = label_codes.codes[view.group.codes[rows]] * len(kind_codes.names) + kind_codes.codes[view.kind.codes[rows]]
    size = view.size[rows]
    dur = view.dur[rows]
    exposed = view.written("exposed_us")[rows]
    wait = view.written("wait_us")[rows]
    cells = []
    first = unique_ints(cell, return_index=True)[1]
    for c in cell[np.sort(first)].tolist():
        mine = cell == c
        sizes, durs, exp, waits = size[mine], dur[mine], exposed[mine], wait[mine]
        known = _finite(sizes)
        with np.errstate(invalid="ignore"):
            has_wait = _finite(waits) & _finite(exp)
            parts = np.minimum(np.maximum(waits[has_wait], 0.0), exp[has_wait])
        row = rows[int(np.argmax(mine))]
        cells.append([label_codes.names[c // len(kind_codes.names)], kind_codes.names[c % len(kind_codes.names)],
                      int(mine.sum()), ordered_sum(np.where(known, sizes, 0.0), 0.0), int((~known).sum()),
                      ordered_sum(np.where(_finite(durs), durs, 0.0), 0.0),
                      ordered_sum(np.where(_finite(exp), exp, 0.0), 0.0),
                      ordered_sum(parts, 0.0) if has_wait.any() else None, view.rows[row].get("group")])
    return {"windows": count, "per": per, "cells": cells}
