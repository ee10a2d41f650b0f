"""Bandwidth of every collective, and α/β of every process group fitted from the trace.

algbw / busbw follow nccl-tests (models.md §2): ``algbw = S / t`` and ``busbw = algbw ×
busbw_factor(kind, N)``, with t the collective's *transfer* time: its duration minus the time it
waited for late ranks (:mod:`analyzer.job.crossrank`). A collective has one only where that wait
is measured (``transfer_measured``); elsewhere its kernel's duration is a wait of unknown length
plus the transfer, no rate of the link, and it has no algbw or busbw.

α/β of a group (models.md §1): every ring collective costs ``hops·α + hops·x/β`` with
``hops`` = 2(N-1) (all-reduce), N-1 (all-gather, reduce-scatter, all-to-all) or 1 (broadcast,
reduce, point-to-point) and ``x = S · busbw_factor / hops`` (S/N for the rings), so
``y = t / hops = α + x / β`` is one line for all kinds of a group. Durations are inflated by
waiting and contention, never deflated, so the line is fitted to the *lower envelope*: the
fastest point of each size bucket, then the line that stays below every envelope point and is
closest to them in relative terms (a 2-variable linear program, solved exactly on its vertices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from collections import deque
from itertools import repeat
from operator import setitem
from typing import Any

import numpy as np

from analyzer.job.columns import Categorical, CollectiveColumns, categorical, distinct_rows, round_list
from analyzer.job.crossrank import matched_ranks
from analyzer.model import formulas as models

P2P = ("send", "recv", "sendrecv")
MIN_DISTINCT_SIZES = 3
MAX_MEDIAN_GAP = 0.5  # envelope points this far above the fitted line: the model does not fit
_RING_HOPS = {"allreduce": 2, "allgather": 1, "reduce_scatter": 1, "alltoall": 1}


def hops(kind: str, n: int) -> int:
    """Number of α terms of one collective of ``kind`` on N ranks (models.md §2)."""
    if kind in _RING_HOPS:
        return _RING_HOPS[kind] * (n - 1)
    return 1


def modelled(kind: str) -> bool:
    return kind in models.COLLECTIVE_KINDS


def has_bus_model(kind: str, n: int | None) -> bool:
    """Whether busbw, hops and the latency/bandwidth bound are defined for ``kind`` on N ranks:
    a modelled kind, a known N, and two ranks at least except for point-to-point."""
    return modelled(kind) and bool(n) and (n >= 2 or kind in ("send", "recv", "sendrecv"))


def bandwidths(kind: str, size_bytes: int | None, time_us: float | None,
               n: int | None) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s; None where the size, time or group size is unknown."""
    if size_bytes is None or not time_us or time_us <= 0:
        return None, None
    alg = models.algbw_gbps(size_bytes, time_us)
    if not has_bus_model(kind, n):
        return alg, None
    return alg, alg * busbw_factor(kind, n)  # = models.busbw_gbps, factor computed once per (kind, N)


def transfer_measured(view: CollectiveColumns) -> np.ndarray:
    """Whether each row's transfer time is measured, so that its bandwidth is the link's rate
    (models.md §2, "Bus bandwidth of a job"): a GPU collective kernel (an op's duration on the
    host is no transfer: an NCCL launch takes ~20 µs whatever the size) of a known size and a
    kind with a bus-bandwidth factor on its group's size, matched across ranks with *every*
    member of its group. A kernel's duration is the wait for the group's last member plus the
    transfer; in a set that holds every member the shortest kernel is the last arrival's, which
    waited for nobody, and ``dur − wait_us`` is the transfer. Where a member's trace is missing
    the wait is a lower bound, and unmatched it is unknown. Point-to-point kernels never: a
    send or recv waits for its peer, and paired (analyzer.job.p2p) a send may return before its
    data has landed (eagerly buffered, or handed to gloo's socket): the shorter kernel of a pair
    need not be the transfer."""
    if not view.n:
        return np.zeros(0, dtype=bool)
    sizes = np.array([group_size(g) for g in view.group.names], dtype=np.int64)[view.group.codes]
    # once per (group, kind) pair: a ring or tree kind with a factor on the group's size
    codes, ok = view.group_keys(lambda row: row["collective"] not in P2P
                                and has_bus_model(row["collective"], group_size(row.get("group")) or None))
    transfer = view.dur - waits(view)
    with np.errstate(invalid="ignore"):
        return (view.on_gpu & (view.size > 0) & np.array(ok, dtype=bool)[codes] & ~np.isnan(view.written("wait_us"))
                & (matched_ranks(view) == sizes) & (transfer > 0))


def group_size(group: Any) -> int:
    """A row's group size (0: unknown)."""
    size = (group or {}).get("size") if isinstance(group, dict) else None
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


class GroupColumns:
    """The fields of a group's collective rows that the fits need, as arrays: the rows at
    ``index`` of the job's view (its ``wait_us`` column set by the cross-rank matching), or
    rows read on their own. ``measured``: which rows' transfer time is measured (the job's
    ``transfer_measured`` at ``index``); None: every row's (rows read on their own, whose job
    is unknown)."""

    def __init__(self, rows: list[dict[str, Any]], view: CollectiveColumns | None = None,
                 index: np.ndarray | None = None, measured: np.ndarray | None = None) -> None:
        if view is None or index is None:
            view, index = CollectiveColumns(rows), np.arange(len(rows))
        self.measured = np.ones(len(index), dtype=bool) if measured is None else measured
        # codes of the view's kinds (kinds of other groups among the names): no string per row
        self.kind = Categorical(view.kind.codes[index], view.kind.names)
        self.sizes = view.size[index]
        self.on_gpu = view.on_gpu[index]
        durations = view.dur[index]
        self.transfer = durations - waits(view)[index]  # the wait for late ranks taken out
        self.time = np.where(self.on_gpu, self.transfer, durations)  # CPU rows: their duration

    def present_kinds(self) -> list[str]:
        """The distinct kinds of the group's rows."""
        seen = np.bincount(self.kind.codes, minlength=len(self.kind.names))
        return [self.kind.names[code] for code in np.flatnonzero(seen).tolist()]


def _by_kind(kind: Categorical, figures: dict[str, float]) -> np.ndarray:
    """Each row's figure of its kind (``figures`` holds the kinds present)."""
    return np.array([figures.get(name, np.nan) for name in kind.names], dtype=float)[kind.codes]


def waits(view: CollectiveColumns) -> np.ndarray:
    """Each row's ``wait_us or 0.0`` (the cross-rank matching's)."""
    wait = view.written("wait_us")
    return np.where(np.isnan(wait), 0.0, wait)


BOUNDS = (None, "latency-bound", "bandwidth-bound")  # a row's ``bound`` by code


def annotate_group(rows: list[dict[str, Any]] | None, n: int | None, s_star: float | None,
                   cols: GroupColumns | None = None) -> tuple[list[float | None], np.ndarray, list[float]]:
    """Set ``algbw_gbps``, ``busbw_gbps`` (over the transfer time, on the rows whose transfer is
    measured: ``transfer_measured``; none on a CPU-side row, an unmatched one, one whose group
    has members without a trace, a send or a recv) and ``bound`` on the rows of one group of
    ``n`` ranks: the arithmetic of :func:`bandwidths` and :func:`bound_of`, a group's rows at a
    time. Returns the busbw values, the bounds as codes (``BOUNDS``) and the algbw values (NaN
    where None). ``rows`` None: nothing written (``cols`` then gives the fields)."""
    cols = cols or GroupColumns(rows or [])
    sizes, times = cols.sizes, cols.time
    defined = {kind: has_bus_model(kind, n) for kind in cols.present_kinds()}
    factors = _by_kind(cols.kind, {kind: busbw_factor(kind, n) if ok else np.nan for kind, ok in defined.items()})
    hop_counts = _by_kind(cols.kind, {kind: hops(kind, n) if ok else np.nan for kind, ok in defined.items()})
    with np.errstate(invalid="ignore", divide="ignore"):
        known = ~np.isnan(sizes) & np.isfinite(times) & (times > 0) & cols.on_gpu & cols.measured
        alg = np.where(known, sizes / times * 1e-3, np.nan)
        bus = alg * factors
        per_hop = sizes * factors / hop_counts  # the bytes each of the collective's α terms carries
        latency = per_hop < (np.nan if s_star is None else s_star)
    has_bound = ~np.isnan(per_hop) & (s_star is not None)
    codes = np.where(has_bound, np.where(latency, 1, 2), 0)
    busbw = _none_for_nan(round_list(bus, 4), np.isnan(bus))
    algbw = round_list(alg, 4)
    if rows is not None:  # rows of their own (the job's are written by column: fit_groups)
        # The rows share the BOUNDS strings (an array's tolist() would make one string per row);
        # written by a C-level pass per key, the keys in this order.
        for key, values in (("algbw_gbps", _none_for_nan(algbw, np.isnan(alg))), ("busbw_gbps", busbw),
                            ("bound", list(map(BOUNDS.__getitem__, codes.tolist())))):
            deque(map(setitem, rows, repeat(key), values), maxlen=0)
    return busbw, codes, algbw


def _none_for_nan(values: list[float], nan: np.ndarray) -> list[float | None]:
    """The values with None where ``nan`` (round keeps NaN: the rounded list's NaN are there)."""
    if not nan.any():
        return values
    return np.where(nan, None, np.array(values, dtype=object)).tolist()


@lru_cache(maxsize=4096)
def busbw_factor(kind: str, n: int) -> float:
    return models.busbw_factor(kind, n)


def size_bucket(size_bytes: int) -> int:
    """Power-of-two size bucket: k such that 2**k <= S < 2**(k+1) (0 for S < 2)."""
    return max(0, int(size_bytes).bit_length() - 1)


def size_buckets(sizes: np.ndarray) -> np.ndarray:
    """``size_bucket(int(s))`` of each size (non-negative floats), over the array: floor(s)'s
    binary exponent is its bit length, exact below 2**53 (larger sizes go through Python)."""
    if len(sizes) and (sizes.min() < 0 or sizes.max() >= 2.0 ** 53 or np.isnan(sizes).any()):
        return np.array([size_bucket(int(v)) for v in sizes], dtype=np.int64)
    return np.maximum(np.frexp(np.floor(sizes))[1].astype(np.int64) - 1, 0)


def bucket_label(k: int) -> str:
    return f"{_human(2 ** k)}-{_human(2 ** (k + 1))}"


def _human(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


@dataclass(frozen=True)
class AlphaBeta:
    alpha_us: float | None
    beta_gbps: float | None
    fit: str  # how they were obtained, in words
    source: str  # "fit" | "profile-alpha" (α from the profile, β measured) | "profile" | "none"
    points: int = 0  # envelope points the fit used

    @property
    def s_star_bytes(self) -> float | None:
        if self.alpha_us is None or not self.beta_gbps:
            return None
        return models.crossover_bytes(self.alpha_us, self.beta_gbps)


def envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fastest point (smallest y) of each power-of-two bucket of x, buckets ascending."""
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
    keys = size_buckets(x)
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    best_x, best_y = [], []
    for lo, hi in zip(first, np.r_[first[1:], len(x)]):
        k = lo + int(np.argmin(y[lo:hi]))
        best_x.append(x[k])
        best_y.append(y[k])
    return np.asarray(best_x, float), np.asarray(best_y, float)


def lower_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(α, c) of the line ``α + c·x`` below every point (α ≥ 0, c > 0) that maximises
    ``Σ (α + c·x_i) / y_i``: the lower envelope in relative terms. None when no such line has
    c > 0 (times that do not grow with size)."""
    if len(x) < 2:
        return None
    candidates = [(0.0, float(np.min(y / x)))]
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx > 0
    slope = (y[j][ok] - y[i][ok]) / dx[ok]
    intercept = y[i][ok] - slope * x[i][ok]
    candidates += list(zip(intercept.tolist(), slope.tolist()))
    weights = 1.0 / y
    best, best_score = None, -math.inf
    for alpha, c in candidates:
        if alpha < 0 or c <= 0:
            continue
        if np.any(alpha + c * x > y * (1 + 1e-9) + 1e-12):
            continue
        score = float(np.sum(weights * (alpha + c * x)))
        if score > best_score:
            best, best_score = (alpha, c), score
    return best


def fit_alpha_beta(kinds: list[str] | Categorical, sizes: list[int] | np.ndarray, times_us: list[float] | np.ndarray, n: int,
                   fallback: tuple[float | None, float | None, str]) -> AlphaBeta:
    """α (µs) and β (GB/s) of one group of N ranks from its collectives' (kind, S, transfer time;
    S and t as lists or arrays; the kinds as a list or as codes).
    ``fallback`` = (α, β, where from) used when fewer than 3 distinct sizes are known."""
    # the per-kind figures once per kind (names of kinds absent from these rows are harmless)
    kind, names = kinds if isinstance(kinds, Categorical) else categorical(kinds, len(kinds))
    usable = [has_bus_model(k, n) for k in names]
    factor = np.array([busbw_factor(k, n) if ok else np.nan for k, ok in zip(names, usable)], float)[kind]
    hop = np.array([hops(k, n) if ok else np.nan for k, ok in zip(names, usable)], float)[kind]
    # None: no size, left out as 0 is
    if isinstance(sizes, np.ndarray):  # NaN: no size
        s = np.where(np.isnan(sizes), 0.0, sizes).astype(float)
    else:
        s = np.array([0.0 if v is None else v for v in sizes] if None in sizes else sizes, float)
    t = np.asarray(times_us, float)
    with np.errstate(invalid="ignore"):
        keep = ~np.isnan(factor) & (s != 0) & (t > 0)  # kinds with a model, s and t truthy, t > 0
    px, py = s[keep] * factor[keep] / hop[keep], t[keep] / hop[keep]
    sized = np.array([modelled(k) for k in names], dtype=bool)[kind] & (s != 0)  # a known size of a modelled kind
    distinct = len(set(s[sized].tolist()))
    alpha_fb, beta_fb, where = fallback
    source = "profile" if beta_fb is not None else "none"
    if distinct < MIN_DISTINCT_SIZES:
        return _beta_only(list(zip(px.tolist(), py.tolist())), alpha_fb, beta_fb, where, distinct, source)
    x, y = envelope(px, py)
    line = lower_line(x, y)
    if line is None:
        return AlphaBeta(alpha_fb, beta_fb, f"{where}: transfer times do not grow with size, "
                         "no α/β fit", source)
    alpha, c = line
    gap = float(np.median((y - (alpha + c * x)) / y))
    if gap > MAX_MEDIAN_GAP:
        return AlphaBeta(alpha_fb, beta_fb, f"{where}: the fastest transfers do not follow α + S/β "
                         f"(median gap {100 * gap:.0f}% to the best line)", source)
    beta = 1e-3 / c  # y µs = x B · c  ->  β GB/s = 1e-3 / c
    return AlphaBeta(round(alpha, 4), round(beta, 3),
                     f"lower-envelope fit of {len(px)} collectives ({distinct} distinct sizes, "
                     f"{len(x)} size buckets)", "fit", len(x))


def unfitted_partial(where: str, given: int, n: int) -> str:
    """Why a group with members missing from the traces has no α/β fit (its link: ``where``)."""
    return (f"{where}: {given} of {n} members' traces given: each kernel's duration is its transfer plus "
            "waiting for the members not given, which a fit cannot tell apart, so none is made")


def _beta_only(points, alpha_fb, beta_fb, where, distinct, source) -> AlphaBeta:
    """Too few sizes for a line: α from the profile; β from the fastest collective with that α
    when its transfer time is clearly above α (else the profile's β too)."""
    why = f"only {distinct} distinct message size(s) (a fit needs {MIN_DISTINCT_SIZES})"
    if alpha_fb is None or not points:
        return AlphaBeta(alpha_fb, beta_fb, f"{where}: {why}", source)
    betas = [x * 1e-3 / (y - alpha_fb) for x, y in points if x > 0 and y > 2 * alpha_fb]
    if not betas:
        return AlphaBeta(alpha_fb, beta_fb, f"{where}: {why}; transfers too short to measure β", source)
    return AlphaBeta(alpha_fb, round(max(betas), 3),
                     f"α from the {where}; β from the fastest of {len(points)} collectives "
                     f"with that α: {why}", "profile-alpha", 1)


def summarize(rows: list[dict[str, Any]], view: CollectiveColumns | None = None) -> list[dict[str, Any]]:
    """Per (group, collective, size bucket): count, sizes, transfer time and busbw statistics.
    ``view``: the rows' columns when the caller has them (with the fits' ``busbw_gbps``)."""
    view = view if view is not None else CollectiveColumns(rows)
    index = np.flatnonzero(~np.isnan(view.size))  # rows with a known size
    count = len(index)

    def sized(key: str) -> list[Any]:  # the rows' values of ``key`` (read only where needed)
        values = view.rows.values(key)
        return list(map(values.__getitem__, index.tolist()))
    known = view.size[index]
    # Sizes below 2**53 are exact in the column: buckets and each cell's extremes from it (the
    # extreme's row gives the value as written); larger ones from the rows' values
    exact = not count or float(np.abs(known).max()) < 2.0 ** 53
    sizes_list = [] if exact else sized("bytes")
    if exact:
        bucket = size_buckets(known)
    else:
        bucket_of = {size: size_bucket(size) for size in set(sizes_list)}  # a job has few distinct sizes
        bucket = np.fromiter(map(bucket_of.__getitem__, sizes_list), dtype=np.int64, count=count)
    group_code, names = view.group_keys(_group_name)
    kinds = view.kind.codes[index]
    # cells by (group name, kind, bucket), numbered in order of first appearance
    first, _, cell_of = distinct_rows([group_code[index], kinds, bucket])
    order = np.argsort(cell_of, kind="stable")  # each cell's rows together, in row order
    bounds_at = np.searchsorted(cell_of[order], np.arange(len(first) + 1))
    cells = {(names[group_code[index[i]]], view.kind.names[kinds[i]], int(bucket[i])):
             order[bounds_at[code]:bounds_at[code + 1]] for code, i in enumerate(first.tolist())}
    sizes = None if exact else np.fromiter(sizes_list, dtype=object, count=count)
    transfer = (view.dur - waits(view))[index]
    busbw = view.written("busbw_gbps")[index]
    codes = view.extra.get("bound")  # the fits' (fit_groups), else the rows'
    bounds = Categorical(codes[index], list(BOUNDS)) if codes is not None else \
        categorical(sized("bound"), count)
    out = []
    for (group, kind, bucket), members in sorted(cells.items(), key=lambda kv: (str(kv[0][0]), kv[0][1], kv[0][2])):
        cell_transfer, cell_busbw = transfer[members], busbw[members]
        cell_busbw = cell_busbw[~np.isnan(cell_busbw)]
        if sizes is None:  # min() and max() of the values: the first row of the extreme (argmin's)
            cell_known = known[members]
            column = view.rows.column("bytes")  # the extreme rows' values as written
            bytes_min = column.at(int(index[members[np.argmin(cell_known)]]))  # type: ignore[union-attr]
            bytes_max = column.at(int(index[members[np.argmax(cell_known)]]))  # type: ignore[union-attr]
        else:
            bytes_min, bytes_max = min(sizes[members]), max(sizes[members])
        out.append({
            "group": group, "collective": kind, "size_bucket": bucket_label(bucket),
            "count": len(members),
            "bytes_min": bytes_min, "bytes_max": bytes_max,
            "transfer_us_min": round(float(cell_transfer.min()), 3),
            "transfer_us_median": round(float(np.median(cell_transfer)), 3),
            "busbw_gbps_median": round(float(np.median(cell_busbw)), 3) if cell_busbw.size else None,
            "busbw_gbps_max": round(float(cell_busbw.max()), 3) if cell_busbw.size else None,
            "bound": _most_common(bounds, members),
        })
    return out


def _most_common(labels: Categorical, members: np.ndarray) -> str | None:
    """The most common non-null label of the rows ``members`` (ties: alphabetical), None when
    all are null."""
    counts = np.bincount(labels.codes[members], minlength=len(labels.names)).tolist()
    present = [(-n, name) for name, n in zip(labels.names, counts) if n and name is not None]
    return min(present)[1] if present else None


def _group_name(row: dict[str, Any]) -> str | None:
    group = row.get("group") or {}
    return group.get("name")


def bound_of(kind: str, size_bytes: int | None, n: int | None, s_star: float | None) -> str | None:
    """``latency-bound`` when the collective's α terms outweigh its bandwidth terms, i.e. when the
    bytes per hop ``x = S·busbw_factor/hops`` (S/N on a ring) are below S* = α·β (models.md §1-2);
    ``bandwidth-bound`` otherwise. A ring all-reduce of S is latency-bound iff S < N·S*."""
    if size_bytes is None or s_star is None or not has_bus_model(kind, n):
        return None
    per_hop = size_bytes * busbw_factor(kind, n) / hops(kind, n)
    return "latency-bound" if per_hop < s_star else "bandwidth-bound"
