"""The LLaMA block of `llama.py`, built directly in the IR with the Builder.

Weights carry the module's state_dict names, so the same tensors feed both. Two spellings
differ from the module without changing the arithmetic: the q/k/v projections write
(batch, heads, seq, head_dim) directly through a grouped weight operand ``(he)d`` instead of a
view and a transpose, and grouped-query attention views query heads as (kv heads, group)
instead of copying K and V (`Builder.attention`).
"""
from __future__ import annotations

from ..frontend.builder import Builder
from ..frontend.ir import Constant, Graph
from ..frontend.scalar import arg, call
from .llama import LlamaConfig


def llama_block_graph(config: LlamaConfig, batch: int, seq: int, dtype: str = "float32",
                      n_layers: int = 1) -> Graph:
    """x (batch, seq, dim) -> the output of `n_layers` LLaMA blocks, as one Graph."""
    b = Builder(dtype)
    x = b.input("x", (batch, seq, config.dim))
    e = config.head_dim
    cos = b.constant("rope_cos", Constant("rope_cos", theta=config.rope_theta), (seq, e))
    sin = b.constant("rope_sin", Constant("rope_sin", theta=config.rope_theta), (seq, e))
    for layer in range(n_layers):
        p = f"layers.{layer}." if n_layers > 1 else ""
        x = _block(b, x, config, p, cos, sin)
    return b.build([x])


def _block(b: Builder, x, c: LlamaConfig, p: str, cos, sin):
    d, e, f = c.dim, c.head_dim, c.ffn_dim
    attn_norm = b.weight(p + "attention_norm.weight", (d,))
    wq = b.weight(p + "attention.wq.weight", (c.n_heads * e, d))
    wk = b.weight(p + "attention.wk.weight", (c.n_kv_heads * e, d))
    wv = b.weight(p + "attention.wv.weight", (c.n_kv_heads * e, d))
    wo = b.weight(p + "attention.wo.weight", (d, c.n_heads * e))
    ffn_norm = b.weight(p + "ffn_norm.weight", (d,))
    w1 = b.weight(p + "feed_forward.w1.weight", (f, d))
    w2 = b.weight(p + "feed_forward.w2.weight", (d, f))
    w3 = b.weight(p + "feed_forward.w3.weight", (f, d))

    h = b.rms_norm(x, attn_norm, c.norm_eps)
    q = b.einsum("bsd,(he)d->bhse", h, wq, sizes={"e": e})
    k = b.einsum("bsd,(he)d->bhse", h, wk, sizes={"e": e})
    v = b.einsum("bsd,(he)d->bhse", h, wv, sizes={"e": e})
    q, k = b.rotary(q, cos, sin), b.rotary(k, cos, sin)
    att = b.attention(q, k, v, causal=True)
    x = x + b.einsum("bhse,d(he)->bsd", att, wo, sizes={"e": e})

    h = b.rms_norm(x, ffn_norm, c.norm_eps)
    gate = b.einsum("bsd,fd->bsf", h, w1)
    up = b.einsum("bsd,fd->bsf", h, w3)
    act = b.map(call("silu", arg(0)) * arg(1), gate, up)
    return x + b.einsum("bsf,df->bsd", act, w2)
