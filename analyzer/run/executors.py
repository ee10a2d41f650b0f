"""Where the per-rank map runs: in this process, a memory-aware local process pool, or Dask.

The map (one trace file -> one compact RankAnalysis) needs nothing but its own file, so it
spreads over processes or cluster workers; only the summaries come back for the cross-rank
reduce. ``--executor dask`` hands the map to Dask distributed (an existing engine, with its
scheduling, retries and dashboard) instead of growing a home-made one. See docs/scale.md.
"""

from __future__ import annotations

import gc
import os
import struct
import uuid
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from analyzer.run import EXECUTORS
from analyzer.run.cache import (analyze_and_pack, analyze_and_store, analyze_rank_cached_packed, cached_entry,
                                cached_timeline, key_or_none, prune, step_timeline_and_store, store_timeline,
                                timeline_entry)
from analyzer.base.errors import ConfigError, InputError
from analyzer.base.gc_pause import paused_gc
from analyzer.ingest.parallel import MIN_PARALLEL_BYTES
from analyzer.rank.analysis import RankAnalysis, RankOptions

if TYPE_CHECKING:  # concurrent.futures is imported where a pool starts (its import costs each process)
    from concurrent.futures import Future

Progress = Callable[[int, int, str], None]

# Peak memory of one rank's worker ~ fixed cost (interpreter, numpy, pandas, two decode chunks)
# + the columns, which grow with the inflated JSON (measured: docs/scale.md, "Constants and the
# measurements behind them"); the constants below keep a margin: over-estimating costs
# parallelism, under-estimating an out-of-memory kill.
WORKER_BASE_BYTES = 300 << 20
PEAK_PER_INFLATED_BYTE = 0.25
GZIP_RATIO_GUESS = 12  # when a gzip trailer's size field wrapped (members > 4 GiB)
MEMORY_HEADROOM = 0.8  # share of the available memory the pool may plan to use
# The kernels the map keeps for the report's step timeline (RankAnalysis.kernels, ~22 bytes a
# kernel: 0.65 MB for a 49 MB rank of 29,000 kernels) wait in this process until the report
# draws up to three ranks of them. They are kept while their total stays within this budget:
# ~100 such ranks, the jobs where decoding three ranks again is a noticeable share of the run
# (0.75 s of 4.4 s at 8 ranks); past it all are dropped and the report decodes its ranks again,
# as before, so a 1,024-rank job never holds most of a gigabyte of kernels for a saving that is
# small next to its map.
KEPT_KERNELS_BYTES = 64 << 20


def map_ranks(files: list[Path], rank_options: RankOptions, executor: str = "local",
              scheduler: str | None = None, workers: int | None = None, cache_dir: str | None = None,
              progress: Progress | None = None) -> list[RankAnalysis]:
    """Analyze every file, results in the order of ``files``."""
    paths = [str(p) for p in files]
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")
    if scheduler and executor != "dask":
        raise ConfigError("--scheduler needs --executor dask")
    kept = KernelBudget()
    if executor == "dask":
        results = _map_dask(paths, rank_options, scheduler, cache_dir, progress, kept)
    else:
        results = _map_local(paths, rank_options, workers, cache_dir, progress, kept)
    if cache_dir:
        prune(cache_dir)
    return results


class KernelBudget:
    """Keeps the ranks' kept kernels while their total is within ``limit`` bytes; past it, drops
    them all (those admitted before and every one after), so the report reads its timeline again."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = KEPT_KERNELS_BYTES if limit is None else limit
        self.total = 0
        self.holding: list[RankAnalysis] | None = []  # None: over the budget

    def admit(self, analysis: RankAnalysis) -> RankAnalysis:
        if analysis.kernels is None:
            return analysis
        if self.holding is not None:
            self.total += analysis.kernels.nbytes
            if self.total <= self.limit:
                self.holding.append(analysis)
                return analysis
            for held in self.holding:
                held.kernels = None
            self.holding = None
        analysis.kernels = None
        return analysis


# -- local -----------------------------------------------------------------------------------

def inflated_size(path: str | Path) -> int:
    """Uncompressed size of a trace: the file size, or the gzip trailer's ISIZE (mod 2**32)."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as handle:
            if handle.read(2) != b"\x1f\x8b" or size < 18:
                return size
            handle.seek(-4, os.SEEK_END)
            isize = struct.unpack("<I", handle.read(4))[0]
    except OSError:
        return size
    # ISIZE is modulo 4 GiB and describes only the last member: trust it only when plausible.
    return isize if isize >= size else size * GZIP_RATIO_GUESS


def estimated_peak_bytes(path: str | Path) -> int:
    return WORKER_BASE_BYTES + int(PEAK_PER_INFLATED_BYTE * inflated_size(path))


def available_memory_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, lowered by a cgroup (container) limit."""
    candidates = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            candidates.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(candidates) if candidates else None


def plan_workers(peaks: list[int], cpus: int, budget: int | None) -> int:
    """Most workers the CPUs and the memory budget allow for the largest ranks."""
    workers = max(1, min(cpus, len(peaks)))
    if budget is None or not peaks:
        return workers
    largest = sorted(peaks, reverse=True)
    fit = 0
    while fit < workers and sum(largest[:fit + 1]) <= budget:
        fit += 1
    return max(1, fit)


def _map_local(paths: list[str], options: RankOptions, workers: int | None, cache_dir: str | None,
               progress: Progress | None, kept: KernelBudget) -> list[RankAnalysis]:
    results: list[RankAnalysis | None] = [None] * len(paths)
    keys: list[str | None] = [None] * len(paths)
    if cache_dir:  # hits are answered here, without starting a single worker
        keys = _cache_keys(paths, options, cache_dir)
        with paused_gc(long_lived=True):  # every entry's rows survive to the end: scanning them is wasted
            results = [cached_entry(path, key, cache_dir) for path, key in zip(paths, keys)]
    todo = [i for i, r in enumerate(results) if r is None]
    done_count = len(paths) - len(todo)
    if progress and done_count:
        progress(done_count, len(paths), paths[-1])
    peaks = {i: estimated_peak_bytes(paths[i]) for i in todo}
    count, budget = _pool_size(peaks, workers)
    if count <= 1 or len(todo) <= 1:
        # one rank to read, a spare core and memory for a second process: split its decoding
        two_cores = (len(todo) == 1 and (workers or 2) >= 2 and (os.cpu_count() or 1) >= 2
                     and inflated_size(paths[todo[0]]) >= MIN_PARALLEL_BYTES
                     and (budget is None or peaks[todo[0]] + WORKER_BASE_BYTES <= budget))
        for index in todo:
            analysis = analyze_and_store(paths[index], options, cache_dir, keys[index], two_cores)
            results[index] = kept.admit(analysis)
            done_count += 1
            if progress:
                progress(done_count, len(paths), paths[index])
    else:
        jobs = [(i, (paths[i], options, cache_dir, keys[i])) for i in todo]
        for index, analysis in _memory_gated_pool(analyze_and_pack, jobs, peaks, count, budget):
            results[index] = kept.admit(analysis)
            done_count += 1
            if progress:
                progress(done_count, len(paths), paths[index])
    return results  # type: ignore[return-value]


def _pool_size(peaks: dict[int, int], workers: int | None) -> tuple[int, int | None]:
    """(processes, memory budget in bytes or None) for ranks of these estimated peaks: --workers,
    else what the CPUs and memory allow; never more processes than ranks."""
    available = available_memory_bytes()
    budget = int(available * MEMORY_HEADROOM) if available is not None else None
    count = min(workers, len(peaks)) if workers else plan_workers(list(peaks.values()), os.cpu_count() or 1, budget)
    return max(1, count), budget


def _cache_keys(paths: list[str], options: RankOptions, cache_dir: str) -> list[str | None]:
    """Content-hash cache keys, on a few threads: hashlib and file reads release the GIL, and
    hashing the traces is most of a cached run's map. (Decoding the entries holds the GIL for
    tens of ms at a time, so it runs after, not beside, the hashing.)"""
    if len(paths) < 2:
        return [key_or_none(path, options, cache_dir) for path in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(paths), (os.cpu_count() or 1) + 1)) as pool:
        return list(pool.map(lambda path: key_or_none(path, options, cache_dir), paths))


def _memory_gated_pool(function: Callable[..., Any], jobs: list[tuple[int, tuple]], peaks: dict[int, int],
                       workers: int, budget: int | None) -> Iterator[tuple[int, Any]]:
    """A process pool that starts a rank only while the estimated peaks of the ranks in flight
    fit the memory budget (always at least one), largest first so a big rank never waits last.
    Yields (index, ``function(*arguments)``) as ranks finish."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    queue = deque(sorted(jobs, key=lambda job: -peaks[job[0]]))
    running: dict[Future, int] = {}
    planned = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        try:
            while queue or running:
                while queue and len(running) < workers and (
                        not running or budget is None or planned + peaks[queue[0][0]] <= budget):
                    index, arguments = queue.popleft()
                    running[pool.submit(function, *arguments)] = index
                    planned += peaks[index]
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = running.pop(future)
                    planned -= peaks[index]
                    yield index, future.result()
        except BaseException:
            for future in running:
                future.cancel()
            raise


def map_step_timelines(paths: list[str], options: RankOptions, origin_ns: int, executor: str = "local",
                       scheduler: str | None = None, workers: int | None = None,
                       cache_dir: str | None = None) -> list[dict[str, Any]]:
    """The report's step timeline of each file (``analyzer.rank.analysis.step_timeline_file``, the
    step in ``options.steps``), in the order of ``paths``. Cached ones are read here; the others
    are decoded again in parallel like the map (the same pool, memory budget and --workers), so
    three ranks cost about one rank's decode in wall time. A Dask job sends them to its
    scheduler; without one (a LocalCluster) a local pool is used: starting a cluster for a few
    files would cost more than reading them."""
    entries = [timeline_entry(path, options, origin_ns, cache_dir) for path in paths]
    results = [cached_timeline(entry) for entry in entries]
    calls = [(i, (paths[i], options, origin_ns, entries[i])) for i, timeline in enumerate(results) if timeline is None]
    if executor == "dask" and scheduler:
        done = _dask_calls(step_timeline_and_store, calls, paths, scheduler)
    else:
        peaks = {i: estimated_peak_bytes(paths[i]) for i, _ in calls}
        count, budget = _pool_size(peaks, workers)
        if count <= 1 or len(calls) <= 1:  # in this process: a one-rank job's trace is still loaded
            done = ((i, step_timeline_and_store(*arguments)) for i, arguments in calls)
        else:
            done = _memory_gated_pool(step_timeline_and_store, calls, peaks, count, budget)
    # The workers fork from a parent that now holds the whole job's summaries (gigabytes at
    # 1,024 ranks), shared copy-on-write: a collection in a worker would visit, and so copy,
    # every object. Frozen objects are never visited.
    gc.freeze()
    try:
        for index, timeline in done:
            results[index] = timeline
    finally:
        gc.unfreeze()
    return results  # type: ignore[return-value]


def store_step_timelines(paths: list[str], options: RankOptions, origin_ns: int, timelines: list[dict[str, Any]],
                         cache_dir: str | None) -> None:
    """Step timelines the report drew from the map's kernels, cached where ``map_step_timelines``
    looks for them: a re-run, whose cached summaries hold no kernels, then reads no trace."""
    if cache_dir:
        for path, timeline in zip(paths, timelines):
            store_timeline(timeline_entry(path, options, origin_ns, cache_dir), timeline)


# -- dask ------------------------------------------------------------------------------------

def _map_dask(paths: list[str], options: RankOptions, scheduler: str | None, cache_dir: str | None,
              progress: Progress | None, kept: KernelBudget) -> list[RankAnalysis]:
    """Per-rank map on a Dask cluster (``scheduler`` address, or a LocalCluster when None).
    Workers read the trace paths themselves: they must see the same file system."""
    results: list[RankAnalysis | None] = [None] * len(paths)
    calls = [(i, (path, options, cache_dir)) for i, path in enumerate(paths)]
    for done, (index, analysis) in enumerate(_dask_calls(analyze_rank_cached_packed, calls, paths, scheduler), 1):
        results[index] = kept.admit(analysis)
        if progress:
            progress(done, len(paths), paths[index])
    return results  # type: ignore[return-value]


def _dask_calls(function: Callable[..., Any], calls: list[tuple[int, tuple]], paths: list[str],
                scheduler: str | None) -> Iterator[tuple[int, Any]]:
    """(index, ``function(*arguments)``) for each call, run on the Dask cluster as they finish;
    ``paths[index]`` names the file of a call whose workers died."""
    if not calls:  # all answered by the cache: no cluster to reach
        return
    try:
        from distributed import Client, KilledWorker, as_completed
    except ImportError:
        raise ConfigError("--executor dask needs Dask distributed: pip install 'tracecliff[dask]'") from None
    client = _connect(Client, scheduler)
    try:
        run = uuid.uuid4().hex[:12]  # fresh keys: a shared scheduler must never hand back old results
        indices = [index for index, _ in calls]
        futures = client.map(function, *map(list, zip(*(arguments for _, arguments in calls))), pure=False,
                             key=[f"tracecliff-{run}-{function.__name__}-{index}" for index in indices])
        order = {future.key: index for index, future in zip(indices, futures)}
        for future in as_completed(futures):
            index = order[future.key]
            try:
                result = future.result()  # re-raises the worker's InputError as it was
            except KilledWorker as exc:  # the scheduler's retries are spent: one line, not a traceback
                raise InputError(paths[index], f"the Dask workers analyzing it died {exc.allowed_failures + 1} "
                                               "time(s) (killed, out of memory or crashed; see the worker logs)"
                                 ) from None
            yield index, result
    finally:
        _close(client, owns_cluster=scheduler is None)


def _connect(client_class, scheduler: str | None):
    if scheduler is None:
        from distributed import LocalCluster
        cluster = LocalCluster(n_workers=max(1, min(os.cpu_count() or 1, 8)), threads_per_worker=1,
                               processes=True, dashboard_address=None)
        return client_class(cluster)
    try:
        return client_class(scheduler, timeout="30s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None


def _close(client, owns_cluster: bool) -> None:
    cluster = client.cluster if owns_cluster else None
    client.close()
    if cluster is not None:
        cluster.close()
