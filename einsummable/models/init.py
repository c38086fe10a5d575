"""Deterministic weight init shared by the model zoo.

Weights are drawn on the CPU from one seeded generator and copied to each parameter's device,
so the same seed gives the same numbers on CPU and GPU. Parameters on the meta device are left
alone (there is nothing to fill), which keeps meta builds free.

Scales keep activations O(1) in float32, so comparisons at 1e-5 mean something:
- matrices (Linear weights): normal, std 1/sqrt(fan_in)
- biases: normal, std 0.1 (non-zero so tests exercise them)
- norm weights: 1 + 0.1 * normal (not all ones, so a dropped scale is caught)
- norm biases: normal, std 0.1
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or "Norm" in type(module).__name__


@torch.no_grad()
def init_weights(module: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter of `module` deterministically from `seed`; returns `module`."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    for _, sub in module.named_modules():
        for pname, p in sub.named_parameters(recurse=False):
            if p.is_meta:
                continue
            noise = torch.randn(p.shape, generator=gen, device="cpu", dtype=torch.float32)
            if p.ndim >= 2:
                value = noise / math.sqrt(p.shape[1])
            elif _is_norm(sub) and pname == "weight":
                value = 1.0 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value)
    return module
