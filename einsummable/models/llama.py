"""LLaMA transformer block, written the way Meta's reference code writes it.

Deliberate choices (they decide which ATen ops capture will see):
- RMSNorm computes in float32 and casts back, as in Meta's reference.
- Rotary embeddings use precomputed cos/sin tables (buffers) and the "rotate half" layout
  (pairs are (i, i + head_dim/2)), not Meta's complex-number interleaved pairs. The two differ
  only by a fixed permutation of the rows of wq and wk, so the architecture is the same.
- GQA repeats K/V heads with expand + reshape (Meta's `repeat_kv`): query head h reads KV head
  h // n_rep.
- Attention is spelled out (matmul, explicit -inf causal mask, float softmax, matmul), not SDPA.
- Positions start at 0; there is no KV cache. The block takes x of shape (batch, seq, dim).

norm_eps defaults to 1e-5 (LLaMA-2 and LLaMA-3). LLaMA-1 used 1e-6; the llama-7b..65b presets
set 1e-6 explicitly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from einsummable.errors import ShapeError
from einsummable.models.init import init_weights


def llama_ffn_dim(dim: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """Meta's SwiGLU hidden size: 2/3 of 4*dim, times an optional multiplier, rounded up."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    n_heads: int
    n_kv_heads: int | None = None  # None: equal to n_heads (plain multi-head attention)
    head_dim: int | None = None  # None: dim // n_heads
    ffn_dim: int | None = None  # None: llama_ffn_dim(dim)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq: int = 2048

    def __post_init__(self) -> None:
        # Fill the derived defaults in place; the dataclass is frozen, hence object.__setattr__.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", llama_ffn_dim(self.dim))
        if self.n_heads % self.n_kv_heads:
            raise ShapeError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}",
                             op="LlamaConfig", fix="choose n_kv_heads dividing n_heads")
        if self.head_dim % 2:
            raise ShapeError(f"head_dim={self.head_dim} is odd; rotary embeddings rotate pairs",
                             op="LlamaConfig", fix="use an even head_dim")

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even for fp16/bf16 inputs, then cast back (Meta's reference).
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_rotary(head_dim: int, max_seq: int, theta: float = 10000.0,
                      device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq, head_dim) for the rotate-half layout.

    Built with ordinary factory calls, so under `with torch.device("meta")` they are meta too.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_seq, device=device, dtype=torch.float32)
    angles = torch.outer(t, inv_freq)  # (max_seq, head_dim/2)
    emb = torch.cat((angles, angles), dim=-1)  # same angle for i and i + head_dim/2
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    x1 = x[..., : d // 2]
    x2 = x[..., d // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k; cos and sin must broadcast against them (last dim head_dim)."""
    q_out = q * cos + rotate_half(q) * sin
    k_out = k * cos + rotate_half(k) * sin
    return q_out, k_out


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, s, n_kv, hd) -> (b, s, n_kv * n_rep, hd); each KV head serves n_rep query heads."""
    if n_rep == 1:
        return x
    b, s, n_kv, hd = x.shape
    return x[:, :, :, None, :].expand(b, s, n_kv, n_rep, hd).reshape(b, s, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.n_rep = config.n_rep
        self.head_dim = config.head_dim
        self.max_seq = config.max_seq
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        cos, sin = precompute_rotary(config.head_dim, config.max_seq, config.rope_theta)
        # Derived from the config, so not saved in state_dict, but real buffers: .to() moves them.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        if seq > self.max_seq:
            raise ShapeError(f"sequence length {seq} exceeds max_seq={self.max_seq}",
                             op="llama.Attention",
                             fix="build the model with a LlamaConfig whose max_seq >= seq")
        xq = self.wq(x).view(bsz, seq, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seq, self.n_kv_heads, self.head_dim)

        # Tables are (seq, hd); insert the head axis of the (b, s, h, hd) layout.
        cos = self.cos[:seq].to(x.dtype)[None, :, None, :]
        sin = self.sin[:seq].to(x.dtype)[None, :, None, :]
        xq, xk = apply_rotary(xq, xk, cos, sin)

        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)

        xq = xq.transpose(1, 2)  # (b, h, s, hd)
        keys = keys.transpose(1, 2)
        values = values.transpose(1, 2)

        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seq, seq), float("-inf"), device=x.device).triu(1)
        scores = scores.float() + mask
        probs = F.softmax(scores, dim=-1).type_as(xq)
        out = torch.matmul(probs, values)  # (b, h, s, hd)
        out = out.transpose(1, 2).contiguous().view(bsz, seq, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """One pre-norm LLaMA layer. `seed=None` keeps PyTorch's default (global-RNG) init."""

    def __init__(self, config: LlamaConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.attention_norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.ffn_dim)
        if seed is not None:
            init_weights(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaStack(nn.Module):
    """n_layers LlamaBlocks in sequence (no embedding, final norm or output head)."""

    def __init__(self, config: LlamaConfig, n_layers: int, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(LlamaBlock(config, seed=None) for _ in range(n_layers))
        if seed is not None:
            init_weights(self, seed)  # one pass, so layers get different weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
