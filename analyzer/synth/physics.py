"""Link and collective cost model (models.md sections 1-2) and kernel durations from work.

These formulas are the generator's own copy, deliberately independent of ``analyzer.model.formulas``
(the thing under test).
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import JobSpec

ALLREDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL = "allreduce", "allgather", "reduce_scatter", "alltoall"


@dataclass(frozen=True)
class SimLink:
    """The generator's link (its own, not analyzer.model.link.Link: the thing under test)."""

    alpha_us: float
    beta_gbps: float
    nodes: int

    @property
    def cross_node(self) -> bool:
        return self.nodes > 1


def group_link(spec: JobSpec, ranks: list[int]) -> SimLink:
    """α/β of a process group: NVLink inside one node, NICs once it spans nodes.

    Across nodes NCCL runs one ring per GPU of the node, so the node's aggregate NIC bandwidth
    (nics_per_node x nic_gbps) is shared by the node's members of this group and by the sibling
    groups that run at the same time: a group with k of the node's g GPUs gets k/g of it
    (k = g for a world-spanning group; k = 1 for an HSDP replicate group, one NIC's worth each
    with one NIC per GPU). It never exceeds NVLink.
    """
    nodes = sorted({spec.node_of(r) for r in ranks})
    if len(nodes) == 1:
        return SimLink(spec.nvlink_alpha_us, spec.nvlink_gbps, 1)
    per_node = len(ranks) / len(nodes)
    node_bw = spec.nics_per_node * spec.nic_gbps * per_node / spec.ranks_per_node
    return SimLink(spec.nic_alpha_us, min(spec.nvlink_gbps, node_bw), len(nodes))


def ring_time_us(kind: str, size_bytes: float, n: int, link: SimLink) -> float:
    """NCCL ring: all-reduce 2(N-1)α + 2(N-1)/N·S/β; all-gather (output S) and reduce-scatter
    (input S) (N-1)α + (N-1)/N·S/β; all-to-all (S per rank, N-1 pairwise exchanges of S/N) the
    same as all-gather. β in GB/s = 1e3 bytes/µs."""
    if n <= 1:
        return 0.0
    hops = 2 * (n - 1) if kind == ALLREDUCE else n - 1
    return hops * link.alpha_us + hops / n * size_bytes / (link.beta_gbps * 1e3)


def gemm_us(spec: JobSpec, flops: float, sizes: tuple[int, ...] = ()) -> float:
    """A GEMM's time: its FLOPs at the peak of its dtype times the efficiency, which falls for
    small GEMMs when ``gemm_half_flops`` is set (a tile grid too small to fill the GPU) and for a
    bf16 GEMM with a size not a multiple of 8 when ``misaligned_gemm_efficiency`` is."""
    peak = spec.gpu_model.peak_fp32_tflops if spec.gemm_dtype == "fp32" else spec.gpu_model.peak_bf16_tflops
    efficiency = spec.gemm_efficiency
    if spec.misaligned_gemm_efficiency > 0 and spec.gemm_dtype == "bf16" and any(s % 8 for s in sizes):
        efficiency = spec.misaligned_gemm_efficiency
    if spec.gemm_half_flops > 0:
        efficiency *= flops / (flops + spec.gemm_half_flops)
    return flops / (peak * 1e6 * efficiency)


def attention_us(spec: JobSpec, flops: float) -> float:
    return flops / (spec.gpu_model.peak_bf16_tflops * 1e6 * spec.attn_efficiency)


def memory_us(spec: JobSpec, nbytes: float) -> float:
    return nbytes / (spec.gpu_model.hbm_gbps * 1e3 * spec.mem_efficiency)
