"""Speed and memory of `tracecliff diagnose` on one big rank, against two baselines measured in
the same run: a bare typed msgspec decode of the same file (the floor: reading the bytes and
decoding the fields tracecliff needs) and HTA's TraceAnalysis load (the tool users know).

    python bench/bench_ingest.py                 # makes /tmp/tracecliff-bench-500mb.json once
    python bench/bench_ingest.py --trace FILE    # any single-rank trace
    python bench/bench_ingest.py --mb 100 --no-hta

Each measurement runs in a fresh subprocess (interpreter start included for all three) and
reports wall time and peak RSS. Targets (issue 2): diagnose <= 1.5x the bare decode,
>= 10x faster than HTA's load, peak RSS <= 0.5x HTA's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scale import measure as measure_tree  # noqa: E402  (wall time + process-tree peak RSS)
SOURCE = Path(os.environ.get("TRACECLIFF_REAL_TRACES", HERE.parent.parent / "shared" / "traces" / "real")) \
    / "hta_ddp_rank0_of_2" / "rank-0.json.gz"

BARE_DECODE = """
import sys
from pathlib import Path
from analyzer.ingest.files import read_trace_bytes
from analyzer.ingest.schema import TRACE_DECODER
doc = TRACE_DECODER.decode(read_trace_bytes(Path(sys.argv[1])))
print(len(doc.traceEvents))
"""

HTA_LOAD = """
import os, sys, logging
logging.disable(logging.CRITICAL)
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="", include_last_profiler_step=True)
print(len(t.t.traces[0]))
"""


def measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB of the whole process tree: diagnose may fork a helper) of one
    command in a fresh process."""
    row = measure_tree(argv)
    return row["wall_s"], row["tree_rss_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, help="single-rank trace to measure (default: generate one)")
    parser.add_argument("--mb", type=float, default=500.0, help="size of the generated trace")
    parser.add_argument("--no-hta", action="store_true", help="skip the HTA baseline")
    parser.add_argument("--repeat", type=int, default=1, help="best of N for the two fast commands")
    args = parser.parse_args()
    trace = args.trace or Path(tempfile.gettempdir()) / f"tracecliff-bench-{int(args.mb)}mb.json"
    if not trace.exists():
        print(f"generating {trace} from {SOURCE} ...", flush=True)
        subprocess.run([sys.executable, str(HERE / "make_big_trace.py"), str(SOURCE), str(trace),
                        "--mb", str(args.mb)], check=True)
    size_mb = trace.stat().st_size / 1e6
    py = sys.executable
    rows = {}
    rows["bare msgspec decode"] = min((measure([py, "-c", BARE_DECODE, str(trace)]) for _ in range(args.repeat)))
    diagnose = [py, "-m", "analyzer", "diagnose", str(trace), "--format", "json", "--no-cache", "-o", os.devnull]
    rows["tracecliff diagnose"] = min((measure(diagnose) for _ in range(args.repeat)))
    rows["  same, one core"] = min((measure(diagnose + ["--workers", "1"]) for _ in range(args.repeat)))
    if not args.no_hta:
        rows["HTA TraceAnalysis load"] = measure([py, "-c", HTA_LOAD, str(trace)])
    print(f"\ntrace: {trace} ({size_mb:,.0f} MB)")
    print(f"{'command':<26} {'wall s':>8} {'peak RSS MB':>12}")
    for name, (wall, rss) in rows.items():
        print(f"{name:<26} {wall:>8.2f} {rss:>12,.0f}")
    diag_wall, diag_rss = rows["tracecliff diagnose"]
    bare_wall, _ = rows["bare msgspec decode"]
    print(f"\ndiagnose / bare decode wall: {diag_wall / bare_wall:.2f}x   (target <= 1.5x; "
          f"one core: {rows['  same, one core'][0] / bare_wall:.2f}x)")
    if "HTA TraceAnalysis load" in rows:
        hta_wall, hta_rss = rows["HTA TraceAnalysis load"]
        print(f"HTA load / diagnose wall:    {hta_wall / diag_wall:.1f}x   (target >= 10x)")
        print(f"diagnose / HTA peak RSS:     {diag_rss / hta_rss:.2f}x   (target <= 0.5x)")
    print("wall includes interpreter start and imports; peak RSS is the command's whole process tree "
          "(diagnose of one large rank decodes on two processes when two CPUs are free).")


if __name__ == "__main__":
    main()
