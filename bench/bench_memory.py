"""Cost of the allocator's [memory] events (issue 39 item 7): `tracecliff diagnose` on one rank
with N allocator events besides the same kernels, for growing N. The cost must be linear in N
(the same µs an event at every size) with bounded memory (tens of bytes an event kept).

    python bench/bench_memory.py                       # N = 0, 250k, 500k, 1M
    python bench/bench_memory.py --events 0 2000000

Each trace: 10 ProfilerSteps of 2,000 kernels with their launches, and N [memory] events
spread over the steps (as torch 2.13 writes them: cpu_instant_event, Total Allocated/Reserved).
Each run is a fresh subprocess (wall time and peak RSS of the process tree).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scale import measure  # noqa: E402

STEPS, KERNELS, STEP_US = 10, 2000, 100_000.0


def write_trace(path: Path, events: int) -> None:
    with open(path, "w") as out:
        out.write('{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"NVIDIA H100 80GB HBM3",'
                  '"totalGlobalMem":85520809984}],"traceEvents":[')
        first = True

        def emit(event: dict) -> None:
            nonlocal first
            out.write(("" if first else ",") + json.dumps(event, separators=(",", ":")))
            first = False
        for step in range(STEPS):
            base = step * STEP_US
            emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                  "ts": base, "dur": STEP_US - 1})
            for k in range(KERNELS):
                ts = base + k * STEP_US / KERNELS
                emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                      "dur": 2, "args": {"correlation": step * KERNELS + k}})
                emit({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 3, "dur": 20,
                      "args": {"correlation": step * KERNELS + k, "stream": 7}})
        held = 0
        for k in range(events):  # alternating allocations and frees, spread over the steps
            size = 1 << (20 + k % 7)
            delta = size if k % 2 == 0 else -(1 << (20 + (k - 1) % 7))
            held += delta
            emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                  "ts": round(k * STEPS * STEP_US / max(events, 1), 3),
                  "args": {"Total Reserved": 1 << 34, "Total Allocated": (1 << 33) + held, "Bytes": delta,
                           "Device Id": 0, "Device Type": 1, "Addr": 140000000000 + k}})
        out.write("]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[0, 250_000, 500_000, 1_000_000])
    options = parser.parse_args(argv)
    base = None
    with tempfile.TemporaryDirectory() as folder:
        for n in options.events:
            path = Path(folder) / f"rank-0-{n}.json"
            write_trace(path, n)
            got = measure([sys.executable, "-m", "analyzer", "diagnose", str(path), "--no-cache",
                           "--format", "json", "-o", str(Path(folder) / "out.json")])
            base = base or got
            extra = (got["wall_s"] - base["wall_s"]) / n * 1e6 if n and base is not got else 0.0
            print(f"{n:>9,} [memory] events: {path.stat().st_size / 1e6:7.1f} MB file, wall {got['wall_s']:6.2f} s, "
                  f"peak RSS {got['tree_rss_mb']:7.0f} MB" + (f", {extra:.2f} µs per allocator event" if n else ""),
                  flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
