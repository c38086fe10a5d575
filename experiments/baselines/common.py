"""What every hand-written baseline shares: the per-rank step, even shards, attention math.

The baselines are the code a user would write by hand around torch.distributed collectives;
they are allowed collectives (einsummable itself never calls one). Each baseline module exposes
`build(block, x, rank, world, **options) -> RankStep`: it slices the rank's shards out of the
same `LlamaBlock` and the rank's part of the input out of the same x.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from einsummable.models.llama import apply_rotary, repeat_kv


@dataclass(frozen=True)
class RankStep:
    """One rank's part of a system.

    run: one forward pass from the rank's resident input, returning its local output (in the
        same layout as its input, so blocks could be stacked: the steady state).
    gather: assembles the full output from every rank's local output (checks only; collective).
    note: how the system lays things out, for the results table.
    """

    run: Callable[[], torch.Tensor | None]
    gather: Callable[[torch.Tensor | None], torch.Tensor]
    note: str = ""


def bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of rank's part when n items split into `world` parts differing by at most one."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def require_even(n: int, world: int, what: str, system: str) -> int:
    if n % world:
        raise ValueError(f"{system}: {what}={n} does not split evenly over {world} ranks")
    return n // world


def gather_dim(local: torch.Tensor, dim: int, world: int) -> torch.Tensor:
    """all_gather equal shards and concatenate them along `dim`."""
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts, dim=dim)


def causal_attention(xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, n_rep: int,
                     q_offset: int = 0) -> torch.Tensor:
    """(b, s_q, h, e) queries against (b, s_k, h_kv, e) keys/values, causal, as the module does.

    q_offset is the global position of the first query (sequence-sharded queries see every key
    up to their own position). Scores in float32 and softmax as in `llama.Attention`.
    """
    head_dim = xq.shape[-1]
    keys = repeat_kv(xk, n_rep).transpose(1, 2)
    values = repeat_kv(xv, n_rep).transpose(1, 2)
    q = xq.transpose(1, 2)
    scores = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(head_dim)
    s_q, s_k = q.shape[2], keys.shape[2]
    mask = torch.full((s_q, s_k), float("-inf"), device=q.device).triu(1 + q_offset)
    probs = F.softmax(scores.float() + mask, dim=-1).type_as(q)
    return torch.matmul(probs, values).transpose(1, 2)  # (b, s_q, h, e)


def rotary_tables(block, start: int, stop: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The block's cos/sin rows for positions [start, stop), shaped for (b, s, h, e)."""
    att = block.attention
    cos = att.cos[start:stop].to(dtype)[None, :, None, :]
    sin = att.sin[start:stop].to(dtype)[None, :, None, :]
    return cos, sin


def rotate(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return apply_rotary(xq, xk, cos, sin)
