"""Measured memory (issue 39): the allocator's [memory] events per rank and step, checked
against figures worked out by hand from the raw JSON and against the sizes planted in a real
torch + gloo recording (sample_traces/cpu_gloo/memory_ddp, scripts/record_memory_cpu_traces.py)."""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from analyzer.ingest.loader import load_rank_trace
from analyzer.rank.memory import NOT_RECORDED, rank_memory

REPO = Path(__file__).resolve().parents[1]
MEMORY_DDP = REPO / "sample_traces" / "cpu_gloo" / "memory_ddp"
WORLD = REPO.parent / "shared" / "traces" / "world"
RESNET = WORLD / "kineto_tb_resnet50_num_workers_0"
# Kineto's 2021 category names and today's (the README: renaming them must change nothing)
TODAY = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memset": "gpu_memset",
         "Memcpy": "gpu_memcpy", "async": "ac2g"}


def _events(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as stream:
        return json.load(stream)


def _by_hand(doc: dict, device_type: int, use_totals: bool) -> dict[int, dict[str, float]]:
    """Per ProfilerStep (its CPU range), from the raw events in a plain loop: the peak, start
    and end of allocated memory (the allocator's total, or the running sum of Bytes)."""
    events = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
                   for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == device_type),
                    key=lambda e: e["ts"])
    held, series = 0, []
    for e in memory:
        held = e["args"]["Total Allocated"] if use_totals else held + e["args"]["Bytes"]
        series.append((e["ts"], held, e["args"]["Bytes"]))
    out = {}
    for start, end, number in steps:
        inside = [(ts, value, change) for ts, value, change in series if start <= ts <= end]
        before = [value for ts, value, _ in series if ts < start]
        first = (before[-1] if before else (inside[0][1] - inside[0][2] if use_totals else 0)) if series else 0
        out[number] = {"start": first, "peak": max([first] + [v for _, v, _ in inside]),
                       "end": inside[-1][1] if inside else first}
    return out


def _world(folder: Path) -> Path:
    if not folder.is_dir():
        pytest.skip(f"world traces not found at {folder}")
    return next(folder.glob("*.json*"))


def test_real_cpu_recording_gives_the_planted_sizes():
    """Each step allocates a 64 MiB buffer and frees it, and keeps 1 MiB for good: the peak is
    the buffer above what the step started with, and allocated grows by the leak each step."""
    truth = tomllib.loads((MEMORY_DDP / "truth.toml").read_text())
    for path in sorted(MEMORY_DDP.glob("rank-*.pt.trace.json.gz")):
        memory = rank_memory(load_rank_trace(path))
        assert memory["recorded"] and memory["device"] == "cpu"
        assert memory["relative"]  # the CPU allocator counts from the profiler's start
        hand = _by_hand(_events(path), device_type=0, use_totals=True)
        assert [s["step"] for s in memory["steps"]] == sorted(hand) == [2, 3, 4]
        for step in memory["steps"]:
            worked = hand[step["step"]]
            assert (step["start_allocated_bytes"], step["peak_allocated_bytes"], step["end_allocated_bytes"]) == \
                (worked["start"], worked["peak"], worked["end"])
            assert step["peak_allocated_bytes"] - step["start_allocated_bytes"] == truth["transient_bytes"]
            assert step["end_allocated_bytes"] - step["start_allocated_bytes"] >= truth["leak_bytes_per_step"]
            assert step["peak_at"]["phase"] == "other"  # allocated before the forward pass
            assert step["peak_reserved_bytes"] is None and step["headroom_bytes"] is None  # host memory
        ends = [step["end_allocated_bytes"] for step in memory["steps"]]
        assert np.diff(ends).tolist() == [truth["leak_bytes_per_step"]] * 2  # the leak, step after step


def test_world_resnet50_bytes_only_relative_peak_by_hand():
    """The 2021 trace: GPU [memory] events without a category, Bytes only. The running sum peaks
    2.79 GB above what was held when the trace started, in the trace and in every step."""
    path = _world(RESNET)
    memory = rank_memory(load_rank_trace(path))
    assert memory["device"] == "cuda:0" and memory["relative"] and memory["events"] == 8220
    assert memory["trace_peak_allocated_bytes"] == 2_791_636_480
    assert memory["device_bytes"] == 34_084_028_416  # deviceProperties[0].totalGlobalMem
    assert memory["other_devices"] == [{"device": "cpu", "events": 4618}]
    # With the 2021 names read (issue 37) the steps are found in the file as it is: the same figure.
    assert all(step["peak_allocated_bytes"] == 2_791_636_480 for step in memory["steps"])


def test_world_resnet50_per_step_with_todays_category_names(tmp_path):
    """Per step (the steps need the ProfilerStep ranges, which the 2021 names hide from a reader
    of today's: renamed here, as the world README says changes nothing): 2.79 GB in each of the
    six steps, equal to the running sum worked out by hand, and no headroom (relative)."""
    doc = _events(_world(RESNET))
    for e in doc["traceEvents"]:
        e["cat"] = TODAY.get(e.get("cat"), e.get("cat"))
    renamed = tmp_path / "worker0.json"
    renamed.write_text(json.dumps(doc))
    memory = rank_memory(load_rank_trace(renamed))
    hand = _by_hand(doc, device_type=1, use_totals=False)
    assert [s["step"] for s in memory["steps"]] == sorted(hand) == list(range(5, 11))
    for step in memory["steps"]:
        worked = hand[step["step"]]
        assert step["peak_allocated_bytes"] == worked["peak"] == 2_791_636_480
        assert (step["start_allocated_bytes"], step["end_allocated_bytes"]) == (worked["start"], worked["end"]) == (0, 0)
        assert step["headroom_bytes"] is None


def test_no_allocator_events_says_how_to_record(tmp_path):
    path = REPO / "sample_traces" / "cpu_gloo" / "ddp" / "rank-0.pt.trace.json.gz"
    memory = rank_memory(load_rank_trace(path))
    assert memory == {"recorded": False, "why": NOT_RECORDED, "steps": []}
    assert "profile_memory=True" in NOT_RECORDED


def test_parallel_loader_reads_the_same_allocator_columns():
    from analyzer.ingest.parallel import load_rank_trace_parallel
    path = sorted(MEMORY_DDP.glob("rank-*.pt.trace.json.gz"))[0]
    one, two = load_rank_trace(path), load_rank_trace_parallel(path, chunk_bytes=1 << 16)
    assert len(one.memory) == len(two.memory) > 1000
    for name in ("ts", "delta", "allocated", "device_type", "device_id"):
        np.testing.assert_array_equal(getattr(one.memory, name), getattr(two.memory, name))
    assert [one.threads[t] for t in one.memory.thread] == [two.threads[t] for t in two.memory.thread]


SYNTH = {
    "ddp": dict(strategy="ddp"),
    "fsdp2_per_layer": dict(strategy="fsdp2"),
    "fsdp1_no_wrap": dict(strategy="fsdp1", fsdp_wrap="none"),
}


@pytest.fixture(scope="module")
def synthetic_memory(tmp_path_factory):
    from analyzer.synth.job import write_job
    from analyzer.synth.spec import JobSpec
    out = {}
    for name, knobs in SYNTH.items():
        folder = write_job(JobSpec(name=name, world_size=2, gpus_per_node=2, profile_memory=True, **knobs),
                           tmp_path_factory.mktemp(name))
        out[name] = (folder, json.loads((folder / "truth.json").read_text()))
    return out


@pytest.mark.parametrize("name", sorted(SYNTH))
def test_generator_scenarios_every_figure_equals_the_truth(synthetic_memory, name):
    folder, truth = synthetic_memory[name]
    for rank_truth in truth["ranks"]:
        memory = rank_memory(load_rank_trace(folder / f"rank-{rank_truth['rank']}.json.gz"))
        assert memory["device"] == f"cuda:{rank_truth['rank'] % 2}" and not memory["relative"]
        assert memory["device_bytes"] == truth["memory"]["gpu_mem_bytes"]
        assert memory["events"] == rank_truth["memory"]["events"]
        for got, want in zip(memory["steps"], rank_truth["memory"]["steps"], strict=True):
            assert {key: got[key] for key in want} == want
            assert got["headroom_bytes"] == truth["memory"]["gpu_mem_bytes"] - want["peak_reserved_bytes"]


def test_generator_missing_wrap_policy_peak_holds_the_whole_gathered_model(synthetic_memory):
    """Without a wrap policy the one FSDP unit is the model: its peak is the sharded state, the
    saved activations and every parameter unsharded (Ψ bf16 bytes) at once; per layer the units
    of a wrapped model hold at most two layers' parameters."""
    _, truth = synthetic_memory["fsdp1_no_wrap"]
    model, memory = truth["model"], truth["ranks"][0]["memory"]
    activations = memory["activation_bytes_per_layer"] * model["n_layers"]
    for step in memory["steps"]:
        assert step["peak_allocated_bytes"] == memory["static_bytes"] + activations + model["param_bytes"]
    _, wrapped = synthetic_memory["fsdp2_per_layer"]
    for step in wrapped["ranks"][0]["memory"]["steps"]:
        assert step["peak_allocated_bytes"] < memory["static_bytes"] + activations + model["param_bytes"] / 2


# The rules whose fix changes memory (a strategy, the gathered units, the buckets).
MEMORY_FIXES = ("fsdp-fullshard-cross-node", "fsdp-where-ddp-fits", "fsdp-missing-wrap-policy", "fsdp-no-prefetch",
                "ddp-bucket-undersized", "ddp-bucket-oversized")
FIT_KEYS = {"fits", "peak_bytes", "added_bytes", "device_bytes", "margin", "how"}


def _memory_fix_samples() -> list[str]:
    from rule_cases_lib import load_cases, sample_traces
    cases, traces = load_cases(), sample_traces()
    return sorted({t for name in MEMORY_FIXES for t in cases[name]["fires_on"] if t in traces})


@pytest.mark.parametrize("trace", _memory_fix_samples())
def test_every_memory_changing_fix_on_the_samples_says_whether_it_fits(trace):
    from rule_cases_lib import diagnosed
    result = diagnosed(trace)
    for finding in result.findings:
        memory = finding["evidence"].get("memory")
        if finding["rule"] in MEMORY_FIXES:
            assert memory is not None and FIT_KEYS <= set(memory), finding["rule"]
        if memory is None:
            continue
        assert memory["fits"] in (True, False, None)
        if memory["fits"] is None:
            assert memory["why"]
        elif memory["how"] in ("measured", "modelled"):  # the samples record no memory: modelled
            assert memory["peak_bytes"] > 0 and memory["device_bytes"] > 0
            assert memory["fits"] == (memory["peak_bytes"] <= (1 - memory["margin"]) * memory["device_bytes"])


def test_a_fix_that_does_not_fit_says_so_from_the_measured_peak(tmp_path):
    """FULL_SHARD across two nodes on 20 GB GPUs, memory recorded: HYBRID_SHARD adds 16Ψ/g −
    16Ψ/N to the measured peak, past 90% of the device. The finding and the verdict say so."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.synth.job import write_job
    from analyzer.synth.spec import JobSpec
    spec = json.loads((REPO / "sample_traces" / "synthetic" / "fsdp_fullshard_2node" / "truth.json").read_text())["spec"]
    spec.update(profile_memory=True, gpu_mem_bytes=20_000_000_000)
    out = write_job(JobSpec(**spec), tmp_path / "job")
    truth = json.loads((out / "truth.json").read_text())
    result = diagnose([str(p) for p in sorted(out.glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    peak = max(s["peak_reserved_bytes"] for r in truth["ranks"] for s in r["memory"]["steps"])
    assert result.memory["peak_reserved_bytes"] == peak
    finding = next(f for f in result.findings if f["rule"] == "fsdp-fullshard-cross-node")
    memory = finding["evidence"]["memory"]
    psi = truth["model"]["params"]
    assert memory["how"] == "measured" and memory["measured_peak_bytes"] == peak
    assert memory["added_bytes"] == round(16 * psi / 8 - 16 * psi / 16)
    assert memory["peak_bytes"] == round(peak + memory["added_bytes"]) and memory["fits"] is False
    assert "does NOT fit" in finding["summary"]
    assert "would not fit the GPU's memory" in result.verdict


@pytest.fixture(scope="module")
def skewed_pair(tmp_path_factory):
    """A 2-rank DDP job and the same job with rank 1 holding 16 GiB more, memory recorded."""
    from analyzer.synth.job import write_job
    from analyzer.synth.spec import JobSpec
    out = {}
    for name, knobs in (("base", {}), ("skewed", dict(memory_skew_ranks=(1,), memory_skew_mb=16384))):
        folder = write_job(JobSpec(name=name, world_size=2, gpus_per_node=2, profile_memory=True, **knobs),
                           tmp_path_factory.mktemp(name))
        (folder / "truth.json").rename(folder / "truth.txt")  # beside the traces, not read as one
        out[name] = folder
    return out


def test_views_quote_the_one_peak(skewed_pair):
    """The text section, memory_df(), the gate's metric and the JSON give the same peak: the
    highest of any rank in any step."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.compare.metrics import run_metrics
    from analyzer.base.units import fmt_bytes
    result = diagnose([str(p) for p in sorted(skewed_pair["skewed"].glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    frame = result.memory_df()
    assert len(frame) == 2 * 3 and set(frame["device"]) == {"cuda:0", "cuda:1"}
    peak = int(frame["peak_allocated_bytes"].max())
    assert result.memory["peak_allocated_bytes"] == peak
    assert result.memory["peak_allocated_at"]["rank"] == 1
    assert run_metrics(result)["peak_allocated_bytes"].typical == peak
    from analyzer.reports import render
    text = render(result, "text")
    assert f"{fmt_bytes(peak)} allocated" in text
    doc = json.loads(render(result, "json"))
    assert doc["memory"]["ranks"][1]["steps"][0]["peak_allocated_bytes"] == peak
    html = render(result, "html")
    assert 'id="memory"' in html and fmt_bytes(peak) in html
    assert {f["rule"] for f in result.findings} == {"memory-imbalance"}


def test_gate_and_diff_compare_the_peaks(skewed_pair, tmp_path):
    from analyzer.api import DiagnoseOptions, diagnose, diff, gate
    base = diagnose([str(p) for p in sorted(skewed_pair["base"].glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    saved = tmp_path / "base.json"
    base.save(saved)
    report, _ = gate([str(skewed_pair["skewed"])], baseline=str(saved))
    checks = {c.name: c for c in report.checks if c.kind == "baseline"}
    assert checks["peak_reserved_bytes"].status == "fail" and checks["peak_allocated_bytes"].status == "fail"
    assert checks["step_time_us"].status == "pass"
    doc, _ = diff(str(saved), str(skewed_pair["skewed"]))
    rows = {row["metric"]: row for row in doc["metrics"]}
    assert rows["peak_allocated_bytes"]["verdict"] == "worse"
    assert rows["peak_allocated_bytes"]["new"] - rows["peak_allocated_bytes"]["base"] == 16384 * 2**20


@pytest.mark.parametrize("name", ["ddp", "fsdp2_per_layer"])
def test_measured_against_the_models_equals_the_generator(synthetic_memory, name):
    """Static state 16Ψ (DDP) / 16Ψ/N (FULL_SHARD) with Ψ from the measured gradient
    collectives equals the allocated memory at the step's start; the activations of the
    recorded attention shapes (L·34·s·b·h) equal the generator's."""
    from analyzer.api import DiagnoseOptions, diagnose
    folder, truth = synthetic_memory[name]
    result = diagnose([str(p) for p in sorted(folder.glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    static, activations = result.memory["models"]["static"], result.memory["models"]["activations"]
    memory = truth["ranks"][0]["memory"]
    assert static["parameters"] == truth["model"]["params"]
    assert static["modelled_bytes"] == static["measured_bytes"] == memory["static_bytes"]
    assert activations["modelled_bytes"] == memory["activation_bytes_per_layer"] * truth["model"]["n_layers"]
    assert activations["layers"] == truth["model"]["n_layers"] and activations["flash"]


def test_activation_checkpointing_detected_timed_and_its_fix_fits(tmp_path):
    """The generator's checkpointed job re-runs each layer's forward in backward: detected, the
    recompute time is what the step grows by (its forward GEMMs and attention: within 15%,
    never more), and keeping the activations is predicted at no less than the peak the job
    without checkpointing measures (within 5%)."""
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.synth.job import write_job
    from analyzer.synth.spec import JobSpec
    runs = {}
    for ck in (False, True):
        out = write_job(JobSpec(name="ck", world_size=2, gpus_per_node=2, profile_memory=True,
                                activation_checkpointing=ck), tmp_path / str(ck))
        (out / "truth.json").rename(out / "truth.txt")
        runs[ck] = diagnose([str(p) for p in sorted(out.glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    plain, checkpointed = runs[False], runs[True]
    assert plain.job["activation_checkpointing"]["detected"] is False
    found = checkpointed.job["activation_checkpointing"]
    assert found["detected"] and found["evidence"]["frames"] > 0
    grown = checkpointed.model.step_time_us - plain.model.step_time_us
    assert 0.85 * grown <= found["recompute_us"] <= grown
    finding = next(f for f in checkpointed.findings if f["rule"] == "activation-checkpointing-room")
    memory = finding["evidence"]["memory"]
    assert memory["fits"] and memory["how"] == "measured"
    assert plain.memory["peak_reserved_bytes"] <= memory["peak_bytes"] <= 1.05 * plain.memory["peak_reserved_bytes"]
    assert finding["estimated_gain_us"] == pytest.approx(found["recompute_us"], abs=0.1)


def test_real_cpu_checkpointing_is_detected(tmp_path):
    """torch.utils.checkpoint on CPU, reentrant and not: each block's two linears re-run in
    backward (8 a step for 4 blocks), and the reentrant one's CheckpointFunction frames."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.capture import profile_steps
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
                                 for _ in range(4))
    found = {}
    for mode in ("none", "reentrant", "non-reentrant"):
        with profile_steps(tmp_path / mode, wait=0, warmup=1, active=2, profile_memory=True) as prof:
            for _ in range(3):
                x = torch.randn(8, 32, requires_grad=True)
                for block in blocks:
                    x = block(x) if mode == "none" else checkpoint(block, x, use_reentrant=mode == "reentrant")
                x.sum().backward()
                prof.step()
        result = diagnose([str(p) for p in (tmp_path / mode).glob("*.json.gz")], DiagnoseOptions(workers=1))
        found[mode] = result.job["activation_checkpointing"]
    assert found["none"]["detected"] is False
    for mode in ("reentrant", "non-reentrant"):
        assert found[mode]["detected"] and found[mode]["recompute_us"] > 0
        per_step = next(iter(found[mode]["evidence"]["per_step"].values()))
        assert [s["ops"] for s in per_step.values()] == [8, 8]
    assert found["reentrant"]["evidence"]["frames"] > 0 and found["non-reentrant"]["evidence"]["frames"] == 0


def test_json_without_allocator_events_says_how_to_record():
    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.reports import render
    doc = json.loads(render(diagnose([str(p) for p in sorted((REPO / "sample_traces" / "cpu_gloo" / "ddp").glob("*.gz"))],
                                     DiagnoseOptions(workers=1)), "json"))
    assert doc["memory"] == {"recorded": False, "why": NOT_RECORDED, "ranks": []}
    assert doc["job"]["activation_checkpointing"]["detected"] is False


def test_hostile_allocator_values_are_unknown_never_a_traceback(tmp_path):
    """Text, booleans, NaN-like strings, sizes beyond any device and events without args: read
    as unknown (a Bytes-only running sum where totals are missing), one warning, no crash."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    values = [{"Bytes": 100, "Total Allocated": 100}, {"Bytes": "lots", "Total Allocated": True},
              {"Bytes": 2**70, "Total Allocated": 10**30}, {"Bytes": -50}, None, {"Bytes": 7, "Device Type": "gpu"}]
    for k, args in enumerate(values):
        event = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10 + k}
        if args is not None:
            event["args"] = args
        events.append(event)
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_rank_trace(path)
    assert any("beyond any device's memory" in w for w in trace.warnings)
    memory = rank_memory(trace)
    assert memory["recorded"] and memory["relative"]  # totals missing on some events: the running sum
    assert memory["steps"][0]["peak_allocated_bytes"] == 100  # 100, unknown, unknown, −50 (, 7 on another device)


def test_a_saved_result_gives_the_same_memory_and_report(synthetic_memory, tmp_path):
    from analyzer.api import DiagnoseOptions, diagnose, load_result
    from analyzer.reports import render
    folder, _ = synthetic_memory["fsdp1_no_wrap"]
    result = diagnose([str(p) for p in sorted(folder.glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    saved = tmp_path / "result.json"
    result.save(saved)
    again = load_result(saved)
    assert again.memory == json.loads(json.dumps(result.memory))
    assert again.job["activation_checkpointing"] == result.job["activation_checkpointing"]
    assert render(again, "text") == render(result, "text")
