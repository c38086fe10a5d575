"""`pytorch`: the block on one device (rank 0), with einsummable's attention and RMSNorm calls
(`common.block_forward`); the other ranks idle."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .common import RankStep, block_forward


def build(block, x: torch.Tensor, rank: int, world: int, **_: object) -> RankStep:
    def run() -> torch.Tensor | None:
        if rank != 0:
            return None
        with torch.no_grad():
            return block_forward(block, x)

    def gather(local: torch.Tensor | None) -> torch.Tensor:
        out = local if rank == 0 else torch.empty_like(x)
        dist.broadcast(out, src=0)
        return out

    return RankStep(run, gather, "whole block on rank 0 (sdpa attention, fused-kernel RMSNorm)")
