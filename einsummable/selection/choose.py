"""Close the loop between the objective and the simulator: choose by simulated time.

The MIP minimises the objective T_obj(p) exactly, with a proof (bound, gap) on that model. The
simulator's time T_sim(p) runs the very programs lowering emits, with the schedule the MIP
cannot state (sends leaving as data arrives, relays stored and forwarded, prefetch windows).
Where the two disagree the MIP's optimum need not be the fastest plan, so the plan returned
is

    p* = argmin over p in P of T_sim(p),
    P = {MIP optimum} u {the MIP's next plans} u {the MIP's node-parallel optimum}
        u {named strategies} u {variants}

ties going to the earlier member of P (the MIP's optimum first). Every member is a plan of
the same graph and topology under the same weights option (a strategy that needs other
weights, data parallel's replicas under "sharded", is not a legal plan of these options and
is left out; so is one device when the graph's memory does not fit there, and any strategy
that overfills a device's memory), so p* is as legal as the MIP's optimum and never simulates
slower than any strategy considered. The MIP's bound stays a proof on the objective's model; that p* is best
holds only among P, and the report says so (`Plan.judged`).

T_sim is `simulator.block_time` (one block in a stack) for a steady-state plan, the time of
its program otherwise: the same figure the objective predicts (`docs/ARCHITECTURE.md`, "One
model of time"). `measure="program"` judges a steady-state plan by its program alone instead:
one block with no block before it to stream its weights behind, which is what a benchmark
timing a single block runs.

The MIP's next plans (`optimizer/pool.py`): the optimum on the objective where each plan
before it is cut off together with every plan that splits the time-heavy ops as it does, so
each is a different way of cutting the work, close on the objective, that the simulator may
order otherwise (`pool`, default DEFAULT_POOL plans in all).

The node-parallel optimum (machines of several nodes, `planning/node_parallel.py`): the MIP
over plans in which each node runs its share of the batch, the levels inside a node searched.
Its search has the size of one node's, so within a time limit it often ends at a better plan
than the search over every level, which it cannot beat on the objective given time (it is
a subset of that search's plans, bar the tables it replicates over nodes).

Variants: the MIP re-solved under the other overlap rule (every exchange on the critical path
instead of weights streamed behind compute), a different prediction of the same programs,
which wins where the prefetch window cannot hide what the objective streams.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from ..backend.runtime.simulator import block_time, simulate
from ..backend.runtime.workers import library_main
from ..frontend.ir import Graph
from ..optimizer.api import (check_time_limit, named_plan, optimize, optimize_pool,
                             resolve_options)
from ..optimizer.model import build_model
from ..errors import InfeasibleError, PlanError
from ..optimizer.gather_cuts import fits_with_gathers
from ..optimizer.named import NAMED, ONE_DEVICE, STRATEGY_WEIGHTS, named_assignment
from ..planning import node_parallel
from ..planning.plan import Considered, Judged, Options, Plan
from ..topology import load_topology

OPTIMIZED = "optimized"
SERIAL = "optimized-serial"  # the MIP under the other overlap rule
NODES = "optimized-nodes"  # the MIP over node-parallel plans (machines of several nodes)
BLOCK, PROGRAM = "block", "program"
# Plans of the MIP's pool the simulator judges by default: the optimum and the next that
# splits a time-heavy op otherwise. On h100x8x2's llama-7b block the optimum simulates at
# 0.712 ms and the next plan, 1.9% dearer on the objective, at 0.642. A third costs more than
# the first two together (a100x8 llama-7b: 2.3, 1.4 and 19.6 s; each cut weakens the MIP's
# relaxation); ask for it with `pool`.
DEFAULT_POOL = 2


MEASURES = (BLOCK, PROGRAM)


def simulated_s(plan: Plan, measure: str | None = None) -> tuple[float, str]:
    """The simulated seconds of the plan by `measure` (default: what its objective predicts,
    a block in a stack for a steady-state plan, else its program), and which measure it is."""
    if measure is None:
        measure = BLOCK if plan.options.steady_state else PROGRAM
    if measure == BLOCK:
        return block_time(plan), BLOCK
    return simulate(plan).time_s, PROGRAM


def pool_labels(options: Options, strategies: Sequence[str] = NAMED,
                serial: bool = False, pool: int = DEFAULT_POOL,
                nodes: bool = False) -> tuple[str, ...]:
    """The labels of the plans considered, in tie-breaking order: the MIP's `pool` plans
    (fewer where the cuts leave none), the MIP over node-parallel plans (`nodes`: on a
    machine of several nodes, with every level searched otherwise), its serial variant, the
    named strategies."""
    named = tuple(s for s in strategies
                  if STRATEGY_WEIGHTS.get(s, options.weights) == options.weights)
    ranks = tuple(pool_label(rank) for rank in range(1, pool + 1))
    nodes = nodes and options.nodes == "free"
    return ranks + ((NODES,) if nodes else ()) + ((SERIAL,) if serial else ()) + named


def pool_label(rank: int) -> str:
    """The label of the MIP pool's `rank`-th plan ("optimized" for the optimum)."""
    return OPTIMIZED if rank == 1 else f"{OPTIMIZED}-{rank}"


def choose_plan(graph: Graph, topology, *, options: Options | None = None,
                time_limit_s: float | None = None, cache: bool | str | os.PathLike = True,
                strategies: Sequence[str] = NAMED, serial: bool = False, jobs: int = 1,
                measure: str | None = None, pool: int = DEFAULT_POOL, **shortcuts) -> Plan:
    """The least simulated plan among the MIP's optimum and the `pool` - 1 plans after it
    (`optimizer/pool.py`: each splits some time-heavy op otherwise than those before it),
    the named `strategies` legal under the options, and (with `serial`) the MIP under the
    other overlap rule; `Plan.judged` holds every plan's objective and simulated seconds.
    `time_limit_s` and `cache` go to each MIP solve; `shortcuts` are `optimize`'s option
    keywords (`resolve_options`).
    `jobs`: processes simulating the plans at once (each plan's simulation is independent;
    a process costs an interpreter start, so it pays on large machines' plans only).
    `measure`: "block" or "program" (module docstring; default: what the objective predicts)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise PlanError(f"jobs must be a positive integer, got {jobs!r}",
                        fix="pass jobs=1 to simulate in this process")
    if measure is not None and measure not in MEASURES:
        raise PlanError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}",
                        fix="pass measure='block' (a block in a stack) or 'program' (the "
                            "plan's program alone), or leave it out")
    check_time_limit(time_limit_s)
    topology = load_topology(topology)
    options = resolve_options(options, **shortcuts)
    if measure == BLOCK and not options.steady_state:
        raise PlanError("measure='block' needs a steady-state plan",
                        fix="pass steady_state=True, or measure='program'")
    plans: list[tuple[str, Plan]] = []
    left_out: list[tuple[str, str]] = []
    shared = None  # one model for every named plan, built when the first needs it
    named_options = dataclasses.replace(options, nodes="free")  # the strategies as they are
    for label in pool_labels(options, strategies, serial, pool=1,  # the pool's in OPTIMIZED
                             nodes=node_parallel.applies(topology)):
        if label == OPTIMIZED:
            for rank, plan in enumerate(optimize_pool(graph, topology, pool, time_limit_s,
                                                      options=options, cache=cache), 1):
                plans.append((pool_label(rank), plan))
            continue
        elif label == NODES:
            try:
                plan = optimize(graph, topology, time_limit_s, cache=cache,
                                options=dataclasses.replace(options, nodes="parallel"))
            except PlanError as e:  # e.g. a batch the nodes do not divide: recorded
                left_out.append((label, str(e)))
                continue
        elif label == SERIAL:
            other = dataclasses.replace(options, overlap=not options.overlap)
            plan = optimize(graph, topology, time_limit_s, options=other, cache=cache)
        elif label == ONE_DEVICE:
            try:
                plan = named_plan(graph, topology, label, options=named_options)
            except InfeasibleError as e:  # recorded in Plan.judged, not hidden
                left_out.append((label, str(e)))
                continue
        else:
            shared = shared or build_model(graph, topology, named_options)
            if not fits_with_gathers(shared, named_assignment(shared, label)[0]):
                left_out.append((label, "over a device's memory"))  # not a legal plan here
                continue
            plan = named_plan(graph, topology, label, options=named_options, model=shared)
        plans.append((label, plan))
    times = _simulate_all([p for _, p in plans], jobs, measure)
    judged = []
    for order, ((label, plan), (seconds, measure)) in enumerate(zip(plans, times)):
        judged.append((seconds, order, Considered(label, plan.objective_s, seconds)))
    judged.sort(key=lambda j: (j[0], j[1]))
    best = plans[judged[0][1]][1]
    return dataclasses.replace(best, judged=Judged(judged[0][0], measure,
                                                   tuple(j[2] for j in judged),
                                                   tuple(left_out)))


def _simulate_all(plans: Sequence[Plan], jobs: int, measure: str | None
                  ) -> list[tuple[float, str]]:
    """`simulated_s` of every plan, in order: here, or in `jobs` fresh processes (spawned:
    no state of this process, e.g. a gloo pool's threads, is forked into them)."""
    if jobs == 1 or len(plans) < 2:
        return [simulated_s(p, measure) for p in plans]
    context = multiprocessing.get_context("spawn")
    # the pool's processes start as they are needed, during map: keep the user's main out
    with library_main(), ProcessPoolExecutor(max_workers=min(jobs, len(plans)),
                                             mp_context=context) as pool:
        return list(pool.map(_simulated_from_json, [p.to_json() for p in plans],
                             [measure] * len(plans)))


def _simulated_from_json(text: str, measure: str | None) -> tuple[float, str]:
    return simulated_s(Plan.from_json(text), measure)
