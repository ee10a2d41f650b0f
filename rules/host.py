"""What the host was doing while its GPU idled for lack of work (the host part of the idle of
analyzer.rank.attribution), in words, and the fix for each: shared by the rules that name a host
cause."""

from analyzer.job.model import split_gain
from analyzer.job.prediction_doc import predicted

HOST_FIX = {
    "input": ("feed it faster: more DataLoader workers, pin_memory, prefetch; balance the "
              "per-rank input (uneven batches or shards)"),
    "device_sync": ("remove the blocking sync from the step (.item(), .cpu(), print of a tensor, "
                    "torch.cuda.synchronize, a copy to pageable memory): keep values on the GPU or read them "
                    "every N steps, copy into pinned memory with non_blocking=True"),
    "allocator": ("device memory is allocated and freed outside the caching allocator's pool, and every free "
                  "waits for the device: keep the caching allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING), "
                  "take torch.cuda.empty_cache() out of the loop, set "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where fragmentation makes it retry (free its "
                  "cache and allocate again), and allocate buffers once, outside the step"),
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
    "allocator": ("unset PYTORCH_NO_CUDA_MEMORY_CACHING   # the caching allocator reuses freed blocks\n"
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py   # and no empty_cache() per step"),
    "contention": ("OMP_NUM_THREADS=8 numactl --cpunodebind=<gpu's node> --membind=<node> python train.py\n"
                   "torch.set_num_threads(8)   # the cores of this rank, not the host's"),
    "fsdp": "fully_shard(model.layers[i:i + 4], reshard_after_forward=(i < last))   # fewer, larger units",
    "launch": "model = torch.compile(model)   # or CUDA graphs: torch.cuda.make_graphed_callables",
    "unknown": "py-spy record -o host.svg --pid <PID>   # where the host spends the step",
}

# The host's own work (the ``unknown`` host part of idle) by where in the step it falls: the phase
# of the work whose launch ended each gap (analyzer.rank.attribution: idle_unknown_by_phase).
HOST_OWN_WORK_FIX = {
    "forward": ("the host's own work between kernels in forward (Python, operator dispatch, many small ops) "
                "takes longer than the GPU work it launches: torch.compile (fuses the small ops and cuts the Python "
                "between them) or CUDA graphs, a larger micro-batch per GPU (more GPU work per op); py-spy record on "
                "the rank shows which Python"),
    "backward": ("the host's own work between kernels in backward (autograd's per-op work, Python hooks, many small "
                 "ops) takes longer than the GPU work it launches: torch.compile (compiled autograd) or CUDA graphs, "
                 "fewer Python hooks, a larger micro-batch per GPU (more GPU work per op); py-spy record on the rank "
                 "shows which Python"),
    "optimizer": ("the optimizer step's host work (Python and small kernels per parameter tensor) sets the pace: a "
                  "fused or foreach optimizer (torch.optim.AdamW(..., fused=True)), fewer and larger parameter "
                  "tensors; py-spy record on the rank shows the rest"),
    "other": ("the host's work outside forward, backward and the optimizer step sets the pace: profile that host "
              "(py-spy dump / record on the rank): logging, checkpointing, metrics or evaluation in the step"),
}
HOST_OWN_WORK_SNIPPET = {
    "forward": "model = torch.compile(model)   # fuses small ops; py-spy record -o host.svg --pid <PID>",
    "backward": "model = torch.compile(model)   # with compiled autograd; py-spy record -o host.svg --pid <PID>",
    "optimizer": "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
    "other": "py-spy record -o host.svg --pid <PID>   # where the host spends the step",
}

# An inference job's own host work or launch overhead (no training loop: no optimizer, logging,
# checkpointing or evaluation to blame): cut the host's work per generated token or request.
INFERENCE_ACTIVITIES = ("unknown", "launch")
INFERENCE_HOST_FIX = ("the host's work between kernels of the forward passes (Python, operator dispatch, the serving "
                      "loop's scheduling) takes longer than the GPU work it launches: CUDA graphs (capture the decode "
                      "step: torch.compile(mode=\"reduce-overhead\"), a serving engine's CUDA-graph mode rather than "
                      "eager), torch.compile to fuse the small ops, larger batches (more sequences or requests per "
                      "forward: more GPU work per launch), fewer host syncs (.item() / .tolist() / .cpu() per token)")
INFERENCE_HOST_SNIPPET = 'model = torch.compile(model, mode="reduce-overhead")   # CUDA graphs for the decode step'
# The same where the GPU work already runs as CUDA graphs: what is left is the host's work between
# graph launches.
INFERENCE_GRAPHED_FIX = ("the forward passes already run as CUDA graphs, and the host's work between graph launches "
                         "(scheduling, input preparation, sampling, Python) takes longer than the GPU work of each: "
                         "larger batches (more sequences or requests per graph launch), fewer host syncs "
                         "(.item() / .tolist() / .cpu() per token), and the next step's scheduling overlapped with "
                         "the GPU's work (asynchronous scheduling in the serving engine)")
INFERENCE_GRAPHED_SNIPPET = "py-spy record -o host.svg --pid <PID>   # the host's work between graph launches"


def host_fix(activity: str, own_phase: str | None, workload: str | None,
             graphed: bool = False) -> tuple[str, str, tuple[str, ...]]:
    """The fix, snippet and preconditions (analyzer.job.facts.FIX_PRECONDITIONS) for the leading
    host leaf: on an inference job, its own advice for the host's own work and launch overhead
    (without CUDA graphs where its work runs as graphs already: ``graphed``), which needs nothing
    more; else the leaf's, the host's own work by its phase."""
    if workload == "inference" and activity in INFERENCE_ACTIVITIES:
        return (INFERENCE_GRAPHED_FIX, INFERENCE_GRAPHED_SNIPPET, ()) if graphed else (
            INFERENCE_HOST_FIX, INFERENCE_HOST_SNIPPET, ())
    if activity == "unknown" and own_phase:
        return (HOST_OWN_WORK_FIX[own_phase], HOST_OWN_WORK_SNIPPET[own_phase],
                HOST_OWN_WORK_REQUIRES.get(own_phase, ()))
    return HOST_FIX[activity], HOST_SNIPPET[activity], HOST_FIX_REQUIRES.get(activity, ())


def idle_split_note(ctx) -> str | None:
    """Why the typical step's split of idle into host-caused and queued cannot be trusted."""
    return (ctx.result.attribution or {}).get("idle_split_note")


def ranks_phrase(hit: list[int], given: int) -> str:
    """Which of the ranks given a finding is about, in words."""
    return f"on {len(hit)} of {given} ranks" if len(hit) < given else "on every rank given"

# What each fix above needs of the job (analyzer.job.facts.FIX_PRECONDITIONS), checked before it
# is printed: the data loader's advice only where the loader is where the idle goes, FSDP's only on
# FSDP, advice about the training step (backward, optimizer, checkpointing) only in training.
HOST_FIX_REQUIRES = {"input": ("loader_bound",), "fsdp": ("fsdp",), "unknown": ("training",)}
HOST_OWN_WORK_REQUIRES = {"backward": ("training",), "optimizer": ("training",), "other": ("training",)}


REPLAY_GAIN = ("the gain instead: the firing ranks' extra idle against the median other rank taken out of their "
               "chains and the job replayed (docs/models.md §9), as far as the typical step's idle and waiting hold it")


def replayed_rank_fixes(ctx, causes: dict[int, str], ranks: int):
    """(gain, recovers, prediction) of fixing these ranks' causes on the replay of the measured
    job, the saving split over the typical step's idle then waiting (each at most what that
    leaf holds); None where the job cannot be replayed or every rank fires (no rank to measure
    the extra idle against: the rule's own upper bound stands)."""
    if len(causes) >= ranks:
        return None
    replayed = ctx.gains.replayed_rank_fixes(ctx.result, causes)
    if replayed is None:
        return None
    saved, steps_replayed = replayed
    recovers = split_gain(max(0.0, saved), ("idle_us", "exposed_wait_us"), ctx.model.typical)
    gain = sum(recovers.values())
    prediction = predicted(ctx.model.step_time_us, gain, f"replay of the measured job (docs/models.md §9): {REPLAY_GAIN}",
                           {"fixed": {str(r): c for r, c in sorted(causes.items())}, "steps_replayed": steps_replayed})
    if saved > gain + 0.05:
        prediction["replay_gain_beyond_leaves_us"] = round(saved - gain, 1)
    return gain, recovers, prediction
