"""`pytorch-tp-sp`: Megatron tensor parallelism with sequence parallelism (Korthikanti et al.).

The same column/row-parallel weights as `pytorch_tp`, but the residual stream and the RMSNorms
are split by sequence: before each column-parallel sub-layer an `all_gather` rebuilds the full
sequence, and each row-parallel output is combined by a `reduce_scatter` that leaves every
rank its own sequence shard (the all-reduce's two halves, with the norm in between). As in
Megatron the collectives work on a sequence-first (s, b, d) buffer, so shards are contiguous.
x enters and leaves split by sequence (rank r holds positions [r·s/N, (r+1)·s/N)).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .common import RankStep, gather_dim, require_even, rms_norm
from .pytorch_tp import TensorParallelLlamaBlock


class SequenceParallelLlamaBlock(TensorParallelLlamaBlock):
    def __init__(self, block, rank: int, world: int, seq: int, group=None) -> None:
        super().__init__(block, rank, world, group)
        self.world = world
        self.local_seq = require_even(seq, world, "sequence", "pytorch-tp-sp")

    def _all_gather_seq(self, h: torch.Tensor) -> torch.Tensor:
        """(b, s/N, d) -> (b, s, d) through a sequence-first buffer."""
        local = h.transpose(0, 1).contiguous()
        full = local.new_empty((local.shape[0] * self.world, *local.shape[1:]))
        dist.all_gather_single(full, local, group=self.group)
        return full.transpose(0, 1)

    def _reduce_scatter_seq(self, partial: torch.Tensor) -> torch.Tensor:
        """(b, s, d) partial sums -> this rank's (b, s/N, d) of their sum."""
        full = partial.transpose(0, 1).contiguous()
        local = full.new_empty((full.shape[0] // self.world, *full.shape[1:]))
        dist.reduce_scatter_single(local, full, group=self.group)
        return local.transpose(0, 1)

    @torch.no_grad()
    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        a = self.attention(self._all_gather_seq(rms_norm(x_local, self.attention_norm_w,
                                                          self.eps)))
        h = x_local + self._reduce_scatter_seq(a)
        f = self.feed_forward(self._all_gather_seq(rms_norm(h, self.ffn_norm_w, self.eps)))
        return h + self._reduce_scatter_seq(f)


def build(block, x: torch.Tensor, rank: int, world: int, **_: object) -> RankStep:
    sp = SequenceParallelLlamaBlock(block, rank, world, x.shape[1])
    n = sp.local_seq
    x_local = x[:, rank * n:(rank + 1) * n].contiguous()
    return RankStep(lambda: sp(x_local), lambda local: gather_dim(local.contiguous(), 1, world),
                    "TP weights; norms/residual split by sequence, all_gather + reduce_scatter")
