"""Scaled-dot-product attention, forward and backward, as fused ops (registered into
`aten.TABLE`).

Forward: one "attention" op (`frontend/kernels.py`) over batch modes b (batch, heads; with
grouped-query attention the kv heads and the query groups), query q, key k, head width e and
value width f:

    out[b,q,f] = sum_k P[b,q,k] V[b,k,f],   P = softmax_k(scale * sum_e Q[b,q,e] K[b,k,e] + mask)

split over b and q (a softmax row needs every key).

Backward, as torch.export's joint tracing records it on the CPU (sdpa runs as
`_scaled_dot_product_flash_attention_for_cpu`, whose backward op takes the output's gradient
dO): three "attention_grad" ops (`frontend/attention_grad.py` states their math), dQ, dK and
dV, each over the forward's modes and split like it, over b and q; dK and dV aggregate over q
(and the query groups) by a sum, so a split there leaves partial sums for the exchanges to
fold. The forward's log-sum-exp output is not kept: each backward op recomputes its softmax,
so it is an opaque value that fails wherever else it is read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from . import masks, values as V
from .aten import aten, elementwise, register
from ..scalar import call
from .emit import broadcast_shapes
from .fold import ir_dtype, is_causal
from .values import Folded, Lazy, SliceVal, View


@dataclass(frozen=True)
class _Bound:
    """q, k, v (and the mask) bound to the op's axes: batch axes, then Q, K, E, F."""
    operands: tuple[tuple[View, tuple], ...]   # q, k, v[, mask]
    axes: tuple[int, ...]
    nb: int            # batch axes (the last two are kv heads and query groups under GQA)
    gqa: bool
    heads: tuple[int, int]  # query heads, kv heads
    causal: bool
    scale: float

    def params(self, letters: dict[int, str]) -> tuple:
        Q, K, E, F = range(self.nb, self.nb + 4)
        return (("causal", self.causal), ("scale", float(self.scale)), ("q", letters[Q]),
                ("k", letters[K]), ("e", letters[E]), ("f", letters[F]))


def _bind(cx, q, k, v, mask, mask_node, causal: bool, scale) -> _Bound:
    """The operands of one attention op, its mask made additive (a boolean mask: True
    attends) or, where it is the causal mask, the `causal` flag."""
    q, k, v = (cx.em.view(t) for t in (q, k, v))
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
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
        q = _grouped(cx, q, hk)
        k, v = V.unsqueeze(k, -3), V.unsqueeze(v, -3)
        batch = batch + [hk, hq // hk]
    nb = len(batch)
    Q, K, E, F = nb, nb + 1, nb + 2, nb + 3
    axes = tuple(batch + [q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]])
    ops = [(q, _tail(q, nb, [Q, E])), (k, _tail(k, nb, [K, E])), (v, _tail(v, nb, [K, F]))]
    if mask is not None:
        mv = cx.em.view(mask)
        if gqa:
            mv = V.unsqueeze(mv, -3) if len(mv.shape) >= 3 else mv
        lead = len(mv.shape) - 2
        mb = tuple(range(nb - lead, nb)) + (Q, K)
        mb = tuple(x if mv.shape[i] == axes[x] else None for i, x in enumerate(mb))
        ops.append((mv, mb))
    return _Bound(tuple(ops), axes, nb, gqa, (hq, hk), bool(causal), scale)


def _tail(t: View, nb: int, tail: list[int]) -> tuple:
    """An operand's axes: its leading dims the last batch axes, then `tail`."""
    lead = len(t.shape) - len(tail)
    return tuple(range(nb - lead, nb)) + tuple(tail)


def _grouped(cx, t: View, hk: int) -> View:
    """Query heads (dim -3) as (kv heads, group)."""
    return cx.em.reshape(t, list(t.shape[:-3]) + [hk, t.shape[-3] // hk] + list(t.shape[-2:]))


def _query_out(b: _Bound, width: int) -> list[list[int]]:
    """The output dims of a tensor shaped like the queries: batch, (heads), Q, `width`."""
    nb = b.nb
    heads = [[nb - 2, nb - 1]] if b.gqa else []
    return [[i] for i in range(nb - (2 if b.gqa else 0))] + heads + [[nb], [width]]


def _emit_forward(cx, b: _Bound, dtype: str) -> View:
    return cx.em.op(list(b.operands), list(b.axes), _query_out(b, b.nb + 3), join=None,
                    agg=None, dtype=dtype, fused="attention", params=b.params,
                    splittable=list(range(b.nb)) + [b.nb], stem="attention")


def _emit_grad(cx, b: _Bound, dout: View, wrt: str, dtype: str) -> View:
    """dQ, dK or dV (`frontend/attention_grad.py`): operands q, k, (v), dO, (mask)."""
    nb = b.nb
    Q, K, E, F = nb, nb + 1, nb + 2, nb + 3
    dout = cx.em.view(dout)
    if b.gqa:
        dout = _grouped(cx, dout, b.heads[1])
    (q, qb), (k, kb), (v, vb) = b.operands[:3]
    ops = [(q, qb), (k, kb)] + ([(v, vb)] if wrt != "v" else []) + \
        [(dout, _tail(dout, nb, [Q, F]))] + list(b.operands[3:])
    if wrt == "q":
        if len(qb) - 2 < nb or any(q.shape[i] != b.axes[x] for i, x in enumerate(qb[:-2])):
            raise cx.fail("the queries broadcast over a batch dim",
                          fix="expand the queries to the keys' batch dims before attention")
        out = _query_out(b, E)
    else:
        t, tb = (k, kb) if wrt == "k" else (v, vb)
        own = list(zip(t.shape[:len(tb) - 2], tb[:-2]))
        if b.gqa:
            own = own[:-1]  # the size-1 query-group dim the kv heads were given
        if any(size != b.axes[x] for size, x in own):
            raise cx.fail("keys or values broadcast over a batch dim of the queries",
                          fix="expand keys and values to the queries' batch dims before "
                              "attention")
        out = [[x] for _, x in own] + [[K], [E if wrt == "k" else F]]
    return cx.em.op(ops, list(b.axes), out, join=None, agg="sum", dtype=dtype,
                    fused="attention_grad",
                    params=lambda letters: b.params(letters) + (("wrt", wrt),),
                    splittable=list(range(nb)) + [Q], stem=f"attention_grad_{wrt}")


def _no_dropout(cx, p: Any) -> None:
    if p:
        raise cx.fail("attention dropout is random", fix="call the module in eval mode")


@register(aten.scaled_dot_product_attention.default)
def _sdpa(cx, node, a, kw):
    names = ["attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    opt = {n: kw.get(n) for n in names}
    for i, val in enumerate(a[3:]):
        opt[names[i]] = val
    _no_dropout(cx, opt["dropout_p"])
    mask_node = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
    return _emit_forward(cx, _bind(cx, *a[:3], opt["attn_mask"], mask_node,
                                   bool(opt["is_causal"]), opt["scale"]), cx.dtype)


def _flash_options(a: list, kw: dict, first: int) -> tuple[Any, bool]:
    """dropout_p and is_causal, positional from `first` or by keyword."""
    dropout = a[first] if len(a) > first else kw.get("dropout_p", 0.0)
    causal = a[first + 1] if len(a) > first + 1 else kw.get("is_causal", False)
    return dropout, bool(causal)


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _flash_cpu(cx, node, a, kw):
    dropout, causal = _flash_options(a, kw, 3)
    _no_dropout(cx, dropout)
    out, lse = node.meta["val"]
    out = _emit_forward(cx, _bind(cx, *a[:3], kw.get("attn_mask"), node.kwargs.get("attn_mask"),
                                  causal, kw.get("scale")), ir_dtype(out.dtype))
    return out, Folded("opaque", tuple(lse.shape), lse.dtype)


@register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _flash_cpu_backward(cx, node, a, kw):
    dout, q, k, v = a[:4]
    dropout, causal = _flash_options(a, kw, 6)
    _no_dropout(cx, dropout)
    b = _bind(cx, q, k, v, kw.get("attn_mask"), node.kwargs.get("attn_mask"), causal,
              kw.get("scale"))
    dtype = ir_dtype(node.meta["val"][0].dtype)
    return tuple(_emit_grad(cx, b, dout, wrt, dtype) for wrt in ("q", "k", "v"))
