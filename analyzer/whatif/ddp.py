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
from typing import Any, Callable

import numpy as np

from analyzer.base.units import fmt_bytes
from analyzer.model import formulas as models
from analyzer.job.facts import Link, StepView

_IDLE_GAP_US = 2.0  # comm stream idle at least this long before a start: the start is a ready time
_PIECE_BYTES = models.MIB  # re-bucketing granularity (DDP buckets hold whole gradients)


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

    def ready_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(cumulative bytes, time µs) points of the gradient-ready curve, non-decreasing."""
        cum = np.cumsum(self.bucket_bytes)
        points_b, points_t = [0.0], [self.backward_start_us]
        prev_end = -math.inf
        for i, (start, end) in enumerate(zip(self.bucket_starts_us, self.bucket_ends_us)):
            if start - prev_end > _IDLE_GAP_US and i < len(cum) - 1:
                points_b.append(float(cum[i]))
                points_t.append(min(start, self.backward_end_us))
            prev_end = end
        points_b.append(float(cum[-1]))
        points_t.append(min(self.backward_end_us, self.bucket_starts_us[-1]))
        return np.asarray(points_b), np.maximum.accumulate(np.asarray(points_t))

    def ready_at(self, cumulative_bytes: np.ndarray) -> np.ndarray:
        b, t = self.ready_curve()
        return np.interp(cumulative_bytes, b, t)

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
        sizes: list[float] = []
        for size in self.bucket_bytes:
            count = max(1, math.ceil(size / _PIECE_BYTES))
            sizes.extend([size / count] * count)
        ready = self.ready_at(np.cumsum(sizes))
        return sizes, ready.tolist()

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
    buckets = [b for rows in facts.buckets_by_step().values() for b in rows]
    if not any("backward" in s.windows for s in facts.steps):
        return "no backward phase in the traces (no autograd or DDP markers): the bucket pipeline needs it"
    if buckets and all(b["bytes"] is None for b in buckets):
        return "gradient all-reduce sizes are unknown (no collective args or Input Dims)"
    if need_link and ddp_steps(facts, need_link=False):
        return "the all-reduce group's link (α/β) is unknown: no fit and no hardware profile"
    return "no step has both a backward window and gradient all-reduces of known size"


def _all_ddp_steps(facts) -> list[DdpStep]:
    out = []
    for (rank, step), buckets in sorted(facts.buckets_by_step().items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        view: StepView | None = facts.step_view(rank, step)
        if view is None or "backward" not in view.windows:
            continue
        if any(b["bytes"] is None or b["start_us"] is None for b in buckets):
            continue
        group = next((row["group"] for row in facts.collectives_of(rank, step)
                      if row["collective"] == "allreduce" and row["phase"] == "backward"), {})
        link = facts.link(group)
        start, end, _ = view.windows["backward"]
        out.append(DdpStep(rank, step, start, end,
                           tuple(float(b["bytes"]) for b in buckets),
                           tuple(float(b["start_us"]) for b in buckets),
                           tuple(float(b["start_us"]) + float(b["dur_us"]) for b in buckets),
                           link, buckets[0].get("dtype")))
    return out


def typical_step(steps: list[DdpStep], metric: Callable[[DdpStep], float]) -> tuple[float, DdpStep]:
    """(median of ``metric`` over the steps, the step closest to it): the one a finding shows;
    ties go to the lowest rank, then step."""
    typical = statistics.median(metric(s) for s in steps)
    return typical, min(steps, key=lambda s: (abs(metric(s) - typical), s.rank, str(s.step)))


def backward_transfer_us(facts, rank: int, step: Any) -> float:
    """T_comm of a DDP step: the transfer time (not the waiting) of its gradient all-reduces."""
    return sum(facts.transfer_time(c) for c in facts.collectives_of(rank, step)
               if c["collective"] == "allreduce" and c["phase"] == "backward")


def allreduce_equation(link: Link, size_bytes: float) -> str:
    """T_AR = 2(N−1)α + 2(N−1)/N·S/β with the numbers substituted."""
    n = link.n
    t = link.time_us("allreduce", size_bytes)
    return (f"T_AR(S) = 2(N−1)α + 2(N−1)/N·S/β = 2·{n - 1}·{link.alpha_us:.3g} µs + "
            f"{2 * (n - 1) / n:.3g}·{fmt_bytes(size_bytes)}/{link.beta_gbps:.4g} GB/s = {t:,.0f} µs")
