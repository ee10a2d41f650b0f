"""Parallelism and process-group roles: which dimension (data, tensor, pipeline, expert,
context parallel) each process group serves, the size of each dimension and the evidence, and
the name of the combination (``job.strategy``).

Evidence, strongest first: the group's description (torch DeviceMesh's ``mesh_<dim>``, as
torchtitan names its dims; Megatron-LM's ``TENSOR_MODEL_PARALLEL_GROUP``...); the kernels'
library (DeepEP / pplx dispatch-combine = expert parallel); the collectives the group runs
(send/recv only = pipeline; all-to-all = expert; all-reduces launched in forward = tensor
parallel; FSDP-annotated all-gathers / reduce-scatters = sharded data parallel; backward
all-reduces = data parallel); framework markers (Megatron's TP autograd functions, pipeline
schedule ranges, MoE dispatch annotations). A group nothing identifies keeps role ``unknown``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.job.columns import CollectiveColumns, distinct_rows

DIMS = ("dp", "dp_shard", "dp_replicate", "tp", "pp", "ep", "cp")
EXPERT_LIBRARIES = ("deepep", "pplx")
# Custom all-reduce / overlap kernels: tensor-parallel reductions (vLLM, sglang, TensorRT-LLM,
# TransformerEngine userbuffers, PyTorch symmetric memory).
TP_LIBRARIES = ("custom_allreduce", "userbuffers", "symm_mem")
POINT_TO_POINT = ("send", "recv", "sendrecv")

# torch DeviceMesh names a sub-mesh's group "mesh_<dim>" (torchtitan's dims: dp_replicate,
# dp_shard, dp_shard_cp, dp_cp, cp, tp, pp, ep, dp_shard_mod_ep, dp_shard_in_ep); a flattened
# dim joins several ("dp_shard_cp" = FSDP over dp_shard x cp).
_MESH_DIMS = ("dp_replicate", "dp_shard", "dp", "tp", "pp", "cp", "ep")
# Megatron-LM parallel_state group_desc values (the longest first: prefixes overlap).
_MEGATRON = (
    ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp+ep"), ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp+ep+pp"),
    ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("TENSOR_AND_DATA_PARALLEL_GROUP", "tp+dp"),
    ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp+cp"), ("TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"), ("POSITION_EMBEDDING_GROUP", "embedding"),
    ("EMBEDDING_GROUP", "embedding"), ("MODEL_PARALLEL_GROUP", "tp+pp"),
    ("INTRA_PARTIAL_DATA_PARALLEL_GROUP", "dp_shard"), ("INTER_PARTIAL_DATA_PARALLEL_GROUP", "dp_replicate"),
    ("DATA_PARALLEL_GROUP", "dp"), ("CONTEXT_PARALLEL_GROUP", "cp"),
)


def role_key(row_or_group: dict[str, Any], collective: str | None = None) -> str:
    """The key a group's role is stored under (JSON-safe): its name, else its ranks, else
    ``unknown:<collective>`` as analyzer.job.crossrank.group_key tells groups apart."""
    group = row_or_group.get("group", row_or_group) if "group" in row_or_group else row_or_group
    if group.get("name") is not None:
        return str(group["name"])
    if group.get("ranks"):
        return "ranks:" + ",".join(str(r) for r in group["ranks"])
    return f"unknown:{collective if collective is not None else row_or_group.get('collective')}"


def is_data_parallel(role: str | None) -> bool:
    """Whether a role's collectives feed the DDP bucket / FSDP unit models and rules."""
    return role is None or role in ("unknown", "world") or role.startswith("dp")


# Libraries of data-parallel collectives (None: a CPU-side row whose backend is not known).
DP_LIBRARIES = ("nccl", "rccl", "gloo", "mpi", "ucc", None)


def is_data_parallel_row(row: dict[str, Any], roles: dict[str, str]) -> bool:
    """Whether a collective row belongs to data parallelism: a data-parallel group's, issued by
    a c10d backend's library (a DeepEP or custom all-reduce kernel never is)."""
    return row.get("library") in DP_LIBRARIES and is_data_parallel(roles.get(role_key(row)))


def data_parallel_mask(view: CollectiveColumns, roles: dict[str, str]) -> np.ndarray:
    """``is_data_parallel_row`` of every row of the view, as a boolean array."""
    key_code, keys = view.group_keys(role_key)
    by_key = np.array([is_data_parallel(roles.get(key)) for key in keys], dtype=bool)
    by_library = np.array([library in DP_LIBRARIES for library in view.library.names], dtype=bool)
    if not view.n:
        return np.zeros(0, dtype=bool)
    return by_key[key_code] & by_library[view.library.codes]


def description_role(description: str | None) -> str | None:
    """The role a group description names (DeviceMesh ``mesh_<dim>``, Megatron group names)."""
    if not description:
        return None
    text = description.strip()
    if text in ("default_pg", "mesh_default"):
        return "world"
    mesh = re.fullmatch(r"mesh_(\w+)", text)
    if mesh:
        return _mesh_role(mesh.group(1))
    upper = text.upper()
    for name, role in _MEGATRON:
        if upper.startswith(name):
            return role
    return None


# FSDP2's HSDP examples name the 2-D mesh ("replicate", "shard").
_MESH_ALIASES = {"replicate": "dp_replicate", "shard": "dp_shard"}


def _mesh_role(dim: str) -> str | None:
    if dim in _MESH_DIMS:
        return dim
    if dim in _MESH_ALIASES:
        return _MESH_ALIASES[dim]
    if dim.startswith("dim_"):
        return None  # an unnamed mesh dimension
    parts, rest = [], dim
    while rest:  # a flattened dim: its parts, longest names first
        part = next((d for d in _MESH_DIMS if rest == d or rest.startswith(d + "_")), None)
        if part is None:
            # torchtitan's expert meshes: dp_shard_mod_ep shards experts' weights (FSDP),
            # dp_shard_in_ep is the part of dp_shard inside the expert-parallel group
            return "dp_shard" if dim.startswith("dp_shard_mod_ep") else ("ep" if dim.endswith("in_ep") else None)
        parts.append(part)
        rest = rest[len(part) + 1:]
    return "+".join(parts)


class _Group:
    def __init__(self, key: str, info: dict[str, Any]):
        self.key = key
        self.name, self.description = info.get("name"), info.get("description")
        self.ranks, self.size = info.get("ranks"), info.get("size")
        self.kinds: Counter = Counter()
        self.forward_allreduces = 0
        self.other_allreduces = 0  # outside forward and backward (a job with no backward: inference)
        self.backward_allreduces = 0
        self.fsdp_rows = 0
        self.libraries: set[str] = set()

    def add(self, kind: str, library: str | None, phase: str | None, fsdp: bool, count: int = 1) -> None:
        """``count`` rows of one collective kind, library, phase and FSDP annotation."""
        self.kinds[kind] += count
        if library:
            self.libraries.add(library)
        if kind == "allreduce":
            self.forward_allreduces += count * (phase == "forward")
            self.other_allreduces += count * (phase == "other")
            self.backward_allreduces += count * (phase == "backward")
        self.fsdp_rows += count * fsdp

    def members(self) -> int | None:
        return self.size or (len(self.ranks) if self.ranks else None)


def infer_parallelism(ranks: list[Any], collectives: list[dict[str, Any]], dp_strategy: str,
                      world_size: int | None, columns: CollectiveColumns | None = None) -> dict[str, Any]:
    """``{"parallelism", "strategy", "process_groups", "group_roles"}`` of a job (plain data);
    ``columns``: the view of ``collectives`` when the caller has it."""
    markers = Counter()
    for r in ranks:
        markers.update({k: v for k, v in (r.markers_seen or {}).items() if v})
    groups: dict[str, _Group] = {}
    for r in ranks:
        for pg in r.process_groups or []:
            key = role_key(pg)
            groups.setdefault(key, _Group(key, pg))
    # Rows counted by what the roles read (a handful of distinct combinations per group).
    view = columns if columns is not None else CollectiveColumns(collectives)
    key_code, keys = view.group_keys(role_key)
    combos: Counter = Counter()
    if view.n:
        first, counts, _ = distinct_rows([key_code, view.kind.codes, view.library.codes, view.phase.codes,
                                          view.module_known])
        for row, count in zip(first.tolist(), counts.tolist()):
            combos[keys[key_code[row]], view.kind.at(row), view.library.at(row),
                   view.phase.at(row), bool(view.module_known[row])] = count
        for key, row in zip(keys, unique_ints(key_code, return_index=True)[1].tolist()):
            groups.setdefault(key, _Group(key, collectives[row].get("group") or {}))
    for (key, kind, library, phase, fsdp), count in combos.items():
        groups[key].add(kind, library, phase, fsdp, count)
    world = world_size or len(ranks)
    declared = max((len(r.process_groups or []) for r in ranks), default=0)
    if not any(phase == "backward" for _, _, _, phase, _ in combos):
        for g in groups.values():  # no backward pass anywhere: all-reduces in the forward pass
            g.forward_allreduces += g.other_allreduces
    roles = {key: _role(g, dp_strategy, markers, world, declared) for key, g in groups.items()}
    parallelism = _dimensions(groups, roles, world, markers)
    return {
        "parallelism": parallelism,
        "strategy": strategy_name(dp_strategy, parallelism, markers, roles),
        "process_groups": [{"key": key, "name": g.name, "description": g.description, "ranks": g.ranks,
                            "size": g.members(), "role": roles[key][0], "evidence": roles[key][1],
                            "collectives": dict(sorted(g.kinds.items()))}
                           for key, g in sorted(groups.items())],
        "group_roles": {key: role for key, (role, _) in sorted(roles.items())},
    }


def _role(g: _Group, dp_strategy: str, markers: Counter, world: int, declared: int) -> tuple[str, str]:
    """(role, evidence) of one group."""
    named = description_role(g.description)
    if named == "dp" and dp_strategy.startswith("fsdp"):
        return "dp_shard", f"group description {g.description!r} in an FSDP job"
    if named and named != "world":
        return named, f"group description {g.description!r}"
    kinds = set(g.kinds)
    if g.libraries & set(EXPERT_LIBRARIES):
        return "ep", f"{'/'.join(sorted(g.libraries & set(EXPERT_LIBRARIES)))} dispatch/combine kernels"
    if g.libraries & set(TP_LIBRARIES):
        return "tp", f"{'/'.join(sorted(g.libraries & set(TP_LIBRARIES)))} kernels (tensor-parallel reductions)"
    if g.key.startswith("unknown:") and declared > 1:
        # no group metadata (gloo records none) while several groups exist: these rows mix them
        return "unknown", f"collectives without group metadata in a job of {declared} process groups"
    if kinds and kinds <= set(POINT_TO_POINT):
        return "pp", "only send/recv between ranks (pipeline stages)"
    if "alltoall" in kinds:
        if markers["expert"]:
            return "ep", f"all-to-all with MoE dispatch/combine markers (x{markers['expert']})"
        if dp_strategy == "ddp":
            if g.backward_allreduces:  # DLRM-style: the same group also reduces the dense gradients
                return "dp+embedding", "all-to-all (sharded embeddings) and backward all-reduces in a DDP job"
            return "embedding", "all-to-all in a DDP job (sharded embeddings)"
        return "ep", "all-to-all (token routing)"
    small = (g.members() or world) < world
    tp_markers = markers["megatron_tp"] + markers["megatron_sp"] + markers["megatron_vocab"]
    if g.forward_allreduces and (small or tp_markers or markers["dtensor"] or dp_strategy == "unknown"):
        why = "all-reduces launched in forward"
        if tp_markers:
            why += f", Megatron tensor-parallel markers (x{tp_markers})"
        if markers["dtensor"]:
            why += f", DTensor to/from-local and redistribute markers (x{markers['dtensor']})"
        return "tp", why + (f" in a group of {g.members()} of {world} ranks" if small else "")
    if dp_strategy.startswith("fsdp") and kinds == {"allreduce"} and g.backward_allreduces:
        return "dp_replicate", "FSDP job: gradient all-reduces only, across shard groups (HSDP replicas)"
    if dp_strategy.startswith("fsdp") and (g.fsdp_rows or {"allgather", "reduce_scatter"} & kinds):
        return "dp_shard", "FSDP all-gathers / reduce-scatters" + (" (FSDP2 module annotations)" if g.fsdp_rows else "")
    if g.backward_allreduces:
        return "dp", "all-reduces in backward (gradient reduction)"
    if named == "world":
        return "world", f"the default group ({g.description})"
    return "unknown", "no description and no collective pattern that names a role"


def _dimensions(groups: dict[str, _Group], roles: dict[str, tuple[str, str]], world: int,
                markers: Counter) -> dict[str, dict[str, Any]]:
    dims: dict[str, dict[str, Any]] = {}
    for key, g in sorted(groups.items()):
        role, evidence = roles[key]
        role = _DIM_OF_ROLE.get(role, role)
        if role not in DIMS:  # flattened dims (dp_shard+cp) have no size of their own
            continue
        size = g.members() or world
        entry = dims.setdefault(role, {"size": size, "evidence": []})
        entry["size"] = max(entry["size"], size)
        stride = _stride(g.ranks)
        where = f"group {g.description or g.name or key!s}"
        if g.ranks:
            where += f" ranks {g.ranks[:8]}{'...' if len(g.ranks) > 8 else ''}"
            where += f" (stride {stride})" if stride else ""
        line = f"{where}: {evidence}"
        if line not in entry["evidence"]:
            entry["evidence"].append(line)
    if "pp" in dims and markers["pipeline"]:
        dims["pp"]["evidence"].append(f"pipeline schedule ranges (x{markers['pipeline']})")
    if "ep" in dims and markers["expert"]:
        dims["ep"]["evidence"].append(f"MoE dispatch/combine markers (x{markers['expert']})")
    return dims


# A group serving two purposes counts for its data-parallel one.
_DIM_OF_ROLE = {"dp+embedding": "dp"}


def _stride(ranks: list[int] | None) -> int | None:
    if not ranks or len(ranks) < 2:
        return None
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    return steps.pop() if len(steps) == 1 else None


def strategy_name(dp_strategy: str, parallelism: dict[str, Any], markers: Counter,
                  roles: dict[str, tuple[str, str]]) -> str:
    """``fsdp2+tp``, ``megatron tp+pp``, ``ddp + sharded embeddings``, ``expert parallel``..."""
    model_dims = [d for d in ("tp", "pp", "cp", "ep") if d in parallelism]
    megatron = any(markers[k] for k in ("megatron_tp", "megatron_sp", "megatron_vocab"))
    embeddings = any(role in ("embedding", "dp+embedding") for role, _ in roles.values())
    dp = dp_strategy if dp_strategy != "unknown" else None
    if dp == "ddp" and embeddings and not model_dims:
        return "ddp + sharded embeddings"
    if dp is None and model_dims == ["ep"]:
        return "expert parallel"
    if megatron and model_dims:
        return "megatron " + "+".join(model_dims)
    if dp and dp.startswith("fsdp") and "dp_replicate" in parallelism:
        dp = f"hsdp ({dp})"
    parts = ([dp] if dp else []) + model_dims
    return "+".join(parts) if parts else "unknown"
