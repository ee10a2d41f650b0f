"""Per-step facts the diagnosis rules need beyond the time breakdown: where each phase's compute
sits on the GPU (for the DDP bucket pipeline and the critical-overlap equation, models.md §4) and
in which dtype the compute kernels run (for fp32 gradient communication under bf16 compute).

Computed in the per-rank worker (it needs the event arrays); times are absolute nanoseconds on
the rank's trace clock, so ``(ns - job.time_origin_ns) / 1000`` lines them up with the
collective rows' ``start_us``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.rank.timeline import PHASES
from analyzer.ingest.trace import GpuEvents, GpuKind

# Low-precision compute as kernel names print it: cuBLAS/CUTLASS "bf16" / "f16" tile names,
# ATen's "c10::BFloat16" / "c10::Half" template arguments, FlashAttention's "bfloat16_t".
_LOW_PRECISION = re.compile(r"bf16|bfloat16|::half\b|fp16|__half|_f16|f16_|h884|h1688|h16816",
                            re.IGNORECASE)


@lru_cache(maxsize=65536)
def _is_low_precision(kernel_name: str) -> bool:
    # Cached: the same kernel names recur in every step of every rank.
    return _LOW_PRECISION.search(kernel_name) is not None


def step_facts(strings: list[str], gpu: GpuEvents, phase: np.ndarray) -> dict[str, Any]:
    """``{"phase_windows": {phase: {start_ns, end_ns, compute_us}}, "low_precision_compute_us"}``
    for the GPU events of one step (``phase``: index into PHASES per event)."""
    compute = gpu.kind == GpuKind.COMPUTE
    windows = {}
    for code, name in enumerate(PHASES):
        mask = compute & (phase == code)
        if not mask.any():
            continue
        union = iv.union(gpu.ts[mask], gpu.end[mask])
        windows[name] = {"start_ns": int(gpu.ts[mask].min()), "end_ns": int(gpu.end[mask].max()),
                         "compute_us": round(iv.total(union) / 1000.0, 3)}
    low = np.zeros(len(gpu), dtype=bool)
    names = gpu.name[compute]
    if len(names):
        unique = arrays.unique(names)
        low_names = [i for i in unique.tolist() if _is_low_precision(strings[i])]
        low[np.flatnonzero(compute)[np.isin(names, low_names)]] = True
    low_us = iv.total(iv.union(gpu.ts[low], gpu.end[low])) / 1000.0 if low.any() else 0.0
    return {"phase_windows": windows, "low_precision_compute_us": round(low_us, 3)}
