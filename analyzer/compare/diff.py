"""Compare two runs (trace paths or saved results): metric deltas, per-group collective deltas,
findings that appeared or were resolved, per-rank step times, and the step-time change taken
apart into its leaves, with the weak-scaling efficiency when the runs differ in size.

Every figure is the job model's (analyzer.job.model), the one the verdict and the gate quote:
the step time is each run's typical step (mean over ranks), and its change is taken apart into
that step's leaves, which add up to it exactly: compute only, exposed transfer (by process group,
intra- vs cross-node), idle and waiting for late peers, other GPU work. The collective deltas are
means per steady (rank, step) window (warm-up, drain and outlier steps left out).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from analyzer.base.units import fmt_flops, fmt_pct, fmt_tflops, fmt_us
from analyzer.compare.metrics import DEFAULT_AGGREGATE, metric_spec, run_metrics, unmeasured_metrics
from analyzer.compare.predictions import prediction_checks
from analyzer.job.compute import FAMILIES, bucket_floor
from analyzer.job.model import LEAF_NAMES
from analyzer.model import formulas as models
from analyzer.base.numbers import finite

DIFF_SCHEMA_VERSION = 2  # 2: each run's step_time_us is its typical step's (was mean_step_time_us)
SAME_PCT = 1.0  # |change| below 1% of the base is "same" (run-to-run noise)
SAME_PP = 0.1  # a share's |change| below a tenth of a point: "same" (the views print shares to 0.1%)


def diff_runs(base: Any, new: Any, base_label: str = "base", new_label: str = "new") -> dict[str, Any]:
    """The diff document of two runs (Results)."""
    facts = {"base": run_facts(base, base_label), "new": run_facts(new, new_label)}
    return {
        "kind": "tracecliff-diff",
        "schema_version": DIFF_SCHEMA_VERSION,
        "base": facts["base"],
        "new": facts["new"],
        "same_scale": facts["base"]["world_size"] == facts["new"]["world_size"]
        and facts["base"]["nodes"] == facts["new"]["nodes"],
        "metrics": metric_deltas(base, new),
        "collectives": collective_deltas(base, new),
        "findings": finding_changes(base, new),
        "ranks": rank_deltas(base, new),
        "step_time": decompose(base, new),
        "scaling": scaling(base, new, facts),
        # each finding of base: the gain it predicted against the change measured (added keys only)
        "predictions": prediction_checks(base, new),
        "compute": compute_scaling(base, new, facts),
    }


# ---------------------------------------------------------------- run facts and topology


def run_facts(run: Any, label: str) -> dict[str, Any]:
    model = run.model
    nodes, source = node_count(run)
    mfu = run.mfu if isinstance(run.mfu, dict) else {}
    return {
        "label": label,
        "strategy": run.job.get("strategy"),
        "gpu": run.job.get("gpu"),
        "world_size": run.job.get("world_size") or len(run.ranks) or None,
        "ranks_given": len(run.ranks),
        "nodes": nodes,
        "nodes_source": source,
        "step": model.typical.step if model.typical else None,
        "step_time_us": model.step_time_us,  # the typical step's (the verdict's)
        "tokens_per_step": finite(mfu.get("tokens_per_step")),
        # each GPU's work per step, from the recorded shapes (None: no op gave FLOPs)
        "flops_per_step": model.compute.flops_per_step if model.compute is not None else None,
    }


def node_count(run: Any) -> tuple[int | None, str | None]:
    job = run.job
    hosts = job.get("hosts") or []
    world = job.get("world_size")
    if hosts and (world is None or len(run.ranks) >= world):
        return len(hosts), "host names"
    spans = [g.nodes for g in run.model.groups if isinstance(g.nodes, int)]
    if spans:
        return max(spans), "topology (groups)"
    per_node = job.get("devices_per_node")
    if world and per_node:
        return math.ceil(world / per_node), "layout: world size / devices per node"
    if hosts:
        return len(hosts), "host names of the given ranks"
    return None, None


def cross_node_of(run: Any, group: dict[str, Any] | None) -> tuple[bool | None, str | None]:
    """Whether a group spans nodes: the topology analysis's answer when present, else the host
    names of its ranks, else the torchrun layout (devices per node)."""
    if not group:
        return None, None
    known = run.model.group(group.get("name"))
    if known is not None and isinstance(known.cross_node, bool):
        return known.cross_node, "topology"
    members = group.get("ranks") or []
    host_of = {r.rank: r.host for r in run.ranks if r.host}
    hosts = {host_of[m] for m in members if m in host_of}
    if len(hosts) > 1:
        return True, "host names"
    if members and all(m in host_of for m in members):
        return False, "host names"
    per_node = run.job.get("devices_per_node")
    if members and per_node:
        return len({m // per_node for m in members}) > 1, "layout"
    return None, None


def _group_scope(run: Any, label: str) -> bool | None:
    """Whether the group a breakdown label names (analyzer.job.model.group_label) spans nodes."""
    return next((g.cross_node for g in run.model.groups if g.label == label), None)


# ---------------------------------------------------------------- metric and rank deltas


def metric_deltas(base: Any, new: Any) -> list[dict[str, Any]]:
    """Each metric of either run, the gate's figure (analyzer.compare.metrics); one a run has the
    subject of but cannot measure (a group's bus bandwidth without a measured transfer) is
    ``not measured``, with why in ``note``."""
    before, after = run_metrics(base), run_metrics(new)
    unmeasured = {"base": unmeasured_metrics(base), "new": unmeasured_metrics(new)}
    rows = []
    for name in sorted(set(before) | set(after) | set(unmeasured["base"]) | set(unmeasured["new"])):
        spec = metric_spec(name)
        assert spec is not None
        b = before[name].typical if name in before else None
        a = after[name].typical if name in after else None
        row = {"metric": name, "unit": spec.unit, "better": spec.better, "aggregate": DEFAULT_AGGREGATE,
               "base": b, "new": a, **_change(b, a, spec.better, share=spec.compare == "share")}
        why = {side: reasons[name] for side, reasons in unmeasured.items() if name in reasons}
        if why:
            same = len(why) == 2 and why["base"] == why["new"]
            row.update(verdict="not measured", note=f"both: {why['base']}" if same else
                       "; ".join(f"{side}: {reason}" for side, reason in why.items()))
        rows.append(row)
    return rows


def _change(base: float | None, new: float | None, better: str = "lower", share: bool = False) -> dict[str, Any]:
    """The change of a figure. A share of the step (%) changes in percentage points, as the gate
    says it (``delta_pp``): idle 0.07% → 0.10% is 0.03 points, "same", not "+43.5% worse"."""
    if base is None or new is None:
        return {"delta": None, "delta_pct": None, "verdict": "new" if base is None else "gone"}
    delta = new - base
    pct = 100.0 * delta / abs(base) if base else (0.0 if delta == 0 else None)
    if delta == 0 or (abs(delta) < SAME_PP if share else pct is not None and abs(pct) < SAME_PCT):
        verdict = "same"
    else:
        verdict = "worse" if (delta > 0) == (better == "lower") else "better"
    return {"delta": delta, "delta_pct": pct, "verdict": verdict, **({"delta_pp": delta} if share else {})}


def rank_deltas(base: Any, new: Any) -> list[dict[str, Any]]:
    """Each rank's own time of its run's typical step."""
    def per_rank(run):
        return {r.rank: r.typical.step_time_us for r in run.model.ranks if r.typical is not None}
    before, after = per_rank(base), per_rank(new)
    return [{"rank": rank, "base_step_time_us": before.get(rank), "new_step_time_us": after.get(rank),
             **_change(before.get(rank), after.get(rank))}
            for rank in sorted(set(before) | set(after))]


# ---------------------------------------------------------------- collectives


def collective_totals(run: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (group, collective): count, bytes, time, exposed and wait per steady (rank, step)
    window (per rank when the run has no step breakdown), from the digest of every row
    (analyzer.job.digest: its sums over the windows' rows)."""
    totals = run.model.digest["totals"]
    windows, per = totals["windows"], totals["per"]
    sums: dict[tuple[str, str], dict[str, Any]] = {}
    for label, kind, count, size, unknown, time_us, exposed_us, wait_us, group in totals["cells"]:
        entry = {"count": count, "bytes": None if unknown == count else size, "time_us": time_us,
                 "exposed_us": exposed_us, "wait_us": wait_us, "bytes_unknown": unknown}
        for key in ("count", "bytes", "time_us", "exposed_us", "wait_us"):
            if entry[key] is not None:
                entry[key] = entry[key] / windows
        entry["cross_node"], entry["cross_node_source"] = cross_node_of(run, group)
        entry["per"] = per
        sums[(label, kind)] = entry
    return sums


def collective_deltas(base: Any, new: Any) -> list[dict[str, Any]]:
    before, after = collective_totals(base), collective_totals(new)
    rows = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        either = a or b
        row = {"group": key[0], "collective": key[1], "cross_node": either["cross_node"],
               "base_cross_node": b["cross_node"] if b else None,
               "cross_node_source": either["cross_node_source"],
               "per": either["per"] if not (a and b) or a["per"] == b["per"] else "mixed"}
        for field in ("count", "bytes", "time_us", "exposed_us"):
            bv, av = (b or {}).get(field), (a or {}).get(field)
            row[field] = {"base": bv, "new": av, **_change(bv if b else None, av if a else None)}
        row["bytes_unknown"] = bool((b or {}).get("bytes_unknown") or (a or {}).get("bytes_unknown"))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- findings


def finding_changes(base: Any, new: Any) -> dict[str, list[dict[str, Any]]]:
    def by_rule(run):
        grouped = defaultdict(list)
        for f in run.findings:
            grouped[f.get("rule") or "?"].append(f)
        return grouped
    before, after = by_rule(base), by_rule(new)

    def entry(rule, found, other=None):
        order = {"error": 0, "warning": 1, "info": 2}
        worst = min((f.get("severity") for f in found), key=lambda s: order.get(s, 3))
        out = {"rule": rule, "severity": worst, "count": len(found), "title": found[0].get("title"),
               "summary": found[0].get("summary"), "gain_us": _gain(found)}
        if other is not None:
            out["base_count"] = len(other)
            out["base_gain_us"] = _gain(other)
        return out
    return {
        "appeared": [entry(r, after[r]) for r in sorted(set(after) - set(before))],
        "resolved": [entry(r, before[r]) for r in sorted(set(before) - set(after))],
        "persisting": [entry(r, after[r], before[r]) for r in sorted(set(after) & set(before))],
    }


def _gain(found: list[dict[str, Any]]) -> float | None:
    """The findings' estimated gain per step together (None: none of them has one)."""
    gains = [f["estimated_gain_us"] for f in found if isinstance(f.get("estimated_gain_us"), (int, float))]
    return sum(gains) if gains else None


GREW_PCT = 5.0  # a persisting finding's gain "grew" past this % of the base's (the gate's default limit)


def grown_findings(base: Any, new: Any) -> list[dict[str, Any]]:
    """The findings of ``new`` that appeared since ``base``, or persist with more findings or an
    estimated gain more than GREW_PCT larger: what a failing gate names as its cause."""
    changes = finding_changes(base, new)
    out = [{**f, "change": "appeared"} for f in changes["appeared"]]
    for f in changes["persisting"]:
        gain, before = f["gain_us"], f["base_gain_us"]
        if f["count"] > f["base_count"] or (gain is not None and (
                before is None or gain > before * (1.0 + GREW_PCT / 100.0))):
            out.append({**f, "change": "grew"})
    return out


# ---------------------------------------------------------------- step-time decomposition


def step_components(run: Any) -> dict[str, Any]:
    """The typical step's leaves (mean over ranks; they add up to its time) and its exposed
    transfer by process group."""
    typical = run.model.typical
    if typical is None:
        return {}
    leaves = typical.leaves
    return {
        "step": typical.step,
        "step_time_us": leaves.step_time_us,
        "compute_us": leaves.compute_only_us,
        "exposed_comm_us": leaves.exposed_transfer_us,
        "by_group": {label: split.transfer_us for label, split in typical.details.by_group.items()},
        "cross_node": {label: _group_scope(run, label) for label in typical.details.by_group},
        "idle_us": leaves.idle_us,
        "straggler_wait_us": leaves.exposed_wait_us,
        "other_gpu_us": leaves.other_gpu_us,
        "wait_source": typical.wait_source,
    }


def decompose(base: Any, new: Any) -> dict[str, Any]:
    b, a = step_components(base), step_components(new)
    if not b or not a:
        return {"available": False, "reason": "a run has no step breakdown (no GPU steps in its traces)"}
    total = a["step_time_us"] - b["step_time_us"]

    def part(name, bv, av, children=None, **extra):
        delta = av - bv
        out = {"component": name, "base_us": bv, "new_us": av, "delta_us": delta,
               "share_of_change_pct": 100.0 * delta / total if total else None,
               # at equal per-GPU batch, 1 − efficiency = ΔT / T_new: each part's points of it
               "efficiency_points": 100.0 * delta / a["step_time_us"], **extra}
        if children is not None:
            out["parts"] = children
        return out

    labels = sorted(set(b["by_group"]) | set(a["by_group"]))
    comm_parts = [part(label, b["by_group"].get(label, 0.0), a["by_group"].get(label, 0.0), group=label,
                       collective="all", cross_node=a["cross_node"].get(label, b["cross_node"].get(label)),
                       base_cross_node=b["cross_node"].get(label))
                  for label in labels]
    # Named as the job model names the leaves (the verdict's "exposed communication" is waiting
    # + transfer: here they are two rows, so neither takes that name).
    idle, wait = LEAF_NAMES["idle_us"], LEAF_NAMES["exposed_wait_us"]
    idle_parts = [part(idle, b["idle_us"], a["idle_us"]),
                  part(wait, b["straggler_wait_us"], a["straggler_wait_us"])]
    components = [
        part(LEAF_NAMES["compute_only_us"], b["compute_us"], a["compute_us"]),
        part(LEAF_NAMES["exposed_transfer_us"], b["exposed_comm_us"], a["exposed_comm_us"], comm_parts,
             by_scope=_by_scope(comm_parts)),
        part(f"{idle} and {wait}", b["idle_us"] + b["straggler_wait_us"], a["idle_us"] + a["straggler_wait_us"],
             idle_parts),
        part(LEAF_NAMES["other_gpu_us"] + " (memcpy, memset, sync)", b["other_gpu_us"], a["other_gpu_us"]),
    ]
    return {"available": True, "per": f"typical step (base step {b['step']}, new step {a['step']}), mean over ranks",
            "base_step_time_us": b["step_time_us"], "new_step_time_us": a["step_time_us"],
            "delta_us": total, "components": components,
            "straggler_wait_measured": not (b["wait_source"].startswith("not measured")
                                            and a["wait_source"].startswith("not measured"))}


def _by_scope(parts: list[dict[str, Any]]) -> dict[str, float]:
    scope = {True: "cross-node", False: "intra-node", None: "unknown"}
    out: dict[str, float] = {}
    for p in parts:
        label = scope[p["cross_node"]]
        out[label] = out.get(label, 0.0) + p["delta_us"]
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- scaling efficiency


def scaling_kind(b: dict[str, Any], a: dict[str, Any]) -> str:
    """same scale; strong scaling (the same work per step for the job: FLOPs per GPU × GPUs
    equal within WORK_TOLERANCE); weak scaling (the same work per GPU, or not known)."""
    if b["world_size"] == a["world_size"]:
        return "same scale"
    fb, fa = b.get("flops_per_step"), a.get("flops_per_step")
    if fb and fa and b["world_size"] and a["world_size"]:
        if abs(fa * a["world_size"] / (fb * b["world_size"]) - 1.0) <= WORK_TOLERANCE:
            return "strong scaling"
        if abs(fa / fb - 1.0) > WORK_TOLERANCE:
            return "scaling (work per GPU and per job both changed)"
    return "weak scaling"


def scaling(base: Any, new: Any, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from analyzer.model.formulas import scaling_efficiency
    b, a = facts["base"], facts["new"]
    out = {"kind": scaling_kind(b, a),
           "base_gpus": b["world_size"], "new_gpus": a["world_size"],
           "base_nodes": b["nodes"], "new_nodes": a["nodes"]}
    tb, ta = b["step_time_us"], a["step_time_us"]
    if not tb or not ta:
        return {**out, "efficiency": None, "basis": "unavailable: no step times"}
    if b["tokens_per_step"] and a["tokens_per_step"] and b["world_size"] and a["world_size"]:
        per_gpu = [t / (n * s * 1e-6) for t, n, s in ((b["tokens_per_step"], b["world_size"], tb),
                                                     (a["tokens_per_step"], a["world_size"], ta))]
        basis, unit = "tokens per step / (GPUs × typical step time)", "tokens/s"
    elif b.get("flops_per_step") and a.get("flops_per_step"):
        per_gpu = [f / (s * 1e-6) / 1e12 for f, s in ((b["flops_per_step"], tb), (a["flops_per_step"], ta))]
        basis, unit = "FLOPs per GPU per step (recorded shapes) / typical step time", "TFLOP/s"
    else:
        per_gpu = [1e6 / tb, 1e6 / ta]  # steps/s per GPU: equal per-GPU batch assumed
        basis, unit = "typical step time, assuming equal per-GPU batch (tokens per step unknown)", "steps/s"
    efficiency = scaling_efficiency(per_gpu[1], per_gpu[0])
    return {**out, "efficiency": efficiency, "lost_pct": 100.0 * (1.0 - efficiency), "basis": basis,
            "base_throughput_per_gpu": per_gpu[0], "new_throughput_per_gpu": per_gpu[1],
            "throughput_unit": unit}


# ---------------------------------------------------------------- the strong-scaling compute cliff

WORK_TOLERANCE = 0.05  # work per step equal within 5%: the same batch (strong scaling) or per-GPU batch
SHRANK = 0.9  # each GPU's work fell to at most this share of the base's
SLOWER_PER_FLOP = 0.10  # compute time per FLOP up by at least this share: compute did not scale
GEMM_DROP = 0.10  # GEMM TFLOP/s down by at least this share
MIN_EXCESS_SHARE = 0.02  # the compute lost, as a share of the new step, worth a finding


def compute_side(run: Any) -> dict[str, Any] | None:
    """One run's compute of its typical step (analyzer.job.compute), as the diff compares it."""
    compute = run.model.compute
    if compute is None or not compute.timed or not compute.compute_us:
        return None
    gemm = compute.families["gemm"]
    timed = [compute.families[f] for f in FAMILIES if compute.families[f].gpu_us > 0]
    return {"step": compute.step, "gpus": run.job.get("world_size") or len(run.ranks),
            "flops_per_step": compute.flops_per_step, "compute_us": compute.compute_us,
            # the ops with FLOPs whose kernels were found: their FLOPs and kernel time
            "counted_flops": sum((f.tflops_per_s or 0.0) * f.gpu_us * 1e6 for f in timed),
            "counted_us": sum(f.gpu_us for f in timed),
            "step_time_us": compute.step_time_us, "mfu": compute.mfu, "compute_mfu": compute.compute_mfu,
            "gemm": {"flops": gemm.flops, "gpu_us": gemm.gpu_us, "tflops_per_s": gemm.tflops_per_s,
                     "pct_of_peak": gemm.pct_of_peak},
            "gemm_by_size": [{"bucket": bucket, "flops": f.flops, "gpu_us": f.gpu_us, "tflops_per_s": f.tflops_per_s,
                              "pct_of_peak": f.pct_of_peak} for bucket, f in compute.buckets("gemm")]}


def compute_scaling(base: Any, new: Any, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Compute per step and GEMM efficiency across the two runs, and the strong-scaling compute
    cliff (models.md §6): each GPU got less work (a smaller per-GPU batch) but its compute time
    did not fall with it, and its GEMMs ran further from peak as their shapes shrank."""
    b, a = compute_side(base), compute_side(new)
    if b is None or a is None:
        return {"available": False, "reason": "a run has no FLOPs from recorded shapes with GPU kernels "
                                              "(profile with record_shapes=True)", "finding": None}
    work = a["flops_per_step"] / b["flops_per_step"] if b["flops_per_step"] else None
    # The kernels of the ops with FLOPs at the base run's efficiency: what they would take now
    # had compute scaled perfectly with the work (the rest of compute, e.g. the optimizer, is
    # not work that shrinks with the batch, and is left out of the comparison).
    known = b["counted_flops"] > 0 and a["counted_flops"] > 0 and b["counted_us"] > 0
    expected = models.expected_compute_us(b["counted_us"], b["counted_flops"], a["counted_flops"]) if known else None
    per_flop = (a["counted_us"] / a["counted_flops"]) / (b["counted_us"] / b["counted_flops"]) - 1.0 if known else None
    gb, ga = b["gemm"]["tflops_per_s"], a["gemm"]["tflops_per_s"]
    gemm_change = ga / gb - 1.0 if gb and ga else None
    out = {"available": True, "kind": scaling_kind(facts["base"], facts["new"]), "base": b, "new": a,
           "work_ratio": work, "compute_ratio": a["compute_us"] / b["compute_us"],
           "counted_ratio": a["counted_us"] / b["counted_us"] if b["counted_us"] else None,
           "expected_counted_us": expected,
           "excess_compute_us": a["counted_us"] - expected if expected is not None else None,
           "compute_per_flop_change": per_flop, "gemm_tflops_change": gemm_change}
    out["finding"] = _compute_cliff(out, facts)
    return out


def _compute_cliff(c: dict[str, Any], facts: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    work, per_flop, gemm_change, excess = (c["work_ratio"], c["compute_per_flop_change"], c["gemm_tflops_change"],
                                           c["excess_compute_us"])
    b, a = c["base"], c["new"]
    step = a["step_time_us"] or facts["new"]["step_time_us"]
    if None in (work, per_flop, gemm_change, excess) or not step:
        return None
    if work > SHRANK or per_flop < SLOWER_PER_FLOP or gemm_change > -GEMM_DROP or excess < MIN_EXCESS_SHARE * step:
        return None
    sizes = _size_pairs(b["gemm_by_size"], a["gemm_by_size"])
    same = " at the same global batch (FLOPs per step × GPUs equal)" if c["kind"] == "strong scaling" else ""
    summary = (f"Compute does not scale with the per-GPU batch: from {b['gpus']} to {a['gpus']} GPUs{same}, each GPU's "
               f"work fell {1 / work:.1f}× ({fmt_flops(b['flops_per_step'])} → {fmt_flops(a['flops_per_step'])} per "
               f"step) but the time of its matrix-multiply and attention kernels only "
               f"{b['counted_us'] / a['counted_us']:.1f}× ({fmt_us(b['counted_us'])} → {fmt_us(a['counted_us'])}, "
               f"{fmt_us(c['expected_counted_us'])} had they kept their efficiency): its GEMMs ran at "
               f"{fmt_tflops(b['gemm']['tflops_per_s'])} "
               f"({fmt_pct(b['gemm']['pct_of_peak'])} of peak) and now at {fmt_tflops(a['gemm']['tflops_per_s'])} "
               f"({fmt_pct(a['gemm']['pct_of_peak'])}) on smaller shapes; {fmt_us(excess)} of the new "
               f"{fmt_us(step)} typical step ({fmt_pct(100 * excess / step)}) is compute the smaller shapes cost.")
    return {"code": "compute-cliff", "severity": "warning", "title": "Compute does not scale with the per-GPU batch",
            "summary": summary,
            "evidence": {"base_gpus": b["gpus"], "new_gpus": a["gpus"], "scaling": c["kind"],
                         "work_per_gpu_ratio": round(work, 4),
                         "base_compute_us": b["compute_us"], "new_compute_us": a["compute_us"],
                         "base_flop_kernels_us": round(b["counted_us"], 1), "new_flop_kernels_us": round(a["counted_us"], 1),
                         "expected_flop_kernels_us": round(c["expected_counted_us"], 1),
                         "excess_compute_us": round(excess, 1),
                         "base_gemm_tflops_per_s": b["gemm"]["tflops_per_s"], "new_gemm_tflops_per_s": a["gemm"]["tflops_per_s"],
                         "gemm_tflops_by_size": sizes, "new_step_time_us": step},
            "model": (f"expected kernel time = base kernel time × new FLOPs / base FLOPs = {fmt_us(b['counted_us'])} × "
                      f"{a['counted_flops'] / b['counted_flops']:.4f} = {fmt_us(c['expected_counted_us'])}; measured "
                      f"{fmt_us(a['counted_us'])} (the ops with FLOPs from recorded shapes; models.md §6)"),
            "fix": ("Give each GPU bigger GEMMs again: a larger micro-batch per GPU (with gradient accumulation to keep "
                    "the global batch), fewer GPUs for this batch size, or sequence packing to fill each sequence; "
                    "tensor or sequence parallelism shrinks the GEMMs further.")}


def _size_pairs(base: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GEMM TFLOP/s per FLOPs-per-op decade, in both runs (None where a run has none)."""
    by_b = {row["bucket"]: row for row in base}
    by_a = {row["bucket"]: row for row in new}
    out = []
    for bucket in sorted(set(by_b) | set(by_a), key=lambda x: -bucket_floor(x)):
        out.append({"bucket": bucket, "base_tflops_per_s": (by_b.get(bucket) or {}).get("tflops_per_s"),
                    "new_tflops_per_s": (by_a.get(bucket) or {}).get("tflops_per_s"),
                    "base_flops": (by_b.get(bucket) or {}).get("flops"), "new_flops": (by_a.get(bucket) or {}).get("flops")})
    return out


