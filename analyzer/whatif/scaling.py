"""The scaling what-if curve of the report: the projected weak-scaling efficiency of the job as
configured and with its top finding's fix, at 1/2x..8x the measured GPU count."""

from __future__ import annotations

import dataclasses
from typing import Any

from analyzer.whatif import projection as whatif
from analyzer.whatif.prediction import whatif_doc


def scaling_data(result: Any) -> dict[str, Any]:
    """Weak-scaling efficiency (the typical step ÷ the projected step, the typical step + the change
    ``tracecliff whatif --gpus N`` prints, so the measured point is 100%) at 1/2×..8× the measured GPU count: as configured, and with the top finding's fix when the
    what-if model can express it."""
    measured_gpus = int(result.job.get("world_size") or len(result.ranks))
    measured = whatif.Measured.of(result)  # the measured schedules, shared by every projection of it
    own_size = whatif.Scenario(gpus=measured_gpus)
    try:  # the projection onto the job's own size: when even that cannot run, say why once
        at_own_size = whatif.project(result, own_size, measured)
    except Exception as exc:  # noqa: BLE001 - reported in the section
        return {"available": False, "why": f"the what-if model cannot project this trace: {exc}"}
    counts = sorted({max(measured_gpus // 2, 1), measured_gpus, 2 * measured_gpus, 4 * measured_gpus,
                     8 * measured_gpus})
    fix_label, fix = _fix_scenario(result)
    series, notes, assumptions = [], [], {}
    as_configured = f"projection: {result.job.get('strategy') or 'job'} as configured"
    for label, kind, changes in ((as_configured, "projection", {}), (fix_label, "fix", fix)):
        if changes is None:
            continue
        points = []
        for gpus in counts:
            scenario = whatif.Scenario(gpus=gpus, **changes)
            try:
                projection = at_own_size if scenario == own_size \
                    else whatif.project(result, scenario, measured)
            except Exception as exc:  # noqa: BLE001 - an unsupported point is skipped, and said
                notes.append(f"{label} at {gpus} GPUs: {exc}")
                continue
            # on the report's scale, as `tracecliff whatif --gpus N` prints it (whatif_doc)
            try:
                projected = whatif_doc(result, scenario, projection, at_own_size)["projected"]
            except Exception as exc:  # noqa: BLE001 - no typical step: the point is skipped, and said
                notes.append(f"{label} at {gpus} GPUs: {exc}")
                continue
            if projected.get("scaling_efficiency") is not None:
                points.append({"gpus": gpus, "efficiency": projected["scaling_efficiency"],
                               "step_time_us": projected.get("step_time_us")})
            if not changes and gpus == measured_gpus:
                assumptions = {k: (v.get("value") if isinstance(v, dict) and "value" in v else v)
                               for k, v in projection.assumptions.items()}
        if points:
            series.append({"label": label, "kind": kind, "points": points})
    if not series:
        return {"available": False, "why": "; ".join(notes[:3]) or "the what-if model gave no projection"}
    series.insert(0, {"label": f"measured ({measured_gpus} GPUs)", "kind": "measured",
                      "points": [{"gpus": measured_gpus, "efficiency": 1.0}]})
    return {"available": True, "series": series, "assumptions": assumptions,
            "note": " ".join(notes[:6])}


def _fix_scenario(result: Any) -> tuple[str, dict[str, Any] | None]:
    """The what-if form of the largest-gain finding whose fix the model can express."""
    for finding in result.findings:
        evidence = finding.get("evidence") if isinstance(finding.get("evidence"), dict) else {}
        cap = evidence.get("suggested_bucket_cap_mb")
        if isinstance(cap, (int, float)) and cap > 0:
            return f"with fix: bucket_cap_mb={cap:g}", {"bucket_mb": float(cap)}
        if finding.get("rule") == "fsdp-fullshard-cross-node":
            return "with fix: HYBRID_SHARD", {"strategy": "hsdp"}
        # any other fix the what-if projected for the finding (analyzer.whatif.prediction)
        changes = (evidence.get("prediction") or {}).get("changes") if isinstance(evidence.get("prediction"), dict) else None
        if isinstance(changes, dict) and changes and not {"gpus", "nodes"} & set(changes):
            fields = {f.name for f in dataclasses.fields(whatif.Scenario)}
            if set(changes) <= fields:
                return "with fix: " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in changes.items()), dict(changes)
    return "", None
