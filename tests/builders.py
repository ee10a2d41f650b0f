"""Tiny hand-built Kineto traces whose every number a test can work out by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

MAIN, AUTOGRAD = 100, 200  # CPU thread ids


class TraceBuilder:
    def __init__(self, rank=0, world_size=2, pg_ranks=(0, 1), host=None, pg_ranks_as_string=False):
        self.events: list[dict] = []
        self.corr = 1000
        ranks = list(pg_ranks)
        info = {"backend": "nccl", "rank": rank, "world_size": world_size,
                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": len(ranks),
                               "ranks": str(ranks) if pg_ranks_as_string else ranks}],
                "nccl_version": "2.21.5"}
        if host:
            info["host_name"] = host
        self.doc = {"schemaVersion": 1, "distributedInfo": info,
                    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9}],
                    "traceEvents": self.events}

    def cpu(self, name, ts, dur, tid=MAIN, cat="cpu_op", **args):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
                            "ts": ts, "dur": dur, "args": args})

    def kernel(self, name, ts, dur, stream=7, launch_ts=None, tid=MAIN, cat="kernel", **args):
        """A GPU activity; with launch_ts, also its cudaLaunchKernel on CPU thread ``tid``."""
        self.corr += 1
        kargs = {"device": 0, "stream": stream, "correlation": self.corr, **args}
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                            "ts": ts, "dur": dur, "args": kargs})
        if launch_ts is not None:
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                "tid": tid, "ts": launch_ts, "dur": 1, "args": {"correlation": self.corr}})
        return self.corr

    def write(self, path: Path, gz=False) -> Path:
        data = json.dumps(self.doc).encode()
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        return path


def two_step_ddp(rank=0, comm_us=30.0, period=100.0, group_ranks=(0, 1), **kw) -> TraceBuilder:
    """Two ProfilerSteps of ``period`` µs (100). Each: forward compute [0,30) (launched inside
    DistributedDataParallel.forward), backward compute [30,70) launched from the autograd thread,
    an all-reduce [60,60+comm_us) over ``group_ranks`` (30 µs: 10 hidden under backward, 20
    exposed), then the optimizer, 5 µs."""
    b = TraceBuilder(rank=rank, **kw)
    group = list(group_ranks)
    for step, base in ((1, 1000.0), (2, 1000.0 + period)):
        b.cpu(f"ProfilerStep#{step}", base - 10, period, cat="user_annotation")
        b.cpu("DistributedDataParallel.forward", base - 9, 8)
        b.kernel("sm90_xmma_gemm_bf16<128, 64>", base, 30, launch_ts=base - 8)
        b.cpu("autograd::engine::evaluate_function: MmBackward0", base - 5, 4, tid=AUTOGRAD)
        b.kernel("void at::native::elementwise<&>", base + 30, 40, launch_ts=base - 4, tid=AUTOGRAD)
        b.cpu("record_param_comms", base - 2, 1, tid=AUTOGRAD, **{
            "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
            "Group size": len(group), "dtype": "BFloat16", "Process Group Name": "0",
            "Process Group Description": "default_pg", "Process Group Ranks": str(group)})
        b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 base + 60, comm_us, stream=20, launch_ts=base - 1.5, tid=AUTOGRAD)
        b.cpu("Optimizer.step#AdamW.step", base - 1, 1)
        b.kernel("multi_tensor_apply_kernel", base + 60 + comm_us, 5, launch_ts=base - 0.5)
    return b
