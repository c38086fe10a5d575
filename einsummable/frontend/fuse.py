"""Graph rewrites that replace op chains by fused kernels (`kernels.py`).

    g = fuse(graph)                 # attention, then RMSNorm
    g = fuse_attention(graph)       # scores -> (mask) -> softmax -> probs·v  =>  one "attention"
    g = fuse_rms_norm(graph)        # mean(x^2) -> x * rsqrt(ms + eps) * w  =>  one "rms_norm"

A rewrite fires only when every intermediate of the chain is read by the chain alone (and is
no graph output), so the fused graph computes the same outputs. Modes of the chain's ops are
renamed into one namespace by matching tensor dimensions between producer and consumer; a
chain whose views do not line up dimension by dimension is left alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

from .einsum import Dims, flat_modes
from .ir import Graph, Op
from .norm_forms import norm_factors
from .refine import refine_modes
from .scalar import Expr

# Mode letters for modes that the fused op's namespace does not have yet.
_SPARE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

Term = tuple  # ("leaf", tensor, dims) | ("const", value) | (fn, value, *args)


@dataclass
class _Names:
    """One namespace of modes (canonical letters) with their sizes."""
    size: dict[str, int]

    def fresh(self, extent: int) -> str:
        m = next(c for c in _SPARE if c not in self.size)
        self.size[m] = extent
        return m


def _zip(op: Op, local: Dims, canon: Dims, names: _Names, into: dict[str, str]) -> bool:
    """Extend `into` (op mode -> canonical) by reading one tensor two ways; False on mismatch."""
    if len(local) != len(canon):
        return False
    for lg, cg in zip(local, canon):
        if len(lg) != len(cg):
            return False
        for lm, cm in zip(lg, cg):
            if op.size[lm] != names.size[cm] or into.get(lm, cm) != cm:
                return False
            if cm in into.values() and into.get(lm) != cm:
                return False
            into[lm] = cm
    return True


def _complete(op: Op, into: dict[str, str], names: _Names) -> dict[str, str]:
    for m in op.modes:
        if m not in into:
            into[m] = names.fresh(op.size[m])
    return into


def _rename(dims: Dims, mp: dict[str, str]) -> Dims:
    return tuple(tuple(mp[m] for m in g) for g in dims)


def _wide(dims: Dims, names: _Names) -> tuple[str, ...]:
    """Modes of size > 1 in order: what two readings of a tensor must agree on."""
    return tuple(m for m in flat_modes(dims) if names.size[m] > 1)


def _term(expr: Expr, op: Op, mp: dict[str, str]) -> Term:
    if expr.fn == "arg":
        i = int(expr.value)
        return ("leaf", op.inputs[i], _rename(op.in_dims[i], mp))
    if expr.fn == "const":
        return ("const", expr.value)
    return (expr.fn, expr.value) + tuple(_term(a, op, mp) for a in expr.args)


def _same(a: Term, b: Term, names: _Names) -> bool:
    if a[0] == "leaf" or b[0] == "leaf":
        return a[0] == b[0] and a[1] == b[1] and _wide(a[2], names) == _wide(b[2], names)
    if a[:2] != b[:2] or len(a) != len(b):
        return False
    return all(_same(x, y, names) for x, y in zip(a[2:], b[2:]))


class _Chain:
    """Matching state for one candidate chain: namespace and the ops it would remove."""

    def __init__(self, graph: Graph, names: _Names) -> None:
        self.graph, self.names = graph, names
        self.ops: list[Op] = []

    def producer(self, tensor: str, kind: str) -> Op | None:
        op = self.graph.producer(tensor)
        if op is None or op.fused is not None:
            return None
        if kind == "map" and op.agg is not None:
            return None
        return op

    def bind_output(self, op: Op, canon: Dims) -> dict[str, str] | None:
        mp: dict[str, str] = {}
        if not _zip(op, op.out_dims, canon, self.names, mp):
            return None
        return _complete(op, mp, self.names)


def _contraction(op: Op) -> tuple[int, int, float] | None:
    """(i, j, scale) when op sums the product of two distinct operands times a constant."""
    if op.agg != "sum" or op.fused is not None or op.join is None or len(op.inputs) != 2:
        return None
    prod = op.join.scaled_product()
    if prod is None or sorted(prod[0]) != [0, 1]:
        return None
    return prod[0][0], prod[0][1], prod[1]


def _is(expr: Expr, fn: str, *args: int) -> bool:
    return (expr.fn == fn and len(expr.args) == len(args)
            and all(a.is_arg(i) for a, i in zip(expr.args, args)))


# --------------------------------------------------------------------------- attention

@dataclass(frozen=True)
class _Logits:
    scale: float
    scores: Term
    masks: tuple[Term, ...]
    scaled_masks: bool  # a mask sits inside a scale (only a causal mask survives that)


def _split_logits(t: Term, ch: _Chain) -> _Logits | None:
    """Read a logits term as scale * scores + masks, expanding single-use maps on the way."""
    kind = t[0]
    if kind == "leaf":
        prod = ch.graph.producer(t[1])
        if prod is None:
            return None
        if _contraction(prod) is not None:
            return _Logits(1.0, t, (), False)
        if prod.agg is None and prod.fused is None:
            mp = ch.bind_output(prod, t[2])
            if mp is None:
                return None
            inner = _split_logits(_term(prod.join, prod, mp), ch)
            if inner is not None:
                ch.ops.append(prod)
            return inner
        return None
    if kind in ("mul", "div"):
        a, b = t[2], t[3]
        if b[0] == "const" or (kind == "mul" and a[0] == "const"):
            c, rest = (b[1], a) if b[0] == "const" else (a[1], b)
            inner = _split_logits(rest, ch)
            if inner is None or c == 0.0:
                return None
            c = 1.0 / c if kind == "div" else c
            return _Logits(inner.scale * c, inner.scores, inner.masks,
                           inner.scaled_masks or (bool(inner.masks) and c != 1.0))
        return None
    if kind == "add":
        for main, other in ((t[2], t[3]), (t[3], t[2])):
            if other[0] != "leaf":
                continue
            saved = len(ch.ops)
            inner = _split_logits(main, ch)
            if inner is not None:
                return _Logits(inner.scale, inner.scores, inner.masks + (other,),
                               inner.scaled_masks)
            del ch.ops[saved:]
        return None
    return None


def _match_attention(graph: Graph, div: Op) -> tuple[Op, tuple[Op, ...]] | None:
    """The fused op replacing the chain that ends in `div` (softmax's last op), and the chain."""
    if div.agg is not None or div.fused is not None or not _is(div.join, "div", 0, 1):
        return None
    names = _Names(dict(div.size))
    ch = _Chain(graph, names)
    canon = {m: m for m in div.modes}
    e_dims, z_dims = div.in_dims
    # softmax sum: Z = sum_R E
    sm = ch.producer(div.inputs[1], "any")
    if sm is None or sm.agg != "sum" or len(sm.inputs) != 1 or sm.inputs[0] != div.inputs[0] \
            or not sm.join.is_arg(0):
        return None
    smp: dict[str, str] = {}
    if not _zip(sm, sm.in_dims[0], e_dims, names, smp):
        return None
    _complete(sm, smp, names)
    red = tuple(smp[m] for m in sm.agg_modes if sm.size[m] > 1)
    if not red or _wide(_rename(sm.out_dims, smp), names) != _wide(z_dims, names):
        return None
    # exp: E = exp(L - M)
    ex = ch.producer(div.inputs[0], "map")
    if ex is None or ex.join.fn != "exp" or ex.join.args[0].fn != "sub":
        return None
    exm = ch.bind_output(ex, e_dims)
    if exm is None:
        return None
    logits, m_arg = ex.join.args[0].args
    if not m_arg.is_arg():
        return None
    m_name = ex.inputs[int(m_arg.value)]
    m_dims = _rename(ex.in_dims[int(m_arg.value)], exm)
    lt = _term(logits, ex, exm)
    # max: M = max_R L, the same logits term over the same tensors
    mx = ch.producer(m_name, "any")
    if mx is None or mx.agg != "max" or mx.join is None:
        return None
    mxm: dict[str, str] = {}
    for i, (name, dims) in enumerate(zip(mx.inputs, mx.in_dims)):
        if name in ex.inputs:
            j = ex.inputs.index(name)
            if not _zip(mx, dims, _rename(ex.in_dims[j], exm), names, mxm):
                return None
    _complete(mx, mxm, names)
    if tuple(mxm[m] for m in mx.agg_modes if mx.size[m] > 1) != red \
            or _wide(_rename(mx.out_dims, mxm), names) != _wide(m_dims, names) \
            or not _same(_term(mx.join, mx, mxm), lt, names):
        return None
    ch.ops += [div, sm, ex, mx]
    split = _split_logits(lt, ch)
    if split is None:
        return None
    # scores = q·k
    sc = graph.producer(split.scores[1])
    ci, cj, cscale = _contraction(sc)
    scm = ch.bind_output(sc, split.scores[2])
    if scm is None:
        return None
    a_dims, b_dims = _rename(sc.in_dims[ci], scm), _rename(sc.in_dims[cj], scm)
    a_in, b_in = sc.inputs[ci], sc.inputs[cj]
    if set(red) <= set(flat_modes(a_dims)):
        a_in, b_in, a_dims, b_dims = b_in, a_in, b_dims, a_dims
    q_modes, k_modes = set(flat_modes(a_dims)), set(flat_modes(b_dims))
    space = _wide(e_dims, names)
    if not set(red) <= k_modes - q_modes \
            or set(_wide(_rename(sc.out_dims, scm), names)) != set(space):
        return None
    e_modes = tuple(scm[m] for m in sc.agg_modes)
    if any(m not in q_modes or m not in k_modes for m in e_modes if names.size[m] > 1):
        return None
    ch.ops.append(sc)
    # out = probs · v
    users = graph.consumers(div.output)
    if len(users) != 1 or div.output in graph.outputs:
        return None
    pv = users[0]
    pc = _contraction(pv)
    if pc is None or pc[2] != 1.0:
        return None
    pi = pv.inputs.index(div.output)
    if pv.inputs.count(div.output) != 1:
        return None
    vi = 1 - pi
    pvm: dict[str, str] = {}
    if not _zip(pv, pv.in_dims[pi], div.out_dims, names, pvm):
        return None
    _complete(pv, pvm, names)
    if {pvm[m] for m in pv.agg_modes if pv.size[m] > 1} != set(red):
        return None
    v_in, v_dims = pv.inputs[vi], _rename(pv.in_dims[vi], pvm)
    out_dims = _rename(pv.out_dims, pvm)
    if set(red) & set(flat_modes(out_dims)) or not set(red) <= set(flat_modes(v_dims)):
        return None
    # masks: a causal constant over (query, key) becomes the kernel's flag, one other stays
    causal, q_mode, extra = False, None, []
    for mask in split.masks:
        const = graph.constant.get(mask[1])
        wide = _wide(mask[2], names)
        if const is not None and const.kind == "causal_mask" and len(wide) == 2 \
                and len(red) == 1 and wide[1] == red[0] and wide[0] in q_modes - k_modes \
                and all(len(g) == 1 for g in mask[2] if names.size[g[0]] > 1) and not causal:
            causal, q_mode = True, wide[0]
        else:
            extra.append(mask)
    if len(extra) > 1 or (split.scaled_masks and (extra or split.scale <= 0)):
        return None
    if extra and not set(_wide(extra[0][2], names)) <= set(space):
        return None
    # every intermediate is the chain's own
    inside = {op.name for op in ch.ops} | {pv.name}
    for op in ch.ops:
        if op.output in graph.outputs or any(u.name not in inside for u in graph.consumers(op.output)):
            return None
    f_modes = tuple(m for m in flat_modes(out_dims) if m in flat_modes(v_dims)
                    and m not in space)
    q_all = tuple(m for m in space if m in q_modes and m not in k_modes)
    qp = (q_mode,) if causal else q_all
    k_order = tuple(m for m in flat_modes(b_dims) if m in red)
    operands = [(a_in, a_dims), (b_in, b_dims), (v_in, v_dims)] + [(m[1], m[2]) for m in extra]
    used: list[str] = []
    for _, d in operands + [("", out_dims)]:
        used += [m for m in flat_modes(d) if m not in used]
    params = (("causal", causal), ("scale", float(cscale * split.scale)), ("q", "".join(qp)),
              ("k", "".join(k_order)), ("e", "".join(m for m in e_modes if m in used)),
              ("f", "".join(f_modes)))
    splittable = frozenset(m for m in flat_modes(out_dims) if m not in f_modes)
    fused = Op(pv.name, tuple(n for n, _ in operands), tuple(d for _, d in operands), pv.output,
               out_dims, tuple((m, names.size[m]) for m in used), None, None, "attention",
               params, splittable, pv.source or sc.source)
    return fused, tuple(ch.ops) + (pv,)


# --------------------------------------------------------------------------- RMSNorm

def _match_rms_norm(graph: Graph, op: Op) -> tuple[Op, tuple[Op, ...]] | None:
    """(offset + w) * x * rsqrt(mean_last(x*x) + eps), its factors in any order, over the last
    mode -> one "rms_norm" op (the offset: Gemma's 1 + w)."""
    if op.agg is not None or op.fused is not None or len(op.inputs) != 3:
        return None
    for reading in norm_factors(op.join):
        got = _rms_norm_as(graph, op, *reading)
        if got is not None:
            return got
    return None


def _rms_norm_as(graph: Graph, op: Op, ia: int, ib: int, ic: int, eps: float,
                 offset: float) -> tuple[Op, tuple[Op, ...]] | None:
    x, ms, w = op.inputs[ia], op.inputs[ib], op.inputs[ic]
    mean = graph.producer(ms)
    if mean is None or mean.fused is not None or mean.agg != "sum" or mean.inputs != (x,):
        return None
    prod = mean.join.scaled_product()
    x_dims, w_dims = op.in_dims[ia], op.in_dims[ic]
    last = x_dims[-1]
    if prod is None or prod[0] != (0, 0) or len(last) != 1 or w_dims != (last,) \
            or op.out_dims != x_dims or not math.isclose(prod[1], 1.0 / op.size[last[0]]):
        return None
    names = _Names(dict(op.size))
    mp: dict[str, str] = {}
    if not _zip(mean, mean.in_dims[0], x_dims, names, mp):
        return None
    _complete(mean, mp, names)
    if [mp[m] for m in mean.agg_modes if mean.size[m] > 1] != [last[0]] \
            or _wide(_rename(mean.out_dims, mp), names) != _wide(op.in_dims[ib], names):
        return None
    if ms in graph.outputs or graph.consumers(ms) != (op,):
        return None
    chain: tuple[Op, ...] = (mean, op)
    dtypes = {graph.tensor(n).dtype for n in (x, ms, op.output)}
    cast = _upcast(graph, x, (mean, op))
    if cast is not None and graph.tensor(cast.inputs[0]).dtype == graph.tensor(op.output).dtype:
        # x.float() normalised, cast back, times w: what the kernel computes from x itself
        x, chain, dtypes = cast.inputs[0], (cast,) + chain, {graph.tensor(ms).dtype}
    if len(dtypes) != 1:
        return None
    modes = flat_modes(x_dims)
    fused = Op(op.name, (x, w), (x_dims, w_dims), op.output, x_dims,
               tuple((m, op.size[m]) for m in modes), None, None, "rms_norm",
               (("eps", eps),) + ((("offset", offset),) if offset else ()),
               frozenset(modes[:-1]), op.source)
    return fused, chain


def _upcast(graph: Graph, x: str, readers: tuple[Op, ...]) -> Op | None:
    """The op that casts x up to float32 in place (same dims), when only `readers` read it."""
    cast = graph.producer(x)
    if cast is None or cast.fused is not None or cast.agg is not None or len(cast.inputs) != 1 \
            or not cast.join.is_arg(0) or cast.in_dims[0] != cast.out_dims \
            or graph.tensor(x).dtype != "float32" or x in graph.outputs \
            or set(graph.consumers(x)) != set(readers):
        return None
    return cast


# --------------------------------------------------------------------------- driver

def _rewrite(graph: Graph, matcher, seen: Graph | None = None) -> Graph:
    """Replace the chains `matcher` finds by their fused ops. It matches on `seen` (the graph
    itself, or the same graph with modes refined), and chains are removed by op name."""
    seen = seen or graph
    replaced: dict[str, Op] = {}   # name of the chain's last op -> fused op
    gone: set[str] = set()
    for op in seen.ops:
        if op.name in gone:
            continue
        got = matcher(seen, op)
        if got is None:
            continue
        fused, chain = got
        if any(c.name in gone for c in chain):
            continue
        last = max(chain, key=lambda c: seen.ops.index(c))
        gone.update(c.name for c in chain)
        replaced[last.name] = fused
    if not replaced:
        return graph
    ops = tuple(replaced.get(op.name, op) for op in graph.ops
                if op.name not in gone or op.name in replaced)
    return _prune(graph, ops)


def _prune(graph: Graph, ops: tuple[Op, ...]) -> Graph:
    """Drop the tensors (and constants) nothing produces or reads any more."""
    live = {n for op in ops for n in op.inputs} | {op.output for op in ops} | set(graph.outputs)
    live |= {x for x, _ in graph.carried}
    tensors = tuple(t for t in graph.tensors if t.name in live or t.kind == "input")
    consts = tuple((n, c) for n, c in graph.constants if n in live)
    return Graph(tensors, ops, graph.outputs, consts, graph.carried)


def _absorb_views(graph: Graph, op: Op) -> tuple[Op, tuple[Op, ...]] | None:
    """Read a fused attention op's operands through the single-use views that feed it, and
    write its output through a view that alone reads it (the GQA head regrouping)."""
    if op.fused != "attention":
        return None
    names = _Names(dict(op.size))
    inputs, in_dims, gone = list(op.inputs), list(op.in_dims), []
    for i, (name, dims) in enumerate(zip(op.inputs, op.in_dims)):
        view = graph.producer(name)
        if view is None or not view.is_view or name in graph.outputs \
                or graph.consumers(name) != (op,) or op.inputs.count(name) != 1:
            continue
        mp: dict[str, str] = {}
        if not _zip(view, view.out_dims, dims, names, mp):
            continue
        _complete(view, mp, names)
        inputs[i], in_dims[i] = view.inputs[0], _rename(view.in_dims[0], mp)
        gone.append(view)
    output, out_dims, name, split = op.output, op.out_dims, op.name, set(op.splittable or ())
    users = graph.consumers(op.output)
    if len(users) == 1 and users[0].is_view and op.output not in graph.outputs:
        view = users[0]
        mp = {}
        if _zip(view, view.in_dims[0], op.out_dims, names, mp):
            _complete(view, mp, names)
            output, out_dims, name = view.output, _rename(view.out_dims, mp), view.name
            split |= {m for m in flat_modes(out_dims) if m not in op.size}
            gone.append(view)
    if not gone:
        return None
    used: list[str] = []
    for d in in_dims + [out_dims]:
        used += [m for m in flat_modes(d) if m not in used]
    if not set(op.param["q"] + op.param["k"] + op.param["f"]) <= set(used):
        return None
    fused = Op(name, tuple(inputs), tuple(in_dims), output, out_dims,
               tuple((m, names.size[m]) for m in used), None, None, "attention", op.params,
               frozenset(m for m in split if m in used), op.source)
    return fused, tuple(gone) + (op,)


def fuse_attention(graph: Graph) -> Graph:
    """Replace every attention chain whose intermediates are its own by one "attention" op
    (reading through the views around it). Chains that do not match as written are matched
    again with every op reading a tensor's dims cut as its producer wrote them
    (`refine_modes`: eager grouped-query scores are written with the head cut into key heads
    x group, and the softmax reads the head whole)."""
    once = _rewrite(graph, _match_attention)
    return _rewrite(_rewrite(once, _match_attention, refine_modes(once)), _absorb_views)


def fuse_rms_norm(graph: Graph) -> Graph:
    """Replace mean-of-squares + normalise-and-scale pairs by one "rms_norm" op."""
    return _rewrite(graph, _match_rms_norm)


def fuse(graph: Graph) -> Graph:
    """Every fusion this module knows, in order."""
    return fuse_rms_norm(fuse_attention(graph))


def fused_ops(graph: Graph) -> Iterator[Op]:
    return (op for op in graph.ops if op.fused is not None)


__all__ = ["fuse", "fuse_attention", "fuse_rms_norm", "fused_ops"]
