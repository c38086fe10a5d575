"""Masks built in forward, recognised as structure at any size.

An attention mask over queries q and keys k that a model builds from positions (causal,
sliding window, their boolean and additive spellings, transformers' index comparisons)
depends on the diagonal d = q - k alone. Such a value is kept as its diagonal vector

    diag[d + K - 1] = value at any (q, k) with q - k = d,   d in [-(K - 1), Q - 1]

(kind "diag" of `values.Folded`, broadcast over leading dims): O(Q + K) numbers at any size,
and it reaches the graph as the compact "diagonal" constant (runs of equal values along d),
never as a literal of Q K elements.

Positions enter as affine index values a q + b k + c (kind "affine": an arange along the query
or key dim, or a difference of two). The rules, over the last two dims:
- sums, differences and scalar multiples of affine values are affine;
- a comparison of two affine values x, y is a comparison of x - y with 0, a function of d
  when x - y = a (q - k) + c;
- any other elementwise op whose operands are all functions of d (diagonal vectors, affine
  values with b = -a, scalars) is the same op on the diagonal vectors.
Anything else is left to the other folding rules.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from ..ir import Constant
from .values import Folded

_aten = torch.ops.aten
_COMPARE = {_aten.gt.Tensor: operator.gt, _aten.gt.Scalar: operator.gt,
            _aten.lt.Tensor: operator.lt, _aten.lt.Scalar: operator.lt,
            _aten.ge.Tensor: operator.ge, _aten.ge.Scalar: operator.ge,
            _aten.le.Tensor: operator.le, _aten.le.Scalar: operator.le,
            _aten.eq.Tensor: operator.eq, _aten.eq.Scalar: operator.eq,
            _aten.ne.Tensor: operator.ne, _aten.ne.Scalar: operator.ne}
_LINEAR = {_aten.add.Tensor: 1, _aten.add.Scalar: 1, _aten.sub.Tensor: -1, _aten.sub.Scalar: -1}
_SCALE = {_aten.mul.Tensor, _aten.mul.Scalar}
_CASTS = {_aten._to_copy.default, _aten.to.dtype, _aten.to.dtype_layout, _aten.to.device,
          _aten.clone.default, _aten.alias.default, _aten.detach.default,
          _aten.contiguous.default, _aten.lift_fresh_copy.default}
_SHAPES = {_aten.expand.default, _aten.unsqueeze.default, _aten.view.default,
           _aten.reshape.default, _aten._unsafe_view.default}
# elementwise, but not tagged pointwise
_BOOLEAN = {_aten.__and__.Tensor, _aten.__or__.Tensor, _aten.__xor__.Tensor,
            _aten.where.ScalarOther, _aten.where.ScalarSelf, _aten.where.Scalar,
            _aten.masked_fill.Tensor}
Affine = tuple[float, float, float]  # (a, b, c): a q + b k + c


def _qk(shape: Sequence[int]) -> tuple[int, int]:
    return (shape[-2] if len(shape) > 1 else 1), shape[-1]


def _lead_constant(t: torch.Tensor) -> torch.Tensor | None:
    """t's last two dims, when t does not vary over the dims before them."""
    if t.ndim < 2:
        return t.reshape((1,) * (2 - t.ndim) + tuple(t.shape))
    lead = t.reshape((-1,) + tuple(t.shape[-2:]))
    return lead[0] if torch.equal(lead, lead[:1].expand_as(lead)) else None


def _line(v: torch.Tensor) -> tuple[float, float] | None:
    """(slope, intercept) when v (1-D) is an arithmetic sequence."""
    if v.dtype == torch.bool or v.numel() == 0:
        return None
    v = v.double()
    if v.numel() == 1:
        return 0.0, float(v[0])
    slope = float(v[1] - v[0])
    ref = v[0] + slope * torch.arange(v.numel(), dtype=torch.float64)
    return (slope, float(v[0])) if torch.equal(ref, v) else None


def affine_of(x: Any, shape: Sequence[int]) -> Affine | None:
    """x as a q + b k + c over the last two dims of `shape`, or None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return 0.0, 0.0, float(x)
    if not isinstance(x, Folded) or x.dtype == torch.bool:
        return None
    if x.kind == "affine":
        return x.fill
    if x.kind == "fill":
        return 0.0, 0.0, float(x.fill)
    if x.kind != "real":
        return None
    t = _lead_constant(x.tensor)
    if t is None or (t.shape[0] > 1 and t.shape[1] > 1):
        return None
    if t.shape[0] > 1:
        line = _line(t[:, 0])
        return None if line is None else (line[0], 0.0, line[1])
    line = _line(t[0])
    return None if line is None else (0.0, line[0], line[1])


def diagonal_of(x: Any, shape: Sequence[int]) -> torch.Tensor | float | None:
    """x as its diagonal vector over the last two dims of `shape` (a scalar as itself)."""
    if isinstance(x, (int, float, bool)):
        return x
    if not isinstance(x, Folded):
        return None
    q, k = _qk(shape)
    d = torch.arange(-(k - 1), q)
    if x.kind == "diag":
        return x.tensor if _qk(x.shape) == (q, k) else None
    if x.kind in ("causal", "keep", "drop"):
        if _qk(x.shape) != (q, k):
            return None
        keep = d >= 0
        if x.kind == "causal":
            return torch.zeros(d.shape, dtype=x.dtype).masked_fill(~keep, float("-inf"))
        return keep if x.kind == "keep" else ~keep
    if x.kind == "fill":
        return x.fill
    aff = affine_of(x, shape)
    if aff is not None and aff[0] == -aff[1]:
        return (aff[0] * d + aff[2]) if aff[0] else aff[2]
    if x.kind == "real" and _qk(x.shape) == (q, k):
        return toeplitz(x.tensor)
    return None


def toeplitz(t: torch.Tensor) -> torch.Tensor | None:
    """The diagonal vector of t over its last two dims, when t is constant along every
    diagonal there and over its leading dims."""
    m = _lead_constant(t)
    if m is None or not torch.equal(m[1:, 1:], m[:-1, :-1]):
        return None
    return torch.cat((m[0].flip(0), m[1:, 0]))


def structured(target: Any, args: Sequence[Any], kwargs: dict, shape: tuple[int, ...],
               dtype: torch.dtype) -> Folded | None:
    """The value of an elementwise op over positions and masks by the rules above, or None."""
    x = args[0] if args else None
    if target is _aten.slice.Tensor and isinstance(x, Folded) and x.kind == "diag":
        return _prefix(x, args, shape, dtype)
    if target in _SHAPES or target in _CASTS:
        if isinstance(x, Folded) and x.kind in ("diag", "affine") and len(shape) >= 2 \
                and _qk(shape) == _qk(x.shape):
            vec = x.tensor.to(dtype) if x.kind == "diag" else None
            return Folded(x.kind, shape, dtype, vec, x.fill)
        return None
    if len(shape) < 2 or not any(isinstance(a, Folded) for a in args):
        return None
    if target in _COMPARE or target in _LINEAR or target in _SCALE:
        x, y = (affine_of(a, shape) for a in args[:2])
        if x is not None and y is not None:
            if target in _COMPARE:
                a, b, c = (u - v for u, v in zip(x, y))
                if a == -b:
                    d = torch.arange(-(shape[-1] - 1), shape[-2], dtype=torch.float64)
                    return Folded("diag", shape, dtype, _COMPARE[target](a * d + c, 0.0))
                return None
            if target in _LINEAR:
                alpha = float(kwargs.get("alpha", args[2] if len(args) > 2 else 1))
                s = _LINEAR[target] * alpha
                return Folded("affine", shape, dtype, fill=tuple(u + s * v for u, v in zip(x, y)))
            if x[:2] == (0.0, 0.0) or y[:2] == (0.0, 0.0):
                scale, other = (x[2], y) if x[:2] == (0.0, 0.0) else (y[2], x)
                return Folded("affine", shape, dtype, fill=tuple(scale * u for u in other))
    if torch.Tag.pointwise not in getattr(target, "tags", ()) and target not in _BOOLEAN:
        return None
    vecs = [_operand(a, shape) for a in args]
    if any(v is None for v in vecs) or not any(isinstance(v, torch.Tensor) for v in vecs):
        return None
    try:
        out = target(*vecs, **kwargs)
    except (RuntimeError, TypeError):
        return None
    if not isinstance(out, torch.Tensor) or out.ndim != 1:
        return None
    return Folded("diag", shape, dtype, out.to(dtype))


def _operand(a: Any, shape: Sequence[int]) -> Any:
    """An argument of the op on diagonal vectors: a folded scalar as a 0-d tensor of its dtype
    (the Tensor overloads take no Python numbers)."""
    if not isinstance(a, Folded):
        return diagonal_of(a, shape) if isinstance(a, (int, float, bool)) else a
    v = diagonal_of(a, shape)
    return torch.tensor(v, dtype=a.dtype) if isinstance(v, (int, float, bool)) else v


def _prefix(x: Folded, args: Sequence[Any], shape: tuple[int, ...],
            dtype: torch.dtype) -> Folded | None:
    """x[..., :Q', :K'] (a prefix along either of the last two dims, or any slice before them):
    the diagonals that remain, -(K' - 1) .. Q' - 1."""
    rank = len(x.shape)
    dim = (args[1] if len(args) > 1 else 0) % rank
    start = args[2] if len(args) > 2 else 0
    step = args[4] if len(args) > 4 else 1
    if dim < rank - 2:
        return Folded("diag", shape, dtype, x.tensor)
    if start not in (0, None) or step != 1:
        return None
    (_, k), (q2, k2) = _qk(x.shape), _qk(shape)
    return Folded("diag", shape, dtype, x.tensor[k - k2: k - 1 + q2])


def full(f: Folded) -> torch.Tensor:
    """The tensor of a "diag" or "affine" value (for folding small ones on the CPU)."""
    q, k = _qk(f.shape)
    qi, ki = torch.arange(q)[:, None], torch.arange(k)[None, :]
    if f.kind == "diag":
        m = f.tensor[qi - ki + k - 1]
    else:
        a, b, c = f.fill
        m = (a * qi + b * ki + c).to(f.dtype)
    return m.expand(f.shape).clone()


def runs(vec: torch.Tensor, k: int) -> tuple[float, ...]:
    """(d_0, v_0, d_1, v_1, ...): v_i for q - k in [d_i, d_{i+1}), d_0 = -(k - 1)."""
    vals = vec.double()
    cut = [0] + [i for i in range(1, len(vals)) if not _same(vals[i], vals[i - 1])]
    out: list[float] = []
    for i in cut:
        out += [float(i - (k - 1)), float(vals[i])]
    return tuple(out)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a == b) or bool(torch.isnan(a) and torch.isnan(b))


def is_causal(vec: torch.Tensor, k: int) -> bool:
    """0 on and below the diagonal, -inf above (d < 0)."""
    d = torch.arange(-(k - 1), len(vec) - (k - 1))
    want = torch.zeros(len(vec), dtype=torch.float64).masked_fill(d < 0, float("-inf"))
    return bool(torch.equal(vec.double(), want))


def as_constant(vec: torch.Tensor, shape: Sequence[int]) -> Constant:
    """The graph constant of a diagonal vector over (Q, K) = shape[-2:]."""
    q, k = _qk(shape)
    if vec.dtype != torch.bool and is_causal(vec, k):
        return Constant("causal_mask")
    return Constant("diagonal", runs(vec.float() if vec.dtype == torch.bool else vec, k))
