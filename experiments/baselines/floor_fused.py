"""`floor-fused`: the `floor` yardstick run with einsummable's own kernels.

The block is captured at the full batch (capture fuses attention and RMSNorm, as for the
einsummable rows) and planned as data parallel with every weight replicated, so each rank's
program is its 1/N of the batch with nothing to send; the rank runs that program,
concurrently with the others. The measured floor of a run is the lower of this and `floor`:
a plan that runs faster kernels than the module's own must not be credited for them as if
they were parallelism.
"""
from __future__ import annotations

import dataclasses

import torch

from .common import RankStep, require_even


def build(block, x: torch.Tensor, rank: int, world: int, **_: object) -> RankStep:
    from einsummable import bind, trace
    from einsummable.backend.lowering import lower
    from einsummable.optimizer.api import named_plan
    from einsummable.backend.runtime.dist import execute, rank_blocks
    from einsummable.core.program import Recv, Send
    from einsummable.topology import synthetic

    require_even(x.shape[0], world, "batch", "floor-fused")
    graph = trace(block, (x,))
    plan = named_plan(graph, synthetic(world), "data-parallel")
    low = lower(dataclasses.replace(graph, outputs=()), dict(plan.chosen), plan.topology)
    if any(isinstance(i, Send | Recv) for i in low.programs[rank].instrs):
        raise ValueError("the data-parallel layout of this block communicates; no fused floor")
    inputs = bind(graph, block, (x,))
    blocks = rank_blocks(low, rank, inputs)
    consts: dict = {}  # constant blocks made once, as the einsummable rows keep them
    # Checked like the einsummable rows: the same plan with its output delivered to rank 0.
    full = lower(graph, dict(plan.chosen), plan.topology)
    full_blocks = rank_blocks(full, rank, inputs)

    def run() -> None:
        with torch.no_grad():
            execute(low, rank, blocks, consts=consts)

    def gather(_local) -> torch.Tensor | None:
        with torch.no_grad():
            outs = execute(full, rank, full_blocks)
        return outs.get(graph.outputs[0]) if rank == 0 else None
    return RankStep(run, gather, "as floor, with einsummable's kernels (its data-parallel "
                                 "program, weights replicated: no messages)")
