"""What every hand-written baseline shares: the per-rank step, even shards, the block's kernels.

The baselines are the code a user would write by hand around torch.distributed collectives;
they are allowed collectives (einsummable itself never calls one). Each baseline module exposes
`build(block, x, rank, world, **options) -> RankStep`: it slices the rank's shards out of the
same `LlamaBlock` and the rank's part of the input out of the same x.

Kernel parity: every baseline runs attention and RMSNorm with the torch calls einsummable's
fused kernels make (`causal_attention`, `rms_norm`, `block_forward` below), so a table's
differences are the plans', not the kernels'. The module itself spells attention out (scores,
mask, float softmax); the harness checks every baseline's output against it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from einsummable.models.llama import apply_rotary


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


def causal_attention(xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor,
                     n_rep: int) -> torch.Tensor:
    """(b, s, h, e) queries against (b, s, h_kv, e) keys/values, causal, from position 0.

    The call einsummable's attention kernel makes (`frontend/kernels.py`, `_attention_sdpa`):
    torch's scaled_dot_product_attention with its causal flag, scale 1/sqrt(e), and grouped
    KV heads shared in place (query head h reads KV head h // n_rep, as `repeat_kv` does)."""
    q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                         scale=1.0 / math.sqrt(xq.shape[-1]),
                                         enable_gqa=n_rep > 1)
    return out.transpose(1, 2)  # (b, s, h, e)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension with the torch calls of einsummable's fused kernel
    (`frontend/kernels.py`, `_rms_norm`): in float32, cast back, then scaled."""
    var = x.float().pow(2).mean(dim=-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def block_forward(block, x: torch.Tensor,
                  weights: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The LLaMA block's forward at kernel parity with einsummable: the module's math with
    einsummable's attention and RMSNorm calls (above). weights: the block's parameters by
    name (default: its own), e.g. gathered from shards."""
    w = dict(block.named_parameters()) if weights is None else weights
    c = block.config
    b, s, _ = x.shape
    h = rms_norm(x, w["attention_norm.weight"], c.norm_eps)
    xq = F.linear(h, w["attention.wq.weight"]).view(b, s, c.n_heads, c.head_dim)
    xk = F.linear(h, w["attention.wk.weight"]).view(b, s, c.n_kv_heads, c.head_dim)
    xv = F.linear(h, w["attention.wv.weight"]).view(b, s, c.n_kv_heads, c.head_dim)
    xq, xk = rotate(xq, xk, *rotary_tables(block, 0, s, x.dtype))
    out = causal_attention(xq, xk, xv, c.n_rep).reshape(b, s, -1)
    h = x + F.linear(out, w["attention.wo.weight"])
    f = rms_norm(h, w["ffn_norm.weight"], c.norm_eps)
    gate = F.silu(F.linear(f, w["feed_forward.w1.weight"])) * F.linear(f, w["feed_forward.w3.weight"])
    return h + F.linear(gate, w["feed_forward.w2.weight"])


def rotary_tables(block, start: int, stop: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The block's cos/sin rows for positions [start, stop), shaped for (b, s, h, e)."""
    att = block.attention
    cos = att.cos[start:stop].to(dtype)[None, :, None, :]
    sin = att.sin[start:stop].to(dtype)[None, :, None, :]
    return cos, sin


def rotate(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return apply_rotary(xq, xk, cos, sin)
