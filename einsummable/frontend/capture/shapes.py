"""ATen shape ops -> views, pending slices and small einsums.

Reshapes, permutes, (un)squeezes, expands and repeats only change how a stored tensor is seen
(`values.View`): they emit nothing. Slices stay pending (`values.SliceVal`) so that `cat` can
turn rotate-half and friends into one einsum with a small constant; any other use of a slice,
and the pieces of split / chunk / unbind, is one such einsum (`Emitter.gather`).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from . import values as V
from .aten import as_view, aten, register
from .emit import linear_coef
from .values import Folded, Lazy, SliceVal, View

# ------------------------------------------------------------------------- views


@register(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _reshape(cx, node, a, kw):
    x = as_view(cx, a[0])
    shape = V.resolve_shape(a[1], math.prod(x.shape))
    if tuple(shape) == tuple(x.shape):
        return x
    return cx.em.reshape(x, shape)


@register(aten.flatten.using_ints)
def _flatten(cx, node, a, kw):
    return _reshape(cx, node, [a[0], list(cx.shape)], {})


@register(aten.unflatten.int)
def _unflatten(cx, node, a, kw):
    return _reshape(cx, node, [a[0], list(cx.shape)], {})


@register(aten.permute.default)
def _permute(cx, node, a, kw):
    return V.permute(as_view(cx, a[0]), a[1])


@register(aten.transpose.int)
def _transpose(cx, node, a, kw):
    x = as_view(cx, a[0])
    perm = list(range(len(x.shape)))
    i, j = a[1] % len(perm), a[2] % len(perm)
    perm[i], perm[j] = perm[j], perm[i]
    return V.permute(x, perm)


@register(aten.t.default, aten.numpy_T.default)
def _t(cx, node, a, kw):
    x = as_view(cx, a[0])
    return V.permute(x, list(range(len(x.shape)))[::-1])


@register(aten.unsqueeze.default)
def _unsqueeze(cx, node, a, kw):
    return V.unsqueeze(as_view(cx, a[0]), a[1])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(cx, node, a, kw):
    ds = a[1] if len(a) > 1 else None
    return V.squeeze(as_view(cx, a[0]), [ds] if isinstance(ds, int) else ds)


@register(aten.expand.default, aten.expand_as.default, aten.broadcast_to.default)
def _expand(cx, node, a, kw):
    x = a[0]
    shape = list(cx.shape)
    if isinstance(x, Lazy):  # broadcasting a pending expression costs nothing more later
        return Lazy(x.expr, x.leaves, tuple(shape), x.dtype)
    return V.expand(as_view(cx, x), shape)


@register(aten.repeat_interleave.self_int)
def _repeat_interleave(cx, node, a, kw):
    x = as_view(cx, a[0])
    reps = a[1]
    dim = a[2] if len(a) > 2 else kw.get("dim")
    if dim is None:
        raise cx.fail("repeat_interleave without dim flattens; pass dim=")
    dim %= len(x.shape)
    y = V.unsqueeze(x, dim + 1)
    shape = list(y.shape)
    shape[dim + 1] = reps
    y = V.expand(y, shape)
    return cx.em.reshape(y, list(cx.shape))


@register(aten.repeat.default)
def _repeat(cx, node, a, kw):
    x = as_view(cx, a[0])
    reps = list(a[1])
    lead = len(reps) - len(x.shape)
    for _ in range(lead):
        x = V.unsqueeze(x, 0)
    y = x
    for i in reversed(range(len(reps))):
        y = V.unsqueeze(y, i)
    shape = []
    for r, s in zip(reps, x.shape):
        shape += [r, s]
    y = V.expand(y, shape)
    return cx.em.reshape(y, list(cx.shape))


# ------------------------------------------------------------------------- slices and cat

def _slice_of(cx, x, dim, start, stop):
    v = as_view(cx, x)
    n = v.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    stop = n if stop is None else (stop + n if stop < 0 else stop)
    start, stop = max(0, min(start, n)), max(0, min(stop, n))
    if start == 0 and stop == n:
        return v
    if stop <= start:  # nothing to read: an empty constant, which `cat` drops
        shape = list(v.shape)
        shape[dim] = 0
        return Folded("real", tuple(shape), cx.meta.dtype, torch.empty(shape, dtype=cx.meta.dtype))
    return SliceVal(v, dim, start, stop)


@register(aten.slice.Tensor)
def _slice(cx, node, a, kw):
    x = a[0]
    dim = (a[1] if len(a) > 1 else 0) % len(x.shape)
    start = a[2] if len(a) > 2 else None
    stop = a[3] if len(a) > 3 else None
    step = a[4] if len(a) > 4 else 1
    if step != 1:
        raise cx.fail("strided slices (step != 1) are not supported")
    return _slice_of(cx, x, dim, start, stop)


@register(aten.narrow.default)
def _narrow(cx, node, a, kw):
    dim = a[1] % len(a[0].shape)
    return _slice_of(cx, a[0], dim, a[2], a[2] + a[3])


@register(aten.select.int)
def _select(cx, node, a, kw):
    x = a[0]
    dim = a[1] % len(x.shape)
    i = a[2] % x.shape[dim]
    part = cx.em.view(_slice_of(cx, x, dim, i, i + 1))
    return V.squeeze(part, [dim])


def _split(cx, x, sizes, dim):
    dim %= len(x.shape)
    out, at = [], 0
    for s in sizes:
        out.append(_slice_of(cx, x, dim, at, at + s))
        at += s
    return tuple(out)


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default,
          aten.unbind.int)
def _split_h(cx, node, a, kw):
    x = a[0]
    dim = a[2] if len(a) > 2 else kw.get("dim", 0)
    n = x.shape[dim % len(x.shape)]
    if node.target is aten.unbind.int:
        dim = a[1] if len(a) > 1 else 0
        parts = _split(cx, x, [1] * x.shape[dim], dim)
        return tuple(V.squeeze(cx.em.view(p), [dim % len(x.shape)]) for p in parts)
    if node.target is aten.split_with_sizes.default:
        sizes = list(a[1])
    elif node.target is aten.chunk.default:
        each = -(-n // a[1])
        sizes = [min(each, n - i) for i in range(0, n, each)]
    else:
        sizes = [min(a[1], n - i) for i in range(0, n, a[1])]
    return _split(cx, x, sizes, dim)


def _signed_slice(v: Any) -> tuple[SliceVal, float] | None:
    if isinstance(v, SliceVal):
        return v, 1.0
    if isinstance(v, Lazy) and len(v.leaves) == 1 and isinstance(v.leaves[0], SliceVal):
        c = linear_coef(v.expr)
        if c is not None and v.shape == v.leaves[0].shape:
            return v.leaves[0], c
    return None


@register(aten.cat.default, aten.concat.default)
def _cat(cx, node, a, kw):
    xs = [x for x in a[0] if math.prod(x.shape) > 0]
    dim = (a[1] if len(a) > 1 else kw.get("dim", 0)) % len(cx.shape)
    if len(xs) == 1:
        return xs[0]
    if all(x is xs[0] for x in xs) and not isinstance(xs[0], SliceVal):
        # cat((f, f)) (rotary tables) repeats f: a broadcast view, no op
        v = V.unsqueeze(cx.em.view(xs[0]), dim)
        shape = list(v.shape)
        shape[dim] = len(xs)
        return cx.em.reshape(V.expand(v, shape), list(cx.shape))
    # group pieces by the view they slice; each group is one einsum with a small matrix
    groups: list[tuple[View, list[tuple[int, int, float, int]]]] = []
    at = 0
    for x in xs:
        s = _signed_slice(x)
        if s is not None and s[0].dim == dim:
            src, pieces = s[0].src, [(s[0].start, s[0].stop, s[1], at)]
        else:
            src = cx.em.view(x)
            pieces = [(0, src.shape[dim], 1.0, at)]
        for g in groups:
            if g[0] == src:
                g[1].extend(pieces)
                break
        else:
            groups.append((src, pieces))
        at += x.shape[dim]
    terms = [cx.em.gather(src, dim, pieces, at) for src, pieces in groups]
    if len(terms) == 1:
        return terms[0]
    body = lambda *ts: sum(ts[1:], ts[0])  # noqa: E731
    return cx.em.elementwise(body, terms, cx.dtype)


@register(aten.slice_scatter.default)
def _slice_scatter(cx, node, a, kw):
    """base with src written over base[start:stop] along dim (backward passes write a slice's
    gradient into zeros this way): one gather of src placed at start, plus, where the base is
    not zeros, a gather of the base's rows outside the slice; the same small-matrix einsums
    as `cat`."""
    base, src = a[0], a[1]
    dim = (a[2] if len(a) > 2 else kw.get("dim", 0)) % len(base.shape)
    n = base.shape[dim]
    start = a[3] if len(a) > 3 else kw.get("start")
    stop = a[4] if len(a) > 4 else kw.get("end")
    step = a[5] if len(a) > 5 else kw.get("step", 1)
    if step != 1:
        raise cx.fail("strided slice_scatter (step != 1) is not supported")
    start = 0 if start is None else (start + n if start < 0 else start)
    stop = n if stop is None else (stop + n if stop < 0 else stop)
    start, stop = max(0, min(start, n)), max(0, min(stop, n))
    if stop - start != src.shape[dim]:
        raise cx.fail(f"slice_scatter of {src.shape[dim]} rows into [{start}, {stop})")
    if stop <= start:
        return base
    placed = cx.em.gather(cx.em.view(src), dim, [(0, stop - start, 1.0, start)], n)
    if isinstance(base, Folded) and base.kind == "fill" and base.fill == 0:
        return placed
    kept = [(lo, hi, 1.0, lo) for lo, hi in ((0, start), (stop, n)) if hi > lo]
    if not kept:
        return placed
    rest = cx.em.gather(cx.em.view(base), dim, kept, n)
    return cx.em.elementwise(lambda x, y: x + y, [rest, placed], cx.dtype)


@register(aten.stack.default)
def _stack(cx, node, a, kw):
    dim = (a[1] if len(a) > 1 else kw.get("dim", 0)) % len(cx.shape)
    xs = [V.unsqueeze(cx.em.view(x), dim) for x in a[0]]
    return _cat(cx, node, [xs, dim], {})
