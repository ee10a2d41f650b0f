"""Record the real 4-rank CPU traces of tensor / pipeline / 2-D parallel jobs in
sample_traces/cpu_gloo/ (torch + gloo, no GPU needed).

    python scripts/record_parallel_cpu_traces.py                  # every job
    python scripts/record_parallel_cpu_traces.py --jobs tp pp     # some of them

Jobs (4 ranks, torch.multiprocessing, gloo over 127.0.0.1, the TinyLanguageModel blocks of
scripts/record_cpu_traces.py):

- ``tp``: DTensor tensor parallelism, ``parallelize_module`` (ColwiseParallel up-projection,
  RowwiseParallel down-projection) on a 1-D mesh named ("tp",) of the 4 ranks;
- ``pp``: ``torch.distributed.pipelining``, 4 stages of one block each, ScheduleGPipe with 4
  micro-batches (stage-to-stage send/recv);
- ``fsdp2_tp``: a 2-D mesh ("dp", "tp") = (2, 2): tensor parallel inside ``tp``, FSDP2
  ``fully_shard`` over ``dp``.

Seeds are fixed; timings (and so the trace bytes) vary from run to run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS), str(SCRIPTS.parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from analyzer.capture import profile_steps  # noqa: E402
from record_cpu_traces import SEED, Block, record_job  # noqa: E402

WORLD_SIZE = 4
WIDTH, HIDDEN, BLOCKS = 128, 512, 4
BATCH, SEQUENCE, MICROBATCHES = 8, 32, 4
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}

JOBS = {
    "tp": "DTensor tensor parallel over 4 ranks (parallelize_module: ColwiseParallel up, RowwiseParallel "
          "down), mesh dim 'tp'",
    "pp": "torch.distributed.pipelining: 4 stages x 1 block, ScheduleGPipe, 4 micro-batches",
    "fsdp2_tp": "2-D mesh ('dp', 'tp') = (2, 2): parallelize_module over 'tp', fully_shard over 'dp'",
}


def blocks() -> nn.Sequential:
    torch.manual_seed(SEED)  # same initial weights on every rank
    return nn.Sequential(*(Block(WIDTH, HIDDEN) for _ in range(BLOCKS)))


def tensor_parallel(model: nn.Sequential, mesh) -> nn.Sequential:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


def train(model: nn.Module, out_dir: str, rank: int, data_rank: int, step_fn=None) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(SEED + data_rank)  # one shard of data per DP rank
    with profile_steps(out_dir, **SCHEDULE) as prof:
        for _ in range(sum(SCHEDULE.values())):
            x = torch.randn(BATCH, SEQUENCE, WIDTH, generator=data)
            if step_fn is None:
                model(x).pow(2).mean().backward()
            else:
                step_fn(x)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()


def run_pipeline(rank: int, out_dir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage_module = blocks()[rank]  # stage r holds block r
    stage = PipelineStage(stage_module, rank, WORLD_SIZE, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=lambda out, target: out.pow(2).mean())

    def step(x):
        if rank == 0:
            schedule.step(x)
        elif rank == WORLD_SIZE - 1:
            schedule.step(target=torch.zeros_like(x), losses=[])
        else:
            schedule.step()

    train(stage_module, out_dir, rank, 0, step)


def train_rank(rank: int, job: str, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        if job == "tp":
            mesh = init_device_mesh("cpu", (WORLD_SIZE,), mesh_dim_names=("tp",))
            train(tensor_parallel(blocks(), mesh), out_dir, rank, 0)
        elif job == "pp":
            run_pipeline(rank, out_dir)
        elif job == "fsdp2_tp":
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            model = tensor_parallel(blocks(), mesh["tp"])
            for block in model:
                fully_shard(block, mesh=mesh["dp"])
            train(fully_shard(model, mesh=mesh["dp"]), out_dir, rank, mesh["dp"].get_local_rank())
        else:
            raise ValueError(f"unknown job {job!r}; choose from {', '.join(JOBS)}")
    finally:
        dist.destroy_process_group()


def readme_text() -> str:
    jobs = "\n".join(f"- `{job}/`: {JOBS[job]}" for job in JOBS)
    return f"""# Real 4-rank CPU traces of tensor / pipeline / 2-D parallelism (torch + gloo)

Recorded with `python scripts/record_parallel_cpu_traces.py` (torch {torch.__version__}, gloo, 4 ranks
spawned with `torch.multiprocessing` on 127.0.0.1, one thread per rank), {BLOCKS} pre-norm MLP blocks
({WIDTH} -> {HIDDEN} -> {WIDTH}), batch {BATCH} x {SEQUENCE} x {WIDTH}, loss = mean square, AdamW;
`analyzer.capture.profile_steps(wait={SCHEDULE["wait"]}, warmup={SCHEDULE["warmup"]}, \
active={SCHEDULE["active"]})`.

{jobs}

What they contain (torch 2.13 + gloo):

- `tp`: a 1-D DeviceMesh over the whole world reuses the default group (`pg_config` lists only
  `default_pg`); the TP all-reduces appear as `_c10d_functional::all_reduce` -> `c10d::allreduce_`
  (one in forward per RowwiseParallel layer, one in backward per ColwiseParallel layer), with
  DTensor's `_FromTorchTensor` / `_ToTorchTensor` / `Redistribute` autograd functions around them.
- `pp`: `c10d::send` / `c10d::recv_` in the default group, inside the schedule's `Forward i` /
  `Backward i` ranges.
- `fsdp2_tp`: `pg_config` lists `default_pg`, `mesh_dp` ([0, 2] or [1, 3]) and `mesh_tp` ([0, 1] or
  [2, 3]); gloo records no group on the collectives themselves (no `record_param_comms`), so the
  collectives cannot be told apart by group, only the declared groups by their descriptions.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SCRIPTS.parent / "sample_traces" / "cpu_gloo")
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    options = parser.parse_args(argv)
    for job in options.jobs:
        print(f"recording {job} -> {options.out / job}", flush=True)
        record_job(job, options.out, train_rank, WORLD_SIZE)
    (options.out / "PARALLEL.md").write_text(readme_text())


if __name__ == "__main__":
    main()
