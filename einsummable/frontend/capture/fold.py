"""Constant folding: values that depend on no graph input.

Small ones are computed on the CPU by running the ATen op itself (meta-device factories are
re-targeted to the CPU). Big ones cannot be computed, so a few patterns are kept symbolic: a
fill (`full`, `ones`, `zeros`), the causal mask `full(-inf).triu(1)`, and the boolean
lower/upper triangles `ones(bool).tril()` / `.triu(1)`; views and prefix slices keep the pattern.
Masks built from positions (aranges compared, sliding windows, transformers' index
comparisons) are kept as their diagonals at any size (`masks.py`). A folded value that reaches
a real op becomes a graph constant: the compact `causal_mask` constant when it is one
(whatever its size), a scalar broadcast for a fill, the "diagonal" constant for a mask along
q - k, else a literal.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ...errors import UnsupportedOpError
from ..ir import Constant
from . import masks
from .values import Folded

COMPUTE_LIMIT = 1 << 22  # elements a folded value may have to be computed
LITERAL_LIMIT = 1 << 16  # elements a literal constant may embed in the graph

_aten = torch.ops.aten
FACTORIES = {
    _aten.full.default: lambda a, k: (a[0], a[1]),
    _aten.ones.default: lambda a, k: (a[0], 1),
    _aten.zeros.default: lambda a, k: (a[0], 0),
    _aten.empty.memory_format: lambda a, k: (a[0], 0),
    _aten.empty_permuted.default: lambda a, k: (a[0], 0),  # backward passes' scratch
    _aten.scalar_tensor.default: lambda a, k: ((), a[0]),
}
LIKE = {  # (tensor, ...) -> fill of the tensor's shape; the tensor may be a real input
    _aten.full_like.default: lambda a: a[1],
    _aten.ones_like.default: lambda a: 1,
    _aten.zeros_like.default: lambda a: 0,
    _aten.empty_like.default: lambda a: 0,
}
NEW = {
    _aten.new_full.default: lambda a: (a[1], a[2]),
    _aten.new_ones.default: lambda a: (a[1], 1),
    _aten.new_zeros.default: lambda a: (a[1], 0),
    _aten.new_empty.default: lambda a: (a[1], 0),
}
VIEWS = {_aten.unsqueeze.default, _aten.expand.default, _aten.view.default,
         _aten.reshape.default, _aten._unsafe_view.default, _aten.clone.default,
         _aten.alias.default, _aten.contiguous.default, _aten._to_copy.default,
         _aten.to.dtype, _aten.to.device, _aten.to.dtype_layout, _aten.detach.default,
         _aten.lift_fresh_copy.default}
TRIANGLES = {"causal", "keep", "drop"}

IR_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.float64: "float64", torch.int64: "int64", torch.int32: "int64"}


def ir_dtype(dt: torch.dtype) -> str:
    return IR_DTYPES.get(dt, "float32")


def real(t: torch.Tensor) -> Folded:
    return Folded("real", tuple(t.shape), t.dtype, t.detach().cpu())


def _tensor(f: Folded) -> torch.Tensor:
    if f.kind == "real":
        return f.tensor
    if f.numel > COMPUTE_LIMIT:
        raise OverflowError
    if f.kind == "fill":
        return torch.full(f.shape, f.fill, dtype=f.dtype)
    if f.kind in ("diag", "affine"):
        return masks.full(f)
    q, k = f.shape[-2], f.shape[-1]
    tri = torch.ones(q, k, dtype=torch.bool).tril()
    if f.kind == "causal":
        t = torch.zeros(q, k, dtype=f.dtype).masked_fill(~tri, float("-inf"))
    else:
        t = tri if f.kind == "keep" else ~tri
    return t.expand(f.shape).clone()


def _cpu(x: Any) -> Any:
    if isinstance(x, Folded):
        return _tensor(x)
    if isinstance(x, torch.device):
        return torch.device("cpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(y) for y in x)
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    return x


def _symbolic(target: Any, args: Sequence[Any], kwargs: dict, shape: tuple[int, ...],
              dtype: torch.dtype) -> Folded | None:
    if target in FACTORIES:
        _, v = FACTORIES[target](args, kwargs)
        return Folded("fill", shape, dtype, fill=v)
    if target in LIKE:
        return Folded("fill", shape, dtype, fill=LIKE[target](args))
    if target in NEW:
        return Folded("fill", shape, dtype, fill=NEW[target](args)[1])
    x = args[0] if args else None
    if not isinstance(x, Folded):
        return None
    if target in (_aten.triu.default, _aten.tril.default) and x.kind == "fill" and len(shape) >= 2:
        diag = args[1] if len(args) > 1 else kwargs.get("diagonal", 0)
        upper = target is _aten.triu.default
        if upper and diag == 1 and x.fill == float("-inf"):
            return Folded("causal", shape, dtype)
        if x.fill is True or x.fill == 1 and x.dtype == torch.bool:
            if upper and diag == 1:
                return Folded("drop", shape, dtype)
            if not upper and diag == 0:
                return Folded("keep", shape, dtype)
        return None
    if target in (_aten.bitwise_not.default, _aten.logical_not.default) and x.kind in ("keep", "drop"):
        return Folded("drop" if x.kind == "keep" else "keep", shape, dtype)
    if target in VIEWS:
        if x.kind == "fill":
            return Folded("fill", shape, dtype, fill=x.fill)
        if x.kind in TRIANGLES and len(shape) >= 2 and shape[-2:] == x.shape[-2:]:
            return Folded(x.kind, shape, dtype)
        return None
    if target is _aten.slice.Tensor and x.kind in TRIANGLES | {"fill"}:
        dim = args[1] % len(x.shape) if len(args) > 1 else 0
        start = args[2] if len(args) > 2 else 0
        step = args[4] if len(args) > 4 else 1
        if x.kind == "fill" or ((start in (0, None)) and step == 1 and dim >= len(x.shape) - 2):
            return Folded(x.kind, shape, dtype, fill=x.fill)
    return None


def fold(target: Any, args: Sequence[Any], kwargs: dict, meta: Any) -> Any:
    """The folded value(s) of one node whose tensor inputs are all folded, or None when the
    op cannot be folded (random ops; too big and no symbolic pattern)."""
    if isinstance(meta, torch.Tensor):
        shape, dtype = tuple(meta.shape), meta.dtype
        big = math.prod(shape) > COMPUTE_LIMIT
        sym = any(isinstance(a, Folded) and a.kind != "real" for a in args)
        if big or sym or target in LIKE or target in NEW:
            s = _symbolic(target, args, kwargs, shape, dtype)
            if s is None and (big or sym):
                s = masks.structured(target, args, kwargs, shape, dtype)
            if s is not None:
                return s
            if big or target in LIKE or target in NEW:
                return None
    if torch.Tag.nondeterministic_seeded in getattr(target, "tags", ()):
        return None
    try:
        out = target(*_cpu(list(args)), **_cpu(dict(kwargs)))
    except OverflowError:
        return None
    if isinstance(out, torch.Tensor):
        return real(out)
    if isinstance(out, (tuple, list)):
        return tuple(real(o) if isinstance(o, torch.Tensor) else o for o in out)
    return out


def scalar_of(f: Folded) -> float | None:
    if f.kind == "fill":
        return float(f.fill)
    if f.kind == "real" and f.numel == 1:
        return float(f.tensor.reshape(()).item())
    return None


def is_causal(t: torch.Tensor) -> bool:
    if t.ndim < 2 or not t.is_floating_point():
        return False
    q, k = t.shape[-2:]
    tri = torch.ones(q, k, dtype=torch.bool).tril()
    ref = torch.zeros(q, k, dtype=t.dtype).masked_fill(~tri, float("-inf"))
    return bool(torch.equal(t, ref.expand(t.shape)))


def _diagonal(f: Folded) -> torch.Tensor | None:
    if f.kind == "diag":
        return f.tensor
    if f.kind == "real" and f.tensor.ndim >= 2 and min(f.shape[-2:]) > 1:
        return masks.toeplitz(f.tensor)
    return None


def as_constant(f: Folded, source: str | None
                ) -> tuple[Constant | torch.Tensor, tuple[int, ...], str, tuple[int, ...] | None]:
    """(constant or literal tensor, its stored shape, dtype, shape to broadcast it to)."""
    dtype = ir_dtype(f.dtype)
    if f.kind == "causal" or (f.kind == "real" and is_causal(f.tensor)):
        stored = tuple(f.shape[-2:])
        return Constant("causal_mask"), stored, dtype, (f.shape if f.shape != stored else None)
    if f.kind == "fill":
        return Constant("fill", (float(f.fill),)), f.shape, dtype, None
    vec = _diagonal(f)
    if vec is not None:  # a mask along q - k: runs of values, at any size
        stored = tuple(f.shape[-2:])
        return (masks.as_constant(vec, stored), stored,
                "float32" if f.dtype == torch.bool else dtype,
                f.shape if f.shape != stored else None)
    if f.kind in ("keep", "drop"):
        if f.numel > LITERAL_LIMIT:
            raise UnsupportedOpError(
                f"a boolean triangular mask of shape {f.shape} used as a number",
                source=source, fix="add it as an additive mask: scores + full(-inf).triu(1)")
        return _tensor(f).float(), f.shape, "float32", None
    t = f.tensor
    if t.numel() > LITERAL_LIMIT:
        raise UnsupportedOpError(f"a constant of {t.numel()} elements is too large to embed",
                                 source=source,
                                 fix="register it as a buffer so it becomes a graph input")
    if t.dtype == torch.bool:
        t = t.float()
    return t, tuple(t.shape), dtype if t.is_floating_point() or dtype == "int64" else "float32", None
