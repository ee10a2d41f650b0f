"""Issue 42's columnar paths against the code they replaced, on sample jobs: the DDP step models
sliced from the bucket columns' floats equal the per-bucket float() loop, and a None size or
start still drops its step."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.base.rowtable import Numbers
from analyzer.job.facts import JobFacts
from analyzer.job import ddp
from conftest import SAMPLES

JOBS = ["ddp_bucket_oversized", "ddp_straggler", "ddp_2node_16r_healthy"]


def _steps(result, monkeypatch, columnar: bool):
    if not columnar:
        monkeypatch.setattr(ddp, "_bucket_floats", lambda columns: None)
    try:
        return ddp._all_ddp_steps(JobFacts(result))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("job", JOBS)
def test_ddp_steps_from_columns_equal_the_per_bucket_loop(job, monkeypatch):
    result = diagnose([str(SAMPLES / "synthetic" / job)], DiagnoseOptions(workers=1), report=False)
    columnar = _steps(result, monkeypatch, True)
    assert columnar and columnar == _steps(result, monkeypatch, False)
    for step in columnar:  # Python floats, as float() made them, not numpy scalars
        assert all(type(v) is float for v in step.bucket_bytes + step.bucket_starts_us + step.bucket_ends_us)


def test_a_bucket_without_a_size_drops_its_step_in_both_paths(monkeypatch):
    result = diagnose([str(SAMPLES / "synthetic" / JOBS[0])], DiagnoseOptions(workers=1), report=False)
    column = result.buckets.column("bytes")
    assert isinstance(column, Numbers)
    none = np.zeros(column.n, dtype=bool)
    none[::7] = True
    column.none = none  # this Result is the test's own
    columnar = _steps(result, monkeypatch, True)
    assert columnar == _steps(result, monkeypatch, False)
    assert len(columnar) < len(_steps(diagnose([str(SAMPLES / "synthetic" / JOBS[0])], DiagnoseOptions(workers=1),
                                              report=False), monkeypatch, True))
