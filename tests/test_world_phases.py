"""Phases on a 2021 trace (PyTorch <= 1.9: autograd's nodes by bare name, 'AddmmBackward',
'torch::autograd::AccumulateGrad', on the autograd engine's own thread, no evaluate_function
range): world/kineto_tb_resnet50_num_workers_0 (issue 37 item 8). Worked out by hand from the
raw JSON: a kernel is backward when its launch (the Runtime call of its correlation id) ran on
the thread of those nodes; its step is the ProfilerStep range its launch falls in; each step's
backward compute is the union of those kernels."""

import gzip
import json
import re

import pytest

from analyzer.api import diagnose
from conftest import WORLD_TRACES

TRACE = WORLD_TRACES / "kineto_tb_resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
NODE = re.compile(r"^[A-Za-z_][\w:]*Backward\d*$|^torch::autograd::AccumulateGrad$")


def _union(spans) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@pytest.fixture(scope="module")
def by_hand(world_traces):
    events = [e for e in json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    autograd = {e["tid"] for e in events if e["cat"] == "Operator" and NODE.match(e["name"])}
    launch = {e["args"]["correlation"]: e for e in events if e["cat"] == "Runtime" and "correlation" in e["args"]}
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("ProfilerStep#")}
    backward: dict[int, list] = {n: [] for n in steps}
    for k in (e for e in events if e["cat"] == "Kernel"):
        call = launch.get(k["args"].get("correlation"))
        if call is None or call["tid"] not in autograd:
            continue
        for n, (lo, hi) in steps.items():
            if lo <= call["ts"] <= hi:
                backward[n].append((k["ts"], k["ts"] + k["dur"]))
    return autograd, {n: _union(spans) for n, spans in backward.items()}


def test_the_backward_of_a_2021_trace_is_backward(by_hand):
    autograd, backward = by_hand
    assert len(autograd) == 1  # one autograd thread (the device's), beside the main thread
    result = diagnose([str(TRACE)])
    (rank,) = result.ranks
    got = {s["step"]: s["phase_windows"].get("backward", {}).get("compute_us", 0.0) for s in rank.steps}
    assert sorted(got) == sorted(backward)
    for step, us in backward.items():
        assert us > 0
        assert got[step] == pytest.approx(us, abs=0.01), step
    assert result.job["workload"] == "training"
