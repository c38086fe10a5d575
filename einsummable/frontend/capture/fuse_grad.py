"""Spelled-out attention in a training step, fused before it is differentiated.

A model may write attention out instead of calling sdpa (LLaMA's reference block does):

    S = (Q @ K^T) * c          (c: the product of the constant scales, `/ sqrt(d)`)
    S = float(S) + M           (M = triu(full((s, s), -inf), 1), the causal mask; optional)
    P = softmax_k(S)           (in float, cast back to Q's dtype)
    O = P @ V

Differentiated as written, the step keeps S and P (b x h x s x s each) for the backward,
which runs as spelled-out ops over them:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),
    dQ = c * dS K,  dK = c * dS^T Q          (the mask is a constant: no gradient)

The pass rewrites the chain S..O in the exported forward program, before the joint export
differentiates it, as one `scaled_dot_product_attention(Q, K, V, is_causal=..., scale=c)`.
sdpa computes the same function of Q, K and V (its definition is the chain above with the
causal mask as its flag), so its gradients are the same functions too: the joint export
records sdpa's backward op, which `attention.py` maps to the three attention_grad ops whose
math `frontend/attention_grad.py` states (exactly the dV, dP, dS, dQ, dK above, each op
recomputing P from its blocks of Q and K). Matching the forward rather than the spelled-out
backward avoids depending on how autograd and the decompositions write the latter, and
leaves no q x k tensor in the step: the forward is the fused "attention" op and the backward
the three attention_grad ops. Only rounding differs (the kernel's order of summation).

A chain fuses only when it is exactly that: 4-d Q, K, V that the CPU kernel takes
(`joint._cpu_kernel_takes`), positive constant scales, at most one mask that is the causal
construction above over square scores, a softmax over the last dim, every step in Q's dtype
or float32/float64 (casts up for the softmax, back to Q's dtype before P @ V), and no reader
of S, P or any step between them but the chain (dropout between softmax and P @ V, another
mask, probabilities returned or reused all leave the chain as it is: correct, slower; the
reason is logged at DEBUG).
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

SOFTMAX = (aten.softmax.int, aten._softmax.default)
CASTS = (aten.to.dtype, aten._to_copy.default, aten.type_as.default)
# Nodes that read a value only to check it: they do not count as readers of the chain.
CHECKS = (aten._assert_tensor_metadata.default,)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Dtypes the chain may compute in besides Q's: the fused kernel computes at least as wide.
WIDE = (torch.float32, torch.float64)
# Rank of q, k and v the CPU attention kernel takes: (batch, heads, sequence, width).
RANK = 4


@dataclass(frozen=True)
class _Chain:
    """One matched chain: its operands, scale, causal flag, its output node and its nodes."""
    q: torch.fx.Node
    kt: torch.fx.Node      # K^T as the scores' matmul reads it
    v: torch.fx.Node
    scale: float
    causal: bool
    out: torch.fx.Node     # P @ V
    nodes: tuple[torch.fx.Node, ...]


def fuse_spelled_attention(gm: torch.fx.GraphModule, takes: Callable[[tuple, dict], bool],
                           value: Callable[[torch.fx.Node], Any]) -> bool:
    """Rewrite every spelled-out attention chain of `gm` as one sdpa call (module docstring);
    whether any was. Chains that do not match stay as they are (the reason at DEBUG).
    `takes(qkv, options)`: whether the CPU attention kernel takes an sdpa call's q, k and v;
    `value(node)`: a new node's recorded value (both `joint.py`'s, which calls this pass)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SOFTMAX:
            continue
        chain = _match(node)
        if isinstance(chain, str):
            log.debug("spelled-out attention at %s left unfused: %s", node.name, chain)
            continue
        changed = _replace(gm, chain, takes, value) or changed
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [u for u in node.users if u.target not in CHECKS]


def _cast_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype a cast node produces, when it only casts (no device or layout change)."""
    if node.op != "call_function" or node.target not in CASTS:
        return None
    val, src = _val(node), _val(node.args[0])
    if val is None or src is None or val.shape != src.shape or val.device != src.device:
        return None
    return val.dtype if val.dtype in FLOATS else None


def _scale_of(node: torch.fx.Node) -> float | None:
    """c where node is x * c, c * x or x / c for a Python number c."""
    if node.target is aten.div.Tensor and isinstance(node.args[1], numbers.Real):
        return 1.0 / node.args[1] if node.args[1] else None
    if node.target is aten.mul.Tensor:
        a, b = node.args[:2]
        if isinstance(b, numbers.Real):
            return float(b)
        if isinstance(a, numbers.Real):
            return float(a)
    return None


def _is_causal_mask(mask, rows: int, cols: int) -> bool:
    """mask is triu(full((s, s), -inf), 1): -inf above the diagonal, 0 elsewhere."""
    if not (isinstance(mask, torch.fx.Node) and mask.target is aten.triu.default):
        return False
    diag = mask.args[1] if len(mask.args) > 1 else mask.kwargs.get("diagonal", 0)
    full = mask.args[0]
    if diag != 1 or not isinstance(full, torch.fx.Node) or full.target is not aten.full.default:
        return False
    shape, value = full.args[:2]
    return list(shape) == [rows, cols] and rows == cols and value == -math.inf


def _match(softmax: torch.fx.Node) -> _Chain | str:
    """The chain around `softmax`, or why it is not one."""
    dim = softmax.args[1] if len(softmax.args) > 1 else softmax.kwargs.get("dim")
    scores = _val(softmax)
    if scores is None or scores.ndim != RANK or dim not in (-1, RANK - 1):
        return "not a softmax over the last dim of 4-d scores"
    if softmax.target is aten._softmax.default and softmax.args[2]:
        return "a half-to-float softmax"
    nodes, scale, causal = [softmax], 1.0, False
    node = softmax.args[0]
    # back from the softmax to Q @ K^T: scales, casts and one causal mask
    while isinstance(node, torch.fx.Node) and node.target is not aten.matmul.default:
        if len(_readers(node)) != 1:
            return f"{node.name} is read outside the chain"
        c = _scale_of(node)
        if c is not None:
            if not c > 0:
                return f"scale {c} is not positive"
            scale *= c
            node_in = node.args[0] if isinstance(node.args[0], torch.fx.Node) else node.args[1]
        elif _cast_dtype(node) is not None:
            node_in = node.args[0]
        elif node.target is aten.add.Tensor and len(node.args) == 2 and not node.kwargs:
            a, b = node.args
            main, mask = (a, b) if _is_causal_mask(b, *scores.shape[-2:]) else (b, a)
            if causal or not _is_causal_mask(mask, *scores.shape[-2:]):
                return f"{node.name} adds something other than one causal mask"
            causal, node_in = True, main
        else:
            return f"{node.name} ({node.target}) is not a scale, cast or causal mask"
        nodes.append(node)
        node = node_in
    if not isinstance(node, torch.fx.Node) or len(_readers(node)) != 1:
        return "the scores are not a matmul read by the chain alone"
    nodes.append(node)
    q, kt = node.args[:2]
    qv, ktv = _val(q), _val(kt)
    if qv is None or ktv is None or qv.ndim != RANK or ktv.ndim != RANK:
        return "the scores' operands are not 4-d"
    # forward from the softmax: casts back to Q's dtype, then P @ V
    node = softmax
    while True:
        users = _readers(node)
        if len(users) != 1:
            return f"{node.name} is read outside the chain"
        user = users[0]
        if user.target is aten.matmul.default and user.args[0] is node:
            break
        if _cast_dtype(user) is None or user.args[0] is not node:
            return f"{user.name} ({user.target}) between the softmax and P @ V"
        nodes.append(user)
        node = user
    out, v = user, user.args[1]
    probs, vv, ov = _val(node), _val(v), _val(user)
    if vv is None or ov is None or vv.ndim != RANK:
        return "P @ V's operands are not 4-d"
    if not (probs.dtype == qv.dtype == ktv.dtype == vv.dtype == ov.dtype):
        return "the chain's dtypes differ from Q's at its ends"
    if any(_val(n).dtype not in (qv.dtype,) + WIDE for n in nodes):
        return "a step of the chain in a dtype other than Q's or float32/float64"
    return _Chain(q, kt, v, scale, causal, out, tuple(nodes))


def _replace(gm: torch.fx.GraphModule, ch: _Chain, takes: Callable[[tuple, dict], bool],
             value: Callable[[torch.fx.Node], Any]) -> bool:
    """O = sdpa(Q, K, V) in place of the chain's output; the chain's nodes and the checks
    reading them go (the mask's construction falls with dead-code elimination). False, with
    the graph unchanged, where the CPU kernel would not take q, k and v."""
    g = gm.graph
    with g.inserting_before(ch.out):
        k = g.call_function(aten.transpose.int, (ch.kt, -2, -1))
        k.meta = {**ch.kt.meta, "val": value(k)}
        if not takes((ch.q, k, ch.v), {}):
            g.erase_node(k)
            log.debug("spelled-out attention at %s left unfused: q, k, v the CPU attention "
                      "kernel does not take", ch.out.name)
            return False
        fused = g.call_function(aten.scaled_dot_product_attention.default,
                                (ch.q, k, ch.v, None, 0.0, ch.causal), {"scale": ch.scale})
    fused.meta = {**ch.out.meta, "val": value(fused)}
    ch.out.replace_all_uses_with(fused)
    gone = {ch.out, *ch.nodes}
    for node in gone:
        for check in [u for u in node.users if u.target in CHECKS]:
            g.erase_node(check)
    for node in reversed(list(g.nodes)):  # readers before what they read
        if node in gone:
            g.erase_node(node)
    return True
