"""Data-parallel training steps of a LLaMA block: `ddp` and `fsdp`, written by hand.

Both split the batch over the ranks (x and y enter split by batch) and run the block at kernel
parity (`common.block_forward`); the loss is each rank's share of the whole mean
(`train_common.local_mse`), so the gradients are summed over ranks.

- ddp (PyTorch DistributedDataParallel): every rank keeps the full parameters and the full
  optimizer state; after the backward the gradients, flattened into one bucket (DDP's 25 MiB
  default bucket holds a block of these sizes whole), are summed by one all-reduce, and every
  rank takes the same optimizer step.
- fsdp (ZeRO-3, PyTorch FSDP's flat parameter): each rank keeps a 1/N slice of one flat,
  padded buffer of the block's parameters and the optimizer state of that slice only. The
  forward all-gathers the flat buffer (one FSDP unit per block); the gathered weights are kept
  for the backward (`reshard_after_forward=False`, what FSDP does for the unit whose backward
  runs first: the last block, the only one here), whose gradient of the flat buffer is
  reduce-scattered, leaving each rank the sum of its own slice; the optimizer steps the slice.
  One block measured alone has no earlier compute to prefetch its gather behind (the simulated
  table costs the steady state of a stack, gathers prefetched).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from einsummable.frontend.optim import Hyper

from .common import block_forward, require_even
from .data_parallel import FlatWeights
from .train_common import (
    TrainRankStep,
    gather_flat,
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


def build_fsdp(block, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
               hyper: Hyper) -> TrainRankStep:
    x_local, y_local = _batch_shard(x, rank, world, "fsdp"), _batch_shard(y, rank, world, "fsdp")
    flat = FlatWeights(block, rank, world)
    shard = nn.Parameter(flat.shard)
    opt = make_optimizer([shard], hyper)
    numel = y.numel()
    used = sum(flat.numels)

    def unflatten(full: torch.Tensor) -> dict[str, torch.Tensor]:
        views = torch.split(full[:used], flat.numels)
        return {n: v.view(s) for n, v, s in zip(flat.names, views, flat.shapes)}

    def step() -> torch.Tensor:
        opt.zero_grad()
        weights = unflatten(gather_flat(shard, world))
        loss = local_mse(block_forward(block, x_local, weights), y_local, numel)
        loss.backward()  # the flat gradient is reduce-scattered into shard.grad
        opt.step()
        return loss.detach()

    def params() -> dict[str, torch.Tensor]:
        full = shard.new_empty(shard.numel() * world)
        dist.all_gather_single(full, shard.detach())
        return unflatten(full)

    return TrainRankStep(step, params,
                         "batch split; flat weight shard all-gathered before the forward, kept "
                         "for the backward; gradient reduce-scattered; sharded optimizer step")
