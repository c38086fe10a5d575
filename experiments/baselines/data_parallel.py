"""`data-parallel`: every rank runs the whole block on its batch shard.

weights="replicated": every rank keeps full weights (N copies; no communication at all in a
forward pass). weights="sharded" (weights stored once, as the configs ask): each rank keeps a
1/N slice of one flat buffer of all weights and all-gathers it before computing, as FSDP's
flat parameter does (one all_gather per block, one FSDP unit). A single block measured alone
has no earlier compute to prefetch its gather behind, so the gather is on the critical path
here; the simulated row models the steady state of a stack, where FSDP's forward prefetch
hides it (`simulated.py`). x enters and leaves split by batch. Kernels: einsummable's
attention and RMSNorm calls (`common.block_forward`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .common import RankStep, block_forward, gather_dim, require_even


class FlatWeights:
    """This rank's slice of the block's weights, flattened and padded to N equal slices."""

    def __init__(self, block, rank: int, world: int) -> None:
        named = [(n, p.detach()) for n, p in block.named_parameters()]
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        flat = torch.cat([p.reshape(-1) for _, p in named])
        per_rank = -(-flat.numel() // world)
        padded = torch.zeros(per_rank * world, dtype=flat.dtype)
        padded[:flat.numel()] = flat
        self.shard = padded[rank * per_rank:(rank + 1) * per_rank].clone()
        self.world = world

    def gather(self) -> dict[str, torch.Tensor]:
        full = self.shard.new_empty(self.shard.numel() * self.world)
        dist.all_gather_single(full, self.shard)
        views = torch.split(full[:sum(self.numels)], self.numels)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes)}


def build(block, x: torch.Tensor, rank: int, world: int, weights: str = "sharded",
          **_: object) -> RankStep:
    n = require_even(x.shape[0], world, "batch", "data-parallel")
    x_local = x[rank * n:(rank + 1) * n].contiguous()
    if weights == "replicated":
        def run() -> torch.Tensor:
            with torch.no_grad():
                return block_forward(block, x_local)
        note = "batch split, full weights on every rank (no communication)"
    else:
        flat = FlatWeights(block, rank, world)

        def run() -> torch.Tensor:
            with torch.no_grad():
                # Only the gathered weights are read; the block supplies its config and
                # rotary tables (buffers, not weights).
                return block_forward(block, x_local, flat.gather())
        note = ("batch split, weight shards all-gathered before use (FSDP flat parameter, "
                "one unit; nothing earlier to prefetch behind)")
    return RankStep(run, lambda local: gather_dim(local, 0, world), note)
