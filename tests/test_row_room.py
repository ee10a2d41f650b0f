"""Collective rows are made with room for the keys the job analyses add (analyzer.rank.comms
with_room), by the map and by the cache / worker unpacking (analyzer.run.entry.from_columns):
a row's dict never grows its table during the job analysis (a reallocation per row, and the
old table left behind as allocator waste)."""

import sys

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.rank.analysis import RankOptions, analyze_rank_file
from analyzer.rank.comms import JOB_KEYS_ADDED, with_room
from analyzer.run import entry
from builders import two_step_ddp


@pytest.fixture
def job(tmp_path):
    return [str(two_step_ddp(rank=r).write(tmp_path / f"rank-{r}.json")) for r in (0, 1)]


def test_with_room_keeps_keys_order_and_values():
    row = {"rank": 0, "collective": "allreduce", "bytes": 4096, "group": {"name": "0"}}
    roomy = with_room(row)
    assert roomy == row and list(roomy) == list(row)
    copy = roomy.copy()
    size = sys.getsizeof(copy)
    for k in range(JOB_KEYS_ADDED):
        copy[f"added_{k}"] = 0.0
    assert sys.getsizeof(copy) == size  # the room held every added key
    assert list(copy)[:len(row)] == list(row)


@pytest.mark.parametrize("workers", [1, 2])
def test_job_rows_never_grow(job, workers):
    """The map's rows (in-process, or packed by a worker and unpacked) end the job analysis with
    the table they were made with, and the job analyses add no more keys than the room."""
    made = analyze_rank_file(job[0], RankOptions()).collectives[0]
    result = diagnose(job, DiagnoseOptions(workers=workers, cache_dir=None))
    for row in result.collectives:
        assert len(set(row) - set(made)) <= JOB_KEYS_ADDED
        assert sys.getsizeof(row) == sys.getsizeof(made)


def test_unpacked_rows_have_the_room(job):
    rows = analyze_rank_file(job[0], RankOptions()).collectives
    back = entry.from_columns(entry.pack(entry.to_columns(rows)))
    assert back == rows and [list(r) for r in back] == [list(r) for r in rows]
    assert {sys.getsizeof(r) for r in back} == {sys.getsizeof(rows[0])}
