"""Optional deep dive computed by Holistic Trace Analysis (HTA) itself, for the HTML report.

tracecliff does not re-implement these analyses: it calls HTA's ``get_idle_time_breakdown``
(idle time of each stream split into host wait / kernel wait / other) and
``get_gpu_kernel_breakdown`` (kernel time by type) on the same files, and only reshapes the
DataFrames HTA returns into rows. HTA is an optional extra (``pip install tracecliff[hta]``): it is
imported here, lazily, and its absence is reported as a clear "not available" line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from typing import Any, Mapping


def deep_dive(trace_files: Mapping[int, str]) -> dict[str, Any]:
    """HTA's idle-time and kernel-type breakdowns of ``{rank: path}``, with HTA's run time."""
    if not trace_files:
        return {"available": False, "why": "no trace files"}
    started = time.perf_counter()
    try:
        with _quiet(), _env("HTA_DISABLE_NS_ROUNDING", "1"):
            from hta.trace_analysis import TraceAnalysis  # optional dependency

            version = _hta_version()
            analysis = TraceAnalysis(trace_files=dict(sorted(trace_files.items())), trace_dir="",
                                     include_last_profiler_step=True)
            idle_frame, _ = analysis.get_idle_time_breakdown(ranks=sorted(trace_files), visualize=False)
            kernel_types, kernel_metrics = analysis.get_gpu_kernel_breakdown(visualize=False)
    except ImportError:
        return {"available": False,
                "why": "HTA is not installed: pip install 'tracecliff[hta]' (holistictraceanalysis)"}
    except Exception as exc:  # noqa: BLE001 - HTA's own failure: reported, never fatal to the report
        return {"available": False, "why": f"HTA failed: {type(exc).__name__}: {exc}"}
    return {
        "available": True, "source": f"HolisticTraceAnalysis {version}".strip(),
        "seconds": round(time.perf_counter() - started, 2),
        "idle": idle_rows(idle_frame), "kernel_types": kernel_type_rows(kernel_metrics),
        "all_ranks_kernel_types": [
            {"kernel_type": str(r["kernel_type"]), "sum_us": float(r["sum"]), "percentage": float(r["percentage"])}
            for r in kernel_types.to_dict("records")],
        "notes": ["HTA settings: include_last_profiler_step=True, HTA_DISABLE_NS_ROUNDING=1."],
    }


def idle_rows(frame) -> list[dict[str, Any]]:
    """HTA's long table (rank, stream, idle_category, idle_time) as one row per (rank, stream)."""
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for rec in frame.to_dict("records"):
        key = (int(rec["rank"]), int(rec["stream"]))
        row = rows.setdefault(key, {"rank": key[0], "stream": key[1], "host_wait_us": 0.0,
                                    "kernel_wait_us": 0.0, "other_wait_us": 0.0})
        column = {"host_wait": "host_wait_us", "kernel_wait": "kernel_wait_us"}.get(str(rec["idle_category"]),
                                                                                   "other_wait_us")
        row[column] += max(float(rec["idle_time"]), 0.0)  # HTA can print -0.00
    return [rows[k] for k in sorted(rows)]


def kernel_type_rows(metrics) -> list[dict[str, Any]]:
    """Per rank and kernel type, the sum of HTA's per-kernel rows (its top kernels + "others")."""
    sums: dict[tuple[int, str], float] = {}
    for rec in metrics.to_dict("records"):
        key = (int(rec["rank"]), str(rec["kernel_type"]))
        sums[key] = sums.get(key, 0.0) + float(rec["sum (us)"])
    totals: dict[int, float] = {}
    for (rank, _), value in sums.items():
        totals[rank] = totals.get(rank, 0.0) + value
    return [{"rank": rank, "kernel_type": kind, "sum_us": round(value, 3),
             "percentage": round(100 * value / totals[rank], 2) if totals[rank] else 0.0}
            for (rank, kind), value in sorted(sums.items())]


def _hta_version() -> str:
    try:
        from importlib.metadata import version
        return version("HolisticTraceAnalysis")
    except Exception:  # noqa: BLE001 - the version is decoration
        return ""


@contextlib.contextmanager
def _quiet():
    """HTA prints progress on stdout (keep stdout for the report) and pandas deprecation warnings."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
