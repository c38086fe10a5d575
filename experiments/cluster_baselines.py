"""Cluster baselines: how Megatron, PyTorch FSDP/HSDP and pipeline schedules run a LLaMA block
on several nodes, priced on the same model as the one-node baselines (`simulated.py`: the
library's simulator for compute, `collectives.py` for NCCL's collectives at the published
achieved rates). Forward-only inference in the steady state, as every other baseline: T is
the time of one block of the workload's batch in a stack of identical blocks.

The cluster has M nodes of L devices (the topology's first level), the workload batch B. Every
scheme below keeps its tensor parallelism inside a node, as deployments do; a node alone is the
topology cut to its first node (`node_topology`), and "pytorch-tp(b)" is the one-node
Megatron TP baseline of `simulated.py` on a batch of b sequences on that node: its compute C(b)
(the megatron-tp layout simulated) plus its all-reduces A(b) inside the node.

- **tp-dp** (Megatron TP inside a node x data parallelism across nodes, weights replicated per
  node): each node runs B / M sequences alone; a forward pass sends nothing across nodes.
      T = C(B/M) + A(B/M)
  Its weights are stored M times (once per node, split L ways).
- **tp-fsdp** (Megatron TP inside a node x FSDP across nodes): as tp-dp, but each device's
  TP shard (W / L bytes of the block's weights W) is sharded again over the M devices of its
  rail (the same local index on every node) and all-gathered per block over those devices'
  NICs, prefetched behind the previous block's compute (FSDP's forward prefetch, the overlap
  rule of `simulated.py`):
      G = all_gather(W / L) over the rail group,   T = max(C + κ G, G) + A
  κ: the compute a stream takes per second it runs (`kernel_time.contention_share`), each
  device moving 2 (M - 1) / M · W / L bytes in G seconds.
- **hsdp** (PyTorch HSDP: FSDP sharded inside a node, replicated across nodes): each node runs
  B / M sequences as the one-node FSDP baseline does (`simulated.py` data-parallel: the flat
  parameter of W bytes all-gathered inside the node, prefetched; fewer sequences than a node's
  devices make its attention context-parallel inside the node); no cross-node traffic in a
  forward pass.
- **dp-nodes** (data parallelism over the nodes and inside them, weights replicated on every
  device): each node runs B / M sequences as the one-node data-parallel baseline with
  replicated weights does (`simulated.py` data-parallel under weights "free": where a node
  has fewer sequences than devices, a sequence is split over several devices and its
  attention is context-parallel inside the node, keys and values passed round behind the
  attention); nothing crosses nodes in a forward pass. It is the whole machine's
  data-parallel baseline where every sequence fits in a node (on 8 nodes of 8 H100s with
  batch 16, both give 0.429 ms for the LLaMA-7B block), costed on one node: simulating the
  named plan over 256 devices did not finish in 55 minutes. Where the batch does not divide over
  the nodes it runs on M' nodes as below; splitting a sequence across nodes instead (the
  ring passes then crossing the network) is not costed here. Unavailable where the model's
  layers' weights (`model_layers` in the config) do not fit one device.

Where B does not divide over the M nodes, the four schemes above run on M' nodes, the most
that B divides over (M' <= M, B / M' sequences each), and the other M - M' nodes idle: a
deployment's data-parallel degree divides its batch (B = 16 on 32 nodes: 16 nodes of one
sequence). tp-fsdp then shards over the rail's M' active devices.
- **pipeline-gpipe**, **pipeline-1f1b**: the model's K layers (`model_layers` in the config)
  in p = M stages of K / p layers, one node each with Megatron TP inside; the batch cut into m
  micro-batches of b = B / m sequences. A stage's work on one micro-batch is
      c = (K / p) · (C(b) + A(b))
  and its output activation (a bytes) crosses to the next stage as Megatron's scatter-gather
  does it: each of the L ranks sends a / L over its own NIC to its peer on the next node (the
  link between the stages, at the network's achieved fraction, plus its latency), then the
  next node all-gathers the a bytes inside:
      x = (a / L) / (f_net · r_link) + α_link + all_gather_node(a)
  A forward pass of the whole batch: the first micro-batch crosses every stage and boundary,
  the others follow one cycle apart (a stage takes the next micro-batch as soon as it is
  done, its send of the last one running beside it, so the cycle is the slower of the two):
      total = p c + (p - 1) x + (m - 1) max(c, x),     T = total / K
  so with free boundaries each device idles the bubble fraction (p - 1) / (m + p - 1) of the
  pass. m is the divisor of B that gives the least T. Forward-only, GPipe and 1F1B run the
  same schedule (1F1B reorders the backward passes): their times are equal; they differ in
  the micro-batches a stage holds at once (GPipe m, 1F1B min(m, p)), a training-memory
  property reported in the note.

Each T is also given with every collective and boundary at the links' full rates (at_peak_s).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from einsummable.planning.cost import memory_bound_share
from einsummable.planning.kernel_time import contention_share
from einsummable.topology import Topology, read_topology

from . import einsummable_system as es_sys
from .collectives import ACHIEVED, PEAK, Rates, collective_time, fabric
from .simulated import BaselineTime, Collective, simulate_baseline
from .unavailable import Unavailable
from .workloads import Workload

CLUSTER_SYSTEMS = ("tp-dp", "tp-fsdp", "hsdp", "dp-nodes", "pipeline-gpipe", "pipeline-1f1b")
PIPELINES = {"pipeline-gpipe": "GPipe", "pipeline-1f1b": "1F1B"}


@dataclass(frozen=True)
class Cluster:
    """The topology as M nodes of L devices, and its first node alone."""
    topology: Topology
    node: Topology
    nodes: int     # M
    per_node: int  # L

    def rail(self, local: int = 0) -> tuple[int, ...]:
        """The devices of one rail: local index `local` on every node."""
        by_node: dict[int, list[int]] = {}
        for d in self.topology.devices:
            by_node.setdefault(d.node, []).append(d.id)
        return tuple(sorted(devs)[local] for _, devs in sorted(by_node.items()))


@functools.lru_cache(maxsize=8)
def cluster(topology: Topology) -> Cluster:
    return Cluster(topology, node_topology(topology), topology.num_nodes,
                   topology.world_size // topology.num_nodes)


def node_topology(topology: Topology) -> Topology:
    """The topology cut to its first node: its devices, the links among them, its levels'
    groups inside it (device ids kept: the first node's are 0..L-1)."""
    first = set(topology.devices_in_node(topology.devices[0].node))
    if sorted(first) != list(range(len(first))):
        raise Unavailable(f"topology '{topology.name}': the first node's devices are not "
                          "0..L-1; no one-node cut")
    d = topology.to_dict()
    d["name"] = f"{topology.name}-node"
    d["devices"] = [x for x in d["devices"] if x["id"] in first]
    d["links"] = [dict(l, pairs=[p for p in l["pairs"] if p[0] in first and p[1] in first])
                  for l in d["links"]]
    d["links"] = [l for l in d["links"] if l["pairs"]]
    d["levels"] = [dict(lv, groups=[g for g in lv["groups"] if set(g) <= first])
                   for lv in d["levels"]]
    return read_topology(d, d["name"])


def _graph(w: Workload, batch: int):
    return es_sys.graph_for(dataclasses.replace(w, batch=batch, name=f"{w.name}-b{batch}"))


def _node_share(w: Workload, c: Cluster) -> tuple[int, int, str]:
    """(sequences per active node, active nodes M', how the note says it): M' the most nodes
    up to M that the batch divides over (module docstring)."""
    active = max(m for m in range(1, c.nodes + 1) if w.batch % m == 0)
    left = c.nodes - active
    idle = "" if not left else (f" ({left} node{'s' if left > 1 else ''} idle: batch "
                                f"{w.batch} does not split over {c.nodes})")
    return w.batch // active, active, f"{active} nodes of {w.batch // active} sequences{idle}"


@functools.lru_cache(maxsize=64)
def node_tp(w: Workload, topology: Topology, batch: int) -> BaselineTime:
    """pytorch-tp(b): the one-node Megatron TP baseline on `batch` sequences."""
    return simulate_baseline("pytorch-tp", _graph(w, batch), cluster(topology).node)


def simulate_cluster(system: str, w: Workload, topology: Topology,
                     steady_state: bool = True, layers: int | None = None) -> BaselineTime:
    """The cluster baseline's time per block (module docstring)."""
    if system not in CLUSTER_SYSTEMS:
        raise ValueError(f"no cluster baseline {system!r}: use one of "
                         f"{', '.join(CLUSTER_SYSTEMS)}")
    c = cluster(topology)
    if c.nodes < 2:
        raise Unavailable(f"'{topology.name}' has one node: not a cluster")
    if system in PIPELINES:
        if layers is None:
            raise Unavailable("a pipeline needs the model's layer count (model_layers)")
        return pipeline(system, w, c, layers)
    b, active, share = _node_share(w, c)
    if system == "hsdp":
        bt = simulate_baseline("data-parallel", _graph(w, b), c.node, "sharded", steady_state)
        return dataclasses.replace(
            bt, note=f"HSDP: {share}, no cross-node traffic; per node the FSDP baseline: "
                     f"{bt.note}")
    if system == "dp-nodes":
        graph = _graph(w, b)
        held = sum(t.nbytes for t in graph.weights) * (layers or 1)
        if held > c.node.min_mem_bytes:
            raise Unavailable(f"weights replicated on every device need {held / 1e9:.1f} GB "
                              f"({layers or 1} layers), more than a device's "
                              f"{c.node.min_mem_bytes / 1e9:.1f} GB")
        bt = simulate_baseline("data-parallel", graph, c.node, "free", steady_state)
        return dataclasses.replace(
            bt, note=f"DP over nodes and devices: {share}, weights replicated on every "
                     f"device, no cross-node traffic; per node {bt.note}")
    tp = node_tp(w, topology, b)
    if system == "tp-dp":
        return dataclasses.replace(
            tp, note=f"TP x DP: {share}, weights stored once per node; per node {tp.note}")
    return tp_fsdp(w, c, tp, b, active, share, steady_state)


def tp_fsdp(w: Workload, c: Cluster, tp: BaselineTime, batch: int, active: int, share: str,
            steady_state: bool) -> BaselineTime:
    """TP inside a node x FSDP across the `active` nodes (module docstring)."""
    graph = _graph(w, batch)
    weights = sum(t.nbytes for t in graph.weights)
    shard = weights / c.per_node
    group = c.rail()[:active]
    rail = fabric(c.topology, group)
    gather = Collective("all_gather", "TP shard of the flat parameter", int(shard),
                        weight=True, group=group)
    moved = 2 * (active - 1) / active * shard
    mu = memory_bound_share(graph, c.node)

    def total(rates: Rates, compute_plus: float) -> tuple[float, float]:
        g = collective_time("all_gather", shard, rail, rates)
        kappa = contention_share(c.node, mu, moved / g if g else None)
        if not steady_state:
            return tp.compute_s + g + compute_plus, g
        return max(tp.compute_s + kappa * g, g) + compute_plus, g

    time_s, g = total(ACHIEVED, tp.comm_s)
    peak_comm = (tp.at_peak_s or tp.time_s) - tp.compute_s
    at_peak, _ = total(PEAK, peak_comm)
    note = (f"TP x FSDP: {share}; each device's TP shard "
            f"({shard / 1e6:.1f} MB) all-gathered over its rail of {active} NICs in "
            f"{g * 1e3:.3f} ms, prefetched behind the previous block; per node {tp.note}")
    return BaselineTime(time_s, tp.compute_s, tp.comm_s, tp.collectives + (gather,), note,
                        g, at_peak)


# ------------------------------------------------------------------------------ pipelines

def bubble(stages: int, micro: int) -> float:
    """The fraction of a forward pass each device idles with free boundaries."""
    return (stages - 1) / (micro + stages - 1)


def pipeline_total(stage_s: float, boundary_s: float, stages: int, micro: int) -> float:
    """p c + (p - 1) x + (m - 1) max(c, x) (module docstring)."""
    return (stages * stage_s + (stages - 1) * boundary_s
            + (micro - 1) * max(stage_s, boundary_s))


def boundary_time(c: Cluster, nbytes: float, rates: Rates) -> float:
    """Seconds an activation of `nbytes` takes from one stage's node to the next: a / L per
    rank over its own link to its peer on the next node, then all-gathered inside."""
    a, b = c.rail()[:2]
    link = c.topology.link(a, b)
    if link is None:
        raise Unavailable(f"'{c.topology.name}': devices {a} and {b} of consecutive stages "
                          "have no direct link")
    rate = min(link.bw, link.port_bw or link.bw)
    cross = nbytes / c.per_node / (rates.network * rate) + link.latency_s
    return cross + collective_time("all_gather", nbytes, fabric(c.node), rates)


def pipeline(system: str, w: Workload, c: Cluster, layers: int) -> BaselineTime:
    """GPipe or 1F1B over the nodes, TP inside each (module docstring); the best m."""
    stages = c.nodes
    if layers % stages:
        raise Unavailable(f"{layers} layers do not split into {stages} stages")
    best = None
    for micro in (m for m in range(1, w.batch + 1) if w.batch % m == 0):
        b = w.batch // micro
        tp = node_tp(w, c.topology, b)
        act = _graph(w, b)
        nbytes = sum(act.tensor(o).nbytes for o in act.outputs)
        per_layer = layers // stages
        t = pipeline_total(per_layer * tp.time_s, boundary_time(c, nbytes, ACHIEVED),
                           stages, micro) / layers
        peak = pipeline_total(per_layer * (tp.at_peak_s or tp.time_s),
                              boundary_time(c, nbytes, PEAK), stages, micro) / layers
        if best is None or t < best[0]:
            best = (t, peak, micro, b, tp, boundary_time(c, nbytes, ACHIEVED))
    t, peak, micro, b, tp, x = best
    held = micro if system == "pipeline-gpipe" else min(micro, stages)
    note = (f"{PIPELINES[system]}: {stages} stages of {layers // stages} layers (TP inside a "
            f"node), {micro} micro-batches of {b}: bubble (p-1)/(m+p-1) = "
            f"{bubble(stages, micro):.3f}; stage boundary {x * 1e3:.3f} ms; "
            f"{held} micro-batches held per stage; per layer and micro-batch {tp.note}")
    return BaselineTime(t, tp.compute_s * micro / stages, tp.comm_s * micro / stages,
                        tp.collectives, note, 0.0, peak)
