"""Record real Flight Recorder dumps of hung jobs in sample_traces/flight_recorder/ (torch + gloo
on CPU, no GPU needed).

    python scripts/record_fr_dumps.py                       # every scenario
    python scripts/record_fr_dumps.py --scenarios skip_collective

Each scenario runs WORLD_SIZE ranks (torch.multiprocessing, gloo over 127.0.0.1, process-group
timeout TIMEOUT_S) that all-reduce a few times and then break in one way. Every rank writes its
dump both ways torch offers: ``json/fr_rank_<r>.json`` (``_dump_fr_trace_json``: no stack
frames) and ``pickle/fr_rank_<r>`` (``_dump_fr_trace``: the default format, with frames). A rank
dumps when its collective fails, when it has nothing left to do, or (the sleeping rank) from a
timer thread at the moment the others time out, as the dump-on-timeout signal would make it;
then it exits at once, as a killed job would.

Not recorded: p2p hangs. torch 2.13's gloo backend does not log send/recv in the flight
recorder (a recv that never matches leaves no entry), so the p2p checks are tested on
synthetic dumps (tests/test_hang.py).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 4
TIMEOUT_S = 3
HEALTHY_STEPS = 3
BAD_RANK = 2
OUT = Path(__file__).resolve().parents[1] / "sample_traces" / "flight_recorder"

SCENARIOS = {
    "healthy": "every rank all-reduces 4 times and finishes (no hang: the control)",
    "skip_collective": f"rank {BAD_RANK} skips the 4th all-reduce (a rank-dependent branch)",
    "different_collectives": f"rank {BAD_RANK} broadcasts where the others all-reduce (4th collective)",
    "sleep_past_timeout": f"rank {BAD_RANK} sleeps {2 * TIMEOUT_S} s before the 4th all-reduce "
                          f"(timeout {TIMEOUT_S} s); it dumps when the others time out",
    "size_mismatch": f"rank {BAD_RANK} all-reduces 5 elements where the others all-reduce 4",
}


def _dump(out: Path, rank: int) -> None:
    json_dir, pickle_dir = out / "json", out / "pickle"
    json_dir.mkdir(parents=True, exist_ok=True)
    pickle_dir.mkdir(parents=True, exist_ok=True)
    c10d = torch._C._distributed_c10d
    (json_dir / f"fr_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    (pickle_dir / f"fr_rank_{rank}").write_bytes(c10d._dump_fr_trace(True, True, False))


def _last_step(scenario: str, rank: int, tensor: torch.Tensor, out: Path) -> None:
    """The fourth collective, broken the scenario's way on BAD_RANK."""
    bad = rank == BAD_RANK
    if scenario == "skip_collective" and bad:
        return
    if scenario == "different_collectives" and bad:
        dist.broadcast(tensor, src=0)
    elif scenario == "size_mismatch" and bad:
        dist.all_reduce(torch.ones(5))
    elif scenario == "sleep_past_timeout" and bad:
        # The dump-on-timeout signal reaches the sleeper while it sleeps; the job is then killed.
        threading.Timer(TIMEOUT_S + 1.0, lambda: (_dump(out, rank), os._exit(0))).start()
        time.sleep(2 * TIMEOUT_S)
    else:
        dist.all_reduce(tensor)


def _worker(rank: int, scenario: str, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=TIMEOUT_S))
    tensor = torch.ones(4)
    try:
        for _ in range(HEALTHY_STEPS):
            dist.all_reduce(tensor)
        _last_step(scenario, rank, tensor, out)
    except RuntimeError:
        pass  # the timeout (or gloo's own error): the moment the watchdog would dump
    _dump(out, rank)
    os._exit(0)  # no destroy_process_group: a hung job does not shut down cleanly


def record(scenario: str, port: int) -> None:
    out = OUT / scenario
    for old in [*out.glob("json/*"), *out.glob("pickle/*")]:
        old.unlink()
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # turns the flight recorder on
    mp.start_processes(_worker, args=(scenario, out, port), nprocs=WORLD_SIZE, start_method="spawn")
    print(f"{scenario}: {sorted(p.name for p in out.glob('*/*'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args()
    for offset, scenario in enumerate(args.scenarios):
        record(scenario, 29650 + offset)
    print(f"torch {torch.__version__}; descriptions: {SCENARIOS}")


if __name__ == "__main__":
    main()
