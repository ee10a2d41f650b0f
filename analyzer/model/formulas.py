"""The performance models of ``docs/models.md``: pure functions, nothing else computes a model.

Units (one convention for the whole module, stated in every name that carries a unit):

- sizes and volumes in **bytes** (``*_bytes``); 1 KB = 1e3 B, 1 GB = 1e9 B, 1 MiB = 2**20 B;
- times in **microseconds** (``*_us``), α included;
- bandwidths in **GB/s = 1e9 B/s** (``*_gbps``), *one-way, per GPU*, never bidirectional;
- compute in TFLOPS (1e12 FLOP/s) for peaks, FLOPs for counts.

A bandwidth of β GB/s moves S bytes in ``S / (β·1e3)`` µs, and α µs × β GB/s = α·β·1e3 bytes.

Section numbers (§) refer to ``docs/models.md``; papers are listed there under "References".
Every function validates its inputs and raises ``ValueError`` on nonsense (negative sizes,
N < 1, non-finite numbers, unknown collective names).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BYTES_PER_KB", "BYTES_PER_GB", "MIB", "DEFAULT_BUCKET_CAP_BYTES", "FIRST_BUCKET_BYTES",
    "COLLECTIVE_KINDS", "STRATEGIES",
    "alpha_beta_time", "crossover_bytes",
    "ring_allreduce_time", "ring_allgather_time", "ring_reduce_scatter_time",
    "ring_alltoall_time", "pipelined_time", "point_to_point_time",
    "collective_time", "busbw_factor", "algbw_gbps", "busbw_gbps",
    "ddp_volume_bytes", "zero3_volume_bytes",
    "ddp_memory_bytes", "zero1_memory_bytes", "zero2_memory_bytes", "zero3_memory_bytes",
    "hsdp_memory_bytes", "static_memory_bytes", "canonical_strategy",
    "activation_bytes_per_layer", "recompute_activation_bytes_per_layer", "fits_device",
    "MEASURED_MARGIN", "MODELLED_MARGIN",
    "BucketPipeline", "ddp_bucket_pipeline", "ddp_bucket_pipeline_of_times", "ddp_exposed_tails",
    "assign_buckets", "bucket_ready_times",
    "ddp_pipeline_for_cap", "OverlapBound", "critical_overlap", "BucketCapChoice",
    "best_bucket_cap", "DEFAULT_CANDIDATE_CAPS_BYTES",
    "FsdpSchedule", "fsdp_unit_schedule",
    "flops_per_token", "hardware_flops_per_token", "achieved_tflops_per_gpu", "mfu", "hfu",
    "scaling_efficiency",
    "gemm_flops", "attention_flops", "causal_visible_fraction", "window_visible_fraction",
    "conv_output_size", "conv_flops", "ATTENTION_BACKWARD_FACTOR", "achieved_tflops", "time_at_peak_us",
    "flops_utilization", "expected_compute_us",
    "pipeline_bubble_fraction", "pipeline_time",
]

BYTES_PER_KB = 1e3
BYTES_PER_GB = 1e9
MIB = 2**20
#: ``DistributedDataParallel(bucket_cap_mb=25)``: PyTorch multiplies by 2**20, so MiB.
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
#: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``.
FIRST_BUCKET_BYTES = MIB

# µs per (byte / (GB/s)): S / (β·1e9 B/s) s = S / (β·1e3) µs.
_US_PER_BYTE_AT_1_GBPS = 1e-3


# ---------------------------------------------------------------- validation helpers
def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _nonneg(name: str, value: float) -> float:
    value = _finite(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _positive(name: str, value: float) -> float:
    value = _finite(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _transfer_us(size_bytes: float, beta_gbps: float) -> float:
    return size_bytes / beta_gbps * _US_PER_BYTE_AT_1_GBPS


# ---------------------------------------------------------------- §1 alpha-beta
def alpha_beta_time(size_bytes: float, alpha_us: float, beta_gbps: float) -> float:
    """Hockney cost of one message: ``T = α + S/β`` (µs). §1; Hockney 1994.

    size_bytes: S in bytes; alpha_us: start-up latency α in µs; beta_gbps: one-way β in GB/s.
    """
    size = _nonneg("size_bytes", size_bytes)
    alpha = _nonneg("alpha_us", alpha_us)
    beta = _positive("beta_gbps", beta_gbps)
    return alpha + _transfer_us(size, beta)


def crossover_bytes(alpha_us: float, beta_gbps: float) -> float:
    """Crossover size ``S* = α·β`` in bytes (µs × GB/s = 1e3 B). §1; Hockney 1994.

    At S* the latency and the bandwidth terms are equal; e.g. 0.8 µs × 450 GB/s = 360 KB.
    """
    alpha = _nonneg("alpha_us", alpha_us)
    beta = _positive("beta_gbps", beta_gbps)
    return alpha * beta / _US_PER_BYTE_AT_1_GBPS


# ---------------------------------------------------------------- §2 ring collectives
def _ring_time(steps_per_peer: int, size_bytes: float, n: int, alpha_us: float,
               beta_gbps: float) -> float:
    """``k(N-1)α + k(N-1)/N · S/β`` with k = 2 (all-reduce) or 1 (all-gather, ...)."""
    size = _nonneg("size_bytes", size_bytes)
    ranks = _count("n", n)
    alpha = _nonneg("alpha_us", alpha_us)
    beta = _positive("beta_gbps", beta_gbps)
    hops = steps_per_peer * (ranks - 1)
    return hops * alpha + hops / ranks * _transfer_us(size, beta)


def ring_allreduce_time(size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """Ring all-reduce of S bytes on N ranks: ``2(N-1)α + 2(N-1)/N · S/β`` (µs).

    §2; Thakur, Rabenseifner & Gropp 2005. N = 1 costs 0 (nothing to exchange).
    """
    return _ring_time(2, size_bytes, n, alpha_us, beta_gbps)


def ring_allgather_time(size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """Ring all-gather with an *output* of S bytes: ``(N-1)α + (N-1)/N · S/β`` (µs). §2."""
    return _ring_time(1, size_bytes, n, alpha_us, beta_gbps)


def ring_reduce_scatter_time(size_bytes: float, n: int, alpha_us: float,
                             beta_gbps: float) -> float:
    """Ring reduce-scatter with an *input* of S bytes: ``(N-1)α + (N-1)/N · S/β`` (µs). §2."""
    return _ring_time(1, size_bytes, n, alpha_us, beta_gbps)


def ring_alltoall_time(size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """All-to-all of S bytes per rank: ``(N-1)α + (N-1)/N · S/β`` (µs). §2."""
    return _ring_time(1, size_bytes, n, alpha_us, beta_gbps)


def pipelined_time(size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """Pipelined broadcast / reduce of S bytes: ``≈ α + S/β`` (µs), 0 when N = 1. §2.

    The ring pipeline's fill time (≈ (N-1) chunk hops) is neglected, as in models.md.
    """
    ranks = _count("n", n)
    time = alpha_beta_time(size_bytes, alpha_us, beta_gbps)
    return 0.0 if ranks == 1 else time


def point_to_point_time(size_bytes: float, alpha_us: float, beta_gbps: float) -> float:
    """send / recv / sendrecv of S bytes each way: ``α + S/β`` (µs); β is one-way. §1."""
    return alpha_beta_time(size_bytes, alpha_us, beta_gbps)


_RING_TIME = {
    "allreduce": ring_allreduce_time,
    "allgather": ring_allgather_time,
    "reduce_scatter": ring_reduce_scatter_time,
    "alltoall": ring_alltoall_time,
    "broadcast": pipelined_time,
    "reduce": pipelined_time,
}
_POINT_TO_POINT = ("send", "recv", "sendrecv")
COLLECTIVE_KINDS: tuple[str, ...] = (*_RING_TIME, *_POINT_TO_POINT)


def _check_kind(kind: str) -> str:
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {COLLECTIVE_KINDS}")
    return kind


@functools.lru_cache(maxsize=4096, typed=True)
def collective_time(kind: str, size_bytes: float, n: int, alpha_us: float,
                    beta_gbps: float) -> float:
    """Modelled time (µs) of one collective ``kind`` of S bytes on N ranks (ring algorithm).

    kind ∈ COLLECTIVE_KINDS; S follows nccl-tests: all-reduce buffer, all-gather *output*,
    reduce-scatter *input*, all-to-all bytes per rank, broadcast/reduce/p2p message. §2.
    A pure function, cached: a collective-heavy rank asks for the same few sizes and groups
    thousands of times (the rules' α-β caps). ``typed``: 1 and 1.0 are separate entries.
    """
    _check_kind(kind)
    if kind in _POINT_TO_POINT:
        _count("n", n)
        return point_to_point_time(size_bytes, alpha_us, beta_gbps)
    return _RING_TIME[kind](size_bytes, n, alpha_us, beta_gbps)


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: all-reduce ``2(N-1)/N``; all-gather, reduce-scatter,
    all-to-all ``(N-1)/N``; broadcast, reduce, send/recv ``1``. §2; nccl-tests PERFORMANCE.md.
    """
    _check_kind(kind)
    ranks = _count("n", n)
    if kind == "allreduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("allgather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth ``algbw = S / t`` in GB/s (S in bytes, t in µs). §2; nccl-tests."""
    size = _nonneg("size_bytes", size_bytes)
    time = _positive("time_us", time_us)
    return size / time * _US_PER_BYTE_AT_1_GBPS


def busbw_gbps(kind: str, size_bytes: float, time_us: float, n: int) -> float:
    """Bus bandwidth ``busbw = algbw × busbw_factor(kind, N)`` in GB/s, comparable with the
    link's one-way β whatever N is. §2; nccl-tests PERFORMANCE.md."""
    return algbw_gbps(size_bytes, time_us) * busbw_factor(kind, n)


# ---------------------------------------------------------------- §2 across nodes
# The cross-node link (the node's NICs shared by its GPUs, capped by the intra-node link) is
# analyzer.model.link.cross_node_beta: one rule, which every group's link and the what-if use.


# ---------------------------------------------------------------- §3 data-parallel volumes
def _shard_fraction(n: int) -> float:
    ranks = _count("n", n)
    return (ranks - 1) / ranks


def _bytes_of(psi: float, bytes_per_elem: float) -> float:
    return _nonneg("psi", psi) * _positive("bytes_per_elem", bytes_per_elem)


def _grad_bytes_of(psi: float, bytes_per_elem: float, grad_bytes_per_elem: float | None) -> float:
    return _bytes_of(psi, bytes_per_elem if grad_bytes_per_elem is None else grad_bytes_per_elem)


def ddp_volume_bytes(psi: float, bytes_per_elem: float, n: int, *,
                     grad_bytes_per_elem: float | None = None) -> float:
    """DDP bytes each GPU sends per step: all-reduce of the gradients, ``2(N-1)/N · Ψ_b``.

    ``grad_bytes_per_elem`` (default: ``bytes_per_elem``) is the communicated gradient dtype's
    size; an fp32 reduce dtype with bf16 params doubles it. §3; Li et al. 2020.
    """
    return 2 * _shard_fraction(n) * _grad_bytes_of(psi, bytes_per_elem, grad_bytes_per_elem)


def zero3_volume_bytes(psi: float, bytes_per_elem: float, n: int, *,
                       grad_bytes_per_elem: float | None = None) -> float:
    """ZeRO-3 / FSDP ``FULL_SHARD``: all-gather (forward) + all-gather (backward) of the
    parameters + reduce-scatter of the gradients, ``3(N-1)/N · Ψ_b`` for one dtype
    (1.5× DDP). §3; ZeRO; Zhao et al. 2023."""
    fraction = _shard_fraction(n)
    grads = _grad_bytes_of(psi, bytes_per_elem, grad_bytes_per_elem)
    return 2 * fraction * _bytes_of(psi, bytes_per_elem) + fraction * grads


_STRATEGY_ALIASES = {
    "ddp": "ddp",
    "zero1": "zero1",
    "zero2": "zero2", "fsdp-grad-op": "zero2", "shard_grad_op": "zero2",
    "zero3": "zero3", "fsdp-full": "zero3", "full_shard": "zero3",
    "hsdp": "hsdp", "hybrid_shard": "hsdp",
}
STRATEGIES: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3", "hsdp")


def canonical_strategy(strategy: str) -> str:
    """Map a strategy name or alias (``fsdp-full``, ``FULL_SHARD``, ...) to one of STRATEGIES."""
    key = strategy.strip().lower() if isinstance(strategy, str) else strategy
    if key not in _STRATEGY_ALIASES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of "
                         f"{sorted(_STRATEGY_ALIASES)}")
    return _STRATEGY_ALIASES[key]


# Static memory, bf16 params and grads + AdamW with fp32 master weights, m and v:
# 2 + 2 + (4 + 4 + 4) = 16 bytes per parameter (ZeRO paper, K = 12).
_PARAM_BYTES, _GRAD_BYTES, _OPTIMIZER_BYTES = 2, 2, 12


def ddp_memory_bytes(psi: float) -> float:
    """DDP static memory per GPU: ``16Ψ`` bytes (bf16 params + grads, fp32 AdamW). §3; ZeRO."""
    return (_PARAM_BYTES + _GRAD_BYTES + _OPTIMIZER_BYTES) * _nonneg("psi", psi)


def zero1_memory_bytes(psi: float, n: int) -> float:
    """ZeRO-1 static memory per GPU: ``4Ψ + 12Ψ/N`` bytes (optimizer state sharded). §3."""
    params = _nonneg("psi", psi)
    return (_PARAM_BYTES + _GRAD_BYTES) * params + _OPTIMIZER_BYTES * params / _count("n", n)


def zero2_memory_bytes(psi: float, n: int) -> float:
    """ZeRO-2 / SHARD_GRAD_OP static memory per GPU: ``2Ψ + 14Ψ/N`` bytes. §3."""
    params = _nonneg("psi", psi)
    return _PARAM_BYTES * params + (_GRAD_BYTES + _OPTIMIZER_BYTES) * params / _count("n", n)


def zero3_memory_bytes(psi: float, n: int) -> float:
    """ZeRO-3 / FULL_SHARD static memory per GPU: ``16Ψ/N`` bytes. §3."""
    return ddp_memory_bytes(psi) / _count("n", n)


def hsdp_memory_bytes(psi: float, g: int) -> float:
    """HYBRID_SHARD static memory per GPU: ``16Ψ/g`` bytes; set by the shard group g, not by
    the total GPU count. §3."""
    return zero3_memory_bytes(psi, g)


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, flash: bool = True) -> float:
    """Activations one transformer layer saves for backward, bf16/fp16: ``s·b·h·(34 + 5·a·s/h)``
    bytes; FlashAttention stores no attention scores (the ``5·a·s/h`` term): ``34·s·b·h``.
    §9; Korthikanti et al. 2022."""
    sbh = _count("s", s) * _count("b", b) * _count("h", h)
    return sbh * 34 if flash else sbh * (34 + 5 * _count("a", a) * s / h)


def recompute_activation_bytes_per_layer(s: int, b: int, h: int) -> float:
    """Under full recompute a layer keeps only its input: ``2·s·b·h`` bytes. §9."""
    return 2 * _count("s", s) * _count("b", b) * _count("h", h)


# Kept free beside a peak (§9): workspaces, NCCL's buffers, the CUDA context, fragmentation.
MEASURED_MARGIN = 0.10  # the allocator's reserved total already holds workspaces and fragmentation
MODELLED_MARGIN = 0.20  # the models hold none of them


def fits_device(peak_bytes: float, device_bytes: float, margin: float) -> bool:
    """``peak ≤ (1 − margin)·device``. §9."""
    return _nonneg("peak_bytes", peak_bytes) <= (1 - margin) * _nonneg("device_bytes", device_bytes)


def static_memory_bytes(strategy: str, psi: float, n: int,
                        gpus_per_node: int | None = None) -> float:
    """Static memory per GPU (bytes) of a strategy on N GPUs; HSDP shards over ``gpus_per_node``."""
    name = canonical_strategy(strategy)
    if name == "ddp":
        _count("n", n)
        return ddp_memory_bytes(psi)
    if name == "hsdp":
        if gpus_per_node is None:
            raise ValueError("hsdp needs gpus_per_node (the shard group size g)")
        return hsdp_memory_bytes(psi, gpus_per_node)
    return {"zero1": zero1_memory_bytes, "zero2": zero2_memory_bytes,
            "zero3": zero3_memory_bytes}[name](psi, n)


# ---------------------------------------------------------------- §4 DDP buckets
@dataclass(frozen=True)
class BucketPipeline:
    """All-reduce start and end per bucket (µs, launch order) and the exposed tail (µs)."""

    starts_us: tuple[float, ...]
    ends_us: tuple[float, ...]
    exposed_tail_us: float


def _float_array(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    return array


def _nonneg_array(name: str, values: Sequence[float]) -> np.ndarray:
    """``_nonneg`` of every item at once, with its error for the first bad item."""
    array = np.asarray(values, dtype=float)
    bad = ~(np.isfinite(array) & (array >= 0))
    if bad.any():
        _nonneg(name, float(array[np.argmax(bad)]))
    return array


def ddp_bucket_pipeline(ready_times_us: Sequence[float], bucket_bytes: Sequence[float],
                        backward_end_us: float,
                        allreduce_time_fn: Callable[[float], float]) -> BucketPipeline:
    """DDP bucket pipeline (§4; Li et al. 2020), buckets in launch order:
    ``s_i = max(r_i, e_{i-1})``, ``e_i = s_i + T_AR(S_i)``, exposed tail
    ``max(0, e_last − t_backward_end)``. Times in µs, sizes in bytes; ``allreduce_time_fn``
    maps a bucket's bytes to its all-reduce time in µs (``ddp_bucket_pipeline_of_times``).
    """
    ready = _float_array("ready_times_us", ready_times_us)
    sizes = _float_array("bucket_bytes", bucket_bytes)
    if ready.shape != sizes.shape:
        raise ValueError("ready_times_us and bucket_bytes must have the same length")
    if np.any(sizes < 0):
        raise ValueError("bucket_bytes must be >= 0")
    durations = [_nonneg("allreduce time", allreduce_time_fn(float(s))) for s in sizes]
    return ddp_bucket_pipeline_of_times(ready, durations, backward_end_us)


def ddp_bucket_pipeline_of_times(ready_times_us: Sequence[float], allreduce_times_us: Sequence[float],
                                 backward_end_us: float) -> BucketPipeline:
    """The §4 pipeline of ``ddp_bucket_pipeline`` given each bucket's all-reduce time T_i (µs)
    rather than its bytes: callers that have the times as an array (the what-if projection)
    skip one Python call per bucket.

    Closed form of the recurrence, with C_k = Σ_{i≤k} T_i:
    ``e_k = C_k + max_{j≤k}(r_j − C_{j-1})``.
    """
    ready = _float_array("ready_times_us", ready_times_us)
    durations = _nonneg_array("allreduce time", allreduce_times_us)
    if ready.shape != durations.shape:
        raise ValueError("ready_times_us and allreduce_times_us must have the same length")
    backward_end = _finite("backward_end_us", backward_end_us)
    if ready.size == 0:
        return BucketPipeline((), (), 0.0)
    done_before = np.concatenate(([0.0], np.cumsum(durations)[:-1]))
    ends = np.cumsum(durations) + np.maximum.accumulate(ready - done_before)
    starts = ends - durations
    tail = max(0.0, float(ends[-1]) - backward_end)
    return BucketPipeline(tuple(starts.tolist()), tuple(ends.tolist()), tail)


def ddp_exposed_tails(ready_times_us: np.ndarray, allreduce_times_us: np.ndarray,
                      backward_end_us: np.ndarray) -> list[float]:
    """The exposed tail of ``ddp_bucket_pipeline_of_times`` for many pipelines of the same bucket
    count at once: row i of the 2-D ``ready_times_us`` and ``allreduce_times_us`` is one
    pipeline, ``backward_end_us[i]`` its end of backward. Bit for bit the same numbers (the
    cumulative sums run along each row in order, as the 1-D ones do); the inputs must already
    be what ``ddp_bucket_pipeline_of_times`` accepts (finite, times >= 0)."""
    if ready_times_us.shape != allreduce_times_us.shape or ready_times_us.ndim != 2 or not ready_times_us.shape[1]:
        raise ValueError("ready_times_us and allreduce_times_us must be 2-D arrays of one shape, one bucket or more")
    done = np.cumsum(allreduce_times_us, axis=1)
    done_before = np.concatenate((np.zeros((done.shape[0], 1)), done[:, :-1]), axis=1)
    last_end = done[:, -1] + (ready_times_us - done_before).max(axis=1)
    return [max(0.0, tail) for tail in (last_end - backward_end_us).tolist()]


def assign_buckets(grad_sizes_bytes: Sequence[float], bucket_cap_bytes: float,
                   first_bucket_bytes: float = FIRST_BUCKET_BYTES) -> tuple[tuple[int, ...], ...]:
    """Group gradients (given in ready order) into DDP buckets, as DDP's
    ``_compute_bucket_assignment_by_size`` does for one dtype and device: gradients are
    appended in order and a bucket closes as soon as its size reaches its limit (so it may
    overshoot by its last gradient); limits are ``first_bucket_bytes`` for the first bucket,
    then ``bucket_cap_bytes``. Returns tuples of indices into ``grad_sizes_bytes``. §4.

    PyTorch: ``bucket_cap_mb`` × 2**20 and a 1 MiB first bucket by default; recent versions
    use the cap for the first bucket too when ``bucket_cap_mb`` is set explicitly.
    """
    sizes = _float_array("grad_sizes_bytes", grad_sizes_bytes)
    if np.any(sizes < 0):
        raise ValueError("grad_sizes_bytes must be >= 0")
    limit = _positive("first_bucket_bytes", first_bucket_bytes)
    cap = _positive("bucket_cap_bytes", bucket_cap_bytes)
    buckets: list[tuple[int, ...]] = []
    current: list[int] = []
    filled = 0.0
    for index, size in enumerate(sizes.tolist()):
        current.append(index)
        filled += size
        if filled >= limit:
            buckets.append(tuple(current))
            current, filled, limit = [], 0.0, cap
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


def bucket_ready_times(grad_ready_times_us: Sequence[float],
                       buckets: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """A bucket is ready when its last gradient is: ``r_b = max_{i∈b} r_i`` (µs). §4."""
    ready = _float_array("grad_ready_times_us", grad_ready_times_us)
    if any(len(bucket) == 0 for bucket in buckets):
        raise ValueError("buckets must not be empty")
    return tuple(float(ready[list(bucket)].max()) for bucket in buckets)


def ddp_pipeline_for_cap(grad_sizes_bytes: Sequence[float], grad_ready_times_us: Sequence[float],
                         backward_end_us: float, allreduce_time_fn: Callable[[float], float],
                         bucket_cap_bytes: float,
                         first_bucket_bytes: float | None = FIRST_BUCKET_BYTES) -> BucketPipeline:
    """Bucket the gradients with a cap and run the pipeline model (§4).

    ``first_bucket_bytes=None`` uses the cap for the first bucket too.
    """
    sizes = _float_array("grad_sizes_bytes", grad_sizes_bytes)
    if len(grad_ready_times_us) != sizes.size:
        raise ValueError("grad_sizes_bytes and grad_ready_times_us must have the same length")
    first = bucket_cap_bytes if first_bucket_bytes is None else first_bucket_bytes
    buckets = assign_buckets(sizes, bucket_cap_bytes, first)
    ready = bucket_ready_times(grad_ready_times_us, buckets)
    bucket_bytes = [float(sizes[list(bucket)].sum()) for bucket in buckets]
    return ddp_bucket_pipeline(ready, bucket_bytes, backward_end_us, allreduce_time_fn)


@dataclass(frozen=True)
class OverlapBound:
    """Critical-overlap verdict (µs): ``hidden`` iff slack ≥ 0; ``min_bubble_us`` is a lower
    bound on the exposed communication; ``slack_us = T_bwd − T_first_wait − T_comm``."""

    hidden: bool
    min_bubble_us: float
    slack_us: float


def critical_overlap(t_comm_us: float, t_bwd_us: float,
                     t_first_bucket_wait_us: float) -> OverlapBound:
    """Critical overlap equation (§4; Li et al. 2020): communication can be hidden only if
    ``T_comm ≤ T_bwd − T_first_bucket_wait``.

    Communication cannot start before the first bucket is ready, so it ends no earlier than
    ``T_first_bucket_wait + T_comm``: the exposed bubble is at least
    ``max(0, T_comm + T_first_bucket_wait − T_bwd)`` (models.md's ``T_comm − T_bwd`` is the
    weaker bound for a zero wait). Times in µs, measured from the start of backward.
    """
    comm = _nonneg("t_comm_us", t_comm_us)
    backward = _nonneg("t_bwd_us", t_bwd_us)
    wait = _nonneg("t_first_bucket_wait_us", t_first_bucket_wait_us)
    if wait > backward:
        raise ValueError(f"t_first_bucket_wait_us ({wait}) exceeds t_bwd_us ({backward})")
    slack = _overlap_slack(comm, backward, wait)
    return OverlapBound(hidden=slack >= 0, min_bubble_us=max(0.0, -slack), slack_us=slack)


def _overlap_slack(comm, backward, wait):
    """``T_bwd − T_first_bucket_wait − T_comm`` of the critical overlap equation, for numbers or
    arrays alike (the same float operations either way)."""
    return backward - wait - comm


def critical_overlap_bubbles(t_comm_us: Sequence[float], t_bwd_us: Sequence[float],
                             t_first_bucket_wait_us: Sequence[float]) -> list[float]:
    """``[critical_overlap(c, b, w).min_bubble_us ...]`` of many steps at once: the same floats
    (and, at the first step whose figures are not valid, the same error)."""
    columns = (t_comm_us, t_bwd_us, t_first_bucket_wait_us)
    valid = all(type(v) in (int, float) for column in columns for v in column)
    if valid:
        try:
            comm, backward, wait = (np.array(column, dtype=float) for column in columns)
        except OverflowError:  # an int beyond the floats
            valid = False
    if valid:
        with np.errstate(invalid="ignore"):
            valid = bool((np.isfinite(comm) & (comm >= 0) & np.isfinite(backward) & (backward >= 0)
                          & np.isfinite(wait) & (wait >= 0) & (wait <= backward)).all())
    if not valid:  # the scalar's checks and error, step by step
        return [critical_overlap(c, b, w).min_bubble_us for c, b, w in zip(*columns)]
    short = -_overlap_slack(comm, backward, wait)
    return np.where(short > 0.0, short, 0.0).tolist()  # max(0.0, -slack)


DEFAULT_CANDIDATE_CAPS_BYTES: tuple[int, ...] = tuple(
    mib * MIB for mib in (1, 2, 5, 10, 15, 25, 50, 100, 200))


@dataclass(frozen=True)
class BucketCapChoice:
    """The cap with the smallest exposed tail and the tail of every candidate (µs)."""

    cap_bytes: float
    exposed_tail_us: float
    tails_us: tuple[tuple[float, float], ...]  # (cap_bytes, exposed tail), caps ascending


def best_bucket_cap(grad_sizes_bytes: Sequence[float], grad_ready_times_us: Sequence[float],
                    backward_end_us: float, allreduce_time_fn: Callable[[float], float],
                    candidate_caps_bytes: Sequence[float] = DEFAULT_CANDIDATE_CAPS_BYTES,
                    first_bucket_bytes: float | None = None) -> BucketCapChoice:
    """Search candidate bucket caps with the pipeline model; return the one with the smallest
    exposed tail (ties, within 1e-9 µs: the larger cap, fewer α). §4.

    ``first_bucket_bytes=None`` (default) makes the first bucket the cap, which is what
    setting ``bucket_cap_mb`` explicitly does in recent PyTorch; pass ``FIRST_BUCKET_BYTES``
    to keep a 1 MiB first bucket.
    """
    caps = sorted({_positive("candidate cap", c) for c in candidate_caps_bytes})
    if not caps:
        raise ValueError("candidate_caps_bytes is empty")
    tails = tuple(
        (cap, ddp_pipeline_for_cap(grad_sizes_bytes, grad_ready_times_us, backward_end_us,
                                   allreduce_time_fn, cap, first_bucket_bytes).exposed_tail_us)
        for cap in caps)
    best_tail = min(tail for _, tail in tails)
    best_cap = max(cap for cap, tail in tails if tail <= best_tail + 1e-9)
    return BucketCapChoice(best_cap, dict(tails)[best_cap], tails)


# ---------------------------------------------------------------- §5 FSDP units
@dataclass(frozen=True)
class FsdpSchedule:
    """Per-unit all-gather and compute intervals (µs from the first all-gather's issue) and
    the compute stream's total wait on all-gathers (µs)."""

    ag_starts_us: tuple[float, ...]
    ag_ends_us: tuple[float, ...]
    compute_starts_us: tuple[float, ...]
    compute_ends_us: tuple[float, ...]
    exposed_ag_us: float


def fsdp_unit_schedule(unit_compute_us: Sequence[float], unit_bytes: Sequence[float],
                       ag_time_fn: Callable[[float], float], prefetch: bool) -> FsdpSchedule:
    """FSDP unit schedule (§5; Zhao et al. 2023): units run in order on the compute stream,
    their all-gathers serialize on the communication stream, and a unit computes only once
    its parameters are gathered: ``c_i = max(ag_end_i, c_end_{i-1})``.

    Without prefetch unit i's all-gather is issued when unit i-1's compute ends
    (``ag_start_i = max(c_end_{i-1}, ag_end_{i-1})``: all-gathers serialize with compute).
    With prefetch (``BACKWARD_PRE`` / ``forward_prefetch``) it is issued when unit i-1's
    compute starts (``ag_start_i = max(c_{i-1}, ag_end_{i-1})``), one unit ahead.
    Exposed all-gather time = compute stream idle = ``c_end_last − Σ compute``.
    ``ag_time_fn`` maps a unit's bytes to its all-gather time in µs.
    """
    compute = _float_array("unit_compute_us", unit_compute_us)
    sizes = _float_array("unit_bytes", unit_bytes)
    if compute.shape != sizes.shape:
        raise ValueError("unit_compute_us and unit_bytes must have the same length")
    if np.any(compute < 0) or np.any(sizes < 0):
        raise ValueError("unit_compute_us and unit_bytes must be >= 0")
    ag_starts, ag_ends, c_starts, c_ends = [], [], [], []
    comm_free = compute_free = prev_compute_start = 0.0
    for duration, size in zip(compute.tolist(), sizes.tolist()):
        issue = prev_compute_start if prefetch else compute_free
        ag_start = max(issue, comm_free)
        comm_free = ag_start + _nonneg("all-gather time", ag_time_fn(size))
        prev_compute_start = max(comm_free, compute_free)
        compute_free = prev_compute_start + duration
        ag_starts.append(ag_start)
        ag_ends.append(comm_free)
        c_starts.append(prev_compute_start)
        c_ends.append(compute_free)
    exposed = compute_free - float(compute.sum()) if c_ends else 0.0
    return FsdpSchedule(tuple(ag_starts), tuple(ag_ends), tuple(c_starts), tuple(c_ends),
                        max(0.0, exposed))


# ---------------------------------------------------------------- §6 compute
def _attention_flops(n_layers: int | None, seq_len: int | None, d_model: int | None,
                     passes: int) -> float:
    """``passes · 4 · L · s · d`` per token: QKᵀ and AV cost 4·s·d FLOPs per layer forward."""
    given = [v is not None for v in (n_layers, seq_len, d_model)]
    if not any(given):
        return 0.0
    if not all(given):
        raise ValueError("attention FLOPs need all of n_layers, seq_len and d_model")
    return passes * 4.0 * _count("n_layers", n_layers) * _count("seq_len", seq_len) \
        * _count("d_model", d_model)


def flops_per_token(psi: float, n_layers: int | None = None, seq_len: int | None = None,
                    d_model: int | None = None) -> float:
    """Model training FLOPs per token: ``6Ψ`` (forward 2Ψ + backward 4Ψ), plus
    ``12 · n_layers · seq_len · d_model`` attention when all three are given.
    §6; Chowdhery et al. 2022 (PaLM) appendix B."""
    return 6.0 * _nonneg("psi", psi) + _attention_flops(n_layers, seq_len, d_model, passes=3)


def hardware_flops_per_token(psi: float, n_layers: int | None = None, seq_len: int | None = None,
                             d_model: int | None = None, *, recompute: bool = True) -> float:
    """FLOPs the hardware executes per token: with full activation recomputation the forward
    runs twice, ``8Ψ + 16·L·s·d``; without, the model FLOPs ``6Ψ + 12·L·s·d``. §6; PaLM."""
    passes = 4 if recompute else 3
    return 2.0 * passes * _nonneg("psi", psi) + _attention_flops(n_layers, seq_len, d_model,
                                                                 passes)


def achieved_tflops_per_gpu(tokens_per_s: float, psi: float, n_gpus: int,
                            n_layers: int | None = None, seq_len: int | None = None,
                            d_model: int | None = None) -> float:
    """Model TFLOPS per GPU: ``tokens/s × flops_per_token / N / 1e12`` (tokens/s of the whole
    job). §6."""
    tokens = _nonneg("tokens_per_s", tokens_per_s)
    return tokens * flops_per_token(psi, n_layers, seq_len, d_model) / _count("n_gpus", n_gpus) \
        / 1e12


def mfu(tokens_per_s: float, psi: float, n_gpus: int, peak_tflops: float,
        n_layers: int | None = None, seq_len: int | None = None,
        d_model: int | None = None) -> float:
    """Model FLOPs utilization (fraction): ``tokens/s × 6Ψ / (N × peak)``, tokens/s of the
    whole job, peak in TFLOPS (bf16 dense); attention added when L, s, d are given.
    §6; PaLM appendix B."""
    peak = _positive("peak_tflops", peak_tflops)
    return achieved_tflops_per_gpu(tokens_per_s, psi, n_gpus, n_layers, seq_len, d_model) / peak


def hfu(tokens_per_s: float, psi: float, n_gpus: int, peak_tflops: float,
        n_layers: int | None = None, seq_len: int | None = None, d_model: int | None = None,
        *, recompute: bool = True) -> float:
    """Hardware FLOPs utilization (fraction): ``tokens/s × 8Ψ / (N × peak)`` with full
    recomputation (equal to MFU without). §6; PaLM appendix B."""
    tokens = _nonneg("tokens_per_s", tokens_per_s)
    flops = hardware_flops_per_token(psi, n_layers, seq_len, d_model, recompute=recompute)
    return tokens * flops / (_count("n_gpus", n_gpus) * _positive("peak_tflops", peak_tflops)
                             * 1e12)


def scaling_efficiency(throughput_per_gpu_n: float, throughput_per_gpu_ref: float) -> float:
    """Weak-scaling efficiency: per-GPU throughput at N ÷ per-GPU throughput at the
    reference size (1.0 = perfect). §6."""
    return _nonneg("throughput_per_gpu_n", throughput_per_gpu_n) / _positive(
        "throughput_per_gpu_ref", throughput_per_gpu_ref)


# --- §6 FLOPs from recorded shapes (issue 29) ---------------------------------------------

#: Attention backward over forward: two matmuls forward (QKᵀ, PV), five backward, one of them
#: (recomputing QKᵀ in FlashAttention) counted at half weight by convention: 2.5 (Dao, 2022). §6.
ATTENTION_BACKWARD_FACTOR = 2.5


def gemm_flops(batch: int, m: int, n: int, k: int) -> int:
    """FLOPs of ``batch`` products of an m×k and a k×n matrix: ``2·batch·m·n·k`` (a multiply
    and an add per term; a bias add, m·n, is left out as GEMM benchmarks do). §6."""
    for name, value in (("batch", batch), ("m", m), ("n", n), ("k", k)):
        _nonneg(name, value)
    return 2 * int(batch) * int(m) * int(n) * int(k)


def causal_visible_fraction(sq: int, sk: int, align: str = "top-left") -> float:
    """Share of the ``sq × sk`` score matrix a causal mask keeps, as the continuous area of the
    triangle (½ for a square one; FlashAttention's convention). ``top-left``: PyTorch SDPA's
    ``is_causal`` (query i sees keys ≤ i); ``bottom-right``: flash-attn (the last query sees
    every key). §6."""
    q, k = _positive("sq", sq), _positive("sk", sk)
    if align not in ("top-left", "bottom-right"):
        raise ValueError(f"align must be top-left or bottom-right, got {align!r}")
    if align == "top-left":
        return q / (2.0 * k) if q <= k else 1.0 - k / (2.0 * q)
    return 1.0 - q / (2.0 * k) if q <= k else k / (2.0 * q)


def window_visible_fraction(sq: int, sk: int, left: int | None, right: int | None, causal: bool,
                            align: str = "bottom-right") -> float:
    """Share of the score matrix a sliding window keeps: query i (aligned to key
    ``i + sk − sq`` bottom-right, ``i`` top-left) sees keys in ``[j − left, j + right]``
    (``right = 0`` when causal; None or a negative side: unbounded), counted exactly. §6."""
    q, k = int(_positive("sq", sq)), int(_positive("sk", sk))
    rows = np.arange(q, dtype=np.int64) + (k - q if align == "bottom-right" else 0)
    low = rows - left if left is not None and left >= 0 else np.zeros(q, dtype=np.int64)
    right = 0 if causal else right
    high = rows + right if right is not None and right >= 0 else np.full(q, k - 1, dtype=np.int64)
    seen = np.clip(np.minimum(high, k - 1) - np.maximum(low, 0) + 1, 0, None)
    return float(seen.sum()) / (q * k)


def attention_flops(batch_heads: int, sq: int, sk: int, d_qk: int, d_v: int, visible: float = 1.0,
                    backward: bool = False) -> float:
    """FLOPs of scaled dot-product attention over ``batch_heads`` (batch × query heads):
    ``2·BH·sq·sk·d_qk`` for QKᵀ plus ``2·BH·sq·sk·d_v`` for PV (= ``4·B·H·sq·sk·D`` when the
    head sizes agree), times the ``visible`` share of the scores (½ causal), times
    ``ATTENTION_BACKWARD_FACTOR`` for the backward pass; softmax FLOPs are left out. §6."""
    for name, value in (("batch_heads", batch_heads), ("sq", sq), ("sk", sk), ("d_qk", d_qk), ("d_v", d_v)):
        _nonneg(name, value)
    share = _nonneg("visible", visible)
    flops = 2 * int(batch_heads) * int(sq) * int(sk) * (int(d_qk) + int(d_v))
    factor = share * (ATTENTION_BACKWARD_FACTOR if backward else 1.0)
    return flops if factor == 1.0 else flops * factor


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """One spatial output size of a convolution: ``⌊(in + 2p − d·(k − 1) − 1) / s⌋ + 1``. §6."""
    _positive("stride", stride)
    out = (int(size) + 2 * int(padding) - int(dilation) * (int(kernel) - 1) - 1) // int(stride) + 1
    return max(out, 0)


def conv_flops(batch: int, spatial: Sequence[int], weight_numel: int) -> int:
    """FLOPs of a convolution: ``2 · N · ∏spatial · numel(weight)``, where ``spatial`` is the
    output's spatial size (the input's for a transposed convolution: each input point scatters
    through the whole kernel) and ``numel(weight) = C_out · C_in/groups · ∏kernel``. §6."""
    _nonneg("batch", batch)
    _nonneg("weight_numel", weight_numel)
    points = 1
    for size in spatial:
        points *= int(_nonneg("spatial", size))
    return 2 * int(batch) * points * int(weight_numel)


def achieved_tflops(flops: float, time_us: float) -> float:
    """Achieved throughput in TFLOP/s of ``flops`` done in ``time_us``. §6."""
    return _nonneg("flops", flops) / (_positive("time_us", time_us) * 1e6)


def time_at_peak_us(flops: float, peak_tflops: float) -> float:
    """How long ``flops`` take at ``peak_tflops``: the ideal time, µs. §6."""
    return _nonneg("flops", flops) / (_positive("peak_tflops", peak_tflops) * 1e6)


def flops_utilization(ideal_us: float, time_us: float) -> float:
    """FLOPs utilization (fraction): the FLOPs' time at the peak of each one's dtype
    (``time_at_peak_us`` summed) over the time they took. MFU from recorded shapes is this with
    the step time; compute-only MFU with the step's compute time; a family's share of peak with
    its kernels' time. §6."""
    return _nonneg("ideal_us", ideal_us) / _positive("time_us", time_us)


def expected_compute_us(base_compute_us: float, base_flops: float, new_flops: float) -> float:
    """Compute time of a run whose work per GPU is ``new_flops`` if it ran at the efficiency
    measured with ``base_flops`` (perfect strong scaling of compute). §6."""
    return _nonneg("base_compute_us", base_compute_us) * _nonneg("new_flops", new_flops) \
        / _positive("base_flops", base_flops)


# --- §7 pipeline parallelism ----------------------------------------------------------------

def pipeline_bubble_fraction(stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Share of a pipeline's time its stages sit in the fill / drain bubble:
    ``(p − 1) / (v·m + p − 1)`` for GPipe and 1F1B (``v = 1``) and the interleaved 1F1B schedule
    with ``v`` model chunks per stage (Narayanan et al., SC 2021). §7."""
    p = int(_positive("stages", stages))
    m = int(_positive("microbatches", microbatches))
    v = int(_positive("virtual_stages", virtual_stages))
    return (p - 1) / (v * m + p - 1)


def pipeline_time(work_us: float, stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Time of one pipelined step whose stage computes ``work_us`` per step split into ``m``
    micro-batches: ``work · (v·m + p − 1) / (v·m)`` (transfers between stages left out). §7."""
    bubble = pipeline_bubble_fraction(stages, microbatches, virtual_stages)
    return _nonneg("work_us", work_us) / (1.0 - bubble)


def worked_examples() -> dict[str, float]:
    """The worked examples of docs/models.md (the HTML report's models appendix), computed by
    the formulas above so that they agree with them: S* on NVLink and on a NIC, a ring
    all-reduce of 25 MB on 8 GPUs split into its latency and bandwidth terms, a small message;
    for a 7B model (bf16 communication, 8 GPUs) the bytes each GPU sends per step and the static
    memory per GPU of DDP and ZeRO-1/2/3, of ZeRO-3 and HSDP at 70B; TFLOP/s and MFU at 4,200
    tokens/s."""
    ar = ring_allreduce_time(25e6, 8, 0.8, 450.0)
    return {
        "s_star_nvlink": crossover_bytes(0.8, 450.0),
        "s_star_nic": crossover_bytes(12.0, 45.0),
        "ar_latency": 14 * 0.8, "ar_bandwidth": ar - 14 * 0.8, "ar_total": ar,
        "small_msg": alpha_beta_time(4e3, 10.0, 45.0),
        "ddp_vol_7b": ddp_volume_bytes(7e9, 2, 8), "zero3_vol_7b": zero3_volume_bytes(7e9, 2, 8),
        "ddp_mem_7b": ddp_memory_bytes(7e9), "zero1_mem_7b": zero1_memory_bytes(7e9, 8),
        "zero2_mem_7b": zero2_memory_bytes(7e9, 8), "zero3_mem_7b": zero3_memory_bytes(7e9, 8),
        "zero3_mem_70b": zero3_memory_bytes(70e9, 64), "hsdp_mem_70b": hsdp_memory_bytes(70e9, 8),
        "tflops_7b": achieved_tflops_per_gpu(4200.0, 7e9, 1),
        "mfu_7b": mfu(4200.0, 7e9, 1, 989.0),
    }
