"""The cost model, in seconds on a topology: compute per candidate, exchange per edge.

Compute. A candidate runs its tuples; device d runs those placed on it one after another. A
tuple t with F_t FLOP touching B_t bytes (its input regions read, its output block written) is
one kernel call, priced by `kernel_time.kernel_time` (the simulator prices its kernels with
the same function):

    kernel_s(t) = launch + max(flop_s(t), memory_s(t))                (roofline + launch)
    compute(c)  = max_d  sum_{t on d} kernel_s(t)                      (slowest device)

F_t is the op's FLOP count scaled by the tuple's share of the join space (`Op.share`: a
windowed mode follows its output mode and is not counted twice). Views (reshape,
permute, squeeze) cost nothing: they relabel a block. The rates are what the device achieves
(`topology/achieved.py`: by op class and call size; the datasheet unless the topology says
otherwise); `CostModel.flop_efficiency` and `mem_efficiency` derate every device on top (Meta's
autoparallel uses 70 % of peak), for what-if questions.

Exchange. The edge from a producer's candidate to a consumer's candidate costs
`timing.exchange_time(exchange.synthesize(...))`: the very transfers (and partial-sum folds)
that lowering will emit, so the optimizer prices exactly what runs. Edge costs depend only on
the producer's output layout and the consumer's needs, so they are memoised on those (and the
tensor's shape, dtype and aggregation), which lets repeated blocks and equal layouts share one
synthesis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..core.geometry import Region, region_shape
from ..errors import PlanError
from ..frontend.ir import DTYPE_BYTES, Graph, Op, TensorInfo
from .exchange import synthesize
from .kernel_time import kernel_time
from .placement import Candidate, Piece, input_needs, one_device_choice
from .spec import tuples
from .timing import exchange_parts, exchange_time, level_busy, stitch_time
from .transfers import MODES

DEFAULT_FLOP_EFFICIENCY = 1.0
DEFAULT_MEM_EFFICIENCY = 1.0
Needs = tuple[tuple[Region, int], ...]


@dataclass(frozen=True)
class CostModel:
    """Named knobs of the model. Device attributes of the same name take precedence."""

    flop_efficiency: float = DEFAULT_FLOP_EFFICIENCY
    mem_efficiency: float = DEFAULT_MEM_EFFICIENCY
    exchange_mode: str = "optimized"   # or "naive" (owner sends to every reader)

    def __post_init__(self) -> None:
        if self.exchange_mode not in MODES:
            raise PlanError(f"unknown exchange mode {self.exchange_mode!r}",
                            fix=f"use one of: {', '.join(MODES)}")
        for name in ("flop_efficiency", "mem_efficiency"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise PlanError(f"{name} must be a fraction of peak in (0, 1], got {v!r}",
                                fix=f"pass e.g. CostModel({name}=0.7)")

    def to_dict(self) -> dict:
        return {"flop_efficiency": self.flop_efficiency, "mem_efficiency": self.mem_efficiency,
                "exchange_mode": self.exchange_mode}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "CostModel":
        unknown = sorted(set(d) - {"flop_efficiency", "mem_efficiency", "exchange_mode"})
        if unknown:
            raise PlanError(f"unknown cost model keys {unknown}",
                            fix="use flop_efficiency, mem_efficiency and exchange_mode")
        return CostModel(**d)


@dataclass(frozen=True)
class ComputeCost:
    """Terms of the busiest device: FLOP time, memory time, launch overhead, and the total
    (sum over its kernels of max(flop, memory) + launch)."""

    flop_s: float
    memory_s: float
    launch_s: float
    total_s: float
    kernels: int


@dataclass(frozen=True)
class EdgeCost:
    """`seconds` in all; `local_s` of it is what the readers' stitching copies add to the end
    (all of their time where they follow the last round; replayed, only what the transfers
    did not hide). `batched_s`: the seconds it adds to a batch of exchanges that pays route
    latencies and per-message host work once (`exchange_time(batched=True)`; where lowering
    sends every weight in one batch); None where that is `seconds` itself. `copy_s`: the
    busiest reader's stitching copies as device work (`timing.stitch_time`), overlapped or
    not: a weight streamed behind compute takes that much of its reader's compute stream.
    `levels`: per level of the topology, the seconds the exchange keeps that level's links
    busy (`timing.level_busy`); () where it is not priced yet."""
    seconds: float
    nbytes: int
    rounds: int
    local_s: float = 0.0
    batched_s: float | None = None
    copy_s: float = 0.0
    levels: tuple[float, ...] = ()

    @property
    def in_batch_s(self) -> float:
        return self.seconds if self.batched_s is None else self.batched_s


ZERO_EDGE = EdgeCost(0.0, 0, 0)


def _region_bytes(reg: Region, dtype: str) -> int:
    return math.prod(region_shape(reg)) * DTYPE_BYTES[dtype]


def compute_cost(op: Op, cand: Candidate, graph: Graph, topology,
                 model: CostModel = CostModel()) -> ComputeCost:
    """Compute terms of `cand` (module docstring). Graph-input layouts and views are free."""
    if op.is_view or op.output not in {o.output for o in graph.ops}:
        return ComputeCost(0.0, 0.0, 0.0, 0.0, 0)
    in_dtypes = [graph.tensor(n).dtype for n in op.inputs]
    out_dtype = graph.tensor(op.output).dtype
    per_dev: dict[int, list[float]] = {}
    for t, devs in zip(tuples(op, cand.dec), cand.devices):
        share = op.share(t.ranges)
        flops = op.flops * share
        nbytes = sum(_region_bytes(r, d) for r, d in zip(t.in_regions, in_dtypes))
        nbytes += _region_bytes(t.out_region, out_dtype)
        for d in devs:
            kt = kernel_time(op, flops, nbytes, out_dtype, topology.devices[d],
                             model.flop_efficiency, model.mem_efficiency)
            acc = per_dev.setdefault(d, [0.0, 0.0, 0.0, 0.0, 0])
            acc[0] += kt.flop_s
            acc[1] += kt.memory_s
            acc[2] += kt.launch_s
            acc[3] += kt.total_s
            acc[4] += 1
    worst = max(per_dev.values(), key=lambda a: (a[3], -a[4]))
    return ComputeCost(worst[0], worst[1], worst[2], worst[3], int(worst[4]))


def memory_bound_share(graph: Graph, topology, model: CostModel = CostModel()) -> float:
    """μ of `kernel_time`'s contention: the share of the graph's compute seconds, every op
    whole on device 0, spent in kernels bound by memory (memory_s ≥ flop_s)."""
    choice = one_device_choice(graph)
    bound = total = 0.0
    for op in graph.ops:
        c = compute_cost(op, choice[op.name], graph, topology, model)
        total += c.total_s
        if c.kernels and c.memory_s >= c.flop_s:
            bound += c.total_s
    return bound / total if total > 0 else 0.0


def exchange_cost(key: tuple, topology, mode: str) -> EdgeCost:
    """The exact cost of one cell, key = (shape, dtype, agg, produced pieces, needs): the
    exchange lowering will emit, synthesised and timed."""
    shape, dtype, agg, produced, needs = key
    ex = synthesize(TensorInfo("edge", shape, dtype), produced, needs, agg, topology,
                         mode=mode)
    if not ex:
        return ZERO_EDGE
    seconds, local = exchange_parts(ex, topology)
    return EdgeCost(seconds, ex.nbytes, ex.n_rounds, local,
                    exchange_time(ex, topology, batched=True)
                    if topology.charges_per_message else None,
                    stitch_time(ex, topology), level_busy(ex, topology))


def finished_needs(pieces: Sequence[Piece]) -> Needs:
    """Where a tensor must end up fully folded: each block on the devices of its slice 0."""
    return tuple(dict.fromkeys((p.region, p.device) for p in pieces if p.slice == 0))


def consumer_needs(consumer: Op, cand: Candidate, tensor: str) -> Needs:
    out: dict = {}
    for i, name in enumerate(consumer.inputs):
        if name == tensor:
            out.update(dict.fromkeys(input_needs(consumer, cand, i)))
    return tuple(out)


def resident_bytes(pieces: Sequence[Piece], dtype: str, n_devices: int) -> tuple[int, ...]:
    """Bytes each device holds of a layout (partial slices and replicas included)."""
    out = [0] * n_devices
    for p in pieces:
        out[p.device] += _region_bytes(p.region, dtype)
    return tuple(out)


def needs_bytes(needs: Needs, dtype: str, n_devices: int) -> tuple[int, ...]:
    out = [0] * n_devices
    for reg, d in needs:
        out[d] += _region_bytes(reg, dtype)
    return tuple(out)


def compute_floor(graph: Graph, topology, model: CostModel = CostModel()) -> float:
    """FLOPs / (devices x peak x efficiency): no plan's FLOP time is below this."""
    dtype = graph.tensors[0].dtype if graph.tensors else "float32"
    peak = topology.peak(dtype) * model.flop_efficiency
    return graph.flops / (topology.world_size * peak)
