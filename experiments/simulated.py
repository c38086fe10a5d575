"""Analytic time of the hand-written baselines on a topology, the way PyTorch and vLLM run them.

Compute comes from the library's simulator, per rank, for the same layout as the baseline (the
named plans megatron-tp, megatron-tp-sp and data-parallel: the same compute model, the same
kernels, as the einsummable rows). Communication is what the baseline's library does instead of
einsummable's exchange: collectives, costed by `collectives.py` the way NCCL runs them on the
topology (several rings over NVLink at once, hierarchical across nodes, at the published
achieved fraction of the link rates; `PEAK` gives the same at the links' full rates).

Which tensors go through a collective follows from the layout: a Megatron row-parallel op (its
candidate splits an aggregated mode) leaves partial sums that tensor parallelism all-reduces
and sequence parallelism reduce-scatters and all-gathers again; with sharded weights, FSDP
(data-parallel) all-gathers the block's weights once, as one flat parameter (one collective
per FSDP unit), and the ZeRO-3 weights of the sequence-parallel schemes are all-gathered one
weight at a time. Tensor-parallel collectives run inside one node (Megatron deploys TP inside a
node and data parallelism across: node 0's group stands for all nodes, which run at once;
on several nodes the weight copies of that data parallelism are not costed).

What overlaps (T: time per block, C: compute, A: collectives on the critical path, G: weight
all-gathers):
- pytorch-tp, pytorch-tp-sp, vllm-tp: T = C + A. PyTorch waits for each collective before the
  kernel that reads it; so does vLLM.
- data-parallel with sharded weights is PyTorch FSDP with forward prefetch, one FSDP unit per
  block (the transformer wrap policy): the next block's all-gather is issued when this block's
  compute starts and runs on its own stream, so in the steady state (a stack of identical
  blocks) T = max(C + κ G, G) + A, κ the compute a stream costs per second it runs
  (NCCL's kernels take SMs from the compute beside them and its bytes take memory rate;
  the aggregate contention rule of `planning/kernel_time.py`, as einsummable's objective
  charges its own weight streams, at the gather's rate: each device sends and receives
  (N - 1) / N of the bytes in G seconds); a block alone (steady_state false) has
  nothing to hide its own gather behind: T = G + C + A. The gathers and A share the links,
  hence A outside the max.
- ulysses and ring-attention keep ZeRO-3 weights, prefetched the same way.
- Where the data-parallel layout must split the sequence too (fewer sequences than devices:
  batch 4 on 8 GPUs), its attention is context-parallel, as PyTorch's context parallelism
  runs it: ring attention inside each group of devices that share a batch block (`context
  group`), the keys and values of that block passed round the group behind the attention
  compute, by the ring rule below. Without it the split attention would read keys and values
  it does not hold. The groups run at once, so the slowest decides; a tuned deployment puts
  them where that is fastest (`best_groups`: node 0's devices split into groups every way,
  each group costed on its own links), as it puts a TP group inside a node.
- vllm-tp: vLLM's Megatron layout (column-parallel QKV and gate/up, row-parallel O and down:
  the megatron-tp plan), one all-reduce after attention and one after the MLP, each by vLLM's
  custom all-reduce where it applies (small messages, fully NVLinked single node) and NCCL
  otherwise (`collectives.vllm_all_reduce`). Simulated from its documented design, not run.

Two sequence-parallel attention schemes, for long contexts:
- ulysses (DeepSpeed-Ulysses): tokens split everywhere; attention splits heads, so its inputs
  (queries, keys, values) and its output each go through one all-to-all.
- ring-attention: tokens split everywhere, attention too (each device keeps its queries); the
  key and value blocks travel round the ring in N-1 steps, each step's transfer overlapped with
  the attention on the block in hand, so only what the attention cannot hide shows, and the
  attention pays the contention of the passes it hides: with R = ring_pass(K) +
  ring_pass(V) and C_att the attention compute per device, max(0, R - C_att) + κ min(R, C_att)
  (κ at the devices' port rates).

The floor: the simulator's roofline for 1/N of every op (FLOPs at peak or bytes at memory
bandwidth, whichever is slower) plus one launch per op that computes (views are free) — what a
perfect split with free communication would cost in this model.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from einsummable.backend.runtime.simulator import simulate as simulate_choice
from einsummable.frontend.ir import Graph
from einsummable.planning.cost import memory_bound_share
from einsummable.planning.kernel_time import contention_share
from einsummable.planning.placement import one_device_choice

from . import einsummable_system as es_sys
from .collectives import (
    ACHIEVED,
    PEAK,
    Fabric,
    Rates,
    collective_time,
    fabric,
    vllm_all_reduce,
)

NAMED_LAYOUT = {"pytorch-tp": "megatron-tp", "pytorch-tp-sp": "megatron-tp-sp",
                "vllm-tp": "megatron-tp", "data-parallel": "data-parallel",
                "ulysses": "ulysses", "ring-attention": "fsdp"}
# Systems whose collectives run inside the tensor-parallel group (one node).
TP_SYSTEMS = ("pytorch-tp", "pytorch-tp-sp", "vllm-tp")
# Context groups are placed by trying every split of a node into groups up to this many
# devices (a node of 8 splits into pairs 105 ways; of 16, two million).
MAX_SPLIT_DEVICES = 8
# The name of FSDP's one all-gather per block (its flat parameter: every weight of the unit).
FLAT_PARAMETER = "flat parameter"


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | ring_pass
    tensor: str
    nbytes: int
    weight: bool = False  # a weight all-gather (prefetched behind compute)
    group: tuple[int, ...] = ()  # the devices of one group it runs in (): the system's fabric


@dataclass(frozen=True)
class BaselineTime:
    """time_s = the overlap rule of the system (module docstring) over compute_s, comm_s (the
    collectives on the critical path) and gather_s (weight all-gathers, prefetched);
    at_peak_s: the same with every collective at its links' full rates (`collectives.PEAK`)."""
    time_s: float
    compute_s: float
    comm_s: float
    collectives: tuple[Collective, ...]
    note: str
    gather_s: float = 0.0
    at_peak_s: float | None = None


def tp_group(topology) -> tuple[int, ...]:
    """The devices of one tensor-parallel group: node 0's (all of them on one node)."""
    return topology.devices_in_node(topology.devices[0].node)


def partial_sum_outputs(graph: Graph, choice) -> list[str]:
    """Outputs of ops whose candidate splits an aggregated mode (row-parallel projections)."""
    out = []
    for op in graph.ops:
        parts = dict(choice[op.name].parts)
        if any(parts.get(m, 1) > 1 for m in op.agg_modes):
            out.append(op.output)
    return out


def collectives_for(system: str, graph: Graph, choice, weights: str,
                    topology) -> tuple[Collective, ...]:
    size = lambda t: graph.tensor(t).nbytes
    if system in ("pytorch-tp", "vllm-tp"):
        return tuple(Collective("all_reduce", t, size(t)) for t in partial_sum_outputs(graph, choice))
    if system == "pytorch-tp-sp":
        return tuple(c for t in partial_sum_outputs(graph, choice)
                     for c in (Collective("reduce_scatter", t, size(t)),
                               Collective("all_gather", t, size(t))))
    if system == "data-parallel":  # FSDP: the block's weights are one flat parameter
        total = sum(w.nbytes for w in graph.weights)
        flat = (Collective("all_gather", FLAT_PARAMETER, total, weight=True),) \
            if weights == "sharded" and total else ()
        return flat + context_passes(graph, choice, topology)
    gathers = tuple(Collective("all_gather", w.name, w.nbytes, weight=True)
                    for w in graph.weights) if weights == "sharded" else ()
    if system == "ulysses":
        ins, _, outs = attention_boundary(graph)
        return gathers + tuple(Collective("all_to_all", t, size(t)) for t in (*ins, *outs))
    if system == "ring-attention":
        return gathers + context_passes(graph, choice, topology)
    return ()


def context_group(graph: Graph, choice) -> tuple[tuple[int, ...], float]:
    """(devices, share): the devices whose attention blocks cover the same batch and head
    ranges as device 0's, the sequence split among them, and the share of a key tensor those
    ranges hold; ((), 0) where no attention op splits a sequence mode."""
    from einsummable.frontend.fuse import fuse
    from einsummable.planning.candidates import roles
    from einsummable.planning.spec import tuples
    fused = fuse(graph)
    mode_roles = roles(fused).modes
    for op in _attention_ops(fused):
        cand = choice.get(op.name)
        if cand is None:
            continue
        role = mode_roles.get(op.name, {})
        outside = [i for i, m in enumerate(op.modes) if role.get(m) != "seq"]
        blocks = list(zip(tuples(op, cand.dec), cand.devices))
        key = lambda t: tuple(t.ranges[i] for i in outside)  # noqa: E731
        first = key(blocks[0][0])
        group = tuple(d for t, devs in blocks if key(t) == first for d in devs)
        if len(group) > 1:
            share = 1.0
            for i, (lo, hi) in zip(outside, first):
                share *= (hi - lo) / op.size[op.modes[i]]
            return group, share
    return (), 0.0


def best_groups(topology, size: int, layout_group: tuple[int, ...]) -> tuple[int, ...]:
    """The group of `size` devices to cost the context passes on: of every split of node 0's
    devices into groups of `size`, the one whose slowest group has the fastest ring (bus
    bandwidth), and that slowest group; the layout's own group where the size does not
    divide a node."""
    node = tuple(topology.devices_in_node(topology.devices[0].node))
    if len(node) % size or len(node) > MAX_SPLIT_DEVICES:
        return layout_group
    bus: dict[tuple[int, ...], float] = {}

    def rate(group: tuple[int, ...]) -> float:
        if group not in bus:
            bus[group] = fabric(topology, group).bus_bw
        return bus[group]

    def splits(left: tuple[int, ...]):
        if not left:
            yield ()
            return
        head = left[0]
        for rest in itertools.combinations(left[1:], size - 1):
            group = (head,) + rest
            for tail in splits(tuple(d for d in left if d not in group)):
                yield (group,) + tail
    best = max(splits(node), key=lambda gs: min(rate(g) for g in gs))
    return min(best, key=rate)


def context_passes(graph: Graph, choice, topology) -> tuple[Collective, ...]:
    """Ring attention's passes of the keys and values round each context group (module
    docstring): per key tensor, its group's share, inside the slowest group of the best
    placement of the groups (`best_groups`)."""
    group, share = context_group(graph, choice)
    if not group:
        return ()
    group = best_groups(topology, len(group), group)
    _, keys, _ = attention_boundary(graph)
    return tuple(Collective("ring_pass", t, int(graph.tensor(t).nbytes * share), group=group)
                 for t in keys)


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
    from einsummable.frontend.fuse import fuse
    from einsummable.planning.candidates import roles
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


def simulate_baseline(system: str, graph: Graph, topology, weights: str = "sharded",
                      steady_state: bool = True, rates: Rates = ACHIEVED) -> BaselineTime:
    """The baseline's time per block (module docstring), its collectives at `rates`, and
    at_peak_s with them at the links' full rates."""
    if system == "pytorch":
        result = simulate_choice(graph, one_device_choice(graph), topology)
        t = result.compute_s[0]
        return BaselineTime(t, t, 0.0, (), "one device", at_peak_s=t)
    if system not in NAMED_LAYOUT:
        raise ValueError(f"no simulated baseline {system!r}: use pytorch or one of "
                         f"{', '.join(NAMED_LAYOUT)}")
    plan = es_sys.named_plan(graph, topology, NAMED_LAYOUT[system])
    compute_s = max(es_sys.simulate(plan).compute_s)
    colls = collectives_for(system, graph, plan.chosen, weights, topology)
    fab = fabric(topology, tp_group(topology) if system in TP_SYSTEMS else None)
    ringed = any(c.kind == "ring_pass" for c in colls)
    attention_s = attention_compute(graph, topology) if ringed else 0.0
    mu = memory_bound_share(graph, topology)
    ring_share = contention_share(topology, mu)
    fabs = {c.group: fabric(topology, c.group) for c in colls if c.group}
    comm_s, gather_s, algos = _comm(system, colls, fab, rates, attention_s, ring_share, fabs)
    peak_comm, peak_gather, _ = _comm(system, colls, fab, PEAK, attention_s, ring_share, fabs)
    time_s = _overlap(compute_s, comm_s, gather_s, steady_state,
                      gather_share(topology, mu, colls, gather_s))
    at_peak = _overlap(compute_s, peak_comm, peak_gather, steady_state,
                       gather_share(topology, mu, colls, peak_gather))
    return BaselineTime(time_s, compute_s, comm_s, colls,
                        _note(system, compute_s, comm_s, gather_s, colls, fab, algos,
                              steady_state),
                        gather_s, at_peak)


def gather_share(topology, memory_bound: float, colls: tuple[Collective, ...],
                 gather_s: float) -> float:
    """κ of the weight all-gathers (module docstring): every device sends and receives
    (N - 1) / N of their bytes while they run."""
    n = topology.world_size
    moved = 2 * (n - 1) / n * sum(c.nbytes for c in colls if c.weight)
    return contention_share(topology, memory_bound, moved / gather_s if gather_s else None)


def _overlap(compute_s: float, comm_s: float, gather_s: float, steady_state: bool,
             share: float = 0.0) -> float:
    """Weight gathers prefetched behind the previous block's compute in the steady state,
    taking `share` of the compute's rate while they run (module docstring)."""
    if not steady_state:
        return compute_s + gather_s + comm_s
    return max(compute_s + share * gather_s, gather_s) + comm_s


def _comm(system: str, colls: tuple[Collective, ...], fab: Fabric, rates: Rates,
          attention_s: float, share: float = 0.0, fabs: dict | None = None
          ) -> tuple[float, float, dict[str, int]]:
    """(critical-path collective seconds, weight-gather seconds, algorithms used); a
    collective with a group runs on that group's fabric (`fabs`), the others on `fab`."""
    critical = gathers = ring = 0.0
    algos: dict[str, int] = {}
    for c in colls:
        if system == "vllm-tp" and c.kind == "all_reduce":
            t, algo = vllm_all_reduce(c.nbytes, fab, rates)
            algos[algo] = algos.get(algo, 0) + 1
        else:
            t = collective_time(c.kind, c.nbytes, (fabs or {}).get(c.group, fab), rates)
        if c.weight:
            gathers += t
        elif c.kind == "ring_pass":
            ring += t
        else:
            critical += t
    if ring:
        critical += max(0.0, ring - attention_s) + share * min(ring, attention_s)
    return critical, gathers, algos


def _note(system: str, compute_s: float, comm_s: float, gather_s: float,
          colls: tuple[Collective, ...], fab: Fabric, algos: dict[str, int],
          steady_state: bool) -> str:
    kinds: dict[str, int] = {}
    for c in colls:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    what = ", ".join(f"{k} {n}x" for k, n in kinds.items()) or "no collectives"
    if algos:
        what += "; vLLM all-reduce: " + ", ".join(f"{a} {n}x" for a, n in algos.items())
    ms = lambda x: f"{x * 1e3:.3f}"
    text = f"simulated: compute {ms(compute_s)} + collectives {ms(comm_s)} ms"
    if gather_s:
        who = "FSDP forward prefetch" if system == "data-parallel" else "ZeRO-3 prefetch"
        how = (f"prefetched behind the previous block's compute ({who}), "
               "max(compute + contention, gathers)" if steady_state
               else "not hidden (one block)")
        text += f"; weight all-gathers {ms(gather_s)} ms {how}"
    if system == "vllm-tp":
        text += "; vLLM's design (Megatron TP, custom all-reduce), not run"
    passes = [c for c in colls if c.kind == "ring_pass" and c.group]
    if passes and system == "data-parallel":
        text += (f"; context-parallel attention (ring passes of keys and values inside "
                 f"groups of {len(passes[0].group)} devices sharing a batch block)")
    return f"{text} ({what}; NCCL model: {fab.describe()})"


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
