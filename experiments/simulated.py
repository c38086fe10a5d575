"""Analytic time of the hand-written baselines on a topology, the way PyTorch runs them.

Compute comes from the library's simulator, per rank, for the same layout as the baseline (the
named plans megatron-tp, megatron-tp-sp and data-parallel: the same compute model as the
einsummable rows). Communication is what NCCL does instead of einsummable's exchange: ring
collectives over a ring of all N devices, with no overlap with compute (PyTorch waits for each
collective before the next kernel that reads it):

    all_reduce(B)     = 2 (N-1)/N · B / bw_ring + 2 (N-1) · latency_ring
    all_gather(B)     =   (N-1)/N · B / bw_ring +   (N-1) · latency_ring    (B: gathered bytes)
    reduce_scatter(B) =   (N-1)/N · B / bw_ring +   (N-1) · latency_ring    (B: input bytes)
    all_to_all(B)     = (N-1)/N² · B / bw_ring +   (N-1) · latency_ring    (B: whole tensor)
    ring_pass(B)      =   (N-1)/N · B / bw_ring +   (N-1) · latency_ring    (B: whole tensor)

bw_ring is the slowest hop of the ring 0→1→…→N-1→0 (one direction) and latency_ring its
largest latency. Which tensors go through a collective follows from the layout: a Megatron
row-parallel op (its candidate splits an aggregated mode) leaves partial sums that tensor
parallelism all-reduces and sequence parallelism reduce-scatters and all-gathers again; data
parallelism with sharded weights all-gathers every weight once (FSDP).

Two sequence-parallel attention schemes, for long contexts (both keep the weights sharded and
all-gather each once, as ZeRO-3 does):
- ulysses (DeepSpeed-Ulysses): tokens split everywhere; attention splits heads, so its inputs
  (queries, keys, values) and its output each go through one all-to-all.
- ring-attention: tokens split everywhere, attention too (each device keeps its queries); the
  key and value blocks travel round the ring in N-1 steps, each step's transfer overlapped with
  the attention on the block in hand, so only what the attention cannot hide shows:
  max(0, ring_pass(K) + ring_pass(V) - attention compute per device).

The floor: the simulator's roofline for 1/N of every op (FLOPs at peak or bytes at memory
bandwidth, whichever is slower) plus one launch per op that computes (views are free) — what a
perfect split with free communication would cost in this model.
"""
from __future__ import annotations

from dataclasses import dataclass

from einsummable.frontend.ir import Graph
from einsummable.planning.placement import INPUT_PREFIX, input_op, place

from einsummable.backend.runtime.simulator import simulate as simulate_choice

from . import einsummable_system as es_sys

NAMED_LAYOUT = {"pytorch-tp": "megatron-tp", "pytorch-tp-sp": "megatron-tp-sp",
                "data-parallel": "data-parallel", "ulysses": "ulysses",
                "ring-attention": "fsdp"}
# Systems whose attention moves keys and values around a ring behind the attention compute.
RING_SYSTEMS = ("ring-attention",)


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | ring_pass
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
    if c.kind == "all_to_all":  # each device keeps 1/N of its 1/N share
        return share * c.nbytes / world / bw + (world - 1) * latency
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
    gathers = tuple(Collective("all_gather", w.name, w.nbytes) for w in graph.weights) \
        if weights == "sharded" else ()
    if system == "data-parallel":
        return gathers
    if system == "ulysses":
        ins, _, outs = attention_boundary(graph)
        return gathers + tuple(Collective("all_to_all", t, size(t)) for t in (*ins, *outs))
    if system == "ring-attention":
        _, keys, _ = attention_boundary(graph)
        return gathers + tuple(Collective("ring_pass", t, size(t)) for t in keys)
    return ()


def attention_ops(graph: Graph) -> list:
    """The attention kernels: ops with two sequence modes (queries and keys) once spelled-out
    chains (scores, mask, softmax, weighted sum) are fused, as capture does."""
    from einsummable.frontend.fuse import fuse
    return _attention_ops(fuse(graph))


def _attention_ops(fused: Graph) -> list:
    from einsummable.planning.candidates import roles
    mode_roles = roles(fused).modes
    return [op for op in fused.ops
            if sum(1 for m in op.modes if mode_roles.get(op.name, {}).get(m) == "seq") >= 2]


def attention_boundary(graph: Graph) -> tuple[list[str], list[str], list[str]]:
    """Tensors that cross into and out of the attention ops: (activation inputs, those of them
    indexed by the key sequence mode, which the kernel aggregates: keys and values; outputs
    read elsewhere). A spelled-out chain is fused first: the tensors at its edges keep their
    names."""
    from einsummable.planning.candidates import roles
    from einsummable.frontend.fuse import fuse
    graph = fuse(graph)
    mode_roles = roles(graph).modes
    att = _attention_ops(graph)
    inside = {op.output for op in att}
    ins: list[str] = []
    keys: list[str] = []
    for op in att:
        key_modes = {m for m in op.agg_modes if mode_roles.get(op.name, {}).get(m) == "seq"}
        for name, dims in zip(op.inputs, op.in_dims):
            if name in inside or name in ins or graph.tensor(name).kind in ("weight", "constant"):
                continue
            ins.append(name)
            if key_modes & {m for g in dims for m in g}:
                keys.append(name)
    read_outside = {t for op in graph.ops if op not in att for t in op.inputs}
    outs = [t for t in inside if t in read_outside or t in graph.outputs]
    return ins, keys, sorted(outs)


def single_device_choice(graph: Graph) -> dict:
    """Every op and graph input whole on device 0."""
    choice = {INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in graph.inputs}
    choice.update({op.name: place(op, {}, [0]) for op in graph.ops})
    return choice


def simulate_baseline(system: str, graph: Graph, topology, weights: str = "sharded") -> BaselineTime:
    n = topology.world_size
    if system == "pytorch":
        result = simulate_choice(graph, single_device_choice(graph), topology)
        return BaselineTime(result.compute_s[0], result.compute_s[0], 0.0, (), "one device")
    plan = es_sys.named_plan(graph, topology, NAMED_LAYOUT[system])
    compute_s = max(es_sys.simulate(plan).compute_s)
    colls = collectives_for(system, graph, plan.chosen, weights)
    bw, lat = ring(topology)
    comm_s = sum(collective_time(c, n, bw, lat) for c in colls if c.kind != "ring_pass")
    if system in RING_SYSTEMS:
        ring_s = sum(collective_time(c, n, bw, lat) for c in colls if c.kind == "ring_pass")
        comm_s += max(0.0, ring_s - attention_compute(graph, topology))
    kinds = {}
    for c in colls:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    what = ", ".join(f"{k} {c}x" for k, c in kinds.items()) or "no collectives"
    return BaselineTime(compute_s + comm_s, compute_s, comm_s, colls,
                        f"compute {compute_s * 1e3:.3f} + NCCL ring {comm_s * 1e3:.3f} ms ({what})")


def attention_compute(graph: Graph, topology) -> float:
    """Seconds of attention per device with the work split N ways (the roofline of the
    floor below): what a ring of key/value transfers can hide behind."""
    dev = topology.devices[0]
    return sum(op.flops / (topology.world_size * dev.peak(graph.tensor(op.output).dtype))
               for op in attention_ops(graph))


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
