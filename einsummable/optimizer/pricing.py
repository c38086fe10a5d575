"""Pricing edge cells: (producer layout, consumer needs) -> EdgeCost, memoised and lazy.

The optimizer's edge matrices hold, per cell, either the exact cost (`cost.exchange_cost`: the
synthesised exchange, timed) or, until it is priced, a lower bound (`bound.py`). Pricing is the
dominant cost of a solve, so the pricer interns layouts and needs (a cell is five small
values), memoises every price for the whole optimisation, and prices large batches in worker
processes.
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
from ..frontend.ir import DTYPE_BYTES, Op, TensorInfo
from ..planning.cost import CostModel, EdgeCost, Needs, consumer_needs, exchange_cost
from ..planning.placement import Candidate, Piece, output_layout
from ..planning.bound import matrix_bounds, min_latency

# Below this many unpriced pairs the worker processes cost more than they
# save (measured: rounds of a few dozen pairs ran no faster on two workers than in-process).
PARALLEL_MIN_PAIRS = 400


PARALLEL_CHUNK = 64


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

    def _executor(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.topology, self.model.exchange_mode))
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
            hit = exchange_cost(self._long(short), self.topology, self.model.exchange_mode)
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
        self.pricer = pricer
        lays = [tuple(l) for l in layouts]
        nds = [tuple(n) for n in needs]
        head = (tuple(info.shape), info.dtype, agg)
        self._rows = [pricer.intern(l) for l in lays]
        self._cols = [pricer.intern(n) for n in nds]
        self._head = head
        topo = pricer.topology
        self._batched = topo.charges_per_message
        self._latency = min_latency(topo)
        self._spec = (lays, nds, DTYPE_BYTES[info.dtype])
        self._bounds: tuple | None = None

    @property
    def bounds(self) -> tuple[tuple[tuple[float, float, float], ...], ...]:
        """Per cell (seconds, local seconds, copy seconds), never above the exact EdgeCost's
        (`bound.py`); computed on first use."""
        if self._bounds is None:
            self._bounds = matrix_bounds(*self._spec, self.pricer.topology)
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
        seconds, local, copy = self.bounds[r][s]
        if not self._batched:
            return EdgeCost(seconds, 0, 0, local, copy_s=copy)
        # the wire bound less its one latency is a bound on the batched wire seconds
        wire = seconds - local
        return EdgeCost(seconds, 0, 0, local, max(0.0, wire - self._latency) + local, copy)

    def estimates(self) -> tuple[tuple[EdgeCost, ...], ...]:
        R, S = self.shape
        return tuple(tuple(self.estimate(r, s) for s in range(S)) for r in range(R))

    def price_all(self) -> None:
        R, S = self.shape
        self.pricer.prefetch_short([self.short(r, s) for r in range(R) for s in range(S)])


_WORKER: dict = {}  # per worker process: its topology (set once by the initializer)


def _init_worker(topology, mode: str) -> None:
    _WORKER["topology"] = topology
    _WORKER["mode"] = mode


def _price_chunk(keys: list) -> list[EdgeCost]:
    return [exchange_cost(k, _WORKER["topology"], _WORKER["mode"]) for k in keys]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def edge_cost(info: TensorInfo, producer: Op, producer_cand: Candidate, consumer: Op,
              consumer_cand: Candidate, pricer: EdgePricer) -> EdgeCost:
    """Exchange from the producer's output layout to every block the consumer reads of `info`
    (all operand positions that read it)."""
    needs = consumer_needs(consumer, consumer_cand, info.name)
    return pricer.price(info, output_layout(producer, producer_cand), needs, producer.agg)

