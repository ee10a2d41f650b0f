"""Synthetic jobs beyond data parallelism, with truth: tensor parallel (FSDP2 + TP on a 2-D mesh,
Megatron-style), a pipeline of send/recv stages, expert parallel with DeepEP dispatch/combine
kernels, custom all-reduce kernels, RCCL names.

Unlike the DDP/FSDP simulator (analyzer.synth.programs), these are laid out by hand: every rank
runs the same fixed schedule (durations in whole µs, no noise, no skew), so the figures the
analysis must find follow from the layout itself. The truth holds what the layout implies: each
group's role and each dimension's size (from the construction, not from any description), the
strategy name, the communication libraries, and per rank the timeline metrics computed with the
generator's own interval algebra (analyzer.synth.truth).

    write_parallel_job(PARALLEL_SCENARIOS["pp_gpipe_4stage"], "out/pp")   # rank-{r}.json.gz + truth.json
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .job import write_folder
from .kineto import autograd_tid, os_pid, us
from .truth import timeline_metrics

NS = 1000  # layouts are in µs; events in integer ns
COMPUTE_STREAM, DP_STREAM, TP_STREAM, EP_STREAM, SEND_STREAM, RECV_STREAM = 7, 20, 21, 30, 40, 41
NCCL = {
    "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "allgather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "send": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "recv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
}
RCCL_GENERIC = "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"
C10D_NAME = {"allreduce": "allreduce", "allgather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
             "send": "send", "recv": "recv"}
DEEPEP_DISPATCH = "deep_ep::intranode::dispatch<__nv_bfloat16, 8, 768>(int4*, float*, int*, int64_t*)"
DEEPEP_COMBINE = "deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*, int const*)"
CUSTOM_AR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, int)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
DEVICES = {"H100": "NVIDIA H100 80GB HBM3", "MI300X": "AMD Instinct MI300X"}


@dataclass(frozen=True)
class ParallelGroup:
    name: str
    desc: str
    ranks: tuple[int, ...]
    role: str  # the truth: what the construction uses the group for


@dataclass(frozen=True)
class ParallelSpec:
    name: str
    layout: str  # fsdp2_tp | megatron_tp | pipeline | expert | custom_allreduce | rccl_ddp
    world_size: int = 8
    gpus_per_node: int = 8
    tp: int = 1
    pp: int = 1
    microbatches: int = 4
    layers: int = 4
    steps: int = 2
    first_step: int = 3
    device: str = "H100"
    ep_overlapped: bool = True  # expert: dispatch/combine on their own stream under compute
    descriptions: bool = True  # group descriptions in pg_config / record_param_comms
    note: str = ""
    # pipeline: one micro-batch's forward, backward and stage-to-stage transfer (whole µs); a job
    # re-run with more micro-batches of the same batch scales them down (tests/test_rules_gains.py)
    forward_us: int = 200
    backward_us: int = 400
    transfer_us: int = 20
    # every NCCL collective and transfer takes this many times as long: a link at 1/k of its
    # bandwidth, α included (the gate's planted regression, tests/test_busbw.py); DeepEP and custom
    # all-reduce kernels, in no process group, keep theirs
    comm_slowdown: int = 1
    # pipeline: each send's / recv's record_param_comms names its ends by global rank (``Src Rank``
    # / ``Dst Rank``, torch >= 2.5), so the analysis can pair them; off in the committed samples
    peer_fields: bool = False

    def to_dict(self) -> dict:
        # Knobs added after the committed samples were written are left out at their defaults,
        # so those samples' truth still describes them.
        return {k: v for k, v in asdict(self).items() if not (k in _LATER_KNOBS and v == _LATER_KNOBS[k])}


_LATER_KNOBS = {"forward_us": 200, "backward_us": 400, "transfer_us": 20, "comm_slowdown": 1, "peer_fields": False}


@dataclass
class ParallelOp:
    stream: int
    start: int  # µs from the step start
    dur: int
    name: str
    kind: str  # compute | comm
    thread: str = "main"  # launching thread: main | autograd
    coll: str | None = None  # NCCL collective (record_param_comms); None: no CPU-side metadata
    group: ParallelGroup | None = None
    nelems: int = 0
    marker: str | None = None  # CPU range around the launch (FSDP2 / Megatron / pipeline / MoE)
    library: str = "nccl"
    peer: int | None = None  # a send's / recv's other end (global rank)


@dataclass
class StepPlan:
    ops: list[ParallelOp] = field(default_factory=list)
    length: int = 0  # µs: the next step starts this much later


# ---- layouts: one step of one rank --------------------------------------------------------------
def _groups(spec: ParallelSpec, rank: int) -> tuple[ParallelGroup, dict[str, ParallelGroup]]:
    """The world group and this rank's groups by role (torch numbers groups in creation order)."""
    world = ParallelGroup("0", "default_pg", tuple(range(spec.world_size)), "world")
    n, tp = spec.world_size, spec.tp
    own: dict[str, ParallelGroup] = {}
    if spec.layout in ("fsdp2_tp", "megatron_tp") and tp > 1:
        dp_desc, tp_desc = (("mesh_dp_shard", "mesh_tp") if spec.layout == "fsdp2_tp"
                            else ("DATA_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP"))
        dp_role = "dp_shard" if spec.layout == "fsdp2_tp" else "dp"
        tp_index, dp_index = rank // tp, rank % tp
        own["tp"] = ParallelGroup(str(1 + tp_index), tp_desc, tuple(range(tp_index * tp, tp_index * tp + tp)), "tp")
        if n > tp:
            own[dp_role] = ParallelGroup(str(1 + n // tp + dp_index), dp_desc, tuple(range(dp_index, n, tp)), dp_role)
    if not spec.descriptions:
        own = {k: ParallelGroup(g.name, "undefined", g.ranks, g.role) for k, g in own.items()}
    return world, own


def plan_step(spec: ParallelSpec, rank: int) -> StepPlan:
    return {"fsdp2_tp": _fsdp2_tp, "megatron_tp": _megatron_tp, "pipeline": _pipeline, "expert": _expert,
            "custom_allreduce": _custom_allreduce, "rccl_ddp": _rccl_ddp}[spec.layout](spec, rank)


def _fsdp2_tp(spec: ParallelSpec, rank: int) -> StepPlan:
    """Forward: each layer's FSDP all-gather prefetched under the previous layer (the first one
    exposed), 300 µs of compute, a 30 µs TP all-reduce the next layer waits for. Backward:
    600 µs per layer, a 30 µs TP all-reduce, the layer's reduce-scatter under the next layer's
    compute (the last one exposed). Optimizer 100 µs."""
    _, g = _groups(spec, rank)
    plan, t = StepPlan(), 0
    ops = plan.ops
    k = spec.comm_slowdown
    ops.append(ParallelOp(DP_STREAM, 0, 40 * k, NCCL["allgather"], "comm", coll="allgather", group=g["dp_shard"],
                  nelems=1 << 20, marker="FSDP::all_gather (layers.0)"))
    t = 40 * k
    for i in range(spec.layers):
        ops.append(ParallelOp(COMPUTE_STREAM, t, 300, GEMM, "compute", marker=f"FSDP::pre_forward (layers.{i})"))
        if i + 1 < spec.layers:
            ops.append(ParallelOp(DP_STREAM, t + 10, 40 * k, NCCL["allgather"], "comm", coll="allgather", group=g["dp_shard"],
                          nelems=1 << 20, marker=f"FSDP::all_gather (layers.{i + 1})"))
        t += 300
        ops.append(ParallelOp(TP_STREAM, t, 30 * k, NCCL["allreduce"], "comm", coll="allreduce", group=g["tp"],
                      nelems=1 << 18))
        t += 30 * k
    for i in reversed(range(spec.layers)):
        ops.append(ParallelOp(COMPUTE_STREAM, t, 600, GEMM, "compute", thread="autograd",
                      marker="autograd::engine::evaluate_function: MmBackward0"))
        t += 600
        ops.append(ParallelOp(TP_STREAM, t, 30 * k, NCCL["allreduce"], "comm", thread="autograd", coll="allreduce",
                      group=g["tp"], nelems=1 << 18))
        t += 30 * k
        ops.append(ParallelOp(DP_STREAM, t, 50 * k, NCCL["reduce_scatter"], "comm", thread="autograd", coll="reduce_scatter",
                      group=g["dp_shard"], nelems=1 << 20, marker=f"FSDP::post_backward_reduce (layers.{i})"))
    t += 50 * k  # the last reduce-scatter has no compute after it
    ops.append(ParallelOp(COMPUTE_STREAM, t, 100, "multi_tensor_apply_kernel", "compute", marker="Optimizer.step#AdamW.step"))
    plan.length = t + 100 + 20
    return plan


def _megatron_tp(spec: ParallelSpec, rank: int) -> StepPlan:
    """Megatron-style TP: per layer two forward all-reduces (attention and MLP outputs, inside
    _ReduceFromModelParallelRegion) the next kernel waits for; in backward one all-reduce per
    layer (_CopyToModelParallelRegion's backward): 30 µs each inside a node, 120 µs when the
    TP group spans nodes (α and bandwidth of the NIC); with a DP dimension, the layer's
    gradient bucket all-reduce (80 µs) under the next layer's backward (the last one exposed)."""
    _, g = _groups(spec, rank)
    plan, t = StepPlan(), 0
    ar = (30 if spec.tp <= spec.gpus_per_node else 120) * spec.comm_slowdown  # NVLink, or the NIC's α and bandwidth
    bucket = 80 * spec.comm_slowdown
    for _ in range(spec.layers):
        for _half in range(2):
            plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 150, GEMM, "compute"))
            t += 150
            plan.ops.append(ParallelOp(TP_STREAM, t, ar, NCCL["allreduce"], "comm", coll="allreduce", group=g["tp"],
                               nelems=1 << 18, marker="_ReduceFromModelParallelRegion"))
            t += ar
    for _ in range(spec.layers):
        plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 600, GEMM, "compute", thread="autograd",
                           marker="autograd::engine::evaluate_function: LinearWithGradAccumulationAndAsyncCommunicationBackward"))
        t += 600
        plan.ops.append(ParallelOp(TP_STREAM, t, ar, NCCL["allreduce"], "comm", thread="autograd", coll="allreduce",
                           group=g["tp"], nelems=1 << 18,
                           marker="autograd::engine::evaluate_function: _CopyToModelParallelRegionBackward"))
        t += ar
        if "dp" in g:  # overlap_grad_reduce: the layer's gradient bucket under the next layer
            plan.ops.append(ParallelOp(DP_STREAM, t, bucket, NCCL["allreduce"], "comm", thread="autograd", coll="allreduce",
                               group=g["dp"], nelems=1 << 22, marker="autograd::engine::evaluate_function: AccumulateGrad"))
    if "dp" in g:
        t += bucket  # the last bucket has no compute after it
    plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 100, "multi_tensor_apply_kernel", "compute", marker="Optimizer.step#AdamW.step"))
    plan.length = t + 120
    return plan


def _pipeline(spec: ParallelSpec, rank: int) -> StepPlan:
    """GPipe over ``pp`` stages (one per rank), ``microbatches`` micro-batches: forward F = 200,
    backward B = 400, each activation/gradient transfer c = 20 µs (``forward_us``, ...). Stage s runs micro-batch j's
    forward at tF(s, j) = max(tF(s-1, j) + F + c, tF(s, j-1) + F) and its backward at
    tB(s, j) = max(tB(s+1, j) + B + c, tB(s, j-1) + B), the last stage starting backward when its
    forwards are done. As NCCL does, a posted recv spins on the GPU until its data arrives (the
    host runs ahead): a stage waiting for its neighbour is busy in a recv kernel, not idle; a
    send runs c after the compute it follows. Each stage runs its optimizer (50 µs) after its
    last backward; a later stage then already posts the next step's first recv (launched in
    this step: the host runs ahead), which spins until stage s-1 sends in the next step.
    Ideal bubble: (p - 1)/(m + p - 1) of the pipeline time."""
    p, m, s = spec.pp, spec.microbatches, rank
    f, b, c = spec.forward_us, spec.backward_us, spec.transfer_us * spec.comm_slowdown
    world = _groups(spec, rank)[0]
    tf = [[0] * m for _ in range(p)]
    tb = [[0] * m for _ in range(p)]
    for st in range(p):
        for j in range(m):
            tf[st][j] = max(tf[st - 1][j] + f + c if st else 0, tf[st][j - 1] + f if j else 0)
    for st in reversed(range(p)):
        for j in range(m):
            after = tb[st + 1][j] + b + c if st < p - 1 else tf[p - 1][m - 1] + f
            tb[st][j] = max(after, tb[st][j - 1] + b if j else 0)
    plan, recv_free = StepPlan(), 0

    def p2p(kind, start, end, thread, marker, peer):
        stream = RECV_STREAM if kind == "recv" else SEND_STREAM
        plan.ops.append(ParallelOp(stream, start, end - start, NCCL[kind], "comm", thread=thread, coll=kind, group=world,
                           nelems=1 << 16, marker=marker, peer=peer))

    for j in range(m):
        if s > 0 and j > 0:  # posted when the previous recv finished; the data lands at tF(s, j)
            p2p("recv", recv_free, tf[s][j], "main", f"Forward {j}", s - 1)
        recv_free = tf[s][j]
        plan.ops.append(ParallelOp(COMPUTE_STREAM, tf[s][j], f, GEMM, "compute", marker=f"Forward {j}"))
        if s < p - 1:
            p2p("send", tf[s][j] + f, tf[s][j] + f + c, "main", f"Forward {j}", s + 1)
    # the host posts the backward recvs from the main thread once every forward is queued
    recv_free = max(recv_free, max(op.start for op in plan.ops) + 3)
    for j in range(m):
        if s < p - 1:
            p2p("recv", recv_free, tb[s][j], "main", f"Backward {j}", s + 1)
            recv_free = tb[s][j]
        plan.ops.append(ParallelOp(COMPUTE_STREAM, tb[s][j], b, GEMM, "compute", thread="autograd",
                           marker="autograd::engine::evaluate_function: MmBackward0"))
        if s > 0:
            p2p("send", tb[s][j] + b, tb[s][j] + b + c, "main", f"Backward {j}", s - 1)
    done = tb[s][m - 1] + b + 3  # the host queues the optimizer after the last send
    plan.ops.append(ParallelOp(COMPUTE_STREAM, done, 50, "multi_tensor_apply_kernel", "compute",
                       marker="Optimizer.step#AdamW.step"))
    plan.length = tb[0][m - 1] + b + 3 + 50  # stage 0 finishes last
    if s > 0:  # the next step's first recv, posted now, lands at tF(s, 0) of the next step
        p2p("recv", done + 50, plan.length + tf[s][0], "main", "Forward 0", s - 1)
    return plan


def _expert(spec: ParallelSpec, rank: int) -> StepPlan:
    """MoE layers with DeepEP intranode dispatch/combine (no CPU-side collective metadata).
    Overlapped: dispatch (60 µs) runs on its own stream under the attention compute (200 µs)
    and combine (60 µs) under the shared expert (50 µs): 10 µs of each combine exposed.
    Not overlapped: both run on the compute stream, in line with it. Backward mirrors forward
    (combine's backward is a dispatch and vice versa) with compute twice as long."""
    plan, t = StepPlan(), 0
    stream = EP_STREAM if spec.ep_overlapped else COMPUTE_STREAM
    for phase, thread, scale in (("forward", "main", 1), ("backward", "autograd", 2)):
        bwd = "autograd::engine::evaluate_function: " if phase == "backward" else ""
        for _ in range(spec.layers):
            plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 200 * scale, GEMM, "compute", thread=thread, marker=f"{bwd}MmBackward0" if bwd else None))
            if spec.ep_overlapped:
                plan.ops.append(ParallelOp(stream, t + 20, 60, DEEPEP_DISPATCH, "comm", thread=thread, marker="dispatch", library="deepep"))
                t += 200 * scale
            else:
                t += 200 * scale
                plan.ops.append(ParallelOp(stream, t, 60, DEEPEP_DISPATCH, "comm", thread=thread, marker="dispatch", library="deepep"))
                t += 60
            plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 300 * scale, "fused_moe_kernel", "compute", thread=thread))
            t += 300 * scale
            if spec.ep_overlapped:
                plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 50, "shared_expert_gemm", "compute", thread=thread))
                plan.ops.append(ParallelOp(stream, t, 60, DEEPEP_COMBINE, "comm", thread=thread, marker="combine", library="deepep"))
                t += 60
            else:
                plan.ops.append(ParallelOp(stream, t, 60, DEEPEP_COMBINE, "comm", thread=thread, marker="combine", library="deepep"))
                t += 60
    plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 100, "multi_tensor_apply_kernel", "compute", marker="Optimizer.step#AdamW.step"))
    plan.length = t + 120
    return plan


def _custom_allreduce(spec: ParallelSpec, rank: int) -> StepPlan:
    """Tensor-parallel forward passes (inference-style) whose all-reduces are vLLM's custom
    one-stage kernel on the compute stream: each 300 µs layer is followed by a 25 µs reduce."""
    plan, t = StepPlan(), 0
    for _ in range(spec.layers):
        plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 300, GEMM, "compute"))
        plan.ops.append(ParallelOp(COMPUTE_STREAM, t + 300, 25, CUSTOM_AR, "comm", library="custom_allreduce"))
        t += 325
    plan.length = t + 50
    return plan


def _rccl_ddp(spec: ParallelSpec, rank: int) -> StepPlan:
    """DDP on AMD GPUs: RCCL names every kernel ncclDevKernel_Generic; each backward layer's
    bucket all-reduce (80 µs) runs under the next layer's backward (the last one exposed)."""
    world, _ = _groups(spec, rank)
    plan, t = StepPlan(), 0
    plan.ops.append(ParallelOp(COMPUTE_STREAM, 0, 300 * spec.layers, GEMM, "compute", marker="DistributedDataParallel.forward"))
    t = 300 * spec.layers
    for _ in range(spec.layers):
        plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 600, GEMM, "compute", thread="autograd",
                           marker="autograd::engine::evaluate_function: MmBackward0"))
        t += 600
        plan.ops.append(ParallelOp(DP_STREAM, t, 80 * spec.comm_slowdown, RCCL_GENERIC, "comm", thread="autograd",
                           coll="allreduce", group=world, nelems=1 << 22, library="rccl"))
    t += 80 * spec.comm_slowdown
    plan.ops.append(ParallelOp(COMPUTE_STREAM, t, 100, "multi_tensor_apply_kernel", "compute", marker="Optimizer.step#AdamW.step"))
    plan.length = t + 120
    return plan


# ---- rendering ----------------------------------------------------------------------------------
class _Writer:
    def __init__(self, spec: ParallelSpec, rank: int):
        self.spec, self.rank = spec, rank
        self.pid, self.events, self.corr = os_pid(rank), [], 0
        self.tids = {"main": self.pid, "autograd": autograd_tid(rank)}
        self.last_launch: dict[str, int] = {}

    def cpu(self, name: str, start_ns: int, dur_ns: int, thread: str, cat: str = "cpu_op", **args) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tids[thread],
                            "ts": us(start_ns), "dur": us(dur_ns), "args": args})

    def _peer_args(self, op: ParallelOp) -> dict[str, int]:
        """A send's / recv's peer by global rank, when the spec records it (``peer_fields``), as
        torch's profiler writes it: ``Dst Rank`` on a send, ``Src Rank`` on a recv (the peer's
        global rank, from the group's ranks and record_param_comms' ``Rank``)."""
        if not self.spec.peer_fields or op.peer is None:
            return {}
        return {"Dst Rank": op.peer} if op.coll == "send" else {"Src Rank": op.peer}

    def op(self, op: ParallelOp, step_ns: int) -> None:
        start = step_ns + op.start * NS
        # launched 9 µs before it runs, and at least 2 µs after the thread's previous launch
        # (each launch's CPU ranges then enclose it alone)
        launch = max(start - 9 * NS, self.last_launch.get(op.thread, -10**18) + 2 * NS)
        if launch > start - NS:
            raise ValueError(f"{self.spec.name}: rank {self.rank}: {op.name} at {op.start} µs cannot be launched in time")
        self.last_launch[op.thread] = launch
        if op.marker:
            cat = "user_annotation" if op.marker in ("dispatch", "combine") or op.marker.startswith(
                ("Forward ", "Backward ", "FSDP::")) else "cpu_op"
            self.cpu(op.marker, launch - 300, 1600, op.thread, cat)
        if op.coll:
            group = op.group
            self.cpu("record_param_comms", launch - 200, 1300, op.thread, **{
                "Collective name": C10D_NAME[op.coll], "dtype": "BFloat16", "In msg nelems": op.nelems,
                "Out msg nelems": op.nelems * (len(group.ranks) if op.coll == "allgather" else 1),
                "Group size": len(group.ranks), "Process Group Name": group.name,
                "Process Group Description": group.desc,
                "Process Group Ranks": "[" + ", ".join(map(str, group.ranks)) + "]",
                **self._peer_args(op)})
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid,
                            "tid": self.tids[op.thread], "ts": us(launch), "dur": us(NS),
                            "args": {"correlation": self.corr, "cbid": 211}})
        self.events.append({"ph": "X", "cat": "kernel", "name": op.name, "pid": self.rank % self.spec.gpus_per_node,
                            "tid": op.stream, "ts": us(start), "dur": us(op.dur * NS),
                            "args": {"device": self.rank % self.spec.gpus_per_node, "stream": op.stream,
                                     "correlation": self.corr}})


def render(spec: ParallelSpec, rank: int) -> tuple[dict, list[tuple[int, int, str]]]:
    """(Kineto trace of one rank, its GPU intervals in ns with kind) for the truth."""
    w = _Writer(spec, rank)
    intervals = []
    step_ns = 10**12  # a fixed origin (ns)
    plan = plan_step(spec, rank)
    if spec.layout == "pipeline" and rank > 0:  # the first recv, posted in the unrecorded step before
        first = plan.ops[-1]
        w.op(ParallelOp(first.stream, first.start - plan.length, first.dur, first.name, "comm", coll="recv",
                group=first.group, nelems=first.nelems, marker="Forward 0", peer=first.peer), step_ns)
        intervals.append((step_ns + (first.start - plan.length) * NS,
                          step_ns + (first.start - plan.length + first.dur) * NS, "comm"))
    for k in range(spec.steps):
        w.cpu(f"ProfilerStep#{spec.first_step + k}", step_ns - 30 * NS, plan.length * NS, "main", "user_annotation")
        for op in sorted(plan.ops, key=lambda o: o.start):  # the host launches in time order
            w.op(op, step_ns)
            intervals.append((step_ns + op.start * NS, step_ns + (op.start + op.dur) * NS, op.kind))
        step_ns += plan.length * NS
    world, own = _groups(spec, rank)
    info = {"backend": "nccl", "rank": rank, "world_size": spec.world_size,
            "pg_config": [{"pg_name": g.name, "pg_desc": g.desc, "pg_size": len(g.ranks), "ranks": list(g.ranks),
                           "backend_config": "cuda:nccl"} for g in (world, *own.values())],
            "nccl_version": "2.27.5", "host_name": f"node{rank // spec.gpus_per_node}"}
    devices = [{"id": d, "name": DEVICES[spec.device], "totalGlobalMem": 85520809984}
               for d in range(min(spec.world_size, spec.gpus_per_node))]
    events = sorted(w.events, key=lambda e: e["ts"])
    return {"schemaVersion": 1, "distributedInfo": info, "deviceProperties": devices, "traceEvents": events}, intervals


def build_parallel_truth(spec: ParallelSpec) -> dict:
    """What the analysis must find, from the construction."""
    ranks = {}
    for rank in range(spec.world_size):
        _, intervals = render(spec, rank)
        starts = np.array([s for s, _, _ in intervals], dtype=np.int64)
        ends = np.array([e for _, e, _ in intervals], dtype=np.int64)
        kinds = np.array([k for _, _, k in intervals])
        ranks[str(rank)] = timeline_metrics(starts, ends, kinds)
    plan = plan_step(spec, 0)
    roles: dict[str, str] = {}
    for rank in range(spec.world_size):
        world, own = _groups(spec, rank)
        for group in own.values():
            roles[group.name] = group.role
    roles.update(_unnamed_roles(spec))
    sizes = {"fsdp2_tp": {"dp_shard": spec.world_size // spec.tp, "tp": spec.tp},
             "megatron_tp": {"tp": spec.tp, **({"dp": spec.world_size // spec.tp} if spec.world_size > spec.tp else {})},
             "pipeline": {"pp": spec.pp}, "expert": {"ep": spec.world_size},
             "custom_allreduce": {"tp": spec.world_size}, "rccl_ddp": {"dp": spec.world_size}}[spec.layout]
    strategy = {"fsdp2_tp": "fsdp2+tp", "megatron_tp": "megatron tp", "pipeline": "pp", "expert": "expert parallel",
                "custom_allreduce": "tp", "rccl_ddp": "ddp"}[spec.layout]
    truth = {"spec": spec.to_dict(), "roles": roles, "parallelism": sizes, "strategy": strategy,
             "libraries": sorted({op.library for op in plan.ops if op.kind == "comm"}),
             "step_time_us": plan.length, "ranks": ranks}
    if spec.layout == "pipeline":
        p, m = spec.pp, spec.microbatches
        truth["ideal_bubble_fraction"] = round((p - 1) / (m + p - 1), 6)
    return truth


def _unnamed_roles(spec: ParallelSpec) -> dict[str, str]:
    """Roles of what runs outside any declared group: the world group's, and kernels with no
    CPU-side metadata (their group key is ``unknown:<collective>``)."""
    return {"fsdp2_tp": {}, "megatron_tp": {},
            "pipeline": {"0": "pp"}, "expert": {"unknown:alltoall": "ep"},
            "custom_allreduce": {"unknown:allreduce": "tp"}, "rccl_ddp": {"0": "dp"}}[spec.layout]


def write_parallel_job(spec: ParallelSpec, outdir: str | Path) -> Path:
    """rank-{r}.json.gz per rank and truth.json; identical bytes every time."""
    traces = {rank: render(spec, rank)[0] for rank in range(spec.world_size)}
    return write_folder(outdir, traces, build_parallel_truth(spec))


PARALLEL_SCENARIOS: dict[str, ParallelSpec] = {s.name: s for s in [
    ParallelSpec("fsdp2_tp_2d", "fsdp2_tp", tp=2, note="FSDP2 over mesh_dp_shard (4) x TP over mesh_tp (2)"),
    ParallelSpec("megatron_tp4_dp2", "megatron_tp", tp=4,
                 note="Megatron-style TP=4 inside a node, DP=2, forward all-reduces exposed"),
    ParallelSpec("megatron_tp8_2node", "megatron_tp", tp=8, gpus_per_node=4,
                 note="TP=8 over 2 nodes of 4 GPUs: every TP all-reduce crosses the network"),
    ParallelSpec("pp_gpipe_4stage", "pipeline", world_size=4, pp=4, microbatches=2,
                 note="GPipe, 4 stages, 2 micro-batches: bubble 3/5 of the pipeline"),
    ParallelSpec("pp_gpipe_4stage_16mb", "pipeline", world_size=4, pp=4, microbatches=16,
                 note="GPipe, 4 stages, 16 micro-batches: bubble 3/19"),
    ParallelSpec("ep_deepep_overlapped", "expert", note="DeepEP dispatch/combine on their own stream, mostly hidden"),
    ParallelSpec("ep_deepep_exposed", "expert", ep_overlapped=False,
                 note="DeepEP dispatch/combine in line with compute: all exposed"),
    ParallelSpec("tp_custom_allreduce", "custom_allreduce", steps=3, note="vLLM custom all-reduce kernels, exposed"),
    ParallelSpec("ddp_rccl_mi300x", "rccl_ddp", device="MI300X", note="DDP on MI300X: RCCL's generic kernel names"),
]}
