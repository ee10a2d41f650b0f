"""Measure the HTML report's size for synthetic 8- and 64-rank jobs (issue 5: < 2 MB and < 5 MB).

    python scripts/html_report_sizes.py [OUTDIR]

Generates the jobs with analyzer.synth (64 ranks: ddp_healthy_8r and fsdp_fullshard_2node scaled
to 64 GPUs), renders them as `diagnose --format html` does, prints bytes and timings, and exits 1
when a limit is exceeded."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.reports import render
from analyzer.synth import SCENARIOS, write_job

LIMITS = {8: 2_000_000, 64: 5_000_000}
JOBS = (("ddp_straggler", 8), ("fsdp_fullshard_2node", 8), ("ddp_healthy_8r", 64), ("fsdp_fullshard_2node", 64))


def measure(scenario: str, ranks: int, root: Path) -> tuple[int, float]:
    spec = dataclasses.replace(SCENARIOS[scenario], world_size=ranks, name=f"{scenario}_{ranks}")
    folder = root / spec.name
    write_job(spec, folder)
    started = time.perf_counter()
    result = diagnose([str(p) for p in sorted(folder.glob("rank-*.json.gz"))], DiagnoseOptions())
    html = render(result, "html")
    (root / f"{spec.name}.html").write_text(html, encoding="utf-8")
    return len(html.encode("utf-8")), time.perf_counter() - started


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tracecliff-html-"))
    root.mkdir(parents=True, exist_ok=True)
    failed = False
    for scenario, ranks in JOBS:
        size, seconds = measure(scenario, ranks, root)
        ok = size < LIMITS[ranks]
        failed |= not ok
        print(f"{scenario:24} {ranks:3} ranks  {size / 1e6:6.3f} MB  (limit {LIMITS[ranks] / 1e6:.0f} MB)  "
              f"{seconds:5.1f} s  {'ok' if ok else 'TOO BIG'}")
    print(f"reports in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
