"""Record the real 2-rank CPU traces in sample_traces/cpu_gloo/ (torch + gloo, no GPU needed).

    python scripts/record_cpu_traces.py                     # every job
    python scripts/record_cpu_traces.py --jobs ddp fsdp2    # some of them

Each job trains a small transformer-style MLP for a few steps on 2 ranks (torch.multiprocessing,
gloo over 127.0.0.1) under ``analyzer.capture.profile_steps`` and writes
``<out>/<job>/rank-{0,1}.pt.trace.json.gz``, then ``<out>/README.md`` describes the recording.
Seeds are fixed; timings (and so the trace bytes) still vary from run to run.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from analyzer.capture import profile_steps  # noqa: E402

WORLD_SIZE = 2
SEED = 1234
VOCAB, WIDTH, HIDDEN, BLOCKS = 1024, 256, 1024, 4
BATCH, SEQUENCE = 8, 64
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
DDP_BUCKET_CAP_MB = 2  # parameters are ~10 MB of fp32: several buckets

JOBS = {
    "ddp": f"DistributedDataParallel, bucket_cap_mb={DDP_BUCKET_CAP_MB} (several all-reduce buckets)",
    "fsdp1_wrap": "FSDP1 FullyShardedDataParallel, ModuleWrapPolicy({Block}): one unit per block "
    "+ root, device_id=cpu",
    "fsdp1_nowrap": "FSDP1 FullyShardedDataParallel without auto-wrap policy: a single unit, "
    "device_id=cpu",
    "fsdp2": "FSDP2 fully_shard on each block, then on the root; 1-D CPU device mesh",
}


class Block(nn.Module):
    """Pre-norm residual MLP block, the feed-forward half of a transformer layer."""

    def __init__(self, width: int = WIDTH, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLanguageModel(nn.Module):
    """Embedding -> BLOCKS x Block -> LayerNorm -> vocabulary head (~2.6 M parameters with the
    defaults; scripts/record_gpu_traces.py builds a larger one)."""

    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, hidden: int = HIDDEN, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch * sequence, vocab)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        # Flatten before the head so the output is not a view (FSDP2 warns about views).
        return self.head(self.norm(x).flatten(0, 1))


def wrap_for_job(job: str, model: nn.Module) -> nn.Module:
    if job == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_CAP_MB)
    if job.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policy = ModuleWrapPolicy({Block}) if job == "fsdp1_wrap" else None
        return FullyShardedDataParallel(
            model, auto_wrap_policy=policy, device_id=torch.device("cpu")
        )
    if job == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    raise ValueError(f"unknown job {job!r}; choose from {', '.join(JOBS)}")


def train_rank(rank: int, job: str, out_dir: str, port: int, profile_memory: bool = False,
               before_step=None) -> None:
    """``profile_memory`` and ``before_step`` (called at each step's start): for
    scripts/record_memory_cpu_traces.py."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
    )
    torch.set_num_threads(1)  # 2 ranks on a small machine: do not oversubscribe the cores
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(SEED)  # same initial weights on every rank
        model = wrap_for_job(job, TinyLanguageModel())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(SEED + rank)  # a different shard of data per rank
        steps = sum(SCHEDULE.values())
        with profile_steps(out_dir, profile_memory=profile_memory, **SCHEDULE) as prof:
            for _ in range(steps):
                if before_step is not None:
                    before_step()
                tokens = torch.randint(VOCAB, (BATCH, SEQUENCE), generator=data)
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                prof.step()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def record_job(job: str, out_root: Path, train=None, world_size: int = WORLD_SIZE) -> None:
    """Spawn ``world_size`` ranks running ``train(rank, job, job_dir, port)`` (default: this
    script's ``train_rank``) into a fresh ``out_root/job``."""
    job_dir = out_root / job
    job_dir.mkdir(parents=True, exist_ok=True)
    for stale in job_dir.glob("*.json*"):
        stale.unlink()
    mp.spawn(train or train_rank, args=(job, str(job_dir), free_port()), nprocs=world_size, join=True)


def readme_text(jobs: list[str]) -> str:
    job_lines = "\n".join(f"- `{job}/`: {JOBS[job]}" for job in jobs)
    return f"""# Real 2-rank CPU traces (torch + gloo)

Recorded with `python scripts/record_cpu_traces.py` (torch {torch.__version__}, Python
{platform.python_version()}, gloo backend, 2 ranks spawned with `torch.multiprocessing` on
127.0.0.1, `torch.set_num_threads(1)` per rank).

Model: `TinyLanguageModel` in the script: embedding ({VOCAB} x {WIDTH}), {BLOCKS} pre-norm MLP
blocks ({WIDTH} -> {HIDDEN} -> {WIDTH}), LayerNorm, vocabulary head; ~2.6 M fp32 parameters.
Batch {BATCH} x {SEQUENCE - 1} tokens per rank, cross-entropy loss, AdamW. Seed {SEED} for the
weights (same on both ranks) and {SEED} + rank for the data.

Profiler: `analyzer.capture.profile_steps(job_dir, wait={SCHEDULE["wait"]}, \
warmup={SCHEDULE["warmup"]}, active={SCHEDULE["active"]})`:
CPU activity only, `record_shapes=True`, one gzip file per rank, `rank-<r>.pt.trace.json.gz`,
each with `distributedInfo` (backend, rank, world_size, pg_count, pg_config).

{job_lines}
- `memory_ddp/`: the `ddp/` job with `profile_memory=True` and two planted allocations per step
  (a 64 MiB buffer freed at once, 1 MiB kept for good), recorded by
  `scripts/record_memory_cpu_traces.py`; the sizes in `truth.toml` (tests/test_memory.py)
- `compute/`: a model whose FLOPs cover every op family tracecliff counts (causal SDPA, 4-D
  matmul, baddbmm, Conv1d, mv), recorded by `scripts/record_compute_cpu_traces.py`: see
  [COMPUTE.md](COMPUTE.md)

What they contain (as observed with torch 2.13 + gloo; other versions may differ):

- CPU activity only: no GPU kernels, so GPU timelines are empty. Steps are `ProfilerStep#2..4`
  (steps 0 and 1 are the schedule's wait and warm-up).
- Collectives appear twice: the c10d op on the main thread (`c10d::allreduce_`,
  `c10d::allgather_`, `c10d::_allgather_base_`, `c10d::_reduce_scatter_base_`, with
  `Input Dims`) and the work itself as a `gloo:all_reduce` / `gloo:all_gather` user annotation
  on one of two gloo worker threads (`thread_name` `pt_gloo_runloop`; one of them also has a
  second `thread_name` record, `(python)`, for the same tid). Nothing links the two (their
  `External id`s are unrelated); gloo emits no `record_param_comms`, so there is no `Seq`.
- gloo implements `_reduce_scatter_base_` as an all-reduce of the whole unsharded input:
  FSDP reduce-scatters show up as `gloo:all_reduce` of the full size.
- Backward runs on the main thread (CPU autograd has no separate device thread); backward ops
  sit under `autograd::engine::evaluate_function: ...`.
- Framework annotations: `DistributedDataParallel.forward` (ddp);
  `FullyShardedDataParallel.forward`, `FullyShardedDataParallel._pre_forward`, ... (FSDP1,
  no module names); `FSDP::all_gather (blocks.0)`, `FSDP::pre_forward (blocks.0)`,
  `FSDP::post_backward_reduce (blocks.0)`, ... (FSDP2, module name in parentheses; the root
  unit's are bare or `()`); `Optimizer.step#AdamW.step` in all jobs.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "sample_traces" / "cpu_gloo")
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    options = parser.parse_args(argv)
    for job in options.jobs:
        print(f"recording {job} -> {options.out / job}", flush=True)
        record_job(job, options.out)
    (options.out / "README.md").write_text(readme_text(list(JOBS)))


if __name__ == "__main__":
    main()
