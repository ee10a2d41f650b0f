"""Name-based classification of events. Documented defaults, overridable by the caller.

Each function runs once per *unique* name (results are cached), never once per event.
"""

from __future__ import annotations

import re
from functools import lru_cache

from analyzer.base.limits import MAX_STEP
from analyzer.ingest.catalog import DEFAULT_COMM_PATTERN
from analyzer.ingest.trace import GpuKind, Marker

GPU_ACTIVITY_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "runtime"})
CPU_OP_CATS = frozenset({"cpu_op", "user_annotation", "cpu_instant_event"})
ANNOTATION_CAT = "user_annotation"  # record_function ranges
# The categories of host ops whose lengths tell a descheduled host (analyzer.ingest.hostops).
HOST_OP_CATS = frozenset({"cpu_op"}) | LAUNCH_CATS
# Kineto's flow arrows from a runtime launch to the GPU work it launched (counted, not read).
FLOW_CATS = frozenset({"ac2g"})

__all__ = ["DEFAULT_COMM_PATTERN", "KernelClassifier"]  # communication: analyzer.ingest.catalog


# A kernel name is matched over its first characters: its library and collective lead it, and a
# user's pattern (analyzer.base.config.backtracking_risk) then costs at most quadratic in these.
MATCHED_CHARS = 4096


class KernelClassifier:
    def __init__(self, comm_pattern: str = DEFAULT_COMM_PATTERN):
        self._comm = re.compile(comm_pattern, re.IGNORECASE)
        self._cache: dict[tuple[str, str], int] = {}

    def __call__(self, cat: str, name: str) -> int:
        key = (cat, name)
        kind = self._cache.get(key)
        if kind is None:
            kind = self._cache[key] = int(self._classify(cat, name))
        return kind

    def _classify(self, cat: str, name: str) -> GpuKind:
        if cat in ("gpu_memcpy", "gpu_memset"):
            return GpuKind.MEMORY
        if cat == "cuda_sync":
            return GpuKind.SYNC
        if self._comm.search(name, 0, MATCHED_CHARS):
            return GpuKind.COMM
        if name.startswith(("Memcpy", "Memset")):
            return GpuKind.MEMORY
        return GpuKind.COMPUTE


# Host calls that block until the device has drained (runtime/driver calls and the ATen ops that
# copy a scalar back): while the host sits in one, it queues no work, so the GPU idles after it.
HOST_SYNC_NAMES = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
    "cuMemcpyDtoH_v2", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
    "hipMemcpy", "aten::item", "aten::_local_scalar_dense",
})
_INPUT_PREFIXES = ("enumerate(DataLoader)", "enumerate(DataPipe)")

_FSDP_FQN = re.compile(r"^FSDP::[\w.]+ \((.*)\)$")
# A job's own ranges of its passes: a schedule's forward / backward step (Megatron-style
# "forward_step", "backward-compute"...), and ranges suffixed with the pass they run in, as
# DeepEP-style MoE layers annotate theirs ("dispatch(F)", "combine(B)").
_PASS_RANGE = re.compile(r"^(forward|backward)(?:[_\- ](?:step|compute|pass))?$", re.IGNORECASE)
_PASS_SUFFIX = re.compile(r"^[\w.:\-]+\(([FB])\)$")
_PIPELINE_ACTION = re.compile(r"^(?:Forward|Backward) \d+$")

# Framework markers of parallelism (CPU op names: autograd Functions record their class name,
# their backward "autograd::engine::evaluate_function: <Name>Backward"), by family.
# Megatron-LM core/tensor_parallel (mappings.py, cross_entropy.py, layers.py) and
# transformer/moe (fused_a2a.py, token_dispatcher.py); torch.distributed.pipelining schedules
# ("Forward i" / "Backward i", "PP:<action>"); DTensor's to/from-local and redistribute autograd
# functions (tensor parallelism; FSDP2 alone records none); DeepEP-style MoE dispatch/combine.
FRAMEWORK_MARKERS = (
    ("megatron_tp", re.compile(r"_(?:CopyTo|ReduceFrom|ScatterTo|GatherFrom)ModelParallelRegion"
                               r"|LinearWithGradAccumulationAndAsyncCommunication")),
    ("megatron_sp", re.compile(r"_(?:ScatterTo|GatherFrom|ReduceScatterTo|AllGatherFrom)SequenceParallelRegion")),
    ("megatron_vocab", re.compile(r"_VocabParallelCrossEntropy")),
    ("dtensor", re.compile(r"^(?:autograd::engine::evaluate_function: )?(?:_FromTorchTensor|_ToTorchTensor|Redistribute)"
                           r"(?:Backward)?$")),
    ("pipeline", re.compile(r"^(?:Forward|Backward) \d+$|^PP:")),
    ("expert", re.compile(r"Fused(?:Dispatch|Combine)|TokenDispatcher"
                          r"|(?:^|[.: ])(?:moe_)?(?:dispatch|combine)(?:\([FB]\))?$", re.IGNORECASE)),
)


@lru_cache(maxsize=65536)
def framework_marker(name: str) -> str | None:
    """The parallelism family a CPU op name marks (see FRAMEWORK_MARKERS), or None."""
    body = name.split("evaluate_function: ", 1)[-1]
    for family, pattern in FRAMEWORK_MARKERS:
        if pattern.search(body):
            return family
    return None


@lru_cache(maxsize=65536)
def marker_kind(name: str) -> int | None:
    """Marker kind of a CPU op name, or None when the op tells nothing about phase or step."""
    if name.startswith("ProfilerStep#"):
        return Marker.STEP
    if name == "record_param_comms":
        return Marker.COMM_PARAMS
    if name.startswith(("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")):
        return Marker.COMM_OP
    if name.startswith("autograd::engine::evaluate_function"):
        return Marker.BACKWARD  # framework markers among them are counted from the names
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return Marker.OPTIMIZER
    if name in HOST_SYNC_NAMES:
        return Marker.HOST_SYNC
    if name.startswith(_INPUT_PREFIXES):
        return Marker.HOST_INPUT
    lowered = name.lower()
    if name.startswith("FSDP::"):
        if _FSDP_FQN.match(name) and "backward" not in lowered and "forward" not in lowered:
            return Marker.FSDP_UNIT
        if "backward" in lowered:
            return Marker.BACKWARD
        if "forward" in lowered:
            return Marker.FORWARD
        return None
    if name.startswith("FullyShardedDataParallel."):
        if "backward" in lowered:
            return Marker.BACKWARD
        if "forward" in lowered:
            return Marker.FORWARD
        return None
    if name in ("DistributedDataParallel.forward", "## forward ##"):
        return Marker.FORWARD
    if _PIPELINE_ACTION.match(name):  # torch.distributed.pipelining's GPipe / 1F1B ranges
        return Marker.FORWARD if name[0] == "F" else Marker.BACKWARD
    if name == "## backward ##":
        return Marker.BACKWARD
    named = _PASS_RANGE.match(name)
    if named:
        return Marker.FORWARD if named.group(1).lower() == "forward" else Marker.BACKWARD
    suffixed = _PASS_SUFFIX.match(name)
    if suffixed:
        return Marker.FORWARD if suffixed.group(1) == "F" else Marker.BACKWARD
    if name.startswith("## optimizer"):
        return Marker.OPTIMIZER
    if framework_marker(name):
        return Marker.FRAMEWORK
    return None


def fsdp_module_of(name: str) -> str | None:
    """The module fqn in an FSDP2 annotation such as ``FSDP::all_gather (layers.3)``."""
    match = _FSDP_FQN.match(name)
    return match.group(1) if match else None


def step_number(name: str) -> int | None:
    """N of ``ProfilerStep#N``; None when N is no number, or one no step can have (negative, or
    beyond ``MAX_STEP``: such a marker is left out, and the ingest says so)."""
    try:
        number = int(name.split("#", 1)[1])
    except (IndexError, ValueError):
        return None
    return number if 0 <= number <= MAX_STEP else None
