"""Per-step facts the diagnosis rules need beyond the time breakdown: where each phase's compute
sits on the GPU (for the DDP bucket pipeline and the critical-overlap equation, models.md §4), in
which dtype the compute kernels run (for fp32 gradient communication under bf16 compute) and how
many attention kernels the forward pass runs (one per transformer block: the layer structure an
FSDP wrap policy would follow, models.md §5).

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
from analyzer.rank.timeline import BACKWARD, FORWARD, NO_STEP, PHASES, Attribution, breakdown_of, ns_to_us
from analyzer.ingest.trace import GpuEvents, GpuKind

# Low-precision compute as kernel names print it: cuBLAS/CUTLASS "bf16" / "f16" tile names,
# ATen's "c10::BFloat16" / "c10::Half" template arguments, FlashAttention's "bfloat16_t".
_LOW_PRECISION = re.compile(r"bf16|bfloat16|::half\b|fp16|__half|_f16|f16_|h884|h1688|h16816",
                            re.IGNORECASE)


@lru_cache(maxsize=65536)
def _is_low_precision(kernel_name: str) -> bool:
    # Cached: the same kernel names recur in every step of every rank.
    return _LOW_PRECISION.search(kernel_name) is not None


# One forward attention kernel per transformer block, as the attention libraries name them:
# FlashAttention 2 and PyTorch's copy of it (flash_fwd_kernel, flash_fwd_splitkv_kernel, not
# its combine kernel), FlashAttention 3 (FlashAttnFwdSm90), PyTorch's memory-efficient kernel
# (fmha_cutlassF_*), other fmha forward kernels (CK's FmhaFwdKernel, TensorRT's fmha_*_fwd),
# cuDNN's SDPA forward (*sdpa*fprop*) and the Triton tutorial's / ROCm's _attn_fwd.
_ATTENTION_FORWARD = re.compile(r"flash_fwd(?!_splitkv_combine)|flashattnfwd|fmha_cutlassf|fmha_?fwd|fmhafwd"
                                r"|sdpa\w*fprop|_attn_fwd", re.IGNORECASE)


@lru_cache(maxsize=65536)
def _is_attention_forward(kernel_name: str) -> bool:
    return _ATTENTION_FORWARD.search(kernel_name) is not None


# Lanes times their stride stay below this (int64 with room to spare): a trace whose steps span
# more (bogus timestamps) is computed a few steps, or one, at a time.
LANES_SPAN_NS = 2**62


def step_figures(strings: list[str], gpu: GpuEvents, att: Attribution) -> list[dict[str, Any]]:
    """The entry of each step (ascending) as the per-rank summary begins it: its number, its time
    breakdown (``breakdown``), exposed communication by phase (``exposed_by_phase``), where each
    phase's compute sits (``phase_windows``: for the DDP bucket pipeline and the critical-overlap
    equation), its low-precision compute time and its first backward launch; and ``first_ns``,
    its first GPU activity, for the caller to pop.

    Every step at once (issue 13: a dozen interval operations per step were ~0.07 s of a
    165-step rank): each step's events move to a lane of their own on one time axis, lanes far
    enough apart that no interval reaches the next, so one union or intersection on the axis is
    every step's at once; the figures are whole nanoseconds, exactly the step-by-step ones."""
    order = np.argsort(att.step, kind="stable")  # each step's rows, ascending
    order = order[att.step[order] != NO_STEP]
    if not len(order):
        return []
    bounds = _group_bounds(att.step[order])
    ts, end = gpu.ts[order], gpu.end[order]
    span = np.maximum.reduceat(end, bounds[:-1]) - np.minimum.reduceat(ts, bounds[:-1])
    stride = min(max(int(span.max()) + 1, 1), LANES_SPAN_NS)
    per_chunk = LANES_SPAN_NS // stride
    entries = []
    for lo in range(0, len(bounds) - 1, per_chunk):
        rows = order[bounds[lo]:bounds[min(lo + per_chunk, len(bounds) - 1)]]
        entries += _lanes(strings, gpu.take(rows), att.take(rows), stride)
    return entries


def _group_bounds(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values begins, and the end."""
    return np.append(np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]])), len(values))


def _lanes(strings: list[str], gpu: GpuEvents, att: Attribution, stride: int) -> list[dict[str, Any]]:
    """``step_figures`` of whole steps' events (``att.step`` ascending), lane k from k * stride."""
    bounds = _group_bounds(att.step)
    begins, n = bounds[:-1], len(bounds) - 1
    lane = np.repeat(np.arange(n), np.diff(bounds))
    first, last = np.minimum.reduceat(gpu.ts, begins), np.maximum.reduceat(gpu.end, begins)
    offset = lane * stride - first[lane]
    # Ends before their starts clamped (the union drops them either way) so that no shift wraps.
    starts, ends = gpu.ts + offset, np.maximum(gpu.end, gpu.ts) + offset

    def union(mask: np.ndarray) -> iv.IntervalSet:
        return iv.union(starts[mask], ends[mask])

    # Lane k spans [k * stride, (k + 1) * stride), the outer lanes open-ended: a lone step
    # longer than LANES_SPAN_NS overruns its stride.
    cuts = np.arange(1, n, dtype=np.int64) * stride
    lane_from, lane_to = np.r_[np.iinfo(np.int64).min, cuts], np.r_[cuts, np.iinfo(np.int64).max]

    def totals(intervals: iv.IntervalSet) -> list[int]:
        """Nanoseconds of the canonical set in each lane."""
        return iv.covered_length(intervals, lane_from, lane_to).tolist()

    compute_rows, comm_rows = gpu.kind == GpuKind.COMPUTE, gpu.kind == GpuKind.COMM
    compute, comm = union(compute_rows), union(comm_rows)
    busy_ns, compute_ns, comm_ns = totals(iv.union(starts, ends)), totals(compute), totals(comm)
    overlap_ns = totals(iv.intersect(compute, comm))
    exposed, windows = [], []
    for code in range(len(PHASES)):
        exposed.append(totals(iv.subtract(union(comm_rows & (att.phase == code)), compute)))
        in_phase = compute_rows & (att.phase == code)
        windows.append((_lane_extreme(np.minimum, gpu.ts, lane, in_phase, n),
                        _lane_extreme(np.maximum, gpu.end, lane, in_phase, n), totals(union(in_phase))))
    low_ns = totals(union(_low_precision(strings, gpu, compute_rows)))
    attention = np.bincount(lane[_named(strings, gpu, compute_rows & (att.phase == FORWARD), _is_attention_forward)],
                            minlength=n).tolist()
    backward = (att.phase == BACKWARD) & (att.launch_thread >= 0)
    backward_launch = _lane_extreme(np.minimum, att.launch_ts, lane, backward, n)
    entries = []
    for k, (number, first_ns, last_ns) in enumerate(zip(att.step[begins].tolist(), first.tolist(), last.tolist())):
        entry = {"step": number}
        entry.update(breakdown_of(last_ns - first_ns, busy_ns[k], compute_ns[k], comm_ns[k], overlap_ns[k]))
        entry["phases"] = {name: ns_to_us(exposed[code][k]) for code, name in enumerate(PHASES)}
        entry["phase_windows"] = {name: {"start_ns": low[k], "end_ns": high[k], "compute_us": round(ns[k] / 1000.0, 3)}
                                  for name, (low, high, ns) in zip(PHASES, windows) if low[k] is not None}
        entry["low_precision_compute_us"] = round(low_ns[k] / 1000.0, 3)
        if attention[k]:  # only where there is one: other jobs' summaries stay as they were
            entry["forward_attention_kernels"] = attention[k]
        entry["first_ns"] = first_ns
        entry["backward_launch_ns"] = backward_launch[k]
        entries.append(entry)
    return entries


def _lane_extreme(ufunc: np.ufunc, values: np.ndarray, lane: np.ndarray, mask: np.ndarray,
                  n: int) -> list[int | None]:
    """``ufunc`` (np.minimum, np.maximum) of ``values[mask]`` in each lane; None where it has none."""
    rows = np.flatnonzero(mask)
    out: list[int | None] = [None] * n
    if len(rows):
        bounds = _group_bounds(lane[rows])
        for k, value in zip(lane[rows[bounds[:-1]]].tolist(), ufunc.reduceat(values[rows], bounds[:-1]).tolist()):
            out[k] = value
    return out


def _low_precision(strings: list[str], gpu: GpuEvents, compute: np.ndarray) -> np.ndarray:
    """The compute kernels whose names say bf16/fp16 (each distinct name judged once)."""
    return _named(strings, gpu, compute, _is_low_precision)


def _named(strings: list[str], gpu: GpuEvents, rows: np.ndarray, test) -> np.ndarray:
    """The rows (a mask) whose kernel name passes ``test`` (each distinct name judged once)."""
    names = gpu.name[rows]
    found = np.zeros(len(gpu), dtype=bool)
    if len(names):
        passing = [i for i in arrays.unique(names).tolist() if test(strings[i])]
        found[np.flatnonzero(rows)[np.isin(names, passing)]] = True
    return found
