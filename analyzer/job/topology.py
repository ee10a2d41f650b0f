"""Ranks to nodes, and every process group labelled intra- or cross-node.

Sources, in order: ``distributedInfo.host_name`` of every rank of the job; else a GPUs-per-node
count (``--gpus-per-node``, else the number of ``deviceProperties`` entries when all ranks agree,
else 8) with torchrun's layout (node = rank // gpus_per_node). Host names of a subset of ranks
say nothing about the others, so a group with a rank of unknown host falls back to the layout.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Topology:
    gpus_per_node: int
    gpus_per_node_source: str  # "host names" | "--gpus-per-node" | "deviceProperties" | "default"
    world_size: int | None
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host name (ranks that have one)
    notes: tuple[str, ...] = ()

    def node_of(self, rank: int) -> str:
        """Node label of a global rank: its host name, else ``node<rank // gpus_per_node>``."""
        if rank in self.hosts:
            return self.hosts[rank]
        return f"node{rank // self.gpus_per_node}"

    def nodes_of(self, ranks: Iterable[int]) -> list[str]:
        ranks = list(ranks)
        if self.hosts and not all(r in self.hosts for r in ranks):
            # Mixed sources would compare host names with layout labels: use the layout alone.
            return sorted({f"node{r // self.gpus_per_node}" for r in ranks})
        return sorted({self.node_of(r) for r in ranks})

    @property
    def n_nodes(self) -> int | None:
        if self.world_size is None:
            return len(set(self.hosts.values())) or None
        return len(self.nodes_of(range(self.world_size)))

    def label_group(self, ranks: list[int] | None) -> dict[str, Any]:
        """``{nodes, cross_node, ranks_per_node}`` of a group (None values when ranks unknown)."""
        if not ranks:
            return {"nodes": None, "cross_node": None, "ranks_per_node": None}
        nodes = self.nodes_of(ranks)
        return {"nodes": len(nodes), "cross_node": len(nodes) > 1,
                "ranks_per_node": len(ranks) / len(nodes)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], world_size: int | None) -> "Topology":
        """The inverse of ``to_dict`` (a Result's ``topology`` section; the job's world size)."""
        hosts = {int(r): h for r, h in (doc.get("rank_hosts") or {}).items()}
        return cls(int(doc["gpus_per_node"]), str(doc.get("gpus_per_node_source") or "default"), world_size,
                   hosts, tuple(doc.get("notes") or ()))

    def to_dict(self) -> dict[str, Any]:
        world = self.world_size
        layout = ({str(r): self.node_of(r) for r in range(world)}
                  if world and len(self.hosts) == world else None)
        return {"gpus_per_node": self.gpus_per_node, "gpus_per_node_source": self.gpus_per_node_source,
                "n_nodes": self.n_nodes, "hosts": sorted(set(self.hosts.values())),
                "rank_hosts": {str(r): h for r, h in sorted(self.hosts.items())},
                "node_of_rank": layout, "notes": list(self.notes)}


def build_topology(ranks: list[Any], gpus_per_node: int | None = None) -> Topology:
    """Topology of a job from its RankAnalysis list (fields ``rank``, ``host``, ``devices``,
    ``world_size``); ``gpus_per_node``: the user's value, which wins over every other source."""
    world = next((r.world_size for r in ranks if r.world_size), None)
    hosts = {r.rank: r.host for r in ranks if r.host}
    notes = []
    if hosts and len(hosts) < len(ranks):
        notes.append(f"{len(ranks) - len(hosts)} rank(s) without a host name: hosts ignored")
        hosts = {}
    if gpus_per_node is not None:
        return Topology(gpus_per_node, "--gpus-per-node", world, hosts, tuple(notes))
    counted = _gpus_per_node_from_hosts(hosts, world)
    if counted is not None:
        return Topology(counted, "host names", world, hosts, tuple(notes))
    device_counts = {len(r.devices) for r in ranks if r.devices}
    if len(device_counts) == 1:
        count = device_counts.pop()
        return Topology(count, "deviceProperties", world, hosts, tuple(notes))
    if len(device_counts) > 1:
        notes.append(f"ranks list different numbers of deviceProperties {sorted(device_counts)}")
    notes.append(f"GPUs per node unknown: assumed {DEFAULT_GPUS_PER_NODE} (torchrun layout); "
                 "pass --gpus-per-node to set it")
    return Topology(DEFAULT_GPUS_PER_NODE, "default", world, hosts, tuple(notes))


def _gpus_per_node_from_hosts(hosts: dict[int, str], world: int | None) -> int | None:
    """Ranks per host when every rank of the job is given with a host and all hosts agree."""
    if not hosts or (world is not None and len(hosts) < world):
        return None
    counts = set(Counter(hosts.values()).values())
    return counts.pop() if len(counts) == 1 else None
