"""Cost of hostile inputs by size (issue 41): each layout of tests/test_hostile_inputs.py at
several sizes, run as `python -m analyzer diagnose` (or `hang`) under an address-space limit;
prints the exit code, wall time and peak RSS of each. Past each limit (64 MB before or after
the events array, 32 MB for one event, 256 MB for a dump) both stay flat: the file is refused
as soon as it crosses the limit, whatever its size.

    python bench/bench_hostile.py [--sizes 100,400,1600] [--limit-gb 4]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1 << 20
EVENTS = ",".join(json.dumps({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000 + 10 * i,
                              "dur": 5, "args": {"device": 0, "stream": 7}}) for i in range(100)).encode()


def write_gz(path: Path, *parts) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as handle:
        for part in parts:
            if isinstance(part, tuple):
                block = part[0] * MB
                for _ in range(part[1]):
                    handle.write(block)
            else:
                handle.write(part)
    return path


LAYOUTS = {
    "string before the events": lambda p, n: write_gz(p, b'{"x": "', (b"A", n), b'", "traceEvents": [' + EVENTS + b"]}"),
    "event name": lambda p, n: write_gz(p, b'{"traceEvents": [' + EVENTS + b', {"ph": "X", "name": "', (b"A", n),
                                        b'", "ts": 1, "dur": 1}]}'),
    "string after the events": lambda p, n: write_gz(p, b'{"traceEvents": [' + EVENTS + b'], "x": "', (b"A", n), b'"}'),
    "whitespace in the array": lambda p, n: write_gz(p, b'{"traceEvents": [' + EVENTS + b",", (b" ", n), b"{}]}"),
}


def run(args: list[str], limit: int) -> tuple[int, float, float]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.monotonic()
    with open(os.devnull, "wb") as sink:
        child = subprocess.Popen([sys.executable, "-m", "analyzer", *args], stdout=sink, stderr=sink,
                                 preexec_fn=preexec)
        _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - start, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,400,1600", help="MB of the long value, comma-separated")
    parser.add_argument("--limit-gb", type=float, default=4.0)
    options = parser.parse_args()
    sizes = [int(s) for s in options.sizes.split(",")]
    limit = int(options.limit_gb * (1 << 30))
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in LAYOUTS.items():
            for size in sizes:
                path = make(Path(tmp) / "rank-0.json.gz", size)
                code, wall, peak = run(["diagnose", "--no-cache", str(path)], limit)
                print(f"{name:<26} {size:>6} MB ({path.stat().st_size / MB:6.1f} MB gz): exit {code}, "
                      f"{wall:6.2f} s, {peak:7.0f} MB")
        entry = {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
                 "profiling_name": "nccl:all_reduce", "state": "completed", "retired": True}
        for count in (10_000, 100_000, 2_000_000):
            path = Path(tmp) / "fr_rank_0"
            path.write_bytes(pickle.dumps({"version": "2.10", "entries": [entry] * count}))
            code, wall, peak = run(["hang", str(path)], limit)
            print(f"{'dump of shared entries':<26} {count:>9,} refs ({path.stat().st_size / MB:5.1f} MB): exit {code}, "
                  f"{wall:6.2f} s, {peak:7.0f} MB")


if __name__ == "__main__":
    main()
