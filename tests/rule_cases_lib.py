"""Shared by the rule tests: the sample traces, the rule case files, and one cached diagnosis
per trace."""

from __future__ import annotations

import functools
from pathlib import Path

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.base.config import tomllib

from conftest import REAL_TRACES, SAMPLES

CASES = Path(__file__).parent / "rule_cases"


def sample_traces() -> dict[str, list[str]]:
    """'synthetic/NAME', 'cpu_gloo/NAME', 'gpu_h200/NAME', 'real/NAME' -> the trace files of that job."""
    traces = {}
    for kind in ("synthetic", "cpu_gloo", "gpu_h200"):
        for job in sorted((SAMPLES / kind).iterdir()):
            files = sorted(str(p) for p in job.glob("rank-*.json*"))
            if files:
                traces[f"{kind}/{job.name}"] = files
    if REAL_TRACES.is_dir():
        for job in sorted(REAL_TRACES.iterdir()):
            files = sorted(str(p) for p in job.glob("*.json*"))
            if files:
                traces[f"real/{job.name}"] = files
    return traces


def load_cases() -> dict[str, dict]:
    return {p.stem: tomllib.loads(p.read_text("utf-8")) for p in sorted(CASES.glob("*.toml"))}


@functools.lru_cache(maxsize=None)
def diagnosed(trace: str):
    return diagnose(sample_traces()[trace], DiagnoseOptions(workers=1))
