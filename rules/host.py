"""What the host was doing while its GPU idled for lack of work (the host part of the idle of
analyzer.rank.attribution), in words, and the fix for each: shared by the rules that name a host
cause."""

# What the host was doing while its GPU idled, nothing launched (analyzer.rank.attribution).
HOST_ACTIVITY = {"input": "the data loader", "device_sync": "a blocking device sync",
                 "contention": "host ops running far beyond their usual length (CPU contention)",
                 "fsdp": "FSDP's own hooks", "launch": "launching kernels one by one",
                 "unknown": "Python or other host work"}
HOST_FIX = {
    "input": ("feed it faster: more DataLoader workers, pin_memory, prefetch; balance the "
              "per-rank input (uneven batches or shards)"),
    "device_sync": ("remove the blocking sync from the step (.item(), .cpu(), print of a tensor, "
                    "torch.cuda.synchronize, a copy to pageable memory): keep values on the GPU or read them "
                    "every N steps, copy into pinned memory with non_blocking=True"),
    "contention": ("the host process is descheduled: ordinary host ops (kernel launches, allocations) run "
                   "20x and more their usual length. Pin each rank's threads to its own cores (numactl / taskset, "
                   "one NUMA node per GPU), set OMP_NUM_THREADS and torch.set_num_threads to the cores per rank, "
                   "and look for other processes on the host (data-loader workers, monitoring, another job)"),
    "fsdp": ("FSDP's per-unit bookkeeping (pre-forward, post-backward, reduce-scatter hooks) sets the pace: "
             "wrap coarser (fewer, larger units; group small modules into one), and keep the last units "
             "unsharded after forward (reshard_after_forward=False)"),
    "launch": "cut launch overhead: torch.compile, CUDA graphs, fused optimizers",
    "unknown": ("profile that host (py-spy dump / record on the rank): logging, checkpointing or "
                "other per-rank work in the step"),
}
HOST_SNIPPET = {
    "input": ("DataLoader(dataset, batch_size=..., num_workers=8, pin_memory=True,\n"
              "           persistent_workers=True, prefetch_factor=4)"),
    "device_sync": "loss_sum += loss.detach()          # not loss.item() every step\n"
                   "if step % 100 == 0: print(loss_sum.item() / 100)",
    "contention": ("OMP_NUM_THREADS=8 numactl --cpunodebind=<gpu's node> --membind=<node> python train.py\n"
                   "torch.set_num_threads(8)   # the cores of this rank, not the host's"),
    "fsdp": "fully_shard(model.layers[i:i + 4], reshard_after_forward=(i < last))   # fewer, larger units",
    "launch": "model = torch.compile(model)   # or CUDA graphs: torch.cuda.make_graphed_callables",
    "unknown": "py-spy record -o host.svg --pid <PID>   # where the host spends the step",
}


def idle_split_note(ctx) -> str | None:
    """Why the typical step's split of idle into host-caused and queued cannot be trusted."""
    return (ctx.result.attribution or {}).get("idle_split_note")


def ranks_phrase(hit: list[int], given: int) -> str:
    """Which of the ranks given a finding is about, in words."""
    return f"on {len(hit)} of {given} ranks" if len(hit) < given else "on every rank given"
