"""Plain multilayer perceptrons."""
from __future__ import annotations

import torch
from torch import nn

from einsummable.errors import ShapeError, UnknownFunctionError
from einsummable.models.init import init_weights

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


def _activation(act: str) -> nn.Module:
    if act not in _ACTIVATIONS:
        raise UnknownFunctionError(f"unknown activation '{act}'", op="MLP",
                                   fix=f"use one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[act]()


class MLP(nn.Sequential):
    """Linear layers dims[0] -> dims[1] -> ... -> dims[-1], activation between (not after last)."""

    def __init__(self, dims: list[int], act: str = "relu", bias: bool = True,
                 seed: int | None = 0) -> None:
        if len(dims) < 2:
            raise ShapeError(f"MLP needs at least two sizes, got dims={list(dims)}", op="MLP",
                             fix="pass [in, hidden..., out]")
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(d_in, d_out, bias=bias))
            if i < len(dims) - 2:
                layers.append(_activation(act))
        super().__init__(*layers)
        if seed is not None:
            init_weights(self, seed)


class TwoLayerMLP(nn.Module):
    """x -> w2(act(w1 x)), no biases: the layer Megatron splits column- then row-parallel."""

    def __init__(self, d: int, hidden: int, act: str = "gelu", seed: int | None = 0) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.act = _activation(act)
        self.w2 = nn.Linear(hidden, d, bias=False)
        if seed is not None:
            init_weights(self, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)))
