"""What ``diagnose`` needs for the HTML report: its options, and the document sections that only
the HTML view uses (the kernel timeline, the scaling what-if curve, the optional HTA deep dive).

These sections go into a copy of the JSON document handed to the renderer; ``--format json``
output is unchanged."""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import click

from analyzer.errors import TracecliffError
from analyzer.rank_analysis import RankOptions, analyze_rank_file


def html_options(command):
    """Click decorator adding --html, --step, --hta, --timestamp; the command receives them as
    one ``html`` dict."""

    @functools.wraps(command)
    def wrapper(*args, html_file, step, hta, timestamp, **kwargs):
        return command(*args, html={"file": html_file, "step": step, "hta": hta, "timestamp": timestamp}, **kwargs)

    options = [
        click.option("--html", "html_file", type=click.Path(dir_okay=False),
                     help="Also write the self-contained HTML report to FILE (next to the chosen --format)."),
        click.option("--step", type=int, help="ProfilerStep shown in the HTML timeline (default: the median step)."),
        click.option("--hta", is_flag=True,
                     help="HTML: add HTA's idle-time and kernel-type breakdowns (needs the optional hta extra)."),
        click.option("--timestamp", is_flag=True,
                     help="HTML: print the generation time (off by default so the bytes are reproducible)."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def wants_html(fmt: str, html: dict[str, Any]) -> bool:
    return fmt == "html" or bool(html.get("file"))


def html_document(doc: dict[str, Any], result: Any, html: dict[str, Any],
                  rank_options: RankOptions | None = None) -> dict[str, Any]:
    """``doc`` plus the HTML-only sections."""
    out = dict(doc)
    out["timeline"] = report_timeline(doc, result, html.get("step"), rank_options or RankOptions())
    scaling = scaling_data(result)
    if scaling is not None:
        out["scaling"] = scaling
    if html.get("hta"):
        from analyzer.hta_deepdive import deep_dive
        out["hta"] = deep_dive({int(i["rank"]): str(i["path"]) for i in doc.get("inputs") or []})
    return out


def report_timeline(doc: dict[str, Any], result: Any, step: int | None, rank_options: RankOptions) -> dict[str, Any]:
    """The timeline section. Kernel lists of every rank would cost memory in proportion to the
    job; the step and ranks are chosen from the per-rank summaries instead, and only those ranks
    are read again, keeping just that step's kernels (unless the Result already kept them)."""
    if any(r.timeline for r in result.ranks):
        from analyzer.reports.html_timeline import timeline_data
        return timeline_data(result.ranks, doc, step)
    summaries = [{"rank": r["rank"], "steps": r.get("steps") or [], "span_us": r.get("span_us")}
                 for r in doc.get("ranks") or [] if r.get("gpu_event_count")]
    # The HTML machinery (jinja2, templates) loads only when a report is asked for.
    from analyzer.reports.html_timeline import draw_timeline, plan_timeline, unavailable
    plan = plan_timeline(summaries, doc, step)
    if plan is None:
        return unavailable("the traces hold no GPU kernels (CPU-only profile?)")
    paths = {int(i["rank"]): str(i["path"]) for i in doc.get("inputs") or []}
    missing = [rank for rank, _ in plan.ranks if rank not in paths]
    if missing:
        return unavailable(f"no input file for rank(s) {missing}")
    options = replace(rank_options, keep_timeline=True, steps=None if plan.step is None else (plan.step,))
    origin = int((doc.get("job") or {}).get("time_origin_ns") or 0)
    try:
        analyses = {rank: analyze_rank_file(paths[rank], options, origin_ns=origin) for rank, _ in plan.ranks}
    except TracecliffError as exc:  # the file changed since it was read: the rest of the page stands
        return unavailable(f"could not read the kernels again: {exc}")
    return draw_timeline(analyses, plan)


def render_html(doc: dict[str, Any], html: dict[str, Any]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if html.get("timestamp") else None
    from analyzer.reports.html import HtmlRenderer
    return HtmlRenderer(timestamp=stamp).render(doc)


def scaling_data(result: Any) -> dict[str, Any] | None:
    """Weak-scaling efficiency (measured step time ÷ projected step time, so the measured point is
    100%) at 1/2×..8× the measured GPU count: as configured, and with the top finding's fix when the
    what-if model can express it. None when the what-if model is not installed."""
    try:
        from analyzer import whatif
    except ImportError:
        return None
    measured_gpus = int(result.job.get("world_size") or len(result.ranks))
    try:  # the projection onto the job's own size: when even that cannot run, say why once
        whatif.project(result, whatif.Scenario(gpus=measured_gpus))
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
            try:
                projection = whatif.project(result, whatif.Scenario(gpus=gpus, **changes))
            except Exception as exc:  # noqa: BLE001 - an unsupported point is skipped, and said
                notes.append(f"{label} at {gpus} GPUs: {exc}")
                continue
            projected = projection.projected
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
    return "", None
