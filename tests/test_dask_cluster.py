"""The Dask path on a real cluster: a `dask scheduler` and `dask worker --nworkers 2 --nthreads 1`
started here as separate processes (as a user runs them), not an in-process LocalCluster
(issue 13). Outputs must be byte-identical to the local executor, `.json.gz` inputs included,
and a worker killed mid-job must cost a retry, or one clear line once the retries are spent."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.base.errors import InputError
from analyzer.job.result import dumps
from builders import two_step_ddp

REPO = Path(__file__).resolve().parents[1]
START_S = 90  # the scheduler and both workers must be up within this


def run(paths, **kw):
    return dumps(diagnose(paths, DiagnoseOptions(**kw)).to_dict())


def _start(args, log: Path) -> subprocess.Popen:
    # Its own session, so that cleanup can end the nannies and their workers together; the
    # worktree first on the path, so that workers import this checkout's analyzer.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    distributed = pytest.importorskip("distributed")
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip("the dask command is not installed beside this interpreter")
    folder = tmp_path_factory.mktemp("dask")
    address_file = folder / "scheduler.json"
    processes, client = [], None
    try:
        processes.append(_start([str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(address_file)], folder / "scheduler.log"))
        deadline = time.monotonic() + START_S
        while not address_file.exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, \
                (folder / "scheduler.log").read_text()
            time.sleep(0.2)
        processes.append(_start([str(dask), "worker", "--scheduler-file", str(address_file), "--host", "127.0.0.1",
                                 "--nworkers", "2", "--nthreads", "1", "--no-dashboard"], folder / "worker.log"))
        client = distributed.Client(scheduler_file=str(address_file), timeout=f"{START_S}s")
        client.wait_for_workers(2, timeout=START_S)
        yield client
    finally:
        if client is not None:
            client.close()
        for process in reversed(processes):
            _stop(process)


@pytest.fixture(scope="module")
def gz_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gzjob")
    paths = []
    for rank in range(4):
        plain = two_step_ddp(rank=rank, world_size=4, pg_ranks=range(4)).write(folder / f"rank-{rank}.json")
        packed = folder / f"rank-{rank}.json.gz"
        packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
        plain.unlink()
        paths.append(str(packed))
    return paths


def test_real_cluster_matches_local(cluster, gz_job, real_traces):
    address = cluster.scheduler.address
    real = [str(p) for p in sorted((real_traces / "hta_ddp_sampled_128rank").iterdir())]
    for paths in (gz_job, real):
        assert run(paths, executor="dask", scheduler=address) == run(paths, workers=1)


def _kill_a_worker_mid_job(client, paths) -> dict:
    """Freeze one worker (SIGSTOP) so it cannot finish anything, start the job, kill it
    (SIGKILL) once the scheduler has given it a task of the job; the job's outcome."""
    address, pid = sorted(client.run(os.getpid).items())[0]
    outcome: dict = {}

    def job():
        try:
            outcome["result"] = run(paths, executor="dask", scheduler=client.scheduler.address)
        except Exception as exc:  # noqa: BLE001  (the test inspects it)
            outcome["error"] = exc

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=job)
    try:
        thread.start()
        deadline = time.monotonic() + 60
        while not any(str(key).startswith("tracecliff-") for key in client.processing().get(address, ())):
            assert time.monotonic() < deadline, "the scheduler never gave the frozen worker a task"
            time.sleep(0.05)
        outcome["killed_with_tasks"] = True
    finally:
        os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive(), "the job did not end after its worker was killed"
    client.wait_for_workers(2, timeout=START_S)  # the nanny restarts it
    return outcome


def test_worker_killed_mid_job_is_retried(cluster, gz_job):
    outcome = _kill_a_worker_mid_job(cluster, gz_job)
    assert outcome["killed_with_tasks"] and "error" not in outcome, outcome.get("error")
    assert outcome["result"] == run(gz_job, workers=1)


def test_worker_killed_with_no_retry_left_is_one_line(cluster, gz_job):
    def set_allowed_failures(count, dask_scheduler=None):
        previous, dask_scheduler.allowed_failures = dask_scheduler.allowed_failures, count
        return previous

    previous = cluster.run_on_scheduler(set_allowed_failures, 0)
    try:
        outcome = _kill_a_worker_mid_job(cluster, gz_job)
    finally:
        cluster.run_on_scheduler(set_allowed_failures, previous)
    error = outcome.get("error")
    assert isinstance(error, InputError), error
    assert error.path in gz_job and "died" in str(error) and "\n" not in str(error)


def test_real_cluster_writes_the_same_large_result(cluster, gz_job, tmp_path, monkeypatch):
    """A large result (JSON_ROWS lowered so this small job is one): the same JSON and the same
    rows file from the cluster as from the local executor."""
    pytest.importorskip("pyarrow")
    from analyzer.job import large
    monkeypatch.setattr(large, "JSON_ROWS", 5)
    for name, kw in (("dask", {"executor": "dask", "scheduler": cluster.scheduler.address}), ("local", {"workers": 1})):
        (tmp_path / name).mkdir()
        written = diagnose(gz_job, DiagnoseOptions(**kw)).save(tmp_path / name / "result.json")
        assert written is not None and written.file == "result.collectives.parquet"
    for file in ("result.json", "result.collectives.parquet"):
        assert (tmp_path / "dask" / file).read_bytes() == (tmp_path / "local" / file).read_bytes(), file
