"""Training-step programs: DDP and FSDP (FSDP1 / FSDP2 annotation names) on the Engine.

Record-function names are those of torch 2.13: nn/parallel/distributed.py
("DistributedDataParallel.forward"), distributed/fsdp/_runtime_utils.py and
fully_sharded_data_parallel.py (FSDP1 "FullyShardedDataParallel.*"),
distributed/fsdp/_fully_shard/_fsdp_state.py and _fsdp_param_group.py (FSDP2 "FSDP::* (fqn)").
Collective op names are those of ProcessGroupNCCL (c10d::allreduce_ / _allgather_base_ /
_reduce_scatter_base_, record_param_comms "Collective name", "nccl:*" annotations).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from .compute import COMPUTE_STREAM, Compute
from .engine import CollectiveCall, Engine, GpuEvent
from .layout import Param, Unit, ddp_buckets, fsdp_units, model_params, process_groups
from .physics import ALLGATHER, ALLREDUCE, ALLTOALL, REDUCE_SCATTER, memory_us, ring_time_us
from .spec import DTYPE_BYTES, NCCL_DTYPE_NAME, JobSpec

T0_NS = 3_600_000_000_000  # the first step starts one hour after baseTimeNanoseconds
STEP_GAP_US = 30.0  # profiler step bookkeeping between ProfilerStep ranges
DDP_NCCL_STREAM, FSDP_NCCL_STREAM, REPLICATE_NCCL_STREAM, FSDP2_COPY_STREAM = 40, 20, 24, 20
INPUT_STREAM = 28  # the prefetching thread's copy stream

COLLECTIVE_OPS = {  # kind -> (c10d op, record_param_comms "Collective name", nccl annotation)
    ALLREDUCE: ("c10d::allreduce_", "allreduce", "nccl:all_reduce"),
    ALLGATHER: ("c10d::_allgather_base_", "_allgather_base", "nccl:_all_gather_base"),
    REDUCE_SCATTER: ("c10d::_reduce_scatter_base_", "_reduce_scatter_base", "nccl:_reduce_scatter_base"),
    ALLTOALL: ("c10d::alltoall_base_", "all_to_all", "nccl:all_to_all"),
}
# tp_allreduce_impl -> (the launching op, its kernel, the library tracecliff names it by, the
# kernel's element type by dtype)
CUSTOM_ALLREDUCE = {
    "symm_mem": ("symm_mem::multimem_all_reduce_",
                 "void c10d::symmetric_memory::multimem_all_reduce_kernel<{dtype}, 16, {n}>({dtype}*, unsigned long, "
                 "unsigned long, unsigned int**, unsigned long, unsigned long)", "symm_mem",
                 {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp32": "float"}),
    "custom_ar": ("vllm::all_reduce",
                  "void vllm::cross_device_reduce_1stage<{dtype}, {n}>(vllm::RankData*, vllm::RankSignals, "
                  "vllm::Signal*, {dtype}*, int, int)", "custom_allreduce",
                  {"bf16": "__nv_bfloat16", "fp16": "half", "fp32": "float"}),
}
RECORDED_TYPE = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp32": "float"}  # record_shapes' Input type
DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
ACCUMULATE_GRAD = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
SPLIT_COPY = (
    "void at::native::(anonymous namespace)::split_with_sizes_copy_out_contiguous_no_cast_kernel<unsigned char>("
    "char**, char**, long const*, long const*, long const*, long const*, long const*, long, long, long)"
)
COPY_IN = (
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::"
    "OpaqueType<2u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::OpaqueType<2u>*, "
    "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::"
    "OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, "
    "4u>, int, unsigned int)"
)
CHUNK_CAT = (
    "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<c10::BFloat16, c10::BFloat16>(c10::BFloat16**, "
    "c10::BFloat16*, long*, long*, long*, long*, long, long, long, long)"
)


def nccl_kernel_name(kind: str, dtype: str) -> str:
    if kind == ALLTOALL:  # NCCL runs all-to-all as grouped send/recv
        return "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    op = {ALLREDUCE: f"AllReduce_Sum_{NCCL_DTYPE_NAME[dtype]}", ALLGATHER: "AllGather",
          REDUCE_SCATTER: f"ReduceScatter_Sum_{NCCL_DTYPE_NAME[dtype]}"}[kind]
    return f"ncclDevKernel_{op}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


class Program:
    """Common step skeleton; subclasses provide forward, backward and the optimizer's share."""

    comm_stream = DDP_NCCL_STREAM

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.eng = Engine(spec.world_size, spec.seed, spec.noise, spec.launch_overhead_us, spec.cpu_op_overhead_us)
        self.eng.contention_us, self.eng.contention_every = spec.host_contention_us, spec.host_contention_every
        self.compute = Compute(self.eng, spec)
        self.groups = process_groups(spec)
        roles = ["world"] + [role for role in ("shard", "replicate") if getattr(self.groups, role)]
        self.labels = {role: np.array(self.groups.labels(role, spec.world_size)) for role in roles}
        self.step_ranges: dict[int, object] = {}
        self.batch_ready: np.ndarray | None = None  # when the prefetched batch is on the GPU

    def run(self) -> "Program":
        skew = self.eng.rng.uniform(0, self.spec.start_skew_us * 1e3, self.spec.world_size)
        self.eng.cpu["main"] = T0_NS + np.rint(skew).astype(np.int64)
        for k in range(self.spec.steps):
            self.run_step(self.spec.first_step + k)
        self.number_collectives()
        return self

    def number_collectives(self) -> None:
        """ProcessGroupNCCL sequence numbers count from the group's creation: the steps before the
        profiled window ran the same collectives, after 2 at initialisation."""
        counts: dict[str, int] = {}
        for call in self.eng.collectives:
            counts[call.role] = counts.get(call.role, 0) + 1
        base = {role: 3 + self.spec.first_step * n // self.spec.steps for role, n in counts.items()}
        for call in self.eng.collectives:
            call.seq = base[call.role] + call.seq_index

    def run_step(self, step: int) -> None:
        eng, compute = self.eng, self.compute
        eng.step, eng.phase = step, "other"
        with eng.annotation(f"ProfilerStep#{step}") as rec:
            rec.recorded = self.spec.step_marker == "profiler"
            self.step_ranges[step] = rec
            training = self.spec.workload == "training"
            if training:
                with eng.annotation("Optimizer.zero_grad#AdamW.zero_grad"):
                    pass
            stall = self.spec.stall_us(step - self.spec.first_step)
            if self.spec.host_stall_kind == "input" and (self.spec.host_stall_ranks or self.spec.host_stalls):
                self.host_stall(stall)
            if self.spec.input_copy != "pinned":
                self.prefetch_input()
            else:
                compute.copy_inputs()
            eng.phase = "forward"
            if self.spec.step_marker == "annotation":  # a benchmark's own range around each forward
                with eng.annotation(self.spec.step_annotation):
                    self.forward()
            else:
                self.forward()
            if training:
                compute.loss_forward()
            if self.spec.host_stall_kind == "sync" and any(stall):
                compute.loss_item()  # the host blocks until forward is done...
                self.host_stall(stall, "log_metrics")  # ...then works
            if self.spec.host_stall_kind == "alloc" and any(stall):
                eng.device_free(stall)  # waits for the device to drain, then frees
            if training:
                self.train_after_forward()
            eng.phase = "other"
            compute.loss_item()
        eng.advance("main", STEP_GAP_US)

    def train_after_forward(self) -> None:
        """The backward pass and the optimizer step."""
        eng = self.eng
        eng.phase = "backward"
        self.run_backward()
        eng.phase = "optimizer"
        with eng.annotation("Optimizer.step#AdamW.step") as opt:
            kernels = self.compute.optimizer_step(self.local_params())
        eng.annotate_gpu(opt.name, opt.ext, kernels)

    def forward_range(self):
        """The range the trace shows around DDP's forward (JobSpec.forward_marker), or None."""
        eng, marker = self.eng, self.spec.forward_marker
        if marker == "ddp":
            return eng.annotation("DistributedDataParallel.forward")
        if marker == "compiled":  # dynamo's region, AOTAutograd's forward inside it
            return _nested(eng.op("Torch-Compiled Region: 0/0"), eng.op("CompiledFunction"))
        return None

    def prefetch_input(self) -> None:
        """The compute stream waits for this step's batch (prefetched during the previous step;
        the first was ready before the profile), then the prefetching thread starts copying the
        next one from pageable memory on its own stream."""
        eng, spec = self.eng, self.spec
        if self.batch_ready is not None:
            eng.wait_event(COMPUTE_STREAM, self.batch_ready)
        eng.cpu["loader"] = np.maximum(eng.cpu["loader"], eng.cpu["main"])
        nbytes = spec.input_mb * 2**20
        with eng.op("aten::to", "loader"), eng.op("aten::_to_copy", "loader"), eng.op("aten::copy_", "loader"):
            if spec.input_copy == "pageable_prefetch":
                copy = eng.copy_from_pageable("Memcpy HtoD (Pageable -> Device)", INPUT_STREAM, nbytes,
                                              spec.host_copy_gbps, spec.pcie_gbps, "loader")
            else:  # pinned memory, non_blocking=True: a DMA that starts once the stream is free
                copy = eng.launch("Memcpy HtoD (Pinned -> Device)", INPUT_STREAM,
                                  eng.jitter_ns(2.0 + nbytes / (spec.pcie_gbps * 1e3)), "loader", kind="memory",
                                  cat="gpu_memcpy", args={"bytes": int(nbytes)})
        eng.record_event(INPUT_STREAM, "loader")
        self.batch_ready = copy.start + copy.dur

    def host_stall(self, stall_us: list[float], name: str = DATALOADER) -> None:
        """A CPU range of the main thread lasting ``stall_us`` (per rank) plus its overhead (the
        truth finds it by name)."""
        with self.eng.annotation(name):
            self.eng.advance("main", np.asarray(stall_us, dtype=float))

    def run_backward(self) -> None:
        """loss.backward(): the autograd thread runs the graph while the main thread waits."""
        eng = self.eng
        eng.cpu["autograd"] = eng.cpu["main"] + 5_000
        self.backward()
        eng.cpu["main"] = eng.cpu["autograd"] + 3_000

    # ---- collectives ------------------------------------------------------------------------
    def collective(self, kind: str, dtype: str, nelems: int, role: str, stream: int, thread: str,
                   ready: np.ndarray, tag: dict) -> GpuEvent | None:
        """Issue one collective as torch does: c10d op > record_param_comms (> stream wait)
        > nccl:* annotation > cudaLaunchKernelExC. nelems: the full (unsharded) element count."""
        group = self.groups.of(role, 0)  # all groups of one role have the same size and link
        n = group.size
        if n <= 1:
            return None
        in_n, out_n = {ALLREDUCE: (nelems, nelems), ALLTOALL: (nelems, nelems), ALLGATHER: (nelems // n, nelems),
                       REDUCE_SCATTER: (nelems, nelems // n)}[kind]
        size = nelems * DTYPE_BYTES[dtype]
        contention = 1 + self.spec.noise * abs(self.eng.rng.standard_normal())  # never faster than the model
        transfer_us = ring_time_us(kind, size, n, self._link(group)) * contention
        c10d_op, coll_name, annotation = COLLECTIVE_OPS[kind]
        impl = self.spec.tp_allreduce_impl if kind == ALLREDUCE and "tp" in tag else "nccl"
        if impl != "nccl":
            tag = {**tag, "library": CUSTOM_ALLREDUCE[impl][2]}
        call = CollectiveCall(kind, coll_name, dtype, in_n, out_n, size, role, int(round(transfer_us * 1e3)),
                              ready=ready, labels=self.labels[role], tag=tag)
        eng = self.eng
        if impl != "nccl":
            return self.custom_allreduce(impl, call, n, stream, thread)
        with eng.op(c10d_op, thread), eng.op("record_param_comms", thread) as rpc:
            rpc.comm = call
            eng.depend_on(COMPUTE_STREAM, thread)  # ProcessGroupNCCL syncStream; `ready` holds its time
            with eng.annotation(annotation, thread) as ann:
                kernel = eng.collective(nccl_kernel_name(kind, dtype), stream, call, thread)
        eng.annotate_gpu(annotation, ann.ext, [kernel])
        return kernel

    def custom_allreduce(self, impl: str, call: CollectiveCall, n: int, stream: int, thread: str) -> GpuEvent:
        """An all-reduce outside c10d's backends (tp_allreduce_impl): the op that launches it
        names it (with its recorded shapes when record_shapes is on), no record_param_comms."""
        op, kernel, _, types = CUSTOM_ALLREDUCE[impl]
        shapes = {"Input Dims": [[call.in_nelems]], "Input type": [RECORDED_TYPE[call.dtype]]} \
            if self.spec.record_shapes else {}
        with self.eng.op(op, thread, args=shapes):
            self.eng.depend_on(COMPUTE_STREAM, thread)
            return self.eng.collective(kernel.format(dtype=types[call.dtype], n=n), stream, call, thread)

    def _link(self, group: Any) -> Any:
        """The group's link, at the slow link's pace when the group's ring runs through it (all
        the groups of one role share one call: the slow rank's group sets it, as in one
        data-parallel group)."""
        spec = self.spec
        if spec.slow_link_rank is None or spec.slow_link_gbps <= 0.0:
            return group.link
        return replace(group.link, beta_gbps=min(group.link.beta_gbps, spec.slow_link_gbps))

    def local_params(self) -> float:
        raise NotImplementedError

    def forward(self) -> None:
        raise NotImplementedError

    def backward(self) -> None:
        raise NotImplementedError


class DdpProgram(Program):
    comm_stream = DDP_NCCL_STREAM

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.buckets = ddp_buckets(spec)
        self.bucket_of = {name: b.index for b in self.buckets for name in b.params}
        self.params = model_params(spec)

    def local_params(self) -> float:
        return float(sum(p.numel for p in self.params))

    def forward(self) -> None:
        eng, compute = self.eng, self.compute
        first = len(eng.gpu)
        self.embedding_alltoall("main")
        around = self.forward_range()
        with around or nullcontext() as ann:
            if self.spec.forward_marker == "ddp":
                ann.recorded = self.spec.step_marker != "optimizer"
            compute.embed_forward()
            for _ in range(self.spec.n_layers):
                compute.layer_forward(self.tp_allreduce)
                self.blocking_collective(ALLREDUCE, self.spec.forward_allreduce_mb, "main", {"tp": "forward"})
            compute.head_forward()
        if around is not None:
            eng.annotate_gpu(ann.name, ann.ext, [e for e in eng.gpu[first:] if e.stream == COMPUTE_STREAM])

    def backward(self) -> None:
        compute = self.compute
        self.pending = {b.index: len(b.params) for b in self.buckets}
        self.ends: list[np.ndarray] = []
        compute.loss_backward()
        compute.head_backward(self.grads_ready)
        for i in reversed(range(self.spec.n_layers)):
            compute.layer_backward(i, self.grads_ready, self.tp_allreduce)
        compute.embed_backward(self.grads_ready)
        self.embedding_alltoall("autograd")  # the sparse gradients go back to their shards
        # Reducer::finalize_backward: the compute stream waits for every bucket's all-reduce
        if self.ends:
            self.eng.wait_event(COMPUTE_STREAM, np.max(self.ends, axis=0), "autograd")

    def embedding_alltoall(self, thread: str) -> None:
        """Sharded embeddings: each rank's looked-up rows (forward) or their gradients (backward)
        go to their owners in one all-to-all that the dense compute then waits for."""
        self.blocking_collective(ALLTOALL, self.spec.embedding_alltoall_mb, thread, {"embedding": self.eng.phase})

    def blocking_collective(self, kind: str, mb: float, thread: str, tag: dict) -> None:
        """A collective of ``mb`` MiB over the world group after the compute so far, which the
        compute stream then waits for (nothing when ``mb`` is 0)."""
        if mb <= 0:
            return
        nelems = int(mb * 2**20) // DTYPE_BYTES[self.spec.param_dtype]
        ready = self.eng.stream_tail(COMPUTE_STREAM).copy()
        kernel = self.collective(kind, self.spec.param_dtype, nelems, "world", self.comm_stream, thread, ready, tag)
        if kernel is not None:
            self.eng.wait_event(COMPUTE_STREAM, kernel.start + kernel.dur, thread)

    def tp_allreduce(self, thread: str) -> None:
        """A tensor-parallel all-reduce after a block's attention or MLP part (tp_allreduce_mb)."""
        phase = "forward" if thread == "main" else "backward"
        self.blocking_collective(ALLREDUCE, self.spec.tp_allreduce_mb, thread, {"tp": phase})

    def grads_ready(self, params: list[Param], thread: str) -> None:
        """DDP's autograd hook: mark each gradient ready; launch a bucket once it is full (or,
        unbucketed, all-reduce the gradient at once and wait for it)."""
        for p in params:
            if self.spec.sync_param_allreduce:
                with self.eng.op(ACCUMULATE_GRAD, thread):
                    ready = self.eng.stream_tail(COMPUTE_STREAM).copy()
                    self.collective(ALLREDUCE, self.spec.grad_dtype, p.numel, "world", self.comm_stream, thread,
                                    ready, {"param": p.name})
                    self.eng.synchronize(self.comm_stream, thread)
                continue
            with self.eng.op(ACCUMULATE_GRAD, thread):
                b = self.bucket_of[p.name]
                self.pending[b] -= 1
                if self.pending[b] == 0:
                    self.launch_bucket(b, thread)

    def launch_bucket(self, b: int, thread: str) -> None:
        bucket = self.buckets[b]
        ready = self.eng.stream_tail(COMPUTE_STREAM).copy()  # the bucket's last gradient
        kernel = self.collective(ALLREDUCE, self.spec.grad_dtype, bucket.numel, "world", self.comm_stream,
                                 thread, ready, {"bucket": b})
        if kernel is not None:
            self.ends.append(kernel.start + kernel.dur)


class FsdpNames:
    """Record-function names of FSDP1 (FullyShardedDataParallel.*) or FSDP2 (FSDP::* (fqn))."""

    def __init__(self, fsdp2: bool):
        self.fsdp2 = fsdp2

    @staticmethod
    def with_fqn(label: str, fqn: str) -> str:  # FSDPParamGroup._with_fqn
        return f"{label} ({fqn})" if fqn else label

    @property
    def root_pre_forward(self) -> str:
        return "FSDP::root_pre_forward" if self.fsdp2 else "FullyShardedDataParallel._root_pre_forward"

    def pre_forward(self, fqn: str) -> str:
        return self.with_fqn("FSDP::pre_forward", fqn) if self.fsdp2 else "FullyShardedDataParallel._pre_forward"

    def post_forward(self, fqn: str) -> str:
        return self.with_fqn("FSDP::post_forward", fqn) if self.fsdp2 else "FullyShardedDataParallel._post_forward"

    def pre_backward(self, fqn: str) -> str:
        return self.with_fqn("FSDP::pre_backward", fqn) if self.fsdp2 else "FullyShardedDataParallel._pre_backward_hook"

    def prefetch(self, pass_type: str, target_fqn: str) -> str:
        if self.fsdp2:
            return f"FSDP::{pass_type}_prefetch for {target_fqn}"
        return f"FullyShardedDataParallel._pre_{pass_type}_prefetch"

    def post_backward(self, fqn: str) -> str:
        if self.fsdp2:
            return self.with_fqn("FSDP::post_backward_reduce", fqn)
        return "FullyShardedDataParallel._post_backward_hook"


class FsdpProgram(Program):
    """FSDP units: all-gather before use (prefetched or not), reduce-scatter after backward;
    HYBRID_SHARD adds an all-reduce of each shard across the replicate group."""

    comm_stream = FSDP_NCCL_STREAM

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.fsdp2 = spec.strategy == "fsdp2"
        self.names = FsdpNames(self.fsdp2)
        self.shard_size = self.groups.of("shard", 0).size
        self.units = fsdp_units(spec, self.shard_size)
        self.per_layer = spec.fsdp_wrap == "per_layer"
        # the root is never resharded after forward (FSDP1 _post_forward_reshard, FSDP2 lazy init)
        self.reshard_after_forward = spec.sharding != "shard_grad_op"

    def local_params(self) -> float:
        return float(sum(u.padded_numel // self.shard_size for u in self.units))

    def layer_unit(self, i: int) -> Unit | None:
        return self.units[1 + i] if self.per_layer and 0 <= i < self.spec.n_layers else None

    # ---- all-gather / reduce-scatter ------------------------------------------------------
    def all_gather(self, unit: Unit, thread: str, pass_type: str) -> None:
        eng = self.eng
        label = self.names.with_fqn("FSDP::all_gather", unit.fqn)
        ready = eng.stream_tail(COMPUTE_STREAM).copy()  # the stream's work enqueued so far
        with eng.annotation(label, thread) if self.fsdp2 else nullcontext():
            if self.fsdp2:
                with eng.op("fsdp::all_gather_copy_in", thread):
                    nbytes = 4.0 * unit.padded_numel // self.shard_size
                    self.copy_kernel(COPY_IN, nbytes, FSDP2_COPY_STREAM, thread, after=ready)
            kernel = self.collective(ALLGATHER, self.spec.param_dtype, unit.padded_numel, "shard", self.comm_stream,
                                     thread, ready, {"unit": unit.index, "pass": pass_type})
        self.gathered[unit.index] = kernel.start + kernel.dur if kernel is not None else ready

    def wait_for_unshard(self, unit: Unit, thread: str) -> None:
        """The compute stream waits for the unit's all-gather (FSDP2 also copies out)."""
        eng = self.eng
        eng.wait_event(COMPUTE_STREAM, self.gathered[unit.index], thread)
        if self.fsdp2:
            with eng.annotation(self.names.with_fqn("FSDP::all_gather_copy_out", unit.fqn), thread):
                with eng.op("fsdp::split_with_sizes_copy", thread):
                    self.copy_kernel(SPLIT_COPY, 4.0 * unit.padded_numel, COMPUTE_STREAM, thread)

    def copy_kernel(self, name: str, nbytes: float, stream: int, thread: str, after=None) -> GpuEvent:
        dur = self.eng.jitter_ns(max(1.5, memory_us(self.spec, nbytes)) * self.compute.slowdown)
        args = {"grid": [int(max(1, nbytes // 65536)), 1, 1], "block": [128, 1, 1], "registers per thread": 32,
                "shared memory": 0}
        return self.eng.launch(name, stream, dur, thread, args=args, after=after)

    def unshard(self, unit: Unit, thread: str, pass_type: str) -> None:
        if unit.index not in self.gathered:
            self.all_gather(unit, thread, pass_type)

    def prefetch(self, unit: Unit | None, thread: str, pass_type: str) -> None:
        enabled = self.spec.forward_prefetch if pass_type == "forward" else self.spec.backward_prefetch
        if unit is None or not enabled or unit.index in self.gathered:
            return
        with self.eng.annotation(self.names.prefetch(pass_type, unit.fqn), thread):
            self.all_gather(unit, thread, pass_type)

    def reduce(self, unit: Unit, thread: str) -> None:
        """Post-backward: reduce-scatter the unit's gradients (+ HSDP all-reduce of the shard)."""
        eng, spec = self.eng, self.spec
        with eng.annotation(self.names.post_backward(unit.fqn), thread):
            ready = eng.stream_tail(COMPUTE_STREAM).copy()
            if self.fsdp2:
                with eng.op("fsdp::chunk_cat", thread):
                    self.copy_kernel(CHUNK_CAT, 2.0 * DTYPE_BYTES[spec.grad_dtype] * unit.padded_numel,
                                     self.comm_stream, thread, after=ready)
            rs = self.collective(REDUCE_SCATTER, spec.grad_dtype, unit.padded_numel, "shard", self.comm_stream,
                                 thread, ready, {"unit": unit.index, "pass": "backward"})
            done = rs.start + rs.dur if rs is not None else ready
            if spec.sharding == "hybrid_shard":
                ar = self.collective(ALLREDUCE, spec.grad_dtype, unit.padded_numel // self.shard_size, "replicate",
                                     REPLICATE_NCCL_STREAM, thread, done, {"unit": unit.index, "pass": "backward"})
                done = ar.start + ar.dur if ar is not None else done
        self.reduced.append(done)

    # ---- passes ---------------------------------------------------------------------------
    def forward(self) -> None:
        eng, compute, root = self.eng, self.compute, self.units[0]
        self.gathered: dict[int, np.ndarray] = {}
        first = len(eng.gpu)
        outer = eng.annotation("FullyShardedDataParallel.forward") if not self.fsdp2 else nullcontext()
        with outer as ann:
            with eng.annotation(self.names.root_pre_forward):
                pass
            with eng.annotation(self.names.pre_forward(root.fqn)):
                self.unshard(root, "main", "forward")
                self.wait_for_unshard(root, "main")
                self.prefetch(self.layer_unit(0), "main", "forward")
            compute.embed_forward()
            for i in range(self.spec.n_layers):
                self.layer_forward(i)
            compute.head_forward()
            with eng.annotation(self.names.post_forward(root.fqn)):
                pass
        if ann is not None:
            eng.annotate_gpu(ann.name, ann.ext, [e for e in eng.gpu[first:] if e.stream == COMPUTE_STREAM])

    def layer_forward(self, i: int) -> None:
        eng, unit = self.eng, self.layer_unit(i)
        if unit is None:
            self.compute.layer_forward()
            return
        with eng.annotation("FullyShardedDataParallel.forward") if not self.fsdp2 else nullcontext():
            with eng.annotation(self.names.pre_forward(unit.fqn)):
                self.unshard(unit, "main", "forward")
                self.wait_for_unshard(unit, "main")
                self.prefetch(self.layer_unit(i + 1), "main", "forward")
            self.compute.layer_forward()
            with eng.annotation(self.names.post_forward(unit.fqn)):
                if self.reshard_after_forward:
                    del self.gathered[unit.index]

    def backward(self) -> None:
        eng, compute, root, a = self.eng, self.compute, self.units[0], "autograd"
        self.reduced: list[np.ndarray] = []
        with eng.annotation(self.names.pre_backward(root.fqn), a):
            self.prefetch(self.layer_unit(self.spec.n_layers - 1), a, "backward")
        compute.loss_backward()
        compute.head_backward(_ignore)
        for i in reversed(range(self.spec.n_layers)):
            unit = self.layer_unit(i)
            if unit is None:
                compute.layer_backward(i, _ignore)
                continue
            with eng.annotation(self.names.pre_backward(unit.fqn), a):
                self.unshard(unit, a, "backward")
                self.wait_for_unshard(unit, a)
                self.prefetch(self.layer_unit(i - 1), a, "backward")
            compute.layer_backward(i, _ignore)
            self.post_backward(unit)
        compute.embed_backward(_ignore)
        self.post_backward(root)
        # FSDP1 _post_backward_final_callback has no record_function; FSDP2's callback has one
        with eng.annotation("FSDP::root_post_backward_callback", a) if self.fsdp2 else nullcontext():
            eng.wait_event(COMPUTE_STREAM, np.max(self.reduced, axis=0), a)

    def post_backward(self, unit: Unit) -> None:
        node = "RegisterPostBackwardFunctionBackward" if self.fsdp2 else "torch::autograd::AccumulateGrad"
        with self.eng.op(f"autograd::engine::evaluate_function: {node}", "autograd"):
            self.reduce(unit, "autograd")


def _ignore(params: list[Param], thread: str) -> None:
    """FSDP reduces per unit in its post-backward hook, not per gradient."""


def build_program(spec: JobSpec) -> Program:
    return (DdpProgram if spec.strategy == "ddp" else FsdpProgram)(spec).run()


@contextmanager
def _nested(outer, inner):
    """Two ranges, one inside the other; yields the outer one."""
    with outer as rec, inner:
        yield rec
