"""The `einsummable` rows: capture a block, optimize it for a topology, simulate or run the plan.

The library's entry points are looked up when first used, so the harness runs (and says why a
row is empty) while parts of the library are still missing.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any

from .systems import Unavailable
from .workloads import Workload


def api(module: str, name: str, *more: str) -> Any:
    """`module.name` from the library (the first of `module` and `more` that has it), or
    Unavailable saying which piece is missing."""
    missing = []
    for mod_name in (module, *more):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            missing.append(f"{mod_name} ({e})")
            continue
        if callable(getattr(mod, name, None)):  # not a submodule of the same name
            return getattr(mod, name)
        missing.append(f"{mod_name}.{name}")
    raise Unavailable(f"{' / '.join(missing)} not available")


def choice_of(plan) -> dict:
    """A plan's choice as a mapping (Plan keeps it as sorted pairs)."""
    chosen = getattr(plan, "chosen", None)
    return dict(chosen if chosen is not None else plan.choice)


@dataclass(frozen=True)
class CapturedGraph:
    graph: Any
    how: str  # "capture" or "builder IR"


def graph_for(workload: Workload, dtype: str | None = None) -> CapturedGraph:
    """The block as a Graph: traced from the nn.Module on the meta device (no memory), or the
    builder's hand-written IR of the same block when capture is missing or fails."""
    dtype = dtype or workload.dtype
    module, x = workload.build(device="meta")
    try:
        trace = api("einsummable.capture", "trace")
        return CapturedGraph(trace(module, (x,)).with_dtype(dtype), "capture")
    except Unavailable as e:
        reason = str(e)
    except Exception as e:  # capture bug: fall back, and say so in the row
        reason = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    from einsummable.models import LlamaConfig
    from einsummable.models.llama_ir import llama_block_graph
    if not isinstance(module.config, LlamaConfig):
        raise Unavailable(reason)
    return CapturedGraph(llama_block_graph(module.config, workload.batch, workload.seq, dtype),
                         f"builder IR ({reason})")


@dataclass(frozen=True)
class Optimized:
    plan: Any
    solve_wall_s: float


def optimize(graph, topology, weights: str = "sharded", steady_state: bool = True,
             **options: Any) -> Optimized:
    fn = api("einsummable", "optimize", "einsummable.optimize")
    t0 = time.perf_counter()
    plan = fn(graph, topology, weights=weights, steady_state=steady_state, **options)
    return Optimized(plan, time.perf_counter() - t0)


def simulate(plan, mode: str = "optimized", resident: bool = True):
    """SimResult of a Plan, lowered with the given exchange mode.

    resident: leave the block's output where the plan computes it (steady state, as the
    baselines leave theirs) instead of also delivering it whole to device 0.
    """
    import dataclasses
    fn = api("einsummable.runtime.simulate", "simulate")
    graph = dataclasses.replace(plan.graph, outputs=()) if resident else plan.graph
    return fn(graph, choice_of(plan), plan.topology, mode=mode)


def named_plan(graph, topology, name: str, **options: Any):
    fn = api("einsummable", "named_plan", "einsummable.optimize", "einsummable.named")
    return fn(graph, topology, name, **options)


def plan_json(plan) -> str | None:
    to_json = getattr(plan, "to_json", None)
    return to_json() if to_json else None


def explain(plan) -> str:
    """The plan's per-op report (without re-pricing every named strategy: that is slow)."""
    fn = getattr(plan, "explain", None)
    if fn is None:
        return ""
    try:
        return fn(strategies=False)
    except TypeError:
        return fn()


def per_op_breakdown(plan) -> dict[str, tuple[float, float, int]]:
    """Node key -> (compute s, exchange s into it, bytes moved into it), from the optimizer's
    own pricing of this plan; empty when the optimizer does not expose it."""
    try:
        opt = importlib.import_module("einsummable.optimize")  # the module, not the function
        o = plan.option
        cost = dict(o.get("cost") or {})
        mode = cost.pop("exchange_mode", "optimized")
        model_cls = importlib.import_module("einsummable.cost").CostModel
        options = opt._options(o.get("weights", "sharded"), bool(o.get("steady_state", False)),
                               model_cls(**cost, exchange_mode=mode), mode)
        model = opt.build_model(plan.graph, plan.topology, options,
                                opt._restricted(plan.graph, plan.topology, options, plan.chosen))
        return opt._per_node(model, {k: 0 for k in model.nodes})
    except Exception:  # a private helper changed: the figure just loses its bytes column
        return {}


# ------------------------------------------------------------------------------ measured runs

def bound_inputs(graph, block, x) -> dict:
    """Graph inputs by name from the module: capture's binding, or the builder IR's names
    (x plus state_dict names, which is how llama_ir names them)."""
    try:
        bind = api("einsummable.capture", "bind")
        return bind(graph, block, (x,))
    except Unavailable:
        state = {k: v.detach() for k, v in block.state_dict().items()}
        return {"x": x, **state}


def measured_step(payload: str | None, block, x, rank: int, world: int):
    """This rank's part of an einsummable plan (payload: the Plan's JSON, made in the parent).

    Timed: the rank's program lowered without delivering the block's output to rank 0, so the
    output stays where the plan leaves it (steady state, as the baselines leave theirs).
    Checked: the full program once, whose output rank 0 assembles.
    """
    import dataclasses

    import torch
    if payload is None:
        raise Unavailable("no plan was prepared for this run")
    Plan = api("einsummable.plan", "Plan").from_json
    execute = api("einsummable.runtime.dist", "execute")
    rank_blocks = api("einsummable.runtime.dist", "rank_blocks")
    lower = api("einsummable.lower", "lower")
    from .baselines import RankStep
    plan = Plan(payload)
    if plan.topology.world_size != world:
        raise Unavailable(f"plan is for {plan.topology.world_size} ranks, run has {world}")
    inputs = bound_inputs(plan.graph, block, x)
    choice = choice_of(plan)
    full = lower(plan.graph, choice, plan.topology)
    resident = lower(dataclasses.replace(plan.graph, outputs=()), choice, plan.topology)
    full_blocks = rank_blocks(full, rank, inputs)
    resident_blocks = rank_blocks(resident, rank, inputs)
    out_name = plan.graph.outputs[0]

    def run():
        with torch.no_grad():
            execute(resident, rank, resident_blocks)
        return None

    def gather(_local):
        with torch.no_grad():
            outs = execute(full, rank, full_blocks)
        return outs.get(out_name) if rank == 0 else None

    return RankStep(run, gather, "optimized plan; send/recv only")
