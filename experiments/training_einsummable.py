"""The `einsummable` rows of the training bench: the block's training step traced, planned
(`choose_plan`, as `es.compile_train` plans it) and run inside the measuring ranks.

`plan_step` runs in the parent (the plan's JSON travels to the ranks); `rank_train_step` runs
in each rank: the plan's program lowered twice, once delivering the loss and the new
parameters to rank 0 (checked for one step against torch.optim) and once leaving them where
the plan computes them (timed: a training loop whose parameters and optimizer state stay on
the ranks; the step's inputs are bound once, as the forward bench binds its blocks once).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from einsummable.backend.lowering import lower
from einsummable.backend.runtime.dist import execute, rank_blocks
from einsummable.frontend.capture import StepGraph, bind_step, trace_step
from einsummable.frontend.optim import Hyper, TrainGraph, with_update
from einsummable.planning.plan import Plan
from einsummable.selection.choose import choose_plan

from .unavailable import Unavailable


def train_graph(block, x: torch.Tensor, y: torch.Tensor, hyper: Hyper) -> TrainGraph:
    """The block's step with mse_loss and `hyper`'s update, as `compile_train` traces it."""
    return with_update(trace_step(block, (x,), F.mse_loss, (y,)), hyper)


def plan_step(block, x: torch.Tensor, y: torch.Tensor, hyper: Hyper, topology,
              **options) -> Plan:
    """The plan `compile_train` would run (the least simulated of the MIP's pool and the named
    strategies); `options` go to `choose_plan`."""
    return choose_plan(train_graph(block, x, y, hyper).graph, topology, **options)


def rank_train_step(payload: str | None, block, x: torch.Tensor, y: torch.Tensor, rank: int,
                    world: int, hyper: Hyper):
    """(timed step, [(loss, parameters)] of one checked step on rank 0, note)."""
    if payload is None:
        raise Unavailable("no plan was prepared for this run")
    plan = Plan.from_json(payload)
    if plan.topology.world_size != world:
        raise Unavailable(f"plan is for {plan.topology.world_size} ranks, run has {world}")
    train = train_graph(block, x, y, hyper)
    if {t.name for t in train.graph.inputs} != {t.name for t in plan.graph.inputs}:
        raise Unavailable("the plan's graph is not this block's training step")
    dtype = x.dtype
    params = dict(block.named_parameters())
    state = {name: torch.zeros(train.graph.tensor(name).shape, dtype=dtype)
             for name, _ in train.updates if name not in params}
    scalars = {name: torch.tensor([v], dtype=dtype) for name, v in train.scalar_values(1).items()}
    feed = bind_step(StepGraph(train.graph, train.loss, ()), block, (x,), (y,),
                     {**state, **scalars})
    full = lower(plan)
    resident = lower(plan, deliver="in_place")
    full_blocks = rank_blocks(full, rank, feed)
    resident_blocks = rank_blocks(resident, rank, feed)
    consts: dict = {}

    with torch.no_grad():
        outs = execute(full, rank, full_blocks)
    checked = []
    if rank == 0:
        new = {name: outs[out].reshape(params[name].shape) for name, out in train.updates
               if name in params}
        checked.append((float(outs[train.loss].reshape(())), new))

    def step() -> None:
        with torch.no_grad():
            execute(resident, rank, resident_blocks, consts=consts)

    label = plan.judged.considered[0].label if plan.judged is not None else "optimized"
    return step, checked, f"{label} plan; send/recv only, no collectives"
