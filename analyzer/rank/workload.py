"""Training or inference: what a trace shows of the job's work (issue 37 item 7).

A training step runs a backward pass and an optimizer step; inference (eager prefill / decode, a
serving engine such as vLLM or SGLang, an evaluation loop) runs forward passes only. The rank
counts the evidence of either once per distinct name (never per event): backward markers
(autograd's ``evaluate_function``, FSDP's backward hooks, a schedule's backward ranges),
optimizer markers (``Optimizer.step#`` / ``zero_grad#``), and kernels whose names say they are
backward or optimizer work (cuDNN's dgrad / wgrad, MIOpen's wrw, flash attention's bwd, a fused
Adam). The job is ``inference`` only where every rank's host side is in the trace (the model's
own CPU ops: matmuls, convolutions, attention (analyzer.ingest.shapes); launches linked to the
GPU work, not a filtered trace) and none shows any of that evidence: absence of evidence counts
only where the evidence could have been recorded.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.ingest.trace import GpuKind, Marker, RankTrace

# Kernel names of backward or optimizer work: autograd kernels (…_backward_…, softmax_backward,
# cudnn's dgrad / wgrad, MIOpen's wrw and bwd convolutions, flash attention's bwd) and fused
# optimizers (apex / torch FusedAdam, multi-tensor Adam functors).
_TRAINING_KERNEL = re.compile(r"backward|bwd|dgrad|wgrad|_wrw_|grad_input|grad_weight|adam", re.IGNORECASE)

INFERENCE_NOTE = "no backward pass and no optimizer step in the trace"
WORKLOAD_TEXT = {"training": "training (a backward pass or an optimizer step in the trace)",
                 "inference": f"inference ({INFERENCE_NOTE})"}


def workload_evidence(trace: RankTrace) -> dict[str, int]:
    """Counts for :func:`job_workload`: backward markers, training kernels (counted only where
    no backward or optimizer marker decides already: a pass over the kernel names a training
    trace need not pay), and whether the host side is there to show them (saved with the rank's
    ``markers_seen``)."""
    m, gpu = trace.markers, trace.gpu
    launches = len(trace.launches.correlation)
    filtered = trace.flow_events == 0 and trace.runtime_calls <= launches  # analyzer.rank.attribution's test
    return {
        "backward": int((m.kind == Marker.BACKWARD).sum()),
        "training_kernels": 0 if _training_markers(trace) else _training_kernels(trace),
        "host_ops": int(len(trace.shape_ops.ts)),  # the model's own CPU ops
        "linked_launches": 0 if filtered else launches,
        "compute_kernels": int((gpu.kind == GpuKind.COMPUTE).sum()),
        # graph-launched work, where no training marker decides already (inference's advice)
        "graph_kernels": 0 if _training_markers(trace) else _graph_kernels(trace),
    }


def _graph_kernels(trace: RankTrace) -> int:
    """GPU ops launched by a CUDA graph: CUPTI gives every op of a graph launch the launch call's
    correlation id, so ids shared by several ops are graph launches (analyzer.rank.attribution)."""
    corr = trace.gpu.correlation
    _, counts = np.unique(corr[corr >= 0], return_counts=True)
    return int(counts[counts > 1].sum())


def forward_only(trace: RankTrace) -> bool:
    """Whether the rank's trace holds forward passes only: the model's CPU ops are in it, and no
    backward or optimizer marker nor kernel of their work (its phases then come from that:
    analyzer.rank.timeline)."""
    return bool(len(trace.shape_ops.ts)) and not _training_markers(trace) and not _training_kernels(trace)


def _training_markers(trace: RankTrace) -> bool:
    return bool(np.isin(trace.markers.kind, (Marker.BACKWARD, Marker.OPTIMIZER)).any())


def _training_kernels(trace: RankTrace) -> int:
    """How many compute kernels are named as backward or optimizer work (each name judged once)."""
    gpu = trace.gpu
    compute = gpu.name[gpu.kind == GpuKind.COMPUTE]
    names = [i for i in arrays.unique(compute).tolist() if _TRAINING_KERNEL.search(trace.strings[i])]
    return int(np.isin(compute, names).sum()) if names else 0


def job_workload(seen: list[dict[str, Any]]) -> str | None:
    """``training``, ``inference`` or None (cannot tell) from the ranks' ``markers_seen``."""
    if not seen:
        return None
    if any(s.get("backward") or s.get("optimizer") or s.get("training_kernels") for s in seen):
        return "training"
    if all(s.get("host_ops") and s.get("linked_launches") and s.get("compute_kernels") for s in seen):
        return "inference"
    return None
