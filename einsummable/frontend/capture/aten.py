"""The ATen -> join-agg mapping table.

Each handler gets the node's arguments with FX nodes replaced by symbolic values (see
`values.py`) and returns the node's value. Views stay symbolic, elementwise ops stay lazy, and
only contractions, reductions, fused kernels and materialisations emit ops.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch

from ...errors import UnsupportedOpError
from ..scalar import Expr, call
from . import values as V
from .emit import Emitter, broadcast_shapes
from .fold import _is_causal as is_causal, ir_dtype, scalar_of
from .values import Folded, Lazy, SliceVal, View

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


def _ew(cx: Ctx, fn: Callable[..., Expr], *vals: Any) -> Lazy:
    return cx.em.elementwise(fn, vals, cx.dtype)


def _view(cx: Ctx, x: Any) -> View:
    return cx.em.view(x)


# ------------------------------------------------------------------------- elementwise

def _binary(fn: Callable[[Expr, Expr], Expr]) -> Handler:
    def h(cx, node, a, kw):
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        if alpha != 1:
            return _ew(cx, lambda x, y: fn(x, y * float(alpha)), a[0], a[1])
        return _ew(cx, fn, a[0], a[1])
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
    return _ew(cx, lambda x, y: x / y, a[0], a[1])


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(cx, node, a, kw):
    alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
    return _ew(cx, lambda x, y: y - x * float(alpha), a[0], a[1])


_UNARY = {
    aten.neg.default: lambda x: -x, aten.abs.default: lambda x: call("abs", x),
    aten.exp.default: lambda x: call("exp", x), aten.log.default: lambda x: call("log", x),
    aten.sqrt.default: lambda x: call("sqrt", x), aten.rsqrt.default: lambda x: call("rsqrt", x),
    aten.tanh.default: lambda x: call("tanh", x), aten.sigmoid.default: lambda x: call("sigmoid", x),
    aten.relu.default: lambda x: call("relu", x), aten.silu.default: lambda x: call("silu", x),
    aten.reciprocal.default: lambda x: 1.0 / x, aten.square.default: lambda x: x * x,
}
for _t, _f in _UNARY.items():
    register(_t)(lambda cx, node, a, kw, _f=_f: _ew(cx, _f, a[0]))


@register(aten.gelu.default)
def _gelu(cx, node, a, kw):
    fn = "gelu_tanh" if kw.get("approximate", a[1] if len(a) > 1 else "none") == "tanh" else "gelu"
    return _ew(cx, lambda x: call(fn, x), a[0])


@register(aten.pow.Tensor_Scalar)
def _pow(cx, node, a, kw):
    p = float(a[1])
    if p == 1.0:
        return a[0]
    if p == 2.0:
        return _ew(cx, lambda x: x * x, a[0])
    return _ew(cx, lambda x: x ** p, a[0])


@register(aten.clamp_min.default)
def _clamp_min(cx, node, a, kw):
    return _ew(cx, lambda x, y: call("max", x, y), a[0], float(a[1]))


@register(aten.clamp_max.default)
def _clamp_max(cx, node, a, kw):
    return _ew(cx, lambda x, y: call("min", x, y), a[0], float(a[1]))


@register(aten.clamp.default)
def _clamp(cx, node, a, kw):
    lo = a[1] if len(a) > 1 else kw.get("min")
    hi = a[2] if len(a) > 2 else kw.get("max")
    out = a[0]
    if lo is not None:
        out = _ew(cx, lambda x, y: call("max", x, y), out, float(lo))
    if hi is not None:
        out = _ew(cx, lambda x, y: call("min", x, y), out, float(hi))
    return out


def _cast(cx, node, a, kw):
    x = a[0]
    if isinstance(x, (int, float)):
        return x
    if cx.dtype == x.dtype:
        return x
    if isinstance(x, Folded):
        return x
    return _ew(cx, lambda e: e, x)


register(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default,
         aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
         aten.lift_fresh_copy.default)(
    lambda cx, node, a, kw: _cast(cx, node, a[:1], kw))


@register(aten.dropout.default)
def _dropout(cx, node, a, kw):
    train = a[2] if len(a) > 2 else kw.get("train", False)
    if train and a[1]:
        raise cx.fail("dropout in training mode is random", fix="call module.eval() first")
    return a[0]


def _triangle_to_additive(cond: Folded, neg_inf_where: bool) -> Folded:
    """where(cond, -inf, 0) for a symbolic triangle."""
    kind = cond.kind if neg_inf_where else ("drop" if cond.kind == "keep" else "keep")
    if kind == "drop":
        return Folded("causal", cond.shape, torch.float32)
    raise ValueError


def _where(cx, cond, a, b):
    """where(cond, a, b) for a constant condition."""
    if not isinstance(cond, Folded):
        raise cx.fail("a condition that depends on inputs has no join function",
                      fix="build masks from constants (triu/tril/full/arange), not from data")
    for other, inf, neg_inf_where in ((a, b, False), (b, a, True)):
        if isinstance(inf, (int, float)) and math.isinf(inf) and inf < 0:
            if cond.kind in ("keep", "drop"):
                try:
                    return _ew(cx, lambda x, m: x + m, other, _triangle_to_additive(cond, neg_inf_where))
                except ValueError:
                    pass
            elif cond.kind == "real":
                c = cond.tensor.bool()
                m = torch.zeros(c.shape).masked_fill(c if neg_inf_where else ~c, float("-inf"))
                return _ew(cx, lambda x, y: x + y, other, Folded("real", tuple(m.shape),
                                                               torch.float32, m))
    if cond.kind != "real":
        raise cx.fail("a large symbolic condition mixed with finite values")
    c = cond.tensor.float()
    return _ew(cx, lambda x, y, p, q: x * p + y * q, a, b, Folded("real", tuple(c.shape),
                                                                  torch.float32, c),
               Folded("real", tuple(c.shape), torch.float32, 1 - c))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where_h(cx, node, a, kw):
    return _where(cx, a[0], a[1], a[2])


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(cx, node, a, kw):
    v = a[2]
    if isinstance(v, Folded):
        v = scalar_of(v)
    return _where(cx, a[1], v, a[0])


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


def _layer_norm(cx, x, shape, w, b, eps):
    dims = list(range(len(x.shape) - len(shape), len(x.shape)))
    n = math.prod(shape)
    mu = cx.em.reduce(x, dims, True, "sum", cx.dtype, 1.0 / n, stem="layer_norm_mean")
    sq = cx.em.elementwise(lambda y, m: (y - m) * (y - m), [x, mu], cx.dtype)
    var = cx.em.reduce(sq, dims, True, "sum", cx.dtype, 1.0 / n, stem="layer_norm_var")
    vals: list[Any] = [x, mu, var]
    ws = [t for t in (w, b) if t is not None]

    def body(y, m, v, *rest):
        out = (y - m) * call("rsqrt", v + float(eps))
        if w is not None:
            out = out * rest[0]
        if b is not None:
            out = out + rest[-1]
        return out
    out = cx.em.elementwise(body, vals + ws, cx.dtype)
    rstd = cx.em.elementwise(lambda v: call("rsqrt", v + float(eps)), [var], cx.dtype)
    return out, mu, rstd


@register(aten.layer_norm.default)
def _layer_norm_h(cx, node, a, kw):
    w = a[2] if len(a) > 2 else kw.get("weight")
    b = a[3] if len(a) > 3 else kw.get("bias")
    eps = a[4] if len(a) > 4 else kw.get("eps", 1e-5)
    return _layer_norm(cx, a[0], a[1], w, b, eps)[0]


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


# ------------------------------------------------------------------------- contractions

def _matmul(cx, x, y, dtype):
    xs, ys = list(x.shape), list(y.shape)
    xv, yv = x, y
    squeeze = []
    if len(xs) == 1:
        xs = [1] + xs
        squeeze.append(-2)
    if len(ys) == 1:
        ys = ys + [1]
        squeeze.append(-1)
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    nb = len(batch)
    sizes = {i: s for i, s in enumerate(batch)}
    n, k, m = nb, nb + 1, nb + 2
    sizes.update({n: xs[-2], k: xs[-1], m: ys[-1]})
    xa = list(range(nb - (len(xs) - 2), nb)) + [n, k]
    ya = list(range(nb - (len(ys) - 2), nb)) + [k, m]
    if len(x.shape) == 1:
        xa = [k]
    if len(y.shape) == 1:
        ya = [k]
    out = list(range(nb)) + ([n] if len(x.shape) > 1 else []) + ([m] if len(y.shape) > 1 else [])
    return cx.em.contract([(xv, xa), (yv, ya)], sizes, out, dtype)


@register(aten.matmul.default, aten.mm.default, aten.bmm.default)
def _matmul_h(cx, node, a, kw):
    return _matmul(cx, a[0], a[1], cx.dtype)


@register(aten.linear.default)
def _linear(cx, node, a, kw):
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else kw.get("bias")
    r = len(x.shape)
    sizes = {i: s for i, s in enumerate(x.shape)}
    sizes[r] = w.shape[0]
    y = cx.em.contract([(x, list(range(r))), (w, [r, r - 1])], sizes,
                       list(range(r - 1)) + [r], cx.dtype)
    return y if b is None else _ew(cx, lambda p, q: p + q, y, b)


@register(aten.addmm.default, aten.baddbmm.default, aten.addbmm.default)
def _addmm(cx, node, a, kw):
    beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
    if node.target is aten.addbmm.default:
        raise cx.fail("addbmm sums over the batch; write it as bmm(...).sum(0)")
    y = _matmul(cx, a[1], a[2], cx.dtype)
    return _ew(cx, lambda p, q: p * float(beta) + q * float(alpha), a[0], y)


@register(aten.einsum.default)
def _einsum(cx, node, a, kw):
    eq, xs = a[0].replace(" ", ""), a[1]
    lhs, _, rhs = eq.partition("->")
    specs = lhs.split(",")
    if "." in eq:
        rank = max(len(x.shape) - (len(s) - 3) for s, x in zip(specs, xs) if "..." in s)
        ell = "".join(chr(0x3b1 + i) for i in range(rank))
        specs = [s.replace("...", ell[rank - (len(x.shape) - (len(s) - 3)):]) for s, x in
                 zip(specs, xs)]
        if rhs:
            rhs = rhs.replace("...", ell)
    if not _ and not rhs:
        counts: dict[str, int] = {}
        for s in specs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
    letters = sorted({c for s in specs for c in s})
    axis = {c: i for i, c in enumerate(letters)}
    sizes: dict[int, int] = {}
    for s, x in zip(specs, xs):
        if len(set(s)) != len(s):
            raise cx.fail("repeated index within one operand (a diagonal)")
        for c, extent in zip(s, x.shape):
            sizes[axis[c]] = max(sizes.get(axis[c], 1), extent)
    return cx.em.contract([(x, [axis[c] for c in s]) for s, x in zip(specs, xs)], sizes,
                          [axis[c] for c in rhs], cx.dtype)


@register(aten.embedding.default)
def _embedding(cx, node, a, kw):
    w, idx = cx.em.stored(a[0]), cx.em.stored(a[1])
    r = len(idx.shape)
    axes = list(idx.shape) + list(w.shape)
    # w binds (v, d...), idx binds its own dims; output idx dims then d dims
    wb = tuple(range(r, r + len(w.shape)))
    ib = tuple(range(r))
    out = [[i] for i in range(r)] + [[r + 1 + j] for j in range(len(w.shape) - 1)]
    split = list(range(r)) + list(range(r + 1, r + len(w.shape)))
    return cx.em.op([(w, wb), (idx, ib)], axes, out, join=None, agg=None, dtype=cx.dtype,
                    fused="embedding", splittable=split)


@register(aten.scaled_dot_product_attention.default)
def _sdpa(cx, node, a, kw):
    q, k, v = (cx.em.view(t) for t in a[:3])
    names = ["attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    opt = {n: kw.get(n) for n in names}
    for i, val in enumerate(a[3:]):
        opt[names[i]] = val
    if opt["dropout_p"]:
        raise cx.fail("attention dropout is random", fix="call the module in eval mode")
    causal = bool(opt["is_causal"])
    mask = opt["attn_mask"]
    scale = opt["scale"] if opt["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    if isinstance(mask, Folded):
        if mask.dtype == torch.bool:
            if mask.kind == "keep":
                mask = Folded("causal", mask.shape, torch.float32)
            elif mask.kind == "real":
                add = torch.zeros(mask.shape).masked_fill(~mask.tensor, float("-inf"))
                mask = Folded("real", tuple(add.shape), torch.float32, add)
            else:
                raise cx.fail("a boolean attention mask of this kind",
                              fix="pass is_causal=True or an additive float mask")
        square = mask.shape[-2] == mask.shape[-1] == q.shape[-2] == k.shape[-2]
        if square and (mask.kind == "causal" or mask.kind == "real" and is_causal(mask.tensor)):
            mask, causal = None, True
    if mask is not None and not isinstance(mask, (Folded, View, Lazy, SliceVal)):
        raise cx.fail(f"attention mask of type {type(mask).__name__}")
    elif isinstance(mask, View) and mask.dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise cx.fail("a boolean attention mask that depends on inputs")
    nb = len(q.shape) - 2
    hq, hk = q.shape[-3] if nb else 1, k.shape[-3] if len(k.shape) > 2 else 1
    # axes: batch dims..., then Q, K, E, F; GQA splits the head axis into (kv heads, group)
    batch = list(broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])) if hq == hk else \
        list(q.shape[:-3])
    gqa = hq != hk
    if gqa:
        if hq % hk:
            raise cx.fail(f"{hq} query heads do not group over {hk} key heads")
        q = cx.em.reshape(q, list(q.shape[:-3]) + [hk, hq // hk] + list(q.shape[-2:]))
        k, v = V.unsqueeze(k, -3), V.unsqueeze(v, -3)
        batch = batch + [hk, hq // hk]
    nb = len(batch)
    Q, K, E, F = nb, nb + 1, nb + 2, nb + 3
    axes = batch + [q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]]

    def bind(t: View, tail: list[int]) -> tuple:
        lead = len(t.shape) - len(tail)
        return tuple(range(nb - lead, nb)) + tuple(tail)
    ops = [(q, bind(q, [Q, E])), (k, bind(k, [K, E])), (v, bind(v, [K, F]))]
    if mask is not None:
        mv = cx.em.view(mask)
        if gqa:
            mv = V.unsqueeze(mv, -3) if len(mv.shape) >= 3 else mv
        lead = len(mv.shape) - 2
        mb = tuple(range(nb - lead, nb)) + (Q, K)
        mb = tuple(x if mv.shape[i] == axes[x] else None for i, x in enumerate(mb))
        ops.append((mv, mb))
    out = [[i] for i in range(nb - (2 if gqa else 0))] + ([[nb - 2, nb - 1]] if gqa else []) + \
        [[Q], [F]]

    def params(letters: dict[int, str]) -> tuple:
        return (("causal", causal), ("scale", float(scale)), ("q", letters[Q]),
                ("k", letters[K]), ("e", letters[E]), ("f", letters[F]))
    return cx.em.op(ops, axes, out, join=None, agg=None, dtype=cx.dtype, fused="attention",
                    params=params, splittable=list(range(nb)) + [Q], stem="attention")


# ------------------------------------------------------------------------- misc

@register(operator.getitem)
def _getitem(cx, node, a, kw):
    return a[0][a[1]]


IGNORED = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
           aten.sym_constrain_range_for_size.default, aten._assert_async.msg}
