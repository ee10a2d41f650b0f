"""Record the real 2-rank CPU trace of a job whose FLOPs come from every op family tracecliff
counts (issue 29), in sample_traces/cpu_gloo/compute/ (torch + gloo, no GPU needed).

    python scripts/record_compute_cpu_traces.py

The model (``ComputeModel``) is a small causal language model whose ops cover what
analyzer.rank.flops reads from recorded shapes: ``F.scaled_dot_product_attention(is_causal=True)``
(CPU: ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), an attention
written by hand (``torch.matmul`` of 4-D tensors -> ``aten::bmm`` through broadcasting,
``torch.baddbmm`` with a bias), a depthwise and a dense ``nn.Conv1d`` over the sequence
(``aten::convolution`` / ``aten::convolution_backward``), linears with and without bias
(``aten::addmm`` / ``aten::mm`` through ``aten::matmul``), ``torch.mv`` on a pooled vector.
DistributedDataParallel over 2 ranks (gloo on 127.0.0.1), AdamW, fp32;
``analyzer.capture.profile_steps(wait=1, warmup=1, active=3)`` with ``record_shapes=True``.
Seeds are fixed; timings (and so the trace bytes) vary from run to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path[:0] = [str(SCRIPTS), str(SCRIPTS.parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from analyzer.capture import profile_steps  # noqa: E402
from record_cpu_traces import SEED, record_job  # noqa: E402

WORLD_SIZE = 2
VOCAB, WIDTH, HEADS, BLOCKS = 512, 128, 4, 2
BATCH, SEQUENCE = 4, 64
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
OUT = SCRIPTS.parent / "sample_traces" / "cpu_gloo"


class Attention(nn.Module):
    """Causal self-attention: SDPA (``fused``) or by hand (``torch.matmul`` + ``baddbmm``)."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((SEQUENCE, SEQUENCE), float("-inf")), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / (WIDTH // HEADS) ** 0.5  # 4-D: bmm
            probs = scores.add(self.mask[:s, :s]).softmax(-1).reshape(b * HEADS, s, s)
            bias = torch.zeros(1, s, WIDTH // HEADS)
            y = torch.baddbmm(bias, probs, v.reshape(b * HEADS, s, WIDTH // HEADS)).view(b, HEADS, s, -1)
        return self.out(y.transpose(1, 2).reshape(b, s, WIDTH))


class Block(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention(fused)
        self.mix = nn.Conv1d(WIDTH, WIDTH, 3, padding=1, groups=WIDTH)  # depthwise, over the sequence
        self.up = nn.Conv1d(WIDTH, 2 * WIDTH, 1)  # a dense 1x1 convolution
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.up(self.mix(self.norm2(x).transpose(1, 2)))
        return x + self.down(F.gelu(h).transpose(1, 2))


class ComputeModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block(fused=i % 2 == 0) for i in range(BLOCKS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.gate = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        pooled = torch.mv(self.gate, x.mean((0, 1)))  # aten::mv
        return self.head(x.flatten(0, 1)), pooled


def train_rank(rank: int, job: str, out_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(SEED)
        model = DistributedDataParallel(ComputeModel(), bucket_cap_mb=1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(SEED + rank)
        with profile_steps(out_dir, **SCHEDULE) as prof:
            for _ in range(sum(SCHEDULE.values())):
                tokens = torch.randint(VOCAB, (BATCH, SEQUENCE + 1), generator=data)
                logits, pooled = model(tokens[:, :-1])
                loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1)) + 1e-3 * pooled.square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                prof.step()
    finally:
        dist.destroy_process_group()


README = f"""# Real 2-rank CPU trace whose FLOPs cover every op family (issue 29)

Recorded with `python scripts/record_compute_cpu_traces.py` (torch {torch.__version__}, gloo, 2
ranks, one thread per rank): `ComputeModel` in the script, {BLOCKS} blocks of width {WIDTH}
({HEADS} heads): causal attention by `F.scaled_dot_product_attention` in block 0 and by hand
(4-D `torch.matmul`, `torch.baddbmm`) in block 1, a depthwise `Conv1d(k=3)` and a 1x1 `Conv1d`
over the sequence, linears with and without bias, `torch.mv`; batch {BATCH} x {SEQUENCE}
tokens per rank, DDP, AdamW, fp32; `profile_steps(wait=1, warmup=1, active=3)`,
`record_shapes=True` (steps 2-4).

`tests/test_flops_real.py` counts its FLOPs from the raw events with its own code and checks
tracecliff's per step against it.
"""


def main() -> None:
    print(f"recording compute -> {OUT / 'compute'}", flush=True)
    record_job("compute", OUT, train=train_rank, world_size=WORLD_SIZE)
    (OUT / "COMPUTE.md").write_text(README)


if __name__ == "__main__":
    main()
