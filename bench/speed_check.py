"""CI's speed check (issue 42): bench/bench_targets.py's shapes at a reduced size, each one's CPU
set against the decode floor of the same files measured in this same process, median of three;
it fails when a ratio is more than 30% above the figure committed beside it
(bench/speed_figures.json).

    python bench/speed_check.py              # check (CI runs this after the tests)
    python bench/speed_check.py --write      # measure and write the figures (commit the reason)

Shapes: light (8 ranks of the real HTA DDP rank, tiled to 3 MB each), one rank (the same rank at
12 MB), heavy (8 ranks of bench_shapes.py's collective-heavy rank at 3 MB each) and the reduce
(bench_reduce.py's job at 128 ranks x 2,000 collectives). tracecliff is `diagnose` with one
worker and no cache (everything in this process, so process_time is its CPU) and the JSON made;
the floor is the bare typed decode of each file (ISA-L + msgspec of the fields tracecliff
reads). The reduce has no decode of its own: it is set against the light job's floor, as a
measure of this machine's speed in the same run. A ratio of the same process's CPU times moves
little with the machine's load (both sides slow down together): ten runs on an unchanged tree
are in docs/scale.md. Timings are never asserted in the test suite; this is the one check.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import analyzer.cli  # noqa: E402,F401  (first: the command's settings for numpy, made before numpy is imported)
from bench_ingest import SOURCE  # noqa: E402
from bench_scale import make_job  # noqa: E402
from bench_shapes import BLANKS, heavy_source  # noqa: E402
from make_big_trace import tile  # noqa: E402

FIGURES = HERE / "speed_figures.json"
SLACK = 1.3  # a ratio may be 30% above its committed figure
REPEAT = 3
SAMPLE_S = 0.4  # CPU seconds of one sample of each side


def cpu(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def decode_floor(files: list[Path]) -> None:
    from analyzer.ingest.files import read_trace_bytes
    from analyzer.ingest.schema import TRACE_DECODER
    for path in files:
        TRACE_DECODER.decode(read_trace_bytes(path))


def diagnose_json(target: Path) -> None:
    from analyzer.api import DiagnoseOptions, diagnose
    result = diagnose([str(target)], DiagnoseOptions(workers=1))
    for _ in result.json_chunks():
        pass


def reduce_job(ranks: int, collectives: int) -> Callable[[], None]:
    """bench_reduce.py's stages on ``ranks`` clones of its tiled rank (made here, outside the timing)."""
    import bench_reduce
    from analyzer.api import DiagnoseOptions, build_report
    from analyzer.base.gc_pause import paused_gc
    template = bench_reduce.tiled_rank(collectives)

    def run() -> None:
        job = [bench_reduce.clone(template, r, ranks) for r in range(ranks)]
        options = DiagnoseOptions()
        with paused_gc():
            result = build_report(job, options, {}, report=False)  # diagnose's build, as --format json
            for _ in result.json_chunks():
                pass
    return run


def shapes(work: Path) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """Each shape's (tracecliff, floor) pair of callables."""
    light = make_job(work / "light", 8, 3.0, SOURCE, header_separators=BLANKS)
    heavy = make_job(work / "heavy", 8, 3.0, heavy_source(work / "heavy-source-tp.json"), header_separators=BLANKS)
    one = work / "one-rank-12mb.json"
    if not one.exists():
        tile(SOURCE, one, 12.0)
    return {"light": (lambda: diagnose_json(light[0].parent), lambda: decode_floor(light)),
            "one rank": (lambda: diagnose_json(one), lambda: decode_floor([one])),
            "heavy": (lambda: diagnose_json(heavy[0].parent), lambda: decode_floor(heavy)),
            "reduce": (reduce_job(128, 2000), lambda: decode_floor(light))}


def timing(work: Callable[[], None], count: int) -> float:
    """CPU seconds of one call of ``work``, over ``count`` calls after a full collection (the
    garbage of the run before is not charged to this one)."""
    gc.collect()
    return cpu(lambda: [work() for _ in range(count)]) / count


def measure(pairs: dict[str, tuple[Callable[[], None], Callable[[], None]]]) -> dict[str, float]:
    """Each shape's CPU against its floor's: the median of REPEAT ratios, each of a sample of
    tracecliff then one of the floor, a sample being as many calls as take SAMPLE_S (a call of
    tens of milliseconds alone moves by a fifth from run to run)."""
    counts = {}
    for shape, (ours, bare) in pairs.items():  # warm-up (imports, first-call caches) and the counts
        ours()
        bare()
        counts[shape] = [max(1, round(SAMPLE_S / max(timing(work, 1), 1e-3))) for work in (ours, bare)]
    ratios = {}
    for shape, (ours, bare) in pairs.items():
        n_ours, n_bare = counts[shape]
        ratios[shape] = statistics.median(timing(ours, n_ours) / timing(bare, n_bare) for _ in range(REPEAT))
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the measured ratios as the committed figures")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tracecliff-speed-check")
    args = parser.parse_args()
    if not SOURCE.exists():
        print(f"speed check: skipped: {SOURCE} (the real HTA trace, ../shared) is not here")
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    ratios = measure(shapes(args.dir))
    committed = json.loads(FIGURES.read_text("utf-8"))["ratios"] if FIGURES.exists() else {}
    failed = []
    for shape, value in ratios.items():
        figure = committed.get(shape)
        verdict = "" if figure is None else f" (committed {figure:.2f}x, limit {figure * SLACK:.2f}x)"
        if figure is not None and value > figure * SLACK:
            failed.append(shape)
            verdict += ": SLOWER"
        print(f"speed check: {shape:<9} CPU / decode floor {value:5.2f}x{verdict}")
    print(f"speed check: {time.perf_counter() - start:.0f} s")
    if args.write:
        temporary = FIGURES.with_suffix(".tmp")
        temporary.write_text(json.dumps({"slack": SLACK, "ratios": {k: round(v, 2) for k, v in ratios.items()}},
                                        indent=2) + "\n", "utf-8")
        temporary.replace(FIGURES)
        return 0
    if failed:
        print(f"speed check: FAILED: {', '.join(failed)} more than {SLACK - 1:.0%} above the committed figure "
              f"({FIGURES.name}); if the cost is meant, update it with --write and say why in the commit")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
