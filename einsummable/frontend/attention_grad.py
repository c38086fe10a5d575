"""The backward of fused attention: one kernel ("attention_grad") behind three ops, the
gradient of the queries, of the keys or of the values.

Over batch modes b (batch, heads, and the query groups of grouped-query attention, which only
q and dO carry), query modes q, key modes k, head width e and value width f, with dO the
gradient of the forward's output out[b,q,f]:

    S[b,q,k]  = scale * sum_e Q[b,q,e] K[b,k,e] (+ mask[b,q,k]; -inf above the diagonal if causal)
    P         = softmax over k of S                 (a fully masked row is 0, as in the forward)
    dV[b,k,f] = sum_{q, groups} P dO[b,q,f]
    dP[b,q,k] = sum_f dO[b,q,f] V[b,k,f]
    dS        = P * (dP - sum_k P * dP)             (softmax's backward, row by row)
    dQ[b,q,e] = scale * sum_k dS K[b,k,e]
    dK[b,k,e] = scale * sum_{q, groups} dS Q[b,q,e]

Each op recomputes P from its blocks of Q and K, so nothing of size q x k outlives a kernel
(the forward saves none either). A softmax row needs every key, so k is never split; batch
modes and q are (the op's `splittable`). dQ's tuples are whole; dK's and dV's sum over q and
the query groups, so their aggregation is a sum: split there, a tuple holds a partial sum that
the exchanges fold like any contraction's.

Operands, in order: Q, K, V (not for dV, which does not read it), dO, then the additive mask
if the forward had one. Params: the forward's ("q", "k", "e", "f" mode names, "scale",
"causal") and "wrt" ("q", "k" or "v").
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .einsum import flat_modes
from .kernels import (
    KERNELS,
    SOFTMAX_OPS_PER_SCORE,
    FusedOp,
    Kernel,
    Ranges,
    fine_blocks,
    positions,
)

# Scalar operations per score element of softmax's backward: P * dP, the row sum, the
# subtraction and the product with P.
SOFTMAX_GRAD_OPS_PER_SCORE = 4
# Which gradient each op computes, and the operands it reads (besides the mask).
WRT = {"q": "qkvd", "k": "qkvd", "v": "qkd"}


def _attention_grad(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    p = op.param
    qm, km, em, fm, wrt = p["q"], p["k"], p["e"], p["f"], p["wrt"]
    # Size-1 modes outside q, k, e and f are dropped, as the forward does: q, k and v sliced
    # from one tensor each carry their own size-1 mode for the slice they are.
    one = {m for m in op.modes if op.size[m] == 1} - set(qm + km + em + fm)
    names = ["".join(m for m in flat_modes(d) if m not in one) for d in op.in_dims]
    fine = [b.reshape([b.shape[i] for i, m in enumerate(m for g in d for m in g) if m not in one])
            for b, d in zip(fine_blocks(op, xs, ranges), op.in_dims)]
    roles = WRT[wrt] + ("m" if len(xs) > len(WRT[wrt]) else "")
    block = dict(zip(roles, fine))
    name = dict(zip(roles, names))
    batch = "".join(m for m in name["q"] if m not in qm + em)
    target = batch + qm + km
    ext = {m: hi - lo for m, (lo, hi) in ranges.items()}
    fast = _flash(op, xs, block, name, batch, ranges)
    if fast is not None:  # torch's CPU flash kernels: the scores never materialised
        return fast.to(xs[0].dtype)
    scores = torch.einsum(f"{name['q']},{name['k']}->{target}", block["q"].float(),
                          block["k"].float()) * p["scale"]
    if p.get("causal", False):
        pq = positions(qm, op, ranges, scores.device)
        pk = positions(km, op, ranges, scores.device)
        hide = (pk[None, :] > pq[:, None]).reshape([ext[m] for m in qm + km])
        scores = scores.masked_fill(hide, float("-inf"))
    if "m" in block:
        have = "".join(m for m in target if m in name["m"])
        mask = torch.einsum(f"{name['m']}->{have}", block["m"].float())
        scores = scores + mask.reshape([ext[m] if m in have else 1 for m in target])
    rows = [ext[m] for m in batch + qm] + [-1]
    probs = torch.nan_to_num(torch.softmax(scores.reshape(rows), dim=-1), nan=0.0)
    dout = block["d"].float()
    out = "".join(m for m in op.out_modes if m in target + em + fm)
    if wrt == "v":
        probs = probs.reshape(scores.shape)
        res = torch.einsum(f"{target},{name['d']}->{out}", probs, dout)
        return res.to(xs[0].dtype)
    dprobs = torch.einsum(f"{name['d']},{name['v']}->{target}", dout, block["v"].float())
    dprobs = dprobs.reshape(rows)
    dscores = (probs * (dprobs - (probs * dprobs).sum(-1, keepdim=True))).reshape(scores.shape)
    other = "k" if wrt == "q" else "q"
    res = torch.einsum(f"{target},{name[other]}->{out}", dscores, block[other].float())
    return (res * p["scale"]).to(xs[0].dtype)


# The last flash call's operands, position ranges and gradients (`_flash`): one entry.
_LAST: list = []


def _flash(op: FusedOp, xs: Sequence[torch.Tensor], block: dict, name: dict, batch: str,
           ranges: Ranges) -> torch.Tensor | None:
    """dQ, dK or dV by torch's CPU flash-attention kernels, the scores never materialised:
    the forward again for its log-sum-exp, then its backward (the kernels autograd runs for
    sdpa on the CPU), in the output's modes. The backward reads V only for dQ and dK: the dV
    op, which does not read V, passes zeros (dV = P^T dO does not depend on V, and the
    log-sum-exp depends on the scores alone). None where these kernels do not apply: not on
    the CPU, an additive mask, grouped-query heads, several query or key modes."""
    p = op.param
    qm, km, em, fm, wrt = p["q"], p["k"], p["e"], p["f"], p["wrt"]
    if block["q"].device.type != "cpu" or "m" in block or len(qm) != 1 or len(km) != 1 \
            or any(m not in name["k"] for m in batch) or not batch:
        return None
    ext = {m: hi - lo for m, (lo, hi) in ranges.items()}
    lead, head = batch[:-1], batch[-1:]
    n = lambda ms: math.prod(ext[m] for m in ms)  # noqa: E731

    def nhle(t: torch.Tensor, have: str, rows: str, width: str) -> torch.Tensor:
        want = batch + rows + width  # (N, H, L, E): views where the layout allows
        t = t.permute([have.index(m) for m in want])
        return t.reshape(n(lead), n(head), n(rows), n(width))
    q = nhle(block["q"], name["q"], qm, em)
    k = nhle(block["k"], name["k"], km, em)
    d = nhle(block["d"], name["d"], qm, fm)
    v = nhle(block["v"], name["v"], km, fm) if "v" in block else \
        torch.zeros(n(lead), n(head), n(km), n(fm), dtype=q.dtype)
    causal, mask = False, None
    if p.get("causal", False):
        (q0, q1), (k0, k1) = ranges[qm], ranges[km]
        causal = (q0, q1) == (k0, k1)  # local and global positions agree: top-left causal
        if not causal:
            pq = positions(qm, op, ranges, q.device)
            pk = positions(km, op, ranges, q.device)
            if not bool((pk[None, :] <= pq[:, None]).any(1).all()):
                return None  # a fully masked row: the spelled-out path zeroes it
            mask = torch.zeros(len(pq), len(pk), dtype=q.dtype).masked_fill(
                pk[None, :] > pq[:, None], float("-inf"))
    # The three ops of one attention read the same q, k and dO blocks (the same objects on a
    # rank) and the kernels give all three gradients at once: the last call's are kept (and
    # its operands, so that no other tensor can take their place while kept) and handed to
    # the next op that asks with the same operands. dQ and dK need V's, dV any.
    raw = dict(zip(WRT[wrt], xs))
    key = (ranges[qm], ranges[km], p["scale"], causal,  # and the blocks read alike
           tuple((t.shape, t.stride()) for t in (q, k, d)))
    hit = _LAST[0] if _LAST else None
    if hit is not None and all(a is b for a, b in zip(hit[0], (raw["q"], raw["k"], raw["d"]))) \
            and hit[2] == key and (wrt == "v" or (hit[1] is not None and hit[1] is raw["v"])):
        grads = hit[3]
    else:
        aten = torch.ops.aten
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=p["scale"])
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            d, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=p["scale"])
        _LAST[:] = [((raw["q"], raw["k"], raw["d"]), raw.get("v"), key, grads)]
    res = grads["qkv".index(wrt)]
    have = batch + (qm + em if wrt == "q" else km + (em if wrt == "k" else fm))
    res = res.reshape([ext[m] for m in have])
    want = "".join(m for m in op.out_modes if m in have)
    return res.permute([have.index(m) for m in want])


def _attention_grad_flops(op: FusedOp) -> int:
    p = op.param
    size = lambda ms: math.prod(op.size[m] for m in ms)  # noqa: E731
    q_modes = flat_modes(op.in_dims[0])
    scores = size(m for m in q_modes if m not in p["e"]) * size(p["k"])
    e, f = size(p["e"]), size(p["f"])
    recompute = 2 * scores * e + SOFTMAX_OPS_PER_SCORE * scores  # S and P again
    if p["wrt"] == "v":
        return recompute + 2 * scores * f
    return recompute + 2 * scores * f + SOFTMAX_GRAD_OPS_PER_SCORE * scores + 2 * scores * e


KERNELS["attention_grad"] = Kernel(
    "attention_grad", _attention_grad, _attention_grad_flops,
    "the gradient of fused attention's q, k or v (param 'wrt'); splits batch, head and query "
    "modes, dK and dV as partial sums over the queries")
