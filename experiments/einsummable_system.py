"""The `einsummable` rows: capture a block, optimize it for a topology, simulate or run the plan."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from einsummable import bind, choose_plan, named_plan, optimize as optimize_graph, trace
from einsummable.backend.lowering import IN_PLACE, lower
from einsummable.backend.runtime.dist import execute, rank_blocks
from einsummable.backend.runtime.simulator import SimResult, block_time
from einsummable.backend.runtime.simulator import simulate as simulate_choice
from einsummable.frontend.ir import Graph
from einsummable.optimizer.report import NodeCost, explain, plan_costs
from einsummable.planning.plan import Plan

from .baselines import RankStep
from .unavailable import Unavailable
from .workloads import Workload

__all__ = ["Optimized", "block_seconds", "chosen_label", "explain", "graph_for", "measured_step", "named_plan",
           "optimize", "plan_costs", "simulate", "NodeCost"]


def graph_for(workload: Workload, dtype: str | None = None) -> Graph:
    """The block as a Graph, traced from the nn.Module on the meta device (no memory)."""
    module, x = workload.build(device="meta")
    return trace(module, (x,)).with_dtype(dtype or workload.dtype)


@dataclass(frozen=True)
class Optimized:
    plan: Plan
    solve_wall_s: float


def optimize(graph: Graph, topology, weights: str = "sharded", steady_state: bool = True,
             select: bool = False, **options: Any) -> Optimized:
    """The MIP's optimum, or with `select` the plan einsummable returns to a user: the least
    simulated of it, the named strategies and one device (`choose_plan`, `Plan.judged`)."""
    t0 = time.perf_counter()
    make = choose_plan if select else optimize_graph
    plan = make(graph, topology, weights=weights, steady_state=steady_state, **options)
    return Optimized(plan, time.perf_counter() - t0)


def chosen_label(plan: Plan) -> str:
    """Which plan the selection stage kept ("optimized" for the MIP's optimum)."""
    return plan.judged.considered[0].label if plan.judged is not None else "optimized"


def simulate(plan: Plan, mode: str = "optimized", resident: bool = True) -> SimResult:
    """SimResult of a Plan, lowered with the given exchange mode.

    resident: leave the block's output where the plan computes it (steady state, as the
    baselines leave theirs) instead of also delivering it whole to device 0; a training
    step's carried outputs (`Graph.carried`) are still handed on to their inputs' layouts.
    """
    if not resident:
        return simulate_choice(plan.graph, plan.chosen, plan.topology, mode=mode)
    graph = dataclasses.replace(plan.graph, outputs=tuple(y for _, y in plan.graph.carried))
    return simulate_choice(graph, plan.chosen, plan.topology, mode=mode, deliver=IN_PLACE)


def block_seconds(plan: Plan) -> float:
    """Simulated seconds of one block as the plan's objective means it: in a stack with
    steady state (`simulator.block_time`: no first-block cold start, as FSDP's prefetching
    baseline is costed), else the plan's program alone."""
    return block_time(plan) if plan.options.steady_state else simulate_choice(plan).time_s


# ------------------------------------------------------------------------------ measured runs

def measured_step(payload: str | None, block, x, rank: int, world: int) -> RankStep:
    """This rank's part of an einsummable plan (payload: the Plan's JSON, made in the parent).

    Timed: the rank's program lowered without delivering the block's output to rank 0, so the
    output stays where the plan leaves it (steady state, as the baselines leave theirs).
    Checked: the full program once, whose output rank 0 assembles.
    """
    if payload is None:
        raise Unavailable("no plan was prepared for this run")
    plan = Plan.from_json(payload)
    if plan.topology.world_size != world:
        raise Unavailable(f"plan is for {plan.topology.world_size} ranks, run has {world}")
    inputs = bind(plan.graph, block, (x,))
    full = lower(plan.graph, plan.chosen, plan.topology)
    resident = lower(dataclasses.replace(plan.graph, outputs=()), plan.chosen, plan.topology)
    full_blocks = rank_blocks(full, rank, inputs)
    resident_blocks = rank_blocks(resident, rank, inputs)
    out_name = plan.graph.outputs[0]
    # What depends on the plan only (constant blocks, bound kernels) is made on the first run
    # and kept, as the library's own pools keep it.
    resident_consts: dict = {}

    def run():
        with torch.no_grad():
            execute(resident, rank, resident_blocks, consts=resident_consts)
        return None

    def gather(_local):
        with torch.no_grad():
            outs = execute(full, rank, full_blocks)
        return outs.get(out_name) if rank == 0 else None

    return RankStep(run, gather, "optimized plan; send/recv only")
