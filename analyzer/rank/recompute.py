"""Activation checkpointing of one rank: forward ops re-run inside backward, and its frames.

A checkpointed block saves only its input in forward and runs its forward again in backward
(``torch.utils.checkpoint``, ``checkpoint_wrapper``; docs/models.md §9). The trace shows it as
forward-only ops (``aten::linear``, a forward attention kernel, ``aten::convolution``; backward
uses ``aten::mm`` and the ``*_backward`` ops) whose CPU point lies in backward, and, with the
reentrant implementation, as ``CheckpointFunction`` autograd functions. Their time per step:
the GPU time of the kernels those ops launched (the host time spent in them on a CPU-only
trace), which is what recomputation costs the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analyzer.base import intervals as iv
from analyzer.ingest.shapes import ATTENTION_OPS
from analyzer.ingest.trace import GpuEvents, GpuKind, RankTrace
from analyzer.rank.flops import kernel_owner
from analyzer.rank.timeline import BACKWARD, NO_STEP, locate

FORWARD_ONLY = frozenset(("aten::linear", "aten::convolution", "aten::_convolution")
                         + tuple(op for op in ATTENTION_OPS if "backward" not in op))


def recompute(trace: RankTrace, gpu: GpuEvents, launch_ts: np.ndarray, launch_thread: np.ndarray) -> dict[str, Any]:
    """``{"forward_ops_in_backward", "frames", "steps": {step: {"gpu_us", "host_us", "ops"}}}``."""
    ops = trace.shape_ops
    frames = _frames(trace)
    if not len(ops):
        return {"forward_ops_in_backward": 0, "frames": frames, "steps": {}}
    forward = np.array([name in FORWARD_ONLY for name in ops.names] or [False], dtype=bool)
    rows = np.flatnonzero(forward[ops.name]) if len(ops.names) else np.empty(0, np.int64)
    step, phase = locate(trace, ops.ts[rows], ops.thread[rows])
    inside = (phase == BACKWARD) & (step != NO_STEP)
    rows, step = rows[inside], step[inside]
    compute = np.flatnonzero(gpu.kind == GpuKind.COMPUTE)
    owner = kernel_owner(ops, rows, launch_ts[compute], launch_thread[compute]) if len(rows) else np.empty(0, np.int64)
    owned = owner >= 0
    gpu_ns = np.bincount(owner[owned], weights=(gpu.end[compute][owned] - gpu.ts[compute][owned]).astype(np.float64),
                         minlength=len(rows)) if owned.any() else np.zeros(len(rows))
    steps = {}
    for number in np.unique(step).tolist():
        mine = step == number
        chosen = rows[mine]
        host = sum(iv.total(iv.union(ops.ts[chosen][ops.thread[chosen] == t], ops.end[chosen][ops.thread[chosen] == t]))
                   for t in np.unique(ops.thread[chosen]).tolist())
        steps[str(number)] = {"ops": int(mine.sum()), "gpu_us": round(float(gpu_ns[mine].sum()) / 1000.0, 3),
                              "host_us": round(host / 1000.0, 3)}
    return {"forward_ops_in_backward": int(len(rows)), "frames": frames, "steps": steps}


def _frames(trace: RankTrace) -> int:
    """Ranges naming a checkpoint (``CheckpointFunction``, ``checkpoint_wrapper``, a user's
    ``record_function("checkpoint...")``), counted once per distinct name."""
    names, counts = np.unique(trace.markers.name, return_counts=True)
    return int(sum(n for i, n in zip(names.tolist(), counts.tolist()) if "checkpoint" in trace.strings[i].lower()))
