"""The caching allocator of a simulated rank (``JobSpec.profile_memory``): its ``[memory]``
events and, from the same walk, the truth every measured figure is checked against.

The model (docs/models.md §9): the static state is held throughout (16Ψ bytes under DDP,
16Ψ/g sharded over the shard group g under FSDP: bf16 parameters and gradients, fp32 AdamW
master, m and v); the forward pass saves s·b·h·34 bytes of activations per transformer layer
(Korthikanti et al. 2022, bf16 with FlashAttention: no 5·a·s/h term), spread over its forward
ops, and the backward pass frees them over its autograd functions; each FSDP all-gather holds
the unit's unsharded parameters (its output bytes) until the gather two later in the same pass
(the current unit and the prefetched one) or the pass's end; without a wrap policy the one
unit is the whole model. Reserved memory is the allocator's segments: allocated rounded up to
2 MiB, never given back. Every value is an integer, so the truth is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.model import formulas as models

from .layout import model_params
from .programs import Program
from .spec import DTYPE_BYTES

SEGMENT = 2 << 20  # the caching allocator's large-segment granularity
MIB = 1 << 20
FORWARD_ALLOCATING = ("aten::linear", "aten::gelu", "aten::layer_norm", "aten::scaled_dot_product_attention")
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
RECOMPUTE = BACKWARD_PREFIX + "CheckpointFunctionBackward"
_GATHER_KINDS = ("allgather",)


@dataclass(frozen=True)
class AllocatorEvent:
    ts_ns: int
    delta: int
    allocated: int
    reserved: int
    thread: str  # main | autograd: the thread whose op allocates or frees


Change = tuple[int, int, int, str]  # (ts, order, delta, thread)


def static_bytes(program: Program, rank: int) -> int:
    spec = program.spec
    psi = sum(p.numel for p in model_params(spec))
    shard = program.groups.of("shard", 0).size if spec.strategy != "ddp" else 1
    skew = int(spec.memory_skew_mb * MIB) if rank in spec.memory_skew_ranks else 0
    return 16 * psi // shard + skew


def activation_bytes_per_layer(program: Program) -> int:
    spec = program.spec  # FlashAttention kernels: no attention scores saved
    return int(models.activation_bytes_per_layer(spec.seq_len, spec.micro_batch, spec.hidden,
                                                 spec.hidden // spec.head_dim, flash=True))


def allocator_events(program: Program, rank: int) -> list[AllocatorEvent]:
    """The rank's allocator events over its recorded steps, in time order."""
    spec = program.spec
    changes: list[Change] = []  # (ts, order: frees first, delta; 2: empty_cache, thread)
    first: list[tuple[int, int, int]] | None = None
    for _, rec in sorted(program.step_ranges.items()):
        start, end = int(rec.start[rank]), int(rec.end[rank])
        step = _step_changes(program, rank, start, end)
        if step and spec.memory_leak_mb:  # kept for good, as the step's first allocation
            step.append((min(c[0] for c in step), 1, int(spec.memory_leak_mb * MIB), "main"))
        if step and spec.empty_cache:  # after the step's last free
            step.append((max(c[0] for c in step), 2, 0, "main"))
        changes += step
        first = sorted(step) if first is None else first
    changes.sort(key=lambda c: (c[0], c[1]))
    held = static_bytes(program, rank)
    # Profiling starts after warm-up steps: the cache already holds the first step's peak.
    reserved = _segments(_first_step_peak(held, first or []))
    out = []
    for ts, order, delta, thread in changes:
        if order == 2:  # empty_cache gives every free segment back to the driver (no event of its
            reserved = _segments(held)  # own: the next event's reserved total shows the drop)
            continue
        held += delta
        reserved = max(reserved, _segments(held))
        out.append(AllocatorEvent(ts, delta, held, reserved, thread))
    return out


def _first_step_peak(held: int, changes: list[Change]) -> int:
    peak = held
    for _, _, delta, _ in changes:
        held += delta
        peak = max(peak, held)
    return peak


def _segments(nbytes: int) -> int:
    return -(-nbytes // SEGMENT) * SEGMENT


def _step_changes(program: Program, rank: int, start: int, end: int) -> list[Change]:
    inside = [rec for rec in program.eng.cpu_ranges
              if rec.recorded and start <= int(rec.start[rank]) <= end]
    forward = sorted(int(rec.start[rank]) for rec in inside
                     if rec.thread == "main" and rec.name in FORWARD_ALLOCATING)
    backward = sorted(int(rec.end[rank]) for rec in inside
                      if rec.name.startswith(BACKWARD_PREFIX) and rec.end is not None and rec.name != RECOMPUTE)
    if not forward or not backward:
        return []
    total = saved_bytes_per_layer(program) * program.spec.n_layers
    changes = [(ts, 1, part, "main") for ts, part in zip(forward, _split(total, len(forward)))]
    changes += [(ts, 0, -part, "autograd") for ts, part in zip(backward, _split(total, len(backward)))]
    changes += _recomputed(program, rank, inside)
    return changes + _gathers(program, rank, inside, min(backward[0], _first_backward_gather(program, rank, inside)),
                              end)


def saved_bytes_per_layer(program: Program) -> int:
    """What forward keeps per layer: its activations, or under checkpointing its input only."""
    spec = program.spec
    if spec.activation_checkpointing:
        return int(models.recompute_activation_bytes_per_layer(spec.seq_len, spec.micro_batch, spec.hidden))
    return activation_bytes_per_layer(program)


def _recomputed(program: Program, rank: int, inside: list) -> list[Change]:
    """Checkpointing: each recompute re-materializes the layer's activations, held through its
    backward until the next layer's recompute starts (or the last one's backward ends)."""
    ranges = sorted((int(rec.start[rank]), int(rec.end[rank])) for rec in inside if rec.name == RECOMPUTE)
    if not ranges:
        return []
    per_layer = activation_bytes_per_layer(program)
    ends = [start for start, _ in ranges[1:]] + [max(int(rec.end[rank]) for rec in inside if rec.end is not None)]
    return [c for (start, _), end in zip(ranges, ends)
            for c in ((start, 1, per_layer, "autograd"), (end, 0, -per_layer, "autograd"))]


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integers that add up to it exactly."""
    base = total // parts
    return [base] * (parts - 1) + [total - base * (parts - 1)]


def _gather_calls(program: Program, rank: int, inside: list) -> list[tuple[int, int]]:
    """(start, gathered bytes) of the step's all-gathers, from their record_param_comms."""
    calls = [(int(rec.start[rank]), rec.comm.out_nelems * DTYPE_BYTES[rec.comm.dtype]) for rec in inside
             if rec.comm is not None and rec.comm.kind in _GATHER_KINDS and rec.name == "record_param_comms"]
    return sorted(calls)


def _first_backward_gather(program: Program, rank: int, inside: list) -> int:
    backward = [int(rec.start[rank]) for rec in inside if rec.name.startswith(BACKWARD_PREFIX)]
    first = min(backward) if backward else 2**62
    later = [ts for ts, _ in _gather_calls(program, rank, inside) if ts >= first]
    return min([first] + later)


def _gathers(program: Program, rank: int, inside: list, backward_from: int, end: int) -> list[Change]:
    """Each pass's gathered units: held until the gather two later in the pass, or its end."""
    changes: list[Change] = []
    calls = _gather_calls(program, rank, inside)
    for in_pass, until, thread in (([c for c in calls if c[0] < backward_from], backward_from, "main"),
                                   ([c for c in calls if c[0] >= backward_from], end, "autograd")):
        for k, (ts, nbytes) in enumerate(in_pass):
            freed = in_pass[k + 2][0] if k + 2 < len(in_pass) else until
            changes += [(ts, 1, nbytes, thread), (freed, 0, -nbytes, thread)]
    return changes


def memory_truth(program: Program, rank: int) -> dict:
    """Per recorded step: allocated at its start, its peak and at its end, peak reserved."""
    events = allocator_events(program, rank)
    held = static_bytes(program, rank)
    reserved = events[0].reserved if events else _segments(held)
    steps = []
    k = 0
    for step, rec in sorted(program.step_ranges.items()):
        start, end = int(rec.start[rank]), int(rec.end[rank])
        while k < len(events) and events[k].ts_ns < start:
            held, reserved = events[k].allocated, events[k].reserved
            k += 1
        first, peak, peak_reserved = held, held, reserved
        while k < len(events) and events[k].ts_ns <= end:
            held, reserved = events[k].allocated, events[k].reserved
            peak, peak_reserved = max(peak, held), max(peak_reserved, reserved)
            k += 1
        steps.append({"step": step, "start_allocated_bytes": first, "peak_allocated_bytes": peak,
                      "end_allocated_bytes": held, "peak_reserved_bytes": peak_reserved})
    return {"static_bytes": static_bytes(program, rank), "activation_bytes_per_layer": activation_bytes_per_layer(program),
            "events": len(events), "steps": steps}
