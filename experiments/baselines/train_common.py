"""What the hand-written training-step baselines share: the rank's step, the loss, the
optimizer, and torch.distributed collectives with their autograd duals.

A training baseline module exposes `build(block, x, y, rank, world, hyper) -> TrainRankStep`.
Every rank builds the same block, x and targets y from one seed and keeps its own shards of
them; the forward runs at kernel parity with einsummable (`common.block_forward`'s sdpa
attention and RMSNorm calls), the backward is torch.autograd's, the update torch.optim's
(SGD or AdamW, on whatever part of the parameters the rank owns).

The loss is `mse_loss(block(x), y)` (the mean over every element of the whole batch). A rank
that holds part of the output computes its part of that mean, Σ (out - y)² / numel(whole), so
the ranks' local losses sum to the loss and their gradients sum to its gradient: data-parallel
gradients are then summed (all-reduce or reduce-scatter), not averaged.

The collectives' duals (Megatron-LM's conjugate operators, Shoeybi et al.):
- `copy_to_group`: identity forward, all-reduce of the gradient backward (before a
  column-parallel linear whose input every rank holds whole);
- `reduce_from_group`: all-reduce forward, identity backward (after a row-parallel linear);
- `gather_seq` / `scatter_seq`: all-gather along the sequence forward and reduce-scatter of the
  gradient backward, and the reverse (Megatron's sequence parallelism);
- `gather_flat`: all-gather of a flat weight shard forward, reduce-scatter (sum) of the full
  gradient backward (FSDP's flat parameter).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from einsummable.frontend.optim import Hyper


@dataclass(frozen=True)
class TrainRankStep:
    """One rank's part of a training system.

    step: one training step (forward, backward, update) on the rank's resident shards of x and
        y; returns the rank's loss, detached (no collective beyond the step's own: timed).
    params: the block's full parameters by name, assembled from every rank's (collective).
    note: how the system lays things out, for the results table.
    loss_split: whether the ranks' losses are shares to sum (else each is the whole loss).
    """

    step: Callable[[], torch.Tensor]
    params: Callable[[], dict[str, torch.Tensor]]
    note: str = ""
    loss_split: bool = True

    def whole_loss(self, local: torch.Tensor) -> float:
        """The step's loss from this rank's (collective where the loss is split)."""
        return summed(local) if self.loss_split else float(local)


def make_optimizer(params: Iterable[torch.nn.Parameter], hyper: Hyper) -> torch.optim.Optimizer:
    """torch.optim's SGD or AdamW with the hyperparameters einsummable's update takes."""
    params = list(params)
    if hyper.optimizer == "sgd":
        return torch.optim.SGD(params, lr=hyper.lr, weight_decay=hyper.weight_decay)
    return torch.optim.AdamW(params, lr=hyper.lr, betas=hyper.betas, eps=hyper.eps,
                             weight_decay=hyper.weight_decay)


def local_mse(out: torch.Tensor, y: torch.Tensor, whole_numel: int) -> torch.Tensor:
    """This rank's share of mse_loss over the whole output (module docstring)."""
    return (out - y).pow(2).sum() / whole_numel


def summed(loss: torch.Tensor) -> float:
    """The whole loss from every rank's share."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total)


def gathered_params(mine: dict[str, torch.Tensor],
                    assemble: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]]
                    ) -> dict[str, torch.Tensor]:
    """Every rank's shards (any shapes) gathered as objects and assembled (checks only)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, {k: v.detach().clone() for k, v in mine.items()})
    return assemble(every)


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _all_gather_seq(h: torch.Tensor, world: int) -> torch.Tensor:
    """(b, s/N, d) -> (b, s, d) through a sequence-first buffer (contiguous shards)."""
    local = h.transpose(0, 1).contiguous()
    full = local.new_empty((local.shape[0] * world, *local.shape[1:]))
    dist.all_gather_single(full, local)
    return full.transpose(0, 1)


def _reduce_scatter_seq(h: torch.Tensor, world: int) -> torch.Tensor:
    """(b, s, d) partial sums -> this rank's (b, s/N, d) of their sum."""
    full = h.transpose(0, 1).contiguous()
    local = full.new_empty((full.shape[0] // world, *full.shape[1:]))
    dist.reduce_scatter_single(local, full)
    return local.transpose(0, 1)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, world):
        ctx.world = world
        return _all_gather_seq(h, world)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.world), None


class _ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, world):
        ctx.world = world
        return _reduce_scatter_seq(h, world)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.world), None


def copy_to_group(x: torch.Tensor) -> torch.Tensor:
    return _CopyToGroup.apply(x)


def reduce_from_group(x: torch.Tensor) -> torch.Tensor:
    return _ReduceFromGroup.apply(x)


def gather_seq(h: torch.Tensor, world: int) -> torch.Tensor:
    return _GatherSeq.apply(h, world)


def scatter_seq(h: torch.Tensor, world: int) -> torch.Tensor:
    return _ScatterSeq.apply(h, world)
