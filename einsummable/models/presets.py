"""Named model configurations and `preset()`, which builds a module plus example inputs.

Widths (`width=`)
-----------------
`width=w` shrinks (or grows) a preset while keeping its structure:
- head_dim is kept (rotary tables, attention scale and per-head work stay as in the real model);
- KV heads: n_kv' = max(1, round(n_kv * w)); query heads: n_heads' = n_kv' * (n_heads / n_kv),
  so the GQA ratio is exact (llama3-8b keeps 4 query heads per KV head). For plain multi-head
  models this is n_heads' = max(1, round(n_heads * w));
- dim' = n_heads' * head_dim;
- ffn' = max(1, round(ffn * n_heads' / n_heads)): the FFN scales by the realised head ratio, so
  ffn/dim is kept (GPT-2 stays at 4x, LLaMA at ~2.7x);
- norm eps, rope theta and max_seq are unchanged. Rounding is half-up.
Example: llama-65b at width=0.0625 is dim 512 (4 heads of 128), FFN 1376.

Sequence length: when `seq` exceeds a preset's max_seq, the rotary tables are built for `seq`
(max_seq is raised to seq); nothing else in these blocks depends on it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Union

import torch
from torch import nn

from einsummable.errors import ShapeError, UnknownFunctionError
from einsummable.models.gpt2 import GPT2Block, GPT2Config
from einsummable.models.init import init_weights
from einsummable.models.llama import LlamaBlock, LlamaConfig, LlamaStack
from einsummable.models.mistral import MistralBlock, MistralConfig

ModelConfig = Union[LlamaConfig, GPT2Config, MistralConfig]

# LLaMA-1 sizes (head dim 128; n_kv = n_heads; FFN from Meta's 2/3*4*dim rounded to 256;
# norm_eps 1e-6 as in the released params.json).
PRESETS: dict[str, ModelConfig] = {
    "llama-7b": LlamaConfig(dim=4096, n_heads=32, n_kv_heads=32, head_dim=128, ffn_dim=11008,
                            norm_eps=1e-6, max_seq=2048),
    "llama-13b": LlamaConfig(dim=5120, n_heads=40, n_kv_heads=40, head_dim=128, ffn_dim=13824,
                             norm_eps=1e-6, max_seq=2048),
    "llama-30b": LlamaConfig(dim=6656, n_heads=52, n_kv_heads=52, head_dim=128, ffn_dim=17920,
                             norm_eps=1e-6, max_seq=2048),
    "llama-65b": LlamaConfig(dim=8192, n_heads=64, n_kv_heads=64, head_dim=128, ffn_dim=22016,
                             norm_eps=1e-6, max_seq=2048),
    # LLaMA-3 8B: GQA 32 query / 8 KV heads, FFN 14336 (multiplier 1.3, rounded to 1024).
    "llama3-8b": LlamaConfig(dim=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                             norm_eps=1e-5, rope_theta=500000.0, max_seq=8192),
    # LLaMA-2 70B: GQA 64 query / 8 KV heads, FFN 28672 (multiplier 1.3, rounded to 4096),
    # 80 layers in the released model (a block here; `n_layers=` stacks them).
    "llama2-70b": LlamaConfig(dim=8192, n_heads=64, n_kv_heads=8, head_dim=128, ffn_dim=28672,
                              norm_eps=1e-5, max_seq=4096),
    # Small enough for unit tests at full width: plain MHA, 4 heads of 16, FFN 172 (Meta's rule
    # with multiple_of=4).
    "llama-tiny": LlamaConfig(dim=64, n_heads=4, n_kv_heads=4, head_dim=16, ffn_dim=172,
                              norm_eps=1e-5, max_seq=256),
    "gpt2-small": GPT2Config(dim=768, n_heads=12, ffn_dim=3072, norm_eps=1e-5),
    "gpt2-tiny": GPT2Config(dim=64, n_heads=4, ffn_dim=256, norm_eps=1e-5),
    # Mistral 7B v0.1 (sliding window not modelled; see mistral.py).
    "mistral-7b": MistralConfig(dim=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                                norm_eps=1e-5, rope_theta=10000.0, max_seq=8192),
    # GQA ratio 2 so the repeat_interleave path is exercised.
    "mistral-tiny": MistralConfig(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176,
                                  norm_eps=1e-5, rope_theta=10000.0, max_seq=256),
}


def list_presets() -> list[str]:
    return list(PRESETS)


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def scale_config(config: ModelConfig, width: float) -> ModelConfig:
    """The structure-preserving width scaling described in the module docstring."""
    if not (width > 0 and math.isfinite(width)):
        raise ShapeError(f"width must be a positive number, got {width!r}", op="preset",
                         fix="pass e.g. width=0.0625 for a 1/16-wide model")
    if isinstance(config, GPT2Config):
        heads = max(1, _round_half_up(config.n_heads * width))
        ffn = max(1, _round_half_up(config.ffn_dim * heads / config.n_heads))
        return dataclasses.replace(config, dim=heads * config.head_dim, n_heads=heads, ffn_dim=ffn)
    n_kv = max(1, _round_half_up(config.n_kv_heads * width))
    heads = n_kv * config.n_rep
    ffn = max(1, _round_half_up(config.ffn_dim * heads / config.n_heads))
    return dataclasses.replace(config, dim=heads * config.head_dim, n_heads=heads,
                               n_kv_heads=n_kv, ffn_dim=ffn)


def preset_config(name: str, width: float | None = None) -> ModelConfig:
    """The configuration of preset `name`, scaled by `width` when given."""
    if name not in PRESETS:
        raise UnknownFunctionError(f"unknown model preset '{name}'", op="preset",
                                   fix=f"use one of: {', '.join(PRESETS)}")
    config = PRESETS[name]
    return config if width is None else scale_config(config, width)


def build(config: ModelConfig, n_layers: int = 1, seed: int = 0) -> nn.Module:
    """The module for `config` on the current default device (n_layers blocks in sequence)."""
    if n_layers < 1:
        raise ShapeError(f"n_layers must be >= 1, got {n_layers}", op="preset")
    if isinstance(config, LlamaConfig):
        return LlamaBlock(config, seed=seed) if n_layers == 1 else LlamaStack(config, n_layers, seed=seed)
    block = {GPT2Config: GPT2Block, MistralConfig: MistralBlock}[type(config)]
    if n_layers == 1:
        return block(config, seed=seed)
    return init_weights(nn.Sequential(*(block(config, seed=None) for _ in range(n_layers))), seed)


def preset(name: str, batch: int = 1, seq: int = 128, device: torch.device | str = "cpu",
           dtype: torch.dtype = torch.float32, width: float | None = None, seed: int = 0,
           n_layers: int = 1) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """Build preset `name` and an input x of shape (batch, seq, dim); returns (module, (x,)).

    device="meta" allocates nothing (parameters, rotary buffers and x are all meta). Weights and
    x are deterministic in `seed` and identical across devices (drawn on the CPU).
    """
    config = preset_config(name, width)
    if hasattr(config, "max_seq") and seq > config.max_seq:
        config = dataclasses.replace(config, max_seq=seq)
    device = torch.device(device)
    with torch.device(device):
        module = build(config, n_layers=n_layers, seed=seed)
    if dtype != torch.float32:
        module = module.to(dtype)
    module.eval()
    if device.type == "meta":
        x = torch.empty(batch, seq, config.dim, device=device, dtype=dtype)
    else:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed + 7919)  # a different stream from the weights of the same seed
        x = torch.randn(batch, seq, config.dim, generator=gen, device="cpu").to(device=device, dtype=dtype)
    return module, (x,)
