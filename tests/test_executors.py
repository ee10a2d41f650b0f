"""Executors: the memory-aware local pool and Dask distributed give the same bytes as the
in-process run; worker errors stay one-line input errors."""

import json

import pytest

from analyzer.run import executors
from analyzer.api import DiagnoseOptions, diagnose
from analyzer.base.errors import ConfigError, InputError
from analyzer.job.result import dumps
from builders import two_step_ddp


@pytest.fixture
def job(tmp_path):
    return [str(two_step_ddp(rank=r, world_size=4, pg_ranks=range(4)).write(tmp_path / f"rank-{r}.json"))
            for r in range(4)]


def run(paths, **kw):
    return dumps(diagnose(paths, DiagnoseOptions(**kw)).to_dict())


def test_local_pool_matches_in_process(job, real_traces):
    real = sorted(str(p) for p in (real_traces / "param_dlrm_ddp_8rank").iterdir())[:3]
    for paths in (job, real):
        assert run(paths, workers=2) == run(paths, workers=1)


def test_worker_input_error_is_one_line(job, tmp_path):
    bad = tmp_path / "rank-9.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1}')
    with pytest.raises(InputError) as info:
        diagnose(job + [str(bad)], DiagnoseOptions(workers=2))
    assert str(info.value).startswith(str(bad))


def test_plan_workers_bounded_by_memory():
    gib = 1 << 30
    assert executors.plan_workers([gib] * 8, cpus=4, budget=None) == 4
    assert executors.plan_workers([gib] * 8, cpus=4, budget=int(2.5 * gib)) == 2
    assert executors.plan_workers([3 * gib, gib, gib], cpus=4, budget=2 * gib) == 1  # largest alone
    assert executors.plan_workers([gib] * 2, cpus=16, budget=100 * gib) == 2  # never more than ranks


def test_memory_gate_limits_ranks_in_flight(job, monkeypatch):
    """With a budget for two estimated peaks, never more than two ranks run at once."""
    peaks = {i: 10 for i in range(len(job))}
    in_flight, seen = [], []
    from concurrent.futures import ProcessPoolExecutor  # the executors import it where a pool starts
    real_submit = ProcessPoolExecutor.submit

    def tracking_submit(pool, fn, *args):
        in_flight.append(1)
        seen.append(len(in_flight))
        future = real_submit(pool, fn, *args)
        future.add_done_callback(lambda _: in_flight.pop())
        return future
    monkeypatch.setattr(ProcessPoolExecutor, "submit", tracking_submit)
    from analyzer.rank.analysis import RankOptions
    jobs = [(i, (p, RankOptions(), None, None)) for i, p in enumerate(job)]
    done = dict(executors._memory_gated_pool(executors.analyze_and_store, jobs, peaks, workers=4, budget=20))
    assert sorted(done) == list(range(len(job))) and max(seen) <= 2
    assert [done[i].rank for i in range(len(job))] == [0, 1, 2, 3]


def test_inflated_size_estimates(tmp_path):
    import gzip
    plain = tmp_path / "a.json"
    plain.write_bytes(b"x" * 1000)
    packed = tmp_path / "b.json"  # gzip without .gz: sniffed, ISIZE trailer read
    packed.write_bytes(gzip.compress(b"y" * 100_000))
    assert executors.inflated_size(plain) == 1000
    assert executors.inflated_size(packed) == 100_000
    assert executors.estimated_peak_bytes(packed) > executors.estimated_peak_bytes(plain)


def test_available_memory_is_positive():
    available = executors.available_memory_bytes()
    assert available is None or available > 0


def test_bad_executor_settings():
    with pytest.raises(ConfigError):
        executors.map_ranks([], None, executor="spark")
    with pytest.raises(ConfigError, match="--executor dask"):
        executors.map_ranks([], None, executor="local", scheduler="tcp://127.0.0.1:1")


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    yield cluster
    cluster.close()


def test_dask_matches_local(job, real_traces, dask_cluster, tmp_path):
    real = [str(p) for p in sorted((real_traces / "hta_ddp_sampled_128rank").iterdir())]
    for paths in (job, real):
        local = run(paths, workers=1)
        assert run(paths, executor="dask", scheduler=dask_cluster.scheduler_address) == local
    # through the cache on the workers too
    store = str(tmp_path / "cache")
    for _ in range(2):
        assert run(job, executor="dask", scheduler=dask_cluster.scheduler_address, cache_dir=store) == run(job)


def test_dask_map_keeps_kernels_for_the_report(job, dask_cluster, monkeypatch):
    """The ranks' kernels come back from the Dask workers too: the report reads no rank again."""
    expected = run(job, workers=1)

    def refuse(*_):
        raise AssertionError("read the shown ranks again")
    monkeypatch.setattr("analyzer.api.map_step_timelines", refuse)
    assert run(job, executor="dask", scheduler=dask_cluster.scheduler_address) == expected


def test_dask_worker_error_is_input_error(job, dask_cluster, tmp_path):
    bad = tmp_path / "rank-5.json"
    bad.write_bytes(b"\x1f\x8b\x08\x00truncated")
    with pytest.raises(InputError) as info:
        diagnose(job + [str(bad)], DiagnoseOptions(executor="dask", scheduler=dask_cluster.scheduler_address))
    assert str(info.value).startswith(str(bad))


def test_dask_cli(job, dask_cluster, capsys):
    from analyzer.cli.main import main
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--format", "json", "--no-cache", "--executor", "dask",
              "--scheduler", dask_cluster.scheduler_address, *job])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert [r["rank"] for r in json.loads(captured.out)["ranks"]] == [0, 1, 2, 3]
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--scheduler", dask_cluster.scheduler_address, *job])
    assert exit_info.value.code == 2 and "--executor dask" in capsys.readouterr().err


@pytest.mark.parametrize("files, workers, cpus, memory, expected", [
    (1, None, 2, None, True),           # one rank, a spare core: two processes decode it
    (1, 1, 2, None, False),             # --workers 1 keeps one process
    (1, None, 1, None, False),          # no spare core
    (1, None, 2, 100 << 20, False),     # no memory for a second process
])
def test_one_large_rank_decodes_on_two_cores_only_when_there_is_room(job, monkeypatch, files, workers, cpus,
                                                                     memory, expected):
    seen = []

    def record(path, options, cache_dir, key, two_cores=False):
        seen.append(two_cores)
        return real_analyze(path, options, cache_dir, key)
    real_analyze = executors.analyze_and_store
    monkeypatch.setattr(executors, "analyze_and_store", record)
    monkeypatch.setattr(executors, "MIN_PARALLEL_BYTES", 1)
    monkeypatch.setattr(executors.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(executors, "available_memory_bytes", lambda: memory)
    diagnose(job[:files], DiagnoseOptions(workers=workers))
    assert seen == [expected]


def test_two_core_diagnose_gives_the_same_bytes(real_traces, monkeypatch):
    path = [str(real_traces / "hta_ddp_rank0_of_2" / "rank-0.json.gz")]
    one_core = run(path, workers=1)
    monkeypatch.setattr(executors, "MIN_PARALLEL_BYTES", 1)
    assert run(path) == one_core


def test_step_timelines_read_in_parallel_then_from_the_cache(job, tmp_path, monkeypatch):
    """The report's re-read of the shown ranks: a pool gives what one-by-one reading gives, and a
    second run with the cache reads no trace."""
    from analyzer.job.step_timeline import read_one_by_one
    from analyzer.rank.analysis import RankOptions
    from analyzer.run import cache
    options = RankOptions(keep_timeline=True, steps=(2,))
    expected = read_one_by_one(job[:3], options, 5)
    assert executors.map_step_timelines(job[:3], options, 5, workers=2) == expected
    store = str(tmp_path / "cache")
    assert executors.map_step_timelines(job[:3], options, 5, workers=2, cache_dir=store) == expected

    def no_read(*_):
        raise AssertionError("read a trace although its step timeline is cached")
    monkeypatch.setattr(cache, "step_timeline_file", no_read)
    assert executors.map_step_timelines(job[:3], options, 5, workers=2, cache_dir=store) == expected
    with pytest.raises(AssertionError, match="read a trace"):  # another origin: another entry
        executors.map_step_timelines(job[:1], options, 6, workers=1, cache_dir=store)


@pytest.mark.parametrize("kept_kernels_bytes", [executors.KEPT_KERNELS_BYTES, 1])
def test_one_rank_job_decodes_its_file_once(job, monkeypatch, kept_kernels_bytes):
    """The report's timeline of a one-rank job uses the kernels the map kept or, past their
    budget, the trace the map left in the main process; the report then lets that trace go."""
    from analyzer.rank import analysis
    monkeypatch.setattr(executors, "KEPT_KERNELS_BYTES", kept_kernels_bytes)
    monkeypatch.setattr(analysis, "_LAST_LOADED", {})
    loads = []
    real_load = analysis.load_rank_trace

    def counting(*args):
        loads.append(args[0])
        return real_load(*args)
    monkeypatch.setattr(analysis, "load_rank_trace", counting)
    result = diagnose(job[:1], DiagnoseOptions(workers=1))
    assert len(loads) == 1 and result.timeline["available"] and not analysis._LAST_LOADED
    kept = diagnose(job[:1], DiagnoseOptions(workers=1, keep_timeline=True))
    assert result.timeline == kept.timeline
