"""`pytorch-tp`: Megatron-LM / vLLM tensor parallelism for a LLaMA block, written by hand.

Layout (Shoeybi et al., Megatron-LM; vLLM's ColumnParallelLinear / RowParallelLinear):
- wq, wk, wv are column-parallel: rank r holds the rows of its query heads and of the KV heads
  they read, so attention runs on local heads with no communication;
- wo is row-parallel (the matching input columns); its partial sums are combined with one
  `dist.all_reduce` per sub-layer;
- w1 and w3 are column-parallel over the FFN width, w2 row-parallel, then one all-reduce;
- RMSNorm and the residual stream are replicated: x enters and leaves whole on every rank.
Heads split by KV heads (GQA groups stay together); uneven counts go one-larger-first.
Kernels: einsummable's attention (sdpa, causal) and RMSNorm calls (`common.py`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .common import RankStep, bounds, causal_attention, rms_norm, rotary_tables, rotate


class TensorParallelLlamaBlock(nn.Module):
    """Rank `rank`'s shard of a LlamaBlock; forward takes and returns the full x."""

    def __init__(self, block, rank: int, world: int, group=None) -> None:
        super().__init__()
        c = block.config
        if c.n_kv_heads < world:
            raise ValueError(f"pytorch-tp: {c.n_kv_heads} KV heads cannot be split over {world} ranks")
        self.block, self.group = block, group
        self.n_rep, self.head_dim = c.n_rep, c.head_dim
        kv_lo, kv_hi = bounds(c.n_kv_heads, world, rank)
        q_lo, q_hi = kv_lo * c.n_rep, kv_hi * c.n_rep
        f_lo, f_hi = bounds(c.ffn_dim, world, rank)
        e = c.head_dim
        att, ff = block.attention, block.feed_forward
        take = lambda w: nn.Parameter(w.detach().clone().contiguous(), requires_grad=False)
        self.wq = take(att.wq.weight[q_lo * e:q_hi * e])
        self.wk = take(att.wk.weight[kv_lo * e:kv_hi * e])
        self.wv = take(att.wv.weight[kv_lo * e:kv_hi * e])
        self.wo = take(att.wo.weight[:, q_lo * e:q_hi * e])
        self.w1 = take(ff.w1.weight[f_lo:f_hi])
        self.w3 = take(ff.w3.weight[f_lo:f_hi])
        self.w2 = take(ff.w2.weight[:, f_lo:f_hi])
        self.attention_norm_w, self.ffn_norm_w = block.attention_norm.weight, block.ffn_norm.weight
        self.eps = c.norm_eps
        self.cos, self.sin = att.cos, att.sin

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        """Local heads; returns this rank's partial sum of the wo projection."""
        b, s, _ = h.shape
        xq = F.linear(h, self.wq).view(b, s, -1, self.head_dim)
        xk = F.linear(h, self.wk).view(b, s, -1, self.head_dim)
        xv = F.linear(h, self.wv).view(b, s, -1, self.head_dim)
        cos, sin = rotary_tables(self.block, 0, s, h.dtype)
        xq, xk = rotate(xq, xk, cos, sin)
        out = causal_attention(xq, xk, xv, self.n_rep).reshape(b, s, -1)
        return F.linear(out, self.wo)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(h, self.w1)) * F.linear(h, self.w3), self.w2)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(rms_norm(x, self.attention_norm_w, self.eps))
        dist.all_reduce(a, group=self.group)
        h = x + a
        f = self.feed_forward(rms_norm(h, self.ffn_norm_w, self.eps))
        dist.all_reduce(f, group=self.group)
        return h + f


def build(block, x: torch.Tensor, rank: int, world: int, **_: object) -> RankStep:
    tp = TensorParallelLlamaBlock(block, rank, world)
    return RankStep(lambda: tp(x), lambda local: local,
                    "column-parallel wq/wk/wv/w1/w3, row-parallel wo/w2 + all_reduce; "
                    "x replicated")
