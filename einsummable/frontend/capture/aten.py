"""The ATen -> join-agg mapping table.

Each handler gets the node's arguments with FX nodes replaced by symbolic values (see
`values.py`) and returns the node's value. Views stay symbolic, elementwise ops stay lazy, and
only contractions, reductions, fused kernels and materialisations emit ops. This module holds
the table and the elementwise ops and reductions; `contractions.py` and `shapes.py` register
theirs into it.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch

from ...errors import UnsupportedOpError
from ..scalar import Expr, call, const
from .emit import Emitter
from .fold import ir_dtype, scalar_of
from .values import Folded, Lazy, View

aten = torch.ops.aten
Handler = Callable[["Ctx", Any, list, dict], Any]
TABLE: dict[Any, Handler] = {}


class Ctx:
    """What a handler needs: the emitter and the node's output metadata."""

    def __init__(self, em: Emitter, node: Any) -> None:
        self.em = em
        self.node = node
        val = node.meta.get("val")
        self.meta = val
        self.dtype = ir_dtype(val.dtype) if isinstance(val, torch.Tensor) else "float32"
        self.shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None

    def fail(self, message: str, fix: str | None = None) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.node.target}: {message}", op=self.node.name,
                                  source=self.em.source, fix=fix)


def register(*targets: Any) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for t in targets:
            TABLE[t] = fn
        return fn
    return deco


def supported_ops() -> list[str]:
    return sorted({"operator.getitem" if t is operator.getitem else str(t) for t in TABLE})


def elementwise(cx: Ctx, fn: Callable[..., Expr], *vals: Any) -> Lazy:
    return cx.em.elementwise(fn, vals, cx.dtype)


def as_view(cx: Ctx, x: Any) -> View:
    return cx.em.view(x)


# ------------------------------------------------------------------------- elementwise

def _binary(fn: Callable[[Expr, Expr], Expr]) -> Handler:
    def h(cx, node, a, kw):
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        if alpha != 1:
            return elementwise(cx, lambda x, y: fn(x, y * float(alpha)), a[0], a[1])
        return elementwise(cx, fn, a[0], a[1])
    return h


for _t, _f in {
    (aten.add.Tensor, aten.add.Scalar): lambda x, y: x + y,
    (aten.sub.Tensor, aten.sub.Scalar): lambda x, y: x - y,
    (aten.mul.Tensor, aten.mul.Scalar): lambda x, y: x * y,
    (aten.maximum.default,): lambda x, y: call("max", x, y),
    (aten.minimum.default,): lambda x, y: call("min", x, y),
}.items():
    register(*_t)(_binary(_f))


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode)
def _div(cx, node, a, kw):
    if kw.get("rounding_mode", a[2] if len(a) > 2 else None) is not None:
        raise cx.fail("integer-rounding division has no join function")
    return elementwise(cx, lambda x, y: x / y, a[0], a[1])


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(cx, node, a, kw):
    alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
    return elementwise(cx, lambda x, y: y - x * float(alpha), a[0], a[1])


_UNARY = {
    aten.neg.default: lambda x: -x, aten.abs.default: lambda x: call("abs", x),
    aten.exp.default: lambda x: call("exp", x), aten.log.default: lambda x: call("log", x),
    aten.sqrt.default: lambda x: call("sqrt", x), aten.rsqrt.default: lambda x: call("rsqrt", x),
    aten.tanh.default: lambda x: call("tanh", x), aten.sigmoid.default: lambda x: call("sigmoid", x),
    aten.relu.default: lambda x: call("relu", x), aten.silu.default: lambda x: call("silu", x),
    aten.reciprocal.default: lambda x: 1.0 / x, aten.square.default: lambda x: x * x,
    aten.cos.default: lambda x: call("cos", x), aten.sin.default: lambda x: call("sin", x),
    aten.erf.default: lambda x: call("erf", x),
}
for _t, _f in _UNARY.items():
    register(_t)(lambda cx, node, a, kw, _f=_f: elementwise(cx, _f, a[0]))


@register(aten.nan_to_num.default)
def _nan_to_num(cx, node, a, kw):
    """NaN to 0, infinities kept: what `joint.py` makes of math attention's guard for fully
    masked rows. torch's default (infinities to the dtype's extremes) has no mapping."""
    names = ("nan", "posinf", "neginf")
    opt = {n: kw.get(n) for n in names}
    opt.update(dict(zip(names, a[1:])))
    if opt["nan"] not in (None, 0.0) or opt["posinf"] != math.inf or opt["neginf"] != -math.inf:
        raise cx.fail("nan_to_num maps only NaN to 0 here, keeping infinities",
                      fix="pass nan=0.0, posinf=float('inf'), neginf=float('-inf')")
    return elementwise(cx, lambda x: call("nan_to_zero", x), a[0])


@register(aten.gelu.default)
def _gelu(cx, node, a, kw):
    fn = "gelu_tanh" if kw.get("approximate", a[1] if len(a) > 1 else "none") == "tanh" else "gelu"
    return elementwise(cx, lambda x: call(fn, x), a[0])


@register(aten.pow.Tensor_Scalar)
def _pow(cx, node, a, kw):
    p = float(a[1])
    if p == 1.0:
        return a[0]
    if p == 2.0:
        return elementwise(cx, lambda x: x * x, a[0])
    return elementwise(cx, lambda x: x ** p, a[0])


@register(aten.clamp_min.default)
def _clamp_min(cx, node, a, kw):
    return elementwise(cx, lambda x, y: call("max", x, y), a[0], float(a[1]))


@register(aten.clamp_max.default)
def _clamp_max(cx, node, a, kw):
    return elementwise(cx, lambda x, y: call("min", x, y), a[0], float(a[1]))


@register(aten.clamp.default)
def _clamp(cx, node, a, kw):
    lo = a[1] if len(a) > 1 else kw.get("min")
    hi = a[2] if len(a) > 2 else kw.get("max")
    out = a[0]
    if lo is not None:
        out = elementwise(cx, lambda x, y: call("max", x, y), out, float(lo))
    if hi is not None:
        out = elementwise(cx, lambda x, y: call("min", x, y), out, float(hi))
    return out


def _torch_dtype(node: Any, i: int) -> torch.dtype | None:
    arg = node.args[i] if len(node.args) > i else None
    val = getattr(arg, "meta", {}).get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _cast(cx, node, a, kw):
    """Casts change nothing but the IR dtype; booleans are 0/1 numbers, so a cast to bool of an
    integer tensor is min(|x|, 1) (a float's x != 0 has no join function)."""
    x = a[0]
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, Folded):
        return x
    src = _torch_dtype(node, 0)
    if cx.meta.dtype == torch.bool and src is not None and src != torch.bool:
        if src.is_floating_point:
            raise cx.fail("a float tensor cast to bool (x != 0) has no join function",
                          fix="build the mask from integers or pass it in as 0/1 numbers")
        return elementwise(cx, lambda e: call("min", call("abs", e), const(1.0)), x)
    if cx.dtype == x.dtype:
        return x
    return elementwise(cx, lambda e: e, x)


# A device move is a cast that changes nothing here: the graph has no devices.
register(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device,
         aten.to.other, aten.type_as.default,
         aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
         aten.lift_fresh_copy.default)(
    lambda cx, node, a, kw: _cast(cx, node, a[:1], kw))


@register(aten.dropout.default)
def _dropout(cx, node, a, kw):
    train = a[2] if len(a) > 2 else kw.get("train", False)
    if train and a[1]:
        raise cx.fail("dropout in training mode is random", fix="call module.eval() first")
    return a[0]


# Booleans are 0/1 numbers: and is a product, or a maximum, not one minus.
def _boolean(fn: Callable[..., Expr]) -> Handler:
    def h(cx, node, a, kw):
        if cx.meta.dtype != torch.bool:
            raise cx.fail("bitwise logic on integers has no join function",
                          fix="use it on boolean masks only")
        return elementwise(cx, fn, *a[:2])
    return h


register(aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default)(
    _boolean(lambda x, y: x * y))
register(aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default)(
    _boolean(lambda x, y: call("max", x, y)))
register(aten.bitwise_not.default, aten.logical_not.default)(_boolean(lambda x: 1.0 - x))


def _triangle_to_additive(cond: Folded, neg_inf_where: bool) -> Folded:
    """where(cond, -inf, 0) for a symbolic triangle."""
    kind = cond.kind if neg_inf_where else ("drop" if cond.kind == "keep" else "keep")
    if kind == "drop":
        return Folded("causal", cond.shape, torch.float32)
    raise ValueError


def _where(cx, cond, a, b, cond_arg: int = 0):
    """where(cond, a, b) for a constant condition, or a boolean one that depends on inputs
    (the node's argument `cond_arg`)."""
    if not isinstance(cond, Folded):
        if _torch_dtype(cx.node, cond_arg) != torch.bool:
            raise cx.fail("a condition that depends on inputs has no join function",
                          fix="build masks from constants (triu/tril/full/arange), not from data")
        return _where_mask(cx, cond, a, b)
    for other, inf, neg_inf_where in ((a, b, False), (b, a, True)):
        if isinstance(inf, (int, float)) and math.isinf(inf) and inf < 0:
            if cond.kind in ("keep", "drop"):
                try:
                    return elementwise(cx, lambda x, m: x + m, other, _triangle_to_additive(cond, neg_inf_where))
                except ValueError:
                    pass
            elif cond.kind == "real":
                c = cond.tensor.bool()
                m = torch.zeros(c.shape).masked_fill(c if neg_inf_where else ~c, float("-inf"))
                return elementwise(cx, lambda x, y: x + y, other, Folded("real", tuple(m.shape),
                                                               torch.float32, m))
    if cond.kind != "real":
        raise cx.fail("a large symbolic condition mixed with finite values")
    c = cond.tensor.float()
    return elementwise(cx, lambda x, y, p, q: x * p + y * q, a, b, Folded("real", tuple(c.shape),
                                                                  torch.float32, c),
               Folded("real", tuple(c.shape), torch.float32, 1 - c))


def _where_mask(cx, cond, a, b):
    """where(c, a, b) for a 0/1 mask c that depends on inputs (a padding mask): a + log(c)
    where b is -inf (log 0 = -inf, log 1 = 0), b + log(1 - c) where a is, else
    c a + (1 - c) b (a 0-d zero, transformers' torch.tensor(0.0), folds to a number)."""
    a, b = (scalar_of(x) if isinstance(x, Folded) and scalar_of(x) is not None else x
            for x in (a, b))
    for x, inf, keep in ((a, b, True), (b, a, False)):
        if isinstance(inf, (int, float)) and math.isinf(inf) and inf < 0:
            if keep:
                return elementwise(cx, lambda v, c: v + call("log", c), x, cond)
            return elementwise(cx, lambda v, c: v + call("log", 1.0 - c), x, cond)
    # stored, so that an attention chain reads the mask as a tensor of its own
    if isinstance(a, (int, float)) and a == 0:
        return cx.em.view(elementwise(cx, lambda c, q: (1.0 - c) * q, cond, b))
    if isinstance(b, (int, float)) and b == 0:
        return cx.em.view(elementwise(cx, lambda c, p: c * p, cond, a))
    return cx.em.view(elementwise(cx, lambda c, p, q: c * p + (1.0 - c) * q, cond, a, b))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where_h(cx, node, a, kw):
    return _where(cx, a[0], a[1], a[2])


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(cx, node, a, kw):
    v = a[2]
    if isinstance(v, Folded):
        v = scalar_of(v)
    return _where(cx, a[1], v, a[0], cond_arg=1)


# ------------------------------------------------------------------------- reductions

def _dims(x: Any, dims: Any) -> list[int]:
    rank = len(x.shape)
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank for d in dims]


def _reduction(agg: str, mean: bool = False) -> Handler:
    def h(cx, node, a, kw):
        x = a[0]
        dims = _dims(x, a[1] if len(a) > 1 else kw.get("dim"))
        keep = a[2] if len(a) > 2 else kw.get("keepdim", False)
        count = math.prod(x.shape[d] for d in dims)
        return cx.em.reduce(x, dims, bool(keep), agg, cx.dtype,
                            scale=1.0 / count if mean else 1.0, stem=node.name)
    return h


register(aten.sum.dim_IntList, aten.sum.default)(_reduction("sum"))
register(aten.mean.dim, aten.mean.default)(_reduction("sum", mean=True))
register(aten.amax.default)(_reduction("max"))
register(aten.amin.default)(_reduction("min"))
register(aten.prod.dim_int, aten.prod.default)(_reduction("prod"))


def _variance(cx, x, dims, correction, keep):
    n = math.prod(x.shape[d] for d in dims)
    mu = cx.em.reduce(x, dims, True, "sum", cx.dtype, 1.0 / n)
    sq = cx.em.elementwise(lambda y, m: (y - m) * (y - m), [x, mu], cx.dtype)
    return cx.em.reduce(sq, dims, keep, "sum", cx.dtype, 1.0 / max(n - correction, 1))


@register(aten.var.correction, aten.var.dim, aten.std.correction, aten.std.dim)
def _var(cx, node, a, kw):
    x = a[0]
    dims = _dims(x, a[1] if len(a) > 1 else kw.get("dim"))
    if node.target in (aten.var.dim, aten.std.dim):
        unbiased = a[2] if len(a) > 2 else kw.get("unbiased", True)
        correction = 1 if unbiased else 0
        keep = a[3] if len(a) > 3 else kw.get("keepdim", False)
    else:
        correction = kw.get("correction", 1)
        correction = 1 if correction is None else correction
        keep = kw.get("keepdim", False)
    v = _variance(cx, x, dims, correction, bool(keep))
    if node.target in (aten.std.correction, aten.std.dim):
        return cx.em.elementwise(lambda y: call("sqrt", y), [v], cx.dtype)
    return v


@register(aten.softmax.int, aten._softmax.default, aten._safe_softmax.default)
def _softmax(cx, node, a, kw):
    x, d = a[0], a[1] % len(a[0].shape)
    m = cx.em.reduce(x, [d], True, "max", cx.dtype, stem="softmax_max")
    e = cx.em.view(cx.em.elementwise(lambda y, mm: call("exp", y - mm), [x, m], cx.dtype))
    s = cx.em.reduce(e, [d], True, "sum", cx.dtype, stem="softmax_sum")
    return cx.em.elementwise(lambda y, z: y / z, [e, s], cx.dtype)


@register(aten.log_softmax.int, aten._log_softmax.default)
def _log_softmax(cx, node, a, kw):
    x, d = a[0], a[1] % len(a[0].shape)
    m = cx.em.reduce(x, [d], True, "max", cx.dtype, stem="log_softmax_max")
    ex = cx.em.elementwise(lambda y, mm: call("exp", y - mm), [x, m], cx.dtype)
    s = cx.em.reduce(ex, [d], True, "sum", cx.dtype, stem="log_softmax_sum")
    return cx.em.elementwise(lambda y, mm, z: y - mm - call("log", z), [x, m, s], cx.dtype)



def normalized(eps: float, scaled: bool, shifted: bool):
    """The join of a normalisation: (y - mean) * rsqrt(var + eps), times the weight and plus
    the bias where they are given (the operands after y, mean and var, in that order)."""
    def body(y, m, v, *rest):
        out = (y - m) * call("rsqrt", v + float(eps))
        if scaled:
            out = out * rest[0]
        if shifted:
            out = out + rest[-1]
        return out
    return body

def _layer_norm(cx, x, shape, w, b, eps):
    dims = list(range(len(x.shape) - len(shape), len(x.shape)))
    n = math.prod(shape)
    mu = cx.em.reduce(x, dims, True, "sum", cx.dtype, 1.0 / n, stem="layer_norm_mean")
    sq = cx.em.elementwise(lambda y, m: (y - m) * (y - m), [x, mu], cx.dtype)
    var = cx.em.reduce(sq, dims, True, "sum", cx.dtype, 1.0 / n, stem="layer_norm_var")
    vals: list[Any] = [x, mu, var]
    ws = [t for t in (w, b) if t is not None]

    out = cx.em.elementwise(normalized(eps, w is not None, b is not None), vals + ws, cx.dtype)
    rstd = cx.em.elementwise(lambda v: call("rsqrt", v + float(eps)), [var], cx.dtype)
    return out, mu, rstd


@register(aten.layer_norm.default)
def _layer_norm_h(cx, node, a, kw):
    """One "layer_norm" kernel over the last dim (as sdpa maps to one attention op); over
    several dims, or with a bias but no weight, the spelled-out mean and variance."""
    w = a[2] if len(a) > 2 else kw.get("weight")
    b = a[3] if len(a) > 3 else kw.get("bias")
    eps = a[4] if len(a) > 4 else kw.get("eps", 1e-5)
    if len(a[1]) != 1 or (w is None and b is not None):
        return _layer_norm(cx, a[0], a[1], w, b, eps)[0]
    x = cx.em.stored(a[0])
    rank = len(x.shape)
    ops = [(x, tuple(range(rank)))] + [(cx.em.view(t), (rank - 1,)) for t in (w, b)
                                       if t is not None]
    return cx.em.op(ops, list(x.shape), [[i] for i in range(rank)], join=None, agg=None,
                    dtype=cx.dtype, fused="layer_norm", params=lambda _: (("eps", float(eps)),),
                    splittable=list(range(rank - 1)), stem="layer_norm")


@register(aten.native_layer_norm.default)
def _native_layer_norm(cx, node, a, kw):
    return _layer_norm(cx, a[0], a[1], a[2], a[3], a[4])


@register(aten.rms_norm.default)
def _rms_norm(cx, node, a, kw):
    x, shape = a[0], a[1]
    w = a[2] if len(a) > 2 else kw.get("weight")
    eps = a[3] if len(a) > 3 else kw.get("eps")
    if eps is None:
        eps = torch.finfo(cx.meta.dtype).eps
    dims = list(range(len(x.shape) - len(shape), len(x.shape)))
    ms = cx.em.reduce(cx.em.elementwise(lambda y: y * y, [x], cx.dtype), dims, True, "sum",
                      cx.dtype, 1.0 / math.prod(shape), stem="rms_norm_ms")
    if w is None:
        return cx.em.elementwise(lambda y, m: y * call("rsqrt", m + float(eps)), [x, ms], cx.dtype)
    return cx.em.elementwise(lambda y, m, ww: y * call("rsqrt", m + float(eps)) * ww,
                             [x, ms, w], cx.dtype)


# ------------------------------------------------------------------------- misc

@register(operator.getitem)
def _getitem(cx, node, a, kw):
    return a[0][a[1]]


IGNORED = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
           aten.sym_constrain_range_for_size.default, aten._assert_async.msg}
