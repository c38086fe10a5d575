"""Analytic time of the hand-written baselines on a topology, the way PyTorch runs them.

Compute comes from the library's simulator, per rank, for the same layout as the baseline (the
named plans megatron-tp, megatron-tp-sp and data-parallel: the same compute model as the
einsummable rows). Communication is what NCCL does instead of einsummable's exchange: ring
collectives over a ring of all N devices, with no overlap with compute (PyTorch waits for each
collective before the next kernel that reads it):

    all_reduce(B)     = 2 (N-1)/N · B / bw_ring + 2 (N-1) · latency_ring
    all_gather(B)     =   (N-1)/N · B / bw_ring +   (N-1) · latency_ring    (B: gathered bytes)
    reduce_scatter(B) =   (N-1)/N · B / bw_ring +   (N-1) · latency_ring    (B: input bytes)

bw_ring is the slowest hop of the ring 0→1→…→N-1→0 (one direction) and latency_ring its
largest latency. Which tensors go through a collective follows from the layout: a Megatron
row-parallel op (its candidate splits an aggregated mode) leaves partial sums that tensor
parallelism all-reduces and sequence parallelism reduce-scatters and all-gathers again; data
parallelism with sharded weights all-gathers every weight once (FSDP).

The floor: the simulator's roofline for 1/N of every op (FLOPs at peak or bytes at memory
bandwidth, whichever is slower) plus one launch per op that computes (views are free) — what a
perfect split with free communication would cost in this model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from einsummable.ir import Graph
from einsummable.placement import INPUT_PREFIX, input_op, place

from . import einsummable_system as es_sys

NAMED_LAYOUT = {"pytorch-tp": "megatron-tp", "pytorch-tp-sp": "megatron-tp-sp",
                "data-parallel": "data-parallel"}


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter
    tensor: str
    nbytes: int


@dataclass(frozen=True)
class BaselineTime:
    time_s: float
    compute_s: float
    comm_s: float
    collectives: tuple[Collective, ...]
    note: str


def ring(topology) -> tuple[float, float]:
    """(bandwidth, latency) of the ring 0→1→…→N-1→0: its slowest hop and largest latency."""
    n = topology.world_size
    hops = [(i, (i + 1) % n) for i in range(n)]
    return (min(topology.path_bw(a, b) for a, b in hops),
            max(topology.path_latency(a, b) for a, b in hops))


def collective_time(c: Collective, world: int, bw: float, latency: float) -> float:
    if world == 1:
        return 0.0
    share = (world - 1) / world
    if c.kind == "all_reduce":
        return 2 * share * c.nbytes / bw + 2 * (world - 1) * latency
    return share * c.nbytes / bw + (world - 1) * latency


def partial_sum_outputs(graph: Graph, choice) -> list[str]:
    """Outputs of ops whose candidate splits an aggregated mode (row-parallel projections)."""
    out = []
    for op in graph.ops:
        parts = dict(choice[op.name].parts)
        if any(parts.get(m, 1) > 1 for m in op.agg_modes):
            out.append(op.output)
    return out


def collectives_for(system: str, graph: Graph, choice, weights: str) -> tuple[Collective, ...]:
    size = lambda t: graph.tensor(t).nbytes
    if system == "pytorch-tp":
        return tuple(Collective("all_reduce", t, size(t)) for t in partial_sum_outputs(graph, choice))
    if system == "pytorch-tp-sp":
        return tuple(c for t in partial_sum_outputs(graph, choice)
                     for c in (Collective("reduce_scatter", t, size(t)),
                               Collective("all_gather", t, size(t))))
    if system == "data-parallel" and weights == "sharded":
        return tuple(Collective("all_gather", w.name, w.nbytes) for w in graph.weights)
    return ()


def single_device_choice(graph: Graph) -> dict:
    """Every op and graph input whole on device 0."""
    choice = {INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in graph.inputs}
    choice.update({op.name: place(op, {}, [0]) for op in graph.ops})
    return choice


def simulate_baseline(system: str, graph: Graph, topology, weights: str = "sharded") -> BaselineTime:
    sim = es_sys.api("einsummable.runtime.simulate", "simulate")
    n = topology.world_size
    if system == "pytorch":
        result = sim(graph, single_device_choice(graph), topology)
        return BaselineTime(result.compute_s[0], result.compute_s[0], 0.0, (), "one device")
    plan = es_sys.named_plan(graph, topology, NAMED_LAYOUT[system])
    compute_s = max(es_sys.simulate(plan).compute_s)
    colls = collectives_for(system, graph, es_sys.choice_of(plan), weights)
    bw, lat = ring(topology)
    comm_s = sum(collective_time(c, n, bw, lat) for c in colls)
    kinds = {}
    for c in colls:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    what = ", ".join(f"{k} {c}x" for k, c in kinds.items()) or "no collectives"
    return BaselineTime(compute_s + comm_s, compute_s, comm_s, colls,
                        f"compute {compute_s * 1e3:.3f} + NCCL ring {comm_s * 1e3:.3f} ms ({what})")


def compute_floor(graph: Graph, topology) -> float:
    """Σ over ops of max(F / (N·peak), B / (N·mem_bw)) + launch, with F the op's FLOPs and B
    the bytes it reads and writes once: the simulator's roofline for 1/N of every op on each
    device, with free communication and no replicated work. Views are free."""
    dev = topology.devices[0]
    n = topology.world_size
    total = 0.0
    for op in graph.ops:
        if op.is_view:
            continue
        flops_s = op.flops / (n * dev.peak(graph.tensor(op.output).dtype))
        nbytes = sum(graph.tensor(t).nbytes for t in op.inputs) + graph.tensor(op.output).nbytes
        total += max(flops_s, nbytes / (n * dev.mem_bw)) + dev.launch_s
    return total
