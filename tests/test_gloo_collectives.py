"""CPU-only gloo traces: collectives from the c10d ops (kind, sizes, step, phase) timed by
gloo's own work ranges (real duration, dtype), checked against the raw trace events."""

import gzip
import json

import pytest

from analyzer.api import diagnose
from conftest import SAMPLES


def raw_ops(path, prefix):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return sorted((e for e in doc["traceEvents"] if e.get("name", "").startswith(prefix)), key=lambda e: e["ts"])


@pytest.mark.parametrize("job", ["ddp", "fsdp2", "fsdp1_nowrap"])
def test_gloo_work_ranges_time_the_c10d_ops(job):
    folder = SAMPLES / "cpu_gloo" / job
    result = diagnose([str(folder)], report=False)
    rank0 = [c for c in result.collectives if c["rank"] == 0]
    gloo = raw_ops(folder / "rank-0.pt.trace.json.gz", "gloo:")
    c10d = [e for e in raw_ops(folder / "rank-0.pt.trace.json.gz", "c10d::") if "barrier" not in e["name"]]
    assert len(rank0) == len(gloo) == len(c10d) > 0
    for row, work, op in zip(sorted(rank0, key=lambda r: r["start_us"]), gloo, c10d):
        assert row["dur_us"] == pytest.approx(work["dur"], abs=0.002)  # the work, not the enqueue
        assert row["dtype"] == "f32" and row["bytes"] is not None and row["size_source"] == "Input Dims"
        assert row["collective"] == {"allreduce_": "allreduce", "_allgather_base_": "allgather",
                                     "allgather_": "allgather", "_reduce_scatter_base_": "reduce_scatter",
                                     "reduce_scatter_": "reduce_scatter"}.get(op["name"].split("::")[1], row["collective"])
    ddp_like = [r for r in rank0 if r["collective"] == "allreduce"]
    for r in ddp_like:
        assert r["bytes"] == 4 * r["in_nelems"]
