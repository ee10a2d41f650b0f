"""analyzer.capture (the public profiler helper) and the real CPU traces it recorded."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CPU_GLOO = REPO_ROOT / "sample_traces" / "cpu_gloo"
CPU_GLOO_JOBS = ["ddp", "fsdp1_nowrap", "fsdp1_wrap", "fsdp2"]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


class NamedEvent(msgspec.Struct):
    name: str = ""


class TraceNamesAndInfo(msgspec.Struct):
    """Only the fields these tests read: a typed decode is ~10x faster than a generic one."""

    traceEvents: list[NamedEvent]
    distributedInfo: dict | None = None


def load_sample(path: Path) -> TraceNamesAndInfo:
    with gzip.open(path, "rb") as stream:
        return msgspec.json.decode(stream.read(), type=TraceNamesAndInfo)


def test_import_does_not_import_torch():
    # A fresh interpreter: this pytest process may already hold torch from another test.
    result = run_python(
        "import sys, analyzer.capture; print('torch' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_profile_steps_without_torch_says_how_to_install():
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed.
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "from analyzer.capture import profile_steps\n"
        "try:\n    profile_steps('unused')\n"
        "except ImportError as error:\n    print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch is required: pip install tracecliff[capture]"


@pytest.mark.parametrize(
    "arguments, problem",
    [({"active": 0}, "active must be >= 1"), ({"wait": -1}, "must be >= 0: wait")],
)
def test_profile_steps_rejects_bad_schedule(arguments, problem):
    pytest.importorskip("torch")
    from analyzer.capture import profile_steps

    with pytest.raises(ValueError, match=problem):
        profile_steps("unused", **arguments)


def test_trace_file_name():
    from analyzer.capture import trace_file_name

    assert trace_file_name(3) == "rank-3.pt.trace.json.gz"
    assert trace_file_name(0, use_gzip=False) == "rank-0.pt.trace.json"


def test_single_process_run_writes_one_rank_file(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from analyzer.capture import profile_steps

    monkeypatch.delenv("RANK", raising=False)
    model = torch.nn.Linear(4, 4)
    # wait=1, warmup=1, active=2: steps 2 and 3 are recorded; the 5th step is outside.
    with profile_steps(tmp_path, wait=1, warmup=1, active=2) as prof:
        for _ in range(5):
            model(torch.ones(2, 4)).sum().backward()
            prof.step()

    assert [path.name for path in tmp_path.iterdir()] == ["rank-0.pt.trace.json.gz"]
    with gzip.open(tmp_path / "rank-0.pt.trace.json.gz", "rt") as stream:
        trace = json.load(stream)
    steps = sorted(
        event["name"]
        for event in trace["traceEvents"]
        if event.get("name", "").startswith("ProfilerStep#")
    )
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    assert trace["record_shapes"] == 1
    assert "distributedInfo" not in trace  # no process group in this run


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_repeated_cycles_and_explicit_rank_go_to_cycle_folders(tmp_path):
    torch = pytest.importorskip("torch")
    from analyzer.capture import profile_steps

    with profile_steps(tmp_path, wait=0, warmup=1, active=1, repeat=2, gzip=False, rank=5) as prof:
        for _ in range(4):
            torch.ones(3).sum()
            prof.step()

    written = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))
    assert written == [
        "cycle-0",
        "cycle-0/rank-5.pt.trace.json",
        "cycle-1",
        "cycle-1/rank-5.pt.trace.json",
    ]
    for cycle in ("cycle-0", "cycle-1"):
        trace = json.loads((tmp_path / cycle / "rank-5.pt.trace.json").read_text())
        assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])


@pytest.mark.parametrize("job", CPU_GLOO_JOBS)
def test_cpu_gloo_sample_has_two_ranks_with_distributed_info(job):
    files = sorted((CPU_GLOO / job).iterdir())
    assert [path.name for path in files] == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    for expected_rank, path in enumerate(files):
        trace = load_sample(path)
        info = trace.distributedInfo
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", expected_rank, 2)
        assert info["pg_config"][0]["ranks"] == [0, 1]
        names = {event.name for event in trace.traceEvents}
        assert {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"} <= names
        assert "gloo:all_reduce" in names


def test_cpu_gloo_samples_stay_small():
    total_bytes = sum(path.stat().st_size for path in CPU_GLOO.rglob("*") if path.is_file())
    assert total_bytes < 6 * 1024 * 1024
