"""Topology: ranks to nodes from host names, --gpus-per-node or deviceProperties, groups labelled."""

from types import SimpleNamespace

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.job.topology import DEFAULT_GPUS_PER_NODE, build_topology


def rank(r, host=None, devices=8, world=16):
    return SimpleNamespace(rank=r, host=host, devices=[{"name": "NVIDIA H100 80GB HBM3"}] * devices,
                           world_size=world)


def test_host_names_give_nodes_and_gpus_per_node():
    ranks = [rank(r, host=f"h{r // 4}", world=8) for r in range(8)]
    topo = build_topology(ranks)
    assert (topo.gpus_per_node, topo.gpus_per_node_source, topo.n_nodes) == (4, "host names", 2)
    assert topo.label_group([0, 1, 2, 3]) == {"nodes": 1, "cross_node": False, "ranks_per_node": 4.0}
    assert topo.label_group(list(range(8)))["nodes"] == 2
    assert topo.label_group([0, 4]) == {"nodes": 2, "cross_node": True, "ranks_per_node": 1.0}


def test_hosts_that_disagree_with_the_layout_win():
    # Round-robin placement: even ranks on one host, odd on the other.
    ranks = [rank(r, host=f"h{r % 2}", world=4) for r in range(4)]
    topo = build_topology(ranks)
    assert topo.label_group([0, 2])["cross_node"] is False
    assert topo.label_group([0, 1])["cross_node"] is True


def test_user_gpus_per_node_uses_the_torchrun_layout():
    ranks = [rank(r) for r in range(16)]
    topo = build_topology(ranks, gpus_per_node=4)
    assert (topo.gpus_per_node, topo.gpus_per_node_source, topo.n_nodes) == (4, "--gpus-per-node", 4)
    assert topo.label_group([3, 4]) == {"nodes": 2, "cross_node": True, "ranks_per_node": 1.0}


def test_device_properties_count_when_consistent_else_default():
    assert build_topology([rank(r, devices=2) for r in range(4)]).gpus_per_node == 2
    mixed = build_topology([rank(0, devices=2), rank(1, devices=4)])
    assert (mixed.gpus_per_node, mixed.gpus_per_node_source) == (DEFAULT_GPUS_PER_NODE, "default")
    assert any("assumed 8" in note for note in mixed.notes)


def test_subset_with_hosts_falls_back_to_layout_for_unknown_members():
    ranks = [rank(0, host="a", world=16), rank(9, host="b", world=16)]
    topo = build_topology(ranks)
    assert topo.gpus_per_node_source == "deviceProperties"  # hosts of 2 of 16 ranks count nothing
    assert topo.label_group([0, 9]) == {"nodes": 2, "cross_node": True, "ranks_per_node": 1.0}
    assert topo.label_group(list(range(8)))["nodes"] == 1  # layout: ranks 0-7 on node0
    assert topo.label_group(None)["cross_node"] is None


def test_groups_in_json_carry_nodes(real_traces):
    result = diagnose([str(real_traces / "hta_ddp_rank0_of_2")], DiagnoseOptions(workers=1))
    topo = result.topology
    assert (topo["gpus_per_node"], topo["gpus_per_node_source"]) == (8, "deviceProperties")
    (group,) = result.groups
    assert (group["ranks"], group["nodes"], group["cross_node"]) == ([0, 1], 1, False)
    result = diagnose([str(real_traces / "hta_ddp_rank0_of_2")], DiagnoseOptions(workers=1, gpus_per_node=1))
    assert result.groups[0]["cross_node"] is True
