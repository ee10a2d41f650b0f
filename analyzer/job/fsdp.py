"""FSDP unit schedule (models.md §5) fed with one rank-step's measurements, for projections:
what the step's exposed communication becomes with other links (HYBRID_SHARD), other bytes
(bf16 reduce-scatter) or prefetch.

Forward: units all-gather then compute, one after the other. Backward: each unit all-gathers,
computes, then reduce-scatters; all-gathers and reduce-scatters share the network, so a unit's
"fetch" in the backward schedule is its all-gather plus the previous unit's reduce-scatter; the
last reduce-scatter runs after the last compute. Under HYBRID_SHARD each gradient shard is then
all-reduced across nodes on the NICs, pipelined like DDP buckets (models.md §4). Per-unit compute is the phase's measured compute split evenly.
Projections are used as differences (configuration A − configuration B on the same measured
step), so that what the model leaves out cancels.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from analyzer.model import formulas as models
from analyzer.rank.comms import DTYPE_BYTES

CommTime = Callable[[str, float], float]  # (collective kind, bytes) -> µs


@dataclass(frozen=True)
class FsdpStep:
    rank: int
    step: Any
    forward_compute_us: float
    backward_compute_us: float
    forward_ag_bytes: tuple[float, ...]
    backward_ag_bytes: tuple[float, ...]
    rs_bytes: tuple[float, ...]
    prefetch: bool

    def exposed_us(self, comm_time: CommTime, rs_scale: float = 1.0,
                   replicate_time: Callable[[float], float] | None = None,
                   prefetch: bool | None = None) -> float:
        """Modelled exposed communication of this step (µs). ``replicate_time`` (HYBRID_SHARD)
        maps a unit's reduce-scatter bytes to its replicate all-reduce time; those run on the
        NICs, a different link from the shard group's, as their own pipeline."""
        prefetch = self.prefetch if prefetch is None else prefetch
        total = 0.0
        if self.forward_ag_bytes:
            per_unit = self.forward_compute_us / len(self.forward_ag_bytes)
            total += _schedule([per_unit] * len(self.forward_ag_bytes),
                               [comm_time("allgather", b) for b in self.forward_ag_bytes], prefetch).exposed_ag_us
        rs_bytes = [b * rs_scale for b in self.rs_bytes]
        rs_times = [comm_time("reduce_scatter", b) for b in rs_bytes]
        units = max(len(self.backward_ag_bytes), len(rs_times))
        if not units:
            return total
        per_unit = self.backward_compute_us / units
        fetch = []
        for i in range(units):
            ag = comm_time("allgather", self.backward_ag_bytes[i]) if i < len(self.backward_ag_bytes) else 0.0
            previous_rs = rs_times[i - 1] if 0 < i <= len(rs_times) else 0.0
            fetch.append(ag + previous_rs)
        backward = _schedule([per_unit] * units, fetch, prefetch)
        total += backward.exposed_ag_us + (rs_times[-1] if rs_times else 0.0)
        if replicate_time and rs_times:
            # Reduce-scatter i is done about its compute's end + its own time (the last one is
            # already counted above); the replicate all-reduces then pipeline on the NICs.
            ends = backward.compute_ends_us
            ready = [ends[min(i, units - 1)] + rs_times[i] for i in range(len(rs_times))]
            tail = models.ddp_bucket_pipeline(ready, rs_bytes, ready[-1], replicate_time)
            total += tail.exposed_tail_us
        return total


def _schedule(compute_us: list[float], fetch_us: list[float], prefetch: bool) -> models.FsdpSchedule:
    # fsdp_unit_schedule maps a unit's "bytes" to its fetch time; pass the unit index as bytes.
    return models.fsdp_unit_schedule(compute_us, list(range(len(fetch_us))),
                                     lambda index: fetch_us[int(index)], prefetch)


def fsdp_steps(facts, prefetch: bool = True) -> list[FsdpStep]:
    """One FsdpStep per (rank, step) with GPU phase windows and known unit sizes."""
    passes = facts.units_by_pass()
    out = []
    for view in facts.steps:
        if "forward" not in view.windows or "backward" not in view.windows:
            continue
        fwd = passes.get((view.rank, view.step, "forward", "allgather"), [])
        bwd = passes.get((view.rank, view.step, "backward", "allgather"), [])
        rs = passes.get((view.rank, view.step, "backward", "reduce_scatter"), [])
        rows = fwd + bwd + rs
        if not rows or any(u["bytes"] is None for u in rows):
            continue
        out.append(FsdpStep(view.rank, view.step, view.windows["forward"][2], view.windows["backward"][2],
                            tuple(float(u["bytes"]) for u in fwd), tuple(float(u["bytes"]) for u in bwd),
                            tuple(float(u["bytes"]) for u in rs), prefetch))
    return out


def group_of_kind(facts, rank: int, step: Any, kind: str) -> dict[str, Any]:
    return next((c["group"] for c in facts.collectives_of(rank, step) if c["collective"] == kind), {})


def unit_links(facts, step: FsdpStep):
    """(links by collective kind, comm_time(kind, bytes) -> µs) for a step's all-gathers and
    reduce-scatters, or None when a group's α/β is unknown."""
    links = {k: facts.link(group_of_kind(facts, step.rank, step.step, k)) for k in ("allgather", "reduce_scatter")}
    if None in links.values():
        return None
    return links, lambda kind, size: links[kind].time_us(kind, size)


# d_model ≈ 128 × n_layers: the aspect ratio of GPT-3 (12288 / 96) and Llama (4096 / 32, 5120 / 40)
ASPECT_RATIO = 128


def layer_count(facts, passes: dict[tuple[int, Any], int]) -> tuple[int | None, str]:
    """Transformer blocks of the model, the units a per-layer wrap policy makes (models.md §5):
    the forward attention kernels of a steady step (one per block and pass) over its forward
    passes (``passes``: forward all-gathers per (rank, step) of a single-unit job), median over
    rank-steps; else from Ψ with d_model = 128·n_layers (Ψ ≈ 12·n_layers·d_model²); else None."""
    counts = []
    for (rank, step), n in passes.items():
        view = facts.steady_view(rank, step)
        if view is not None and view.forward_attention_kernels and n:
            counts.append(view.forward_attention_kernels / n)
    if counts:
        layers = max(1, round(statistics.median(counts)))
        return layers, "measured: forward attention kernels per forward pass (one per transformer block)"
    psi, _ = parameter_count(facts)
    if psi:
        layers = max(2, round((psi / (12 * ASPECT_RATIO ** 2)) ** (1 / 3)))
        return layers, (f"from the parameter count: Ψ = {psi:,.0f} ≈ 12·L·d² with d = {ASPECT_RATIO}·L "
                        "(no attention kernels in the trace to count the blocks)")
    return None, "neither attention kernels nor parameter sizes in the trace"


def parameter_count(facts) -> tuple[float | None, str]:
    """Ψ from one step's gradient reduce-scatters (their inputs are the unsharded gradients),
    else its forward all-gathers (outputs are the unsharded parameters)."""
    per_step: dict[tuple[int, Any], dict[str, float]] = {}
    for row in facts.rows_of_kinds(("reduce_scatter", "allgather")):
        if row["bytes"] is None:
            continue
        if row["collective"] == "allgather" and row["phase"] != "forward":
            continue
        elem = DTYPE_BYTES.get(row.get("dtype"))
        if not elem:
            continue
        slot = per_step.setdefault((row["rank"], row["step"]), {})
        slot[row["collective"]] = slot.get(row["collective"], 0.0) + row["bytes"] / elem
    for kind in ("reduce_scatter", "allgather"):
        counts = sorted(v[kind] for v in per_step.values() if kind in v)
        if counts:
            return counts[len(counts) // 2], f"{kind.replace('_', '-')} elements per step"
    return None, "no sized reduce-scatters or all-gathers"

