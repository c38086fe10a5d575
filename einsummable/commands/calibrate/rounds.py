"""Dependent exchange rounds: what ranks actually wait on, and the link figures that make the
simulator's time for such a chain equal the measured one.

A chain between ranks a and b: a sends a block to b, b's next op reads it (an identity op, so
the chain times the exchange alone) and b sends the result back, a reads it, and so on, `hops`
transfers in all; every hop is on the one critical path. All pairs of a round-robin round run
their chains at once (each rank in one pair), as ranks do in an exchange. Three chains:

    tiny    1 element per hop, one message
    multi   K messages of 1 element per hop (K sends; K receives landing in one buffer)
    large   one block of B bytes per hop
    duplex  both ranks of a pair, every hop: a W x W matmul (the core busy, as in a plan),
            then each sends its 1-element block to the other and reads the one it receives:
            two-way exchanges, whose messages cross (`Device.exchange_wait_s`)

Each chain is a hand-made `Lowered` program, run by the dist executor (`dist.execute`, the
runtime's own code) inside the calibration's gloo ranks and timed as `Pool.time` times a
program: a p2p barrier, then each rank's seconds to its program's end, the slowest rank's
counting; and simulated by `simulate_programs` on the calibrated topology. Trials interleave
the chains and rounds, so drift hits all alike; the figure per chain is the median over rounds
and trials, and its noise the interquartile range over the median.

The fit. With the rank-local figures (launch, memory, achieved rates) fixed, the simulated
time of chain j is a function S_j(x) of x = (L, m, g, w): the link latency, the per-message
host seconds, the inverse link bandwidth and the two-way exchange wait. On a serial chain S_j
is linear in x (every term lies on the critical path): S_j(x) = S_j(0) + a_j L + c_j m + d_j g
+ e_j w, with a_j about the hop count, c_j the messages on the path, d_j the bytes and e_j the
crossed waits (only duplex has them). The coefficients are read off the simulator by finite
differences, and x solves S(x) = T (the measured medians), four equations in four unknowns
(K > 1 separates m from L; B separates g; duplex's crossing messages separate w), subject to
L, m, w >= 0 and bandwidth <= MAX_BW; where a bound binds, the free unknowns are fitted by
least squares. The step is repeated from the
solution (Newton) in case a term leaves the critical path, until the simulated times match
to FIT_RTOL.
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ...backend.lowering import Lowered
from ...backend.runtime.dist import execute, p2p_barrier, rank_blocks
from ...backend.runtime.simulator import simulate_programs
from ...core.program import Alloc, Compute, Free, Output, Place, Program, Recv, Send, Slice
from ...errors import PlanError
from ...frontend.ir import Graph, TensorInfo, make_op
from ...frontend.scalar import arg
from ...topology import Topology

CHAINS = ("tiny", "multi", "large", "duplex")
ELEM_BYTES = 4  # the chains send float32
# The fastest link the fit may find (a bound, so that g = 1/bw stays positive).
MAX_BW = 1e13
# Newton steps of the fit, and the relative mismatch at which it stops.
FIT_STEPS = 6
FIT_RTOL = 1e-4
# Finite-difference steps of the coefficients: relative to the point, with a floor.
REL_STEP = 0.05
MIN_STEP = {"latency": 1e-6, "message": 1e-6, "inv_bw": 1e-12, "exchange_wait": 1e-6}


@dataclass(frozen=True)
class ChainEffort:
    hops: int            # transfers per chain (even: the block ends where it started)
    multi: int           # K: messages per hop of the multi chain
    large_bytes: int     # B: bytes per hop of the large chain
    trials: int
    warmup: int = 1
    busy_n: int = 64     # W: the duplex chain's matmul is W x W x W


FULL = ChainEffort(hops=40, multi=8, large_bytes=1 << 21, trials=15, busy_n=192)
QUICK = ChainEffort(hops=10, multi=4, large_bytes=1 << 18, trials=5)


@dataclass(frozen=True)
class ChainTime:
    """One chain's measured time: median over rounds and trials, and its spread."""
    kind: str
    hops: int
    messages_per_hop: int
    bytes_per_hop: int
    measured_s: float
    spread: float        # interquartile range / median
    samples: int
    low_s: float = 0.0   # the fastest and slowest sample
    high_s: float = 0.0


@dataclass(frozen=True)
class LinkFit:
    """The fitted figures and the simulated chain times they give (same order as chains)."""
    latency_s: float
    message_s: float
    bw: float
    simulated_s: tuple[float, ...]
    max_rel_error: float
    bounded: tuple[str, ...] = ()   # unknowns held at a bound
    exchange_wait_s: float = 0.0


def chain_shape(kind: str, effort: ChainEffort) -> tuple[int, int]:
    """(elements per message, messages per hop) of a chain."""
    if kind in ("tiny", "duplex"):
        return 1, 1
    if kind == "multi":
        return 1, effort.multi
    if kind == "large":
        return max(1, effort.large_bytes // ELEM_BYTES), 1
    raise PlanError(f"unknown chain {kind!r}", fix=f"use one of {', '.join(CHAINS)}")


def _hop_graph(n: int, busy_n: int) -> Graph:
    """x (n,) -> y = x through one identity op: the op every hop runs on what it received;
    and z = w @ w, the duplex chain's busy work."""
    op = make_op("hop", "a->a", ["x"], "y", {"x": (n,)}, join=arg(0))
    work = make_op("work", "ab,bc->ac", ["w", "w"], "z", {"w": (busy_n, busy_n)},
                   join=arg(0) * arg(1), agg="sum")
    return Graph((TensorInfo("x", (n,), "float32", "input"),
                  TensorInfo("w", (busy_n, busy_n), "float32", "input"),
                  TensorInfo("y", (n,), "float32"), TensorInfo("z", (busy_n, busy_n), "float32")),
                 (op, work), ("y",))


def _duplex(instrs: list[list], pairs: list[tuple[int, int]], hops: int, busy_n: int,
            ids: Iterator[int], tags: Iterator[int]) -> dict[tuple[int, int], int]:
    """Both ranks of each pair: Place x and w; every hop the matmul, then send its block to
    the other and read the one it receives. Returns (pair) -> rank a's final block."""
    cur: dict[int, int] = {}
    w: dict[int, int] = {}
    for a, b in pairs:
        for r in (a, b):
            cur[r], w[r] = next(ids), next(ids)
            instrs[r].append(Place(cur[r], "x", ((0, 1),)))
            instrs[r].append(Place(w[r], "w", ((0, busy_n), (0, busy_n))))
    full = ((0, busy_n), (0, busy_n), (0, busy_n))
    for _ in range(hops):
        for a, b in pairs:
            sent = {a: next(tags), b: next(tags)}
            got = {}
            for r, peer in ((a, b), (b, a)):
                z = next(ids)
                instrs[r].append(Compute(z, "work", full, (w[r], w[r])))
                instrs[r].append(Free(z))
                instrs[r].append(Send(cur[r], peer, sent[r]))
                got[r] = next(ids)
                instrs[r].append(Recv(got[r], peer, sent[peer], (1,), "float32"))
            for r in (a, b):
                out = next(ids)
                instrs[r].append(Compute(out, "hop", ((0, 1),), (got[r],)))
                cur[r] = out
    return {(a, b): cur[a] for a, b in pairs}


def chain_program(world: int, pairs: list[tuple[int, int]], kind: str,
                  effort: ChainEffort) -> Lowered:
    """The programs of one round's chains (module docstring), in one global order."""
    if effort.hops < 2 or effort.hops % 2:
        raise PlanError(f"a chain needs an even number of hops, got {effort.hops}",
                        fix="pass hops = 2, 4, ...")
    elems, msgs = chain_shape(kind, effort)
    n = elems * msgs
    instrs: list[list] = [[] for _ in range(world)]
    ids, tags = itertools.count(), itertools.count()
    cur: dict[tuple[int, int], int] = {}
    if kind == "duplex":
        cur = _duplex(instrs, pairs, effort.hops, effort.busy_n, ids, tags)
    for a, b in pairs:
        if kind != "duplex":
            cur[(a, b)] = next(ids)
            instrs[a].append(Place(cur[(a, b)], "x", ((0, n),)))
    for hop in range(0 if kind == "duplex" else effort.hops):
        for a, b in pairs:
            src, dst = (a, b) if hop % 2 == 0 else (b, a)
            buf = cur[(a, b)]
            if msgs == 1:
                tag, got = next(tags), next(ids)
                instrs[src].append(Send(buf, dst, tag))
                instrs[dst].append(Recv(got, src, tag, (n,), "float32"))
            else:
                regions = [((i * elems, (i + 1) * elems),) for i in range(msgs)]
                views = [next(ids) for _ in regions]
                instrs[src].extend(Slice(v, buf, r) for v, r in zip(views, regions))
                sent = [next(tags) for _ in regions]
                instrs[src].extend(Send(v, dst, t) for v, t in zip(views, sent))
                got = next(ids)
                instrs[dst].append(Alloc(got, (n,), "float32"))
                instrs[dst].extend(Recv(next(ids), src, t, (elems,), "float32", into=got, at=r)
                                   for t, r in zip(sent, regions))
            out = next(ids)
            instrs[dst].append(Compute(out, "hop", ((0, n),), (got,)))
            cur[(a, b)] = out
    # Rank 0 delivers y: its chain's block, which ends where it started, or (rank 0 idle this
    # round, or its chain's second rank) a copy of x, as the executors want every output there.
    mine = [buf for (a, _), buf in cur.items() if a == 0]
    if not mine:
        mine = [next(ids)]
        instrs[0].append(Place(mine[0], "x", ((0, n),)))
    instrs[0].append(Output("y", mine[0]))
    progs = tuple(Program(r, world, tuple(instrs[r])) for r in range(world))
    return Lowered(_hop_graph(n, effort.busy_n), progs)


def chain_inputs(low: Lowered) -> dict[str, torch.Tensor]:
    return {"x": torch.zeros(low.graph.tensor("x").shape),
            "w": torch.randn(low.graph.tensor("w").shape)}


def time_chains(rank: int, world: int, rounds: list[list[tuple[int, int]]],
                effort: ChainEffort, timeout_s: float) -> dict[tuple[int, str, int], float]:
    """In a gloo rank: this rank's seconds of every chain of every round, per (round, chain,
    trial), warm-up trials left out (module docstring). Every rank calls it at once."""
    lows = {(r, k): chain_program(world, rnd, k, effort)
            for r, rnd in enumerate(rounds) for k in CHAINS}
    blocks = {key: rank_blocks(low, rank, chain_inputs(low)) for key, low in lows.items()}
    out = {}
    for trial in range(effort.warmup + effort.trials):
        for (r, kind), low in lows.items():
            p2p_barrier(rank, world, timeout_s)
            t0 = time.perf_counter()
            execute(low, rank, blocks[(r, kind)], "cpu", timeout_s)
            if trial >= effort.warmup:
                out[(r, kind, trial)] = time.perf_counter() - t0
    return out


def summarize(per_rank: list[dict[tuple[int, str, int], float]], effort: ChainEffort
              ) -> tuple[ChainTime, ...]:
    """Each run lasts as long as its slowest rank; per chain the median over rounds and trials
    and the interquartile range over it."""
    got: dict[str, list[float]] = {k: [] for k in CHAINS}
    for key in per_rank[0]:
        got[key[1]].append(max(times[key] for times in per_rank))
    out = []
    for kind in CHAINS:
        elems, msgs = chain_shape(kind, effort)
        xs = sorted(got[kind])
        q1, med, q3 = (statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1
                       else (xs[0],) * 3)
        out.append(ChainTime(kind, effort.hops, msgs, elems * msgs * ELEM_BYTES, med,
                             (q3 - q1) / med, len(xs), xs[0], xs[-1]))
    return tuple(out)


# (latency, message, bw, exchange wait) -> topology
TopologyFor = Callable[[float, float, float, float], Topology]


def simulated(lows: list[Lowered], topology_for: TopologyFor, x: np.ndarray) -> np.ndarray:
    """Simulated seconds of each chain program at x = (latency, message, 1 / bw, wait)."""
    topo = topology_for(float(x[0]), float(x[1]), 1.0 / max(float(x[2]), 1.0 / MAX_BW),
                        float(x[3]))
    return np.array([simulate_programs(low, topo).time_s for low in lows])


def _bounded_solve(a: np.ndarray, r: np.ndarray, lo: np.ndarray
                   ) -> tuple[np.ndarray, tuple[int, ...]]:
    """x >= lo minimising |a x - r| (exact where it can be): try every set of unknowns held
    at their bound, fewest first, and keep the best feasible solution."""
    n = len(lo)
    best: tuple[float, np.ndarray, tuple[int, ...]] | None = None
    for k in range(n + 1):
        for held in itertools.combinations(range(n), k):
            free = [i for i in range(n) if i not in held]
            x = lo.copy()
            if free:
                rhs = r - a[:, list(held)] @ lo[list(held)] if held else r
                sol, *_ = np.linalg.lstsq(a[:, free], rhs, rcond=None)
                x[free] = sol
            if np.all(x >= lo - 1e-15):
                res = float(np.linalg.norm(a @ x - r))
                if best is None or res < best[0] - 1e-15:
                    best = (res, np.maximum(x, lo), held)
        if best is not None and best[0] <= 1e-12 * max(1.0, float(np.linalg.norm(r))):
            break
    assert best is not None  # all unknowns held at their bounds is always feasible
    return best[1], best[2]


def fit_links(chains: tuple[ChainTime, ...], lows: list[Lowered], topology_for: TopologyFor,
              start: tuple[float, float, float]) -> LinkFit:
    """Latency, message, bandwidth and exchange wait that make the simulated chains match
    (docstring); `start` = (latency, message, bw) to begin from (the independent-batch
    figures; the wait starts at the latency: at zero a crossed message that arrives before its
    reader gets to it has no slope in the wait)."""
    target = np.array([c.measured_s for c in chains])
    lo = np.array([0.0, 0.0, 1.0 / MAX_BW, 0.0])
    x = np.maximum(np.array([start[0], start[1], 1.0 / start[2], start[0]]), lo)
    names = tuple(MIN_STEP)
    held: tuple[int, ...] = ()
    for _ in range(FIT_STEPS):
        s0 = simulated(lows, topology_for, x)
        if np.max(np.abs(s0 - target) / target) <= FIT_RTOL:
            break
        a = np.zeros((len(lows), len(names)))
        for i, name in enumerate(names):
            step = max(MIN_STEP[name], REL_STEP * x[i])
            xi = x.copy()
            xi[i] += step
            a[:, i] = (simulated(lows, topology_for, xi) - s0) / step
        x, held = _bounded_solve(a, target - s0 + a @ x, lo)
    sim = simulated(lows, topology_for, x)
    return LinkFit(float(x[0]), float(x[1]), 1.0 / float(x[2]), tuple(float(s) for s in sim),
                   float(np.max(np.abs(sim - target) / target)),
                   tuple(names[i] for i in held), float(x[3]))
