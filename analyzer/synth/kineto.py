"""Render one rank of a simulated job as a Kineto (PyTorch profiler) Chrome-trace JSON object.

Field names follow libkineto's output_json.cpp (deviceProperties, distributedInfo, metadata
events, "ac2g" flows, the collective args it copies from record_param_comms onto the NCCL kernel)
and torch 2.13's profiler/util.h saveNcclMeta keys on record_param_comms.
"""

from __future__ import annotations

import hashlib
import math

from .engine import CollectiveCall, GpuEvent
from .layout import LayoutProcessGroup
from .memory import allocator_events
from .programs import Program
from .spec import TORCH_DTYPE_NAME

BASE_TIME_NS = 1_735_689_600_000_000_000  # 2025-01-01T00:00:00Z
KINETO_KERNEL_COMM_KEYS = (  # what output_json.cpp copies onto the kernel
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
    "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks",
)


def os_pid(rank: int) -> int:
    return 2_900_000 + 7919 * rank


def autograd_tid(rank: int) -> int:
    return os_pid(rank) + 9513


def loader_tid(rank: int) -> int:
    return os_pid(rank) + 4111


def us(ns) -> float:
    """Integer nanoseconds as microseconds (3 decimals exactly, like Kineto's "{}.{:03}")."""
    return int(ns) / 1000


class RankRenderer:
    """Builds the trace of one rank from a run Program."""

    def __init__(self, program: Program, rank: int):
        self.p, self.r, self.spec = program, rank, program.spec
        self.pid, self.device = os_pid(rank), rank % self.spec.gpus_per_node
        self.tids = {"main": self.pid, "autograd": autograd_tid(rank), "loader": loader_tid(rank)}

    # ---- top level --------------------------------------------------------------------------
    def trace(self) -> dict:
        spec = self.spec
        events = self.cpu_events() + self.gpu_events() + self.metadata_events()
        if spec.profile_memory:
            events += self.memory_events()
        if spec.category_names == "legacy":
            events = [_legacy(e) for e in events]
        host = spec.host_name(self.r)
        dist = {
            "backend": "nccl", "rank": self.r, "world_size": spec.world_size,
            "pg_count": self.p.groups.pg_count,
            "pg_config": [_pg_config(g) for g in self.p.groups.member_groups(self.r)],
            "nccl_version": spec.nccl_version,
        }
        if not spec.emit_pg_config:
            del dist["pg_config"]
        if spec.emit_host_name:
            dist["host_name"] = host
        return {
            "schemaVersion": 1,
            "deviceProperties": [_device_properties(spec, i) for i in range(spec.ranks_per_node)],
            "distributedInfo": dist,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS,
            "traceEvents": events,
            "traceName": f"/tmp/traces/{host}_{self.pid}.{BASE_TIME_NS // 10**6 + 3_600_000}.pt.trace.json",
        }

    # ---- CPU side ---------------------------------------------------------------------------
    def cpu_events(self) -> list[dict]:
        r, rows = self.r, []
        for rec in self.p.eng.cpu_ranges:
            if not rec.recorded:
                continue
            args = {"External id": rec.ext, "Record function id": rec.ext, **rec.args}
            if rec.comm is not None:
                args.update(self.comm_args(rec.comm, cpu_side=True))
            start = int(rec.start[r])
            rows.append((start, {"ph": "X", "cat": rec.cat, "name": rec.name, "pid": self.pid,
                                 "tid": self.tids[rec.thread], "ts": us(start), "dur": us(rec.end[r] - start),
                                 "args": args}))
        for call in self.p.eng.runtime:
            start = int(call.start[r])
            tid = self.tids[call.thread]
            rows.append((start, {"ph": "X", "cat": "cuda_runtime", "name": call.name, "pid": self.pid, "tid": tid,
                                 "ts": us(start), "dur": us(call.dur[r]),
                                 "args": {"External id": call.ext, "cbid": call.cbid, "correlation": call.corr}}))
            if call.launches_gpu:
                rows.append((start, {"ph": "s", "id": call.corr, "pid": self.pid, "tid": tid, "ts": us(start),
                                     "cat": "ac2g", "name": "ac2g"}))
        return _by_time(rows)

    # ---- GPU side ---------------------------------------------------------------------------
    def gpu_events(self) -> list[dict]:
        r, rows = self.r, []
        for ev in self.p.eng.gpu:
            start = int(ev.start[r])
            rows.append((start, {"ph": "X", "cat": ev.cat, "name": ev.name, "pid": self.device, "tid": ev.stream,
                                 "ts": us(start), "dur": us(ev.dur[r]), "args": self.gpu_args(ev)}))
            rows.append((start, {"ph": "f", "id": ev.corr, "pid": self.device, "tid": ev.stream, "ts": us(start),
                                 "cat": "ac2g", "name": "ac2g", "bp": "e"}))
        for ann in self.p.eng.annotations:
            start = int(ann.start[r])
            rows.append((start, {"ph": "X", "cat": "gpu_user_annotation", "name": ann.name, "pid": self.device,
                                 "tid": ann.stream, "ts": us(start), "dur": us(ann.dur[r]),
                                 "args": {"External id": ann.ext}}))
        return _by_time(rows)

    def gpu_args(self, ev: GpuEvent) -> dict:
        args = {"External id": ev.ext, "device": self.device, "context": 1, "stream": ev.stream,
                "correlation": ev.corr}
        if ev.cat != "kernel":
            nbytes = ev.args["bytes"]
            return {**args, "bytes": nbytes, "memory bandwidth (GB/s)": nbytes / max(1, int(ev.dur[self.r]))}
        if ev.comm is not None:
            grid, block = [24 if self.p.groups.of(ev.comm.role, self.r).link.cross_node else 16, 1, 1], [640, 1, 1]
            kernel = {"grid": grid, "block": block, "registers per thread": 96, "shared memory": 8576}
        else:
            kernel = dict(ev.args)
        blocks = math.prod(kernel["grid"]) / self.spec.gpu_model.num_sms
        warps = blocks * math.ceil(math.prod(kernel["block"]) / 32)
        args.update(queued=0, **kernel)
        args["blocks per SM"] = round(blocks, 6)
        args["warps per SM"] = round(warps, 6)
        args["est. achieved occupancy %"] = int(min(100, 100 * warps / 64))
        # Kineto copies record_param_comms' args onto the kernel: none for a custom all-reduce's
        if ev.comm is not None and self.spec.kernel_comm_args and "library" not in ev.comm.tag:
            comm = self.comm_args(ev.comm, cpu_side=False)
            args.update({k: comm[k] for k in KINETO_KERNEL_COMM_KEYS if k in comm})
        return args

    def comm_args(self, call: CollectiveCall, cpu_side: bool) -> dict:
        group = self.p.groups.of(call.role, self.r)
        ranks = list(group.ranks)
        args = {
            "Collective name": call.c10d_name, "dtype": TORCH_DTYPE_NAME[call.dtype],
            "In msg nelems": call.in_nelems, "Out msg nelems": call.out_nelems, "Group size": group.size,
            "In split size": "[]", "Out split size": "[]", "Process Group Name": group.name,
            "Process Group Description": group.desc, "Process Group Ranks": _format_list(ranks),
        }
        if not self.spec.record_comm_sizes:
            del args["In msg nelems"], args["Out msg nelems"]
        if cpu_side:
            start, stride = _rank_stride(ranks)
            args.update({"Rank": ranks.index(self.r), "Seq": call.seq,
                         "Comms Id": _comms_id(group, call.seq, start, stride),
                         "Is asynchronized op": int(call.kind == "allreduce" and self.spec.strategy == "ddp")})
            if start >= 0:
                args["Global rank start"] = start
            if stride > 0:
                args["Global rank stride"] = stride
        return args

    def memory_events(self) -> list[dict]:
        """The allocator's instant events, as torch 2.13 writes them (analyzer.synth.memory)."""
        return [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": self.pid,
                 "tid": self.tids[ev.thread], "ts": us(ev.ts_ns),
                 "args": {"Total Reserved": ev.reserved, "Total Allocated": ev.allocated, "Bytes": ev.delta,
                          "Device Id": self.device, "Device Type": 1, "Addr": 0x7F0000000000 + k * 512}}
                for k, ev in enumerate(allocator_events(self.p, self.r))]

    # ---- metadata ---------------------------------------------------------------------------
    def metadata_events(self) -> list[dict]:
        ts = us(self.p.step_ranges[self.spec.first_step].start[self.r] - 200_000)
        streams = sorted({ev.stream for ev in self.p.eng.gpu})
        out = _process_meta(self.pid, "python3.11", "CPU", self.pid, ts)
        for dev in range(self.spec.ranks_per_node):
            out += _process_meta(dev, "python3.11", f"GPU {dev}", 16777216 + dev, ts)
        for stream in streams:
            out += _thread_meta(self.device, stream, f"stream {stream} ", stream, ts)
        out += _thread_meta(self.pid, self.pid, f"thread {self.pid} (pt_main_thread)", self.pid, ts)
        out += _thread_meta(self.pid, self.tids["autograd"], f"thread {self.tids['autograd']} (pt_autograd_0)",
                            self.tids["autograd"], ts)
        if any(call.thread == "loader" for call in self.p.eng.runtime):
            out += _thread_meta(self.pid, self.tids["loader"], f"thread {self.tids['loader']} (pt_prefetch)",
                                self.tids["loader"], ts)
        last = self.p.step_ranges[self.spec.first_step + self.spec.steps - 1]
        end = us(last.end[self.r] + 100_000)
        out += [
            {"ph": "X", "cat": "Trace", "ts": ts, "dur": round(end - ts, 3), "pid": "Spans",
             "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
            {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": "Spans", "tid": 0,
             "args": {"sort_index": 536870912}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": ts},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": end},
        ]
        return out


def render_rank(program: Program, rank: int) -> dict:
    return RankRenderer(program, rank).trace()


# PyTorch <= 1.9's category names (category_names="legacy"): CPU ops and record_function
# ranges were both "Operator" (GPU annotations keep theirs: tracecliff reads none).
LEGACY_NAMES = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset", "cuda_runtime": "Runtime",
                "cpu_op": "Operator", "user_annotation": "Operator", "ac2g": "async"}


def _legacy(event: dict) -> dict:
    cat = event.get("cat")
    return {**event, "cat": LEGACY_NAMES[cat]} if cat in LEGACY_NAMES else event


def _by_time(rows: list[tuple[int, dict]]) -> list[dict]:
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # stable: creation order breaks ties
    return [rows[i][1] for i in order]


def _format_list(values: list[int], limit: int = 30) -> str:
    """torch's format_list: "[0, 1, 2]", cut to the first 30 entries then ", ..." (kTruncatLength)."""
    head = ", ".join(str(v) for v in values[:limit])
    return f"[{head}, ...]" if len(values) > limit else f"[{head}]"


def _rank_stride(ranks: list[int]) -> tuple[int, int]:
    """Global rank start / stride when the group's ranks are evenly spaced (else -1, not written)."""
    if len(ranks) == 1:
        return ranks[0], 1
    stride = ranks[1] - ranks[0]
    even = all(b - a == stride for a, b in zip(ranks, ranks[1:]))
    return (ranks[0], stride) if even and stride > 0 else (-1, -1)


def _comms_id(group: LayoutProcessGroup, seq: int, start: int, stride: int) -> int:
    """Same on every member: a hash of (group name, seq, isP2P, rank start, stride, size)."""
    key = f"{group.name}|{seq}|0|{start}|{stride}|{group.size}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def _pg_config(group: LayoutProcessGroup) -> dict:
    return {"pg_name": group.name, "pg_desc": group.desc, "backend_config": "cuda:nccl", "pg_size": group.size,
            "ranks": list(group.ranks)}


def _device_properties(spec, device: int) -> dict:
    gpu = spec.gpu_model
    return {
        "id": device, "name": gpu.name, "totalGlobalMem": spec.memory_bytes, "computeMajor": gpu.compute_major,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": gpu.num_sms,
        "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": gpu.shared_mem_optin,
        "sharedMemPerMultiprocessor": gpu.shared_mem_per_sm,
    }


def _process_meta(pid, name: str, label: str, sort_index: int, ts: float) -> list[dict]:
    return [
        {"name": "process_name", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"name": name}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"labels": label}},
        {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"sort_index": sort_index}},
    ]


def _thread_meta(pid, tid, name: str, sort_index: int, ts: float) -> list[dict]:
    return [
        {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": {"name": name}},
        {"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": {"sort_index": sort_index}},
    ]

