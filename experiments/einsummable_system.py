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


def simulate(plan, mode: str = "optimized"):
    """SimResult of a Plan, lowered with the given exchange mode."""
    fn = api("einsummable.runtime.simulate", "simulate")
    return fn(plan.graph, choice_of(plan), plan.topology, mode=mode)


def named_plan(graph, topology, name: str, **options: Any):
    fn = api("einsummable", "named_plan", "einsummable.optimize", "einsummable.named")
    return fn(graph, topology, name, **options)


def plan_json(plan) -> str | None:
    to_json = getattr(plan, "to_json", None)
    return to_json() if to_json else None


def explain(plan) -> str:
    fn = getattr(plan, "explain", None)
    return fn() if fn else ""


# ------------------------------------------------------------------------------ measured runs

def measured_step(payload: str | None, block, x, rank: int, world: int):
    """This rank's step of an einsummable plan (payload: the plan's JSON, made in the parent)."""
    if payload is None:
        raise Unavailable("no plan was prepared for this run")
    rank_runner = api("einsummable.runtime.dist", "rank_runner")
    from .baselines import RankStep
    runner = rank_runner(payload, block, x, rank, world)
    return RankStep(runner.run, runner.gather, getattr(runner, "note", "optimized plan, p2p only"))
