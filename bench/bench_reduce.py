"""The reduce at job scale: everything after the per-rank map (combining the ranks, cross-rank
matching, fits, rules, serialisation) for a job of many small ranks, without reading files.

    python bench/bench_reduce.py --ranks 1024 --collectives 2000

One synthetic rank (sample_traces/synthetic/ddp_healthy_8r, rank 0) is analysed once, its
collectives tiled to the count asked (steps repeated), and cloned per rank with the rank
number changed, so the reduce sees a job of ``ranks`` x ``collectives`` rows. Prints the time of
each stage (wall, and CPU seconds of this process: the machine may be shared), the size of the
JSON and of the rows file beside it (a result of more than analyzer.job.large.JSON_ROWS rows:
docs/scale.md), and the peak memory (RSS from /proc), in one run.
"""

from __future__ import annotations

import argparse
import copy
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

# This checkout's analyzer, not an installed one (the script's folder is bench/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import analyzer.cli  # noqa: E402,F401  (first: the command's settings for numpy, made before numpy is imported)
import numpy as np  # noqa: E402

from analyzer.api import DiagnoseOptions
from analyzer.base.rowtable import Numbers, RowTable
from analyzer.base.gc_pause import paused_gc
from analyzer.job.analysis import analyze_job
from analyzer.job.reduce import build_result
from analyzer.rank.analysis import RankOptions, analyze_rank_file
from analyzer.rules.engine import run_rules
from analyzer.whatif.gains import WHATIF_GAINS

SOURCE = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic" / "ddp_healthy_8r" / "rank-0.json.gz"


def rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tiled_rank(count: int):
    base = analyze_rank_file(str(SOURCE), RankOptions())
    rows, steps = base.collectives, base.steps
    span = max(r["start_us"] + r["dur_us"] for r in rows) - min(r["start_us"] for r in rows) + 1000.0
    out_rows, out_steps, k = [], [], 0
    while len(out_rows) < count:
        shift, step_shift = k * span, k * (max(s["step"] for s in steps) + 1)
        for r in rows:
            if len(out_rows) == count:
                break
            row = dict(r, start_us=r["start_us"] + shift, step=r["step"] + step_shift,
                       launch_us=None if r["launch_us"] is None else r["launch_us"] + shift,
                       seq=None if r.get("seq") is None else r["seq"] + k * 100000)
            out_rows.append(row)
        for s in steps:
            out_steps.append(dict(s, step=s["step"] + step_shift))
        k += 1
    return replace(base, collectives=RowTable.from_dicts(out_rows), steps=out_steps)


def clone(template, rank: int, world: int):
    # the map's rows are a table (analyzer.rank.analysis): the template's, with this rank's number
    rows = template.collectives.take(np.arange(len(template.collectives)))
    rows.set("rank", Numbers(np.full(len(rows), rank, dtype=np.int64)))
    return replace(template, rank=rank, world_size=world, path=f"rank-{rank}.json", collectives=rows,
                   steps=copy.deepcopy(template.steps), host=f"node{rank // 8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--output", default="/tmp/tracecliff-bench-reduce.json",
                        help="where the JSON goes (a large result's rows file goes beside it)")
    args = parser.parse_args()
    template = tiled_rank(args.collectives)
    start_rss = rss_mb()
    t0 = time.perf_counter(), time.process_time()
    ranks = [clone(template, r, args.ranks) for r in range(args.ranks)]
    t1 = time.perf_counter(), time.process_time()
    options = DiagnoseOptions()
    with paused_gc():
        result = build_result(ranks, options)
        t2 = time.perf_counter(), time.process_time()
        analyze_job(result, options)
        t3 = time.perf_counter(), time.process_time()
        run_rules(result, {}, gains=WHATIF_GAINS)
        t4 = time.perf_counter(), time.process_time()
        written = result.save(args.output)  # as `diagnose --format json -o FILE` does: the JSON, the rows file
        t5 = time.perf_counter(), time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.ranks} ranks x {len(template.collectives)} collectives = {args.ranks * len(template.collectives):,} rows")
    output = Path(args.output)
    rows = output.with_name(written.file) if written is not None and written.file else None
    sizes = f"JSON {output.stat().st_size / 1e6:,.1f} MB" + (f", rows file {rows.stat().st_size / 1e6:,.1f} MB" if rows
                                                          else ", no rows file" + (f" ({written.why})" if written else ""))
    print("  stage                               wall      CPU")
    for label, (a, b) in (("ranks in memory (the map's output)", (t0, t1)), ("combine (build_result)", (t1, t2)),
                          ("job analysis (match, fits, MFU)", (t2, t3)), ("rules", (t3, t4)),
                          ("save (JSON and rows file)", (t4, t5)), ("reduce total (combine..save)", (t1, t5))):
        print(f"  {label + ':':<35}{b[0] - a[0]:6.2f} s {b[1] - a[1]:6.2f} s")
    print(f"  {sizes}")
    print(f"  RSS: {start_rss:,.0f} MB before the ranks, peak {peak:,.0f} MB")


if __name__ == "__main__":
    main()
