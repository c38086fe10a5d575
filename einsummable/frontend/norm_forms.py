"""The spellings of a normalisation's join that fusion recognises (`fuse.py`).

RMSNorm's last op is the product, in some order and nesting, of x, rsqrt(ms + eps) and a
weight factor (offset + w): LLaMA, Qwen2 and Mistral in transformers write
w * (x * rsqrt(ms + eps)), the hand-built blocks (x * rsqrt(ms + eps)) * w, Gemma
x * rsqrt(ms + eps) * (1 + w). A join is read as a flat list of factors, so every order and
nesting is one pattern.
"""
from __future__ import annotations

from .scalar import Expr


def _factors(e: Expr) -> list[Expr]:
    """The factors of a product tree (a non-product is its own one factor)."""
    if e.fn == "mul":
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _const_plus_arg(e: Expr) -> tuple[float, int] | None:
    """(c, i) when e is arg(i), c + arg(i) or arg(i) + c."""
    if e.is_arg():
        return 0.0, int(e.value)
    if e.fn == "add":
        a, b = e.args
        for c, x in ((a, b), (b, a)):
            if c.fn == "const" and x.is_arg():
                return float(c.value), int(x.value)
    return None


def norm_factors(j: Expr) -> list[tuple[int, int, int, float, float]]:
    """The readings (x, ms, w, eps, offset) of a join that is the product, in any order, of
    x, rsqrt(ms + eps) and (offset + w), as argument indices and constants: LLaMA, Qwen2 and
    Mistral spell w * (x * rsqrt(ms + eps)), Gemma x * rsqrt(ms + eps) * (1 + w). Two bare
    factors give two readings; the mean's input tells x from w."""
    fs = _factors(j)
    rs = [f for f in fs if f.fn == "rsqrt"]
    if len(fs) != 3 or len(rs) != 1:
        return []
    inner = _const_plus_arg(rs[0].args[0])
    if inner is None or inner[0] == 0.0:
        return []
    eps, ib = inner
    a, b = [f for f in fs if f is not rs[0]]
    out = []
    for xf, wf in ((a, b), (b, a)):
        w = _const_plus_arg(wf)
        if xf.is_arg() and w is not None and sorted((int(xf.value), ib, w[1])) == [0, 1, 2]:
            out.append((int(xf.value), ib, w[1], eps, w[0]))
    return out
