"""A/B of two checkouts on one command, in milliseconds of CPU (``bench/ab.sh`` reads
/usr/bin/time, which rounds to 10 ms: too coarse for a run's fixed cost).

    python bench/ab_cpu.py OLD_CHECKOUT NEW_CHECKOUT N diagnose DIR --no-cache --format text -o /dev/null

Runs ``python -m analyzer ARGS...`` N times from each checkout (PYTHONPATH and the working
directory set to it), the two sides alternating and swapping which goes first, and prints each
side's median, best and quartiles of the CPU (user + sys of the process and of the children it
waited for, from ``wait4``), and the median of the paired differences (new - old): the figure a
machine whose speed drifts leaves the least noisy. Compile both checkouts first
(``python -m compileall -q analyzer rules reports``) where bytecode is not written by default.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys


def cpu_ms(tree: str, args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    child = subprocess.Popen([sys.executable, "-m", "analyzer", *args], cwd=tree, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: findings, still a whole run
        sys.exit(f"ab_cpu.py: a run from {tree} failed: rerun the command there to see why")
    return (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    old, new, count, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    runs: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(count):
        order = [("old", old), ("new", new)]
        for side, tree in order if i % 2 == 0 else order[::-1]:
            runs[side].append(cpu_ms(tree, args))
    for side in ("old", "new"):
        ordered = sorted(runs[side])
        quarter = len(ordered) // 4
        print(f"{side}: CPU median {statistics.median(ordered):.1f} ms, best {ordered[0]:.1f}, "
              f"quartiles {ordered[quarter]:.1f}-{ordered[-quarter - 1]:.1f} (n={len(ordered)})")
    paired = [b - a for a, b in zip(runs["old"], runs["new"])]
    print(f"new - old, median of the paired differences: {statistics.median(paired):+.1f} ms")


if __name__ == "__main__":
    main()
