"""JobSpec: everything the synthetic generator needs to simulate one distributed training job."""

from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
TORCH_DTYPE_NAME = {"bf16": "BFloat16", "fp16": "Half", "fp32": "Float"}
NCCL_DTYPE_NAME = {"bf16": "bf16", "fp16": "f16", "fp32": "f32"}


@dataclass(frozen=True)
class GpuModel:
    """What the simulation needs to know about one GPU type (datasheet values)."""

    name: str  # deviceProperties name, as CUDA reports it
    arch: str  # kernel-name prefix: sm90 / sm80
    peak_bf16_tflops: float  # dense
    hbm_gbps: float
    total_mem_bytes: int
    num_sms: int
    compute_major: int
    shared_mem_optin: int
    shared_mem_per_sm: int
    peak_fp32_tflops: float = 0.0  # dense, non-tensor (datasheet)


GPUS = {
    "H100": GpuModel("NVIDIA H100 80GB HBM3", "sm90", 989.0, 3350.0, 85520809984, 132, 9, 232448, 233472, 67.0),
    "H200": GpuModel("NVIDIA H200", "sm90", 989.0, 4800.0, 150754820096, 132, 9, 232448, 233472, 67.0),
    "A100": GpuModel("NVIDIA A100-SXM4-80GB", "sm80", 312.0, 2039.0, 85198045184, 108, 8, 166912, 167936, 19.5),
}

STRATEGIES = ("ddp", "fsdp1", "fsdp2")
SHARDINGS = ("full_shard", "shard_grad_op", "hybrid_shard")
WRAPS = ("per_layer", "none")


@dataclass(frozen=True)
class JobSpec:
    """One data-parallel training job. Every field has a sensible default (a 1.9 B GPT on 8 H100s)."""

    name: str = "job"
    strategy: str = "ddp"  # ddp | fsdp1 | fsdp2
    world_size: int = 8
    gpus_per_node: int = 8
    steps: int = 3
    first_step: int = 5  # number of the first recorded ProfilerStep#N
    # model: a GPT block stack (pre-LN, GELU MLP), untied embedding and output head
    n_layers: int = 8
    hidden: int = 4096
    ffn_mult: int = 4
    vocab_size: int = 32000
    bias: bool = False  # linear/LayerNorm biases (many small tensors, as in GPT-2/BERT)
    seq_len: int = 2048
    micro_batch: int = 4
    head_dim: int = 128
    # compute: kernel time = work / (peak x efficiency); straggler multiplies it
    gpu: str = "H100"
    gemm_efficiency: float = 0.6
    # GEMMs smaller than this many FLOPs run further from peak: efficiency = gemm_efficiency ·
    # f / (f + gemm_half_flops), half of it at f = gemm_half_flops (0: every GEMM at gemm_efficiency)
    gemm_half_flops: float = 0.0
    gemm_dtype: str = "bf16"  # bf16 | fp32: the linears' dtype (fp32: sgemm kernels at the fp32 peak)
    # efficiency of a bf16 GEMM with a size not a multiple of 8 (tensor cores tile aligned sizes;
    # 0: as aligned ones, gemm_efficiency)
    misaligned_gemm_efficiency: float = 0.0
    attn_efficiency: float = 0.45
    mem_efficiency: float = 0.8
    optimizer_bytes_per_param: float = 28.0  # fused AdamW: fp32 master + m + v reads/writes, bf16 copy
    gpu_mem_bytes: int | None = None  # None: the GPU's own memory
    # DDP
    bucket_cap_mb: float = 25.0  # MiB, as torch
    first_bucket_mb: float = 1.0  # MiB, dist._DEFAULT_FIRST_BUCKET_BYTES
    grad_dtype: str = "bf16"  # dtype of the gradient all-reduce / reduce-scatter
    param_dtype: str = "bf16"  # dtype of the FSDP all-gather (and of DDP params)
    # sharded embeddings (DLRM / recommendation): an all-to-all of this many MiB per rank before
    # the dense forward and of the gradients after the dense backward (0: none)
    embedding_alltoall_mb: float = 0.0
    # tensor-parallel style: after each block's forward an all-reduce of this many MiB of
    # activations over the world group, which the next block waits for (0: none)
    forward_allreduce_mb: float = 0.0
    # Megatron-style tensor parallelism: an all-reduce of this many MiB over the world group after
    # attention and after the MLP in each block's forward (row-parallel outputs) and after the
    # MLP's and attention's first linear in its backward (column-parallel input gradients), each
    # waited for by the compute that follows (0: none)
    tp_allreduce_mb: float = 0.0
    # DDP replaced by a synchronous all-reduce per gradient as it becomes ready (each waited for
    # by the host before backward goes on), and collectives recorded without message sizes
    sync_param_allreduce: bool = False
    record_comm_sizes: bool = True
    # FSDP
    fsdp_wrap: str = "per_layer"  # per_layer | none
    sharding: str = "full_shard"  # full_shard | shard_grad_op | hybrid_shard
    backward_prefetch: bool = True
    forward_prefetch: bool = True
    # links (models.md section 1-2): one-way, per GPU
    nvlink_alpha_us: float = 0.8
    nvlink_gbps: float = 450.0
    nic_alpha_us: float = 12.0
    nic_gbps: float = 45.0  # achievable per NIC
    nics_per_node: int = 8
    # imbalance, host and noise
    straggler_rank: int | None = None
    straggler_slowdown: float = 1.0  # 1.3: that rank's compute kernels take 30% longer
    # a slow link: this rank's link runs at slow_link_gbps (one-way), and every ring through it
    # (each collective of a group holding it) runs at that pace (0: no slow link)
    slow_link_rank: int | None = None
    slow_link_gbps: float = 0.0
    # host stalls: these ranks' hosts stall host_stall_us each step (rotating: one of them per
    # step, in turn) in the data loader ("input") or in Python right after a blocking device
    # sync in mid-step ("sync": loss.item() after forward, then host work before backward) or in
    # the device allocator ("alloc": after forward, a cudaFree with the caching allocator off,
    # which waits for the device to drain, then frees for host_stall_us)
    host_stall_ranks: tuple = ()
    host_stall_us: float = 0.0
    host_stall_kind: str = "input"  # input | sync | alloc
    host_stall_rotate: bool = False
    # more data-loader stalls, each (rank, µs, every) or (rank, µs, every, first): that rank's
    # host stalls that long in every every-th recorded step from the first-th (0: the first
    # recorded step), on top of the above
    host_stalls: tuple = ()
    # how each batch reaches the GPU: "pinned" (a pinned-memory copy on the compute stream at the
    # step's start), "pageable_prefetch" (a prefetching thread copies the next step's batch,
    # input_mb MiB from pageable memory, on a side stream while the step runs: the driver stages
    # it at host_copy_gbps before the DMA can start; the next step's compute waits for the copy)
    # or "pinned_prefetch" (the same from pinned memory with non_blocking=True: the DMA starts at once)
    input_copy: str = "pinned"
    input_mb: float = 64.0
    host_copy_gbps: float = 3.0
    pcie_gbps: float = 20.0
    # how the loss reaches the host at the end of each step: "item" (loss.item(): a copy, then
    # cudaStreamSynchronize) or "pageable" (loss.cpu(): a copy to pageable memory, whose call
    # returns only when the copy is done)
    loss_copy: str = "item"
    # CPU contention on every rank's host: every host_contention_every-th runtime call of the
    # training threads is descheduled for host_contention_us (0: none)
    host_contention_us: float = 0.0
    host_contention_every: int = 50
    # how the trace marks the steps: "profiler" (ProfilerStep#N, the profiler's schedule),
    # "annotation" (no ProfilerStep: a benchmark's own record_function around each forward,
    # named step_annotation) or "none" (no step marker at all)
    step_marker: str = "profiler"  # or "optimizer": neither ProfilerStep nor a forward range, the optimizer's alone
    step_annotation: str = "measure|forward"
    # what the job runs: "training" (zero_grad, forward, loss, backward, optimizer step) or
    # "inference" (forward passes only, then the output's .item(): no backward, no optimizer)
    workload: str = "training"
    # the range the trace shows around DDP's forward: "ddp" (DistributedDataParallel.forward),
    # "compiled" (torch.compile: "Torch-Compiled Region: 0/0" > "CompiledFunction") or "none"
    # (eager, no range: the phases come from the job's structure alone)
    forward_marker: str = "ddp"
    # the category names Kineto writes: "today" or "legacy" (PyTorch <= 1.9: Kernel, Memcpy,
    # Memset, Runtime, Operator for CPU ops and record_function ranges alike, async flows)
    category_names: str = "today"
    # how the tensor-parallel / forward all-reduces run: "nccl", "symm_mem" (PyTorch's symmetric
    # memory: symm_mem::multimem_all_reduce_ launching multimem_all_reduce_kernel, no
    # record_param_comms) or "custom_ar" (vLLM's custom all-reduce: vllm::all_reduce launching
    # cross_device_reduce_1stage); the time model is the same
    tp_allreduce_impl: str = "nccl"
    emit_pg_config: bool = True  # distributedInfo.pg_config (older torch writes none)
    launch_overhead_us: float = 4.0  # CPU cost of one cudaLaunchKernel
    cpu_op_overhead_us: float = 6.0  # CPU cost of entering one aten op / annotation
    noise: float = 0.01  # relative sigma of kernel durations (seeded; truth stays exact)
    start_skew_us: float = 40.0  # ranks start their first step up to this much apart
    seed: int = 0
    # schema knobs
    kernel_comm_args: bool = True  # newer Kineto copies collective args onto the NCCL kernel
    emit_host_name: bool = True  # distributedInfo.host_name (not written by torch itself)
    record_shapes: bool = True
    # the allocator's [memory] events (profile_memory=True; analyzer.synth.memory), truth per rank
    profile_memory: bool = False
    memory_leak_mb: float = 0.0  # MiB each step keeps for good (a leak: allocated grows step after step)
    empty_cache: bool = False  # torch.cuda.empty_cache() at each step's end: segments freed, taken again
    memory_skew_ranks: tuple = ()  # these ranks hold memory_skew_mb MiB more throughout (imbalance)
    memory_skew_mb: float = 0.0
    # torch.utils.checkpoint on every layer: forward saves its input only (2·s·b·h), backward
    # re-runs each layer's forward first (analyzer.synth.compute.Compute.layer_backward, .memory)
    activation_checkpointing: bool = False
    torch_version: str = "2.13.0+cu128"
    nccl_version: str = "2.27.5"

    def __post_init__(self) -> None:
        _check(self.strategy in STRATEGIES, f"strategy must be one of {STRATEGIES}")
        _check(self.sharding in SHARDINGS, f"sharding must be one of {SHARDINGS}")
        _check(self.fsdp_wrap in WRAPS, f"fsdp_wrap must be one of {WRAPS}")
        _check(self.gpu in GPUS, f"gpu must be one of {sorted(GPUS)}")
        _check(self.grad_dtype in DTYPE_BYTES and self.param_dtype in DTYPE_BYTES, "unknown dtype")
        _check(self.gemm_dtype in ("bf16", "fp32"), "gemm_dtype must be bf16 or fp32")
        _check(self.gemm_half_flops >= 0, "gemm_half_flops >= 0")
        _check(self.world_size >= 1 and self.gpus_per_node >= 1, "world_size, gpus_per_node >= 1")
        _check(
            self.world_size <= self.gpus_per_node or self.world_size % self.gpus_per_node == 0,
            "world_size must fill whole nodes",
        )
        _check(self.steps >= 1 and self.n_layers >= 1, "steps, n_layers >= 1")
        _check(self.hidden % self.head_dim == 0, "hidden must be a multiple of head_dim")
        _check(
            self.straggler_rank is None or 0 <= self.straggler_rank < self.world_size,
            "straggler_rank out of range",
        )
        _check(all(0 <= r < self.world_size for r in self.host_stall_ranks), "host_stall_ranks out of range")
        _check(self.slow_link_rank is None or 0 <= self.slow_link_rank < self.world_size, "slow_link_rank out of range")
        _check(all(len(s) in (3, 4) and 0 <= int(s[0]) < self.world_size and int(s[2]) >= 1 for s in self.host_stalls),
               "host_stalls: (rank in range, µs, every >= 1[, first])")
        _check(self.host_stall_kind in ("input", "sync", "alloc"), "host_stall_kind must be input, sync or alloc")
        _check(self.workload in ("training", "inference"), "workload must be training or inference")
        _check(self.forward_marker in ("ddp", "compiled", "none"), "forward_marker must be ddp, compiled or none")
        _check(self.input_copy in ("pinned", "pageable_prefetch", "pinned_prefetch"),
               "input_copy must be pinned, pageable_prefetch or pinned_prefetch")
        _check(self.loss_copy in ("item", "pageable"), "loss_copy must be item or pageable")
        _check(self.host_contention_every >= 1, "host_contention_every >= 1")
        _check(self.step_marker in ("profiler", "annotation", "none", "optimizer"),
               "step_marker must be profiler, annotation, none or optimizer")
        _check(self.category_names in ("today", "legacy"), "category_names must be today or legacy")
        _check(self.tp_allreduce_impl in ("nccl", "symm_mem", "custom_ar"),
               "tp_allreduce_impl must be nccl, symm_mem or custom_ar")

    def stall_us(self, step_index: int) -> list[float]:
        """Per rank, the host stall of the step_index-th recorded step (µs)."""
        ranks = list(self.host_stall_ranks)
        if self.host_stall_rotate and ranks:
            ranks = [ranks[step_index % len(ranks)]]
        stalls = [self.host_stall_us if r in ranks else 0.0 for r in range(self.world_size)]
        for rank, us, every, *first in self.host_stalls:
            if step_index % int(every) == (int(first[0]) if first else 0) % int(every):
                stalls[int(rank)] += float(us)
        return stalls

    # ---- derived quantities -------------------------------------------------------------
    @property
    def gpu_model(self) -> GpuModel:
        return GPUS[self.gpu]

    @property
    def memory_bytes(self) -> int:
        return self.gpu_mem_bytes if self.gpu_mem_bytes is not None else self.gpu_model.total_mem_bytes

    @property
    def ranks_per_node(self) -> int:
        return min(self.world_size, self.gpus_per_node)

    @property
    def n_nodes(self) -> int:
        return max(1, self.world_size // self.gpus_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def host_name(self, rank: int) -> str:
        return f"node{self.node_of(rank)}"

    @property
    def tokens_per_rank(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def ffn(self) -> int:
        return self.ffn_mult * self.hidden

    def to_dict(self) -> dict:
        # Knobs added after the committed samples were written are left out while off, so those
        # samples' truth still describes them (and a spec read back gets the default).
        return {k: v for k, v in asdict(self).items() if not (k in _LATER_KNOBS and v == _LATER_KNOBS[k])}


_LATER_KNOBS = {"slow_link_rank": None, "slow_link_gbps": 0.0, "tp_allreduce_mb": 0.0, "gemm_half_flops": 0.0, "gemm_dtype": "bf16", "misaligned_gemm_efficiency": 0.0,
                "input_copy": "pinned", "input_mb": 64.0, "host_copy_gbps": 3.0,
                "pcie_gbps": 20.0, "loss_copy": "item", "host_contention_us": 0.0,
                "host_contention_every": 50, "host_stalls": (), "step_marker": "profiler",
                "step_annotation": "measure|forward", "category_names": "today",
                "tp_allreduce_impl": "nccl", "workload": "training", "forward_marker": "ddp",
                "profile_memory": False, "memory_leak_mb": 0.0,
                "empty_cache": False, "memory_skew_ranks": (), "memory_skew_mb": 0.0,
                "activation_checkpointing": False}  # knob: its default


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"JobSpec: {message}")
