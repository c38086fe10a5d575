"""`floor`: the time one rank takes for 1/N of the block's work, with nothing to communicate.

Every rank runs the whole block on its batch shard with its own full weights, concurrently, so
the measurement sees the same core sharing as the parallel systems. It runs the kernels every
baseline runs (einsummable's attention and RMSNorm calls, `common.block_forward`). No plan
that splits the work N ways can beat it by more than noise; it is a yardstick, not a system.
"""
from __future__ import annotations

import torch

from .common import RankStep, block_forward, gather_dim, require_even


def build(block, x: torch.Tensor, rank: int, world: int, **_: object) -> RankStep:
    n = require_even(x.shape[0], world, "batch", "floor")
    x_local = x[rank * n:(rank + 1) * n].contiguous()

    def run() -> torch.Tensor:
        with torch.no_grad():
            return block_forward(block, x_local)
    return RankStep(run, lambda local: gather_dim(local, 0, world),
                    "1/N of the tokens per rank, no communication (baseline kernels)")
