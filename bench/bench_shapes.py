"""Per-rank cost on two trace shapes against the decode floor and HTA, in one run (issue 13).

    python bench/bench_shapes.py --quick      # 8 x 10 MB jobs, a 40 MB rank: a few minutes
    python bench/bench_shapes.py              # 8 x 50 MB jobs, a ~200 MB rank (HTA takes minutes)
    python bench/bench_shapes.py --no-hta
    python bench/bench_shapes.py --per-rank-only   # one 50 MB rank of each shape: a minute

Shapes, tiled in time to the size asked (bench/make_big_trace.py):
- few collectives: the real HTA DDP rank (../shared/traces/real/hta_ddp_rank0_of_2);
- collective-heavy: a synthetic rank of Megatron-style tensor parallelism over per-parameter
  all-reduce data parallelism (analyzer.synth, GPT_SMALL with biases and 24 blocks, bucket_cap_mb
  tiny so every gradient tensor is its own all-reduce, four tensor-parallel all-reduces per
  block, collective args on the CPU ops only as Kineto wrote them before copying them onto the
  kernels): ~10,300 collective kernels per 50 MB (heavy-source-tp.json, folder
  collective-heavy-tp; the earlier 8,848-kernel shape, heavy-source-24l.json, is left as it is).
For each single rank the map's CPU is also split by stage (imports, decode, columns, per-rank
analysis; in-process timers in a fresh process), the rest of `diagnose` being the reduce, rules
and render. Each job's CPU is set against its decode floor (issue 28): every file decoded bare
in a fresh process of its own, CPU summed (the per-rank floor, eight times); the same decode by
one pool of a process per CPU (bench_scale.py's floor) is printed beside it.
Each job's files get a `"distributedInfo": {"rank": N, ...}` header written with blanks, since
HTA finds the rank with the regex `"rank":\\s+(\\d+)`. Every command runs in a fresh process
(interpreter start included) with the bytecode cache allowed (a warm-up run fills it), and
reports wall, CPU (user + system of the whole process tree) and the tree's peak RSS. Ratios
are printed, never asserted: timings on a shared machine are not test material.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_ingest import BARE_DECODE, HTA_LOAD, SOURCE  # noqa: E402  (same floor and HTA load)
from bench_scale import DECODE_FLOOR, make_job, measure  # noqa: E402  (wall + process-tree peak RSS)
from make_big_trace import tile  # noqa: E402

HTA_JOB = """
import os, sys, logging
logging.disable(logging.CRITICAL)
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
print(len(t.t.traces))
"""
BLANKS = (", ", ": ")
# The per-rank map alone, in a fresh process, CPU seconds by stage: imports of the map's
# modules, the streamed decode (inflate, cut, msgspec), the columns (ColumnBuilder.add and
# finish, timed around their calls) and the per-rank analysis; "rest of diagnose" in the
# table is the command's CPU less this (the CLI's other imports, reduce, rules, render).
BREAKDOWN = """
import sys, time
t0 = time.process_time()
from pathlib import Path
from analyzer.ingest import loader
from analyzer.ingest.columns import ColumnBuilder
from analyzer.rank.analysis import RankOptions, analyze_rank
t1 = time.process_time()
columns = [0.0]
def timed(method):
    def run(*args):
        start = time.process_time()
        try:
            return method(*args)
        finally:
            columns[0] += time.process_time() - start
    return run
ColumnBuilder.add, ColumnBuilder.finish = timed(ColumnBuilder.add), timed(ColumnBuilder.finish)
trace = loader.load_rank_trace(Path(sys.argv[1]))
t2 = time.process_time()
analyze_rank(trace, RankOptions())
t3 = time.process_time()
print(f"{t1 - t0:.4f} {t2 - t1 - columns[0]:.4f} {columns[0]:.4f} {t3 - t2:.4f}")
"""
STAGES = ("imports", "decode", "columns", "per-rank analysis")


def heavy_source(path: Path) -> Path:
    """One rank of a job with Megatron-style tensor parallelism (an all-reduce of the block's
    16 MiB of activations after attention and after the MLP, and of their gradients in backward)
    over per-parameter all-reduce data parallelism (every gradient tensor its own bucket), 24
    blocks, shapes not recorded (torch's default), collective args on record_param_comms and not
    on the kernels (Kineto before torch copied them there): ~10,300 collective kernels per 50 MB.
    Every collective is issued as torch does (~15 events: c10d op, record_param_comms, nccl
    annotations, launch, event record/wait, kernel, flow arrows); the non-collective kernels are
    a block's own (~60), which is what bounds the density."""
    if not path.exists():
        from analyzer.synth import simulate
        from analyzer.synth.scenarios import GPT_SMALL
        spec = replace(GPT_SMALL, name="tp_per_parameter_allreduce", bucket_cap_mb=0.0001, world_size=8, steps=2,
                       n_layers=24, record_shapes=False, tp_allreduce_mb=16.0, kernel_comm_args=False)
        path.write_text(json.dumps(simulate(spec).rank_traces[0]))
    return path


def shapes_source(path: Path) -> Path:
    """One rank of the heavy source's model profiled with record_shapes=True: matrix multiplies,
    attention and their backward ops carry their recorded arguments (analyzer.rank.flops reads
    them)."""
    if not path.exists():
        from analyzer.synth import simulate
        from analyzer.synth.scenarios import GPT_SMALL
        spec = replace(GPT_SMALL, name="record_shapes", bucket_cap_mb=25.0, world_size=8, steps=2, n_layers=24,
                       record_shapes=True)
        path.write_text(json.dumps(simulate(spec).rank_traces[0]))
    return path


def count_collectives(path: Path) -> tuple[int, int]:
    """(communication kernels, events carrying a Process Group Ranks string) in a trace."""
    data = path.read_bytes()
    return data.count(b'"cat":"kernel","name":"nccl'), data.count(b'"Process Group Ranks"')


def timed(argv: list[str]) -> dict[str, float]:
    """measure() plus the CPU seconds of the command's whole process tree (reaped children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = measure(argv)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return row


def best(argv: list[str], repeat: int) -> dict[str, float]:
    return min((timed(argv) for _ in range(repeat)), key=lambda row: row["wall_s"])


def breakdown(path: Path, repeat: int) -> dict[str, float]:
    """CPU seconds of the per-rank map by stage (BREAKDOWN), the run with the least total."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", BREAKDOWN, str(path)], check=True, capture_output=True, text=True)
        runs.append(dict(zip(STAGES, map(float, out.stdout.split()))))
    return min(runs, key=lambda row: sum(row.values()))


def diagnose(*paths: str, workers: str | None = None) -> list[str]:
    extra = ["--workers", workers] if workers else []
    return [sys.executable, "-m", "analyzer", "diagnose", *paths, "--format", "json", "--no-cache",
            "-o", os.devnull, *extra]


def floor_per_file(files: list[Path]) -> dict[str, float]:
    """The job's decode floor as the per-rank one, summed: each file decoded bare (typed msgspec,
    the fields tracecliff reads) in a fresh process; wall and CPU summed, the largest tree peak."""
    runs = [timed([sys.executable, "-c", BARE_DECODE, str(f)]) for f in files]
    return {"wall_s": sum(r["wall_s"] for r in runs), "cpu_s": sum(r["cpu_s"] for r in runs),
            "tree_rss_mb": max(r["tree_rss_mb"] for r in runs), "tree_pss_mb": max(r["tree_pss_mb"] for r in runs)}


def show(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'command':<34} {'wall s':>7} {'CPU s':>7} {'tree peak MB':>13} {'tree peak PSS MB':>17}")
    for name, row in rows.items():
        print(f"  {name:<34} {row['wall_s']:>7.2f} {row['cpu_s']:>7.2f} {row['tree_rss_mb']:>13,.0f}"
              f" {row['tree_pss_mb']:>17,.0f}")


def ratio(label: str, value: float, target: str) -> None:
    print(f"  {label:<52} {value:>6.2f}x   (target {target})")


def large_rank(work: Path, big_mb: float) -> Path:
    """The few-collectives rank tiled to ``big_mb`` MB of JSON, gzipped (made once)."""
    big = work / f"one-rank-{big_mb:g}mb.json.gz"
    if not big.exists():
        print(f"making {big} ...", flush=True)
        plain = work / "one-rank.tmp.json"
        tile(SOURCE, plain, big_mb)
        with open(plain, "rb") as src, gzip.open(big, "wb", compresslevel=6) as out:
            shutil.copyfileobj(src, out, 16 << 20)
        plain.unlink()
    return big


def per_rank_ratios(per_rank: dict[str, dict[str, dict[str, float]]]) -> None:
    for shape, rows in per_rank.items():
        bare = rows["bare typed msgspec decode"]["cpu_s"]
        ratio(f"per-rank CPU, {shape}: diagnose / bare decode", rows["diagnose --workers 1"]["cpu_s"] / bare,
              "<= 1.3x")
        ratio("  the map alone (imports, decode, columns, analysis) / bare", rows["map"]["cpu_s"] / bare, "<= 1.3x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 x 10 MB jobs and a 40 MB rank")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA (it takes minutes at full size)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for the single-rank commands")
    parser.add_argument("--per-rank-only", action="store_true",
                        help="only the one-rank CPU figures of both shapes (no large rank, no jobs)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tracecliff-shapes")
    args = parser.parse_args()
    rank_mb, big_mb = (10.0, 40.0) if args.quick else (50.0, 200.0)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # users run with .pyc files: so do we
    work = args.dir / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    # New names for a changed shape: files of an earlier shape may serve others as references.
    sources = {"few collectives": (SOURCE, "few-collectives"),
               "collective-heavy": (heavy_source(args.dir / "heavy-source-tp.json"), "collective-heavy-tp"),
               "recorded shapes": (shapes_source(args.dir / "shapes-source.json"), "record-shapes")}
    jobs = {}
    for shape, (source, name) in sources.items():
        folder = work / name
        if not (folder / "rank-7.json").exists():
            shutil.rmtree(folder, ignore_errors=True)
            print(f"making 8 ranks x {rank_mb:g} MB ({shape}) in {folder} ...", flush=True)
        jobs[shape] = make_job(folder, 8, rank_mb, source, header_separators=BLANKS)
    timed(diagnose(str(jobs["few collectives"][0]), workers="1"))  # warm-up: fills the bytecode cache
    py = sys.executable

    print(f"\n{os.cpu_count()} CPUs; wall and CPU include interpreter start; best of {args.repeat} for single ranks")
    per_rank = {}
    for shape, files in jobs.items():
        kernels, groups = count_collectives(files[0])
        rows = {"bare typed msgspec decode": best([py, "-c", BARE_DECODE, str(files[0])], args.repeat),
                "diagnose --workers 1": best(diagnose(str(files[0]), workers="1"), args.repeat)}
        show(f"one rank, {shape}: {files[0].stat().st_size / 1e6:.0f} MB, {kernels:,} collective kernels, "
             f"{groups:,} events with Process Group Ranks", rows)
        stages = breakdown(files[0], args.repeat)
        rest = rows["diagnose --workers 1"]["cpu_s"] - sum(stages.values())
        print("  CPU by stage (the map alone, in-process timers): "
              + ", ".join(f"{name} {value:.2f} s" for name, value in stages.items())
              + f"; rest of diagnose (CLI imports, reduce, rules, render) {rest:.2f} s")
        rows["map"] = {"cpu_s": sum(stages.values())}
        per_rank[shape] = rows
    if args.per_rank_only:
        print("\nratios")
        per_rank_ratios(per_rank)
        return
    big = large_rank(work, big_mb)
    rows = {"bare decode, one core": best([py, "-c", BARE_DECODE, str(big)], args.repeat),
            "diagnose (default: two processes)": best(diagnose(str(big)), args.repeat)}
    if not args.no_hta:
        rows["HTA TraceAnalysis load"] = timed([py, "-c", HTA_LOAD, str(big)])
    show(f"one large rank: {big.name}, {big.stat().st_size / 1e6:.0f} MB gzip", rows)
    big_rows = rows
    job_rows = {}
    for shape, files in jobs.items():
        rows = {"diagnose (default workers)": timed(diagnose(str(files[0].parent)))}
        rows["decode floor, a process per file"] = floor_per_file(files)
        rows["decode floor, one pool"] = timed([py, "-c", DECODE_FLOOR, str(files[0].parent), str(os.cpu_count() or 1)])
        if not args.no_hta:
            rows["HTA TraceAnalysis(trace_dir)"] = timed([py, "-c", HTA_JOB, str(files[0].parent)])
        size = sum(f.stat().st_size for f in files) / 1e6
        show(f"job, {shape}: 8 ranks, {size:,.0f} MB", rows)
        job_rows[shape] = rows

    print("\nratios")
    per_rank_ratios(per_rank)
    ratio("large rank wall: diagnose / one-core bare decode",
          big_rows["diagnose (default: two processes)"]["wall_s"] / big_rows["bare decode, one core"]["wall_s"],
          "<= 1.3x")
    if not args.no_hta:
        ratio("large rank wall: HTA / diagnose", big_rows["HTA TraceAnalysis load"]["wall_s"]
              / big_rows["diagnose (default: two processes)"]["wall_s"], ">= 12x")
        for shape, rows in job_rows.items():
            ours, hta = rows["diagnose (default workers)"], rows["HTA TraceAnalysis(trace_dir)"]
            ratio(f"8-rank job wall, {shape}: HTA / diagnose", hta["wall_s"] / ours["wall_s"], ">= 10x")
            ratio(f"8-rank job tree peak, {shape}: diagnose / HTA", ours["tree_rss_mb"] / hta["tree_rss_mb"],
                  "<= 0.25x")
            # RSS counts a forked worker's pages shared with its parent once per process; PSS once.
            ratio(f"8-rank job tree peak PSS, {shape}: diagnose / HTA", ours["tree_pss_mb"] / hta["tree_pss_mb"],
                  "<= 0.25x")
    for shape, rows in job_rows.items():
        ours = rows["diagnose (default workers)"]
        ratio(f"8-rank job CPU, {shape}: diagnose / decode floor", ours["cpu_s"]
              / rows["decode floor, a process per file"]["cpu_s"], "<= 1.3x; floor: a process per file")
        ratio("  the same against one pool's decode", ours["cpu_s"] / rows["decode floor, one pool"]["cpu_s"],
              "none; a process per CPU")


if __name__ == "__main__":
    main()
