"""CPU-only jobs on the gloo backend, with truth: the traces torch + gloo write (a ``c10d::*`` op
on the main thread, the work as a ``gloo:*`` range on a worker thread, ``distributedInfo`` with
``pg_config``, no GPU), for checks of what the host-side record can tell.

Each collective starts on every rank when that rank reaches it (its arrival, known here) and
ends once the last member arrived plus the transfer, each member finishing a little apart (gloo
ends are not aligned the way NCCL kernels' are: up to ``finish_spread_us``). Ranks on one host
read its clock: a host's ``clock_offset_us`` shifts every timestamp of its ranks, so the truth
holds each host's offset and, per collective, the rank that arrived last.

    write_gloo_job(GlooSpec(world_size=4), "out/gloo")   # rank-{r}.json.gz + truth.json
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .job import write_folder
from .kineto import os_pid

T0_US = 5_250_000_000_000.0  # a monotonic clock's µs since boot, as the recorded traces have


@dataclass(frozen=True)
class GlooSpec:
    name: str = "gloo_job"
    world_size: int = 4
    hosts: int = 1  # ranks spread over this many hosts, in blocks (torchrun's layout)
    steps: int = 2
    collectives_per_step: int = 8
    nbytes: int = 131072
    transfer_us: float = 900.0
    arrival_spread_us: float = 3000.0  # how far apart the ranks reach a collective
    finish_spread_us: float = 2000.0  # how far apart the members of one collective finish
    clock_offset_us: tuple[float, ...] = ()  # per host (0 when not given)
    seed: int = 0

    def host_of(self, rank: int) -> int:
        return rank * self.hosts // self.world_size


def gloo_job(spec: GlooSpec) -> tuple[dict[int, dict], dict]:
    """(rank -> Kineto trace object, truth)."""
    rng = np.random.default_rng(spec.seed)
    offsets = [spec.clock_offset_us[h] if h < len(spec.clock_offset_us) else 0.0 for h in range(spec.hosts)]
    events: dict[int, list[dict]] = {r: [] for r in range(spec.world_size)}
    truth_rows = []
    t = T0_US
    for step in range(spec.steps):
        starts = {r: t for r in range(spec.world_size)}
        step_start = t
        for k in range(spec.collectives_per_step):
            arrival = t + 200.0 + rng.uniform(0, spec.arrival_spread_us, spec.world_size)
            last = int(np.argmax(arrival))
            done = arrival.max() + spec.transfer_us
            finish = done + rng.uniform(0, spec.finish_spread_us, spec.world_size)
            for r in range(spec.world_size):
                clock = offsets[spec.host_of(r)]
                events[r] += _collective(r, arrival[r] + clock, finish[r] + clock, spec.nbytes)
            truth_rows.append({"step": step, "index": k, "last_rank": last,
                               "arrival_us": [round(float(a - step_start), 3) for a in arrival]})
            t = float(finish.max()) + 100.0
        for r in range(spec.world_size):
            clock = offsets[spec.host_of(r)]
            events[r].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": os_pid(r),
                              "tid": os_pid(r), "ts": round(starts[r] + clock, 3), "dur": round(t - starts[r], 3),
                              "args": {}})
    traces = {r: _trace(spec, r, events[r]) for r in range(spec.world_size)}
    last = [row["last_rank"] for row in truth_rows]
    truth = {"spec": asdict(spec), "clock_offset_us_by_host": offsets,
             "host_of_rank": [spec.host_of(r) for r in range(spec.world_size)],
             "collectives": truth_rows,
             "times_last": {str(r): last.count(r) for r in range(spec.world_size)}}
    return traces, truth


def _collective(rank: int, start: float, end: float, nbytes: int) -> list[dict]:
    pid = os_pid(rank)
    n = nbytes // 4
    return [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": pid, "ts": round(start - 30, 3),
         "dur": 60.0, "args": {"Input Dims": [[[n]], [], [], [], [], []],
                               "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid, "tid": pid + 1,
         "ts": round(start, 3), "dur": round(end - start, 3), "args": {"Input type": ["float"], "Input Dims": [[n]]}},
    ]


def _trace(spec: GlooSpec, rank: int, events: list[dict]) -> dict:
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": spec.world_size, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
                                           "pg_size": spec.world_size, "ranks": list(range(spec.world_size))}],
                            "host_name": f"host{spec.host_of(rank)}"},
        "traceEvents": sorted(events, key=lambda e: e["ts"]),
    }


def write_gloo_job(spec: GlooSpec, outdir: str | Path) -> Path:
    traces, truth = gloo_job(spec)
    return write_folder(outdir, traces, truth)
