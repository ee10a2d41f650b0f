"""The row-by-row code the digest (analyzer.job.digest) replaced, as it was on main (b13bf47),
kept as the oracle tests/test_digest.py compares the digest's views with: the HTML report's
collective tables and scatter, the text view's top and host-side collectives and the diff's
totals per (group, collective). The bus bandwidth of each group (the gate's, the HTML's; models.md
§2 "Bus bandwidth of a job") as branch busbw defines it, worked out here row by row on its own
(no call into analyzer.job.busbw): which collectives' transfer is measured, the typical step's
Σ S·factor / Σ t (else the steady steps', else the whole trace's), the samples per rank and steady
step, and why a group has none."""

from __future__ import annotations

import heapq
import math
from itertools import repeat
from operator import is_not
from statistics import median
from typing import Any

import numpy as np

from analyzer.base.units import fmt_bytes, fmt_us
from analyzer.base.numbers import finite as diff_num
from analyzer.compare.diff import cross_node_of
from analyzer.compare.metrics import GROUP_METRIC, Metric, Sample
from analyzer.job.model import STEADY, TYPICAL, JobModel, group_label
from analyzer.model import formulas as models
from analyzer.base.numbers import sourced as _sourced
from analyzer.reports.html import OPEN_GROUPS, _fit_view, _short_list, unavailable
from analyzer.reports.wrap import WIDTH, wrap  # the views' line breaking, not a figure

SIZE_EDGES = (10e3, 100e3, 1e6, 10e6, 100e6)
MAX_SCATTER_POINTS, MIN_SCATTER_POINTS, SCATTER_POINTS_TOTAL = 600, 60, 3000
BUSBW_KINDS = set(models.COLLECTIVE_KINDS)


def _log_bounds(lo: float, hi: float) -> tuple[int, int]:
    a, b = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
    return a, b if b > a else a + 1


def _collectives(doc: dict[str, Any], model: JobModel, busbw: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``busbw``: the oracle's bus bandwidth of each group label (``busbw_figures``)."""
    rows = [c for c in doc.get("collectives") or [] if isinstance(c, dict)]
    if not rows:
        return unavailable("no collective operations in the traces")
    fits = {str(g.get("name")): g for g in doc.get("groups") or [] if isinstance(g, dict)}
    by_group: dict[str, list[dict[str, Any]]] = {}
    for c in rows:
        by_group.setdefault(_group_name(c), []).append(c)
    # The scatter plots share one point budget, so many process groups cannot blow up the page.
    budget = max(MIN_SCATTER_POINTS, min(MAX_SCATTER_POINTS, SCATTER_POINTS_TOTAL // len(by_group)))
    groups = [_group_view(name, by_group[name], fits.get(name), budget, _busbw_view(model.group(name), busbw))
              for name in sorted(by_group, key=_natural)]
    # Many groups (HSDP, TP x DP) would bury the page: the ones with the most exposed time open.
    ranked = sorted(groups, key=lambda g: (-g["exposed_us"], -g["total_us"], _natural(g["name"])))
    for g in groups:
        g["open"] = g in ranked[:OPEN_GROUPS]
    return {"available": True, "groups": groups, "fits_available": bool(fits), "open_count": OPEN_GROUPS,
            "why_no_fits": "" if fits else "α/β fits per group are not in this document (job analyses did not run)"}


def _natural(name: str) -> tuple[int, Any]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _group_name(c: dict[str, Any]) -> str:
    group = c.get("group") if isinstance(c.get("group"), dict) else {}
    return str(group.get("name") if group.get("name") is not None else "unknown")


def _busbw_view(facts: Any, busbw: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    figure = busbw.get(facts.label) if facts is not None and facts.label is not None else None
    return None if figure is None else {"gbps": figure["gbps"], "basis": figure["basis"], "label": facts.label}


def _group_view(name: str, rows: list[dict[str, Any]], fit: dict[str, Any] | None, budget: int,
                busbw: dict[str, Any] | None) -> dict[str, Any]:
    group = next((c["group"] for c in rows if isinstance(c.get("group"), dict)), {}) or {}
    size = (fit or {}).get("size") or group.get("size")
    beta = _num((fit or {}).get("beta_gbps"))
    table: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c in rows:
        table.setdefault((str(c.get("collective") or "unknown"), _bucket_index(c.get("bytes"))), []).append(c)
    lines = [_bucket_line(kind, bucket, table[(kind, bucket)], size, beta) for kind, bucket in sorted(table)]
    return {"name": name, "description": str((fit or {}).get("description") or group.get("description") or ""),
            "size": size, "ranks": _short_list((fit or {}).get("ranks") or group.get("ranks")),
            "fit": _fit_view(fit), "table": lines, "scatter": _scatter(rows, fit, budget), "count": len(rows),
            "total_us": sum(line["total_us"] for line in lines), "exposed_us": sum(line["exposed_us"] for line in lines),
            "on_gpu": any(c.get("on_gpu") for c in rows), "busbw": busbw}


def _num(value: Any) -> float | None:
    value = _sourced(value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _bucket_index(nbytes: Any) -> int:
    if not isinstance(nbytes, (int, float)) or isinstance(nbytes, bool):
        return len(SIZE_EDGES) + 1  # size unknown: last
    return sum(nbytes >= edge for edge in SIZE_EDGES)


def _bucket_label(index: int) -> str:
    if index > len(SIZE_EDGES):
        return "size unknown"
    lo = SIZE_EDGES[index - 1] if index else 0
    if index == len(SIZE_EDGES):
        return f"≥ {fmt_bytes(lo)}"
    return f"{fmt_bytes(lo)} – {fmt_bytes(SIZE_EDGES[index])}" if index else f"< {fmt_bytes(SIZE_EDGES[0])}"


def _bucket_line(kind, bucket, rows, group_size, beta) -> dict[str, Any]:
    # each row's busbw comes from the job analysis (analyzer.job.commfit); none is computed here
    busbw = [b for b in (_num(c.get("busbw_gbps")) for c in rows) if b is not None]
    mid = median(busbw) if busbw else None
    bounds = sorted({str(c["bound"]) for c in rows if c.get("bound")})
    waits = [float(c["wait_us"]) for c in rows if _num(c.get("wait_us")) is not None]
    return {"collective": kind, "bucket": _bucket_label(bucket), "count": len(rows),
            "total_us": sum(float(c.get("dur_us") or 0) for c in rows),
            "exposed_us": sum(float(c.get("exposed_us") or 0) for c in rows),
            "wait_us": sum(waits) if waits else None, "bound": ", ".join(bounds),
            "busbw_gbps": mid, "beta_pct": 100 * mid / beta if mid is not None and beta else None}


def _scatter(rows: list[dict[str, Any]], fit: dict[str, Any] | None, budget: int = 600) -> dict[str, Any]:
    """Collectives in the coordinates of the group's α-β fit (analyzer.job.commfit): bytes per ring
    step x = S·busbw_factor/hops (S/N on a ring) against time per step y = transfer time/hops,
    so every kind of collective lies on the one line y = α + x/β, and S* = α·β is a point on x."""
    points = sorted(p for p in (_per_hop_point(c, i) for i, c in enumerate(rows)) if p is not None)
    if len(points) < 2:
        return unavailable("fewer than two collectives with a known size, kind and group size")
    total = len(points)
    if total > budget:
        points = _thin_points(points, budget)
    w, h, left, bottom, right = 640, 300, 64, 36, 34
    s_star = _num(fit.get("s_star_bytes")) if fit else None
    alpha, beta = (_num(fit.get("alpha_us")), _num(fit.get("beta_gbps"))) if fit else (None, None)
    # The axes reach down to α and S*, so the line's latency floor and its knee are visible.
    xs = [p[0] for p in points] + ([s_star / 10] if s_star else [])
    ys = [p[1] for p in points] + ([alpha] if alpha else [])
    xlo, xhi = _log_bounds(min(xs), max(xs))
    ylo, yhi = _log_bounds(min(ys), max(ys))
    fx = lambda v: left + (math.log10(v) - xlo) / (xhi - xlo) * (w - left - right)  # noqa: E731
    fy = lambda v: h - bottom - (math.log10(v) - ylo) / (yhi - ylo) * (h - bottom - 10)  # noqa: E731
    kinds = sorted({p[2] for p in points})
    view = {"available": True, "w": w, "h": h, "left": left, "plot_right": w - right, "plot_bottom": h - bottom,
            "shown": len(points), "total": total, "kinds": kinds,
            "points": [{"x": round(fx(x), 1), "y": round(fy(y), 1), "k": kinds.index(kind), "tip": _hop_tip(rows[i])}
                       for x, y, kind, i in points],
            "xticks": [{"x": round(fx(10 ** e), 1), "label": fmt_bytes(10 ** e)} for e in range(xlo, xhi + 1)],
            "yticks": [{"y": round(fy(10 ** e), 1), "label": fmt_us(10 ** e)} for e in range(ylo, yhi + 1)],
            "line": None, "s_star": None}
    if alpha is not None and beta:
        curve = []
        for i in range(61):
            size = 10 ** (xlo + (xhi - xlo) * i / 60)
            t = models.alpha_beta_time(size, alpha, beta)
            if 10 ** ylo <= t <= 10 ** yhi:
                curve.append(f"{fx(size):.1f},{fy(t):.1f}")
        view["line"] = " ".join(curve)
        s_star = s_star or models.crossover_bytes(alpha, beta)
        if s_star and 10 ** xlo <= s_star <= 10 ** xhi:
            view["s_star"] = {"x": round(fx(s_star), 1), "label": f"S* = {fmt_bytes(s_star)}"}
    return view


def _hop_geometry(c: dict[str, Any]) -> tuple[str, float, float, int, int, float] | None:
    """(kind, S, transfer µs, ring steps, N, waited µs) of a collective the fit can place."""
    from analyzer.job.commfit import hops

    kind, size, dur = str(c.get("collective") or ""), _num(c.get("bytes")), _num(c.get("dur_us"))
    n = (c.get("group") or {}).get("size") if isinstance(c.get("group"), dict) else None
    if kind not in BUSBW_KINDS or not size or not dur or not isinstance(n, int) or n < 1:
        return None
    steps = hops(kind, n)
    if steps < 1 or (n < 2 and kind not in ("send", "recv", "sendrecv")):
        return None
    wait = _num(c.get("wait_us")) or 0.0
    wait = wait if 0 <= wait < dur else 0.0  # waiting for late ranks is not transfer
    return kind, size, dur - wait, steps, n, wait


def _per_hop_point(c: dict[str, Any], index: int) -> tuple[float, float, str, int] | None:
    geometry = _hop_geometry(c)
    if geometry is None:
        return None
    kind, size, transfer, steps, n, _ = geometry
    return size * models.busbw_factor(kind, n) / steps, transfer / steps, kind, index


def _hop_tip(c: dict[str, Any]) -> str:
    kind, size, transfer, steps, n, wait = _hop_geometry(c)
    return (f"{kind} of {fmt_bytes(size)} on {n} ranks: transfer {fmt_us(transfer)}"
            + (f" (+{fmt_us(wait)} waiting)" if wait else "")
            + f" = {steps} step(s) of {fmt_bytes(size * models.busbw_factor(kind, n) / steps)} in {fmt_us(transfer / steps)}")


def _thin_points(points: list[tuple], budget: int) -> list[tuple]:
    """Deterministic thinning that keeps the lower envelope (the fastest point of each size, what
    the α-β fit rests on) and spreads the rest evenly in size order."""
    fastest = [i for i, p in enumerate(points) if i == 0 or p[0] != points[i - 1][0]]
    keep = _evenly(fastest, budget)
    kept = set(keep)
    rest = [i for i in range(len(points)) if i not in kept]
    keep += _evenly(rest, budget - len(keep))
    return [points[i] for i in sorted(keep)]


def _evenly(items: list[int], count: int) -> list[int]:
    if count <= 0:
        return []
    if len(items) <= count:
        return list(items)
    return [items[int(i * len(items) / count)] for i in range(count)]



# ---------------------------------------------------------------- text
def text_top_collectives(doc: dict[str, Any], limit: int = 5) -> list[str]:
    on_gpu = [c for c in doc["collectives"] if c.get("on_gpu")]
    matched = bool((doc.get("stragglers") or {}).get("method"))
    host_side = _host_side_collectives(doc["collectives"], limit, matched) \
        if len(on_gpu) < len(doc["collectives"]) else []
    shown, rows = _exposed_rows(on_gpu, limit)
    if not shown:
        if host_side:  # nothing on the GPU to be exposed: say what the host-side ops tell
            return host_side
        return ["No exposed communication." if on_gpu else "No communication kernels.", ""]
    # The first ``limit`` of the sorted rows (ties in row order, as a stable sort), without
    # sorting hundreds of thousands of rows of a large job.
    rows = heapq.nsmallest(limit, rows, key=lambda c: (-c["exposed_us"], c["rank"], c["start_us"]))
    lines = [f"Top {min(limit, shown)} collectives by exposed time:",
             f"{'rank':>5} {'step':>5} {'phase':<9} {'collective':<14} {'size':>10} {'dur µs':>10} {'exposed µs':>11}  group"]
    for c in rows[:limit]:
        size = fmt_bytes(c.get("bytes"))
        group = (c.get("group") or {}).get("description") or (c.get("group") or {}).get("name") or "?"
        step = c["step"] if c.get("step") is not None else "-"
        lines.append(f"{c['rank']:>5} {step:>5} {str(c.get('phase')):<9} {c['collective']:<14} {size:>10} "
                     f"{c['dur_us']:>10,.0f} {c['exposed_us']:>11,.0f}  {group}")
    return lines + [""] + host_side


def _host_side_collectives(collectives: list[dict[str, Any]], limit: int, matched: bool) -> list[str]:
    """The collectives only the host's ops record (gloo, and NCCL ops of a rank with no GPU
    trace): how many and how large per step, the longest, and what their record can and cannot
    tell (their host time, not when a GPU transferred or what compute hid)."""
    rows = [c for c in collectives if not c.get("on_gpu")]
    libraries = sorted({str(c.get("library") or "unknown") for c in rows})
    ranks = sorted({c["rank"] for c in rows})
    steps = {(c["rank"], c.get("step")) for c in rows if c.get("step") is not None}
    per = max(len(steps), len(ranks), 1)
    kinds: dict[str, list[float]] = {}
    for c in rows:
        kinds.setdefault(c["collective"], [0.0, 0.0])
        kinds[c["collective"]][0] += 1
        kinds[c["collective"]][1] += c.get("bytes") or 0
    basis = "rank and step" if steps else "rank (whole trace)"
    parts = ", ".join(f"{kind} {count / per:g} ({fmt_bytes(round(size / per)) if size else 'size unknown'})"
                      for kind, (count, size) in sorted(kinds.items(), key=lambda kv: -kv[1][0]))
    lines = wrap(f"Host-side collectives ({', '.join(libraries)}), {len(rows)} on {len(ranks)} rank(s), "
                          f"per {basis}: {parts}.", WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    last = ("which rank reached each last" if matched else
            "not which rank reached each last (the collectives could not be matched across ranks)")
    lines += wrap("measured: their count, message sizes, how long each took on the host (the "
                           f"backend's own work range where the trace has one); {last}; not measured: GPU time, "
                           "exposed communication and what compute hid (no GPU work recorded for them)", WIDTH,
                           initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    longest = heapq.nsmallest(limit, rows, key=lambda c: (-c["dur_us"], c["rank"], c["start_us"]))
    lines += [f"Top {len(longest)} host-side collectives by duration:",
              f"{'rank':>5} {'step':>5} {'phase':<9} {'collective':<14} {'size':>10} {'dur µs':>10}  group"]
    for c in longest:
        group = (c.get("group") or {}).get("description") or (c.get("group") or {}).get("name") or "?"
        step = c["step"] if c.get("step") is not None else "-"
        lines.append(f"{c['rank']:>5} {step:>5} {str(c.get('phase')):<9} {c['collective']:<14} "
                     f"{fmt_bytes(c.get('bytes')):>10} {c['dur_us']:>10,.0f}  {group}")
    return lines + [""]


def _exposed_rows(collectives: list[dict[str, Any]], limit: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many rows have exposed time (a truthy ``exposed_us``), those of them that can be
    among the ``limit`` most exposed, in row order): the rows whose exposed time is at least
    the ``limit``-th largest, read as a column (a float is never above a larger exact value,
    so no row of the top is left out). All of them where the values are not plain numbers."""
    values = list(map(dict.get, collectives, repeat("exposed_us")))
    exposed = None
    if set(map(type, values)) <= {float, int, type(None)}:
        try:
            exposed = np.array(values, dtype=float)  # None: NaN
        except OverflowError:  # an int beyond the floats
            pass
    known = np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=len(values))
    if exposed is None or np.isnan(exposed[known]).any():  # not plain numbers, or NaN
        rows = [c for c in collectives if c.get("exposed_us")]
        return len(rows), rows
    index = np.flatnonzero(known & (exposed != 0))
    shown = len(index)
    if shown > limit:
        threshold = np.partition(exposed[index], shown - limit)[shown - limit]
        index = index[exposed[index] >= threshold]
    return shown, list(map(collectives.__getitem__, index.tolist()))



# ---------------------------------------------------------------- gate: bus bandwidth
P2P = ("send", "recv", "sendrecv")


def _size_of(group: Any) -> int:
    size = group.get("size") if isinstance(group, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def _value(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return None if value is None or value != value else float(value)


def _factor(kind: Any, n: int) -> float | None:
    """nccl-tests' factor of a kind on N ranks, where the bus model has one."""
    if kind not in models.COLLECTIVE_KINDS or not n or (n < 2 and kind not in P2P):
        return None
    return models.busbw_factor(kind, n)


def _measured(row: dict[str, Any], matched: int) -> bool:
    """A GPU ring/tree collective of a known size, matched on every member of its group, its wait
    known and its transfer (duration - wait) positive."""
    n, size, dur, wait = _size_of(row.get("group")), _value(row, "bytes"), _value(row, "dur_us"), _value(row, "wait_us")
    return (bool(row.get("on_gpu")) and size is not None and size > 0 and row.get("collective") not in P2P
            and _factor(row.get("collective"), n) is not None and wait is not None and matched == n
            and dur is not None and dur - wait > 0)


def busbw_figures(run: Any, matched: list[int]) -> dict[str, dict[str, Any]]:
    """label -> {gbps, basis, scope, samples}: each group label's bus bandwidth, row by row.
    ``matched``: each row's matched set size (the cross-rank matching's, an input)."""
    typical = run.model.typical
    step, steady = (typical.step, list(typical.steady_steps)) if typical is not None else (None, [])
    by_label: dict[str, list[int]] = {}
    for i, row in enumerate(run.collectives):
        group = row.get("group")
        label = group_label(group) if isinstance(group, dict) else None
        if label is not None:
            by_label.setdefault(label, []).append(i)
    out = {}
    for label in sorted(by_label):
        rows = [run.collectives[i] for i in by_label[label]]
        if all(_size_of(r.get("group")) == 1 for r in rows):
            continue  # a group of one rank moves nothing over a link
        hit = [i for i in by_label[label] if _measured(run.collectives[i], matched[i])]
        out[label] = (_label_figure(run.collectives, hit, matched, step, steady) if hit else
                      {"gbps": None, "basis": "not measured: " + _why_not(rows, [matched[i] for i in by_label[label]]),
                       "scope": "step", "samples": []})
    return out


def _label_figure(rows: list[dict[str, Any]], hit: list[int], matched: list[int], step: Any,
                  steady: list[Any]) -> dict[str, Any]:
    def bus(i: int) -> float:
        return rows[i]["bytes"] * _factor(rows[i]["collective"], _size_of(rows[i]["group"]))

    def transfer(i: int) -> float:
        return rows[i]["dur_us"] - rows[i]["wait_us"]

    def samples(chosen: list[int]) -> list[tuple[int, Any, float]]:
        cells: dict[tuple[int, Any], list[float]] = {}
        for i in chosen:
            cell = cells.setdefault((rows[i]["rank"], rows[i].get("step")), [0.0, 0.0])
            cell[0] += bus(i)
            cell[1] += transfer(i)
        return [(rank, at, b / t * 1e-3) for (rank, at), (b, t) in cells.items()]

    def figure(chosen: list[int], basis: str, scope: str, sampled: list[int]) -> dict[str, Any]:
        members = max(matched[i] for i in hit)
        names = {_group_key(rows[i]) for i in hit}
        what = (f"Σ bus bytes / Σ transfer time of {len(chosen)} collective kernel(s), each matched on all {members} "
                "members" + (f" of its group ({len(names)} groups of this name)" if len(names) > 1 else ""))
        gbps = sum(bus(i) for i in chosen) / sum(transfer(i) for i in chosen) * 1e-3
        return {"gbps": gbps, "basis": basis + what, "scope": scope, "samples": samples(sampled)}

    if step is None:
        return figure(hit, "whole trace (no step breakdown): ", "trace", hit)
    in_steady = [i for i in hit if rows[i].get("step") in steady]
    in_typical = [i for i in hit if rows[i].get("step") == step]
    if in_typical:
        return figure(in_typical, f"typical step {step}: ", "step", in_steady)
    if in_steady:
        covered = [s for s in steady if any(rows[i].get("step") == s for i in in_steady)]
        return figure(in_steady, f"steady steps {', '.join(map(str, covered))} (none in typical step {step}): ", "step",
                      in_steady)
    return {"gbps": None, "basis": f"not measured in the steady steps: its {len(hit)} collective(s) with a measured "
                                   "transfer lie in the warm-up, drain or outlier steps, or outside any step",
            "scope": "step", "samples": []}


def _group_key(row: dict[str, Any]) -> tuple:
    group = row.get("group") or {}
    if group.get("name") is not None:
        return ("name", str(group["name"]))
    return ("ranks", tuple(group["ranks"])) if group.get("ranks") else ("unknown", row["collective"])


def _why_not(rows: list[dict[str, Any]], matched: list[int]) -> str:
    """Why none of a label's rows has a measured transfer: the first condition none meets."""
    gpu = [(r, m) for r, m in zip(rows, matched) if r.get("on_gpu")]
    if not gpu:
        return "no GPU collective kernel (an op's duration on the host is no transfer time)"
    sized = [(r, m) for r, m in gpu if (_value(r, "bytes") or 0) > 0]
    if not sized:
        return "no GPU collective of a known size"
    kinds = {r["collective"] for r, _ in sized}
    sizes = {_size_of(r.get("group")) for r, _ in sized}
    if kinds <= set(P2P):
        return ("send/recv only: a point-to-point kernel's time includes waiting for its peer, and even a "
                "paired send may end before its data lands, so no transfer time is measured")
    if not any(kind in models.COLLECTIVE_KINDS for kind in kinds - set(P2P)):
        return f"no collective kind with a bus-bandwidth factor ({', '.join(sorted(map(str, kinds)))})"
    if sizes == {0}:
        return "the group's size is unknown: no bus-bandwidth factor"
    ranks, size = len({r["rank"] for r, _ in sized}), max(sizes)
    if ranks < size:
        return (f"{ranks} of the group's {size} members' traces given: each collective's wait for the members "
                "not given is unknown, so its transfer time is too")
    if not any(m > 0 for _, m in sized):
        return ("its collectives could not be matched across ranks (no Comms Id, Seq or consistent order): "
                "their waits for the last member are unknown")
    return f"no collective matched on all {size} members of the group"


def busbw_metrics(run: Any, matched: list[int]) -> tuple[dict[str, Metric], dict[str, str]]:
    """``busbw_gbps:<group>`` of each label with a figure, and why each other has none."""
    figures = busbw_figures(run, matched)
    metrics = {f"{GROUP_METRIC}:{label}": Metric(f"{GROUP_METRIC}:{label}", f["gbps"],
                                                 tuple(Sample(*s) for s in f["samples"]), f["basis"], f["scope"])
               for label, f in figures.items() if f["gbps"] is not None}
    return metrics, {f"{GROUP_METRIC}:{label}": f["basis"] for label, f in figures.items() if f["gbps"] is None}


# ---------------------------------------------------------------- diff
def _rows_in_windows(run: Any) -> tuple[list[dict[str, Any]], int, str]:
    """Collective rows inside the run's steady (rank, step) windows, the number of windows and
    what a window is. A run without a step breakdown counts whole traces per rank."""
    windows = {(s.rank, s.step) for s in run.model.rank_steps() if s.role in (TYPICAL, STEADY)}
    rows = run.collectives
    if not windows:
        ranks = {r.rank for r in run.ranks}
        return [row for row in rows if row.get("rank") in ranks], max(len(ranks), 1), "rank"
    return [row for row in rows if (row.get("rank"), row.get("step")) in windows], len(windows), "steady rank-step"


def collective_totals(run: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (group, collective): count, bytes, time, exposed and wait per steady (rank, step)
    window (per rank when the run has no step breakdown)."""
    rows, windows, per = _rows_in_windows(run)
    sums: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (group_label(row.get("group")) or "(unknown group)", row.get("collective") or "unknown")
        entry = sums.setdefault(key, {"count": 0, "bytes": 0.0, "time_us": 0.0, "exposed_us": 0.0,
                                      "wait_us": None, "bytes_unknown": 0, "group": row.get("group")})
        entry["count"] += 1
        size = diff_num(row.get("bytes"))
        entry["bytes"] += size or 0.0
        entry["bytes_unknown"] += size is None
        entry["time_us"] += diff_num(row.get("dur_us")) or 0.0
        entry["exposed_us"] += diff_num(row.get("exposed_us")) or 0.0
        wait = _exposed_wait(row)
        if wait is not None:
            entry["wait_us"] = (entry["wait_us"] or 0.0) + wait
    for entry in sums.values():
        if entry["bytes_unknown"] == entry["count"]:
            entry["bytes"] = None  # no size known at all: not "0 bytes"
        for key in ("count", "bytes", "time_us", "exposed_us", "wait_us"):
            if entry[key] is not None:
                entry[key] = entry[key] / windows
        entry["cross_node"], entry["cross_node_source"] = cross_node_of(run, entry.pop("group"))
        entry["per"] = per
    return sums


def _exposed_wait(row: dict[str, Any]) -> float | None:
    """The part of a collective's exposed time spent waiting for the last rank to arrive."""
    wait, exposed = diff_num(row.get("wait_us")), diff_num(row.get("exposed_us"))
    if wait is None or exposed is None:
        return None
    return min(max(wait, 0.0), exposed)
