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
# Runtime / driver calls that launch device work: CUDA's, HIP's, and the other backends Kineto
# records (Intel XPU, MTIA, PrivateUse1 devices), whose kernels are "kernel" events as CUDA's.
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "runtime", "xpu_runtime", "xpu_driver",
                         "mtia_runtime", "privateuse1_runtime", "privateuse1_driver"})
CPU_OP_CATS = frozenset({"cpu_op", "user_annotation", "cpu_instant_event"})
ANNOTATION_CAT = "user_annotation"  # record_function ranges
# The categories of host ops whose lengths tell a descheduled host (analyzer.ingest.hostops).
HOST_OP_CATS = frozenset({"cpu_op"}) | LAUNCH_CATS
# Kineto's flow arrows from a runtime launch to the GPU work it launched (counted, not read).
FLOW_CATS = frozenset({"ac2g"})
# The categories Kineto wrote up to PyTorch 1.9 (2021), read as today's. "Operator" held both the
# ATen ops and the record_function ranges (ProfilerStep#N, the DataLoader, the optimizer):
# OPERATOR_CAT is split by name (operator_category), once per distinct name.
OPERATOR_CAT = "Operator"
LEGACY_CATS = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime",
               "async": "ac2g"}
# Categories tracecliff knows and does not read (no device work it measures lies in them): an
# unknown category whose events look like device work is named in a warning (columns.py).
IGNORED_CATS = frozenset({"python_function", "gpu_user_annotation", "Trace", "fwdbwd", "overhead",
                          "external_correlation", "cuda_profiler_range", "mtia_ccp_events"})


# The record_function ranges the frameworks open (today's user_annotation), by prefix.
_FRAMEWORK_RANGES = ("DistributedDataParallel.", "FullyShardedDataParallel.", "FSDP::", "## ")


@lru_cache(maxsize=65536)
def operator_category(name: object) -> str:
    """Today's category of an old "Operator" event: record_function ranges carry a '#'
    (``ProfilerStep#5``, ``Optimizer.step#SGD.step``, ``enumerate(DataLoader)#...``) or are a
    framework's own (``_FRAMEWORK_RANGES``); the ATen ops (``aten::conv2d``) and autograd nodes
    (``CudnnConvolutionBackward``) are ``cpu_op``. A user's own range without '#' is read as an
    op: it still marks what its name marks, only it is no candidate step annotation."""
    if isinstance(name, str) and ("#" in name or name.startswith(_FRAMEWORK_RANGES)):
        return ANNOTATION_CAT
    return "cpu_op"

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
# The device allocator's own calls, made by the host outside the caching allocator's pool (it
# disabled: PYTORCH_NO_CUDA_MEMORY_CACHING=1; torch.cuda.empty_cache, which frees the cached
# blocks; the pool's retry after a failed allocation, which frees them and allocates again: both
# show as these calls, with_stack's Python frames being no CPU op): each free of device or
# pinned memory implicitly synchronizes the device, and an allocation costs host time the GPU
# waits through. The stream-ordered cudaMallocAsync / cudaFreeAsync are neither, and not here;
# "torch.cuda.empty_cache" is a user's own record_function of that name.
HOST_ALLOC_NAMES = frozenset({
    "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost", "cudaMallocManaged",
    "cudaHostRegister", "cudaHostUnregister", "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2",
    "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemHostAlloc", "cuMemFreeHost", "cuMemAllocManaged",
    "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree", "hipFreeHost", "hipMallocHost", "hipMallocManaged",
    "hipExtMallocWithFlags", "hipHostRegister", "hipHostUnregister", "torch.cuda.empty_cache",
})
_INPUT_PREFIXES = ("enumerate(DataLoader)", "enumerate(DataPipe)")
# Autograd's nodes by their bare names, as PyTorch <= 1.9 records the backward ("AddmmBackward",
# "MeanBackward1", "torch::autograd::AccumulateGrad") and as newer ones record a node's own range
# inside its evaluate_function ("CompiledFunctionBackward"): CamelCase, no spaces (aten's
# "aten::addmm_backward" ops and schedules' "Backward 3" ranges are not these).
_AUTOGRAD_NODE = re.compile(r"^(?:[A-Za-z_][\w:]*Backward\d*|torch::autograd::(?:AccumulateGrad|CopyBackwards|GraphRoot))$")
# Ops that launch collectives outside c10d's backends, naming the collective: PyTorch's
# symmetric memory (symm_mem::multimem_all_reduce_, one_shot_all_reduce, two_shot_all_reduce_...),
# vLLM's / SGLang's custom all-reduce (vllm::all_reduce, _C_custom_ar::all_reduce,
# sgl_kernel::all_reduce), TensorRT-LLM's (trtllm::allreduce). Their kernels take kind (and,
# for symm_mem, group) from them (analyzer.rank.comms).
_LAUNCHING_COMM_OP = re.compile(r"^(?:symm_mem|vllm|_C_custom_ar|sgl_kernel|trtllm)::\w*?"
                                r"(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast)", re.IGNORECASE)

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
    if name.startswith(("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")) or launching_comm_op(name):
        return Marker.COMM_OP
    if name.startswith("autograd::engine::evaluate_function"):
        return Marker.BACKWARD  # framework markers among them are counted from the names
    if _AUTOGRAD_NODE.match(name):  # a node by its bare name (PyTorch <= 1.9; a node's own range)
        return Marker.BACKWARD
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return Marker.OPTIMIZER
    if name in HOST_SYNC_NAMES:
        return Marker.HOST_SYNC
    if name in HOST_ALLOC_NAMES:
        return Marker.HOST_ALLOC
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
    # torch.compile: AOTAutograd's forward ("CompiledFunction", its backward an autograd node,
    # "…evaluate_function: CompiledFunctionBackward") inside dynamo's "Torch-Compiled Region: i/j"
    # (in a backward or an optimizer step, their markers come first: analyzer.rank.timeline)
    if name == "CompiledFunction" or name.startswith("Torch-Compiled Region"):
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


def launching_comm_op(name: str) -> bool:
    """Whether a CPU op launches a collective outside c10d's backends and names it
    (``_LAUNCHING_COMM_OP``): every kernel it launches is that collective's."""
    return _LAUNCHING_COMM_OP.match(name) is not None


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
