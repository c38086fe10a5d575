"""The shipped cluster topologies (4, 8 and 32 DGX H100 nodes; 2 and 4 DGX A100 nodes): they
load with their world sizes and nodes, every GPU reaches any other node over its own NIC at
the NIC's rate and its own node over NVSwitch, and named plans price on them."""
from __future__ import annotations

import pytest

from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.optimizer.api import named_plan
from einsummable.topology import load_topology, shipped_topologies

GB = 1e9
# name -> (nodes, NVSwitch port GB/s, NIC GB/s): DGX H100 8 x 400 Gb/s, DGX A100 8 x 200 Gb/s
CLUSTERS = {"h100x8x4": (4, 450, 50), "h100x8x8": (8, 450, 50), "h100x8x32": (32, 450, 50),
            "a100x8x2": (2, 300, 25), "a100x8x4": (4, 300, 25)}
GPUS_PER_NODE = 8


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_cluster_loads_with_its_nodes_and_links(name):
    assert name in shipped_topologies()
    nodes, nvswitch, nic = CLUSTERS[name]
    t = load_topology(name)
    assert t.name == name and t.source_notes.strip()
    assert t.world_size == nodes * GPUS_PER_NODE and t.num_nodes == nodes
    assert [lv.name for lv in t.levels] == ["node", "gpu"]
    assert all(len(t.devices_in_node(n)) == GPUS_PER_NODE for n in range(nodes))
    last = t.world_size - 1
    inside, across, cross = t.link(0, 1), t.link(0, last - 7), t.link(1, last)
    assert inside.kind == "nvswitch" and inside.port_bw == pytest.approx(nvswitch * GB)
    assert across.kind == "ib" and across.bw == pytest.approx(nic * GB)
    assert across.port_bw == pytest.approx(nic * GB)
    # a cross pair leaves through the sender's own NIC, shared with its other cross traffic
    assert cross.shared == t.link(1, last - 1).shared != across.shared
    assert t.route(0, last)[0].src == 0 and t.route(0, last)[-1].dst == last


def _tiny(world: int):
    # llama-tiny with a sequence per device: data parallelism splits it every way
    return llama_block_graph(preset_config("llama-tiny"), world, 8, dtype="float16")


@pytest.mark.parametrize("name", ["a100x8x2", "a100x8x4", "h100x8x4", "h100x8x8"])
def test_named_plans_price_on_clusters(name):
    t = load_topology(name)
    g = _tiny(t.world_size)
    plan = named_plan(g, t, "data-parallel")
    assert plan.objective_s > 0 and plan.topology.world_size == t.world_size
    assert {d for c in plan.chosen.values() for ds in c.devices for d in ds} == set(range(t.world_size))


def test_a_llama_7b_block_prices_on_two_a100_nodes():
    t = load_topology("a100x8x2")
    g = llama_block_graph(preset_config("llama-7b"), 16, 2048, dtype="float16")
    tp, dp = named_plan(g, t, "megatron-tp"), named_plan(g, t, "data-parallel")
    assert tp.objective_s > 0 and dp.objective_s > 0


@pytest.mark.slow  # 8 s alone, 45 s under load, a plan on 256 GPUs here
def test_named_plans_price_on_32_nodes():
    t = load_topology("h100x8x32")
    plan = named_plan(_tiny(t.world_size), t, "data-parallel")
    assert plan.objective_s > 0
