"""The link a process group's collectives run on (docs/models.md §2): NVLink (or the node's
intra-node fabric) inside a node; across nodes, the node's NICs shared by the group's members on
that node, never faster than the intra-node link. The one statement of this rule, and the one
``Link`` type: the job analysis, the job model, the rules and the what-if projection all use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from analyzer.model import formulas as models

if TYPE_CHECKING:
    from analyzer.model.hardware import HardwareAssumptions


@dataclass(frozen=True)
class Link:
    """α (µs) and β (one-way GB/s) of the link a group of ``n`` ranks on ``nodes`` node(s) runs
    its collectives on, and where the two came from (a fit of the group's own collectives, the
    hardware profile, a what-if target)."""

    alpha_us: float
    beta_gbps: float
    n: int = 1
    cross_node: bool = False
    nodes: int = 1
    source: str = ""

    def time_us(self, kind: str, size_bytes: float, n: int | None = None) -> float:
        """The α-β model time of one collective on this link (its own group size unless ``n``)."""
        return models.collective_time(kind, size_bytes, self.n if n is None else n, self.alpha_us, self.beta_gbps)

    @property
    def s_star_bytes(self) -> float:
        return models.crossover_bytes(self.alpha_us, self.beta_gbps)

    def evidence(self) -> dict[str, Any]:
        return {"alpha_us": self.alpha_us, "beta_gbps": self.beta_gbps, "n": self.n,
                "cross_node": self.cross_node, "nodes": self.nodes,
                "s_star_bytes": round(self.s_star_bytes), "source": self.source}


def cross_node_beta(intra_gbps: float, nics_per_node: float, nic_gbps: float,
                    members_per_node: float, gpus_per_node: float) -> float:
    """One-way GB/s per GPU of a group spanning nodes:
    ``min(β_intra, nics_per_node × β_nic × members_per_node / gpus_per_node)``: each member
    gets its share of the node's NICs, all of them when every GPU of the node is a member."""
    share = min(1.0, members_per_node / gpus_per_node)
    return min(intra_gbps, nics_per_node * nic_gbps * share)


def node_nic_gbps(group_beta_gbps: float, members_per_node: float, gpus_per_node: float) -> float:
    """The node's aggregate NIC bandwidth a measured cross-node β implies (the inverse of
    ``cross_node_beta`` below the intra-node cap)."""
    return group_beta_gbps / min(1.0, members_per_node / gpus_per_node)


def hardware_link(hardware: HardwareAssumptions, cross_node: bool, members_per_node: float | None
                  ) -> tuple[float | None, float | None, str]:
    """(α µs, β GB/s, where from) of a group from the resolved hardware: the intra-node link
    inside a node, else the NIC rule above."""
    intra_alpha, intra_beta = hardware.intra_node_alpha_us.value, hardware.intra_node_gbps.value
    if not cross_node:
        return intra_alpha, intra_beta, "hardware profile (intra-node link)"
    nic, nics, gpn = hardware.nic_gbps.value, hardware.nics_per_node.value, hardware.gpus_per_node.value
    if nic is None or not nics or not gpn or intra_beta is None:
        return hardware.nic_alpha_us.value, None, "hardware profile (NIC; β unknown)"
    per_node = members_per_node or gpn
    return (hardware.nic_alpha_us.value, round(cross_node_beta(intra_beta, nics, nic, per_node, gpn), 3),
            f"hardware profile ({nics} NIC(s) per node x {nic} GB/s, shared by {per_node:g} of {gpn} GPUs per node)")


def profile_link(hardware: HardwareAssumptions, n: int, nodes: int, members: int | None = None) -> Link | None:
    """The link the hardware profile gives a group of ``n`` ranks (``members`` of them listed) on
    ``nodes`` node(s); None when the profile does not know the intra-node link (CPU-only traces,
    an unrecognised GPU)."""
    if hardware.intra_node_gbps.value is None or hardware.intra_node_alpha_us.value is None:
        return None
    alpha, beta, _ = hardware_link(hardware, nodes > 1, (members or n) / max(nodes, 1))
    if alpha is None or beta is None:
        return None
    if nodes <= 1:
        return Link(alpha, beta, n, False, 1, f"profile {hardware.gpu_profile.value} intra-node link")
    return Link(alpha, beta, n, True, nodes,
                f"profile: {hardware.nics_per_node.value} x {hardware.nic_gbps.value:g} GB/s NICs per node "
                f"({hardware.nics_per_node.origin})")


def group_link(fit: dict[str, Any] | None, hardware: HardwareAssumptions, n: int, nodes: int,
               members: int | None = None) -> Link | None:
    """The link of a process group: the job analysis's α/β fit of its collectives when there is
    one (``fit``: its ``groups[]`` entry), else the hardware profile's."""
    if fit and fit.get("alpha_us") is not None and fit.get("beta_gbps"):
        # the analysis's entry holds the profile's α/β when it made no fit: say so, not "fitted"
        unfitted = fit.get("fit_source") == "profile"
        source = str(fit.get("fit") or "hardware profile").split(": ")[0] if unfitted \
            else f"fitted ({fit.get('fit') or 'job analysis'})"
        return Link(float(fit["alpha_us"]), float(fit["beta_gbps"]), n, bool(fit.get("cross_node", nodes > 1)),
                    int(fit.get("nodes") or nodes), source)
    return profile_link(hardware, n, nodes, members)
