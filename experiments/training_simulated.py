"""The training-step baselines' time per block on a topology, simulated the way the forward
baselines are (`simulated.py`): compute from the library's compute model, collectives costed
as NCCL runs them (`collectives.py`), in the steady state of a stack of blocks.

**Compute.** The ops of the training graph itself (forward, backward, update: the graph
einsummable plans), each under the baseline's layout: the named plan of the same name
(data-parallel for ddp, fsdp, megatron-tp, megatron-tp-sp), op by op by
`planning.cost.compute_cost` (summed over ops, it is the simulator's compute per device).
The ops fall in three phases: forward (up to the loss), backward, update (the joins that
produce the new parameters and optimizer state). Per device: C_f, C_b, U. DDP replicates its
update, so its U is the update's ops whole on one device; FSDP steps its 1/N shard, so its U
is each update op split over the devices along its largest mode (`sharded_update_s`).

**Collectives.** Those of the forward baseline of the same layout (`simulated.simulate_baseline`
on the forward graph: the same bytes, fabric, rates), and those of the backward and of the
gradients' synchronisation. With P the bytes of the block's parameters (FSDP's flat
parameter), N the devices, κ_X the compute a stream X costs per second it runs behind compute
(`kernel_time.contention_share` at the stream's rate through a device):
- ddp (weights and optimizer state replicated; batch split, and where there are fewer
  sequences than devices the sequence too, attention context-parallel as in the forward
  baseline): one all-reduce of the gradients, AR = all_reduce(P), bucketed and overlapped with
  the backward (DDP launches a bucket's all-reduce once its gradients are ready; in a stack
  the block's buckets run behind the backward of the blocks before it):
      T = C_f + max(C_b + κ_AR AR, AR) + U + 3 R,
  R the forward's exposed ring passes of keys and values (the backward passes the keys and
  values again and their gradients back, behind twice the attention compute: 2 R).
- fsdp (ZeRO-3; PyTorch FSDP's defaults: one unit per block, forward and backward prefetch,
  resharded after the forward): the flat parameter gathered before the forward, G =
  all_gather(P), and again before the backward, whose gradients are reduce-scattered,
  RS = reduce_scatter(P), both behind the compute of the neighbouring block:
      T = max(C_f + κ_G G, G) + max(C_b + κ_G (G + RS), G + RS) + U + 3 R.
- pytorch-tp (Megatron TP): the forward's two all-reduces of (b, s, d) and the backward's two
  of the same size (the gradients of the sub-layers' inputs), waited for: T = C_f + C_b + U
  + 2 A, A the forward baseline's collectives.
- pytorch-tp-sp: the forward's all-gathers and reduce-scatters and their duals backward
  (2 A), plus one all-reduce of the norms' weight gradients, partial over the sequence:
  T = C_f + C_b + U + 2 A + all_reduce(norm weights). (Megatron keeps only the sequence shard
  of each sub-layer's input and all-gathers it again in the backward, behind the input
  gradient's compute; this model keeps the gathered input, so it does not charge that.)
Every figure is also given with the collectives at the links' full rates (`at_peak_s`), and
beside it the simulated time of einsummable's own program of the same layout (`layout_s`: the
named plan lowered to send/recv and simulated, as the einsummable rows are), which tells the
collectives' overlap apart from the layout.
"""
from __future__ import annotations

from dataclasses import dataclass

from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.ir import Graph
from einsummable.frontend.optim import TrainGraph
from einsummable.planning.cost import compute_cost, memory_bound_share
from einsummable.planning.kernel_time import contention_share
from einsummable.planning.placement import Candidate, one_device_choice

from . import einsummable_system as es_sys
from .collectives import ACHIEVED, PEAK, Rates, collective_time, fabric
from .simulated import simulate_baseline, tp_group

# Training baseline -> (named plan of its compute, forward baseline of its collectives, the
# forward baseline's weights option).
LAYOUTS = {"ddp": ("data-parallel", "data-parallel", "replicated"),
           "fsdp": ("fsdp", "data-parallel", "sharded"),
           "pytorch-tp": ("megatron-tp", "pytorch-tp", "sharded"),
           "pytorch-tp-sp": ("megatron-tp-sp", "pytorch-tp-sp", "sharded")}
SYSTEMS = tuple(LAYOUTS)
# The backward's exposed ring passes over the forward's: keys and values again, and their
# gradients back, behind twice the forward's attention compute (module docstring).
RING_BACKWARD = 2
# The backward of a Megatron layout runs the duals of the forward's collectives, same sizes.
TP_BACKWARD = 1


@dataclass(frozen=True)
class Phases:
    """Per-device compute seconds of a training graph under one layout."""
    forward_s: float
    backward_s: float
    update_s: float


@dataclass(frozen=True)
class TrainTime:
    time_s: float
    compute_s: float
    comm_s: float
    gather_s: float
    at_peak_s: float
    layout_s: float
    note: str


def phases(train: TrainGraph, choice, topology) -> Phases:
    """C_f, C_b, U (module docstring) of `train` under `choice`."""
    graph = train.graph
    updated = {out for _, out in train.updates}
    loss_at = next(i for i, op in enumerate(graph.ops) if op.output == train.loss)
    acc = [0.0, 0.0, 0.0]
    for i, op in enumerate(graph.ops):
        phase = 2 if op.output in updated else (0 if i <= loss_at else 1)
        acc[phase] += compute_cost(op, choice[op.name], graph, topology).total_s
    return Phases(*acc)


def replicated_update_s(train: TrainGraph, topology) -> float:
    """The update's ops whole on one device (every DDP rank runs all of them)."""
    whole = one_device_choice(train.graph)
    updated = {out for _, out in train.updates}
    return sum(compute_cost(op, whole[op.name], train.graph, topology).total_s
               for op in train.graph.ops if op.output in updated)


def sharded_update_s(train: TrainGraph, topology) -> float:
    """The update's ops each split over the devices along their largest mode: FSDP (ZeRO-3)
    steps each rank's 1/N shard of the weights and their optimizer state. (The named fsdp
    layout splits token modes only, and an update has none: it would replicate the update.)"""
    n = topology.world_size
    updated = {out for _, out in train.updates}
    total = 0.0
    for op in train.graph.ops:
        if op.output not in updated:
            continue
        big = max(op.modes, key=lambda m: op.size[m])
        p = min(n, op.size[big])
        cand = Candidate(tuple((m, p if m == big else 1) for m in op.modes),
                         tuple((d,) for d in range(p)), "update shard")
        total += compute_cost(op, cand, train.graph, topology).total_s
    return total


def _share(topology, mu: float, moved_bytes: float, seconds: float) -> float:
    """κ of a stream moving `moved_bytes` through each device in `seconds`."""
    return contention_share(topology, mu, moved_bytes / seconds if seconds else None)


def _norm_bytes(graph: Graph) -> int:
    return sum(w.nbytes for w in graph.weights if len(w.shape) == 1)


def simulate_training(system: str, train: TrainGraph, forward: Graph, topology) -> TrainTime:
    """The baseline's time per block of a training step (module docstring)."""
    if system not in LAYOUTS:
        raise ValueError(f"no simulated training baseline {system!r}: use one of "
                         f"{', '.join(LAYOUTS)}")
    named, fwd_system, weights = LAYOUTS[system]
    plan = es_sys.named_plan(train.graph, topology, named)
    ph = phases(train, plan.chosen, topology)
    update_s = (replicated_update_s(train, topology) if system == "ddp"
                else sharded_update_s(train, topology) if system == "fsdp" else ph.update_s)
    mu = memory_bound_share(train.graph, topology)
    times = {}
    for label, rates in (("achieved", ACHIEVED), ("peak", PEAK)):
        fwd = simulate_baseline(fwd_system, forward, topology, weights, True, rates)
        times[label] = _time(system, ph, update_s, fwd, forward, topology, mu, rates)
    t, comm_s, gather_s = times["achieved"]
    compute_s = ph.forward_s + ph.backward_s + update_s
    ms = lambda x: f"{x * 1e3:.3f}"  # noqa: E731
    note = (f"simulated: forward {ms(ph.forward_s)} + backward {ms(ph.backward_s)} + update "
            f"{ms(update_s)} ms compute ({named} layout of the training graph); collectives "
            f"{ms(comm_s)} ms on the critical path")
    if gather_s:
        note += f"; gradient/weight streams {ms(gather_s)} ms behind compute"
    layout_s = simulate(plan).time_s
    note += f"; einsummable's program of this layout {ms(layout_s)} ms"
    return TrainTime(t, compute_s, comm_s, gather_s, times["peak"][0], layout_s, note)


def _time(system: str, ph: Phases, update_s: float, fwd, forward: Graph, topology, mu: float,
          rates: Rates) -> tuple[float, float, float]:
    """(T, collectives on the critical path, streams behind compute) at `rates`."""
    n = topology.world_size
    params = sum(w.nbytes for w in forward.weights)
    if system == "ddp":
        ring = (1 + RING_BACKWARD) * fwd.comm_s
        ar = collective_time("all_reduce", params, fabric(topology), rates)
        kappa = _share(topology, mu, 2 * (n - 1) / n * params, ar)
        t = ph.forward_s + max(ph.backward_s + kappa * ar, ar) + update_s + ring
        return t, ring, ar
    if system == "fsdp":
        ring = (1 + RING_BACKWARD) * fwd.comm_s
        g = fwd.gather_s
        rs = collective_time("reduce_scatter", params, fabric(topology), rates)
        kappa = _share(topology, mu, (n - 1) / n * params, g)
        t = (max(ph.forward_s + kappa * g, g) + max(ph.backward_s + kappa * (g + rs), g + rs)
             + update_s + ring)
        return t, ring, 2 * g + rs
    comm = (1 + TP_BACKWARD) * fwd.comm_s
    if system == "pytorch-tp-sp":
        comm += collective_time("all_reduce", _norm_bytes(forward),
                                fabric(topology, tp_group(topology)), rates)
    return ph.forward_s + ph.backward_s + update_s + comm, comm, 0.0
