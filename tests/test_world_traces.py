"""Traces other teams recorded (``../shared/traces/world``, README there): the verdict and the
figures the README gives, each worked out again here by hand from the raw JSON (plain Python
over the events, no tracecliff code), and compared with what tracecliff prints (issue 37)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from analyzer.api import diagnose
from analyzer.cli.main import main
from conftest import REAL_TRACES

WORLD = REAL_TRACES.parent / "world"
RESNET50 = "kineto_tb_resnet50_num_workers_0"
MI300 = "tracelens_ddp_resnet18_mi300"
# The old Kineto categories (PyTorch <= 1.9) and today's, as the README lists them.
TODAY = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime",
         "async": "ac2g"}


def _world(name: str) -> Path:
    folder = WORLD / name
    if not folder.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"world traces missing at {WORLD} (CI must provide ../shared)")
        pytest.skip(f"world traces not found at {WORLD}")
    return next(folder.glob("*.json.gz"))


def _events(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def resnet50():
    path = _world(RESNET50)
    return path, diagnose([str(path)], report=False)


def _by_hand_steps(events: list[dict]) -> list[tuple[str, float, float]]:
    """(name, length ms, DataLoader ms inside it) of each ProfilerStep: the step is the CPU
    ``ProfilerStep#N`` range; the loader's time the sum of the
    ``enumerate(DataLoader)#...__next__`` ranges that start inside it."""
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    loader = [e for e in events if str(e.get("name", "")).startswith("enumerate(DataLoader)#")]
    return [(s["name"], s["dur"] / 1000.0,
             sum(e["dur"] for e in loader if s["ts"] <= e["ts"] < s["ts"] + s["dur"]) / 1000.0) for s in steps]


def test_old_category_names_are_read_and_the_loader_is_the_verdict(resnet50):
    """PyTorch 1.9's categories (Kernel, Runtime, Operator, async): 8,772 kernels on a V100,
    data-loader bound. By hand: ProfilerStep#5..10 last 176.1 / 174.0 / 176.9 / 181.3 / 176.5 /
    164.3 ms; the DataLoader's __next__ takes 68.7 / 68.8 / 73.4 / 71.4 / 70.8 / 62.6 ms of them."""
    path, result = resnet50
    by_hand = _by_hand_steps(_events(path)["traceEvents"])
    assert [round(ms, 1) for _, ms, _ in by_hand] == [176.1, 174.0, 176.9, 181.3, 176.5, 164.3]
    assert all(62.0 <= loader <= 74.0 for _, _, loader in by_hand)
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [5, 6, 7, 8, 9, 10]
    assert [s["cpu_step_us"] / 1000.0 for s in steps] == pytest.approx([ms for _, ms, _ in by_hand], abs=0.001)
    assert result.ranks[0].gpu_event_count == 8772 + 312 + 12
    assert "CPU-only" not in result.verdict
    fired = [f for f in result.findings if f["rule"] == "gpu-idle-host-bound"]
    assert len(fired) == 1, result.verdict
    evidence = fired[0]["evidence"]
    leaves = evidence["idle_by_host_median_us"]
    assert evidence["host_activity"] == "input" and max(leaves, key=leaves.get) == "input"
    # The GPU idles only for part of the loader's time (kernels of the previous step drain meanwhile):
    # the loader's share of the idle is below its CPU time and most of the host-caused idle.
    typical = next(loader for name, _, loader in by_hand if name == f"ProfilerStep#{evidence['step']}")
    assert 0.5 * typical * 1000 < leaves["input"] <= typical * 1000
    assert leaves["input"] > 0.7 * evidence["host_idle_us_median"]
    assert "DataLoader" in fired[0]["fix"]["text"]


def test_old_category_names_gpu_idle_as_the_readme_works_it_out(resnet50):
    """GPU idle 65-87 ms a step (~43%) by hand: each full step's GPU span less the union of its
    kernels, copies and memsets (the last step, 10, is the drain: shorter)."""
    _, result = resnet50
    full = [s for s in result.ranks[0].steps if s["step"] < 10]
    for step in full:
        idle_ms = step["time_breakdown"]["idle_us"] / 1000.0
        assert 65.0 <= idle_ms <= 87.0, step["step"]
        assert 0.37 <= idle_ms * 1000 / step["step_time_us"] <= 0.49
    assert 89.0 <= min(s["busy_us"] for s in full) / 1000.0 and max(s["busy_us"] for s in full) / 1000.0 <= 107.0


def _renamed(doc: dict) -> dict:
    """The trace with today's category names: record_function ranges (a '#' in the name:
    ProfilerStep#N, the DataLoader, the optimizer) are ``user_annotation``, other operators
    ``cpu_op``."""
    for event in doc["traceEvents"]:
        cat = event.get("cat")
        if cat == "Operator":
            event["cat"] = "user_annotation" if "#" in event["name"] else "cpu_op"
        elif cat in TODAY:
            event["cat"] = TODAY[cat]
    return doc


def test_old_names_give_the_figures_of_todays_names(resnet50, tmp_path):
    """The same trace with its categories renamed to today's gives the same result, figure for
    figure (the paths in the warnings aside)."""
    path, result = resnet50
    copy = tmp_path / path.name
    with gzip.open(copy, "wt", compresslevel=1) as f:
        json.dump(_renamed(_events(path)), f)
    today = diagnose([str(copy)], report=False)
    old_doc = json.loads(result.to_json().replace(str(path), str(copy)))
    new_doc = json.loads(today.to_json())
    for doc in (old_doc, new_doc):
        doc.pop("inputs", None)
    assert old_doc == new_doc


def test_unknown_categories_that_look_like_device_work_are_named_not_cpu_only(tmp_path, capsys):
    """Kernels under a category no Kineto version wrote: read what can be read, name the
    category in one warning, and never call the trace CPU-only."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0 * k, "dur": 20.0}
              for k in range(4)]
    events += [{"ph": "X", "cat": "GpuKernelV9", "name": "gemm_kernel", "pid": 0, "tid": "stream 7",
                "ts": 100.0 * k + 10, "dur": 50.0, "args": {"stream": 7, "correlation": k}} for k in range(4)]
    # another generator's: kernels named as CUDA names them, on a numbered row, no args
    events += [{"ph": "X", "cat": "cuda_op", "name": "void sgemm_kernel", "pid": 1, "tid": 5, "ts": 100.0 * k + 60,
                "dur": 20.0} for k in range(2)]
    events += [{"ph": "X", "cat": "my_host_range", "name": "setup", "pid": 1, "tid": 1, "ts": 0.0, "dur": 5.0}]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    result = diagnose([str(path)], report=False)
    named = [w for w in result.warnings if "categories tracecliff does not know" in w]
    assert len(named) == 1 and "6 event(s)" in named[0]
    assert "'GpuKernelV9' (4)" in named[0] and "'cuda_op' (2)" in named[0] and "my_host_range" not in named[0]
    assert "CPU-only" not in result.verdict and "No GPU work could be read" in result.verdict
    statuses = {r["rule"]: (r["status"], r.get("reason") or "") for r in result.rules}
    assert "CPU-only" not in statuses["gpu-idle-host-bound"][1]
    html = result.to_html()
    assert "CPU-only" not in html and "unknown categories" in html
    with pytest.raises(SystemExit) as exited:
        main(["gate", str(path), "--preset", "recommended"])
    out, err = capsys.readouterr()
    assert exited.value.code != 0 and "CPU-only" not in out + err and "unknown categories" in out + err


def test_iterations_between_optimizer_steps():
    """No ProfilerStep and no distributedInfo; ``Optimizer.step#SGD.step`` repeats 5 times on the
    main thread. By hand: the iterations are the 4 windows between consecutive starts of that
    range, 115.8 / 1014.7 / 1068.4 / 1076.1 ms, and the kernels launched in each (the runtime
    call with the kernel's correlation id starts inside the window) keep the GPU busy (union of
    their intervals) 72.4 / 71.3 / 71.7 / 71.5 ms. (The allocator verdict on this trace is
    tests/test_world_allocator.py's.)"""
    path = _world(MI300)
    events = _events(path)["traceEvents"]
    starts = sorted(e["ts"] for e in events if e.get("name") == "Optimizer.step#SGD.step"
                    and e.get("cat") == "user_annotation")
    assert len(starts) == 5
    windows = list(zip(starts, starts[1:]))
    assert [round((b - a) / 1000.0, 1) for a, b in windows] == [115.8, 1014.7, 1068.4, 1076.1]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy = [_union_ms([(g["ts"], g["ts"] + g["dur"]) for g in gpu
                       if a <= launch.get(g["args"].get("correlation"), -1) < b]) for a, b in windows]
    assert [round(ms, 1) for ms in busy] == [72.4, 71.3, 71.7, 71.5]

    result = diagnose([str(path)], report=False)
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["cpu_step_us"] / 1000.0 for s in steps] == pytest.approx([(b - a) / 1000.0 for a, b in windows],
                                                                       abs=0.001)
    assert [s["busy_us"] / 1000.0 for s in steps] == pytest.approx(busy, abs=0.01)
    source = result.attribution["step_source"]
    assert "'Optimizer.step#SGD.step'" in source and "4 iterations between the 5 repeats" in source
    assert not any("no repeating annotation" in w or "nor a repeating annotation" in w for w in result.warnings)
    assert not any("outside every ProfilerStep" in w for w in result.warnings)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1000.0


def test_old_kernels_without_a_stream_arg_are_read_on_their_row(tmp_path):
    """PyTorch 1.9 wrote some GPU work with only a "stream 7" row and a correlation (the
    TensorBoard plugin's own test traces): read on stream 7, linked to its launch."""
    events = [{"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{k}", "pid": 13721, "tid": "123",
               "ts": 1000.0 * k, "dur": 900.0, "args": {"External id": k}} for k in range(1, 3)]
    for k in range(1, 3):
        events.append({"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 13721, "tid": "123",
                       "ts": 1000.0 * k + 10, "dur": 5.0, "args": {"correlation": k, "external id": k}})
        events.append({"ph": "X", "cat": "Kernel", "name": "void gemmSN_TN_kernel_64addr", "pid": 0,
                       "tid": "stream 7", "ts": 1000.0 * k + 20, "dur": 300.0,
                       "args": {"correlation": k, "external id": k, "device": 0}})
    path = tmp_path / "worker0.json"
    path.write_text(json.dumps(events))
    result = diagnose([str(path)], report=False)
    steps = result.ranks[0].steps
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["busy_us"] for s in steps] == [300.0, 300.0]
    assert steps[0]["step_time_us"] == 1000.0
