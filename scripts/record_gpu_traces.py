"""Record real single-GPU CUDA + NCCL traces (one rank: DDP and FSDP2 on world size 1).

    python scripts/record_gpu_traces.py --out DIR          # needs torch with CUDA and one GPU

One GPU cannot host a multi-rank NCCL job (NCCL refuses two ranks on one device), so these
traces carry no cross-rank waits; what they check is everything a GPU trace of this torch /
CUDA / Kineto version brings: CUDA kernels on their streams, memcpy/memset, ``deviceProperties``,
``distributedInfo`` with the nccl backend, ProfilerStep and autograd markers, and whatever NCCL
launches for a one-rank all-reduce. tests/test_gpu_traces.py checks tracecliff against HTA on
the recorded files. Written through ``analyzer.capture.profile_steps``, as a user would.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from analyzer.capture import profile_steps  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from record_cpu_traces import TinyLanguageModel  # noqa: E402  (the same model, larger)

VOCAB, WIDTH, HIDDEN, BLOCKS = 8192, 1024, 4096, 6
BATCH, SEQUENCE = 8, 512
SCHEDULE = {"wait": 1, "warmup": 2, "active": 3}
SEED = 0


def wrap(job: str, model: nn.Module) -> nn.Module:
    if job == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=25)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cuda", (1,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def record(job: str, out_dir: Path) -> None:
    torch.manual_seed(SEED)
    model = wrap(job, TinyLanguageModel(VOCAB, WIDTH, HIDDEN, BLOCKS).cuda())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.Generator(device="cuda").manual_seed(SEED)
    with profile_steps(out_dir, **SCHEDULE) as prof:
        for _ in range(sum(SCHEDULE.values())):
            tokens = torch.randint(VOCAB, (BATCH, SEQUENCE), generator=data, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float(), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", default="ddp,fsdp2")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        for job in args.jobs.split(","):
            record(job, args.out / job)
            print(job, sorted(p.name for p in (args.out / job).iterdir()), flush=True)
    finally:
        dist.destroy_process_group()
    print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
          torch.cuda.get_device_name(0))


if __name__ == "__main__":
    main()
