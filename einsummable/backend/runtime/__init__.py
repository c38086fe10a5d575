"""Executors for lowered programs: `local` (one process), `dist` (torch.distributed p2p) and
`simulator` (predicted time). `run` lowers a plan and dispatches on the backend; `kept`
gathers the inputs a plan's runs keep on the ranks (`resident.py`)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from ...errors import PlanError
from ..lowering import Lowered, lower
from .pool import POOLS, Pools, run_dist
from .local import run_local
from .resident import gather
from .simulator import simulate

BACKENDS = ("local", "gloo", "nccl")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}", fix=f"use one of {', '.join(BACKENDS)}")


def run(plan: Any, inputs: Mapping[str, torch.Tensor], backend: str = "local", *,
        world_size: int | None = None, mode: str = "optimized", choice=None, topology=None,
        no_collectives: bool = False, resident: dict | None = None,
        pools: Pools | None = None) -> dict[str, torch.Tensor]:
    """Outputs of a plan (a Plan, a graph with `choice` and `topology`, or a Lowered bundle).
    Blocks the programs keep (`Keep`) stay in the worker pool (`pools`, by default the
    process's) or, for `local`, in the caller's `resident` dict: the next run reads them for
    the inputs it is not passed."""
    _check_backend(backend)
    low = plan if isinstance(plan, Lowered) else lower(plan, choice, topology, mode=mode)
    if backend == "local":
        if world_size is not None and world_size != low.world_size:
            raise PlanError(f"the plan is for {low.world_size} ranks but world_size={world_size}",
                            fix=f"run with world_size={low.world_size}")
        return run_local(low, inputs, resident=resident)
    return run_dist(low, inputs, backend=backend, world_size=world_size,
                    no_collectives=no_collectives, pools=pools)


def kept(low: Lowered, names: Iterable[str], backend: str = "local", *,
         resident: dict | None = None, pools: Pools | None = None) -> dict[str, torch.Tensor]:
    """The inputs `names` whole, on the CPU, as the last run of `low` left them on the ranks
    (`resident` and `pools` as `run` was given them)."""
    _check_backend(backend)
    if backend == "local":
        store = {} if resident is None else resident
        return gather(low, names, {k: v for blocks in store.values() for k, v in blocks.items()})
    return (pools or POOLS).get(backend, low.world_size).kept(low, names)


__all__ = ["BACKENDS", "kept", "run", "simulate"]
