"""Self-contained HTML diagnosis report: one file, no network, deterministic bytes.

``HtmlRenderer().render(result)`` turns a diagnosed Result into a page: its figures from the job
model (analyzer.job.model), the drawn sections (timeline, collectives, scaling curve) from its
document. Every section says "not available: <why>" when its data is absent, and a section whose
data cannot be read says so in place instead of taking the page down. Charts are inline SVG drawn here (printable, no
script needed); the timeline's kernel names travel once in a JSON block (``|tojson``) that a small
inline script reads for the hover tooltip. The templates run with autoescape on, so no trace string
(kernel, host, path, group, finding text) can open a tag or a script.
"""

from __future__ import annotations

import base64
import hashlib
import math
from functools import lru_cache
from typing import Any, Callable

from markupsafe import Markup

from analyzer.base.config import SEVERITY_ORDER
from analyzer.base.units import fmt_bytes, fmt_flops, fmt_num, fmt_pct, fmt_tflops, fmt_us, fmt_value, shape_text
from analyzer.base.numbers import sourced, sourced_figure
from analyzer.job.model import HOST_ACTIVITY, WAITED_ON, JobModel, leaf_names, wait_words
from analyzer.reports import evidence as structured
from analyzer.reports.prediction import prediction_view
from analyzer.reports.templating import TEMPLATES, environment
from analyzer.job.result import STATUS_WORDS, _clean, result_to_dict, straggler_ranks, unavailable

BAR_SEGMENTS = (("compute_only", "compute only"), ("overlapped", "overlapped comm"),
                ("exposed", "exposed comm"), ("other", "other GPU (memcpy, sync)"), ("idle", "idle"))
# The typical step's leaves (analyzer.job.attribution): they add up to the step time.
LEAF_SEGMENTS = (("compute_only", "compute only"), ("wait", "waiting for late peers"),
                 ("transfer", "exposed transfer"), ("other", "other GPU (memcpy, sync)"), ("idle", "idle"))
OPEN_GROUPS = 2


class HtmlRenderer:
    name = "html"

    def __init__(self, timestamp: str | None = None) -> None:
        self.timestamp = timestamp  # shown only when asked for: the bytes stay deterministic

    def render(self, result: Any) -> str:
        view = build_view(result)
        script = (TEMPLATES / "report.js").read_text(encoding="utf-8")
        # The page's policy allows exactly this script (by hash): nothing injected could run.
        view.update(timestamp=self.timestamp, script=Markup(script), script_hash=_sha256_source(script))
        return _environment().get_template("report.html.j2").render(**view)


class SummaryHtmlRenderer:
    """The report's summary as an HTML fragment (Jupyter's inline view of a Result): the same
    verdict, headline numbers and findings as the page, none of its scripts or charts."""

    name = "summary-html"

    def render(self, result: Any) -> str:
        doc, model = _document(result), result.model
        job = doc.get("job") or {}
        facts = (f"{len(doc.get('ranks') or [])} of {job.get('world_size') or len(doc.get('ranks') or [])} "
                 f"rank(s), {job['workload'] + ', ' if job.get('workload') else ''}"
                 f"{job.get('strategy') or 'unknown strategy'}")
        return _environment().get_template("summary.html.j2").render(
            summary=_guarded(_summary, doc, model), findings=_guarded(_findings, doc, model), facts=facts,
            warnings=len(doc.get("warnings") or []))


def _sha256_source(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


@lru_cache(maxsize=1)
def _environment():
    return environment({"us": fmt_us, "size": fmt_bytes, "pct": fmt_pct, "num": fmt_num, "value": fmt_value},
                       compact_json=True)


# ----------------------------------------------------------------------------- view model
def _document(result: Any) -> dict[str, Any]:
    """The Result's document as the sections read it (the DDP buckets are never drawn: left as
    they are, no dict per bucket; NaN as None)."""
    return _clean(result_to_dict(result, plain=False))


def build_view(result: Any) -> dict[str, Any]:
    doc, model = _document(result), result.model
    summary = _guarded(_summary, doc, model)
    view = {"tool": doc.get("tool") or {}, "summary": summary}
    for key, builder in SECTIONS:
        view[key] = _guarded(builder, doc, model)
    return view


Builder = Callable[[dict[str, Any], JobModel], dict[str, Any]]


def _guarded(builder: Builder, doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    # A section whose data cannot be read must not take the whole report down.
    try:
        return builder(doc, model)
    except Exception as exc:  # noqa: BLE001 - reported on the page, in that section
        return unavailable(f"could not read this section's data ({type(exc).__name__}: {exc})")


def _summary(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    job, ranks = doc.get("job") or {}, doc.get("ranks") or []
    step_numbers = sorted({s.get("step") for r in ranks for s in r.get("steps") or [] if isinstance(s, dict)},
                          key=lambda n: (n is None, n))
    headline = []
    gpu_seen = model.whole_trace is not None  # a rank with GPU activity
    if ranks and not gpu_seen:
        headline.append({"label": "GPU time", "value": "–",
                         "note": f"not available: no GPU activity in the traces ({_no_gpu_why(model)})"})
    if gpu_seen:
        typical = model.typical
        if typical is not None:  # the one definition of each figure (analyzer.job.model)
            step_time, idle, exposed = typical.step_time_us, typical.leaves.idle_us, typical.leaves.exposed_us
            exposed_share, idle_share, overlap = typical.exposed_share, typical.idle_share, model.overlap_share
            label, step_note = "step time", f"typical step {typical.step}, mean over ranks"
            overlap_note = f"communication hidden under compute in typical step {typical.step}"
            exposed_split, idle_split = _leaf_notes(typical)
        elif model.whole_trace is not None:  # no typical step: the whole trace, labelled as such
            whole = model.whole_trace
            step_time, exposed, idle = whole.span_us, whole.exposed_us, whole.idle_us
            exposed_share, idle_share, overlap = whole.exposed_share, whole.idle_share, whole.overlap_share
            label = "GPU span (no typical step)"
            step_note = f"whole trace, mean over {whole.ranks} rank(s)"
            overlap_note = "communication hidden under compute, whole trace"
            exposed_split = idle_split = ""
        headline += [
            {"label": label, "value": fmt_us(step_time), "note": step_note},
            {"label": "exposed communication", "value": fmt_us(exposed),
             "note": f"{_pct_of(exposed_share)} of the step{exposed_split}"},
            {"label": "overlap", "value": _pct_of(overlap), "note": overlap_note},
            {"label": "GPU idle", "value": fmt_us(idle),
             "note": f"{_pct_of(idle_share)} of the step{idle_split}"},
        ]
    headline += _mfu_cards(doc.get("mfu"), model)
    return {
        "available": True,
        "verdict": _verdict_text(doc.get("verdict")) or _fallback_verdict(doc, model),
        "verdict_from_rules": bool(_verdict_text(doc.get("verdict"))),
        "facts": _facts(doc, job, ranks, step_numbers, model),
        "headline": headline,
        "hardware": _hardware_rows(doc.get("hardware")),
        "warnings": [str(w) for w in doc.get("warnings") or []][:50],
        "warnings_more": max(len(doc.get("warnings") or []) - 50, 0),
        "inputs": [str(i.get("path")) for i in doc.get("inputs") or [] if isinstance(i, dict)][:64],
    }


def _pct_of(share: float | None) -> str:
    return fmt_pct(None if share is None else 100 * share)


def _hardware_rows(hardware: Any) -> list[dict[str, str]]:
    """Each hardware value with where it came from (measured from the trace, profile, assumed),
    headed by its declared label (analyzer.rules.evidence_fields), its value in its unit; the
    key stays as the heading's tooltip."""
    if not isinstance(hardware, dict):
        return []
    rows = []
    for key, item in sorted(hardware.items()):
        if isinstance(item, dict) and "value" in item:
            rows.append({"key": key, "label": structured.label(key),
                         "value": structured.fmt_field(item["value"], structured.unit_of(key)),
                         "origin": str(item.get("origin") or ""),
                         "source": str(item.get("source") or "")})
        elif not isinstance(item, (dict, list)):
            rows.append({"key": key, "label": structured.label(key),
                         "value": structured.fmt_field(item, structured.unit_of(key)),
                         "origin": "", "source": ""})
    return rows


def _verdict_text(verdict: Any) -> str | None:
    if isinstance(verdict, str):
        return verdict or None
    if isinstance(verdict, dict):
        for key in ("text", "sentence", "summary", "verdict"):
            if isinstance(verdict.get(key), str) and verdict[key]:
                return verdict[key]
    return None


def _fallback_verdict(doc: dict[str, Any], model: JobModel) -> str:
    if not doc.get("ranks"):
        return "No ranks analysed."
    typical, whole = model.typical, model.whole_trace
    if typical is not None:
        return (f"No diagnosis rules ran on this report; measured: {_pct_of(typical.exposed_share)} of the typical "
                f"step is exposed communication ({fmt_us(typical.leaves.exposed_us)} of {fmt_us(typical.step_time_us)}).")
    if whole is not None:
        return (f"No diagnosis rules ran on this report; measured: {_pct_of(whole.exposed_share)} of the GPU span "
                f"is exposed communication ({fmt_us(whole.exposed_us)} of {fmt_us(whole.span_us)}, whole trace, "
                "mean over ranks).")
    return "No diagnosis rules ran on this report; no GPU activity in the traces."


def _facts(doc, job, ranks, step_numbers, model: JobModel) -> list[dict[str, str]]:
    hosts = job.get("hosts") or (doc.get("topology") or {}).get("hosts") or []
    world = job.get("world_size")
    given = job.get("ranks_given", len(ranks))
    facts = [("ranks", f"{given} of {world}" if world else str(given)),
             ("nodes", str(len(hosts)) + (" (" + ", ".join(map(str, hosts[:8])) + (" …" if len(hosts) > 8 else "") + ")"
                                          if hosts else "") if hosts else "unknown (no host names)"),
             ("GPU", _gpu_text(doc, job)),
             ("workload", model.workload_text),
             ("strategy detected", str(job.get("strategy") or "unknown")),
             ("steps", (f"{len(step_numbers)} (" + _number_list(step_numbers) + ")") if step_numbers else "none marked"),
             ("backend", str(job.get("backend") or "unknown")),
             ("NCCL", str(job.get("nccl_version") or "unknown"))]
    torch_version = job.get("pytorch_version") or job.get("torch_version")
    if torch_version:
        facts.append(("PyTorch", str(torch_version)))
    return [{"label": k, "value": v} for k, v in facts]


def _gpu_text(doc, job) -> str:
    gpu = job.get("gpu")
    hardware = doc.get("hardware")
    if not gpu and isinstance(hardware, dict):
        gpu = sourced(hardware.get("gpu_name") or hardware.get("gpu"))
    if not gpu:
        unread = any((r.get("markers_seen") or {}).get("unread_device_events") for r in doc.get("ranks") or [])
        return f"none seen ({'device-looking events under unknown categories not read' if unread else 'CPU-only trace'})"
    mem = job.get("gpu_mem_bytes")
    smallest = "smallest " if str(gpu).startswith("mixed:") else ""  # the job's gpu_mem_bytes then
    return f"{gpu}" + (f", {smallest}{mem / 2**30:.0f} GiB" if isinstance(mem, (int, float)) and mem else "")


def _number_list(numbers: list[Any]) -> str:
    shown = ", ".join(str(n) for n in numbers[:10])
    return shown + (" …" if len(numbers) > 10 else "")


def _mfu_cards(mfu: Any, model: JobModel) -> list[dict[str, str]]:
    """MFU from recorded shapes when the trace gives it (no flags needed), and the
    model-parameter MFU when it was asked for: each card says what it counts."""
    compute, cards = model.compute, []
    if compute is not None and compute.mfu is not None:
        cards.append({"label": "MFU", "value": fmt_pct(100 * compute.mfu),
                      "note": f"FLOPs from recorded shapes (typical step) at the {compute.dtype or '?'} peak "
                              f"over the step time; compute-only MFU {fmt_pct(100 * (compute.compute_mfu or 0))}"})
    params = mfu.get("mfu_mean") if isinstance(mfu, dict) else None
    if params is not None or not cards:
        value, note = _mfu_text(mfu)
        if compute is not None and compute.counted and compute.mfu is None and params is None:
            note = (f"{fmt_flops(compute.flops_per_step)} per rank per step from recorded shapes, but no GPU "
                    "kernels were linked to the ops: no throughput")
        cards.append({"label": "model-parameter MFU" if cards else "MFU", "value": value, "note": note})
    return cards


def _mfu_text(mfu: Any) -> tuple[str, str]:
    if isinstance(mfu, (int, float)) and not isinstance(mfu, bool):
        return fmt_pct(100 * mfu), "model FLOPs utilisation"  # a fraction, always (analyzer.job.schema.Mfu)
    if isinstance(mfu, dict):
        value = sourced_figure(mfu.get("mfu_mean", mfu.get("mfu")))
        if value is None:
            return "–", "not available: " + str(mfu.get("note") or mfu.get("why") or "no FLOP count")
        return fmt_pct(100 * value), "6Ψ per token, mean over steps; source: " + str(mfu.get("source") or "job analysis")
    return "–", "not available: no FLOP count (pass --model-params and --tokens-per-step)"


def _leaf_notes(typical: Any) -> tuple[str, str]:
    """The typical step's finer leaves for the headline: the waiting/transfer split of the
    exposed communication and what the host did during most of the idle."""
    exposed = (f": {wait_words(typical.wait_source)} {fmt_us(typical.leaves.exposed_wait_us)}, transfer "
               f"{fmt_us(typical.leaves.exposed_transfer_us)}")
    details = typical.details
    host = details.idle_by_host
    busiest = max(host, key=lambda k: (host[k], k)) if host else None
    queued = details.idle_queued_us or 0.0
    waited = details.idle_queued_by
    lead = max(waited, key=lambda k: (waited[k], k)) if waited else None
    parts = []
    if busiest and host[busiest] > 0:
        activity = HOST_ACTIVITY.get(busiest, busiest.replace("_", " "))  # the findings' words
        parts.append(f"most while the host is in: {activity} ({fmt_us(host[busiest])})")
    if lead and queued >= 0.05 * (typical.leaves.idle_us or 1.0):
        parts.append(f"{fmt_us(queued)} with work launched and waiting, most on {WAITED_ON.get(lead, lead)} "
                     f"({fmt_us(waited[lead])})")
    return exposed, "; " + "; ".join(parts) if parts else ""


# ----------------------------------------------------------------------------- per-rank bars
def _no_gpu_why(model: JobModel) -> str:
    """Why a job has no GPU figures: a CPU-only profile, or device work under unknown categories."""
    if model.unread_device_events:
        return "device-looking events under unknown categories not read: see warnings"
    return "CPU-only profile"


def _rank_bars(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    ranks = doc.get("ranks") or []
    if not ranks:
        return unavailable("no ranks in the document")
    if model.whole_trace is None:
        return unavailable(f"no GPU activity in the traces ({_no_gpu_why(model)}): nothing to break down")
    stragglers = straggler_ranks(doc)
    if model.typical is not None and any(r.typical for r in model.ranks):
        return _leaf_bars(model, stragglers)
    rows = []
    for r in model.ranks:  # no typical step: each rank's whole trace (the model's WholeTrace figures)
        parts = {
            "compute_only": r.compute_only_us,
            "overlapped": r.overlap_us,
            "exposed": r.exposed_comm_us,
            "other": r.other_gpu_us,
            "idle": r.idle_us,
        }
        rows.append({"rank": r.rank, "host": r.host, "parts": parts, "total": sum(parts.values()),
                     "pcts": {key: r.span_pct(us) or 0.0 for key, us in parts.items()},
                     "straggler": stragglers.get(r.rank)})
    return {"available": True, **_bar_geometry(rows),
            "per": "whole trace (no typical step)",
            "stragglers": stragglers, "legend": [{"key": k, "label": v} for k, v in BAR_SEGMENTS]}


def _leaf_bars(model: JobModel, stragglers: dict[Any, str]) -> dict[str, Any]:
    """Each rank's typical step, leaf by leaf (ranks without a breakdown are left out)."""
    rows = []
    for r in model.ranks:
        leaves = r.typical
        if leaves is None:
            continue
        parts = {"compute_only": leaves.compute_only_us, "wait": leaves.exposed_wait_us,
                 "transfer": leaves.exposed_transfer_us, "other": leaves.other_gpu_us, "idle": leaves.idle_us}
        rows.append({"rank": r.rank, "host": r.host, "parts": parts, "total": sum(parts.values()),
                     "pcts": {key: leaves.pct(us) or 0.0 for key, us in parts.items()},
                     "straggler": stragglers.get(r.rank)})
    step = model.typical.step if model.typical else None
    return {"available": True, **_bar_geometry(rows, LEAF_SEGMENTS),
            "per": f"typical step {step}, each rank's own time of it: the leaves add up to its step time",
            "stragglers": stragglers,
            "legend": [{"key": k, "label": v} for k, v in LEAF_SEGMENTS]}


def _bar_geometry(rows: list[dict[str, Any]], kinds=BAR_SEGMENTS) -> dict[str, Any]:
    label_w, plot_w, row_h = 150, 960, 18
    scale = plot_w / max(max(r["total"] for r in rows), 1e-9)
    for i, row in enumerate(rows):
        x, segments = label_w, []
        for key, label in kinds:
            width = row["parts"][key] * scale
            segments.append({"key": key, "label": label, "x": round(x, 2), "w": round(width, 2),
                             "us": row["parts"][key],
                             "pct": row["pcts"][key]})  # of the rank's step or GPU span (the model's)
            x += width
        row.update(y=22 + i * row_h, segments=segments, end_x=round(x, 2))
    return {"rows": rows, "width": label_w + plot_w + 130, "height": 30 + len(rows) * row_h,
            "label_w": label_w, "row_h": row_h, "ticks": _linear_ticks(max(r["total"] for r in rows), scale, label_w)}


def _linear_ticks(top: float, scale: float, x0: float) -> list[dict[str, Any]]:
    if top <= 0:
        return []
    raw = top / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [{"x": round(x0 + v * scale, 2), "label": fmt_us(v)} for v in _frange(0, top, step)]


def _frange(lo: float, hi: float, step: float) -> list[float]:
    count = int(math.floor((hi - lo) / step + 1e-9)) + 1
    return [lo + i * step for i in range(count)]


# ----------------------------------------------------------------------------- timeline
def _timeline(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    data = doc.get("timeline")
    if not isinstance(data, dict):
        return unavailable("kernel-level data was not kept for this report (render with "
                           "`tracecliff diagnose --format html`, which keeps it)")
    if not data.get("available"):
        return unavailable(str(data.get("why") or "no timeline data"))
    label_w, plot_w, lane_h, head_h = 190, int(data.get("plot_width_px") or 1000), 16, 30
    span = float(data["span_us"]) or 1e-3
    scale = plot_w / span
    y, groups, merged_lanes = 26, [], 0
    for rank in data["ranks"]:
        group = {"rank": rank["rank"], "host": rank.get("host"), "role": rank["role"], "y": y,
                 "step_time_us": rank.get("step_time_us"), "lanes_dropped": rank.get("lanes_dropped", 0),
                 "phases": [{"phase": p["phase"], "x": round(label_w + p["s"] * scale, 2),
                             "w": round(max((p["e"] - p["s"]) * scale, 1), 2)} for p in rank["phases"]]}
        y += head_h
        lane_rows = []
        for lane in rank["lanes"]:
            merged_lanes += lane.get("merge_px", 1) > 1 or any(m["c"] > 1 for m in lane["marks"])
            lane_rows.append({"label": f"stream {lane['stream']} · {lane['kind']}", "y": y, "kind": lane["kind"],
                              "kernels": lane["kernels"], "marks": [_mark(m, label_w, scale) for m in lane["marks"]]})
            y += lane_h
        group["lanes"] = lane_rows
        group["exposed"] = [{"x": round(label_w + s * scale, 2), "w": round(max((e - s) * scale, 0.5), 2)}
                            for s, e in rank["exposed"]]
        group["body_y"], group["body_h"] = group["y"] + head_h, y - group["y"] - head_h
        groups.append(group)
        y += 10
    step = data.get("step")
    role = model.step_role(step) if step is not None else None
    return {"available": True, "step": step, "role": role, "note": data.get("note"), "groups": groups,
            "names": data.get("names") or [], "width": label_w + plot_w + 10, "height": y + 4,
            "label_w": label_w, "lane_h": lane_h, "span_us": span,
            "ticks": _linear_ticks(span, scale, label_w), "downsampled": merged_lanes > 0,
            "steps_available": data.get("steps_available") or []}


def _mark(m: dict[str, Any], x0: float, scale: float) -> dict[str, Any]:
    return {"x": round(x0 + m["s"] * scale, 2), "w": round(max((m["e"] - m["s"]) * scale, 0.6), 2),
            "k": m["k"], "n": m["n"], "d": m["d"], "c": m["c"]}


# ----------------------------------------------------------------------------- findings
def _findings(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    findings = doc.get("findings") or []
    if not findings and "rules" not in doc and "verdict" not in doc:
        return unavailable("the diagnosis rules did not run on this document")
    cards = [_card(f, model) for f in findings if isinstance(f, dict)]
    cards.sort(key=lambda c: (c["gain_us"] is None, -(c["gain_us"] or 0.0),
                              SEVERITY_ORDER.get(c["severity"], 3), c["rule"]))
    statuses = [{"rule": str(r.get("rule")), "status": str(r.get("status") or ""),
                 "reason": fmt_value(r.get("reason")) if r.get("reason") else ""}
                for r in doc.get("rules") or [] if isinstance(r, dict)]
    joint = doc.get("recoverable") if isinstance(doc.get("recoverable"), dict) else None
    counts = [(words, sum(r["status"] == status for r in statuses)) for status, words in STATUS_WORDS.items()]
    tally = ", ".join(f"{n} {words}" for words, n in counts if n)
    for r in statuses:
        r["status"] = STATUS_WORDS.get(r["status"], r["status"])
    return {"available": True, "cards": cards, "rules": statuses, "rules_tally": tally,
            "joint": _joint(joint, model)}


def _joint(joint: dict[str, Any] | None, model: JobModel) -> dict[str, Any] | None:
    """What the findings recover together (the verdict's figure), and the time they share."""
    if not joint or len(joint.get("findings") or []) < 2:
        return None
    shared = [f"{c.rule}: {fmt_us(c.shared_total_us)} of " + " and ".join(leaf_names(c.shared_us)) + " already counted"
              for c in model.joint_claims if c.shared_us]  # each finding's shared total: the model's
    return {"joint_us": joint["joint_us"], "sum_us": joint["sum_us"], "bound_us": joint["lost_bound_us"],
            "source": joint.get("source"),
            "pct": model.step_pct(joint["joint_us"]), "shared": shared}


MODEL_ANCHORS = (("bucket", "model-buckets"), ("comm-bound", "model-buckets"), ("overlap", "model-buckets"),
                 ("fullshard", "model-volume"), ("hsdp", "model-volume"), ("where-ddp", "model-volume"),
                 ("fp32", "model-volume"), ("fsdp", "model-fsdp"), ("straggler", "model-alpha-beta"),
                 ("mfu", "model-mfu"), ("latency", "model-alpha-beta"), ("cross-node", "model-cross-node"))


def _card(f: dict[str, Any], model: JobModel) -> dict[str, Any]:
    rule = str(f.get("rule") or "?")
    gain = f.get("estimated_gain_us")
    gain = float(gain) if isinstance(gain, (int, float)) and not isinstance(gain, bool) else None
    fix_text, fix_snippet = _fix_parts(f.get("fix"))
    anchor = next((a for key, a in MODEL_ANCHORS if key in rule.lower()), "models")
    return {
        "rule": rule, "code": str(f.get("code") or ""), "severity": str(f.get("severity") or "info"),
        "title": str(f.get("title") or rule), "summary": str(f.get("summary") or ""),
        "ranks": _short_list(f.get("ranks")), "steps": _short_list(f.get("steps")),
        "evidence": structured.evidence_rows(f), "model": _model_text(f.get("model")),
        "prediction": prediction_view((f.get("evidence") or {}).get("prediction")
                                      if isinstance(f.get("evidence"), dict) else None, model.step_time_us),
        "recovers": " and ".join(leaf_names(f.get("recovers"))) if gain else "",
        "fix_text": fix_text, "fix_snippet": fix_snippet, "withheld": structured.withheld_fixes(f), "gain_us": gain,
        "gain_pct": model.step_pct(gain),
        "references": [fmt_value(r) for r in f.get("references") or []] if isinstance(f.get("references"), list)
        else ([str(f["references"])] if f.get("references") else []),
        "anchor": anchor,
    }


def _short_list(values: Any) -> str:
    if not isinstance(values, list) or not values:
        return ""
    return ", ".join(str(v) for v in values[:16]) + (f" … ({len(values)} in all)" if len(values) > 16 else "")


def _model_text(model: Any) -> str:
    if isinstance(model, str):
        return model
    if isinstance(model, dict):
        return "\n".join(f"{k}: {fmt_value(v, 1000)}" for k, v in sorted(model.items(), key=lambda kv: str(kv[0])))
    if isinstance(model, list):
        return "\n".join(fmt_value(v, 1000) for v in model)
    return ""


def _fix_parts(fix: Any) -> tuple[str, str]:
    if isinstance(fix, str):
        return fix, ""
    if isinstance(fix, dict):
        text = next((str(fix[k]) for k in ("text", "summary", "description") if fix.get(k)), "")
        snippet = next((fix[k] for k in ("snippet", "config", "code") if fix.get(k)), "")
        return text, snippet if isinstance(snippet, str) else fmt_value(snippet, 2000)
    return "", ""


# ----------------------------------------------------------------------------- collectives
def _collectives(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    # every row's figures, from the digest (analyzer.job.digest): a saved large result has only
    # its most exposed rows in the document
    digest = model.digest["groups"]
    if not digest:
        return unavailable("no collective operations in the traces")
    fits = {str(g.get("name")): g for g in doc.get("groups") or [] if isinstance(g, dict)}
    groups = [_group_view(entry, fits.get(entry["name"]), model.group(entry["name"]), model.size_edges,
                          model.scatter_frames[entry["name"]], model.group_totals[entry["name"]]) for entry in digest]
    # Many groups (HSDP, TP x DP) would bury the page: the ones with the most exposed time open.
    ranked = sorted(groups, key=lambda g: (-g["exposed_us"], -g["total_us"], _natural(g["name"])))
    for g in groups:
        g["open"] = g in ranked[:OPEN_GROUPS]
    return {"available": True, "groups": groups, "fits_available": bool(fits), "open_count": OPEN_GROUPS,
            "why_no_fits": "" if fits else "α/β fits per group are not in this document (job analyses did not run)"}


def _collective_steps(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    """The collectives' totals cover every step of the trace: which steps the time breakdown
    leaves out, said beside them."""
    excluded = ", ".join(f"step {e.step} {e.role}" for e in model.typical.excluded) if model.typical else ""
    them = "them" if "," in excluded else "it"
    return {"available": True, "note": "every step of the trace" + (
        f", {excluded} included (the time breakdown leaves {them} out)" if excluded else "")}


def _natural(name: str) -> tuple[int, Any]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _group_view(entry: dict[str, Any], fit: dict[str, Any] | None, facts: Any, edges: tuple[float, ...],
                frame: dict[str, Any] | None, totals: tuple[float, float]) -> dict[str, Any]:
    """One group's section; ``facts``: its GroupFacts (the job model's bus bandwidth and its
    share of β), if known; ``edges``: the digest's size buckets; ``frame``: its scatter's axes
    and α-β line (the job model's scatter_frames); ``totals``: its time and exposed time (the job
    model's group_totals)."""
    group = entry["group"]
    size = (fit or {}).get("size") or group.get("size")
    lines = [_bucket_line(line, facts, edges) for line in entry["lines"]]
    total_us, exposed_us = totals
    return {"name": entry["name"], "description": str((fit or {}).get("description") or group.get("description") or ""),
            "size": size, "ranks": _short_list((fit or {}).get("ranks") or group.get("ranks")),
            "fit": _fit_view(fit), "table": lines, "scatter": _scatter(entry["scatter"], frame), "count": entry["count"],
            "total_us": total_us, "exposed_us": exposed_us,
            "on_gpu": entry["on_gpu"],
            "busbw": None if facts is None or facts.busbw is None else
            {"gbps": facts.busbw.gbps, "basis": facts.busbw.basis, "label": facts.label}}


def _fit_view(fit: dict[str, Any] | None) -> dict[str, Any] | None:
    if not fit:
        return None
    return {"alpha_us": sourced_figure(fit.get("alpha_us")), "beta_gbps": sourced_figure(fit.get("beta_gbps")),
            "s_star_bytes": sourced_figure(fit.get("s_star_bytes")), "how": fmt_value(fit.get("fit") or "unknown"),
            "source": str(fit.get("fit_source") or ""),
            "nodes": fit.get("nodes"), "cross_node": fit.get("cross_node"),
            "role": str(fit.get("role") or "")}


def _bucket_label(index: int, edges: tuple[float, ...]) -> str:
    if index > len(edges):
        return "size unknown"
    lo = edges[index - 1] if index else 0
    if index == len(edges):
        return f"≥ {fmt_bytes(lo)}"
    return f"{fmt_bytes(lo)} – {fmt_bytes(edges[index])}" if index else f"< {fmt_bytes(edges[0])}"


def _bucket_line(line: list[Any], facts: Any, edges: tuple[float, ...]) -> dict[str, Any]:
    # each row's busbw comes from the job analysis (analyzer.job.commfit), its share of the
    # group's β from the job model (GroupFacts.beta_pct); none is computed here
    kind, bucket, count, total, exposed, wait, bounds, mid = line
    return {"collective": kind, "bucket": _bucket_label(bucket, edges), "count": count, "total_us": total,
            "exposed_us": exposed, "wait_us": wait, "bound": ", ".join(bounds),
            "busbw_gbps": mid, "beta_pct": None if facts is None else facts.beta_pct(mid)}


def _scatter(data: dict[str, Any], frame: dict[str, Any] | None) -> dict[str, Any]:
    """Collectives in the coordinates of the group's α-β fit (analyzer.job.commfit): bytes per ring
    step x = S·busbw_factor/hops (S/N on a ring) against time per step y = transfer time/hops,
    so every kind of collective lies on the one line y = α + x/β, and S* = α·β is a point on x.
    The points (thinned to the page's budget) come from the digest, the axes' decades, the
    line's points and S* from its frame (analyzer.job.digest.scatter_frame): drawn here only."""
    points = data["points"]
    if frame is None:
        return unavailable("fewer than two collectives with a known size, kind and group size")
    w, h, left, bottom, right = 640, 300, 64, 36, 34
    xlo, xhi = frame["x_decades"]
    ylo, yhi = frame["y_decades"]
    fx = lambda v: left + (math.log10(v) - xlo) / (xhi - xlo) * (w - left - right)  # noqa: E731
    fy = lambda v: h - bottom - (math.log10(v) - ylo) / (yhi - ylo) * (h - bottom - 10)  # noqa: E731
    kinds = sorted({p[2] for p in points})
    view = {"available": True, "w": w, "h": h, "left": left, "plot_right": w - right, "plot_bottom": h - bottom,
            "shown": len(points), "total": data["total"], "kinds": kinds,
            "points": [{"x": round(fx(p[0]), 1), "y": round(fy(p[1]), 1), "k": kinds.index(p[2]), "tip": _hop_tip(p)}
                       for p in points],
            "xticks": [{"x": round(fx(10 ** e), 1), "label": fmt_bytes(10 ** e)} for e in range(xlo, xhi + 1)],
            "yticks": [{"y": round(fy(10 ** e), 1), "label": fmt_us(10 ** e)} for e in range(ylo, yhi + 1)],
            "line": None, "s_star": None}
    if frame["line"] is not None:
        view["line"] = " ".join(f"{fx(size):.1f},{fy(t):.1f}" for size, t in frame["line"])
        s_star = frame["s_star"]
        if s_star and 10 ** xlo <= s_star <= 10 ** xhi:
            view["s_star"] = {"x": round(fx(s_star), 1), "label": f"S* = {fmt_bytes(s_star)}"}
    return view


def _hop_tip(point: list[Any]) -> str:
    x, y, kind, size, transfer, steps, n, wait = point
    return (f"{kind} of {fmt_bytes(size)} on {n} ranks: transfer {fmt_us(transfer)}"
            + (f" (+{fmt_us(wait)} waiting)" if wait else "")
            + f" = {steps} step(s) of {fmt_bytes(x)} in {fmt_us(y)}")


# ----------------------------------------------------------------------------- scaling what-if
def _scaling(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    data = doc.get("scaling")
    if not isinstance(data, dict):
        return unavailable("no what-if projection in this document (the what-if model did not run)")
    if data.get("available") is False:
        return unavailable(str(data.get("why") or "what-if projection failed"))
    series = [s for s in data.get("series") or [] if isinstance(s, dict) and s.get("points")]
    if not series:
        return unavailable("the what-if projection returned no points")
    w, h, left, bottom, right = 780, 300, 56, 40, 260
    gpus = sorted({int(p["gpus"]) for s in series for p in s["points"]})
    lo, hi = math.log2(min(gpus)), math.log2(max(gpus))
    hi = hi if hi > lo else lo + 1
    top = max(1.0, max(float(p["efficiency"]) for s in series for p in s["points"])) * 1.05
    fx = lambda g: left + (math.log2(g) - lo) / (hi - lo) * (w - left - right)  # noqa: E731
    fy = lambda e: h - bottom - e / top * (h - bottom - 12)  # noqa: E731
    out = []
    for i, s in enumerate(series):
        pts = sorted((int(p["gpus"]), float(p["efficiency"]), p.get("step_time_us")) for p in s["points"])
        out.append({"label": str(s.get("label") or f"series {i + 1}"), "kind": str(s.get("kind") or "projection"),
                    "index": i, "path": " ".join(f"{fx(g):.1f},{fy(e):.1f}" for g, e, _ in pts),
                    "points": [{"x": round(fx(g), 1), "y": round(fy(e), 1),
                                "tip": f"{g} GPUs: efficiency {100 * e:.0f}%" + (f", step {fmt_us(t)}" if t else "")}
                               for g, e, t in pts],
                    "legend_y": 20 + 18 * i})
    return {"available": True, "w": w, "h": h, "left": left, "plot_right": w - right, "plot_bottom": h - bottom,
            "series": out, "xticks": [{"x": round(fx(g), 1), "label": str(g)} for g in gpus],
            "yticks": [{"y": round(fy(e), 1), "label": f"{100 * e:.0f}%"} for e in _frange(0, top, 0.25)],
            "assumptions": structured.rows(data.get("assumptions") or {}),
            "note": str(data.get("note") or "")}


# ----------------------------------------------------------------------------- models appendix
def _appendix(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    """The worked examples of docs/models.md, computed by analyzer.model.formulas (so they agree
    with it) and handed over by the job model."""
    return {"available": True, **model.worked_examples}


# ----------------------------------------------------------------------------- HTA deep dive
def _deep_dive(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    data = doc.get("hta")
    if not isinstance(data, dict):
        return {"available": False, "requested": False,
                "why": "not requested (run with --hta; needs the optional `hta` extra)"}
    if data.get("available") is False:
        return {"available": False, "requested": True, "why": str(data.get("why") or "HTA failed")}
    idle = [{k: r.get(k) for k in ("rank", "stream", "host_wait_us", "kernel_wait_us", "other_wait_us")}
            for r in data.get("idle") or [] if isinstance(r, dict)]
    # One row per rank, one column per kernel type: readable at 64 ranks.
    by_rank: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in data.get("kernel_types") or []:
        if isinstance(r, dict):
            by_rank.setdefault(r.get("rank"), {})[str(r.get("kernel_type"))] = {
                "us": r.get("sum_us"), "pct": r.get("percentage")}
    types = sorted({t for cells in by_rank.values() for t in cells})
    kinds = [{"rank": rank, "cells": [by_rank[rank].get(t, {"us": None, "pct": None}) for t in types]}
             for rank in sorted(by_rank, key=str)]
    return {"available": True, "requested": True, "source": str(data.get("source") or "HolisticTraceAnalysis"),
            "seconds": sourced_figure(data.get("seconds")), "idle": idle, "kernel_types": kinds, "types": types,
            "all_ranks": [{k: r.get(k) for k in ("kernel_type", "sum_us", "percentage")}
                          for r in data.get("all_ranks_kernel_types") or [] if isinstance(r, dict)],
            "notes": [str(n) for n in data.get("notes") or []]}


def _compute(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    """The typical step's achieved TFLOP/s per op family, per GEMM size and per shape, each
    against the peak of its dtype (analyzer.job.compute); bars are % of peak."""
    compute = model.compute
    if compute is None or not compute.counted:
        why = "; ".join(compute.unknown_reasons) if compute is not None else ""
        return unavailable("no op with recorded shapes gives FLOPs (" + (why or "profile with record_shapes=True")
                           + "; counted: matrix multiplies, attention, convolution)")
    section = (doc.get("mfu") or {}).get("from_shapes") or {}

    def row(label: str, figures: Any) -> dict[str, Any]:
        pct = figures.pct_of_peak
        ops = int(figures.ops) if float(figures.ops).is_integer() else round(figures.ops, 1)
        return {"label": label, "flops": fmt_flops(figures.flops), "ops": fmt_num(ops),
                "gpu": fmt_us(figures.gpu_us) if figures.gpu_us else "–", "tflops": fmt_tflops(figures.tflops_per_s),
                "pct": fmt_pct(pct), "bar": round(min(max(pct or 0.0, 0.0), 100.0), 1)}
    families = [row(name, f) for name, f in compute.families.items() if f.flops or f.gpu_us]
    sizes = [row(bucket, f) for bucket, f in compute.buckets("gemm")]
    shapes = []
    for s in (compute.ranks[0].shapes if compute.ranks else ())[:12]:
        shapes.append({"op": s.op, "family": s.family, "dtype": s.dtype or "?", "shape": shape_text(s.dims),
                       "count": fmt_num(s.count), "gpu": fmt_us(s.gpu_us), "tflops": fmt_tflops(s.tflops_per_s),
                       "pct": fmt_pct(s.pct_of_peak),
                       "bar": round(min(max(s.pct_of_peak or 0.0, 0.0), 100.0), 1)})
    return {"available": True, "step": compute.step, "step_source": section.get("step_source") or "",
            "ranks": len(compute.ranks), "flops": fmt_flops(compute.flops_per_step),
            "mfu": fmt_pct(100 * compute.mfu) if compute.mfu is not None else "–",
            "compute_mfu": fmt_pct(100 * compute.compute_mfu) if compute.compute_mfu is not None else "–",
            "peak": fmt_tflops(compute.peak_tflops), "dtype": compute.dtype or "?", "timed": compute.timed,
            "unknown": fmt_us(compute.unknown_gpu_us) if compute.unknown_gpu_us else None,
            "families": families, "sizes": sizes if len(sizes) > 1 else [], "shapes": shapes,
            "shapes_rank": compute.ranks[0].rank if compute.ranks else None, "source": compute.source}


MEMORY_CHART = {"w": 720, "h": 150, "left": 64, "right": 12, "top": 10, "bottom": 22}
PHASE_CLASSES = {"forward": "ph-fwd", "backward": "ph-bwd", "optimizer": "ph-opt"}


def _memory(doc: dict[str, Any], model: JobModel) -> dict[str, Any]:
    """The ``memory`` section drawn: allocated and reserved over the drawn step per rank (the
    fullest ranks the job analysis kept a series of), phases shaded, the peak marked, the
    device's limit drawn (absolute figures only); the table of every rank's figures."""
    memory = doc.get("memory") or {}
    if not memory.get("recorded"):
        return unavailable(str(memory.get("why") or "no allocator events: profile with profile_memory=True"))
    step = memory.get("drawn_step")
    charts, rows = [], []
    for m in memory["ranks"]:
        s = next((s for s in m["steps"] if s["step"] == step), None)
        if s is None:
            continue
        at = s.get("peak_at") or {}
        rows.append({"rank": m["rank"], "device": m["device"], "peak": fmt_bytes(s["peak_allocated_bytes"]),
                     "reserved": fmt_bytes(s["peak_reserved_bytes"]) if s.get("peak_reserved_bytes") is not None else "–",
                     "start": fmt_bytes(s["start_allocated_bytes"]), "end": fmt_bytes(s["end_allocated_bytes"]),
                     "headroom": fmt_bytes(s["headroom_bytes"]) if s.get("headroom_bytes") is not None else "–",
                     "where": f"{at.get('phase')} +{fmt_us(at.get('offset_us'))}" if at else "–",
                     "op": at.get("op") or at.get("fsdp_unit") or ""})
        if s.get("series"):
            charts.append(_memory_chart(m, s))
    return {"available": True, "step": step, "relative": bool(memory.get("relative")),
            "bases": sorted({m["basis"] for m in memory["ranks"] if m["relative"]}),
            "peak": fmt_bytes(memory.get("peak_allocated_bytes")),
            "peak_reserved": fmt_bytes(memory["peak_reserved_bytes"]) if memory.get("peak_reserved_bytes") else None,
            "device": fmt_bytes(memory["device_bytes"]) if memory.get("device_bytes") else None,
            "rows": rows, "charts": charts, "geometry": MEMORY_CHART}


def _memory_chart(rank: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    g = MEMORY_CHART
    series = step["series"]
    xs, alloc, reserved = series["offset_us"], series["allocated_bytes"], series["reserved_bytes"]
    device = None if rank["relative"] else rank.get("device_bytes")
    top = max([v for v in alloc + (reserved or []) if v is not None] + [device or 0, 1])
    span = max(xs[-1] if xs else 1.0, 1.0)
    width, height = g["w"] - g["left"] - g["right"], g["h"] - g["top"] - g["bottom"]

    def x(value: float) -> float:
        return round(g["left"] + width * value / span, 1)

    def y(value: float) -> float:
        return round(g["top"] + height * (1 - value / top), 1)

    def path(values: list[Any]) -> str:
        return " ".join(f"{x(t)},{y(v)}" for t, v in zip(xs, values) if v is not None)
    bands, begin = [], 0
    phases = series["phase"]
    for k in range(1, len(phases) + 1):  # contiguous runs of one phase, shaded
        if k == len(phases) or phases[k] != phases[begin]:
            if phases[begin] in PHASE_CLASSES:
                bands.append({"x": x(xs[begin]), "w": max(round(x(xs[k - 1]) - x(xs[begin]), 1), 1.0),
                              "cls": PHASE_CLASSES[phases[begin]], "label": phases[begin]})
            begin = k
    peak = max(range(len(alloc)), key=lambda k: (alloc[k] or 0, -k)) if alloc else None
    return {"rank": rank["rank"], "device": rank["device"], "alloc": path(alloc),
            "reserved": path(reserved) if reserved else None, "bands": bands,
            "peak": None if peak is None else {"x": x(xs[peak]), "y": y(alloc[peak] or 0),
                                                "tip": f"peak {fmt_bytes(alloc[peak])} at +{fmt_us(xs[peak])}"},
            "limit": None if device is None else {"y": y(device), "label": f"device {fmt_bytes(device)}"},
            "top": fmt_bytes(top), "span": fmt_us(span)}


SECTIONS: tuple[tuple[str, Builder], ...] = (
    ("compute", _compute), ("memory", _memory), ("bars", _rank_bars), ("timeline", _timeline), ("findings", _findings), ("collectives", _collectives),
    ("collective_steps", _collective_steps),
    ("scaling", _scaling), ("appendix", _appendix), ("deep_dive", _deep_dive),
)
