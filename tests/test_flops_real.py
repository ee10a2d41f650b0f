"""FLOPs per step of real recordings against an independent count from their raw events
(issue 29): the CPU gloo jobs (torch 2.13; sample_traces/cpu_gloo/compute covers SDPA, 4-D
matmul, baddbmm, conv1d, mv), the H200 jobs (torch 2.11, bf16 autocast), and the real GPU traces
of ../shared (older torch: shapes without Concrete Inputs, convolutions without shapes).

The counter here is written apart from analyzer.rank.flops on purpose: it reads the JSON with
``json``, builds each thread's op tree with a stack, takes the leaves of the ops it knows, finds
each kernel's op through its ``External id`` (the innermost op at its launch, then up the tree),
and has its own formulas."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from conftest import REAL_TRACES, SAMPLES

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::mv"}
ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
CONV = {"aten::convolution", "aten::_convolution", "aten::convolution_backward"}
KNOWN = MATMUL | ATTENTION | CONV


def prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def flops_of(name, args):
    """This op's FLOPs from its raw args, or None (shapes missing or not understood)."""
    dims, concrete = args.get("Input Dims"), args.get("Concrete Inputs")
    if not dims:
        return None
    if name == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * n * k
    if name == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * n * k
    if name == "aten::bmm":
        (b, m, k), (_, _, n) = dims[0], dims[1]
        return 2 * b * m * n * k
    if name == "aten::baddbmm":
        (b, m, k), (_, _, n) = dims[1], dims[2]
        return 2 * b * m * n * k
    if name == "aten::mv":
        (m, n) = dims[0]
        return 2 * m * n
    if name == "aten::linear":  # (input [..., K], weight [N, K], bias); anything else is not a linear layer
        if len(dims[1]) != 2 or dims[0][-1] != dims[1][1]:
            return None
        return 2 * prod(dims[0][:-1]) * dims[1][0] * dims[1][1]
    if name == "aten::matmul":  # only a leaf when it calls nothing recorded: not in these traces
        return None
    if name in ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention"):
        q, k = dims[0], dims[1]
        full = 4 * prod(q[:-2]) * q[-2] * k[-2] * q[-1]
        causal = concrete[4 if "for_cpu" in name else 5] == "True"
        return full // 2 if causal else full
    if name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        q, k = dims[1], dims[2]
        full = 4 * prod(q[:-2]) * q[-2] * k[-2] * q[-1]
        return 2.5 * (full / 2 if concrete[7] == "True" else full)
    if name in ("aten::convolution", "aten::_convolution"):
        if not concrete:
            return None
        x, w = dims[0], dims[1]
        stride, pad, dil = (json.loads(concrete[i]) for i in (3, 4, 5))
        out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(len(w) - 2)]
        return 2 * x[0] * prod(out) * prod(w)
    if name == "aten::convolution_backward":
        if not concrete:
            return None
        grad, w = dims[0], dims[2]
        grads = sum(word.strip() == "True" for word in concrete[10].strip("[]").split(",")[:2])
        return grads * 2 * grad[0] * prod(grad[2:]) * prod(w)
    return None


def family(name):
    return "gemm" if name in MATMUL - {"aten::mv"} else "attention" if name in ATTENTION else \
        "conv" if name in CONV else "other"


def independent_count(path: Path):
    """{step: {"flops": n, "unknown": ops, "gpu_us": {family: µs}, "unknown_gpu_us": µs}}."""
    raw = path.read_bytes()
    events = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]
    cpu = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in events
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") in ("cpu_op", "user_annotation")]
    # each thread's op tree, with a stack; ties (same µs) go to the earlier External id as the caller
    parent, by_ext = {}, {}
    threads = defaultdict(list)
    for e in cpu:
        threads[(e["pid"], e["tid"])].append(e)
        by_ext[e["args"].get("External id")] = e
    for ops in threads.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"], e["args"].get("External id", 0)))
        stack = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"]:
                stack.pop()
            parent[id(e)] = stack[-1] if stack else None
            stack.append(e)
    has_known_child = set()
    for e in cpu:
        if e["name"] in KNOWN:
            up = parent[id(e)]
            while up is not None:
                if up["name"] in KNOWN:
                    has_known_child.add(id(up))
                up = parent[id(up)]
    leaves = [e for e in cpu if e["name"] in KNOWN and id(e) not in has_known_child]

    def step_of(ts):
        return next((n for n, s, t in steps if s <= ts <= t), None)

    out = defaultdict(lambda: {"flops": 0, "unknown": 0, "gpu_us": defaultdict(float), "unknown_gpu_us": 0.0})
    flops = {}
    for e in leaves:
        counted = flops_of(e["name"], e["args"])
        flops[id(e)] = counted
        entry = out[step_of(e["ts"])]
        if counted is None:
            entry["unknown"] += 1
        else:
            entry["flops"] += counted
    leaf_ids = {id(e) for e in leaves}
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}

    def innermost(launch):
        """The CPU op a launch ran in: the one its External id names (newer Kineto), else the
        deepest op around it on its thread (older traces write the correlation id there)."""
        named = by_ext.get(launch["args"].get("External id"))
        if named is not None and (named["pid"], named["tid"]) == (launch["pid"], launch["tid"]) \
                and named["ts"] <= launch["ts"] <= named["ts"] + named["dur"]:
            return named
        around = [e for e in threads[(launch["pid"], launch["tid"])] if e["ts"] <= launch["ts"] <= e["ts"] + e["dur"]]
        return around[-1] if around else None

    for k in events:
        if k.get("cat") != "kernel" or "nccl" in k["name"].lower():
            continue
        launch = launches.get((k.get("args") or {}).get("correlation"))
        op = innermost(launch) if launch is not None else None
        while op is not None and id(op) not in leaf_ids:
            op = parent[id(op)]
        if op is None:
            continue
        entry = out[step_of(op["ts"])]
        if flops[id(op)] is None:
            entry["unknown_gpu_us"] += k["dur"]
        else:
            entry["gpu_us"][family(op["name"])] += k["dur"]
    return dict(out)


def jobs():
    found = [p for p in sorted((SAMPLES / "cpu_gloo").iterdir()) if p.is_dir()]
    found += [p for p in sorted((SAMPLES / "gpu_h200").iterdir()) if p.is_dir()]
    if REAL_TRACES.is_dir():
        found += [p for p in sorted(REAL_TRACES.iterdir()) if p.is_dir()]
    return found


@pytest.mark.parametrize("job", jobs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_flops_per_step_equal_an_independent_count(job):
    files = sorted(p for p in job.iterdir() if ".json" in p.name)
    result = diagnose([str(p) for p in files], DiagnoseOptions(workers=1))
    for path, rank in zip(files, sorted(result.ranks, key=lambda r: r.path)):
        assert Path(rank.path) == path
        truth = independent_count(path)
        steps = (rank.compute_steps or {}).get("steps") or {}
        for number, want in truth.items():
            got = steps[str(number) if number is not None else "none"]
            assert sum(row["flops"] for row in got["shapes"]) == want["flops"], (path.name, number)
            assert got["unknown"]["ops"] == want["unknown"], (path.name, number)
            assert got["unknown"]["gpu_us"] == pytest.approx(want["unknown_gpu_us"], abs=0.01)
            for fam in ("gemm", "attention", "conv", "other"):
                mine = sum(row["gpu_us"] for row in got["shapes"] if row["family"] == fam)
                assert mine == pytest.approx(want["gpu_us"].get(fam, 0.0), abs=0.01), (path.name, number, fam)
        assert set(steps) == {str(n) if n is not None else "none" for n in truth}
        if rank.compute is not None and rank.compute["step"] is not None:
            assert rank.compute["flops_per_step"] == truth[rank.compute["step"]]["flops"]


def test_the_compute_recording_covers_every_family():
    result = diagnose([str(SAMPLES / "cpu_gloo" / "compute")], DiagnoseOptions(workers=1))
    compute = result.ranks[0].compute
    assert compute["step_source"].startswith("median recorded ProfilerStep")  # CPU-only: no typical step
    assert all(compute["by_family"][f]["flops"] > 0 for f in ("gemm", "attention", "conv"))
    assert compute["unknown_ops"] == 0 and compute["mfu"] is None  # no GPU, no peak
    ops = {row["op"] for row in compute["shapes"]}
    assert {"aten::bmm", "aten::baddbmm", "aten::mv", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            "aten::convolution_backward"} <= ops
    assert "aten::matmul" not in ops and "aten::linear" not in ops and "aten::scaled_dot_product_attention" not in ops
