"""What the host was doing while its GPU idled (the idle leaves of analyzer.rank.attribution),
in words, and the fix for each: shared by the rules that name a host cause."""

# What the host was doing while its GPU idled (analyzer.rank.attribution's idle leaves).
HOST_ACTIVITY = {"input": "the data loader", "device_sync": "a blocking device sync",
                 "launch": "launching kernels one by one", "unknown": "Python or other host work"}
HOST_FIX = {
    "input": ("feed it faster: more DataLoader workers, pin_memory, prefetch; balance the "
              "per-rank input (uneven batches or shards)"),
    "device_sync": ("remove the blocking sync from the step (.item(), .cpu(), print of a tensor, "
                    "torch.cuda.synchronize): keep values on the GPU or read them every N steps"),
    "launch": "cut launch overhead: torch.compile, CUDA graphs, fused optimizers",
    "unknown": ("profile that host (py-spy dump / record on the rank): logging, checkpointing or "
                "other per-rank work in the step"),
}
