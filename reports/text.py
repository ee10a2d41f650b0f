"""Terminal view: fits a 100-column terminal; verdict first, then ranks, then collectives."""

from __future__ import annotations

from typing import Any


from analyzer.base.units import fmt_bytes, fmt_flops, fmt_pct, fmt_tflops, fmt_us
from analyzer.job.model import (ESTIMATED_PEER, HOST_ACTIVITY, WAITED_ON, HostSidePer, JobModel, cached_at_peak_bytes,
                                group_label, leaf_names)
from analyzer.job.result import STATUS_WORDS, result_to_dict
from analyzer.reports.evidence import withheld_fixes
from analyzer.reports.prediction import prediction_view
from analyzer.reports.wrap import WIDTH, wrap

# The peer a wait is keyed by, in words: an α-β estimate names no rank (members' traces missing).
_PEER_WORDS = {ESTIMATED_PEER: "unseen members (beyond the link model)"}
# Whole-trace columns, for ranks without a typical step (no ProfilerStep markers).
COLUMNS = (("step time", "step_time_us"), ("compute", "compute_us"), ("comm", "comm_us"),
           ("overlapped", "overlap_us"), ("exposed", "exposed_comm_us"), ("idle", "idle_us"))
# The typical step's leaves (analyzer.job.attribution): they add up to the step time.
LEAF_COLUMNS = (("step time", "step_time_us"), ("compute only", "compute_only_us"),
                ("waiting", "exposed_wait_us"), ("transfer", "exposed_transfer_us"),
                ("other GPU", "other_gpu_us"), ("idle", "idle_us"))


class TextRenderer:
    name = "text"

    def render(self, result: Any) -> str:
        """``result``: a Result; its figures come from its job model (analyzer.job.model), the
        rest (findings, collectives, groups, warnings) from its document."""
        doc = result_to_dict(result, plain=False)  # the views never read the DDP buckets
        model = result.model
        lines: list[str] = []
        lines += _header(doc, model)
        lines += _findings(doc, model.step_time_us)
        lines += _rule_statuses(doc)
        lines += _tree(model)
        lines += _compute(doc, model)
        lines += _memory(doc)
        lines += _rank_table(doc, model)
        excluded = {e.step: e.role for e in model.typical.excluded} if model.typical else {}
        lines += _top_collectives(doc, model, excluded)
        lines += _groups(doc, model)
        lines += _stragglers(doc)
        lines += _warnings(doc)
        return "\n".join(_fitted(lines)) + "\n"


def _fitted(lines: list[str]) -> list[str]:
    """Lines no wider than the page: a longer one is wrapped at words, never cut."""
    out = []
    for line in lines:
        if len(line) <= WIDTH:
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        out += wrap(line, WIDTH, subsequent_indent=" " * (indent + 2), break_on_hyphens=False)
    return out


def _header(doc: dict[str, Any], model: JobModel) -> list[str]:
    job = doc["job"]
    parts = [f"{job['ranks_given']} rank(s)"]
    if job.get("world_size"):
        parts[0] += f" of {job['world_size']}"
    if job.get("workload"):
        parts.append(str(job["workload"]))
    parts.append(f"strategy {job['strategy']}")
    if job.get("gpu"):
        parts.append(str(job["gpu"]))
    if job.get("nccl_version"):
        parts.append(f"NCCL {job['nccl_version']}")
    lines = ["tracecliff: " + ", ".join(parts)]
    dims = job.get("parallelism") or {}
    if dims:
        lines.append("parallelism: " + ", ".join(f"{dim}={dims[dim]['size']}" for dim in sorted(dims)))
    verdict = doc.get("verdict")
    if verdict:
        lines[0:0] = wrap(verdict, WIDTH, break_on_hyphens=False)
    typical = model.typical
    headline = _compute_headline(doc, model)
    if typical is not None:
        leaves = typical.leaves
        lines.append(f"typical step {typical.step}: {fmt_us(leaves.step_time_us)} (mean over ranks); exposed "
                     f"communication {_share(leaves.exposed_us, leaves)}, GPU idle {_share(leaves.idle_us, leaves)}")
        if model.step_source:
            lines += wrap(f"steps: {model.step_source}", WIDTH, subsequent_indent="  ",
                                   break_on_hyphens=False)
        return lines + headline + [""]
    whole = model.whole_trace  # no typical step: the whole trace, labelled as such
    if whole is not None:
        lines.append(f"whole trace (no typical step), mean over {whole.ranks} rank(s): exposed communication "
                     f"{fmt_us(whole.exposed_us)} ({_pct_share(whole.exposed_share)} of the GPU span "
                     f"{fmt_us(whole.span_us)}), overlap {_pct_share(whole.overlap_share)}")
    return lines + headline + [""]


def _pct_share(share: float | None) -> str:
    return fmt_pct(None if share is None else 100 * share)


def _compute_headline(doc: dict[str, Any], model: JobModel) -> list[str]:
    """MFU from recorded shapes and the model-parameter MFU, each saying what it counts."""
    compute, mfu = model.compute, doc.get("mfu") or {}
    lines = []
    if compute is not None and not compute.counted:
        reasons = "; ".join(compute.unknown_reasons) or "no shapes recorded"
        lines.append(f"compute: FLOPs unknown ({reasons}); ops with {fmt_us(compute.unknown_gpu_us)} of GPU time "
                     "per step, MFU needs --model-params and --tokens-per-step")
    elif compute is not None:
        text = f"compute: {fmt_flops(compute.flops_per_step)} per rank per step (recorded shapes)"
        if compute.mfu is not None:
            text += (f"; MFU {fmt_pct(100 * compute.mfu)} of the step, compute-only MFU "
                     f"{fmt_pct(100 * (compute.compute_mfu or 0))} (at the {compute.dtype or '?'} peak, "
                     f"{fmt_tflops(compute.peak_tflops)})")
            if compute.unknown_gpu_us:  # those ops did work the FLOPs above leave out
                text += f", a lower bound: ops with {fmt_us(compute.unknown_gpu_us)} of GPU time give no FLOPs"
        elif not compute.timed:
            text += "; no GPU kernels linked to the ops: no throughput or MFU"
        gemm = compute.families["gemm"]
        if gemm.tflops_per_s is not None:
            text += f"; GEMMs {fmt_tflops(gemm.tflops_per_s)}" + (
                f" ({fmt_pct(gemm.pct_of_peak)} of peak)" if gemm.pct_of_peak is not None else "")
        lines.append(text)
    if mfu.get("mfu_mean") is not None:
        lines.append(f"model-parameter MFU: {fmt_pct(100 * mfu['mfu_mean'])} (6Ψ per token from --model-params and "
                     "--tokens-per-step, mean over steps; the shapes' MFU counts the FLOPs the ops did, recomputation "
                     "included)")
    return lines


def _compute(doc: dict[str, Any], model: JobModel) -> list[str]:
    """The typical step's FLOPs by op family and GEMM size: achieved TFLOP/s against the peak."""
    compute = model.compute
    if compute is None or not compute.counted:
        return []
    step = compute.step if compute.step is not None else "-"
    source = (doc.get("mfu") or {}).get("from_shapes", {}).get("step_source") or ""
    lines = [f"Compute of step {step} (FLOPs from recorded shapes, mean of {len(compute.ranks)} rank(s)"
             + (f"; {source}" if source and source != "typical step" else "") + "):",
             f"  {'family':<10} {'FLOP/step':>12} {'ops':>7} {'GPU time':>10} {'TFLOP/s':>10} {'% of peak':>10}"]
    for family, figures in compute.families.items():
        if not figures.flops and not figures.gpu_us:
            continue
        lines.append(f"  {family:<10} {fmt_flops(figures.flops):>12} {figures.ops:>7,.0f} {fmt_us(figures.gpu_us):>10} "
                     f"{_rate(figures.tflops_per_s):>10} {fmt_pct(figures.pct_of_peak):>10}")
    if compute.unknown_gpu_us:
        lines.append(f"  ops whose shapes give no FLOPs: {fmt_us(compute.unknown_gpu_us)} of GPU time "
                     "(not in the figures above)")
    sizes = [(bucket, f) for bucket, f in compute.buckets("gemm") if f.tflops_per_s is not None]
    if len(sizes) > 1:
        lines += wrap("GEMMs by FLOPs per op: " + ", ".join(
            f"{bucket} {_rate(f.tflops_per_s)} TFLOP/s ({fmt_pct(f.pct_of_peak)})" for bucket, f in sizes), WIDTH,
            initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    return lines + [""]


MEMORY_ROWS = 16  # ranks listed in the memory table (the fullest first)


def _memory(doc: dict[str, Any]) -> list[str]:
    """Measured memory (the ``memory`` section): each rank's figures in the drawn step."""
    memory = doc.get("memory") or {}
    if not memory.get("recorded"):
        return []
    step = memory.get("drawn_step")
    relative = memory.get("relative")
    typical = step is not None and step == (doc.get("attribution") or {}).get("step")
    head = (f"Memory (allocator events; step {step}{' (typical)' if typical else ''}; peak of any rank in any step: "
            f"{fmt_bytes(memory.get('peak_allocated_bytes'))} allocated"
            + (f", {fmt_bytes(memory['peak_reserved_bytes'])} reserved" if memory.get("peak_reserved_bytes") else "")
            + (f", of a {fmt_bytes(memory['device_bytes'])} GPU" if memory.get("device_bytes") and not relative else "")
            + "):")
    lines = wrap(head)
    if relative:
        lines += wrap("relative figures: " + "; ".join(sorted({m["basis"] for m in memory["ranks"] if m["relative"]})),
                       initial_indent="  ", subsequent_indent="    ")
    lines.append(f"  {'rank':>4} {'device':<7} {'peak alloc':>10} {'reserved':>10} {'start':>10} {'end':>10} "
                 f"{'cached':>9} {'headroom':>10}  peak at")
    rows = [(m, next((s for s in m["steps"] if s["step"] == step), None)) for m in memory["ranks"]]
    rows = sorted((r for r in rows if r[1]), key=lambda r: (-(r[1]["peak_allocated_bytes"] or 0), r[0]["rank"]))
    for m, s in rows[:MEMORY_ROWS]:
        cached = cached_at_peak_bytes(s)  # the memory model's figure (analyzer.job.model)
        at = s.get("peak_at") or {}
        where = f"{at.get('phase')} +{fmt_us(at.get('offset_us'))}" if at else "–"
        lines.append(f"  {m['rank']:>4} {m['device']:<7} {fmt_bytes(s['peak_allocated_bytes']):>10} "
                     f"{fmt_bytes(s.get('peak_reserved_bytes')) if s.get('peak_reserved_bytes') is not None else '–':>10} "
                     f"{fmt_bytes(s['start_allocated_bytes']):>10} {fmt_bytes(s['end_allocated_bytes']):>10} "
                     f"{fmt_bytes(cached) if cached is not None else '–':>9} "
                     f"{fmt_bytes(s['headroom_bytes']) if s.get('headroom_bytes') is not None else '–':>10}  {where}")
    if len(rows) > MEMORY_ROWS:
        lines.append(f"  ... {len(rows) - MEMORY_ROWS} more rank(s) in memory.ranks[] (JSON) and memory_df()")
    at = (rows[0][1].get("peak_at") or {}) if rows else {}
    if at.get("op") or at.get("fsdp_unit"):
        lines += wrap(f"rank {rows[0][0]['rank']}'s peak is inside {at.get('op') or ''}"
                       + (f" (FSDP unit {at['fsdp_unit']})" if at.get("fsdp_unit") else ""),
                       initial_indent="  ", subsequent_indent="    ")
    return lines + [""]


def _rate(value: Any) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _findings(doc: dict[str, Any], step_us: float | None = None) -> list[str]:
    """Each finding: severity, code, rule and gain; its summary, prediction and fix wrapped to
    the width."""
    findings = doc.get("findings") or []
    if not findings:
        return []
    lines = ["Findings (by estimated gain):"]
    for f in findings:
        gain = f.get("estimated_gain_us")
        gain_text = f"  ~{gain / 1000:,.1f} ms/step" if isinstance(gain, (int, float)) else ""
        lines.append(f"  [{f.get('severity', '?')}] {f.get('code', '')} {f.get('rule')}{gain_text}")
        layout = dict(width=WIDTH, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
        lines += wrap(f.get("summary", ""), **layout)
        recovers = leaf_names(f.get("recovers"))
        if recovers and isinstance(gain, (int, float)) and gain > 0:
            lines += wrap(f"recovers: {' and '.join(recovers)} of the typical step", **layout)
        lines += _prediction(f, step_us, layout)
        fix = (f.get("fix") or {}).get("text")
        if fix:
            lines += wrap(f"fix: {fix}", **layout)
        lines += [line for text in withheld_fixes(f) for line in wrap(text, **layout)]
    return lines + ["  (tracecliff explain RULE: what a rule checks, the model, the fix)", ""]


def _prediction(f: dict[str, Any], step_us: float | None, layout: dict[str, Any]) -> list[str]:
    """What the fix is worth: the predicted typical step, the model, its assumptions, the what-if
    command and the alternatives weighed; or why there is no gain."""
    view = prediction_view((f.get("evidence") or {}).get("prediction"), step_us)
    if view is None:
        return []
    if view["after"] is None:
        return wrap(f"no gain: {view['why']}", **layout) if view["why"] else []
    head = f"predicted: typical step {view['step']} → {view['after']}" if view["step"] else \
        f"predicted: typical step {view['after']}"
    lines = wrap(f"{head} ({view['model']})", **layout)
    if view["assumptions"]:
        lines += wrap("assumes: " + "; ".join(view["assumptions"]), **layout)
    if view["whatif"]:
        lines += wrap(f"reproduce: {view['whatif']} (prints this predicted step)", **layout)
    for a in view["alternatives"]:
        outcome = f"{a['after']} ({a['whatif']})" if a["after"] else f"not projected: {a['why']}"
        lines += wrap(f"alternative: {a['fix']}: {outcome}", **layout)
    return lines


def _rule_statuses(doc: dict[str, Any]) -> list[str]:
    """How many rules fired, passed (checked and found nothing), do not apply (their subject is
    absent) and could not check, the last two with their reasons, rules of one reason together."""
    statuses = [s for s in doc.get("rules") or [] if isinstance(s, dict)]
    if not statuses:
        return []
    counts = [(words, [s for s in statuses if s.get("status") == status]) for status, words in STATUS_WORDS.items()]
    lines = ["Rules: " + ", ".join(f"{len(rows)} {words}" for words, rows in counts if rows) + "."]
    for words, rows in counts:
        if words not in ("not applicable", "could not check") or not rows:
            continue
        by_reason: dict[str, list[str]] = {}
        for s in rows:
            by_reason.setdefault(str(s.get("reason") or "no reason given"), []).append(str(s.get("rule")))
        text = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())
        lines += wrap(f"{words}: {text}", WIDTH, initial_indent="  ", subsequent_indent="    ",
                               break_on_hyphens=False)
    return lines + [""]


def _figure_cell(value: float, pct: float | None) -> str:
    return f"{value:>9,.0f}{pct or 0.0:>4.0f}%"


def _rank_table(doc: dict[str, Any], model: JobModel) -> list[str]:
    """The typical step's leaves per rank (whole-trace figures for a rank without one)."""
    with_tb = [r for r in model.ranks if r.typical is not None]
    if with_tb and model.typical is not None:
        head = f"{'rank':>5} " + " ".join(f"{title:>14}" for title, _ in LEAF_COLUMNS)
        lines = [f"Per rank, typical step {model.typical.step}: each rank's own time of it (µs, % of the step):", head]
        for r in with_tb:
            leaves = r.typical
            lines.append(f"{r.rank:>5} " + " ".join(_figure_cell(value, leaves.pct(value))
                                                   for value in (getattr(leaves, key) for _, key in LEAF_COLUMNS)))
        rest = [r.rank for r in model.ranks if r.typical is None]
        return lines + ([f"  (no step breakdown for rank(s) {', '.join(map(str, rest))})"] if rest else []) + [""]
    if not any(r.get("gpu_event_count") for r in doc["ranks"]):
        unread = any((r.get("markers_seen") or {}).get("unread_device_events") for r in doc["ranks"])
        why = "device-looking events under unknown categories not read: see warnings" if unread else "CPU-only"
        return [f"Per rank: no GPU activity in the traces of the {len(doc['ranks'])} rank(s) ({why}): "
                "no GPU time to break down", ""]
    head = f"{'rank':>5} " + " ".join(f"{title:>14}" for title, _ in COLUMNS)
    lines = ["Per rank, whole trace (µs, % of GPU span):", head]
    facts = {r.rank: r for r in model.ranks}
    for r in doc["ranks"]:
        rank = facts[r["rank"]]  # its whole trace: each figure as a share of its GPU span (the model's)
        cells = " ".join(f"{'-':>14}" if r.get(key) is None else _figure_cell(r[key], rank.span_pct(r[key]))
                         for _, key in COLUMNS)
        lines.append(f"{r['rank']:>5} {cells}")
    return lines + [""]


def _share(value: float, leaves: Any) -> str:
    share = leaves.share(value)
    return fmt_us(value) if share is None else f"{fmt_us(value)} ({100 * share:.1f}%)"


def _tree(model: JobModel) -> list[str]:
    """The typical step's time, leaf by leaf (mean over ranks), with the finer splits."""
    typical = model.typical
    if typical is None:
        return []
    leaves, d = typical.leaves, typical.details
    step = leaves.step_time_us
    excluded = "; ".join(f"step {e.step} {e.role}" for e in typical.excluded)
    lines = [f"Where the time of step {typical.step} goes (mean of {typical.ranks} rank(s)): {fmt_us(step)}"
             + (f"  [left out: {excluded}]" if excluded else "")]
    exposed = leaves.exposed_us
    peers = sorted(d.wait_by_peer.items(), key=lambda kv: (-kv[1], kv[0]))
    peer_text = ", ".join(f"{'rank ' if p.isdigit() else ''}{_PEER_WORDS.get(p, p)} {fmt_us(v)}" for p, v in peers[:2]) \
        + (f", +{len(peers) - 2}" if len(peers) > 2 else "")
    splits = []
    for cells_of, title in ((d.by_kind, "by collective"), (d.by_phase, "by phase"), (d.by_group, "by group")):
        cells = sorted(cells_of.items(), key=lambda kv: -kv[1].exposed_us)
        if cells and exposed:
            splits.append(f"{title}: " + ", ".join(f"{label} {fmt_us(c.exposed_us)}" for label, c in cells[:4]))
    idle = sorted(((HOST_ACTIVITY.get(k, k), v) for k, v in d.idle_by_host.items() if v), key=lambda kv: -kv[1])
    rows = [("├─ ", "compute only", leaves.compute_only_us, ""),
            ("├─ ", "exposed communication", exposed, ""),
            ("│  ├─ ", "waiting for late peers", leaves.exposed_wait_us, f"for {peer_text}" if peer_text else ""),
            ("│  └─ ", "transfer", leaves.exposed_transfer_us, ""),
            ("├─ ", "other GPU (copies, memsets)", leaves.other_gpu_us, ""),
            ("└─ ", "GPU idle", leaves.idle_us, "")]
    for prefix, name, value, note in rows:
        lines.append(f"  {prefix + name:<34} {fmt_us(value):>10} {100 * (leaves.share(value) or 0.0):5.1f}%  {note}".rstrip())
        if name == "exposed communication":  # the splits divide all of it, waiting and transfer alike
            lines += [f"  │     {text}" for text in splits]
    layout = dict(width=WIDTH, initial_indent=" " * 11, subsequent_indent=" " * 13, break_on_hyphens=False)
    own = sorted(((k, v) for k, v in d.idle_unknown_by_phase.items() if v), key=lambda kv: (-kv[1], kv[0]))
    where = f" (in {', '.join(f'{k} {fmt_us(v)}' for k, v in own)})" if own else ""
    host_text = "host meanwhile: " + ", ".join(f"{k} {fmt_us(v)}" + (where if k == HOST_ACTIVITY["unknown"] else "")
                                               for k, v in idle)
    if d.idle_host_us is not None and (d.idle_queued_us or 0.0) >= 0.005 * (leaves.idle_us or 1.0):
        # the two parts of idle, each split as the findings say it (analyzer.rules.host, gpu_idle_queued)
        waited = sorted(((WAITED_ON.get(k, k), v) for k, v in d.idle_queued_by.items() if v), key=lambda kv: -kv[1])
        lines += wrap(f"nothing launched {fmt_us(d.idle_host_us)}" + (f"; {host_text}" if idle else ""),
                               **layout)
        lines += wrap(f"work launched and waiting {fmt_us(d.idle_queued_us or 0.0)}: on "
                               + ", ".join(f"{k} {fmt_us(v)}" for k, v in waited), **layout)
    elif idle:
        lines += wrap(host_text, **layout)  # the findings' words for the same leaves (analyzer.rules.host)
    if model.idle_split_note:
        lines += wrap(f"({model.idle_split_note})", **layout)
    lines += wrap(f"waiting measured by: {typical.wait_source}", WIDTH, initial_indent="  ",
                           subsequent_indent="    ", break_on_hyphens=False)
    return lines + [""]


def _steps_label(rows: list[dict[str, Any]], excluded: dict[int, str]) -> str:
    """The list ranks every step of the trace: where it shows a step the breakdown above leaves
    out (warm-up, drain, outlier), it says so, so the two are not read as the same steps."""
    shown = sorted({c["step"] for c in rows if c.get("step") in excluded})
    if not shown:
        return ""
    names = ", ".join(f"step {step} {excluded[step]}" for step in shown)
    return f", every step of the trace ({names} included, which the breakdown leaves out)"


def _top_collectives(doc: dict[str, Any], model: JobModel, excluded: dict[int, str] | None = None) -> list[str]:
    """The most exposed GPU collectives and the host-side ones, from the digest of every row
    (analyzer.job.digest: a saved large result has only its most exposed rows in the document)."""
    digest = model.digest
    top = digest["top_exposed"]
    matched = bool((doc.get("stragglers") or {}).get("method"))
    host_side = _host_side_collectives(digest["host_side"], model.host_side, matched) if model.host_side else []
    shown, rows = top["shown"], top["rows"]
    if not shown:
        if host_side:  # nothing on the GPU to be exposed: say what the host-side ops tell
            return host_side
        return ["No exposed communication." if top["gpu"] else "No communication kernels.", ""]
    lines = [f"Top {len(rows)} collectives by exposed time{_steps_label(rows, excluded or {})}:",
             f"{'rank':>5} {'step':>5} {'phase':<9} {'collective':<14} {'size':>10} {'dur µs':>10} {'exposed µs':>11}  group"]
    for c in rows:
        size = fmt_bytes(c.get("bytes"))
        group = (c.get("group") or {}).get("description") or (c.get("group") or {}).get("name") or "?"
        step = c["step"] if c.get("step") is not None else "-"
        lines.append(f"{c['rank']:>5} {step:>5} {str(c.get('phase')):<9} {c['collective']:<14} {size:>10} "
                     f"{c['dur_us']:>10,.0f} {c['exposed_us']:>11,.0f}  {group}")
    return lines + [""] + host_side


def _host_side_collectives(host: dict[str, Any], per: HostSidePer, matched: bool) -> list[str]:
    """The collectives only the host's ops record (gloo, and NCCL ops of a rank with no GPU
    trace): how many and how large per step (``per``: the job model's), the longest, and what
    their record can and cannot tell (their host time, not when a GPU transferred or what compute hid)."""
    parts = ", ".join(f"{kind} {count:g} ({fmt_bytes(round(size)) if size is not None else 'size unknown'})"
                      for kind, count, size in sorted(per.kinds, key=lambda k: -k[1]))
    lines = wrap(f"Host-side collectives ({', '.join(host['libraries'])}), {host['count']} on "
                          f"{host['ranks']} rank(s), per {per.basis}: {parts}.", WIDTH, subsequent_indent="  ",
                          break_on_hyphens=False)
    last = ("which rank reached each last" if matched else
            "not which rank reached each last (the collectives could not be matched across ranks)")
    lines += wrap("measured: their count, message sizes, how long each took on the host (the "
                           f"backend's own work range where the trace has one); {last}; not measured: GPU time, "
                           "exposed communication and what compute hid (no GPU work recorded for them)", WIDTH,
                           initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    longest = host["longest"]
    lines += [f"Top {len(longest)} host-side collectives by duration:",
              f"{'rank':>5} {'step':>5} {'phase':<9} {'collective':<14} {'size':>10} {'dur µs':>10}  group"]
    for c in longest:
        group = (c.get("group") or {}).get("description") or (c.get("group") or {}).get("name") or "?"
        step = c["step"] if c.get("step") is not None else "-"
        lines.append(f"{c['rank']:>5} {step:>5} {str(c.get('phase')):<9} {c['collective']:<14} "
                     f"{fmt_bytes(c.get('bytes')):>10} {c['dur_us']:>10,.0f}  {group}")
    return lines + [""]


def _groups(doc: dict[str, Any], model: JobModel) -> list[str]:
    """Process groups: span, fitted α/β (or the profile's) with S*, the bus bandwidth (the job
    model's: the typical step's, over the collectives whose transfer is measured) and what it
    is, or why there is none."""
    groups = doc.get("groups") or []
    if not groups:
        return []
    names = [group_label(g) or f"? ({','.join(g.get('kinds') or [])})" for g in groups]
    name_w, role_w = 20, 12
    lines = ["Process groups (α/β: fit of the lower envelope, else hardware profile; busbw: below):",
             f"{'group':<{name_w}} {'role':<{role_w}} {'size':>5} {'nodes':>6} {'α µs':>8} {'β GB/s':>8} {'S*':>10} "
             f"{'busbw GB/s':>10} how"]
    notes: dict[str, str] = {}
    for g, facts, name in zip(groups, model.groups, names):
        nodes = "?" if g.get("nodes") is None else f"{g['nodes']}{'x' if g.get('cross_node') else ''}"
        role = str(g.get("role") or "?")
        if facts.busbw is not None:
            notes.setdefault(facts.label or name, facts.busbw.basis)
        shown = name
        if len(name) > name_w or len(role) > role_w:  # never cut: the long name on a line of its own
            lines.append(f"{name} ({role})" if len(role) > role_w else name)
            shown, role = "", ("" if len(role) > role_w else role)
        lines.append(f"{shown:<{name_w}} {role:<{role_w}} {_formatted(g.get('size'), '{:d}'):>5} {nodes:>6} "
                     f"{_formatted(g.get('alpha_us'), '{:.2f}'):>8} {_formatted(g.get('beta_gbps'), '{:.1f}'):>8} "
                     f"{fmt_bytes(round(g['s_star_bytes'])) if g.get('s_star_bytes') is not None else '?':>10} "
                     f"{_formatted(facts.busbw_gbps, '{:.1f}', '-'):>10} {g.get('fit_source', '')}")
    for label, basis in notes.items():
        lines += wrap(f"busbw {label}: {basis}", WIDTH, subsequent_indent="  ")
    return lines + [""]


def _formatted(value: Any, fmt: str, missing: str = "?") -> str:
    return missing if value is None else fmt.format(value)


def _stragglers(doc: dict[str, Any]) -> list[str]:
    s = doc.get("stragglers") or {}
    if not s.get("method"):
        return [f"Latest arrival: {s['note']}", ""] if s.get("note") else []
    if s.get("top_rank") is None:
        return [f"Latest arrival: none ({s['matched_collectives']} collectives matched by {s['method']})", ""]
    share = 100 * (s.get("top_rank_last_share") or 0)
    # Not the straggler finding's figure (the typical step's exposed waiting): every matched
    # collective of the trace, the waiting hidden under compute included.
    lines = [f"Latest arrival: rank {s['top_rank']} causes the most waiting ({fmt_us(s['top_rank_wait_caused_us'])} "
             f"of the others' time in collectives over the whole trace, exposed or hidden), last at {share:.0f}% "
             f"of {s['matched_collectives']} matched collectives"]
    often = max(s.get("by_rank") or [], key=lambda b: (b.get("times_last", 0), -b["rank"]), default=None)
    if often and often["rank"] != s["top_rank"] and often.get("times_last"):
        lines[0] += f"; rank {often['rank']} is last most often ({often['times_last']} times)"
    offsets = [b.get("clock_offset_us") or 0.0 for b in s.get("by_rank") or []]
    lines[0] += ("; one clock (ranks on one host)" if not any(offsets)
                 else "; clocks aligned per host by collective end times")
    return wrap(lines[0], WIDTH, subsequent_indent="  ", break_on_hyphens=False) + [""]


def _warnings(doc: dict[str, Any], longest: int = 600) -> list[str]:
    """Wrapped, not cut at the terminal width: a warning must be readable in full (up to
    ``longest`` characters: a hostile 100,000-character name must not flood the terminal)."""
    lines = []
    for w in doc.get("warnings") or []:
        text = f"warning: {w}"
        text = text if len(text) <= longest else text[:longest - 1] + "…"
        lines += wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return lines
