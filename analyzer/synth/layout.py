"""Static layout of a job: parameters, DDP buckets, FSDP units and process groups."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .physics import SimLink, group_link
from .spec import DTYPE_BYTES, JobSpec


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class LayoutBucket:
    index: int  # launch order (0 = first, holds the last layers' gradients)
    params: tuple[str, ...]
    numel: int
    nbytes: int


@dataclass(frozen=True)
class Unit:
    """One FSDP unit (FSDP1 FlatParameter / FSDP2 param group); fqn "" is the root."""

    index: int
    fqn: str
    params: tuple[Param, ...]
    padded_numel: int  # all-gather output / reduce-scatter input, in elements

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


@dataclass(frozen=True)
class LayoutProcessGroup:
    name: str
    desc: str
    ranks: tuple[int, ...]
    link: SimLink

    @property
    def size(self) -> int:
        return len(self.ranks)


def layer_params(spec: JobSpec, i: int) -> list[Param]:
    """Registration order of one block's parameters."""
    d, f, p = spec.hidden, spec.ffn, f"layers.{i}."
    out = []
    for name, shape, bias in (
        ("norm1", (d,), (d,)),
        ("attn.qkv", (3 * d, d), (3 * d,)),
        ("attn.out", (d, d), (d,)),
        ("norm2", (d,), (d,)),
        ("mlp.fc1", (f, d), (f,)),
        ("mlp.fc2", (d, f), (d,)),
    ):
        out.append(Param(f"{p}{name}.weight", shape))
        if spec.bias:
            out.append(Param(f"{p}{name}.bias", bias))
    return out


def embedding_params(spec: JobSpec) -> list[Param]:
    return [Param("tok_embeddings.weight", (spec.vocab_size, spec.hidden))]


def head_params(spec: JobSpec) -> list[Param]:
    out = [Param("norm.weight", (spec.hidden,))]
    if spec.bias:
        out.append(Param("norm.bias", (spec.hidden,)))
    out.append(Param("output.weight", (spec.vocab_size, spec.hidden)))
    return out


def model_params(spec: JobSpec) -> list[Param]:
    """All parameters in registration (module definition) order."""
    params = embedding_params(spec)
    for i in range(spec.n_layers):
        params += layer_params(spec, i)
    return params + head_params(spec)


def ddp_buckets(spec: JobSpec) -> list[LayoutBucket]:
    """torch's compute_bucket_assignment_by_size over the reversed parameter list: fill a bucket
    until it reaches its cap (first bucket: first_bucket_mb, then bucket_cap_mb; MiB), then close."""
    elem = DTYPE_BYTES[spec.grad_dtype]
    caps = (int(spec.first_bucket_mb * 2**20), int(spec.bucket_cap_mb * 2**20))
    buckets: list[LayoutBucket] = []
    names: list[str] = []
    numel = 0
    for param in reversed(model_params(spec)):
        names.append(param.name)
        numel += param.numel
        if numel * elem >= caps[min(len(buckets), 1)]:
            buckets.append(LayoutBucket(len(buckets), tuple(names), numel, numel * elem))
            names, numel = [], 0
    if names:
        buckets.append(LayoutBucket(len(buckets), tuple(names), numel, numel * elem))
    return buckets


def fsdp_units(spec: JobSpec, shard_size: int) -> list[Unit]:
    """Root unit first (embedding, final norm, head; or everything without a wrap policy)."""
    if spec.fsdp_wrap == "none":
        groups = [("", model_params(spec))]
    else:
        groups = [("", embedding_params(spec) + head_params(spec))]
        groups += [(f"layers.{i}", layer_params(spec, i)) for i in range(spec.n_layers)]
    return [
        Unit(k, fqn, tuple(params), _padded_numel(spec, params, shard_size))
        for k, (fqn, params) in enumerate(groups)
    ]


def _padded_numel(spec: JobSpec, params: list[Param], n: int) -> int:
    if spec.strategy == "fsdp2":  # per-parameter dim-0 sharding, each padded to n rows
        return sum(math.ceil(p.shape[0] / n) * n * math.prod(p.shape[1:]) for p in params)
    total = sum(p.numel for p in params)  # FSDP1: one flat parameter padded to n
    return math.ceil(total / n) * n


@dataclass(frozen=True)
class Groups:
    """The process groups each rank belongs to, by role, plus torch's pg_count."""

    world: LayoutProcessGroup
    shard: list[LayoutProcessGroup]  # FSDP shard groups (the world group unless hybrid)
    replicate: list[LayoutProcessGroup]  # HSDP replicate groups (empty otherwise)
    pg_count: int

    def of(self, role: str, rank: int) -> LayoutProcessGroup:
        if role == "world":
            return self.world
        return next(g for g in getattr(self, role) if rank in g.ranks)

    def labels(self, role: str, world_size: int) -> list[int]:
        """Index of each rank's group of this role (used to synchronise collectives)."""
        if role == "world":
            return [0] * world_size
        groups = getattr(self, role)
        return [next(k for k, g in enumerate(groups) if r in g.ranks) for r in range(world_size)]

    def member_groups(self, rank: int) -> list[LayoutProcessGroup]:
        found = [self.world] + [g for g in self.shard + self.replicate if rank in g.ranks]
        unique = {g.name: g for g in found}
        return sorted(unique.values(), key=lambda g: int(g.name))


def process_groups(spec: JobSpec) -> Groups:
    """Names and descriptions as torch creates them: default pg "0"; HSDP through DeviceMesh
    (FSDP2: replicate dim first, desc mesh_<dim>) or FSDP1's new_subgroups + new_group ("undefined")."""
    n, g = spec.world_size, spec.ranks_per_node
    world = _group(spec, "0", "default_pg", range(n))
    if spec.strategy == "ddp" or spec.sharding != "hybrid_shard":
        return Groups(world, [world], [], 1)
    nodes = spec.n_nodes
    intra = [list(range(k * g, (k + 1) * g)) for k in range(nodes)]
    inter = [[lr + k * g for k in range(nodes)] for lr in range(g)]
    if spec.strategy == "fsdp2":
        replicate = [_group(spec, str(1 + j), "mesh_replicate", r) for j, r in enumerate(inter)]
        shard = [_group(spec, str(1 + g + k), "mesh_shard", r) for k, r in enumerate(intra)]
    else:
        shard = [_group(spec, str(1 + k), "undefined", r) for k, r in enumerate(intra)]
        replicate = [_group(spec, str(1 + nodes + j), "undefined", r) for j, r in enumerate(inter)]
    return Groups(world, shard, replicate, 1 + g + nodes)


def _group(spec: JobSpec, name: str, desc: str, ranks) -> LayoutProcessGroup:
    ranks = tuple(ranks)
    return LayoutProcessGroup(name, desc, ranks, group_link(spec, list(ranks)))
