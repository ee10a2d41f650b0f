"""Compute under strong scaling: what each GPU's compute takes when its share of a fixed global
batch changes, with the efficiency measured per shape instead of perfect scaling (issue 29;
models.md §6).

Each op with FLOPs (analyzer.job.compute) does ``factor`` times its FLOPs (the per-GPU batch
scales every GEMM's token dimension, every attention's batch), at the TFLOP/s the job itself
reaches on ops of that many FLOPs: the measured (FLOPs per op, TFLOP/s) points of its family in
the typical step, interpolated in log FLOPs; beyond the measured sizes the nearest one's rate is
kept (a GEMM smaller than any measured is assumed as efficient as the smallest: optimistic).
The optimizer's compute does not depend on the batch (the projection scales it by the shard
size); the rest of compute (elementwise, norms: memory-bound, proportional to the tokens) scales
with ``factor``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ComputeScaling:
    """One rank's typical-step compute (µs) as measured, with perfect scaling, and projected."""

    rank: int
    factor: float
    measured_us: float
    flop_kernels_us: float  # the kernels of the ops with FLOPs, as measured
    optimizer_us: float
    perfect_us: float
    projected_us: float

    @property
    def ratio(self) -> float:
        """Projected over measured compute (the factor each rank-step's compute is scaled by)."""
        return self.projected_us / self.measured_us if self.measured_us else 1.0


SOURCE = ("strong scaling: each GPU does gpus_measured / gpus_target of its FLOPs, each op at the TFLOP/s the "
          "job measures on ops of its new size (per family, interpolated in log FLOPs; beyond the measured "
          "sizes the nearest one's rate: optimistic for smaller GEMMs); optimizer compute unchanged, other "
          "compute (memory-bound) scaled with the batch")


def strong_scaling(result: Any, factor: float) -> dict[int, ComputeScaling] | None:
    """Per rank, its compute at ``factor`` times its per-GPU work; None when the job has no
    FLOPs with kernels (nothing to measure efficiency on)."""
    model = result.model
    compute, typical = model.compute, model.typical
    if compute is None or not compute.timed or typical is None or not factor > 0:
        return None
    entries = {r.rank: next((s for s in r.steps if s.get("step") == typical.step), None) for r in result.ranks}
    out = {}
    for rank in compute.ranks:
        step = entries.get(rank.rank)
        if step is None or not step.get("compute_us"):
            continue
        out[rank.rank] = _rank(rank, step, factor)
    return out or None


def _rank(rank: Any, step: dict[str, Any], factor: float) -> ComputeScaling:
    shapes = [s for s in rank.step_shapes if s.gpu_us > 0 and s.timed_flops > 0 and s.flops_each]
    curves = {family: _curve([s for s in shapes if s.family == family]) for family in {s.family for s in shapes}}
    counted = sum(s.gpu_us for s in shapes)
    projected_kernels = 0.0
    for s in shapes:
        xs, ys = curves[s.family]
        rate = float(np.interp(math.log(s.flops_each * factor), xs, ys))  # TFLOP/s at the new size
        projected_kernels += s.timed_flops * factor / (rate * 1e6)
    measured = float(step["compute_us"])
    windows = step.get("phase_windows") or {}
    optimizer = min(float((windows.get("optimizer") or {}).get("compute_us") or 0.0), measured)
    rest = max(measured - counted - optimizer, 0.0)
    perfect = counted * factor + optimizer + rest * factor
    projected = projected_kernels + optimizer + rest * factor
    return ComputeScaling(rank.rank, factor, measured, counted, optimizer, perfect, projected)


def _curve(shapes: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(log FLOPs per op, TFLOP/s) of a family's measured shapes, ascending, one point per size
    (shapes of one size: their FLOPs over their time)."""
    by_size: dict[float, list[float]] = {}
    for s in shapes:
        cell = by_size.setdefault(float(s.flops_each), [0.0, 0.0])
        cell[0] += s.timed_flops
        cell[1] += s.gpu_us
    sizes = sorted(by_size)
    return (np.log(np.array(sizes)), np.array([by_size[f][0] / (by_size[f][1] * 1e6) for f in sizes]))
