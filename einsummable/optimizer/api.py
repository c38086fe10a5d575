"""The optimizer's entry points: `optimize`, `named_plan`, `plan_cost`, `candidates`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from typing import Mapping, Sequence

from formulations.problem import Solution, gap_of

from ..errors import InfeasibleError, PlanError
from ..frontend.ir import Graph
from ..planning.candidates import graph_candidates
from ..planning.cost import CostModel
from ..planning.placement import Candidate, one_device_choice
from ..planning.plan import Named, Options, Origin, Plan, Solved
from ..topology import load_topology
from .cache import cache_dir, cache_key, load_cached, store
from .model import Model, build_model, fixed_nodes, search_topology
from .gather_cuts import MEMORY_CUT_ROUNDS, fit_gathers, fits_with_gathers, least_capacity
from .peak import assignment_peaks, overfilled
from .named import ONE_DEVICE, STRATEGIES, STRATEGY_WEIGHTS, check_strategy, named_assignment
from .objective import objective_s
from .pool import differ_cut, meets
from .pricing import EdgePricer
from .search import floor_s, solve_model

# A proved gap below this is float rounding in the sums (the objective re-added in another
# order), not a missing proof: an optimal plan reports its objective as the bound, so the
# same inputs give the same bytes whichever rounds (timed decisions) proved it.
ROUNDING_GAP = 1e-12
MB = 1e6


def resolve_options(options: Options | None = None, *, weights: str | None = None,
                    steady_state: bool | None = None, cost_model: CostModel | None = None,
                    exchange_mode: str | None = None, overlap: bool | None = None,
                    nodes: str | None = None, layers: int | None = None) -> Options:
    """`options` (default `Options()`) with each keyword that is given in place of its field.
    The keywords are shortcuts for the fields, so one that contradicts `options`, or
    `exchange_mode` that contradicts `cost_model`, is an error rather than a silent choice."""
    base = options or Options()
    if cost_model is not None and exchange_mode is not None \
            and cost_model.exchange_mode != exchange_mode:
        raise PlanError(f"exchange_mode={exchange_mode!r} contradicts cost_model.exchange_mode="
                        f"{cost_model.exchange_mode!r}", fix="give the mode in one place")
    cost = cost_model or base.cost
    if exchange_mode is not None:
        cost = dataclasses.replace(cost, exchange_mode=exchange_mode)
    given = {"weights": weights, "steady_state": steady_state, "cost": cost, "overlap": overlap,
             "nodes": nodes, "layers": layers}
    given = {k: v for k, v in given.items() if v is not None}
    if options is not None:
        for k, v in given.items():
            if v != getattr(options, k):
                raise PlanError(f"{k}={v!r} contradicts options.{k}={getattr(options, k)!r}",
                                fix="pass the options once: in Options, or as keywords")
    return dataclasses.replace(base, **given)


def check_time_limit(time_limit_s: float | None) -> None:
    """None (no limit) or a positive, finite number of seconds: 0, negatives, NaN and infinity
    are mistakes, not limits (an infinite limit is None)."""
    if time_limit_s is None:
        return
    ok = (isinstance(time_limit_s, (int, float)) and not isinstance(time_limit_s, bool)
          and math.isfinite(time_limit_s) and time_limit_s > 0)
    if not ok:
        raise PlanError(f"time_limit_s must be a positive number of seconds, got "
                        f"{time_limit_s!r}", fix="pass e.g. time_limit_s=20, or None for no "
                        "limit (the search then runs to a proved optimum)")


def _plan(model: Model, assignment: Mapping[str, int], objective: float, bound, gap,
          solve_s: float, origin: Origin) -> Plan:
    choice = tuple((k, model.nodes[k].cands[assignment[k]]) for k in model.nodes)
    return Plan(model.graph, model.topology, choice, objective, bound, gap, solve_s,
                model.options, origin)


def candidates(graph: Graph, topology, weights: str | None = None) -> dict[str, list[Candidate]]:
    """Node key (op name, or "input:<name>" for a graph input's layout) -> its candidates,
    under the weights option (default `Options`' own: "free")."""
    topology = load_topology(topology)
    weights = resolve_options(weights=weights).weights
    return {k: list(oc.cands) for k, oc in
            graph_candidates(graph, topology, weights=weights).items()}


def plan_cost(graph: Graph, topology, choice: Mapping[str, Candidate | int], *,
              options: Options | None = None, weights: str | None = None,
              steady_state: bool | None = None, cost_model: CostModel | None = None,
              exchange_mode: str | None = None, overlap: bool | None = None) -> float:
    """The objective (seconds) of one candidate per node, exactly as the MIP scores it."""
    topology = load_topology(topology)
    options = resolve_options(options, weights=weights, steady_state=steady_state,
                              cost_model=cost_model, exchange_mode=exchange_mode,
                              overlap=overlap)
    model = build_model(graph, topology, options, fixed_nodes(graph, topology, options, choice))
    return objective_s(model, {k: 0 for k in model.nodes})


def named_plan(graph: Graph, topology, name: str, *, options: Options | None = None,
               weights: str | None = None, steady_state: bool | None = None,
               cost_model: CostModel | None = None, exchange_mode: str | None = None,
               overlap: bool | None = None, model: Model | None = None) -> Plan:
    """The named strategy as a Plan in the same IR, priced on the same cost model (weights
    "free" for data parallel, whose replicas are not stored once; `named.STRATEGY_WEIGHTS`).
    `model`: a model of these options to reuse (one is built when it is of other options)."""
    check_strategy(name)
    topology = load_topology(topology)
    options = resolve_options(options, weights=weights, steady_state=steady_state,
                              cost_model=cost_model, exchange_mode=exchange_mode,
                              overlap=overlap)
    options = dataclasses.replace(options,
                                  weights=STRATEGY_WEIGHTS.get(name, options.weights))
    if name == ONE_DEVICE:
        return _one_device_plan(graph, topology, options)
    if model is None or model.options != options:
        model = build_model(graph, topology, options)
    assignment, inexact = named_assignment(model, name)
    obj = objective_s(model, assignment)
    return _plan(model, assignment, obj, None, None, 0.0, Named(name, tuple(inexact)))


def _one_device_plan(graph: Graph, topology, options: Options) -> Plan:
    """Everything on device 0, priced on the model fixed to it. A fixed model keeps a memory
    row only where the choice overfills it (`memory.memory_rows`), so any row means it does
    not fit."""
    model = build_model(graph, topology, options,
                        fixed_nodes(graph, topology, options, one_device_choice(graph)))
    if model.memory is not None:
        peak = assignment_peaks(model, {k: 0 for k in model.nodes})[0]
        raise InfeasibleError(f"the whole graph does not fit on device 0: {peak.bytes / MB:.1f} "
                              f"MB live at its peak, {model.capacities[0] / MB:.1f} MB there "
                              f"({peak.describe()})", fix="use a plan over several devices")
    assignment = {k: 0 for k in model.nodes}
    return _plan(model, assignment, objective_s(model, assignment), None, None, 0.0,
                 Named(ONE_DEVICE))


def _strategies(model: Model, deadline: float | None = None,
                cuts: Sequence = ()) -> list[tuple[float, dict[str, int], str]]:
    """(objective, assignment, name) of each named strategy that is a plan of this model:
    legal under its weights option, within every device's memory, left by `cuts`. Out of
    time (`deadline`), those scored so far (at least one)."""
    out: list[tuple[float, dict[str, int], str]] = []
    for name in STRATEGIES:
        if STRATEGY_WEIGHTS.get(name, model.options.weights) != model.options.weights:
            continue
        if out and deadline is not None and time.perf_counter() >= deadline:
            break  # out of time: the strategies scored so far warm-start the solve
        a, _ = named_assignment(model, name)
        if not fits_with_gathers(model, a) or not meets(cuts, a):
            continue  # over a device's memory or cut off: not a plan here, nor a warm start
        out.append((objective_s(model, a), a, name))
    return out


def optimize(graph: Graph, topology, time_limit_s: float | None = None,
             weights: str | None = None, steady_state: bool | None = None, *,
             options: Options | None = None, solver: str = "highs",
             cache: bool | str | os.PathLike = True, cost_model: CostModel | None = None,
             exchange_mode: str | None = None, warm_start: bool = True,
             pricer: EdgePricer | None = None, overlap: bool | None = None,
             nodes: str | None = None, layers: int | None = None) -> Plan:
    """The MIP-optimal Plan for `graph` on `topology` (`model.py` states the MIP).

    options: what defines the model (`Options`: weights, steady_state, cost model, overlap);
    the keywords of the same names are shortcuts for its fields (`resolve_options`).

    time_limit_s: wall seconds for the whole search, model build, warm start and pricing
    included; when it runs out the best plan found is returned with its bound and gap (status
    "time_limit"). At least one strategy is scored, so a plan always comes back: the model
    build and that strategy's exchanges are the least a call takes (`check_time_limit` says
    what a limit may be).
    cache: True (default directory, or $EINSUMMABLE_CACHE_DIR), a directory, or False.
    pricer: an EdgePricer for this topology and cost model to reuse (its memo is shared with
    later builds, e.g. of named plans on the same graph); None makes a fresh one.
    overlap: weight exchanges stream behind compute (`objective.py`); False: plain sum.
    layers: the graph is one of this many identical blocks, each holding its weights in the
    plan's layout (`Options.layers`).
    """
    t0 = time.perf_counter()
    check_time_limit(time_limit_s)
    deadline = None if time_limit_s is None else t0 + time_limit_s
    options = resolve_options(options, weights=weights, steady_state=steady_state,
                              cost_model=cost_model, exchange_mode=exchange_mode,
                              overlap=overlap, nodes=nodes, layers=layers)
    topology = search_topology(graph, load_topology(topology), options)
    if pricer is not None and pricer.topology is not topology:
        pricer = None  # priced on another hierarchy: build_model makes one for this
    path = None
    if cache:
        d = cache_dir(None if cache is True else cache)
        path = d / f"{cache_key(graph, topology, options, time_limit_s, solver)}.json"
        hit = load_cached(path, graph, topology, options, time_limit_s, solver)
        if hit is not None:
            return hit
    model = build_model(graph, topology, options, pricer=pricer)
    scored = _strategies(model, deadline) if warm_start else []
    named = [a for _, a, _ in scored]
    best_named = min(scored, key=lambda x: x[0], default=None)
    warm = best_named[1] if best_named else None
    left = None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - t0))
    if left == 0.0 and best_named is not None:
        # out of time before the search: the best strategy scored, with the floor as bound
        low = min(floor_s(model), best_named[0])
        sol = Solution(dict(best_named[1]), best_named[0], low, gap_of(best_named[0], low),
                       time.perf_counter() - t0, "time_limit", solver)
    else:
        try:
            sol = solve_model(model, time_limit_s=left, solver=solver, warm_start=warm,
                              incumbents=named)
        except InfeasibleError as e:
            if model.options.weights == "sharded":
                raise  # the rows count every block: their least is the least
            raise least_capacity(model, e, _resolver(model, scored, solver), deadline=deadline
                                 ) from None
    sol = _fitting(model, sol, scored, solver, deadline)
    solve_s = time.perf_counter() - t0
    origin = Solved(solver, sol.status, time_limit_s, best_named[2] if best_named else None)
    bound, gap = sol.bound, sol.gap
    if sol.status == "optimal" and gap <= ROUNDING_GAP:
        bound, gap = sol.objective, 0.0
    plan = _plan(model, sol.assignment, sol.objective, bound, gap, solve_s, origin)
    _check_free_gathers(model, sol.assignment)
    if path is not None:
        store(path, plan)
    return plan


def _fitting(model: Model, sol: Solution, scored, solver: str, deadline: float | None,
             side: Sequence = ()) -> Solution:
    """With weights placed freely, the search again under memory cuts while the plan found
    overfills a device with the weight blocks it gathers where a weight is stored otherwise
    (`gather_cuts.py`); the strategies that meet the cuts warm-start it."""
    return fit_gathers(model, sol, _resolver(model, scored, solver, side), deadline)[0]


def _resolver(model: Model, scored, solver: str, side: Sequence = ()):
    """resolve(cuts, seconds left): the model solved under `side` and the cuts, warm-started
    by the strategies that meet them."""
    def resolve(cuts, left):
        every = tuple(side) + tuple(cuts)
        ok = [(o, a) for o, a, _ in scored if meets(every, a)]
        warm = min(ok, key=lambda x: x[0])[1] if ok else None
        return solve_model(model, time_limit_s=left, solver=solver, warm_start=warm,
                           incumbents=[a for _, a in ok], side=every)
    return resolve


def _check_free_gathers(model: Model, assignment: Mapping[str, int]) -> None:
    """The plan is refused, not returned over a device's memory, when the weight blocks it
    gathers where a weight is stored otherwise still overfill one after the cut rounds
    (`gather_cuts.py`: out of rounds or of time)."""
    peak = overfilled(model, assignment)
    if peak is not None:
        cap = model.topology.devices[peak.device].mem_bytes
        raise InfeasibleError(
            f"the plan found does not fit: {peak.describe()}, over its {cap / MB:.1f} MB; "
            f"the search stopped (its time limit, or {MEMORY_CUT_ROUNDS} rounds of memory "
            "cuts) before it found one whose gathered weight blocks fit",
            fix="raise time_limit_s, plan with weights='sharded' (every gathered block is in "
                "the memory rows), or give the devices more memory")


def optimize_pool(graph: Graph, topology, size: int, time_limit_s: float | None = None, *,
                  options: Options | None = None, solver: str = "highs",
                  cache: bool | str | os.PathLike = True, **shortcuts) -> tuple[Plan, ...]:
    """The MIP's optimum (`optimize`) and up to `size` - 1 plans after it, the k-th optimal
    among the plans that split some time-heavy op otherwise than each plan before it
    (`pool.py`), each solve under `time_limit_s`. Fewer come back when the cuts leave no
    plan. Each later plan's bound is the optimum's: a proof over every plan, so its gap says
    how far it is from the best objective. Cached as `optimize` caches, one file a plan."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PlanError(f"the pool size must be a positive integer, got {size!r}",
                        fix="pass 1 for the optimum alone, or e.g. 3")
    options = resolve_options(options, **shortcuts)
    topology = search_topology(graph, load_topology(topology), options)
    # one pricer for every solve: the exchanges the optimum's search priced are not priced
    # again for the plans after it (on h100x8x2's llama-7b block, most of a solve's time)
    pricer = EdgePricer(topology, options.cost)
    first = optimize(graph, topology, time_limit_s, options=options, solver=solver,
                     cache=cache, pricer=pricer)
    plans = [first]
    model: Model | None = None
    key = cache_key(graph, topology, options, time_limit_s, solver) if cache else None
    for rank in range(2, size + 1):
        path = None
        if key is not None:
            # keyed by the plans before it too: its cuts are theirs
            before = hashlib.sha256("".join(p.to_json() for p in plans).encode()).hexdigest()
            d = cache_dir(None if cache is True else cache)
            path = d / f"{key}-pool{rank}-{before[:16]}.json"
            hit = load_cached(path, graph, topology, options, time_limit_s, solver, rank)
            if hit is not None:
                plans.append(hit)
                continue
        t0 = time.perf_counter()
        model = model or build_model(graph, topology, options, pricer=pricer)
        cuts = [differ_cut(model, {k: model.index(k, c) for k, c in p.choice}, f"pool {i}")
                for i, p in enumerate(plans, 1)]
        if any(c is None for c in cuts):
            break  # a plan with no time-heavy op: nothing for a next plan to differ in
        scored = _strategies(model, cuts=cuts)
        best_named = min(scored, key=lambda x: x[0], default=None)
        try:
            sol = solve_model(model, time_limit_s=time_limit_s, solver=solver,
                              warm_start=best_named[1] if best_named else None,
                              incumbents=[a for _, a, _ in scored], side=cuts)
            deadline = None if time_limit_s is None else t0 + time_limit_s
            sol = _fitting(model, sol, scored, solver, deadline, side=cuts)
        except InfeasibleError:
            break  # every plan splits the heavy ops as one before it: the pool is complete
        try:
            _check_free_gathers(model, sol.assignment)
        except InfeasibleError:
            break  # the next plan overfills a device (weights free): none after it is returned
        bound = first.bound_s if first.bound_s is not None else sol.bound
        bound = min(bound, sol.objective)
        plan = _plan(model, sol.assignment, sol.objective, bound, gap_of(sol.objective, bound),
                     time.perf_counter() - t0,
                     Solved(solver, sol.status, time_limit_s,
                            best_named[2] if best_named else None, rank))
        if path is not None:
            store(path, plan)
        plans.append(plan)
    return tuple(plans)
