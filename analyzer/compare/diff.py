"""Compare two runs (trace paths or saved results): metric deltas, per-group collective deltas,
findings that appeared or were resolved, per-rank step times, and the step-time change taken
apart into compute, exposed communication (by group and collective, intra- vs cross-node), idle
and straggler wait, and other GPU work, with the weak-scaling efficiency when the scales differ.

The decomposition uses means over (rank, step) windows, because means add up: per window
``step time = compute + exposed comm + other GPU work + idle`` exactly (compute = union of compute
kernels, exposed comm = comm not under compute, other = busy − both, idle = step time − busy), so
the components' changes sum to the step-time change. Exposed communication is split by the
collectives' own ``exposed_us`` (a residual row holds time where collectives overlap each other);
straggler wait, when the cross-rank analysis measured ``wait_us``, is moved from exposed
communication to "idle and straggler wait" (the exposed part of a collective's wait).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from analyzer.compare.metrics import as_document, extract_samples, group_label, metric_spec, step_records

DIFF_SCHEMA_VERSION = 1
SAME_PCT = 1.0  # |change| below 1% of the base is "same" (run-to-run noise)
RESIDUAL = "(collectives overlapping each other)"


def diff_runs(base: Any, new: Any, base_label: str = "base", new_label: str = "new") -> dict[str, Any]:
    """The diff document of two runs (Results, or their JSON documents)."""
    base, new = as_document(base), as_document(new)
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
    }


# ---------------------------------------------------------------- run facts and topology


def run_facts(doc: dict[str, Any], label: str) -> dict[str, Any]:
    job = doc.get("job") or {}
    records = step_records(doc)
    nodes, source = node_count(doc)
    return {
        "label": label,
        "strategy": job.get("strategy"),
        "gpu": job.get("gpu"),
        "world_size": job.get("world_size") or len(doc.get("ranks") or []) or None,
        "ranks_given": len(doc.get("ranks") or []),
        "nodes": nodes,
        "nodes_source": source,
        "windows": len(records),
        "mean_step_time_us": _mean([r["step_time_us"] for r in records]),
        "tokens_per_step": _num((doc.get("mfu") or {}).get("tokens_per_step")
                                if isinstance(doc.get("mfu"), dict) else None),
    }


def node_count(doc: dict[str, Any]) -> tuple[int | None, str | None]:
    job = doc.get("job") or {}
    hosts = job.get("hosts") or []
    world = job.get("world_size")
    if hosts and (world is None or len(doc.get("ranks") or []) >= world):
        return len(hosts), "host names"
    spans = [g.get("nodes") for g in doc.get("groups") or [] if isinstance(g.get("nodes"), int)]
    if spans:
        return max(spans), "topology (groups)"
    per_node = job.get("devices_per_node")
    if world and per_node:
        return math.ceil(world / per_node), "layout: world size / devices per node"
    if hosts:
        return len(hosts), "host names of the given ranks"
    return None, None


def cross_node_of(doc: dict[str, Any], group: dict[str, Any] | None) -> tuple[bool | None, str | None]:
    """Whether a group spans nodes: the topology analysis's answer when present, else the host
    names of its ranks, else the torchrun layout (devices per node)."""
    if not group:
        return None, None
    for known in doc.get("groups") or []:
        if known.get("name") == group.get("name") and isinstance(known.get("cross_node"), bool):
            return known["cross_node"], "topology"
    members = group.get("ranks") or []
    host_of = {r.get("rank"): r.get("host") for r in doc.get("ranks") or [] if r.get("host")}
    hosts = {host_of[m] for m in members if m in host_of}
    if len(hosts) > 1:
        return True, "host names"
    if members and all(m in host_of for m in members):
        return False, "host names"
    per_node = (doc.get("job") or {}).get("devices_per_node")
    if members and per_node:
        return len({m // per_node for m in members}) > 1, "layout"
    return None, None


# ---------------------------------------------------------------- metric and rank deltas


def metric_deltas(base: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    from analyzer.compare.metrics import aggregate
    before, after = extract_samples(base), extract_samples(new)
    rows = []
    for name in sorted(set(before) | set(after)):
        spec = metric_spec(name)
        b = aggregate([s.value for s in before[name]], "median") if name in before else None
        a = aggregate([s.value for s in after[name]], "median") if name in after else None
        rows.append({"metric": name, "unit": spec.unit, "better": spec.better, "aggregate": "median",
                     "base": b, "new": a, **_change(b, a, spec.better)})
    return rows


def _change(base: float | None, new: float | None, better: str = "lower") -> dict[str, Any]:
    if base is None or new is None:
        return {"delta": None, "delta_pct": None, "verdict": "new" if base is None else "gone"}
    delta = new - base
    pct = 100.0 * delta / abs(base) if base else (0.0 if delta == 0 else None)
    if delta == 0 or (pct is not None and abs(pct) < SAME_PCT):
        verdict = "same"
    else:
        verdict = "worse" if (delta > 0) == (better == "lower") else "better"
    return {"delta": delta, "delta_pct": pct, "verdict": verdict}


def rank_deltas(base: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    def per_rank(doc):
        times = defaultdict(list)
        for r in step_records(doc):
            if r["step"] is not None:
                times[r["rank"]].append(r["step_time_us"])
        return {rank: _mean(v) for rank, v in times.items()}
    before, after = per_rank(base), per_rank(new)
    return [{"rank": rank, "base_step_time_us": before.get(rank), "new_step_time_us": after.get(rank),
             **_change(before.get(rank), after.get(rank))}
            for rank in sorted(set(before) | set(after))]


# ---------------------------------------------------------------- collectives


def _rows_in_windows(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], int, str]:
    """Collective rows inside the run's (rank, step) windows, the number of windows and what a
    window is. A run without GPU windows (CPU-only traces) counts whole traces per rank."""
    records = step_records(doc)
    rows = doc.get("collectives") or []
    if not records:
        ranks = {r.get("rank") for r in doc.get("ranks") or []}
        return [row for row in rows if row.get("rank") in ranks], max(len(ranks), 1), "rank"
    windows = {(r["rank"], r["step"]) for r in records}
    rows = [row for row in rows
            if (row.get("rank"), row.get("step")) in windows or (row.get("rank"), None) in windows]
    return rows, len(records), "rank-step"


def collective_totals(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (group, collective): count, bytes, time, exposed and wait per (rank, step) window
    (per rank when the run has no GPU step windows)."""
    rows, windows, per = _rows_in_windows(doc)
    sums: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (group_label(row.get("group")) or "(unknown group)", row.get("collective") or "unknown")
        entry = sums.setdefault(key, {"count": 0, "bytes": 0.0, "time_us": 0.0, "exposed_us": 0.0,
                                      "wait_us": None, "bytes_unknown": 0, "group": row.get("group")})
        entry["count"] += 1
        size = _num(row.get("bytes"))
        entry["bytes"] += size or 0.0
        entry["bytes_unknown"] += size is None
        entry["time_us"] += _num(row.get("dur_us")) or 0.0
        entry["exposed_us"] += _num(row.get("exposed_us")) or 0.0
        wait = _exposed_wait(row)
        if wait is not None:
            entry["wait_us"] = (entry["wait_us"] or 0.0) + wait
    for entry in sums.values():
        if entry["bytes_unknown"] == entry["count"]:
            entry["bytes"] = None  # no size known at all: not "0 bytes"
        for key in ("count", "bytes", "time_us", "exposed_us", "wait_us"):
            if entry[key] is not None:
                entry[key] = entry[key] / windows
        entry["cross_node"], entry["cross_node_source"] = cross_node_of(doc, entry.pop("group"))
        entry["per"] = per
    return sums


def _exposed_wait(row: dict[str, Any]) -> float | None:
    """The part of a collective's exposed time spent waiting for the last rank to arrive."""
    wait, exposed = _num(row.get("wait_us")), _num(row.get("exposed_us"))
    if wait is None or exposed is None:
        return None
    return min(max(wait, 0.0), exposed)


def collective_deltas(base: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
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


def finding_changes(base: dict[str, Any], new: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    def by_rule(doc):
        grouped = defaultdict(list)
        for f in doc.get("findings") or []:
            grouped[f.get("rule") or "?"].append(f)
        return grouped
    before, after = by_rule(base), by_rule(new)

    def entry(rule, found, other=None):
        order = {"error": 0, "warning": 1, "info": 2}
        worst = min((f.get("severity") for f in found), key=lambda s: order.get(s, 3))
        out = {"rule": rule, "severity": worst, "count": len(found), "title": found[0].get("title"),
               "summary": found[0].get("summary")}
        if other is not None:
            out["base_count"] = len(other)
        return out
    return {
        "appeared": [entry(r, after[r]) for r in sorted(set(after) - set(before))],
        "resolved": [entry(r, before[r]) for r in sorted(set(before) - set(after))],
        "persisting": [entry(r, after[r], before[r]) for r in sorted(set(after) & set(before))],
    }


# ---------------------------------------------------------------- step-time decomposition


def step_components(doc: dict[str, Any]) -> dict[str, Any]:
    """Mean per (rank, step) window of the additive parts of the step time."""
    records = step_records(doc)
    if not records:
        return {}
    mean = {k: _mean([_num(r.get(k)) or 0.0 for r in records])
            for k in ("step_time_us", "compute_us", "exposed_comm_us", "busy_us")}
    totals = collective_totals(doc)
    waits = [t["wait_us"] for t in totals.values() if t["wait_us"] is not None]
    wait = sum(waits) if waits else None
    by_collective = {key: t["exposed_us"] - (t["wait_us"] or 0.0) for key, t in totals.items()}
    transfer = mean["exposed_comm_us"] - (wait or 0.0)
    idle = mean["step_time_us"] - mean["busy_us"]
    return {
        "step_time_us": mean["step_time_us"],
        "compute_us": mean["compute_us"],
        "exposed_comm_us": transfer,
        "by_collective": by_collective,
        "residual_us": round(transfer - sum(by_collective.values()), 3),  # whole ns: no float dust
        "cross_node": {key: t["cross_node"] for key, t in totals.items()},
        "idle_us": idle,
        "straggler_wait_us": wait,
        "other_gpu_us": mean["busy_us"] - mean["compute_us"] - mean["exposed_comm_us"],
    }


def decompose(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    b, a = step_components(base), step_components(new)
    if not b or not a:
        return {"available": False, "reason": "a run has no GPU step windows"}
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

    keys = sorted(set(b["by_collective"]) | set(a["by_collective"]))
    comm_parts = [part(f"{g} {c}", b["by_collective"].get((g, c), 0.0), a["by_collective"].get((g, c), 0.0),
                       group=g, collective=c, cross_node=a["cross_node"].get((g, c), b["cross_node"].get((g, c))),
                       base_cross_node=b["cross_node"].get((g, c)))
                  for g, c in keys]
    comm_parts.append(part(RESIDUAL, b["residual_us"], a["residual_us"], group=None, collective=None,
                           cross_node=None, base_cross_node=None))
    wait_b, wait_a = b["straggler_wait_us"] or 0.0, a["straggler_wait_us"] or 0.0
    idle_parts = [part("GPU idle", b["idle_us"], a["idle_us"])]
    if b["straggler_wait_us"] is not None or a["straggler_wait_us"] is not None:
        idle_parts.append(part("straggler wait (exposed)", wait_b, wait_a))
    components = [
        part("compute", b["compute_us"], a["compute_us"]),
        part("exposed communication", b["exposed_comm_us"], a["exposed_comm_us"], comm_parts,
             by_scope=_by_scope(comm_parts)),
        part("idle and straggler wait", b["idle_us"] + wait_b, a["idle_us"] + wait_a, idle_parts),
        part("other GPU work (memcpy, memset, sync)", b["other_gpu_us"], a["other_gpu_us"]),
    ]
    return {"available": True, "per": "mean over (rank, step) windows",
            "base_step_time_us": b["step_time_us"], "new_step_time_us": a["step_time_us"],
            "delta_us": total, "components": components,
            "straggler_wait_measured": b["straggler_wait_us"] is not None or a["straggler_wait_us"] is not None}


def _by_scope(parts: list[dict[str, Any]]) -> dict[str, float]:
    scope = {True: "cross-node", False: "intra-node", None: "unknown"}
    out: dict[str, float] = {}
    for p in parts:
        if p["component"] != RESIDUAL:
            label = scope[p["cross_node"]]
            out[label] = out.get(label, 0.0) + p["delta_us"]
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- scaling efficiency


def scaling(base: dict[str, Any], new: dict[str, Any], facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from analyzer.model.formulas import scaling_efficiency
    b, a = facts["base"], facts["new"]
    out = {"kind": "same scale" if b["world_size"] == a["world_size"] else "weak scaling",
           "base_gpus": b["world_size"], "new_gpus": a["world_size"],
           "base_nodes": b["nodes"], "new_nodes": a["nodes"]}
    tb, ta = b["mean_step_time_us"], a["mean_step_time_us"]
    if not tb or not ta:
        return {**out, "efficiency": None, "basis": "unavailable: no step times"}
    if b["tokens_per_step"] and a["tokens_per_step"] and b["world_size"] and a["world_size"]:
        per_gpu = [t / (n * s * 1e-6) for t, n, s in ((b["tokens_per_step"], b["world_size"], tb),
                                                     (a["tokens_per_step"], a["world_size"], ta))]
        basis, unit = "tokens per step / (GPUs × mean step time)", "tokens/s"
    else:
        per_gpu = [1e6 / tb, 1e6 / ta]  # steps/s per GPU: equal per-GPU batch assumed
        basis, unit = "mean step time, assuming equal per-GPU batch (tokens per step unknown)", "steps/s"
    efficiency = scaling_efficiency(per_gpu[1], per_gpu[0])
    return {**out, "efficiency": efficiency, "lost_pct": 100.0 * (1.0 - efficiency), "basis": basis,
            "base_throughput_per_gpu": per_gpu[0], "new_throughput_per_gpu": per_gpu[1],
            "throughput_unit": unit}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
