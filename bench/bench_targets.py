"""Issue 42's figures in one run: the three shapes' CPU against the decode floor and HTA, the
1,024-rank reduce and every command's peak memory.

    python bench/bench_targets.py                # full size (HTA takes minutes)
    python bench/bench_targets.py --repeat 3 --no-hta
    python bench/bench_targets.py --no-reduce
    python bench/bench_targets.py --stages    # each shape's CPU by stage, in-process (the profile)

Shapes (files made once under --dir, never in the repository):
- light: bench_shapes.py's 8 x 50 MB few-collectives job (the real HTA DDP rank, tiled);
- one rank: the same rank tiled to 118 MB of JSON, gzipped (~608,000 events: bench_ingest.py's
  shape), read by the default `diagnose` (two processes on two CPUs);
- heavy: bench_shapes.py's 8 x 50 MB collective-heavy job (~10,300 collectives a rank).
Each command runs in a fresh process (interpreter start included) `--repeat` times, the median
kept; its CPU is user + system of the whole process tree. The floor is the bare typed decode
(ISA-L + msgspec of the fields tracecliff reads) of each file in a fresh process, CPU summed over
the job's files; HTA is `TraceAnalysis` on the same files, once (it takes minutes). Ratios are
taken in the same run, so a loaded machine moves both sides; they are printed, never asserted
(the CI check is bench/speed_check.py). The reduce is bench_reduce.py in its own process.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_ingest import BARE_DECODE, HTA_LOAD, SOURCE  # noqa: E402  (the floor and HTA's load)
from bench_scale import make_job  # noqa: E402
from bench_shapes import BLANKS, HTA_JOB, diagnose, heavy_source, large_rank, timed  # noqa: E402

# One shape's `diagnose --format json` by stage, in a fresh process with one worker (so that
# process_time is all of it), CPU seconds: imports, the per-rank map (decode, columns, per-rank
# analysis), combine, job analysis, rules, the report sections (step timeline, scaling what-if)
# and the JSON; the bare decode of the same files first, in the same process, for the ratio.
STAGES = """
import sys, time
import analyzer.cli
from pathlib import Path
t0 = time.process_time()
from analyzer.api import DiagnoseOptions, add_report_sections, analyze_files, check_selection
from analyzer.base.gc_pause import paused_gc
from analyzer.ingest.files import discover_trace_files, read_trace_bytes
from analyzer.ingest.schema import TRACE_DECODER
from analyzer.job.analysis import analyze_job
from analyzer.job.reduce import build_result
from analyzer.rules.engine import run_rules
from analyzer.whatif.gains import WHATIF_GAINS
marks = [("imports", time.process_time())]
files = discover_trace_files([sys.argv[1]])
for f in files:
    TRACE_DECODER.decode(read_trace_bytes(f))
floor = time.process_time() - marks[-1][1]
marks.append(("floor", time.process_time()))
options = DiagnoseOptions(workers=1)
ranks = analyze_files(files, options, keep_kernels=True)
marks.append(("map", time.process_time()))
with paused_gc():
    result = build_result(ranks, options)
    marks.append(("combine", time.process_time()))
    analyze_job(result, options)
    marks.append(("job analysis", time.process_time()))
    run_rules(result, None, gains=WHATIF_GAINS)
    marks.append(("rules", time.process_time()))
    add_report_sections(result, options)
    marks.append(("report sections", time.process_time()))
    for _ in result.json_chunks():
        pass
    marks.append(("JSON", time.process_time()))
times = {name: b - a for (_, a), (name, b) in zip([("start", t0)] + marks, marks)}
times.pop("floor")
print(" ".join(f"{name.replace(' ', '_')}={value:.3f}" for name, value in times.items()), f"floor={floor:.3f}")
"""

TARGETS = {"light": 0.9, "one rank": 1.2, "heavy": 1.5}  # CPU against the floor (issue 42)
HTA_TARGET = 10.0
REDUCE_TARGET_S, REDUCE_TARGET_MB = 12.0, 2048.0


def median_run(argv: list[str], repeat: int) -> dict[str, float]:
    """Each figure's median over ``repeat`` fresh-process runs."""
    runs = [timed(argv) for _ in range(repeat)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def floor(files: list[Path], repeat: int) -> dict[str, float]:
    """The decode floor of ``files``: each decoded bare in a fresh process, the median per file,
    CPU and wall summed, the largest peak."""
    runs = [median_run([sys.executable, "-c", BARE_DECODE, str(f)], repeat) for f in files]
    return {"wall_s": sum(r["wall_s"] for r in runs), "cpu_s": sum(r["cpu_s"] for r in runs),
            "tree_rss_mb": max(r["tree_rss_mb"] for r in runs)}


def shapes(work: Path, rank_mb: float, one_mb: float) -> dict[str, tuple[list[Path], str]]:
    """Each shape's files and what diagnose is given (the job's folder or the one file)."""
    light = make_job(work / "few-collectives", 8, rank_mb, SOURCE, header_separators=BLANKS)
    heavy = make_job(work / "collective-heavy-tp", 8, rank_mb, heavy_source(work.parent / "heavy-source-tp.json"),
                     header_separators=BLANKS)
    one = large_rank(work, one_mb)
    return {"light": (light, str(light[0].parent)), "one rank": ([one], str(one)),
            "heavy": (heavy, str(heavy[0].parent))}


def reduce_figures(ranks: int, collectives: int) -> dict[str, float]:
    """bench_reduce.py's reduce total (wall, CPU) and peak RSS, in a fresh process."""
    out = subprocess.run([sys.executable, str(HERE / "bench_reduce.py"), "--ranks", str(ranks), "--collectives",
                          str(collectives), "--output", str(Path(tempfile.gettempdir()) / "w-bench-reduce.json")],
                         check=True, capture_output=True, text=True).stdout
    print(out.rstrip())
    total = re.search(r"reduce total \(combine\.\.save\):\s+([\d.]+) s\s+([\d.]+) s", out)
    peak = re.search(r"peak ([\d,]+) MB", out)
    assert total and peak, out
    return {"wall_s": float(total[1]), "cpu_s": float(total[2]), "peak_mb": float(peak[1].replace(",", ""))}


def stages(jobs: dict[str, tuple[list[Path], str]], repeat: int) -> None:
    """Each shape's CPU by stage (STAGES), the run with the least total of ``repeat``."""
    print(f"\nCPU by stage, in-process, one worker (best of {repeat}); the map includes decode, columns, analysis")
    for shape, (_, target) in jobs.items():
        runs = []
        for _ in range(repeat):
            out = subprocess.run([sys.executable, "-c", STAGES, target], check=True, capture_output=True, text=True,
                                 cwd=HERE.parent).stdout.split()
            runs.append({k: float(v) for k, v in (item.split("=") for item in out)})
        row = min(runs, key=lambda r: sum(r.values()) - r["floor"])
        total = sum(row.values()) - row["floor"] - row["imports"]
        print(f"  {shape:<9} " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in row.items() if k != "floor")
              + f"; total after imports {total:.2f} s against the bare decode's {row['floor']:.2f} s"
              f" ({total / row['floor']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="median of N for tracecliff and the floor")
    parser.add_argument("--no-hta", action="store_true")
    parser.add_argument("--no-reduce", action="store_true")
    parser.add_argument("--stages", action="store_true", help="only each shape's CPU by stage, in-process")
    parser.add_argument("--rank-mb", type=float, default=50.0, help="each job rank's JSON size")
    parser.add_argument("--one-mb", type=float, default=118.0, help="the one rank's JSON size")
    parser.add_argument("--ranks", type=int, default=1024, help="the reduce's ranks")
    parser.add_argument("--collectives", type=int, default=2000, help="the reduce's collectives per rank")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tracecliff-shapes")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # users run with .pyc files
    work = args.dir / f"targets-{args.rank_mb:g}"
    work.mkdir(parents=True, exist_ok=True)
    jobs = shapes(work, args.rank_mb, args.one_mb)
    timed(diagnose(jobs["light"][1], workers="1"))  # warm-up: the bytecode cache
    if args.stages:
        stages(jobs, args.repeat)
        return
    with open("/proc/loadavg") as handle:
        print(f"{os.cpu_count()} CPUs, load average {handle.read().split()[0]}; median of {args.repeat}")
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for shape, (files, target) in jobs.items():
        row = {"tracecliff": median_run(diagnose(target), args.repeat), "floor": floor(files, args.repeat)}
        if not args.no_hta:
            hta = HTA_LOAD if len(files) == 1 else HTA_JOB
            row["HTA"] = timed([sys.executable, "-c", hta, str(files[0]) if len(files) == 1 else target])
        size = sum(f.stat().st_size for f in files) / 1e6
        print(f"\n{shape}: {len(files)} file(s), {size:,.0f} MB")
        for name, r in row.items():
            print(f"  {name:<11} wall {r['wall_s']:7.2f} s  CPU {r['cpu_s']:7.2f} s  tree peak {r['tree_rss_mb']:7,.0f} MB")
        rows[shape] = row
    print("\nratios (CPU)")
    for shape, row in rows.items():
        ours = row["tracecliff"]["cpu_s"]
        line = f"  {shape:<9} tracecliff / floor {ours / row['floor']['cpu_s']:5.2f}x (target <= {TARGETS[shape]}x)"
        if "HTA" in row:
            line += (f"   HTA / tracecliff {row['HTA']['cpu_s'] / ours:5.1f}x CPU,"
                     f" {row['HTA']['wall_s'] / row['tracecliff']['wall_s']:5.1f}x wall (target >= {HTA_TARGET:g}x)")
        print(line)
    print("peak memory (tree RSS): " + ", ".join(
        f"{shape} {row['tracecliff']['tree_rss_mb']:,.0f} MB" for shape, row in rows.items()))
    if not args.no_reduce:
        print(f"\nreduce, {args.ranks} ranks x {args.collectives} collectives")
        red = reduce_figures(args.ranks, args.collectives)
        print(f"  reduce total {red['cpu_s']:.2f} s CPU, {red['wall_s']:.2f} s wall (target <= {REDUCE_TARGET_S:g} s);"
              f" peak {red['peak_mb']:,.0f} MB (target <= {REDUCE_TARGET_MB:,.0f} MB)")


if __name__ == "__main__":
    main()
