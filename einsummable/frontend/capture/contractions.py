"""ATen contractions as join-agg ops: matmul and its variants, linear, einsum and embedding,
registered into `aten.TABLE` (attention is `attention.py`'s)."""
from __future__ import annotations

import math

import torch

from . import values as V
from .aten import aten, elementwise, register
from .emit import broadcast_shapes
from .values import Folded, View


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
    return y if b is None else elementwise(cx, lambda p, q: p + q, y, b)


@register(aten.addmm.default, aten.baddbmm.default, aten.addbmm.default)
def _addmm(cx, node, a, kw):
    beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
    if node.target is aten.addbmm.default:
        raise cx.fail("addbmm sums over the batch; write it as bmm(...).sum(0)")
    y = _matmul(cx, a[1], a[2], cx.dtype)
    return elementwise(cx, lambda p, q: p * float(beta) + q * float(alpha), a[0], y)


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


def _lookup(cx, table, index, dtype: str) -> View:
    """out[i..., d...] = table[index[i...], d...]: the "embedding" kernel (its table's first
    stored dim is the one looked up)."""
    w, idx = cx.em.stored(table), cx.em.stored(index)
    r = len(idx.shape)
    axes = list(idx.shape) + list(w.shape)
    # w binds (v, d...), idx binds its own dims; output idx dims then d dims
    wb = tuple(range(r, r + len(w.shape)))
    ib = tuple(range(r))
    out = [[i] for i in range(r)] + [[r + 1 + j] for j in range(len(w.shape) - 1)]
    split = list(range(r)) + list(range(r + 1, r + len(w.shape)))
    return cx.em.op([(w, wb), (idx, ib)], axes, out, join=None, agg=None, dtype=dtype,
                    fused="embedding", splittable=split)


@register(aten.embedding.default)
def _embedding(cx, node, a, kw):
    return _lookup(cx, a[0], a[1], cx.dtype)


def _take(cx, src, dim: int, index) -> View:
    """src with dim `dim` replaced by index's dims: the lookup over src with `dim` moved first,
    its output's dims moved back into place."""
    v = cx.em.view(src)
    rank = len(v.shape)
    out = _lookup(cx, V.permute(v, [dim] + [d for d in range(rank) if d != dim]), index,
                  cx.dtype)
    r = len(index.shape)
    rest = list(range(r, r + rank - 1))
    return V.permute(out, rest[:dim] + list(range(r)) + rest[dim:])


@register(aten.index_select.default)
def _index_select(cx, node, a, kw):
    return _take(cx, a[0], a[1] % len(a[0].shape), a[2])


@register(aten.index.Tensor)
def _index(cx, node, a, kw):
    src, indices = a[0], list(a[1])
    given = [i for i, t in enumerate(indices) if t is not None]
    view = _index_view(cx, src, indices, given)
    if view is not None:
        return view
    if len(given) != 1:
        raise cx.fail("indexing with several index tensors at once",
                      fix="index one dim at a time (x[idx] then [:, idx2]) or use index_select")
    idx = indices[given[0]]
    if node.args[1][given[0]].meta["val"].dtype == torch.bool:
        raise cx.fail("a boolean mask index selects a data-dependent number of elements",
                      fix="multiply by the mask (x * mask) or use torch.where instead")
    return _take(cx, src, given[0], idx)


def _index_view(cx, src, indices: list, given: list[int]) -> View | None:
    """src[i_1, ..., i_m] where every index is an arange over its dim placed along one axis
    of the broadcast index shape (transformers' padding_mask[batch_idx, kv_idx]): src's dims
    moved to those axes, a view."""
    if len(given) < 2 or given != list(range(given[0], given[-1] + 1)) \
            or not all(isinstance(indices[i], Folded) and indices[i].kind == "real"
                       for i in given):
        return None
    v = cx.em.view(src)
    wide = broadcast_shapes(*(indices[i].shape for i in given))
    at: dict[int, int] = {}  # index axis -> src dim
    for i in given:
        t = indices[i].tensor
        shape = (1,) * (len(wide) - t.ndim) + tuple(t.shape)
        axes = [p for p, n in enumerate(shape) if n > 1]
        n = v.shape[i]
        if not axes and n == 1 and t.numel() == 1 and int(t.reshape(())) in (0, -1):
            continue  # picks the only element of a size-1 dim
        if len(axes) != 1 or axes[0] in at or shape[axes[0]] != n \
                or not torch.equal(t.reshape(-1).long(), torch.arange(n)):
            return None
        at[axes[0]] = i
    middle = [v.dims[at[p]] if p in at else () for p in range(len(wide))]
    return v.with_(list(v.dims[:given[0]]) + middle + list(v.dims[given[-1] + 1:]))


@register(aten.gather.default)
def _gather(cx, node, a, kw):
    """out[p] = src[p with p_dim replaced by index[p]]. Where src does not vary off `dim`
    (BERT's token-type buffer, expanded over the batch) this is a lookup in a 1-D table; else
    the lookup is in src flattened, at index + (the flat offset of p's other coordinates)."""
    src, idx = cx.em.view(a[0]), a[2]
    dim = a[1] % len(src.shape)
    base = {x for g in src.base_dims for x in g}
    others = [d for d in range(len(src.shape)) if d != dim]
    if all(not set(src.dims[d]) & base for d in others):
        table = src.with_([src.dims[dim]])
        return _lookup(cx, table, idx, cx.dtype)
    if any(idx.shape[d] != src.shape[d] for d in others):
        raise cx.fail("gather with an index smaller than the source off the gathered dim",
                      fix="slice the source to the index's shape first")
    n = src.shape[dim]
    flat = cx.em.reshape(cx.em.stored(V.permute(src, others + [dim])), [math.prod(src.shape)])
    lead = [src.shape[d] for d in others]
    offset = (torch.arange(math.prod(lead), dtype=torch.int64) * n).reshape(lead + [1])
    ix = V.permute(cx.em.view(idx), others + [dim])
    at = cx.em.elementwise(lambda i, o: i + o, [ix, Folded("real", tuple(offset.shape),
                                                             torch.int64, offset)], "int64")
    out = _lookup(cx, flat, at, cx.dtype)
    back = list(range(len(others)))
    return V.permute(out, back[:dim] + [len(others)] + back[dim:])
