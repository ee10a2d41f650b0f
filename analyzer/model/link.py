"""The link a process group's collectives run on (docs/models.md §2): NVLink (or the node's
intra-node fabric) inside a node; across nodes, the node's NICs shared by the group's members on
that node, never faster than the intra-node link. The one statement of this rule: the job
analysis, the rules and the what-if projection all call it."""

from __future__ import annotations

from typing import Any


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


def hardware_link(hardware: Any, cross_node: bool, members_per_node: float | None
                  ) -> tuple[float | None, float | None, str]:
    """(α µs, β GB/s, where from) of a group from resolved hardware (``HardwareAssumptions`` or
    its ``to_dict()``): the intra-node link inside a node, else the NIC rule above."""
    value = (lambda k: hardware[k]["value"]) if isinstance(hardware, dict) else (lambda k: getattr(hardware, k).value)
    intra_alpha, intra_beta = value("intra_node_alpha_us"), value("intra_node_gbps")
    if not cross_node:
        return intra_alpha, intra_beta, "hardware profile (intra-node link)"
    nic, nics, gpn = value("nic_gbps"), value("nics_per_node"), value("gpus_per_node")
    if nic is None or not nics or not gpn or intra_beta is None:
        return value("nic_alpha_us"), None, "hardware profile (NIC; β unknown)"
    per_node = members_per_node or gpn
    return (value("nic_alpha_us"), round(cross_node_beta(intra_beta, nics, nic, per_node, gpn), 3),
            f"hardware profile ({nics} NIC(s) per node x {nic} GB/s, shared by {per_node:g} of {gpn} GPUs per node)")
