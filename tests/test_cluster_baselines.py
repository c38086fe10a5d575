"""The cluster baselines' arithmetic (experiments/cluster_baselines.py): a pipeline's bubble
and schedule, the one-node cut of a cluster, the bytes and time of TP x FSDP's rail gather,
the stage boundary, and that the schemes without cross-node traffic cost what one node does."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from einsummable.topology import read_topology
from experiments import cluster_baselines as cb
from experiments.collectives import ACHIEVED, collective_time, fabric
from experiments.simulated import simulate_baseline
from experiments.workloads import Workload

ROOT = Path(__file__).resolve().parent.parent
TINY = Workload("llama-tiny", "llama-tiny", 8, 64, None, "float16")


@pytest.fixture(scope="module")
def h100_4x2():
    """h100x8x2's figures as 4 nodes of 2 GPUs: small enough to plan in a test."""
    doc = yaml.safe_load((ROOT / "topologies" / "h100x8x2.yaml").read_text())
    doc["name"] = "h100x2x4"
    doc["nodes"] = {"count": 4, "devices_per_node": 2, "device_type": "h100"}
    return read_topology(doc, "h100x2x4")


def test_bubble_and_schedule():
    assert cb.bubble(4, 8) == pytest.approx(3 / 11)
    assert cb.bubble(1, 5) == 0
    # free boundaries: (m + p - 1) cycles of c, each device busy m of them
    c, p, m = 2.0, 4, 8
    total = cb.pipeline_total(c, 0.0, p, m)
    assert total == pytest.approx((m + p - 1) * c)
    assert 1 - m * c / total == pytest.approx(cb.bubble(p, m))
    # boundaries: p - 1 on the first micro-batch's path, the cycle the slower of c and x
    assert cb.pipeline_total(2.0, 0.5, 4, 8) == pytest.approx(4 * 2 + 3 * 0.5 + 7 * 2)
    assert cb.pipeline_total(1.0, 3.0, 2, 3) == pytest.approx(2 * 1 + 1 * 3 + 2 * 3)


def test_node_topology_is_the_first_node(h100_4x2):
    node = cb.node_topology(h100_4x2)
    assert node.world_size == 2 and node.num_nodes == 1
    assert node.link(0, 1).bw == h100_4x2.link(0, 1).bw
    c = cb.cluster(h100_4x2)
    assert (c.nodes, c.per_node) == (4, 2)
    assert c.rail() == (0, 2, 4, 6) and c.rail(1) == (1, 3, 5, 7)


def test_tp_fsdp_gathers_each_tp_shard_over_its_rail(h100_4x2):
    c = cb.cluster(h100_4x2)
    tp_dp = cb.simulate_cluster("tp-dp", TINY, h100_4x2)
    fsdp = cb.simulate_cluster("tp-fsdp", TINY, h100_4x2)
    graph = cb._graph(TINY, TINY.batch // c.nodes)
    weights = sum(t.nbytes for t in graph.weights)
    gather = [x for x in fsdp.collectives if x.weight]
    assert len(gather) == 1 and gather[0].nbytes == weights // c.per_node
    assert gather[0].group == c.rail()
    # the rail is one device per node: NCCL's hierarchical all-gather is the NIC phase alone,
    # (M - 1) / M of the shard over each NIC at the network's achieved rate, M - 1 latencies
    link = h100_4x2.link(0, 2)
    m = c.nodes
    want = ((m - 1) / m * (weights / c.per_node) / (ACHIEVED.network * link.bw)
            + (m - 1) * link.latency_s)
    assert fsdp.gather_s == pytest.approx(want)
    # the TP part is tp-dp's; the gather hides behind compute at most
    assert (fsdp.compute_s, fsdp.comm_s) == (tp_dp.compute_s, tp_dp.comm_s)
    assert fsdp.time_s >= tp_dp.time_s
    assert fsdp.time_s >= fsdp.gather_s + fsdp.comm_s
    # tp-dp sends nothing across nodes: it is the one-node TP baseline on B / M sequences
    one = cb.node_tp(TINY, h100_4x2, TINY.batch // m)
    assert tp_dp.time_s == one.time_s == pytest.approx(one.compute_s + one.comm_s)


def test_hsdp_gathers_inside_a_node_only(h100_4x2):
    hsdp = cb.simulate_cluster("hsdp", TINY, h100_4x2)
    flat = [x for x in hsdp.collectives if x.weight]
    assert flat and all(not x.group or set(x.group) <= {0, 1} for x in flat)
    node = cb.node_topology(h100_4x2)
    assert hsdp.gather_s == pytest.approx(
        collective_time("all_gather", flat[0].nbytes, fabric(node)))


def test_pipelines_take_the_best_micro_batching(h100_4x2):
    c = cb.cluster(h100_4x2)
    layers = 8
    got = cb.simulate_cluster("pipeline-gpipe", TINY, h100_4x2, layers=layers)
    assert got.time_s == cb.simulate_cluster("pipeline-1f1b", TINY, h100_4x2,
                                             layers=layers).time_s
    each = []
    for m in (1, 2, 4, 8):
        b = TINY.batch // m
        act = cb._graph(TINY, b)
        x = cb.boundary_time(c, sum(act.tensor(o).nbytes for o in act.outputs), ACHIEVED)
        stage = layers // c.nodes * cb.node_tp(TINY, h100_4x2, b).time_s
        each.append(cb.pipeline_total(stage, x, c.nodes, m) / layers)
    assert got.time_s == pytest.approx(min(each))
    assert "bubble (p-1)/(m+p-1) = " in got.note
    with pytest.raises(cb.Unavailable, match="do not split into 4 stages"):
        cb.simulate_cluster("pipeline-gpipe", TINY, h100_4x2, layers=6)


def test_the_stage_boundary_crosses_each_rail_then_gathers(h100_4x2):
    c = cb.cluster(h100_4x2)
    nbytes = 8e6
    link = h100_4x2.link(0, 2)
    want = (nbytes / 2 / (ACHIEVED.network * link.bw) + link.latency_s
            + collective_time("all_gather", nbytes, fabric(c.node)))
    assert cb.boundary_time(c, nbytes, ACHIEVED) == pytest.approx(want)


def test_a_batch_that_does_not_split_over_the_nodes_leaves_some_idle(h100_4x2):
    """Batch 6 on 4 nodes: the most nodes it divides over are 3, of 2 sequences each; the
    fourth idles. tp-dp is the one-node TP baseline on 2 sequences, tp-fsdp gathers over the
    3 active devices of the rail, and the notes say a node idles."""
    six = Workload("llama-tiny-6", "llama-tiny", 6, 64, None, "float16")
    tp_dp = cb.simulate_cluster("tp-dp", six, h100_4x2)
    assert tp_dp.time_s == cb.node_tp(six, h100_4x2, 2).time_s
    assert "3 nodes of 2 sequences (1 node idle" in tp_dp.note
    fsdp = cb.simulate_cluster("tp-fsdp", six, h100_4x2)
    gather = [x for x in fsdp.collectives if x.weight]
    assert gather[0].group == cb.cluster(h100_4x2).rail()[:3]
    assert "1 node idle" in cb.simulate_cluster("hsdp", six, h100_4x2).note


def test_dp_nodes_is_the_whole_machine_data_parallel_where_sequences_fit_a_node(h100_4x2):
    """Batch 8 on 4 nodes of 2: every sequence stays inside a node, so the data-parallel
    baseline simulated over all 8 devices (weights replicated) sends nothing across nodes
    and costs what one node does on its 2 sequences (within 0.01%: the whole machine's
    simulation differs by 4e-5 of it)."""
    nodes = cb.simulate_cluster("dp-nodes", TINY, h100_4x2)
    whole = simulate_baseline("data-parallel", cb._graph(TINY, TINY.batch), h100_4x2, "free")
    assert nodes.time_s == pytest.approx(whole.time_s, rel=1e-4)
    assert not any(x.weight for x in nodes.collectives)  # weights replicated: no gather
    assert "4 nodes of 2 sequences" in nodes.note and "replicated" in nodes.note
    six = Workload("llama-tiny-6", "llama-tiny", 6, 64, None, "float16")
    idle = cb.simulate_cluster("dp-nodes", six, h100_4x2)
    node = cb.node_topology(h100_4x2)
    assert idle.time_s == simulate_baseline("data-parallel", cb._graph(six, 2), node,
                                            "free").time_s
    assert "1 node idle" in idle.note
    with pytest.raises(cb.Unavailable, match="weights replicated on every device need"):
        cb.simulate_cluster("dp-nodes", TINY, h100_4x2, layers=10 ** 6)
