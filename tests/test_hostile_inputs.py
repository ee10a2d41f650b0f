"""Issue 41: input built by an attacker. Each case runs the command line in a subprocess under
an address-space limit (RLIMIT_AS) and asserts its exit code, one line on stderr naming the file
(never a traceback or an internal error), its wall time and its peak memory (the child's own
high-water mark, VmHWM, written as it exits: the rusage os.wait4 gives counts the forked parent's
pages too, so it read 819 MB for every case once the test process itself had grown that large).

Figures on this machine (2 cores shared with 5 other sessions), before -> after; after from
`python bench/bench_hostile.py --sizes 100,400` (4 GB limit; wall, peak RSS):
- a long string as the first key before traceEvents: at 1 GB, exit 0 after 9-12 s at 3.1 GB
  (the head read to 64 MB, then the whole file decoded) -> refused at 64 MB naming "x":
  100 MB 3.4 s 203 MB, 400 MB 3.6 s 207 MB.
- one kernel named by a long string: 200 MB 72-81 s (a re-join and re-scan per chunk) ->
  refused at 32 MB naming "name" in $.traceEvents[100]: 100 MB 5.1 s 277 MB, 400 MB 4.4 s 281 MB.
- a long string after the events array: 1 GB 142 s and 2.2 GB -> refused at 64 MB:
  100 MB 3.4 s 321 MB, 400 MB 3.6 s 325 MB.
- whitespace inside the array: 10 GB 53 s -> refused at 32 MB: 100 MB 5.2 s, 400 MB 5.4 s, 281 MB.
- 2,000,000 references to one Flight Recorder entry (3.8 MB pickle): 1:46 and 3.35 GB -> 2.2 s 62 MB.
- 200,000 levels of nesting: "internal error: RecursionError" -> one line naming the file.
The limits asserted below are looser than these (the machine is shared), and the sizes are a few
times each limit: enough to show the cost no longer follows the value.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from builders import two_step_ddp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_hostile import EVENTS, MB, write_gz  # noqa: E402  (the benchmark for size: bench/)

LIMIT_AS = 3 << 30  # the address space each case runs in (Python + numpy + msgspec: ~1 GB of it mapped)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


# ``python -m analyzer ARGS`` that writes its peak RSS (VmHWM, or its workers', kB) to $TC_TEST_HWM as it exits:
# a fork's rusage (ru_maxrss) starts from the parent's high-water mark, the new image's does not.
_LAUNCH = """
import atexit, os, resource, runpy, sys
def _hwm():
    try:
        with open("/proc/self/status") as status:
            kb = int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
        # its own workers (the two-process loader) forked from this image: their rusage counts
        kb = max(kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        with open(os.environ["TC_TEST_HWM"], "w") as out:
            out.write(str(kb))
    except (OSError, StopIteration):
        pass
atexit.register(_hwm)
sys.argv = ["analyzer", *sys.argv[1:]]
runpy.run_module("analyzer", run_name="__main__", alter_sys=True)
"""


def run_cli(*args, cwd=None) -> tuple[int, str, str, float, float]:
    """(exit code, stdout, stderr, wall s, peak RSS MB) of ``python -m analyzer ARGS``: the
    child's own high-water mark (else its rusage from os.wait4), its output through files (no
    pipe to drain while waiting)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as scratch:
        hwm = Path(scratch) / "hwm"
        env = {**os.environ, "TRACECLIFF_CACHE_DIR": str(Path(cwd or ".") / "cache"), "TC_TEST_HWM": str(hwm)}
        start = time.monotonic()
        child = subprocess.Popen([sys.executable, "-c", _LAUNCH, *map(str, args)], stdout=out, stderr=err,
                                 preexec_fn=_limit, cwd=cwd, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        peak_mb = int(hwm.read_text()) / 1024 if hwm.is_file() else usage.ru_maxrss / 1024
        return (child.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                wall, peak_mb)


def refused(path, *args, needle: str, seconds: float, megabytes: float, command="diagnose") -> str:
    code, out, err, wall, peak = run_cli(command, "--no-cache", *args, path)
    assert code == 2, (code, err[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert str(path) in err and needle in err, err
    assert wall < seconds, (wall, err)
    assert peak < megabytes, (peak, err)
    return err


gz = write_gz  # the benchmark's writer: (byte, MB) parts are long runs


def test_long_string_before_the_events(tmp_path):
    path = gz(tmp_path / "rank-0.json.gz", b'{"x": "', (b"A", 200), b'", "traceEvents": [' + EVENTS + b"]}")
    refused(path, needle='the value of "x" is a string longer than', seconds=20, megabytes=700)


def test_long_event_name(tmp_path):
    path = gz(tmp_path / "rank-0.json.gz", b'{"traceEvents": [' + EVENTS + b', {"ph": "X", "name": "', (b"A", 100),
              b'", "ts": 1, "dur": 1, "pid": 0, "tid": 7}]}')
    refused(path, needle='the value of "name" in $.traceEvents[100] is a string longer than', seconds=20,
            megabytes=700)


def test_long_string_after_the_events(tmp_path):
    path = gz(tmp_path / "rank-0.json.gz", b'{"traceEvents": [' + EVENTS + b'], "x": "', (b"A", 200), b'"}')
    refused(path, needle='the value of "x" is a string longer than', seconds=20, megabytes=700)


def test_whitespace_inside_the_array(tmp_path):
    path = gz(tmp_path / "rank-0.json.gz", b'{"traceEvents": [' + EVENTS + b",", (b" ", 100), b"{}]}")
    refused(path, needle="(text with no event boundary) is longer than", seconds=20, megabytes=700)


@pytest.mark.parametrize("layout", ["distributedInfo", "bare", "after"])
def test_deep_nesting(tmp_path, layout):
    deep = b"[" * 200_000 + b"]" * 200_000
    event = b'{"ph": "X", "name": "k", "cat": "kernel", "ts": 1, "dur": 1, "pid": 0, "tid": 1}'
    text = {"distributedInfo": b'{"distributedInfo": {"a": ' + deep + b'}, "traceEvents": [' + event + b"]}",
            "bare": deep,
            "after": b'{"traceEvents": [' + event + b'], "distributedInfo": {"a": ' + deep + b"}}"}[layout]
    path = tmp_path / "rank-0.json"
    path.write_bytes(text)
    code, out, err, wall, peak = run_cli("diagnose", "--no-cache", path)
    assert code == 2 and err.count("\n") == 1 and str(path) in err and "internal error" not in err, err
    assert wall < 20 and peak < 700, (wall, peak)


def test_bare_array_is_streamed_not_parsed_whole(tmp_path):
    """A bare-array trace is never json.loads-ed to see whether it is a saved result: its memory
    follows the columns, as the object form's does."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i % 50}", "pid": 0, "tid": 7, "ts": 1000 + 10 * i, "dur": 5,
               "args": {"device": 0, "stream": 7}} for i in range(60_000)]
    bare, wrapped = tmp_path / "bare" / "rank-0.json", tmp_path / "object" / "rank-0.json"
    for path, doc in ((bare, events), (wrapped, {"traceEvents": events})):
        path.parent.mkdir()
        path.write_text(json.dumps(doc))
    peaks = []
    for path in (bare, wrapped):
        code, out, err, wall, peak = run_cli("diagnose", "--no-cache", "--format", "json", path)
        assert code == 0, err
        assert json.loads(out)["ranks"][0]["event_count"] == 60_000
        peaks.append(peak)
    size = bare.stat().st_size / MB  # ~8 MB
    assert peaks[0] < peaks[1] + size, (peaks, size)  # was ~6x the file for the bare array


def test_long_metadata_rank_is_not_dropped_from_a_directory(tmp_path):
    """A rank whose metadata before traceEvents passes 1 MiB is still a trace of the job."""
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        doc = json.loads(two_step_ddp(rank=rank).write(tmp_path / f"src-{rank}.json").read_text())
        if rank == 1:
            doc = {"distributedInfo": {**doc.get("distributedInfo", {}),
                                       "pg_config": [{"pg_name": "x", "pg_desc": "big", "ranks": list(range(300_000))}]},
                   **{k: v for k, v in doc.items() if k != "distributedInfo"}}
        (job / f"rank-{rank}.json").write_text(json.dumps(doc))
    assert (job / "rank-1.json").read_bytes().index(b'"traceEvents"') > 1 << 20
    code, out, err, wall, peak = run_cli("diagnose", "--no-cache", "--format", "json", job)
    assert code in (0, 1), err
    assert sorted(r["rank"] for r in json.loads(out)["ranks"]) == [0, 1], err


HOSTILE = "\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\x1b[31m\u202e"  # window title, clipboard, colour, bidi
MARKDOWN_HOSTILE = "pg` [click](https://example.com) ![x](https://example.com/p.png) <b>"


def hostile_job(tmp_path, name="job"):
    job = tmp_path / name
    job.mkdir()
    for rank in (0, 1):
        builder = two_step_ddp(rank=rank)
        builder.doc["deviceProperties"][0]["name"] = "H100" + HOSTILE
        info = builder.doc["distributedInfo"]
        info["nccl_version"] = "2.21" + HOSTILE
        info["host_name"] = "host" + HOSTILE
        for group in info.get("pg_config") or []:
            group["pg_desc"] = MARKDOWN_HOSTILE + HOSTILE
        builder.write(job / f"rank-{rank}{HOSTILE[:6]}.json")
    return job


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text[:400])


def test_control_sequences_are_shown_not_obeyed(tmp_path):
    """Issue 41, 5: trace strings and file names reach stdout and stderr escaped (\\x1b)."""
    job = hostile_job(tmp_path)
    shown = []
    for args in (("diagnose", "--no-cache", job), ("gate", "--no-cache", "--preset", "strict", job),
                 ("diagnose", "--no-cache", job / "missing.json")):
        code, out, err, wall, peak = run_cli(*args, cwd=tmp_path)
        assert "internal error" not in err and "Traceback" not in err, err
        assert_inert(out)
        assert_inert(err)
        shown.append((code, out))
    assert shown[0][0] == 0 and "\\x1b]0;owned\\x07" in shown[0][1], shown[0]  # shown, as its escape


def test_summary_and_junit_hold_no_markup_from_the_trace(tmp_path, monkeypatch):
    """Issue 41, 6: the GitHub summary escapes Markdown (backticks included) and controls; JUnit
    shows controls escaped."""
    from analyzer.base.sanitize import markdown
    cell = markdown(MARKDOWN_HOSTILE + HOSTILE)
    assert_inert(cell)
    assert "](" not in cell and "<b>" not in cell and "`" not in cell.replace("\\`", ""), cell
    job = hostile_job(tmp_path)
    summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err, wall, peak = run_cli("gate", "--no-cache", "--preset", "strict", "--github-summary", "--junit", junit, job, cwd=tmp_path)
    assert code in (0, 1), err
    for text in (summary.read_text(), junit.read_text(), out, err):
        assert_inert(text)
    assert "](http" not in summary.read_text()


def test_file_name_that_is_not_utf8(tmp_path):
    """Issue 41, 7: JSON and HTML hold a file name's undecodable bytes as \\xff, losslessly shown."""
    job = tmp_path / "job"
    job.mkdir()
    two_step_ddp(rank=0).write(Path(os.fsdecode(bytes(job) + b"/rank-0\xff\xfe.json")))
    html = tmp_path / "report.html"
    code, out, err, wall, peak = run_cli("diagnose", "--no-cache", "--format", "json", "--html", html, job)
    assert code == 0, err
    assert [r["path"].rsplit("/", 1)[-1] for r in json.loads(out)["ranks"]] == ["rank-0\\xff\\xfe.json"]
    assert "rank-0\\xff\\xfe.json" in html.read_text(encoding="utf-8")


def test_dash_output_is_stdout(tmp_path):
    """Issue 41, 13: ``-o -`` writes to stdout, never a file named ``-``."""
    job = tmp_path / "job"
    job.mkdir()
    two_step_ddp(rank=0).write(job / "rank-0.json")
    code, out, err, wall, peak = run_cli("diagnose", "--no-cache", "--format", "json", "-o", "-", job, cwd=tmp_path)
    assert code == 0 and json.loads(out)["ranks"] and not (tmp_path / "-").exists(), err


@pytest.mark.parametrize("command, steps", [("diagnose", "7-5"), ("diagnose", ","), ("diff", "7-5"),
                                            ("annotate", ","), ("gate", "9-3,4")])
def test_steps_that_select_nothing_by_their_syntax(tmp_path, capsys, command, steps):
    """Issue 41, 8: an empty or reversed --steps is one line, exit 2, in every command."""
    from analyzer.cli.main import main
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        two_step_ddp(rank=rank).write(job / f"rank-{rank}.json")
    extra = {"diff": [job], "annotate": ["-o", tmp_path / "out"], "gate": ["--preset", "strict"]}.get(command, [])
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--no-cache", "--steps", steps, *map(str, extra), str(job)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and repr(steps) in err, err
    assert not (tmp_path / "out").exists()


def _fr_entry() -> dict:
    return {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
            "p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 1,
            "input_sizes": [[4]], "output_sizes": [[4]], "state": "completed", "retired": True, "frames": [],
            "is_p2p": False, "timeout_ms": 600000}


@pytest.mark.parametrize("case, needle", [("cycle", "a cycle"), ("fan", "through shared references"),
                                          ("shared", "through shared references"), ("zeros", "longer than")])
def test_flight_recorder_dumps_cost_their_size(tmp_path, case, needle):
    """Issue 41, 9-10: a dump's cost follows its bytes. A self-holding list (looped for ever), 7.8 KB
    of [x]*1000 four levels deep (~16 h before), 2,000,000 references to one entry (4 MB: 1:46 and
    3.35 GB before) and a .gz of zeros inflating past the dump limit (7.2 GB RSS before) are one
    line each, in seconds."""
    import pickle
    path = tmp_path / f"fr_rank_0{'.gz' if case == 'zeros' else ''}"
    if case == "cycle":
        loop: list = []
        loop.append(loop)
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": loop}))
    elif case == "fan":
        fan: list = [1]
        for _ in range(4):
            fan = [fan] * 1000
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": fan}))
    elif case == "shared":
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": [_fr_entry()] * 2_000_000}))
    else:
        gz(path, b"\x80\x04", (b"\0", 300))
    code, out, err, wall, peak = run_cli("hang", path)
    assert code == 2 and err.count("\n") == 1 and str(path) in err and needle in err, err
    assert wall < 20 and peak < 700, (wall, peak)


def test_large_plain_dump_is_still_read(tmp_path):
    """The bound is on references, not on size: 30,000 distinct entries (no sharing) pass it, in the time of one walk."""
    import pickle
    from analyzer.hang.read import _check_plain
    doc = {"version": "2.10", "entries": [dict(_fr_entry(), record_id=i) for i in range(30_000)]}
    raw = pickle.dumps(doc)
    loaded = pickle.loads(raw)
    _check_plain(tmp_path / "fr_rank_0", loaded, len(raw))  # no error
    shared = {"version": "2.10", "entries": [loaded["entries"][0]] * 2}  # sharing that stays small: read too
    _check_plain(tmp_path / "fr_rank_0", shared, len(pickle.dumps(shared)))


def test_config_depth_and_catastrophic_regex(tmp_path, capsys):
    """Issue 41, 12: a deeply nested TOML value and a catastrophic [communication] kernels regex
    are one-line configuration errors (a RecursionError, a 60 s hang before)."""
    from analyzer.cli.main import main
    job = tmp_path / "job"
    job.mkdir()
    two_step_ddp(rank=0).write(job / "rank-0.json")
    deep = tmp_path / "deep.toml"
    deep.write_text("[tool.tracecliff.communication]\nkernels = " + "[" * 100_000 + "]" * 100_000 + "\n")
    evil = tmp_path / "evil.toml"
    evil.write_text('[tool.tracecliff.communication]\nkernels = ["(a+)+$"]\n')
    for config, needle in ((deep, "nested deeper"), (evil, "nests a quantifier")):
        start = time.monotonic()
        with pytest.raises(SystemExit) as exit_info:
            main(["diagnose", "--no-cache", "--config", str(config), str(job)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and str(config) in err and needle in err, err
        assert time.monotonic() - start < 10


def test_a_result_past_its_versions_row_limit_is_refused(tmp_path, capsys):
    """Issue 41, 13: a schema_version 1 result holds at most 10,000 collective rows (192,000 were
    accepted before: 855 MB for gate)."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.cli.main import main
    from analyzer.job.large import JSON_ROWS
    from analyzer.job.result import dumps
    job = tmp_path / "job"
    job.mkdir()
    two_step_ddp(rank=0).write(job / "rank-0.json")
    doc = json.loads(dumps(diagnose([str(job)], DiagnoseOptions(workers=1)).to_dict()))
    assert doc["collectives"]
    doc["collectives"] = doc["collectives"][:1] * (JSON_ROWS + 1)
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as exit_info:
        main(["gate", "--preset", "strict", str(saved)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and str(saved) in err and "at most 10,000" in err, err
    assert "collectives holds 10,001 rows" in err, err


def test_a_result_past_its_row_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    """Issue 41, 13: the rows are counted before the document is parsed into dicts (192,000 rows
    took 855 MB to refuse): the reader refuses without ever calling the whole parse."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.base.errors import InputError
    from analyzer.job import saved as saved_module
    from analyzer.job.large import JSON_ROWS
    from analyzer.job.result import dumps
    job = tmp_path / "job"
    job.mkdir()
    two_step_ddp(rank=0).write(job / "rank-0.json")
    doc = json.loads(dumps(diagnose([str(job)], DiagnoseOptions(workers=1)).to_dict()))
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    assert saved_module.read_result_file(path) is not None  # within the limit: read
    doc["collectives"] = doc["collectives"][:1] * (JSON_ROWS + 1)
    path.write_text(json.dumps(doc))

    def whole_parse(*_args, **_kwargs):
        raise AssertionError("parsed whole")
    monkeypatch.setattr(saved_module.json, "loads", whole_parse)
    with pytest.raises(InputError, match="collectives holds 10,001 rows") as refusal:
        saved_module.read_result_file(path)
    assert refusal.value.path == str(path)


def test_ranks_that_disagree_on_gpu_or_nccl_are_said(tmp_path):
    """Issue 41, 13: ranks of other GPUs or NCCL versions are not merged in silence."""
    from analyzer.api import DiagnoseOptions, diagnose
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        builder = two_step_ddp(rank=rank)
        if rank == 1:
            builder.doc["deviceProperties"][0]["name"] = "AMD Instinct MI300X"
            builder.doc["distributedInfo"]["nccl_version"] = "2.18.1"
        builder.write(job / f"rank-{rank}.json")
    warnings = diagnose([str(job)], DiagnoseOptions(workers=1)).warnings
    assert any("disagree on the GPU" in w and "MI300X" in w and "rank(s) 1" in w for w in warnings), warnings
    assert any("disagree on the NCCL version" in w and "2.18.1" in w for w in warnings), warnings


def _diagnose_cli(capsys, path) -> tuple[int, str]:
    from analyzer.cli.main import main
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--no-cache", "--format", "json", "--output", str(path.parent / "out.json"), str(path)])
    return exit_info.value.code, capsys.readouterr().err


def test_ranks_of_two_generated_jobs_are_refused(tmp_path, capsys):
    """Issue 41, 13: two HSDP jobs of the same world size (FSDP1's groups, FSDP2's DeviceMesh)
    mixed in one directory were merged. torch's group "1" holds ranks 0, 1 in the first job and
    0, 2 in the second: one line naming both files, exit 2. Each job alone still loads."""
    from analyzer.synth import JobSpec, write_job
    small = dict(world_size=4, gpus_per_node=2, sharding="hybrid_shard", steps=2, n_layers=2, hidden=512, seq_len=256)
    for strategy in ("fsdp1", "fsdp2"):
        write_job(JobSpec(name=strategy, strategy=strategy, **small), tmp_path / strategy)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for rank in range(4):
        name = f"rank-{rank}.json.gz"
        (mixed / name).write_bytes((tmp_path / ("fsdp1" if rank < 2 else "fsdp2") / name).read_bytes())
    code, err = _diagnose_cli(capsys, mixed)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "traces from different jobs: process group '1'" in err, err
    assert str(mixed / "rank-0.json.gz") in err and str(mixed / "rank-2.json.gz") in err, err
    for strategy in ("fsdp1", "fsdp2"):
        code, err = _diagnose_cli(capsys, tmp_path / strategy)
        assert code in (0, 1) and "different jobs" not in err, err


def test_ranks_with_different_backends_are_refused(tmp_path, capsys):
    """Issue 41, 13: every rank of a job initialises one default group, so one backend."""
    job = tmp_path / "job"
    job.mkdir()
    for rank, backend in ((0, "nccl"), (1, "gloo")):
        builder = two_step_ddp(rank=rank)
        builder.doc["distributedInfo"]["backend"] = backend
        builder.write(job / f"rank-{rank}.json")
    code, err = _diagnose_cli(capsys, job)
    assert code == 2 and err.count("\n") == 1 and "the default group's backend differs" in err, err
    assert str(job / "rank-0.json") in err and str(job / "rank-1.json") in err and "'gloo'" in err, err


def test_ranks_on_different_gpus_use_their_own(tmp_path):
    """Issue 41, 13: one job's ranks 0-1 on H100s and 2-3 on A100s (the generator's same job on
    each GPU, mixed). Each rank's MFU from its shapes is held to its own GPU's peak (the one it
    has in its own GPU's job), the model-parameter MFU's N × peak is the sum of the GPUs' peaks,
    and the header names the mix, not the first rank's GPU."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.synth import JobSpec, write_job
    from analyzer.synth.spec import GPUS
    from analyzer.reports.text import TextRenderer
    small = dict(world_size=4, gpus_per_node=2, steps=2, n_layers=2, hidden=512, seq_len=256)
    options = DiagnoseOptions(workers=1, model_params=1e8, tokens_per_step=4096)
    alone = {}
    for gpu in ("H100", "A100"):
        write_job(JobSpec(name=gpu, gpu=gpu, **small), tmp_path / gpu)
        alone[gpu] = diagnose([str(tmp_path / gpu)], options).to_dict()
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for rank in range(4):
        name = f"rank-{rank}.json.gz"
        (mixed / name).write_bytes((tmp_path / ("H100" if rank < 2 else "A100") / name).read_bytes())
    result = diagnose([str(mixed)], options)
    doc = result.to_dict()
    h100, a100 = GPUS["H100"], GPUS["A100"]
    assert doc["job"]["gpu"] == f"mixed: 2\u00d7 {a100.name}, 2\u00d7 {h100.name}"
    assert doc["job"]["gpu_mem_bytes"] == min(h100.total_mem_bytes, a100.total_mem_bytes)
    assert "mixed: 2\u00d7" in TextRenderer().render(result)
    for rank in doc["ranks"]:
        gpu = "H100" if rank["rank"] < 2 else "A100"
        own = next(r for r in alone[gpu]["ranks"] if r["rank"] == rank["rank"])
        assert rank["compute"]["peak_tflops"] == GPUS[gpu].peak_bf16_tflops == own["compute"]["peak_tflops"]
        assert rank["compute"]["mfu"] == own["compute"]["mfu"]
    assert doc["mfu"]["peak_tflops"]["value"] == (2 * h100.peak_bf16_tflops + 2 * a100.peak_bf16_tflops) / 4


def test_gpu_work_lasting_days_is_said(tmp_path):
    """Issue 41, 13: 50 kernels of 6.99 days (below the week that makes a duration impossible)
    turned MFU into "0.0%" in silence; now a warning names them."""
    from analyzer.api import DiagnoseOptions, diagnose
    builder = two_step_ddp(rank=0)
    for i in range(50):
        builder.kernel("sm90_xmma_gemm_bf16", ts=10_000 + i, dur=6.99 * 24 * 3600 * 1e6)
    path = builder.write(tmp_path / "rank-0.json")
    warnings = diagnose([str(path)], DiagnoseOptions(workers=1)).warnings
    assert any("50 GPU event(s) last more than a day (the longest 167.8 h)" in w for w in warnings), warnings


@pytest.mark.parametrize("piece", [1, 7, 64, 300, 4096])
def test_head_finder_ignores_decoy_keys_at_any_split(piece):
    """The incremental head scan finds the top-level "traceEvents" array whatever the chunking,
    past decoys: the key inside a string, as a value, in a nested object, and far blanks."""
    from analyzer.ingest.stream import read_head
    decoys = (b'{"a": "x \\"traceEvents\\": [", "b": "traceEvents", "c": {"traceEvents": [1, 2]}, '
              b'"d": ["traceEvents"], "e": "' + b"traceEvents" * 50 + b'", "traceEvents"' + b" " * 400
              + b": \n [")
    text = decoys + EVENTS + b"]}"
    pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
    buf, at = read_head(iter(pieces), "t.json")
    assert at == len(decoys), (at, len(decoys))
    assert buf[:at] == decoys
