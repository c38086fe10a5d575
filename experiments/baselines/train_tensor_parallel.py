"""Megatron tensor-parallel training steps of a LLaMA block, written by hand: `megatron-tp`
and `megatron-tp-sp`.

The layouts are the forward baselines' (`pytorch_tp`, `pytorch_tp_sp`): column-parallel
wq/wk/wv/w1/w3, row-parallel wo/w2, each rank its heads' and FFN columns' slices and the
optimizer state of those slices. The collectives come with their autograd duals
(`train_common`): in TP every sub-layer's input passes `copy_to_group` (its gradient
all-reduced in the backward) and its row-parallel output `reduce_from_group` (all-reduced in
the forward): two all-reduces forward, two backward. The norms and the residual stream are
replicated, so every rank computes the whole loss and the norms' whole gradients.
In TP+SP the residual stream and the norms are split by sequence: all-gather before each
sub-layer (reduce-scatter of its gradient backward), reduce-scatter after it (all-gather
backward); the norms' weight gradients are then partial over the sequence and are summed by
one all-reduce after the backward, as Megatron does for its sequence-parallel norms.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from einsummable.frontend.optim import Hyper

from .common import require_even, rms_norm
from .pytorch_tp import TensorParallelLlamaBlock
from .train_common import (
    TrainRankStep,
    copy_to_group,
    gather_seq,
    gathered_params,
    local_mse,
    make_optimizer,
    reduce_from_group,
    scatter_seq,
)

# The block's parameter names of each sharded slice, and the dimension it is cut along.
SHARDED = {"wq": ("attention.wq.weight", 0), "wk": ("attention.wk.weight", 0),
           "wv": ("attention.wv.weight", 0), "wo": ("attention.wo.weight", 1),
           "w1": ("feed_forward.w1.weight", 0), "w3": ("feed_forward.w3.weight", 0),
           "w2": ("feed_forward.w2.weight", 1)}
NORMS = {"attention_norm_w": "attention_norm.weight", "ffn_norm_w": "ffn_norm.weight"}


class TrainableShards(TensorParallelLlamaBlock):
    """The forward baseline's shards as trainable parameters, norms copied per rank."""

    def __init__(self, block, rank: int, world: int) -> None:
        super().__init__(block, rank, world)
        for attr in SHARDED:
            getattr(self, attr).requires_grad_(True)
        for attr, name in NORMS.items():
            setattr(self, attr, nn.Parameter(dict(block.named_parameters())[name].detach().clone()))

    def trainable(self) -> list[nn.Parameter]:
        return [getattr(self, a) for a in (*SHARDED, *NORMS)]

    def params(self) -> dict[str, torch.Tensor]:
        def assemble(every: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
            out = {name: torch.cat([r[a] for r in every], dim=d)
                   for a, (name, d) in SHARDED.items()}
            out.update({name: every[0][a] for a, name in NORMS.items()})
            return out
        return gathered_params({a: getattr(self, a) for a in (*SHARDED, *NORMS)}, assemble)


def build_tp(block, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
             hyper: Hyper) -> TrainRankStep:
    tp = TrainableShards(block, rank, world)
    opt = make_optimizer(tp.trainable(), hyper)

    def forward(x_: torch.Tensor) -> torch.Tensor:
        a = tp.attention(copy_to_group(rms_norm(x_, tp.attention_norm_w, tp.eps)))
        h = x_ + reduce_from_group(a)
        f = tp.feed_forward(copy_to_group(rms_norm(h, tp.ffn_norm_w, tp.eps)))
        return h + reduce_from_group(f)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = local_mse(forward(x), y, y.numel())  # whole on every rank
        loss.backward()
        opt.step()
        return loss.detach()

    return TrainRankStep(step, tp.params,
                         "column-parallel wq/wk/wv/w1/w3, row-parallel wo/w2; all_reduce x2 "
                         "forward, x2 backward; x replicated", loss_split=False)


def build_tp_sp(block, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
                hyper: Hyper) -> TrainRankStep:
    tp = TrainableShards(block, rank, world)
    opt = make_optimizer(tp.trainable(), hyper)
    n = require_even(x.shape[1], world, "sequence", "megatron-tp-sp")
    x_local = x[:, rank * n:(rank + 1) * n].contiguous()
    y_local = y[:, rank * n:(rank + 1) * n].contiguous()
    norms = [tp.attention_norm_w, tp.ffn_norm_w]

    def forward(x_: torch.Tensor) -> torch.Tensor:
        a = tp.attention(gather_seq(rms_norm(x_, tp.attention_norm_w, tp.eps), world))
        h = x_ + scatter_seq(a, world)
        f = tp.feed_forward(gather_seq(rms_norm(h, tp.ffn_norm_w, tp.eps), world))
        return h + scatter_seq(f, world)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = local_mse(forward(x_local), y_local, y.numel())
        loss.backward()
        bucket = torch.cat([p.grad for p in norms])
        dist.all_reduce(bucket)  # the norms' gradients are partial over the sequence
        for p, g in zip(norms, torch.split(bucket, [p.numel() for p in norms])):
            p.grad.copy_(g)
        opt.step()
        return loss.detach()

    return TrainRankStep(step, tp.params,
                         "TP weights; norms/residual split by sequence; all_gather + "
                         "reduce_scatter x2 each way, norm gradients all_reduced")
