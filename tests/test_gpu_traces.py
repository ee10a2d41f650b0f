"""Real H200 traces (torch 2.11 + CUDA 13, sample_traces/gpu_h200): parsed, and the GPU
breakdown agrees with HTA run live with the settings of ../shared/traces/real/README.md."""

import gzip
import json
import os
from pathlib import Path

import pytest

from analyzer.api import diagnose
from analyzer.ingest.loader import load_rank_trace
from analyzer.rank.timeline import breakdown

GPU_TRACES = Path(__file__).resolve().parent.parent / "sample_traces" / "gpu_h200"
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def without_unlaunched_gpu_work(source: Path, target: Path) -> float:
    """Copy of a trace without the GPU events whose CPU launch is not in it (HTA drops them);
    returns their total duration (µs)."""
    doc = json.loads(gzip.open(source).read())
    launched = {e["args"]["correlation"] for e in doc["traceEvents"]
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kept, dropped = [], 0.0
    for e in doc["traceEvents"]:
        if e.get("cat") in GPU_CATEGORIES and e.get("args", {}).get("correlation") not in launched:
            dropped += e["dur"]
            continue
        kept.append(e)
    doc["traceEvents"] = kept
    target.write_text(json.dumps(doc))
    return dropped


@pytest.mark.skipif(os.environ.get("TRACECLIFF_SKIP_HTA") == "1", reason="HTA oracle disabled")
@pytest.mark.parametrize("job, unlaunched", [("ddp", 14), ("fsdp2", 0)])
def test_breakdown_agrees_with_hta(tmp_path, monkeypatch, job, unlaunched):
    hta = pytest.importorskip("hta.trace_analysis")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    path = GPU_TRACES / job / "rank-0.pt.trace.json.gz"
    analysis = hta.TraceAnalysis(trace_files={0: str(path)}, trace_dir="", include_last_profiler_step=True)
    temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]

    filtered = tmp_path / "rank-0.json"
    dropped_us = without_unlaunched_gpu_work(path, filtered)
    same_events = breakdown(load_rank_trace(filtered).gpu)
    assert same_events["compute_us"] == pytest.approx(float(temporal["compute_time(us)"]), rel=0.001)
    assert same_events["idle_us"] == pytest.approx(float(temporal["idle_time(us)"]), rel=0.001)
    assert same_events["span_us"] == pytest.approx(float(temporal["kernel_time(us)"]), rel=0.001)

    whole = breakdown(load_rank_trace(path).gpu)  # tracecliff keeps the unlaunched work
    assert whole["busy_us"] - same_events["busy_us"] == pytest.approx(dropped_us, abs=0.01)
    assert (dropped_us > 0) == (unlaunched > 0)


def test_jobs_facts_and_findings():
    for job, strategy in (("ddp", "ddp"), ("fsdp2", "fsdp2")):
        result = diagnose([str(GPU_TRACES / job)])
        doc = result.to_dict()
        assert doc["job"]["strategy"] == strategy
        assert doc["job"]["gpu"] == "NVIDIA H200" and doc["job"]["nccl_version"] == "2.28.9"
        assert doc["hardware"]["gpu_profile"]["value"] == "h200-sxm-141gb"
        rank = doc["ranks"][0]
        assert [s["step"] for s in rank["steps"]] == [3, 4, 5]
        assert rank["comm_us"] == 0 and any("no communication kernels" in w for w in doc["warnings"])
        # launch-bound: HTA puts idle at 60.75 % (ddp) and 70.06 % (fsdp2) of the GPU span
        assert [f["rule"] for f in doc["findings"]] == ["gpu-idle-host-bound"]
    ddp = diagnose([str(GPU_TRACES / "ddp")]).to_dict()
    assert any("14 GPU event(s) (674.5 µs busy) ran outside every ProfilerStep" in w for w in ddp["warnings"])
