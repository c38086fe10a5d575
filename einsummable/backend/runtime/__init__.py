"""Executors for lowered programs: `local` (one process), `dist` (torch.distributed p2p) and
`simulator` (predicted time). `run` lowers a plan and dispatches on the backend."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ...errors import PlanError
from ..lowering import Lowered, lower
from .pool import run_dist
from .local import run_local
from .simulator import simulate

BACKENDS = ("local", "gloo", "nccl")


def run(plan: Any, inputs: Mapping[str, torch.Tensor], backend: str = "local", *,
        world_size: int | None = None, mode: str = "optimized", choice=None, topology=None,
        no_collectives: bool = False) -> dict[str, torch.Tensor]:
    """Outputs of a plan (a Plan, a graph with `choice` and `topology`, or a Lowered bundle)."""
    if backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}", fix=f"use one of {', '.join(BACKENDS)}")
    low = plan if isinstance(plan, Lowered) else lower(plan, choice, topology, mode=mode)
    if backend == "local":
        if world_size is not None and world_size != low.world_size:
            raise PlanError(f"the plan is for {low.world_size} ranks but world_size={world_size}",
                            fix=f"run with world_size={low.world_size}")
        return run_local(low, inputs)
    return run_dist(low, inputs, backend=backend, world_size=world_size,
                    no_collectives=no_collectives)


__all__ = ["BACKENDS", "run", "simulate"]
