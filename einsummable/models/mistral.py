"""Mistral / LLaMA-3 style block, in the spelling of the Hugging Face family of implementations.

Differs from `llama.py` only in how the same mathematics is written, which is the point: capture
must handle both spellings.
- GQA by torch.repeat_interleave on the head axis (query head h reads KV head h // n_rep, the
  same mapping as llama.repeat_kv).
- Rotary applied after the head transpose, with cos/sin tables sliced by position (cos[:seq]).
- Attention through scaled_dot_product_attention(is_causal=True).
- RMSNorm upcasts to float32, normalises, casts back and then scales.
- Sliding-window attention (Mistral 7B v0.1, window 4096) is not modelled: the block is plain
  causal, which is the same whenever seq <= window.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from einsummable.errors import ShapeError
from einsummable.models.init import init_weights


@dataclass(frozen=True)
class MistralConfig:
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    head_dim: int | None = None  # None: dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq: int = 4096

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ShapeError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}",
                             op="MistralConfig", fix="choose n_kv_heads dividing n_heads")
        if self.head_dim % 2:
            raise ShapeError(f"head_dim={self.head_dim} is odd; rotary embeddings rotate pairs",
                             op="MistralConfig", fix="use an even head_dim")

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads


class MistralRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """Holds cos/sin tables (max_seq, head_dim); rows are positions."""

    def __init__(self, head_dim: int, max_seq: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_seq = max_seq
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        positions = torch.arange(max_seq, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_cached[:seq_len].to(x.dtype), self.sin_cached[:seq_len].to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MistralAttention(nn.Module):
    def __init__(self, config: MistralConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.n_rep = config.n_rep
        self.head_dim = config.head_dim
        self.max_seq = config.max_seq
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_seq, base=config.rope_theta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, q_len, _ = x.shape
        if q_len > self.max_seq:
            raise ShapeError(f"sequence length {q_len} exceeds max_seq={self.max_seq}",
                             op="mistral.MistralAttention",
                             fix="build the model with a MistralConfig whose max_seq >= seq")
        q = self.q_proj(x).view(bsz, q_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, q_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, q_len, self.n_kv_heads, self.head_dim).transpose(1, 2)

        cos, sin = self.rotary_emb(v, seq_len=q_len)  # (seq, hd) broadcasts over (b, h, seq, hd)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin

        k = torch.repeat_interleave(k, self.n_rep, dim=1)
        v = torch.repeat_interleave(v, self.n_rep, dim=1)

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, q_len, self.n_heads * self.head_dim)
        return self.o_proj(out)


class MistralMLP(nn.Module):
    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MistralBlock(nn.Module):
    """One pre-norm decoder layer. `seed=None` keeps PyTorch's default (global-RNG) init."""

    def __init__(self, config: MistralConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.input_layernorm = MistralRMSNorm(config.dim, eps=config.norm_eps)
        self.self_attn = MistralAttention(config)
        self.post_attention_layernorm = MistralRMSNorm(config.dim, eps=config.norm_eps)
        self.mlp = MistralMLP(config.dim, config.ffn_dim)
        if seed is not None:
            init_weights(self, seed)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states
