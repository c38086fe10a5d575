"""ATen contractions as join-agg ops: matmul and its variants, linear, einsum, embedding,
and scaled-dot-product attention (one fused "attention" op), registered into `aten.TABLE`."""
from __future__ import annotations

import math

import torch

from . import masks, values as V
from .aten import aten, elementwise, register
from ..scalar import call
from .emit import broadcast_shapes
from .fold import is_causal
from .values import Folded, Lazy, SliceVal, View


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
            elif mask.kind in ("real", "diag"):  # True attends: 0, else -inf
                add = torch.zeros(mask.tensor.shape).masked_fill(~mask.tensor, float("-inf"))
                mask = Folded(mask.kind, mask.shape, torch.float32, add)
            else:
                raise cx.fail("a boolean attention mask of this kind",
                              fix="pass is_causal=True or an additive float mask")
        square = mask.shape[-2] == mask.shape[-1] == q.shape[-2] == k.shape[-2]
        if square and (mask.kind == "causal" or mask.kind == "real" and is_causal(mask.tensor)
                       or mask.kind == "diag" and masks.is_causal(mask.tensor, k.shape[-2])):
            mask, causal = None, True
    if mask is not None and not isinstance(mask, (Folded, View, Lazy, SliceVal)):
        raise cx.fail(f"attention mask of type {type(mask).__name__}")
    if mask is not None and not isinstance(mask, Folded):
        mask_node = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        if mask_node.meta["val"].dtype == torch.bool:  # a padding mask: True attends
            mask = elementwise(cx, lambda m: call("log", m), mask)
        elif mask.dtype not in ("float32", "float16", "bfloat16", "float64"):
            raise cx.fail("an integer attention mask", fix="pass a boolean or additive mask")
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

