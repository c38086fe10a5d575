"""The cost model, in seconds on a topology: compute per candidate, exchange per edge.

Compute. A candidate runs its tuples; device d runs those placed on it one after another. A
tuple t with F_t FLOP touching B_t bytes (its input regions read, its output block written) is
one kernel call:

    flop_s(t)   = F_t / (peak(dtype) * flop_efficiency)
    memory_s(t) = B_t / (mem_bw * mem_efficiency)
    kernel_s(t) = max(flop_s(t), memory_s(t)) + launch_s               (roofline + launch)
    compute(c)  = max_d  sum_{t on d} kernel_s(t)                      (slowest device)

F_t is the op's FLOP count scaled by the tuple's share of the join space. Views (reshape,
permute, squeeze) cost nothing: they relabel a block. `flop_efficiency` is the fraction of
peak a well-shaped kernel sustains; it is a named parameter of the device (attribute
`flop_efficiency` when the topology gives one, else `CostModel.flop_efficiency`); likewise
`mem_efficiency` for HBM. Both default to 1: the simulator's roofline, so that the optimizer
minimises the time the simulator predicts (one model). Derate them (Meta's autoparallel uses
70 % of peak) to plan for kernels that fall short of the datasheet; `einsummable calibrate`
measures the rates of this machine instead.

Exchange. The edge from a producer's candidate to a consumer's candidate costs
`exchange.exchange_time(exchange.synthesize(...))`: the very transfers (and partial-sum folds)
that lowering will emit, so the optimizer prices exactly what runs. Edge costs depend only on
the producer's output layout and the consumer's needs, so they are memoised on those (and the
tensor's shape, dtype and aggregation), which lets repeated blocks and equal layouts share one
synthesis.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from . import exchange as xchg
from .coalesce import weights_in_one_batch
from .ir import DTYPE_BYTES, Graph, Op, TensorInfo
from .placement import Candidate, Piece, input_needs, output_layout
from .spec import Region, region_shape, tuples

DEFAULT_FLOP_EFFICIENCY = 1.0
DEFAULT_MEM_EFFICIENCY = 1.0
# Below this many unpriced pairs the worker processes cost more than they
# save (measured: rounds of a few dozen pairs ran no faster on two workers than in-process).
PARALLEL_MIN_PAIRS = 400
PARALLEL_CHUNK = 64
Needs = tuple[tuple[Region, int], ...]


@dataclass(frozen=True)
class CostModel:
    """Named knobs of the model. Device attributes of the same name take precedence."""

    flop_efficiency: float = DEFAULT_FLOP_EFFICIENCY
    mem_efficiency: float = DEFAULT_MEM_EFFICIENCY
    exchange_mode: str = "optimized"   # or "naive" (owner sends to every reader)

    def to_dict(self) -> dict:
        return {"flop_efficiency": self.flop_efficiency, "mem_efficiency": self.mem_efficiency,
                "exchange_mode": self.exchange_mode}


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
    """`seconds` in all; `local_s` of it is the readers' stitching copies (device work).
    `batched_s`: the seconds it adds to a batch of exchanges that pays route latencies and
    per-message host work once (`exchange_time(batched=True)`; where lowering sends every
    weight in one batch); None where that is `seconds` itself."""
    seconds: float
    nbytes: int
    rounds: int
    local_s: float = 0.0
    batched_s: float | None = None

    @property
    def in_batch_s(self) -> float:
        return self.seconds if self.batched_s is None else self.batched_s


ZERO_EDGE = EdgeCost(0.0, 0, 0)


def flop_efficiency(device, model: CostModel) -> float:
    return getattr(device, "flop_efficiency", None) or model.flop_efficiency


def mem_efficiency(device, model: CostModel) -> float:
    return getattr(device, "mem_efficiency", None) or model.mem_efficiency


def _region_bytes(reg: Region, dtype: str) -> int:
    return math.prod(region_shape(reg)) * DTYPE_BYTES[dtype]


def compute_cost(op: Op, cand: Candidate, graph: Graph, topology,
                 model: CostModel = CostModel()) -> ComputeCost:
    """Compute terms of `cand` (module docstring). Graph-input layouts and views are free."""
    if op.is_view or op.output not in {o.output for o in graph.ops}:
        return ComputeCost(0.0, 0.0, 0.0, 0.0, 0)
    in_dtypes = [graph.tensor(n).dtype for n in op.inputs]
    out_dtype = graph.tensor(op.output).dtype
    total_points = math.prod(op.size.values())
    per_dev: dict[int, list[float]] = {}
    for t, devs in zip(tuples(op, cand.dec), cand.devices):
        share = math.prod(hi - lo for lo, hi in t.ranges) / total_points
        flops = op.flops * share
        nbytes = sum(_region_bytes(r, d) for r, d in zip(t.in_regions, in_dtypes))
        nbytes += _region_bytes(t.out_region, out_dtype)
        for d in devs:
            dev = topology.devices[d]
            peak = dev.peak(out_dtype if out_dtype in dev.peak_flops else "float32")
            f = flops / (peak * flop_efficiency(dev, model))
            m = nbytes / (dev.mem_bw * mem_efficiency(dev, model))
            acc = per_dev.setdefault(d, [0.0, 0.0, 0.0, 0.0, 0])
            acc[0] += f
            acc[1] += m
            acc[2] += dev.launch_s
            acc[3] += max(f, m) + dev.launch_s
            acc[4] += 1
    worst = max(per_dev.values(), key=lambda a: (a[3], -a[4]))
    return ComputeCost(worst[0], worst[1], worst[2], worst[3], int(worst[4]))


class FastTopology:
    """A read-only view of a Topology that memoises the per-pair queries the exchange
    synthesiser repeats (link, route hops, level groups). Same answers, fewer recomputations."""

    def __init__(self, topology) -> None:
        self._t = topology
        # the fields the synthesiser reads per transfer, held here rather than forwarded
        # by __getattr__ on every read (the memo dict is the topology's own, shared)
        self._cache = getattr(topology, "_cache", None)
        self.devices = topology.devices
        self._link: dict = {}
        self._hops: dict = {}
        self._direct: dict = {}
        self._group: dict = {}

    def __getattr__(self, name):
        return getattr(self._t, name)

    @property
    def base(self):
        return self._t

    def link(self, a: int, b: int):
        key = (a, b)
        if key not in self._link:
            self._link[key] = self._t.link(a, b)
        return self._link[key]

    def has_direct(self, a: int, b: int) -> bool:
        key = (a, b)
        if key not in self._direct:
            self._direct[key] = self._t.has_direct(a, b)
        return self._direct[key]

    def hops(self, a: int, b: int, nbytes=None):
        if nbytes is not None:
            return self._t.hops(a, b, nbytes)
        key = (a, b)
        if key not in self._hops:
            self._hops[key] = self._t.hops(a, b)
        return self._hops[key]

    def group_of(self, level, dev: int) -> int:
        key = (level, dev)
        if key not in self._group:
            self._group[key] = self._t.group_of(level, dev)
        return self._group[key]


def edge_info(info: TensorInfo) -> TensorInfo:
    """The tensor without its name: the exchange cost does not depend on it."""
    return TensorInfo("edge", info.shape, info.dtype)


@dataclass
class EdgePricer:
    """Prices (layout, needs) pairs with exchange.synthesize + exchange_time, memoised.

    The memo is per pricer (one optimisation), never global. Layouts and needs are interned
    (one id each), so a lookup hashes two small ints instead of every piece of both: the
    optimizer looks up tens of thousands of cells per solve."""

    topology: object
    model: CostModel = field(default_factory=CostModel)
    _memo: dict = field(default_factory=dict)   # (shape, dtype, agg, layout id, needs id)
    _ids: dict = field(default_factory=dict)    # layout or needs tuple -> id
    _full: dict = field(default_factory=dict)   # id -> that tuple
    calls: int = 0
    workers: int | None = None  # None: the CPUs this process may use
    # CPU seconds spent pricing and the pairs they priced (`predict_s`)
    spent_s: float = 0.0
    spent_pairs: int = 0
    # worker processes, started on the first batch large enough to pay for them and kept for
    # the next (each start forks this process); `close` ends them
    _pool: ProcessPoolExecutor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.fast = self.topology if isinstance(self.topology, FastTopology) \
            else FastTopology(self.topology)

    def _executor(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.fast.base, self.model.exchange_mode))
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        """End the worker processes (a later batch starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @staticmethod
    def key(info: TensorInfo, produced: Sequence[Piece], needs: Needs, agg: str | None):
        return (info.shape, info.dtype, agg, tuple(produced), tuple(needs))

    def intern(self, value: tuple) -> int:
        """A small id for a layout or needs tuple (the same id for equal tuples)."""
        i = self._ids.get(value)
        if i is None:
            i = self._ids[value] = len(self._ids)
            self._full[i] = value
        return i

    def short(self, key: tuple) -> tuple:
        shape, dtype, agg, produced, needs = key
        return (shape, dtype, agg, self.intern(produced), self.intern(needs))

    def _long(self, short: tuple) -> tuple:
        shape, dtype, agg, lid, nid = short
        return (shape, dtype, agg, self._full[lid], self._full[nid])

    def price(self, info: TensorInfo, produced: Sequence[Piece], needs: Needs,
              agg: str | None) -> EdgeCost:
        return self.price_short(self.short(self.key(info, produced, needs, agg)))

    def price_short(self, short: tuple) -> EdgeCost:
        hit = self._memo.get(short)
        if hit is None:
            self.calls += 1
            t0 = time.perf_counter()
            hit = _price(self._long(short), self.fast, self.model.exchange_mode)
            self.spent_s += time.perf_counter() - t0
            self.spent_pairs += 1
            self._memo[short] = hit
        return hit

    def _workers_for(self, n: int) -> int:
        workers = self.workers if self.workers is not None else _cpus()
        return 1 if n < PARALLEL_MIN_PAIRS or workers < 2 or not _can_fork() else workers

    def predict_s(self, n: int) -> float:
        """Wall seconds to price n more pairs at the mean CPU cost of those priced so far
        (infinite before any): for choosing between pricing now and solving again."""
        if not self.spent_pairs:
            return math.inf
        return n * self.spent_s / self.spent_pairs / self._workers_for(n)

    def known(self, key: tuple) -> EdgeCost | None:
        """The price of a full key (`key`) already priced, else None (prices nothing)."""
        return self._memo.get(self.short(key))

    def known_short(self, short: tuple) -> EdgeCost | None:
        """The price of a pair already priced, else None (prices nothing)."""
        return self._memo.get(short)

    def prefetch(self, keys: Sequence[tuple]) -> None:
        """Price many pairs (full keys, `key`) at once, in worker processes when there are
        enough of them. The answers are the same as `price` one by one (each pair is a pure
        function)."""
        self.prefetch_short([self.short(k) for k in keys])

    def prefetch_short(self, shorts: Sequence[tuple], deadline: float | None = None) -> int:
        """Price the pairs (short keys) not priced yet, in worker processes when there are many,
        in the order given. With `deadline` (a `time.perf_counter()` value) it stops at the
        first wave of work that ends past it, leaving the rest unpriced. Returns how many it
        priced."""
        todo = [k for k in dict.fromkeys(shorts) if k not in self._memo]
        workers = self._workers_for(len(todo))
        if workers == 1:
            for i, k in enumerate(todo):
                if deadline is not None and time.perf_counter() >= deadline:
                    return i
                self.price_short(k)
            return len(todo)
        chunks = [todo[i:i + PARALLEL_CHUNK] for i in range(0, len(todo), PARALLEL_CHUNK)]
        # one wave = one chunk per worker, so a deadline is overrun by one chunk's time at most
        waves = [chunks[i:i + workers] for i in range(0, len(chunks), workers)] \
            if deadline is not None else [chunks]
        done = 0
        t0 = time.perf_counter()
        pool = self._executor(workers)
        for wave in waves:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            longs = [[self._long(k) for k in chunk] for chunk in wave]
            for chunk, res in zip(wave, pool.map(_price_chunk, longs)):
                for k, v in zip(chunk, res):
                    self.calls += 1
                    self._memo[k] = v
                done += len(chunk)
        self.spent_s += (time.perf_counter() - t0) * workers
        self.spent_pairs += done
        return done


class EdgeMatrix:
    """Exchange costs of one edge, rows = producer layouts, columns = consumer needs, priced
    lazily: `exact` synthesises a cell on first use (memoised by the pricer); `estimate` is the
    exact cost of a priced cell and, for any other, lower bounds (`bound.py`) on its seconds
    and on its local (stitching) part, each at most the exact one. The optimizer solves on estimates and prices the cells its solutions use.

    Which cells are priced lives in the pricer, so repeated blocks that share one matrix, and
    later builds that share the pricer, see every price made."""

    def __init__(self, pricer: EdgePricer, info: TensorInfo, layouts: Sequence,
                 needs: Sequence, agg: str | None) -> None:
        from .bound import min_latency
        self.pricer = pricer
        lays = [tuple(l) for l in layouts]
        nds = [tuple(n) for n in needs]
        head = (tuple(info.shape), info.dtype, agg)
        self._rows = [pricer.intern(l) for l in lays]
        self._cols = [pricer.intern(n) for n in nds]
        self._head = head
        topo = pricer.fast.base
        self._batched = weights_in_one_batch(topo)
        self._latency = min_latency(topo)
        self._spec = (lays, nds, DTYPE_BYTES[info.dtype])
        self._bounds: tuple | None = None

    @property
    def bounds(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        """Per cell (seconds, local seconds), never above the exact EdgeCost's (`bound.py`);
        computed on first use."""
        if self._bounds is None:
            from .bound import matrix_bounds
            self._bounds = matrix_bounds(*self._spec, self.pricer.fast.base)
        return self._bounds

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._rows), len(self._cols)

    def short(self, r: int, s: int) -> tuple:
        return self._head + (self._rows[r], self._cols[s])

    def exact(self, r: int, s: int) -> EdgeCost:
        return self.pricer.price_short(self.short(r, s))

    def priced(self, r: int, s: int) -> bool:
        return self.pricer.known_short(self.short(r, s)) is not None

    def estimate(self, r: int, s: int) -> EdgeCost:
        hit = self.pricer.known_short(self.short(r, s))
        if hit is not None:
            return hit
        seconds, local = self.bounds[r][s]
        if not self._batched:
            return EdgeCost(seconds, 0, 0, local)
        # the wire bound less its one latency is a bound on the batched wire seconds
        wire = seconds - local
        return EdgeCost(seconds, 0, 0, local, max(0.0, wire - self._latency) + local)

    def estimates(self) -> tuple[tuple[EdgeCost, ...], ...]:
        R, S = self.shape
        return tuple(tuple(self.estimate(r, s) for s in range(S)) for r in range(R))

    def price_all(self) -> None:
        R, S = self.shape
        self.pricer.prefetch_short([self.short(r, s) for r in range(R) for s in range(S)])


def _price(key: tuple, topology, mode: str) -> EdgeCost:
    shape, dtype, agg, produced, needs = key
    ex = xchg.synthesize(TensorInfo("edge", shape, dtype), produced, needs, agg, topology,
                         mode=mode)
    if not ex:
        return ZERO_EDGE
    return EdgeCost(xchg.exchange_time(ex, topology), ex.nbytes, ex.n_rounds,
                    xchg.stitch_time(ex, topology),
                    xchg.exchange_time(ex, topology, batched=True)
                    if weights_in_one_batch(topology) else None)


_WORKER: dict = {}  # per worker process: its topology view (set once by the initializer)


def _init_worker(topology, mode: str) -> None:
    _WORKER["topology"] = FastTopology(topology)
    _WORKER["mode"] = mode


def _price_chunk(keys: list) -> list[EdgeCost]:
    return [_price(k, _WORKER["topology"], _WORKER["mode"]) for k in keys]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def finished_needs(pieces: Sequence[Piece]) -> Needs:
    """Where a tensor must end up fully folded: each block on the devices of its slice 0."""
    return tuple(dict.fromkeys((p.region, p.device) for p in pieces if p.slice == 0))


def edge_cost(info: TensorInfo, producer: Op, producer_cand: Candidate, consumer: Op,
              consumer_cand: Candidate, pricer: EdgePricer) -> EdgeCost:
    """Exchange from the producer's output layout to every block the consumer reads of `info`
    (all operand positions that read it)."""
    needs = consumer_needs(consumer, consumer_cand, info.name)
    return pricer.price(info, output_layout(producer, producer_cand), needs, producer.agg)


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
    dev = topology.devices[0]
    dtype = graph.tensors[0].dtype if graph.tensors else "float32"
    peak = topology.peak(dtype) * flop_efficiency(dev, model)
    return graph.flops / (topology.world_size * peak)
