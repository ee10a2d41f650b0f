"""The truth a simulated job carries: metrics from the generator's own bookkeeping.

Definitions (issue 2, HTA's): per rank, over GPU activity (kernels, memcpy, memset on every
stream): span = last end - first start; busy = |union of all|; compute = |union of non-NCCL
kernels|; comm = |union of NCCL kernels|; overlap = |compute ∩ comm|; exposed = comm - overlap;
idle = span - busy; overlap_pct = 100·overlap/comm (0 when comm is 0). Per step: the GPU work
launched inside ProfilerStep#N. Exposed per phase: |union(comm kernels of that phase) \\ compute|.
This module has its own interval algebra on purpose (analyzer.base.intervals is under test).
"""

from __future__ import annotations

import numpy as np

from .engine import LAUNCH_LATENCY_NS, GpuEvent
from .layout import fsdp_units, model_params
from .memory import memory_truth
from .programs import DdpProgram, FsdpProgram, Program
from .spec import DTYPE_BYTES, TORCH_DTYPE_NAME

PHASES = ("forward", "backward", "optimizer", "other")


# ---- interval algebra (integer nanoseconds) -------------------------------------------------
def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint union of [start, end) intervals."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], e[last]


def length(iv: tuple[np.ndarray, np.ndarray]) -> int:
    return int(np.sum(iv[1] - iv[0]))


def intersection_length(a, b) -> int:
    both = merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return length(a) + length(b) - length(both)


def covered(iv, start: int, end: int) -> int:
    """How much of [start, end) the disjoint intervals iv cover."""
    return int(np.sum(np.clip(iv[1], start, end) - np.clip(iv[0], start, end)))


def clip(iv, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.clip(iv[0], start, end), np.clip(iv[1], start, end)
    keep = e > s
    return s[keep], e[keep]


def _intersect(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise overlaps of two disjoint interval sets (quadratic: the truth's sets are small)."""
    if not len(a[0]) or not len(b[0]):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s = np.maximum(a[0][:, None], b[0][None, :]).ravel()
    e = np.minimum(a[1][:, None], b[1][None, :]).ravel()
    keep = e > s
    return s[keep], e[keep]


def _minus(a, b) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the disjoint intervals a that the disjoint intervals b do not cover."""
    pieces = []
    for s, e in zip(a[0].tolist(), a[1].tolist()):
        for bs, be in zip(b[0].tolist(), b[1].tolist()):
            if be <= s or bs >= e:
                continue
            if bs > s:
                pieces.append((s, bs))
            s = max(s, be)
            if s >= e:
                break
        if e > s:
            pieces.append((s, e))
    return np.array([p[0] for p in pieces], np.int64), np.array([p[1] for p in pieces], np.int64)


def gaps(busy, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """The stretches of [start, end) that the disjoint intervals busy do not cover."""
    s, e = clip(busy, start, end)
    g_start, g_end = np.concatenate([[start], e]), np.concatenate([s, [end]])
    keep = g_end > g_start
    return g_start[keep], g_end[keep]


# ---- metrics ------------------------------------------------------------------------------
def _us(ns) -> float:
    return round(int(ns) / 1000, 3)


def timeline_metrics(starts, ends, kinds) -> dict:
    if len(starts) == 0:
        zero = {k: 0.0 for k in ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us",
                                 "idle_us", "overlap_pct")}
        return zero
    busy = merge(starts, ends)
    compute = merge(starts[kinds == "compute"], ends[kinds == "compute"])
    comm = merge(starts[kinds == "comm"], ends[kinds == "comm"])
    span = int(ends.max() - starts.min())
    overlap = intersection_length(compute, comm)
    comm_len = length(comm)
    return {
        "span_us": _us(span), "busy_us": _us(length(busy)), "compute_us": _us(length(compute)),
        "comm_us": _us(comm_len), "overlap_us": _us(overlap), "exposed_comm_us": _us(comm_len - overlap),
        "idle_us": _us(span - length(busy)), "overlap_pct": round(100.0 * overlap / comm_len, 4) if comm_len else 0.0,
    }


def phase_exposure(starts, ends, kinds, phases) -> dict:
    compute = merge(starts[kinds == "compute"], ends[kinds == "compute"])
    out = {}
    for phase in PHASES:
        sel = (kinds == "comm") & (phases == phase)
        comm = merge(starts[sel], ends[sel])
        out[phase] = _us(length(comm) - intersection_length(comm, compute))
    return out


class TruthBuilder:
    def __init__(self, program: Program):
        self.p, self.spec = program, program.spec
        gpu = program.eng.gpu
        self.starts = np.stack([e.start for e in gpu])  # events x ranks
        self.ends = self.starts + np.stack([e.dur for e in gpu])
        self.kinds = np.array([e.kind for e in gpu])
        self.steps = np.array([e.step for e in gpu])
        self.phases = np.array([e.phase for e in gpu])
        self.streams = np.array([e.stream for e in gpu])

    def build(self) -> dict:
        ranks = [self.rank_truth(r) for r in range(self.spec.world_size)]
        step_numbers = sorted(self.p.step_ranges)
        slowest = [max(rank["steps"][k]["step_time_us"] for rank in ranks) for k in range(len(step_numbers))]
        return {
            "spec": self.spec.to_dict(),
            "definitions": __doc__.split("Definitions", 1)[1].split("This module", 1)[0].strip(),
            "step_time_us": round(float(np.mean(slowest)), 3),
            "step_time_slowest_rank_us": [round(x, 3) for x in slowest],
            "model": self.model_facts(),
            "memory": self.memory_facts(),
            "topology": {
                "nodes": self.spec.n_nodes, "gpus_per_node": self.spec.ranks_per_node,
                "hosts": [self.spec.host_name(r) for r in range(self.spec.world_size)],
                "host_name_in_trace": self.spec.emit_host_name,
            },
            "groups": self.group_facts(),
            "comm_per_step": self.comm_facts(),
            "straggler": {"rank": self.spec.straggler_rank, "slowdown": self.spec.straggler_slowdown},
            "ddp_buckets": self.bucket_facts(),
            "fsdp_units": self.unit_facts(),
            "ranks": ranks,
            "collectives": self.collective_table(),
            "compute": self.compute_facts(),
        }

    # ---- per rank -----------------------------------------------------------------------
    def rank_truth(self, r: int) -> dict:
        s, e = self.starts[:, r], self.ends[:, r]
        out = {"rank": r, "host": self.spec.host_name(r), "world_size": self.spec.world_size,
               **timeline_metrics(s, e, self.kinds), "phases": phase_exposure(s, e, self.kinds, self.phases)}
        out["steps"] = []
        breakdowns = self.step_breakdowns(r)
        for step, rec in sorted(self.p.step_ranges.items()):
            sel = self.steps == step
            row = {"step": step, "step_time_us": _us(rec.end[r] - rec.start[r]),
                   **timeline_metrics(s[sel], e[sel], self.kinds[sel]),
                   "phases": phase_exposure(s[sel], e[sel], self.kinds[sel], self.phases[sel]),
                   "backward_start_us": self.first_start(r, sel & (self.phases == "backward")),
                   "forward_start_us": self.first_start(r, sel & (self.phases == "forward")),
                   "time_breakdown": breakdowns.get(step)}
            out["steps"].append(row)
        if self.spec.profile_memory:  # the allocator's figures per step (analyzer.synth.memory)
            out["memory"] = memory_truth(self.p, r)
        return out

    def step_breakdowns(self, r: int) -> dict[int, dict]:
        """Per step, the time breakdown over the step window [first GPU start of the step, that of
        the next step) (the last step: to its last GPU end): compute only, exposed communication
        split into waiting (a collective's start until its last member started, which the engine
        knows) and transfer, other GPU work, idle; idle split into the host stall in the data
        loader ("input") and gaps that began while the host was blocked in a device sync.
        Idle is first split in two: queued (the work that ended the gap had been launched and
        waited) and the host's (nothing was launched yet); input and device sync are the host's
        part."""
        s, e = self.starts[:, r], self.ends[:, r]
        busy = merge(s, e)
        compute = merge(s[self.kinds == "compute"], e[self.kinds == "compute"])
        comm = merge(s[self.kinds == "comm"], e[self.kinds == "comm"])
        comm_ev = [ev for ev in self.p.eng.gpu if ev.comm is not None]
        waits = merge(np.array([ev.start[r] for ev in comm_ev], np.int64),
                      np.array([ev.start[r] + ev.dur[r] - ev.comm.transfer_ns for ev in comm_ev], np.int64))
        loader = merge(*self._cpu_ranges(r, lambda c: c.name.startswith("enumerate(DataLoader)")))
        sync = merge(*self._host_syncs(r))
        descheduled = [c for c in self.p.eng.runtime if c.descheduled]
        contended = merge(np.array([c.start[r] for c in descheduled], np.int64),
                          np.array([c.start[r] + c.dur[r] for c in descheduled], np.int64))
        queued_parts, host_parts = self._queued_idle(r, busy)
        numbers = sorted(self.p.step_ranges)
        firsts = {n: int(s[self.steps == n].min()) for n in numbers if (self.steps == n).any()}
        out = {}
        for n in firsts:
            start = firsts[n]
            end = firsts.get(n + 1, int(e[self.steps == n].max()))
            c_len = covered(compute, start, end)
            m_w, c_w = clip(comm, start, end), clip(compute, start, end)
            exposed = length(m_w) - intersection_length(m_w, c_w)
            p_w = clip(waits, start, end)
            wait = length(p_w) - intersection_length(p_w, c_w)
            b_len = covered(busy, start, end)
            idle = gaps(busy, start, end)
            # Idle in two: the host's (nothing launched yet) and queued (launched work waiting).
            queued = {kind: clip(part, start, end) for kind, part in queued_parts.items()}
            all_queued = merge(np.concatenate([q[0] for q in queued.values()]),
                               np.concatenate([q[1] for q in queued.values()]))
            host_idle = merge(*_intersect(idle, host_parts))
            after_sync = np.array([covered(sync, g - 1, g) > 0 for g in host_idle[0]], dtype=bool)
            sync_gaps = (host_idle[0][after_sync], host_idle[1][after_sync])
            in_loader = intersection_length(host_idle, loader)
            sync_cover = merge(np.concatenate([sync_gaps[0], sync[0]]), np.concatenate([sync_gaps[1], sync[1]]))
            synced = clip(sync_cover, start, end)
            device_sync = intersection_length(host_idle, synced) - intersection_length(
                (lambda x: clip(x, start, end))(merge(*_intersect(host_idle, synced))), loader)
            # CPU contention: the host idle in descheduled calls, neither the loader's nor a sync's
            left = merge(*_intersect(host_idle, contended))
            for taken in (loader, synced):
                left = _minus(left, taken)
            out[n] = {"step_time_us": _us(end - start), "compute_only_us": _us(c_len),
                      "exposed_wait_us": _us(wait), "exposed_transfer_us": _us(exposed - wait),
                      "other_gpu_us": _us(b_len - c_len - exposed), "idle_us": _us(end - start - b_len),
                      "idle_input_us": _us(in_loader), "idle_device_sync_us": _us(device_sync),
                      "idle_queued_us": _us(length(all_queued)), "idle_queued_copy_us": _us(length(queued["memory"])),
                      "idle_queued_in_sync_us": _us(intersection_length(all_queued, sync)),
                      "idle_contention_us": _us(length(left))}
            if self.spec.host_stall_kind == "alloc":  # only then: the committed samples' truth stays as it was
                out[n]["idle_allocator_us"] = self._allocator_idle(r, host_idle, (loader, synced))
            if (self.spec.workload, self.spec.forward_marker) != ("training", "ddp"):
                out[n]["compute_by_phase_us"] = self._compute_by_phase(r, n)
        return out

    def _allocator_idle(self, r: int, host_idle, taken) -> float:
        """The host idle the data loader and the syncs leave that lies in a cudaFree or began in
        one (the free waited for the device to drain: the gap after it is the free's)."""
        frees = [c for c in self.p.eng.runtime if c.name == "cudaFree"]
        calls = merge(np.array([c.start[r] for c in frees], np.int64),
                      np.array([c.start[r] + c.dur[r] for c in frees], np.int64))
        left = host_idle
        for part in taken:
            left = _minus(left, part)
        began = np.array([covered(calls, g - 1, g) > 0 for g in left[0]], dtype=bool)
        cover = merge(np.concatenate([left[0][began], calls[0]]), np.concatenate([left[1][began], calls[1]]))
        return _us(intersection_length(left, cover))

    def _compute_by_phase(self, r: int, step: int) -> dict[str, float]:
        """The union of the step's compute kernels by the phase the program launched them in."""
        sel = (self.steps == step) & (self.kinds == "compute")
        return {phase: _us(length(merge(self.starts[sel & (self.phases == phase), r],
                                        self.ends[sel & (self.phases == phase), r])))
                for phase in ("forward", "backward", "optimizer", "other") if (sel & (self.phases == phase)).any()}

    def _queued_idle(self, r: int, busy) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]],
                                                  tuple[np.ndarray, np.ndarray]]:
        """The idle the GPU spent with work already launched, by the kind of work that ended each
        gap: from a gap's start (or the ending work's launch + the launch latency, when later)
        to its end, the ending work being, of the GPU work that starts where the gap ends, the
        earliest launched (the engine's own launch times: the runtime call of each event); and
        the rest of each gap, the host's (the GPU had nothing to run)."""
        launched = {call.corr: int(call.start[r]) for call in self.p.eng.runtime if call.launches_gpu}
        by_start: dict[int, list[tuple[int, str]]] = {}
        for ev in self.p.eng.gpu:
            by_start.setdefault(int(ev.start[r]), []).append((launched[ev.corr], ev.kind))
        parts: dict[str, list[tuple[int, int]]] = {"compute": [], "comm": [], "memory": []}
        host = []
        for gap_start, gap_end in zip(busy[1][:-1].tolist(), busy[0][1:].tolist()):
            launch, kind = min(by_start[gap_end])
            waited_from = min(max(gap_start, launch + LAUNCH_LATENCY_NS), gap_end)
            if gap_end > waited_from:
                parts[kind].append((waited_from, gap_end))
            if waited_from > gap_start:
                host.append((gap_start, waited_from))

        def columns(pairs):
            return np.array([a for a, _ in pairs], np.int64), np.array([b for _, b in pairs], np.int64)
        return {kind: columns(p) for kind, p in parts.items()}, columns(host)

    def _cpu_ranges(self, r: int, keep) -> tuple[np.ndarray, np.ndarray]:
        ranges = [c for c in self.p.eng.cpu_ranges if keep(c) and c.end is not None]
        return (np.array([c.start[r] for c in ranges], np.int64), np.array([c.end[r] for c in ranges], np.int64))

    def _host_syncs(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """The host's blocking calls: cudaStreamSynchronize and the aten::item ops around them."""
        calls = [c for c in self.p.eng.runtime if c.name == "cudaStreamSynchronize" or c.blocks]
        items = self._cpu_ranges(r, lambda c: c.name in ("aten::item", "aten::_local_scalar_dense"))
        return (np.concatenate([[c.start[r] for c in calls], items[0]]).astype(np.int64),
                np.concatenate([[c.start[r] + c.dur[r] for c in calls], items[1]]).astype(np.int64))

    def first_start(self, r: int, sel: np.ndarray) -> float | None:
        sel = sel & (self.streams == 7)
        return _us(self.starts[sel, r].min()) if sel.any() else None

    def collective_table(self) -> dict:
        """One row per NCCL kernel per rank, stored column-wise (see collective_rows)."""
        rows = self.collective_rows()
        columns = sorted({key for row in rows for key in row})
        return {"columns": columns, "rows": [[row.get(c) for c in columns] for row in rows]}

    def collective_rows(self) -> list[dict]:
        rows = []
        compute = [merge(self.starts[self.kinds == "compute", r], self.ends[self.kinds == "compute", r])
                   for r in range(self.spec.world_size)]
        backward_start = {(r, step): self.first_start(r, (self.steps == step) & (self.phases == "backward"))
                          for r in range(self.spec.world_size) for step in self.p.step_ranges}
        for ev in self.p.eng.gpu:
            if ev.comm is not None:
                rows += [self.collective_row(ev, r, compute[r], backward_start) for r in range(self.spec.world_size)]
        return rows

    def collective_row(self, ev: GpuEvent, r: int, compute, backward_start) -> dict:
        call = ev.comm
        group = self.p.groups.of(call.role, r)
        start, dur = int(ev.start[r]), int(ev.dur[r])
        row = {  # group size, description, nodes: see truth["groups"] by name
            "rank": r, "step": ev.step, "phase": ev.phase, "stream": ev.stream, "name": call.kind,
            "dtype": TORCH_DTYPE_NAME[call.dtype], "bytes": call.size_bytes, "group": group.name, "seq": call.seq,
            "start_us": _us(start), "dur_us": _us(dur), "transfer_us": _us(call.transfer_ns),
            "wait_us": _us(dur - call.transfer_ns), "exposed_us": _us(dur - covered(compute, start, start + dur)),
            "ready_us": _us(call.ready[r]), **call.tag,
        }
        bwd = backward_start.get((r, ev.step))
        if "bucket" in call.tag and bwd is not None:
            row["ready_offset_us"] = round(row["ready_us"] - bwd, 3)
            row["start_offset_us"] = round(row["start_us"] - bwd, 3)
        return row

    def compute_facts(self) -> dict:
        """Per step: the FLOPs the generator issued (each leaf op once, by the convention of
        models.md §6, from the sizes it multiplied), by family and per GEMM shape, with the
        summed duration of each op's kernels per rank (µs, a list over ranks)."""
        world = self.spec.world_size
        ops: dict[int, tuple] = {}  # id(work) -> (work, step, summed durations ns per rank)
        for ev in self.p.eng.gpu:
            if ev.work is None:
                continue
            work, step, dur = ops.get(id(ev.work), (ev.work, ev.step, np.zeros(world, np.int64)))
            ops[id(ev.work)] = (work, step, dur + ev.dur)
        steps: dict[str, dict] = {}
        for work, step, dur in ops.values():
            entry = steps.setdefault(str(step), {"flops": 0.0, "families": {}, "gemm_shapes": {}})
            entry["flops"] += work.flops
            fam = entry["families"].setdefault(work.family, {"flops": 0.0, "ops": 0, "gpu_ns": np.zeros(world, np.int64)})
            fam["flops"] += work.flops
            fam["ops"] += 1
            fam["gpu_ns"] = fam["gpu_ns"] + dur
            if work.family == "gemm":
                key = "x".join(map(str, work.shape)) + f"/{work.dtype}"
                shape = entry["gemm_shapes"].setdefault(key, {"m": work.shape[0], "n": work.shape[1], "k": work.shape[2],
                                                              "dtype": work.dtype, "flops_each": work.flops, "count": 0,
                                                              "gpu_ns": np.zeros(world, np.int64)})
                shape["count"] += 1
                shape["gpu_ns"] = shape["gpu_ns"] + dur
        for entry in steps.values():
            for cell in [*entry["families"].values(), *entry["gemm_shapes"].values()]:
                cell["gpu_us"] = [_us(v) for v in cell.pop("gpu_ns")]
            entry["families"] = dict(sorted(entry["families"].items()))
            entry["gemm_shapes"] = [entry["gemm_shapes"][k] for k in sorted(entry["gemm_shapes"])]
        return {"definitions": "FLOPs: GEMM 2·m·n·k; causal attention forward 2·b·h·s²·d (half of 4·b·h·s²·d), "
                               "backward 2.5× forward; gpu_us: the summed durations of the kernels each op launched",
                "steps": dict(sorted(steps.items(), key=lambda kv: int(kv[0])))}

    # ---- analytic facts -------------------------------------------------------------------
    def model_facts(self) -> dict:
        spec = self.spec
        params = model_params(spec)
        psi = sum(p.numel for p in params)
        per_layer = sum(p.numel for p in params if p.name.startswith("layers.0."))
        return {
            "params": psi, "params_per_layer": per_layer, "n_layers": spec.n_layers, "hidden": spec.hidden,
            "embedding_params": spec.vocab_size * spec.hidden, "n_tensors": len(params),
            "param_bytes": psi * DTYPE_BYTES[spec.param_dtype], "grad_bytes": psi * DTYPE_BYTES[spec.grad_dtype],
            "tokens_per_step_per_rank": spec.tokens_per_rank,
            "flops_per_step_per_rank": self.p.compute.flops / spec.steps,
            "model_flops_6psi_per_step_per_rank": 6.0 * psi * spec.tokens_per_rank,
            "gpu": spec.gpu_model.name, "gpu_peak_tflops": spec.gpu_model.peak_bf16_tflops,
        }

    def memory_facts(self) -> dict:
        spec = self.spec
        psi = sum(p.numel for p in model_params(spec))
        shard = self.p.groups.of("shard", 0).size if spec.strategy != "ddp" else 1
        return {
            "gpu_mem_bytes": spec.memory_bytes, "ddp_static_bytes": 16 * psi, "fsdp_static_bytes": 16 * psi // shard,
            "ddp_fits": 16 * psi <= spec.memory_bytes, "shard_group_size": shard,
        }

    def group_facts(self) -> list[dict]:
        groups = self.p.groups
        unique = {g.name: g for r in range(self.spec.world_size) for g in groups.member_groups(r)}
        out = []
        for g in sorted(unique.values(), key=lambda g: int(g.name)):
            out.append({"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "size": g.size,
                        "nodes": g.link.nodes, "cross_node": g.link.cross_node, "alpha_us": g.link.alpha_us,
                        "beta_gbps": g.link.beta_gbps, "s_star_bytes": g.link.alpha_us * g.link.beta_gbps * 1e3})
        return out

    def comm_facts(self) -> dict:
        """Per step, per rank: count, bytes (S) and ring volume sent, by collective kind."""
        out: dict[str, dict] = {}
        for call in self.p.eng.collectives:
            n = self.p.groups.of(call.role, 0).size
            hops = 2 * (n - 1) if call.kind == "allreduce" else n - 1
            row = out.setdefault(call.kind, {"count": 0, "bytes": 0, "sent_bytes": 0.0, "transfer_us": 0.0})
            row["count"] += 1
            row["bytes"] += call.size_bytes
            row["sent_bytes"] += hops / n * call.size_bytes
            row["transfer_us"] += call.transfer_ns / 1e3
        steps = self.spec.steps
        return {k: {"count": v["count"] / steps, "bytes": v["bytes"] / steps,
                    "sent_bytes": round(v["sent_bytes"] / steps, 1), "transfer_us": round(v["transfer_us"] / steps, 3)}
                for k, v in sorted(out.items())}

    def bucket_facts(self) -> list[dict] | None:
        if not isinstance(self.p, DdpProgram) or self.spec.sync_param_allreduce:
            return None  # no buckets: one all-reduce per gradient
        return [{"index": b.index, "bytes": b.nbytes, "numel": b.numel, "n_params": len(b.params),
                 "first_param": b.params[0], "last_param": b.params[-1]} for b in self.p.buckets]

    def unit_facts(self) -> list[dict] | None:
        if not isinstance(self.p, FsdpProgram):
            return None
        spec, shard = self.spec, self.p.shard_size
        return [{"index": u.index, "fqn": u.fqn, "numel": u.numel, "padded_numel": u.padded_numel,
                 "n_params": len(u.params), "allgather_bytes": u.padded_numel * DTYPE_BYTES[spec.param_dtype],
                 "reduce_scatter_bytes": u.padded_numel * DTYPE_BYTES[spec.grad_dtype]}
                for u in fsdp_units(spec, shard)]


def build_truth(program: Program) -> dict:
    return TruthBuilder(program).build()


def collective_rows(truth: dict) -> list[dict]:
    """truth["collectives"] as one dict per (kernel, rank); keys absent from a row are dropped."""
    table = truth["collectives"]
    return [{c: v for c, v in zip(table["columns"], row) if v is not None} for row in table["rows"]]
