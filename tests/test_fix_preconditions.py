"""Fixes that agree with the evidence (issue 37 item 5): each fix a rule suggests declares what
must be true of the job for it to apply (analyzer.job.facts.FIX_PRECONDITIONS), checked before it
is printed. Run over every sample, shared (real) and world trace: no fix is printed against its own
precondition, checked two ways: the declared preconditions of each printed fix hold, and the words
of what is printed agree with the job read directly from the result (no bf16 hook when the gradient
collectives already travel in 16 bits, no DataLoader advice where the loader is not where the idle
goes, no FSDP advice on a DDP job nor DDP advice on an FSDP one, no training advice on inference).
Then generated jobs whose truth is known: the same comm-bound job with bf16 and with fp32 gradients.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.api import DiagnoseOptions, diagnose, load_run
from analyzer.job.facts import FIX_PRECONDITIONS, JobFacts
from analyzer.reports.evidence import withheld_fixes
from analyzer.reports.html import HtmlRenderer
from analyzer.reports.text import TextRenderer
from analyzer.rules.engine import all_rules
from analyzer.synth import SCENARIOS, write_job
from builders import TraceBuilder
from conftest import REPO
from rule_cases_lib import diagnosed, sample_traces

WORLD = Path(os.environ.get("TRACECLIFF_WORLD_TRACES", REPO.parent / "shared" / "traces" / "world"))
SIXTEEN_BITS = {"bf16", "f16", "fp16", "bfloat16", "float16"}


def world_traces() -> dict[str, list[str]]:
    if not WORLD.is_dir():
        return {}
    return {f"world/{job.name}": sorted(str(p) for p in job.glob("*.json*"))
            for job in sorted(WORLD.iterdir()) if job.is_dir()}


def traces() -> dict[str, list[str]]:
    return {**sample_traces(), **world_traces()}


def result_of(name: str):
    if name.startswith("world/"):
        return diagnose(world_traces()[name], DiagnoseOptions(workers=1))
    return diagnosed(name)


def gradient_dtypes(result) -> set[str]:
    """The recorded dtypes of the gradient collectives, read from the rows themselves."""
    return {str(c["dtype"]) for c in result.collectives
            if c["collective"] in ("allreduce", "reduce_scatter") and c.get("phase") == "backward"
            and c.get("dtype") is not None and ((c.get("group") or {}).get("size") or 2) >= 2}


def loader_leads_somewhere(result) -> bool:
    """Whether the data loader is the largest host activity of some rank's typical-step idle."""
    for rank in result.ranks:
        by_host = ((rank.time_breakdown or {}).get("details") or {}).get("idle_by_host") or {}
        if by_host and by_host.get("input", 0.0) > 0 and by_host["input"] == max(by_host.values()):
            return True
    return False


def printed(finding) -> str:
    return " ".join([finding["fix"]["text"], finding["fix"]["snippet"] or ""])


def test_every_rule_declares_its_fixes_preconditions():
    for name, rule in all_rules().items():
        assert "fix_requires" in vars(rule), name
        assert set(rule.fix_requires) <= set(FIX_PRECONDITIONS), name


@pytest.mark.parametrize("name", sorted(traces()))
def test_no_fix_is_printed_against_its_precondition(name):
    result = result_of(name)
    facts = JobFacts(result)
    strategy = facts.strategy
    for finding in result.findings:
        if finding["title"].startswith("rule "):
            continue  # a rule that failed: its own finding, no advice
        record = finding["evidence"]["fix_preconditions"]
        assert record, finding["rule"]
        text = printed(finding)
        for fix in record:
            assert set(fix["requires"]) <= set(FIX_PRECONDITIONS)
            if fix["printed"]:  # each declared precondition holds, and the text is the fix's
                assert not fix["failed"] and all(facts.fix_precondition(n) is None for n in fix["requires"])
                assert fix["fix"][1:] in finding["fix"]["text"], finding["rule"]
            else:
                assert fix["failed"] and fix["fix"][1:] not in finding["fix"]["text"]
        # the words agree with the job, read from the result (not through the preconditions)
        if "bf16_compress_hook" in text or "bf16 gradients" in text or "reduce_dtype" in text:
            assert not gradient_dtypes(result) <= SIXTEEN_BITS, (finding["rule"], gradient_dtypes(result))
        if "num_workers" in text or "more DataLoader workers" in text:
            assert loader_leads_somewhere(result), finding["rule"]
        if any(w in text for w in ("fully_shard", "reshard_after_forward", "MixedPrecisionPolicy", "backward_prefetch")):
            assert strategy.startswith("fsdp"), (finding["rule"], strategy)
        if "HYBRID_SHARD" in text and not strategy.startswith("fsdp"):  # a strategy change, projected for this job
            assert "the best fix the what-if projects" in text, finding["rule"]
        if "bucket_cap_mb" in text or "register_comm_hook" in text:
            assert not strategy.startswith("fsdp") or finding["rule"] == "fsdp-where-ddp-fits", finding["rule"]
        if facts.kind == "inference":
            for word in ("gradient", "optimizer", "backward", "micro-batch", "checkpointing", "no_sync"):
                assert word not in text, (finding["rule"], word)


@pytest.fixture(scope="module")
def comm_bound(tmp_path_factory):
    """The comm-bound job (2 nodes x 4 GPUs, one NIC per node) with its gradients all-reduced in
    bf16 (the generator's default: its truth's spec says so) and the same job in fp32."""
    root = tmp_path_factory.mktemp("preconditions")
    base = replace(SCENARIOS["ddp_comm_bound"], n_layers=2, steps=4)
    return {dtype: write_job(replace(base, name=dtype, grad_dtype=dtype, param_dtype=dtype), root / dtype)
            for dtype in ("bf16", "fp32")}


def test_no_bf16_hook_when_the_gradients_already_travel_in_bf16(comm_bound):
    result = load_run([str(comm_bound["bf16"])], no_cache=True)
    assert json.loads((comm_bound["bf16"] / "truth.json").read_text())["spec"]["grad_dtype"] == "bf16"
    (finding,) = [f for f in result.findings if f["rule"] == "comm-bound-step"]
    assert "bf16" not in printed(finding) and "comm_hook" not in printed(finding)
    assert finding["fix"]["text"].startswith("One NIC per GPU (4 per node, measured 1), the best fix the what-if")
    assert "add compute per step" in finding["fix"]["text"]
    withheld = [f for f in finding["evidence"]["fix_preconditions"] if "gradients_wide" in f["failed"]]
    assert withheld and all("already travel in bf16" in f["failed"]["gradients_wide"] for f in withheld)
    assert {f["rule"] for f in result.findings}.isdisjoint({"fp32-gradient-comm"})  # TC103 agrees
    # the text and the HTML say which fix the evidence rules out, and why, in the same words
    (line,) = withheld_fixes(finding)
    assert line == ("not suggested: reduce the bytes per step: bf16 gradients (a DDP comm hook) (the gradient "
                    "collectives already travel in bf16 (320))")
    assert line in " ".join(TextRenderer().render(result).split())
    assert line in HtmlRenderer().render(result)


def test_the_bf16_hook_where_the_gradients_travel_in_fp32(comm_bound):
    result = load_run([str(comm_bound["fp32"])], no_cache=True)
    (finding,) = [f for f in result.findings if f["rule"] == "comm-bound-step"]
    assert "bf16_compress_hook" in finding["fix"]["snippet"] and "bf16 gradients" in finding["fix"]["text"]
    assert "HYBRID_SHARD" not in finding["fix"]["text"]  # a DDP job


def _host_bound(tmp_path, training: bool):
    """A step whose GPU idles 1 ms while the host does its own work outside the phases; with an
    optimizer step in the trace (training) or without one (inference)."""
    b = TraceBuilder(world_size=1, pg_ranks=(0,))
    b.cpu("ProfilerStep#1", 0.0, 2000.0, cat="user_annotation")
    b.cpu("cudaEventRecord", 1.0, 1.0, cat="cuda_runtime")
    b.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 100, "ts": 1.0})
    if training:
        b.cpu("Optimizer.step#AdamW.step", 1900.0, 50.0)
    for start, launch in ((100.0, 50.0), (1200.0, 1195.0)):  # the model's own op launching each GEMM
        b.cpu("aten::mm", launch - 1.0, 3.0, **{"Input Dims": [[1024, 1024], [1024, 1024]]})
        b.kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", start, 100.0, launch_ts=launch)
    path = b.write(tmp_path / ("train" if training else "infer") / "rank-0.json")
    result = diagnose([str(path)], report=False)
    return JobFacts(result).kind, next(f for f in result.findings if f["rule"] == "gpu-idle-host-bound")


def test_no_training_advice_on_an_inference_trace(tmp_path):
    """No backward and no optimizer step: inference; the host's own work is not 'logging,
    checkpointing, metrics or evaluation in the step' there, only in training."""
    (tmp_path / "train").mkdir()
    (tmp_path / "infer").mkdir()
    kind, finding = _host_bound(tmp_path, training=False)
    assert kind == "inference"
    assert "checkpointing" not in finding["fix"]["text"] and "logging" not in finding["fix"]["text"]
    assert "CUDA graphs" in finding["fix"]["text"]
    assert not [f for f in finding["evidence"]["fix_preconditions"] if f["printed"] and "training" in f["requires"]]
    kind, finding = _host_bound(tmp_path, training=True)
    assert kind == "training"
    assert "checkpointing" in finding["fix"]["text"] or "fused" in finding["fix"]["text"]
