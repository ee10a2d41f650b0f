"""The DDP bucket pipeline (models.md §4) fed with one rank-step's measurements: the gradient
ready curve, the backward window and the group's α/β. Shared by the DDP rules.

Gradient-ready times are measured where the trace shows them: a bucket's all-reduce that starts
on an idle communication stream started when its gradients were ready (NCCL waits on the
compute stream's event), so (bytes reduced so far, start) is a point of the ready curve; the
first gradient is produced at the start of backward and the last by its end. Between these
points the curve is interpolated linearly (gradients produced at a steady rate).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from itertools import repeat
from operator import add, attrgetter, is_not
from typing import Any, Callable

import numpy as np

from analyzer.base.rowtable import Numbers
from analyzer.base.units import fmt_bytes
from analyzer.model import formulas as models
from analyzer.job.model import RankStep
from analyzer.model.link import Link
from analyzer.job.buckets import BucketTable
from analyzer.job.result import Bucket

_IDLE_GAP_US = 2.0  # comm stream idle at least this long before a start: the start is a ready time
_PIECE_BYTES = models.MIB  # re-bucketing granularity (DDP buckets hold whole gradients)
# At most this many pieces of 1 MiB per step (16 GiB of gradients; the sample jobs' largest
# step holds 5.5 GiB): past it the pieces grow, so that the re-bucketing's cost follows the
# number of buckets in the trace, never the sizes they claim (issue 30).
MAX_GRADIENT_PIECES = 1 << 14


# ---------------------------------------------------------------- the gradient schedule (§4)
# One estimate of when each measured bucket's gradients were ready, and one re-bucketing, used
# by the bucket rules (cap search) and by the what-if projection (--bucket-mb, FSDP -> DDP).

def interpolate_ready(known: list[float | None], weights: list[float], upper: list[float],
                      end_value: float | None) -> list[float]:
    """Fill unknown ready points linearly in cumulative weight between known anchors (the end
    anchor ``end_value`` after the last item); keep them non-decreasing and <= ``upper``."""
    mask = np.fromiter(map(is_not, known, repeat(None)), dtype=bool, count=len(known))
    values = np.array([0.0 if k is None else k for k in known], dtype=float)
    return interpolate_ready_array(mask, values, np.asarray(weights, dtype=float), np.asarray(upper, dtype=float),
                                   end_value).tolist()


def interpolate_ready_array(known: np.ndarray, values: np.ndarray, weights: np.ndarray, upper: np.ndarray,
                            end_value: float | None) -> np.ndarray:
    """:func:`interpolate_ready` on arrays: ``known`` the mask of the items whose ready point is
    ``values``. Every step is the elementwise IEEE operation the scalar form made, in its order:
    ``min``/``max`` as comparisons that keep the first argument on ties and NaN (as Python's do)."""
    cum = np.cumsum(np.concatenate(([0.0], weights)))[1:]
    xs, ys = cum[known], values[known]
    if end_value is not None and (not len(xs) or cum[-1] > xs[-1]):
        xs, ys = np.append(xs, float(cum[-1])), np.append(ys, end_value)
    filled = np.interp(cum, xs, ys) if len(xs) else upper
    chosen = np.where(known, values, filled)
    value = np.where(upper < chosen, upper, chosen)  # min(chosen, cap)
    return _running_max(value)


def _running_max(values: np.ndarray) -> np.ndarray:
    """``out[i] = max(values[i], out[i - 1])`` as Python computes it. Without zeros or NaN, equal
    floats have equal bits, so numpy's running maximum is that; with them (where -0.0 vs 0.0 or
    NaN's order of arguments decide), Python's own loop."""
    if len(values) and not (np.isnan(values).any() or (values == 0.0).any()):
        return np.maximum.accumulate(values)
    out: list[float] = []
    for value in values.tolist():
        out.append(max(value, out[-1]) if out else value)
    return np.array(out, dtype=float)


def bucket_ready_times(starts: list[float], ends: list[float], sizes: list[float],
                       launches: list[float | None], backward_end: float) -> list[float]:
    """When each measured bucket (launch order) had its gradients ready: its all-reduce's start
    when the stream was idle before it (it ran as soon as it could), else interpolated in bytes
    between such anchors and the end of backward; never after its own start, never before its
    CPU launch."""
    launch = np.array([np.nan if x is None else x for x in launches], dtype=float)
    has_launch = np.fromiter(map(is_not, launches, repeat(None)), dtype=bool, count=len(launches))
    return bucket_ready_array(np.asarray(starts, dtype=float), np.asarray(ends, dtype=float),
                              np.asarray(sizes, dtype=float), launch, has_launch, backward_end).tolist()


def bucket_ready_array(starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray, launch: np.ndarray,
                       has_launch: np.ndarray, backward_end: float) -> np.ndarray:
    """:func:`bucket_ready_times` on arrays (``launch`` where ``has_launch``)."""
    known = np.ones(len(starts), dtype=bool)
    known[1:] = starts[1:] > ends[:-1] + _IDLE_GAP_US
    ready = interpolate_ready_array(known, starts, sizes, starts, min(backward_end, float(starts[-1])))
    # A bucket cannot be ready before the CPU launched its all-reduce; bound by its own start
    # too, so a host clock slightly ahead of the GPU's never moves ready past the transfer.
    launched = np.where(launch > ready, launch, ready)  # max(value, launch)
    return np.where(has_launch, np.where(starts < launched, starts, launched), ready)  # min(.., start)


def gradient_pieces(sizes: list[float], ready: list[float], start: float,
                    piece_bytes: float = _PIECE_BYTES) -> tuple[list[float], list[float]]:
    """The measured buckets as gradient pieces of at most ``piece_bytes`` (never across a
    bucket), ready at times interpolated between the previous bucket's ready time (``start``
    for the first) and their own bucket's. More than ``MAX_GRADIENT_PIECES`` pieces in all
    would be needed: larger pieces, as many as that (plus one a bucket at most)."""
    piece_sizes: list[float] = []
    piece_ready: list[float] = []
    previous = start
    piece_bytes = max(piece_bytes, math.fsum(sizes) / MAX_GRADIENT_PIECES)
    for size, r in zip(sizes, ready):
        count = max(1, math.ceil(size / piece_bytes))
        for p in range(count):
            piece_sizes.append(size / count)
            piece_ready.append(previous + (r - previous) * (p + 1) / count)
        previous = r
    return piece_sizes, piece_ready


def rebucket(sizes: list[float], ready: list[float], cap_bytes: float,
             first_bucket_bytes: float | None = None) -> tuple[list[float], list[float]]:
    """Gradients (bytes and ready time, in ready order) into DDP buckets of ``cap_bytes``
    (``models.assign_buckets``; the first bucket is the cap too, as DDP does when
    ``bucket_cap_mb`` is set) -> (ready time, bytes) per bucket."""
    groups = models.assign_buckets(sizes, cap_bytes, cap_bytes if first_bucket_bytes is None else first_bucket_bytes)
    return (list(models.bucket_ready_times(ready, groups)), [float(sum(sizes[i] for i in g)) for g in groups])


@dataclass(frozen=True)
class DdpStep:
    rank: int
    step: Any
    backward_start_us: float
    backward_end_us: float
    bucket_bytes: tuple[float, ...]
    bucket_starts_us: tuple[float, ...]
    bucket_ends_us: tuple[float, ...]
    link: Link | None
    dtype: str | None
    bucket_launches_us: tuple[float | None, ...] = ()

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bucket_bytes))

    @property
    def measured_tail_us(self) -> float:
        return max(0.0, self.bucket_ends_us[-1] - self.backward_end_us)

    @property
    def first_wait_us(self) -> float:
        """Backward start to the first all-reduce's start (T_first_bucket_wait)."""
        return min(max(0.0, self.bucket_starts_us[0] - self.backward_start_us), self.backward_us)

    @property
    def backward_us(self) -> float:
        return self.backward_end_us - self.backward_start_us

    def allreduce_us(self, size_bytes: float) -> float:
        return self.link.time_us("allreduce", size_bytes)

    @property
    def ready_us(self) -> list[float]:
        """When each measured bucket's gradients were ready (``bucket_ready_times``)."""
        return bucket_ready_times(list(self.bucket_starts_us), list(self.bucket_ends_us), list(self.bucket_bytes),
                                  list(self.bucket_launches_us) or [None] * len(self.bucket_bytes),
                                  self.backward_end_us)

    def ready_at(self, cumulative_bytes: np.ndarray) -> np.ndarray:
        """Ready time of the gradient that completes ``cumulative_bytes`` (from backward start)."""
        cum = np.concatenate(([0.0], np.cumsum(self.bucket_bytes)))
        return np.interp(cumulative_bytes, cum, [self.backward_start_us] + self.ready_us)

    def pipeline(self, bucket_bytes: list[float], scale: float = 1.0) -> models.BucketPipeline:
        """The §4 pipeline for buckets of these sizes (in ready order); ``scale`` multiplies the
        bytes on the wire (0.5: the same buckets all-reduced in bf16 instead of fp32)."""
        ready = self.ready_at(np.cumsum(bucket_bytes))
        return models.ddp_bucket_pipeline(ready.tolist(), [b * scale for b in bucket_bytes],
                                          self.backward_end_us, self.allreduce_us)

    def modelled_current(self, scale: float = 1.0) -> models.BucketPipeline:
        return self.pipeline(list(self.bucket_bytes), scale)

    def pieces(self) -> tuple[list[float], list[float]]:
        """Gradient pieces (≤ 1 MiB, never across a measured bucket) and their ready times."""
        return gradient_pieces(list(self.bucket_bytes), self.ready_us, self.backward_start_us)

    def best_cap(self, candidates=models.DEFAULT_CANDIDATE_CAPS_BYTES) -> models.BucketCapChoice:
        sizes, ready = self.pieces()
        return models.best_bucket_cap(sizes, ready, self.backward_end_us, self.allreduce_us,
                                      candidates, first_bucket_bytes=None)

    def cap_saving(self) -> tuple[models.BucketCapChoice, float, float]:
        """The best candidate cap, the modelled tail with the current buckets, and the saving."""
        choice = self.best_cap()
        current = self.modelled_current().exposed_tail_us
        return choice, current, current - choice.exposed_tail_us

    def tail_for_cap(self, cap_bytes: float) -> float:
        sizes, ready = self.pieces()
        return models.ddp_pipeline_for_cap(sizes, ready, self.backward_end_us, self.allreduce_us,
                                           cap_bytes, first_bucket_bytes=None).exposed_tail_us


def representative(steps: list[Any], model: Any) -> Any:
    """The one rank-step a rule models (``steps``: DdpStep or FsdpStep, in rank order): the
    typical step of the median rank that has it, as every figure quotes the typical step; the
    middle one when the job has no typical step or none of these is of it."""
    typical = model.typical.step if model.typical is not None else None
    chosen = [s for s in steps if s.step == typical] or steps
    return chosen[len(chosen) // 2]


def ddp_steps(facts, need_link: bool = True) -> list[DdpStep]:
    """One DdpStep per (rank, step) whose buckets have known sizes and a backward window (and,
    with ``need_link``, a known α/β for their group). Built once per JobFacts: several rules
    ask, and a 64-rank job has thousands of steps."""
    steps = facts.__dict__.get("_ddp_steps")
    if steps is None:
        steps = facts.__dict__["_ddp_steps"] = _all_ddp_steps(facts)
    return [s for s in steps if s.link is not None] if need_link else list(steps)


def why_no_ddp_steps(facts, need_link: bool = True) -> str:
    """Why ``ddp_steps`` is empty: what the traces lack for the bucket models."""
    buckets = facts.result.buckets  # the buckets of every step, as buckets_by_step groups them
    if not any("backward" in s.windows for s in facts.steps):
        return "no backward phase in the traces (no autograd or DDP markers): the bucket pipeline needs it"
    if buckets and all(b["bytes"] is None for b in buckets):
        return "gradient all-reduce sizes are unknown (no collective args or Input Dims)"
    if need_link and ddp_steps(facts, need_link=False):
        if facts.members_missing:  # no fit from kernels that wait for members not given
            return (f"{facts.members_missing}: no link model (hardware profile or --gpu, --nics-per-node, "
                    "--nic-gbps) for the all-reduce group")
        return "the all-reduce group's link (α/β) is unknown: no fit and no hardware profile"
    return "no step has both a backward window and gradient all-reduces of known size"


def link_origin(link: Link) -> str:
    """Where a link's α/β came from, as a prediction's assumption says it: measured (a fit of
    the group's own collectives) or the hardware profile."""
    return "measured" if link.source.startswith("fitted") else "profile"


def _bucket_floats(columns: list[Any]) -> tuple[np.ndarray, ...] | None:
    """(sizes, starts, ends as float64, the running count of buckets whose size or start is
    None, from 0) of the buckets' number columns of bytes, start and duration: the floats
    ``float()`` of each value gives (the same rounding) and ``start + dur`` in float64, as the
    per-bucket loop added them. None when a column is not numbers, or a duration is None."""
    if not all(isinstance(col, Numbers) for col in columns) or columns[2].none is not None:
        return None  # (a None duration: the per-bucket loop's float(None) says so)
    sizes, starts, durations = (col.floats() for col in columns)
    missing = np.zeros(len(sizes), dtype=bool)
    for col in columns[:2]:
        if col.none is not None:
            missing |= col.none
    return sizes, starts, starts + durations, np.r_[0, np.cumsum(missing)]


def _all_ddp_steps(facts) -> list[DdpStep]:
    out = []
    floats = None
    keys = ("bytes", "start_us", "dur_us", "launch_us")
    fields = attrgetter(*keys)  # a Bucket's (facts.bucket_fields), read here without a call per step
    table = facts.result.buckets
    by_step: dict[tuple[int, Any], Any] = table.by_step() if isinstance(table, BucketTable) \
        else facts.buckets_by_step()
    ordered = sorted(by_step.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    if isinstance(table, BucketTable):  # by column: the fields in this order, each step a slice
        order = np.concatenate([index for _, index in ordered]) if ordered else np.zeros(0, dtype=np.int64)
        taken = [table.column(key).take(order) for key in (*keys, "dtype")]
        bounds = np.cumsum([0] + [len(index) for _, index in ordered]).tolist()
        floats = _bucket_floats(taken[:3])
        if floats is not None:  # as Python floats once: each step takes list slices (a tolist per step cost ~40%)
            floats = (*(f.tolist() for f in floats[:3]), floats[3])
        # the sizes, starts and durations as values only where the floats are not made (each a
        # list of every bucket: ~1 s of the 1,024-rank reduce when made and never read)
        columns = [None, None, None] if floats is not None else [col.values() for col in taken[:3]]
        columns += [col.values() for col in taken[3:]]
    for k, ((rank, step), buckets) in enumerate(ordered):
        view: RankStep | None = facts.step_view(rank, step)
        if view is None or "backward" not in view.windows:
            continue
        if floats is not None:  # the step's floats as slices of the columns' (no float() per bucket)
            lo, hi = bounds[k], bounds[k + 1]
            if floats[3][hi] != floats[3][lo]:  # a size or start is None
                continue
            link = facts.link(facts.backward_allreduce_groups.get((rank, step), {}))
            start, end, _ = view.windows["backward"]
            out.append(DdpStep(rank, step, start, end, tuple(floats[0][lo:hi]), tuple(floats[1][lo:hi]),
                               tuple(floats[2][lo:hi]), link, columns[4][lo], tuple(columns[3][lo:hi])))
            continue
        if isinstance(table, BucketTable):
            lo, hi = bounds[k], bounds[k + 1]
            sizes, starts, durations, launches = (tuple(col[lo:hi]) for col in columns[:4])
            dtype = columns[4][lo]
        else:
            sizes, starts, durations, launches = zip(*map(fields, buckets)) if isinstance(buckets[0], Bucket) \
                else facts.bucket_fields(buckets, keys)
            dtype = buckets[0].get("dtype")
        if None in sizes or None in starts:
            continue
        link = facts.link(facts.backward_allreduce_groups.get((rank, step), {}))
        start, end, _ = view.windows["backward"]
        out.append(DdpStep(rank, step, start, end,
                           tuple(map(float, sizes)), tuple(map(float, starts)),
                           tuple(map(add, map(float, starts), map(float, durations))),
                           link, dtype, launches))
    return out


def typical_step(steps: list[DdpStep], metric: Callable[[DdpStep], float]) -> tuple[float, DdpStep]:
    """(median of ``metric`` over the steps, the step closest to it): the one a finding shows;
    ties go to the lowest rank, then step."""
    typical = statistics.median(metric(s) for s in steps)
    return typical, min(steps, key=lambda s: (abs(metric(s) - typical), s.rank, str(s.step)))


def backward_transfer_us(facts, rank: int, step: Any) -> float:
    """T_comm of a DDP step: the transfer time (not the waiting) of its gradient all-reduces."""
    return facts.backward_allreduce_transfer_us.get((rank, step), 0)


def allreduce_equation(link: Link, size_bytes: float) -> str:
    """T_AR = 2(N−1)α + 2(N−1)/N·S/β with the numbers substituted."""
    n = link.n
    t = link.time_us("allreduce", size_bytes)
    return (f"T_AR(S) = 2(N−1)α + 2(N−1)/N·S/β = 2·{n - 1}·{link.alpha_us:.3g} µs + "
            f"{2 * (n - 1) / n:.3g}·{fmt_bytes(size_bytes)}/{link.beta_gbps:.4g} GB/s = {t:,.0f} µs")
