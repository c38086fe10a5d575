"""GPT-2 transformer block in the usual open-source spelling.

LayerNorm with bias, one fused qkv projection split into three, heads by view + transpose,
causal attention through scaled_dot_product_attention, tanh-GELU MLP, biases everywhere.
No dropout (inference); no positional embedding (that lives outside the block in GPT-2), so the
block has no maximum sequence length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from einsummable.errors import ShapeError
from einsummable.models.init import init_weights


@dataclass(frozen=True)
class GPT2Config:
    dim: int
    n_heads: int
    ffn_dim: int | None = None  # None: 4 * dim, as in GPT-2
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.ffn_dim is None:
            object.__setattr__(self, "ffn_dim", 4 * self.dim)
        if self.dim % self.n_heads:
            raise ShapeError(f"dim={self.dim} is not a multiple of n_heads={self.n_heads}",
                             op="GPT2Config", fix="choose n_heads dividing dim")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.dim = config.dim
        self.c_attn = nn.Linear(config.dim, 3 * config.dim)
        self.c_proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)  # (b, h, t, hd)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.dim, config.ffn_dim)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(config.ffn_dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPT2Block(nn.Module):
    """One pre-LN GPT-2 layer. `seed=None` keeps PyTorch's default (global-RNG) init."""

    def __init__(self, config: GPT2Config, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.ln_1 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.mlp = GPT2MLP(config)
        if seed is not None:
            init_weights(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x
