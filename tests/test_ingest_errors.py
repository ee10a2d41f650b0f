"""Bad input: one line on stderr naming the file and the problem, exit code 2, no traceback."""

import gzip
import json
import subprocess
import sys

import pytest

from analyzer.cli.main import main
from builders import TraceBuilder, two_step_ddp


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def expect_input_error(capsys, args, *needles):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_truncated_gzip(tmp_path, capsys):
    data = gzip.compress(json.dumps(two_step_ddp().doc).encode() * 50)
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    expect_input_error(capsys, ["diagnose", str(bad)], str(bad), "truncated gzip")


def test_invalid_json(tmp_path, capsys):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [ {"ph": "X",')
    expect_input_error(capsys, ["diagnose", str(bad)], str(bad), "invalid JSON")


# JSON that is not a trace: see the case table in tests/test_hostile_input.py


def test_empty_directory_and_missing_path(tmp_path, capsys):
    expect_input_error(capsys, ["diagnose", str(tmp_path)], str(tmp_path), "no trace files")
    missing = tmp_path / "nope.json"
    expect_input_error(capsys, ["diagnose", str(missing)], str(missing), "no such file")


def test_duplicate_ranks_named(tmp_path, capsys):
    a = two_step_ddp(rank=1).write(tmp_path / "a.json")
    b = two_step_ddp(rank=1).write(tmp_path / "b.json")
    err = expect_input_error(capsys, ["diagnose", str(a), str(b)], "duplicate rank 1")
    assert "a.json" in err and "b.json" in err


def test_mixed_world_sizes(tmp_path, capsys):
    a = two_step_ddp(rank=0).write(tmp_path / "a.json")
    b = two_step_ddp(rank=1, world_size=4, pg_ranks=(0, 1, 2, 3)).write(tmp_path / "b.json")
    expect_input_error(capsys, ["diagnose", str(a), str(b)], "world_size differs")


def test_usage_error_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--format", "xml", "x.json"])
    assert exit_info.value.code == 2


def test_trace_without_gpu_events_warns(tmp_path, capsys):
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 0, 10, cat="user_annotation")
    path = b.write(tmp_path / "rank-0.json")
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--format", "json", str(path)])
    assert exit_info.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"][0]["comm_us"] == 0 and doc["collectives"] == []
    assert any("no GPU activity" in w for w in doc["warnings"])


def test_rank_from_file_name_and_gzip_without_suffix(tmp_path):
    from analyzer.api import diagnose
    for name in ("worker3.json", "trace_rank-5.pt.trace.json", "rank7.json"):
        b = TraceBuilder()
        del b.doc["distributedInfo"]
        b.kernel("gemm", 0, 1)
        b.write(tmp_path / name)
    # a gzip file whose name does not say so, in its own directory
    other = tmp_path / "sub"
    other.mkdir()
    b = TraceBuilder(rank=2, world_size=4)  # a rank below the world size (rank 2 of 2 is said: issue 30)
    b.kernel("gemm", 0, 1)
    (other / "rank2.json").write_bytes(gzip.compress(json.dumps(b.doc).encode()))
    ranks = [r.rank for r in diagnose([str(tmp_path / "*.json")]).ranks]
    assert ranks == [3, 5, 7]
    assert diagnose([str(other)]).ranks[0].rank == 2


def test_pg_config_ranks_as_string(tmp_path):
    from analyzer.api import diagnose
    b = two_step_ddp(pg_ranks_as_string=True, host="node-a")
    rank = diagnose([str(b.write(tmp_path / "rank-0.json"))]).ranks[0]
    assert rank.process_groups[0]["ranks"] == [0, 1] and rank.host == "node-a"


def test_subprocess_entry_point_one_line(tmp_path):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    code, out, err = run_cli("diagnose", str(bad))
    assert code == 2 and out == "" and err.startswith("tracecliff: ") and err.count("\n") == 1


def test_output_never_overwrites_input(tmp_path, capsys):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    expect_input_error(capsys, ["diagnose", str(path), "-o", str(path)], "refusing to overwrite")
    assert json.loads(path.read_text())["traceEvents"]
