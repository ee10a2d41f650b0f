"""tracecliff annotate: the added tracks are right to the nanosecond, the original events come
back unchanged through the tool's own ingest, and inputs are never overwritten."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import annotate
from analyzer.export.annotate import (CATEGORY, PROCESS_NAME, finding_windows, ns_to_trace_us,
                               to_trace_ns)
from analyzer.cli.main import main
from analyzer.base.errors import InputError
from analyzer.ingest.columns import _us_to_ns
from analyzer.ingest.loader import load_rank_trace
from builders import two_step_ddp


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exited:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def read_json(path: Path):
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def assert_same_ingest(original: Path, annotated: Path) -> None:
    """The tool reads the annotated file exactly as it read the original."""
    a, b = load_rank_trace(original), load_rank_trace(annotated)
    for part in ("gpu", "launches", "markers"):
        for name, column in vars(getattr(a, part)).items():
            other = vars(getattr(b, part))[name]
            if isinstance(column, np.ndarray):
                np.testing.assert_array_equal(column, other, err_msg=f"{part}.{name}")
            else:
                assert column == other, f"{part}.{name}"
    assert (a.strings, a.threads, a.rank, a.kernel_comm_args) == (b.strings, b.threads, b.rank, b.kernel_comm_args)
    assert b.event_count > a.event_count


def added_events(original: Path, annotated: Path) -> list[dict]:
    before, after = read_json(original), read_json(annotated)
    n = len(before["traceEvents"])
    assert after["traceEvents"][:n] == before["traceEvents"]  # every original event, in order
    assert {k: v for k, v in after.items() if k != "traceEvents"} == \
        {k: v for k, v in before.items() if k != "traceEvents"}
    return after["traceEvents"][n:]


def windows(events, track):
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    return [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
            if e["ph"] == "X" and names[(e["pid"], e["tid"])].split(" (")[0] == track]


@pytest.fixture()
def job(tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    two_step_ddp(rank=0).write(src / "rank-0.json")
    two_step_ddp(rank=1).write(src / "rank-1.json.gz", gz=True)
    return src


def test_tracks_on_the_hand_worked_job(job, tmp_path, capsys):
    out = tmp_path / "out"
    rc, stdout, _ = run_cli(["annotate", job, "-o", out], capsys)
    assert rc == 0 and "rank 1: " in stdout
    assert (out / "rank-1.json.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip in, gzip out
    assert (out / "rank-0.json").read_bytes()[:1] == b"{"
    for name in ("rank-0.json", "rank-1.json.gz"):
        assert_same_ingest(job / name, out / name)
        events = added_events(job / name, out / name)
        original_pids = {e["pid"] for e in read_json(job / name)["traceEvents"]}
        pid = events[0]["pid"]
        assert pid not in original_pids
        assert {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": PROCESS_NAME}} in events
        assert all(e["cat"] == CATEGORY for e in events if e["ph"] == "X")
        # all-reduce [60,90) under backward compute [30,70): exposed [70,90) in each step
        assert windows(events, "exposed communication") == [("exposed allreduce", 1070.0, 1090.0),
                                                            ("exposed allreduce", 1170.0, 1190.0)]
        assert windows(events, "steps") == [("ProfilerStep#1", 1000.0, 1095.0), ("ProfilerStep#2", 1100.0, 1195.0)]
        assert windows(events, "phases")[:3] == [("forward", 1000.0, 1030.0), ("backward", 1030.0, 1090.0),
                                                 ("optimizer", 1090.0, 1095.0)]
    # the original event list is copied byte for byte, not re-encoded
    original_events = json.dumps(read_json(job / "rank-0.json")["traceEvents"]).encode()
    assert original_events[:-1] + b", {" not in (out / "rank-0.json").read_bytes()  # compact join...
    assert original_events[:-1] + b",{" in (out / "rank-0.json").read_bytes()  # ...after the verbatim list


def test_no_track_row_holds_overlapping_slices(tmp_path):
    findings = [{"rule": "a", "severity": "warning", "ranks": [], "steps": [1, 2]},
                {"rule": "b", "severity": "error", "ranks": [0], "steps": [1]},
                {"rule": "c", "severity": "info", "ranks": [1], "steps": [1]}]
    steps = [{"step": 1, "start_ns": 1_000_000, "end_ns": 1_095_000},
             {"step": 2, "start_ns": 1_100_000, "end_ns": 1_195_000}]
    got = finding_windows(findings, 0, 0, steps)
    assert [(w["name"], w["start_ns"]) for w in got] == [("[warning] a", 1_000_000), ("[warning] a", 1_100_000),
                                                         ("[error] b", 1_000_000)]
    from analyzer.export.annotate import assign_lanes, track_events
    events = track_events({"findings": got}, pid=9)
    rows: dict[int, list] = {}
    for e in events:
        if e["ph"] == "X":
            rows.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(rows) == 2 and assign_lanes(got) == [0, 0, 1]
    for slices in rows.values():
        slices.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(slices, slices[1:]))


def test_explicit_finding_windows_convert_to_the_trace_clock():
    origin = 4458676422880181  # ns: the real HTA trace's time origin
    finding = {"rule": "straggler-rank", "severity": "warning", "ranks": [3], "steps": [],
               "evidence": {"time_windows": [{"rank": 3, "start_us": 505.593, "end_us": 536.568},
                                             {"rank": 2, "start_us": 1.0, "dur_us": 2.0}]}}
    got = finding_windows([finding], 3, origin, [])
    assert [(w["start_ns"], w["end_ns"]) for w in got] == [(origin + 505_593, origin + 536_568)]
    ts = ns_to_trace_us(got[0]["start_ns"])
    assert ts == 4458676423385.774 and int(_us_to_ns(np.array([ts]))[0]) == origin + 505_593
    assert to_trace_ns([0.001], origin)[0] == origin + 1


def test_real_trace_round_trip_and_exposed_total(real_traces, tmp_path):
    """HTA's DDP trace (gzip): ingest unchanged; the exposed windows add up to the rank's
    exposed communication (39,559.468 µs, the figure HTA's overlap implies)."""
    src = real_traces / "hta_ddp_rank0_of_2" / "rank-0.json.gz"
    written = annotate([str(src)], tmp_path / "out")
    out = Path(written[0]["output"])
    assert out.name == src.name
    assert_same_ingest(src, out)
    events = added_events(src, out)
    exposed = windows(events, "exposed communication")
    assert sum(end - start for _, start, end in exposed) == pytest.approx(39559.468, abs=0.01)
    assert len(windows(events, "steps")) == 3


def test_refuses_to_write_over_inputs(job, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in job.iterdir()}
    rc, out, err = run_cli(["annotate", job, "-o", job], capsys)
    assert rc == 2 and "refusing to write over the input" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(["annotate", job / "rank-0.json", "-o", tmp_path / "job" / "." / ""], capsys)
    assert rc == 2 and "refusing" in err
    assert {p.name: p.read_bytes() for p in job.iterdir()} == before
    other = tmp_path / "elsewhere"
    other.mkdir()
    two_step_ddp(rank=2, world_size=3, pg_ranks=(0, 1, 2)).write(other / "rank-0.json")
    with pytest.raises(InputError, match="file name also used by"):
        annotate([str(job / "rank-0.json"), str(other / "rank-0.json")], tmp_path / "out")
    assert not (tmp_path / "out").exists()
