"""One dtype policy for every backend: what a caller's tensors become before any kernel runs.

A graph states each input's dtype (the traced or built one). A tensor given in another dtype is
cast to it when the cast loses nothing, i.e. when every value survives the round trip
x -> graph dtype -> x's dtype exactly (float16 into a float32 graph; integer token ids given as
int32, or as floats holding whole numbers, into an int64 input); otherwise it is refused with a
`DTypeError` naming the input, before any rank starts: a float64 weight in a float32 graph
would be rounded silently on one backend and fail inside a rank on another.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..errors import DTypeError
from .ir import Graph
from .reference import TORCH_DTYPES


def lossless(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every value of `t` survives t -> dtype -> t.dtype (NaN stays NaN; infinities and
    signed zeros compare as themselves)."""
    if t.dtype == dtype:
        return True
    if t.is_floating_point() and not dtype.is_floating_point:
        if not bool(torch.isfinite(t).all()):
            return False  # NaN and infinities have no integer value
    back = t.to(dtype).to(t.dtype)
    same = back == t
    if t.is_floating_point():
        same |= torch.isnan(back) & torch.isnan(t)
    return bool(same.all())


def conform_inputs(graph: Graph, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The graph's inputs from `inputs`, each in the graph's dtype (module docstring). Shapes
    and presence are checked by `reference.check_inputs`; extra entries are passed through."""
    out = dict(inputs)
    for info in graph.inputs:
        t = inputs.get(info.name)
        if not isinstance(t, torch.Tensor):
            continue
        want = TORCH_DTYPES[info.dtype]
        if t.dtype == want:
            continue
        if not lossless(t, want):
            what = "weight" if info.kind == "weight" else "input"
            raise DTypeError(
                f"{what} {info.name!r} is {str(t.dtype).removeprefix('torch.')} but the graph "
                f"takes {info.dtype}, and converting it changes its values",
                source=info.source,
                fix=f"pass it as {info.dtype} (tensor.to(torch.{info.dtype})) if the rounding is "
                    f"intended, or trace the module with {str(t.dtype).removeprefix('torch.')} "
                    "tensors")
        out[info.name] = t.to(want)
    return out
