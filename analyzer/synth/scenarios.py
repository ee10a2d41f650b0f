"""Named sample jobs: each shows one scaling problem, or is the healthy counterpart of one.

Models: GPT_1_5B (d=4096, 6 blocks, 1.47 B parameters: 16Ψ = 23.5 GB fits an 80 GB H100, so DDP
is the right tool), GPT_7B (d=9216, 6 blocks, 6.7 B: 16Ψ = 107 GB does not fit, so FSDP is) and
GPT_SMALL (d=1024 with biases, 6 blocks, 0.18 B: many small tensors, the case where DDP bucket
sizes matter). Few, wide blocks keep the traces small; kernel durations come from FLOPs and bytes.
Two-node jobs are 2 x 8 GPUs, or 2 x 4 GPUs where the point is the network, not the rank count.
"""

from dataclasses import replace

from .spec import JobSpec

GPT_1_5B = JobSpec(n_layers=6, hidden=4096, vocab_size=32000, seq_len=2048, micro_batch=4)
GPT_7B = JobSpec(n_layers=6, hidden=9216, vocab_size=32000, seq_len=2048, micro_batch=2)
GPT_SMALL = JobSpec(n_layers=6, hidden=1024, vocab_size=50304, seq_len=1024, micro_batch=8, bias=True)
TWO_NODES = {"world_size": 16, "gpus_per_node": 8}
TWO_SMALL_NODES = {"world_size": 8, "gpus_per_node": 4}


def _job(base: JobSpec, name: str, seed: int, **changes) -> JobSpec:
    return replace(base, name=name, seed=seed, **changes)


SCENARIOS: dict[str, JobSpec] = {
    spec.name: spec
    for spec in [
        _job(GPT_1_5B, "ddp_healthy_8r", 1),
        _job(GPT_1_5B, "ddp_2node_16r_healthy", 2, **TWO_NODES),
        _job(GPT_1_5B, "ddp_bucket_oversized", 3, **TWO_SMALL_NODES, nics_per_node=2, bucket_cap_mb=1024.0),
        _job(GPT_SMALL, "ddp_bucket_undersized", 4, **TWO_NODES, bucket_cap_mb=1.0, emit_host_name=False,
             kernel_comm_args=False),
        _job(GPT_1_5B, "ddp_comm_bound", 5, **TWO_SMALL_NODES, nics_per_node=1),
        _job(GPT_1_5B, "ddp_straggler", 6, straggler_rank=5, straggler_slowdown=1.3),
        _job(GPT_1_5B, "ddp_fp32_grads", 7, grad_dtype="fp32", param_dtype="fp32", kernel_comm_args=False),
        _job(GPT_7B, "fsdp1_no_wrap", 8, strategy="fsdp1", fsdp_wrap="none"),
        _job(GPT_7B, "fsdp2_no_wrap", 9, strategy="fsdp2", fsdp_wrap="none"),
        _job(GPT_7B, "fsdp1_per_layer_healthy", 10, strategy="fsdp1"),
        _job(GPT_7B, "fsdp2_per_layer_healthy", 11, strategy="fsdp2"),
        _job(GPT_7B, "fsdp_fullshard_2node", 12, strategy="fsdp2", **TWO_NODES, nics_per_node=4, micro_batch=1),
        _job(GPT_7B, "fsdp_hybrid_2node", 13, strategy="fsdp2", **TWO_NODES, nics_per_node=4, micro_batch=1,
             sharding="hybrid_shard"),
        _job(GPT_7B, "fsdp_no_prefetch", 14, strategy="fsdp1", micro_batch=1, backward_prefetch=False,
             forward_prefetch=False),
        _job(GPT_SMALL, "fsdp_small_model", 15, strategy="fsdp2", bias=False),
        # host-side problems (issue 11): two hosts stall in the data loader every step; a
        # different host each step (and no pg_config); one host blocked in a device sync then
        # busy in Python mid-step; ranks entering a single profiled step far apart
        _job(GPT_1_5B, "ddp_two_hosts_stall", 16, n_layers=2, steps=4, world_size=4, host_stall_ranks=(1, 3),
             host_stall_us=25000.0),
        _job(GPT_1_5B, "ddp_rotating_stall", 17, n_layers=2, steps=4, world_size=4, host_stall_ranks=(1, 3, 2),
             host_stall_us=25000.0, host_stall_rotate=True, emit_pg_config=False),
        _job(GPT_1_5B, "ddp_host_sync_stall", 18, n_layers=2, steps=4, world_size=4, host_stall_ranks=(3,),
             host_stall_us=40000.0, host_stall_kind="sync"),
        _job(GPT_1_5B, "ddp_entry_skew", 19, n_layers=2, steps=1, start_skew_us=20000.0),
        # sharded embeddings + DDP: an all-to-all before the dense forward and after the backward
        _job(GPT_1_5B, "ddp_alltoall_embeddings", 20, n_layers=2, steps=4, world_size=4, gpus_per_node=2,
             embedding_alltoall_mb=3072.0),
        # one synchronous all-reduce per gradient, sizes not recorded (a hand-rolled data parallel)
        _job(GPT_SMALL, "ddp_sync_per_param", 22, n_layers=4, steps=3, world_size=2, gpus_per_node=1,
             grad_dtype="fp32", param_dtype="fp32", sync_param_allreduce=True, record_comm_sizes=False,
             kernel_comm_args=False),
        # a blocking activation all-reduce after each block's forward (tensor-parallel style)
        _job(GPT_1_5B, "ddp_forward_allreduce", 21, n_layers=2, steps=4, world_size=4, gpus_per_node=2,
             forward_allreduce_mb=1536.0),
        # the linears left in fp32 (outside autocast) while attention runs in bf16 (issue 29)
        _job(GPT_1_5B, "ddp_fp32_gemms", 23, n_layers=2, steps=4, world_size=4, gpus_per_node=4, gemm_dtype="fp32"),
        # idle by cause (issue 26): a prefetching thread copies each next batch from pageable
        # memory (the driver stages it before the DMA can start) while the step's work, launched
        # long before, waits for it, the host meanwhile sitting in loss.cpu() (a copy to pageable
        # memory); and a host whose training threads are descheduled (CPU contention)
        _job(GPT_1_5B, "ddp_pageable_input", 23, n_layers=2, steps=4, world_size=2, gpus_per_node=2,
             input_copy="pageable_prefetch", input_mb=256.0, loss_copy="pageable"),
        # late ranks by the waiting they cause: rank 1 stalls 30 ms in the data loader every
        # other step, rank 3 18 ms every step, rank 2 5 ms every step (late at the step's start,
        # never the last at a collective: entry skew)
        _job(GPT_1_5B, "ddp_two_late_ranks", 25, n_layers=2, steps=5, world_size=8,
             host_stalls=((1, 30000.0, 2), (3, 18000.0, 1), (2, 5000.0, 1))),
        _job(GPT_SMALL, "ddp_cpu_contention", 24, n_layers=2, steps=4, world_size=2, gpus_per_node=2,
             host_contention_us=3000.0, host_contention_every=15),
    ]
}

# Jobs beyond training steps and their host leaves (issue 37 items 3, 7, 8), generated on demand
# by the tests rather than committed (the samples' size budget): the same DDP job stalled in the
# device allocator (a cudaFree with the caching allocator off, after forward, on rank 3); eager
# decode steps of a small model, forward passes only and no range around them (host-bound: each
# step's kernels are shorter than the host's op overhead); the same forward passes compiled
# ("Torch-Compiled Region" > "CompiledFunction") on two ranks with a tensor-parallel all-reduce
# per sublayer; and a compiled training job (its backward an autograd node per op, as eager).
WORKLOAD_SCENARIOS: dict[str, JobSpec] = {
    spec.name: spec
    for spec in [
        replace(SCENARIOS["ddp_host_sync_stall"], name="ddp_allocator_stall", seed=31, host_stall_kind="alloc"),
        _job(GPT_SMALL, "inference_eager_decode", 32, n_layers=2, steps=4, world_size=1, gpus_per_node=1,
             micro_batch=1, seq_len=16, workload="inference", forward_marker="none"),
        _job(GPT_SMALL, "inference_compiled_tp", 33, n_layers=2, steps=3, world_size=2, gpus_per_node=2,
             micro_batch=4, seq_len=512, workload="inference", forward_marker="compiled", tp_allreduce_mb=4.0),
        _job(GPT_SMALL, "ddp_compiled_training", 34, n_layers=2, steps=3, world_size=2, gpus_per_node=2,
             forward_marker="compiled"),
    ]
}
