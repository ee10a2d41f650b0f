"""Record sample_traces/cpu_gloo/memory_ddp/: 2-rank DDP on gloo with ``profile_memory=True``.

    python scripts/record_memory_cpu_traces.py

The job of scripts/record_cpu_traces.py (DDP, TinyLanguageModel, AdamW) with two planted
allocations whose sizes are the ground truth of tests/test_memory.py: each step allocates a
``TRANSIENT_BYTES`` buffer and frees it before the forward pass, and keeps a ``LEAK_BYTES``
tensor alive for the rest of the run (a leak: allocated at the step's end grows by it, step
after step). The sizes are written to ``truth.toml`` beside the traces.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from scripts import record_cpu_traces  # noqa: E402

JOB = "memory_ddp"
TRANSIENT_BYTES = 64 << 20  # far above anything the tiny model allocates at once (~10 MB of state)
LEAK_BYTES = 1 << 20


_LEAK: list = []  # what each step keeps for good (one list per spawned rank)


def plant() -> None:
    """At each step's start: a transient buffer allocated and freed, and a tensor kept."""
    transient = torch.empty(TRANSIENT_BYTES, dtype=torch.uint8)
    del transient
    _LEAK.append(torch.empty(LEAK_BYTES, dtype=torch.uint8))


def train_rank(rank: int, job: str, out_dir: str, port: int) -> None:
    record_cpu_traces.train_rank(rank, "ddp", out_dir, port, profile_memory=True, before_step=plant)


def main() -> None:
    out = REPO_ROOT / "sample_traces" / "cpu_gloo"
    record_cpu_traces.record_job(JOB, out, train=train_rank)
    (out / JOB / "truth.toml").write_text(  # not .json: the readers of the samples take every *.json* as a trace
        f"# scripts/record_memory_cpu_traces.py, torch {torch.__version__}; steps ProfilerStep#2..4\n"
        f"transient_bytes = {TRANSIENT_BYTES}\nleak_bytes_per_step = {LEAK_BYTES}\n")


if __name__ == "__main__":
    main()
