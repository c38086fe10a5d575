"""Data-parallel training steps of a LLaMA block: `ddp` and `fsdp`, written by hand.

Both split the batch over the ranks (x and y enter split by batch) and run the block at kernel
parity (`common.block_forward`); the loss is each rank's share of the whole mean
(`train_common.local_mse`), so the gradients are summed over ranks.

- ddp (PyTorch DistributedDataParallel): every rank keeps the full parameters and the full
  optimizer state; after the backward the gradients, flattened into one bucket (DDP's 25 MiB
  default bucket holds a block of these sizes whole), are summed by one all-reduce, and every
  rank takes the same optimizer step.
- fsdp (ZeRO-3, PyTorch FSDP's flat parameters): the block wrapped as two units, its
  attention sub-layer and its MLP; of each unit every rank keeps a 1/N slice of one flat,
  padded buffer of its parameters and the optimizer state of that slice only. Both gathers are
  issued asynchronously when the step starts, so the MLP's runs behind the attention's
  compute (forward prefetch; the attention's has nothing before it in a block measured
  alone); the gathered weights are kept for the backward (`reshard_after_forward=False`, what
  FSDP does for the units whose backward runs first: here the block is the whole model).
  Once a unit's gradient is accumulated its reduce-scatter is issued asynchronously (the MLP's
  runs behind the attention's backward), leaving each rank the sum of its slice; the step
  waits for them, then the optimizer steps the slices.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from einsummable.frontend.optim import Hyper

from .common import block_forward, require_even
from .train_common import (
    TrainRankStep,
    local_mse,
    make_optimizer,
)


def _batch_shard(t: torch.Tensor, rank: int, world: int, system: str) -> torch.Tensor:
    n = require_even(t.shape[0], world, "batch", system)
    return t[rank * n:(rank + 1) * n].contiguous()


def build_ddp(block, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
              hyper: Hyper) -> TrainRankStep:
    x_local, y_local = _batch_shard(x, rank, world, "ddp"), _batch_shard(y, rank, world, "ddp")
    weights = {n: nn.Parameter(p.detach().clone()) for n, p in block.named_parameters()}
    opt = make_optimizer(weights.values(), hyper)
    numel = y.numel()

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = local_mse(block_forward(block, x_local, weights), y_local, numel)
        loss.backward()
        grads = [p.grad for p in weights.values()]
        bucket = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(bucket)
        for g, summed_g in zip(grads, torch.split(bucket, [g.numel() for g in grads])):
            g.copy_(summed_g.view_as(g))
        opt.step()
        return loss.detach()

    return TrainRankStep(step, lambda: {n: p.detach().clone() for n, p in weights.items()},
                         "batch split, full weights and optimizer state on every rank; "
                         "one all_reduce of the gradient bucket")


# FSDP units of a block, by parameter-name prefix, in the order the forward reads them: the
# attention sub-layer, then the MLP (the finest wrap of a transformer block).
UNITS = (("attention_norm.", "attention."), ("ffn_norm.", "feed_forward."))


class Unit:
    """One FSDP unit: this rank's slice of a flat, padded buffer of the unit's parameters
    (a Parameter the optimizer steps), gathered asynchronously into a leaf whose gradient, once
    accumulated, is reduce-scattered asynchronously into the slice's gradient."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], rank: int, world: int) -> None:
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        per_rank = -(-flat.numel() // world)
        padded = torch.zeros(per_rank * world, dtype=flat.dtype)
        padded[:flat.numel()] = flat
        self.shard = nn.Parameter(padded[rank * per_rank:(rank + 1) * per_rank].clone())
        self.world = world
        self.full: torch.Tensor | None = None
        self.views: dict[str, torch.Tensor] = {}
        self.pending: list = []

    def start_gather(self) -> None:
        self.full = self.shard.new_empty(self.shard.numel() * self.world)
        self.views = {}
        self.pending = [dist.all_gather_single(self.full, self.shard.detach(), async_op=True)]

    def weight(self, name: str) -> torch.Tensor:
        if not self.views:  # first read: wait for the gather, make the views autograd sees
            self.pending.pop().wait()
            self.full.requires_grad_(True)
            self.full.register_post_accumulate_grad_hook(self._reduce_scatter)
            self.views = self.unflatten(self.full)
        return self.views[name]

    def unflatten(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(full[:sum(self.numels)], self.numels)
        return {n: v.view(s) for n, v, s in zip(self.names, parts, self.shapes)}

    def _reduce_scatter(self, full: torch.Tensor) -> None:
        self.shard.grad = torch.empty_like(self.shard)
        self.pending.append(dist.reduce_scatter_single(self.shard.grad, full.grad,
                                                       async_op=True))

    def finish(self) -> None:
        while self.pending:
            self.pending.pop().wait()
        self.full, self.views = None, {}  # resharded after the step


class UnitWeights(Mapping):
    """The block's weights by name, each read from its unit (waiting for its gather)."""

    def __init__(self, units: list[Unit]) -> None:
        self.owner = {n: u for u in units for n in u.names}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.owner[name].weight(name)

    def __iter__(self):
        return iter(self.owner)

    def __len__(self) -> int:
        return len(self.owner)


def build_fsdp(block, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
               hyper: Hyper) -> TrainRankStep:
    x_local, y_local = _batch_shard(x, rank, world, "fsdp"), _batch_shard(y, rank, world, "fsdp")
    named = list(block.named_parameters())
    units = [Unit([(n, p) for n, p in named if n.startswith(prefixes)], rank, world)
             for prefixes in UNITS]
    if sum(len(u.names) for u in units) != len(named):
        raise ValueError("fsdp: the units do not cover the block's parameters")
    opt = make_optimizer([u.shard for u in units], hyper)
    numel = y.numel()

    def step() -> torch.Tensor:
        opt.zero_grad()
        for u in units:  # the MLP's gather is prefetched behind the attention's compute
            u.start_gather()
        loss = local_mse(block_forward(block, x_local, UnitWeights(units)), y_local, numel)
        loss.backward()  # each unit's gradient reduce-scattered once accumulated
        for u in units:
            u.finish()
        opt.step()
        return loss.detach()

    def params() -> dict[str, torch.Tensor]:
        out = {}
        for u in units:
            full = u.shard.new_empty(u.shard.numel() * world)
            dist.all_gather_single(full, u.shard.detach())
            out.update(u.unflatten(full))
        return out

    return TrainRankStep(step, params,
                         "batch split; two units (attention, MLP), each a flat weight shard "
                         "all-gathered asynchronously (the MLP's behind the attention's "
                         "compute), kept for the backward; each unit's gradient "
                         "reduce-scattered asynchronously once accumulated; sharded optimizer "
                         "step")
