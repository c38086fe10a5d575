"""Emit join-agg ops from symbolic values.

`Emitter.op` is the one place ops are made. An op is described by *axes* (its iteration space,
one size each), the binding of every operand's logical dims to axes, and the output dims as
groups of axes. Each axis is factored into the common refinement of how its operands' atoms
cut it, one mode per factor, so a view is read in place: the operand's stored dims become
groups of modes. Operands whose cuts disagree (a (2,3) vs a (3,2) factoring) are copied first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce as _reduce
from typing import Any, Callable, Sequence

import torch

from ...errors import ShapeError, UnsupportedOpError
from ..einsum import dims_shape
from ..ir import Constant, Op, TensorInfo, validate_op
from ..scalar import Expr, arg, const
from . import fold
from .values import (
    Folded,
    Lazy,
    Leaf,
    SliceVal,
    Value,
    View,
    expand,
    fresh_view,
    reshape,
)

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
Binding = tuple[int | None, ...]  # per logical dim of an operand: its axis (None: size 1)


class _Conflict(Exception):
    def __init__(self, operand: int) -> None:
        self.operand = operand


def _bounds(factors: Sequence[int]) -> set[int]:
    out, acc = {1}, 1
    for s in reversed(factors):
        acc *= s
        out.add(acc)
    return out


def substitute(e: Expr, index: dict[int, Expr]) -> Expr:
    if e.fn == "arg":
        return index[int(e.value)]
    if e.fn == "const":
        return e
    return Expr(e.fn, tuple(substitute(a, index) for a in e.args), e.value)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*(torch.Size(s) for s in shapes)))


@dataclass
class Emitter:
    tensors: dict[str, TensorInfo]
    ops: list[Op]
    constants: dict[str, Constant]
    source: str | None = None
    stem: str = "op"

    def __post_init__(self) -> None:
        self._memo: dict[int, tuple[Any, View]] = {}
        self._const_names: dict[Any, str] = {}

    # ----------------------------------------------------------------- names and leaves

    def fresh(self, stem: str) -> str:
        name, i = stem, 0
        while name in self.tensors:
            i += 1
            name = f"{stem}_{i}"
        return name

    def add_tensor(self, name: str, shape: Sequence[int], dtype: str, kind: str,
                   source: str | None = None) -> View:
        self.tensors[name] = TensorInfo(name, tuple(int(s) for s in shape), dtype, kind, source)
        return fresh_view(name, shape, dtype)

    def add_constant(self, key: Any, stem: str, c: Constant, shape: Sequence[int],
                     dtype: str) -> View:
        full_key = (key, tuple(shape), dtype)
        if full_key in self._const_names:
            return fresh_view(self._const_names[full_key], shape, dtype)
        name = self.fresh(stem)
        self._const_names[full_key] = name
        self.constants[name] = c
        return self.add_tensor(name, shape, dtype, "constant")

    def literal(self, values: torch.Tensor, dtype: str = "float32", stem: str = "const") -> View:
        vals = tuple(float(v) for v in values.flatten().tolist())
        shape = tuple(values.shape)
        if vals == (0.0, 1.0, -1.0, 0.0) and shape == (2, 2):
            return self.add_constant("rotate_half", "rotate_half_2x2", Constant("rotate_half"),
                                     shape, dtype)
        return self.add_constant(("literal", vals), stem, Constant("literal", vals), shape, dtype)

    # ----------------------------------------------------------------- the op

    def op(self, operands: Sequence[tuple[View, Binding]], axes: Sequence[int],
           out: Sequence[Sequence[int]], *, join: Expr | None, agg: str | None, dtype: str,
           fused: str | None = None,
           params: Callable[[dict[int, str]], tuple[tuple[str, Any], ...]] | None = None,
           splittable: Sequence[int] | None = None, stem: str | None = None) -> View:
        operands = list(operands)
        for _ in range(len(operands) + 1):
            try:
                return self._op(operands, axes, out, join, agg, dtype, fused, params,
                                splittable, stem)
            except _Conflict as c:
                v, b = operands[c.operand]
                operands[c.operand] = (self.copy(v), b)
        raise ShapeError("operand layouts could not be reconciled", source=self.source)

    def _op(self, operands, axes, out, join, agg, dtype, fused, params, splittable, stem) -> View:
        operands = list(operands)
        # 1. per axis, the common refinement of every operand's cut
        bounds: dict[int, set[int]] = {x: {1, axes[x]} for x in range(len(axes))}
        for i, (v, bind) in enumerate(operands):
            for g, x in zip(v.dims, bind):
                if not g:
                    continue
                if x is None or axes[x] != math.prod(v.size[a] for a in g):
                    raise ShapeError(f"operand {v.base!r} dim of size "
                                     f"{math.prod(v.size[a] for a in g)} bound to axis size "
                                     f"{None if x is None else axes[x]}", source=self.source)
                merged = bounds[x] | _bounds([v.size[a] for a in g])
                seq = sorted(merged)
                if any(b % a for a, b in zip(seq, seq[1:])):
                    raise _Conflict(i)
                bounds[x] = merged
        letters = iter(LETTERS)
        size: dict[str, int] = {}
        axis_modes: dict[int, list[tuple[str, int]]] = {}  # (letter, upper bound), outer first
        for x in range(len(axes)):
            seq = sorted(bounds[x])
            modes = []
            for lo, hi in zip(seq, seq[1:]):
                m = next(letters)
                size[m] = hi // lo
                modes.append((m, hi))
            axis_modes[x] = modes[::-1]
        # 2. operands' stored dims as groups of modes
        in_dims = []
        for v, bind in operands:
            atom_modes: dict[int, list[str]] = {}
            for g, x in zip(v.dims, bind):
                inner = 1
                for a in reversed(g):
                    lo, hi = inner, inner * v.size[a]
                    atom_modes[a] = [m for m, ub in axis_modes[x] if lo < ub <= hi]
                    inner = hi
            dims = []
            for g in v.base_dims:
                ms = [m for a in g for m in atom_modes[a]]
                if not ms:
                    m = next(letters)
                    size[m] = 1
                    ms = [m]
                dims.append(tuple(ms))
            in_dims.append(tuple(dims))
        out_dims = []
        for grp in out:
            ms = [m for x in grp for m, _ in axis_modes[x]]
            if not ms:
                m = next(letters)
                size[m] = 1
                ms = [m]
            out_dims.append(tuple(ms))
        # an output mode that only broadcasts gets its extent from a ones constant, which the
        # join does not read
        names = [v.base for v, _ in operands]
        have = {m for d in in_dims for g in d for m in g}
        for g in out_dims:
            for m in g:
                if size[m] > 1 and m not in have:
                    ones = self.add_constant(("fill", 1.0), "ones", Constant("fill", (1.0,)),
                                             (size[m],), dtype)
                    names.append(ones.base)
                    in_dims.append(((m,),))
                    have.add(m)
        order: list[str] = []
        for d in (out_dims, *in_dims):
            for g in d:
                for m in g:
                    if m not in order:
                        order.append(m)
        name = self.fresh(stem or self.stem)
        out_dims_t = tuple(out_dims)
        shape = dims_shape(out_dims_t, size)
        op = Op(name, tuple(names), tuple(in_dims), name, out_dims_t,
                tuple((m, size[m]) for m in order), join, agg, fused,
                params({x: "".join(m for m, _ in axis_modes[x]) for x in axis_modes})
                if params else (),
                frozenset(m for x in splittable for m, _ in axis_modes[x])
                if splittable is not None else None, self.source)
        shapes = {t: self.tensors[t].shape for t in op.inputs}
        validate_op(op, shapes)
        self.ops.append(op)
        return self.add_tensor(name, shape, dtype, "intermediate", self.source)

    # ----------------------------------------------------------------- conversions

    def copy(self, v: View) -> View:
        """Materialise a view into a fresh contiguous tensor (an identity map)."""
        axes = list(v.shape)
        bind = tuple(i for i in range(len(axes)))
        return self.op([(v, bind)], axes, [[i] for i in range(len(axes))], join=arg(0),
                       agg=None, dtype=v.dtype, stem=self.stem)

    def flat_copy(self, v: View) -> View:
        axes = list(v.shape)
        out = self.op([(v, tuple(range(len(axes))))], axes, [list(range(len(axes)))],
                      join=arg(0), agg=None, dtype=v.dtype, stem=self.stem)
        return out

    def reshape(self, v: View, shape: Sequence[int]) -> View:
        r = reshape(v, shape)
        if r is None:
            r = reshape(self.flat_copy(v), shape)
        assert r is not None
        return r

    def view(self, value: Value) -> View:
        """Any tensor value as a View, emitting what is pending (once per value)."""
        if isinstance(value, View):
            return value
        key = id(value)
        if key in self._memo:
            return self._memo[key][1]
        where = self.source
        if isinstance(value, (Lazy, SliceVal)) and value.source:
            self.source = value.source  # the op belongs to the line that wrote the expression
        try:
            res = self._pending(value)
        finally:
            self.source = where
        self._memo[key] = (value, res)
        return res

    def _pending(self, value: Value) -> View:
        if isinstance(value, Lazy):
            res = self._map(value)
        elif isinstance(value, SliceVal):
            res = self.gather(value.src, value.dim, [(value.start, value.stop, 1.0, 0)],
                              value.stop - value.start, stem=value.name)
        elif isinstance(value, Folded):
            res = self.folded(value)
        else:
            raise TypeError(type(value))
        return res

    def stored(self, value: Value) -> View:
        """A value as a trivial view (its own stored tensor), copying if needed."""
        v = self.view(value)
        return v if v.trivial else self.copy(v)

    def folded(self, f: Folded) -> View:
        c, shape, dtype, expand_to = fold.as_constant(f, self.source)
        if isinstance(c, torch.Tensor):
            v = self.literal(c, dtype)
        else:
            v = self.add_constant((c.kind, c.values), f"{c.kind}_{'x'.join(map(str, shape))}",
                                  c, shape, dtype)
        if expand_to is not None:
            v = expand(v, expand_to)
        return v

    def _map(self, lz: Lazy) -> View:
        leaves = [self.view(l) for l in lz.leaves]
        rank = len(lz.shape)
        ops = []
        for v in leaves:
            off = rank - len(v.shape)
            bind = tuple(off + j if s == lz.shape[off + j] else None for j, s in enumerate(v.shape))
            ops.append((v, bind))
        return self.op(ops, list(lz.shape), [[i] for i in range(rank)], join=lz.expr, agg=None,
                       dtype=lz.dtype, stem=lz.name)

    def parts(self, value: Value | float) -> tuple[Expr, list[Leaf], tuple[int, ...]]:
        """(expr, leaves, shape) of an elementwise operand."""
        if isinstance(value, (int, float, bool)):
            return const(float(value)), [], ()
        if isinstance(value, Lazy):
            return value.expr, list(value.leaves), value.shape
        if isinstance(value, Folded):
            scalar = fold.scalar_of(value)
            if scalar is not None:
                return const(scalar), [], value.shape
            return arg(0), [self.folded(value)], value.shape
        return arg(0), [value], value.shape

    def elementwise(self, fn: Callable[..., Expr], values: Sequence[Value | float],
                    dtype: str) -> Lazy:
        exprs, leaves, shapes = [], [], []
        for val in values:
            e, ls, shape = self.parts(val)
            index = {}
            for i, leaf in enumerate(ls):
                for j, have in enumerate(leaves):
                    if have is leaf or have == leaf:
                        index[i] = arg(j)
                        break
                else:
                    index[i] = arg(len(leaves))
                    leaves.append(leaf)
            exprs.append(substitute(e, index))
            shapes.append(shape)
        shape = broadcast_shapes(*shapes) if shapes else ()
        # a fill that would widen the result must be a real operand
        return Lazy(fn(*exprs), tuple(leaves), shape, dtype)

    # ----------------------------------------------------------------- composites

    def reduce(self, value: Value, dims: Sequence[int], keepdim: bool, agg: str, dtype: str,
               scale: float = 1.0, stem: str | None = None) -> View:
        expr, leaves, shape = self.parts(value)
        rank = len(shape)
        dims = sorted({d % rank for d in dims}) if rank else []
        if scale != 1.0:
            expr = expr * scale
        ops = []
        for leaf in leaves:
            v = self.view(leaf)
            off = rank - len(v.shape)
            ops.append((v, tuple(off + j if s == shape[off + j] else None
                                 for j, s in enumerate(v.shape))))
        out = [([] if i in dims else [i]) for i in range(rank) if keepdim or i not in dims]
        if not ops:
            raise UnsupportedOpError("a reduction of a constant expression", source=self.source)
        return self.op(ops, list(shape), out, join=expr, agg=agg, dtype=dtype, stem=stem)

    def contract(self, operands: Sequence[tuple[Value, Sequence[int]]], sizes: dict[int, int],
                 out_axes: Sequence[int], dtype: str, scale: float = 1.0,
                 out_groups: Sequence[Sequence[int]] | None = None,
                 stem: str | None = None) -> View:
        """sum over the axes not in out of the product of the operands (axes are ints)."""
        order = sorted(sizes)
        pos = {x: i for i, x in enumerate(order)}
        ops = []
        for value, ax in operands:
            factor, v = self._scaled(value)
            scale *= factor
            ops.append((v, tuple(pos[x] for x in ax)))
        join = arg(0)
        for i in range(1, len(ops)):
            join = join * arg(i)
        if scale != 1.0:
            join = join * scale
        groups = out_groups if out_groups is not None else [[x] for x in out_axes]
        return self.op(ops, [sizes[x] for x in order], [[pos[x] for x in g] for g in groups],
                       join=join, agg="sum", dtype=dtype, stem=stem)

    def _scaled(self, value: Value) -> tuple[float, View]:
        if isinstance(value, Lazy) and len(value.leaves) == 1:
            c = linear_coef(value.expr)
            if c is not None and value.shape == value.leaves[0].shape:
                return c, self.view(value.leaves[0])
        return 1.0, self.view(value)

    def gather(self, src: View, dim: int, pieces: Sequence[tuple[int, int, float, int]],
               out_len: int, stem: str | None = None) -> View:
        """out[..., j, ...] = sum of coef * src[..., start + t, ...] placed at offset + t: one
        einsum of src (dim cut into (K, L)) with a small (K, J) constant matrix."""
        n = src.shape[dim]
        L = _reduce(math.gcd, [n, out_len] + [x for s, e, _, o in pieces for x in (s, e, o)])
        K, J = n // L, out_len // L
        mat = torch.zeros(K, J)
        for s, e, c, o in pieces:
            for t in range((e - s) // L):
                mat[s // L + t, o // L + t] += c
        shape = list(src.shape)
        split = shape[:dim] + [K, L] + shape[dim + 1:]
        v = self.reshape(src, split)
        rank = len(shape)
        # axes: 0..rank-1 for src dims (dim -> K), rank for L, rank + 1 for J
        sizes = {i: s for i, s in enumerate(shape)}
        sizes[dim], sizes[rank], sizes[rank + 1] = K, L, J
        src_axes = list(range(dim)) + [dim, rank] + list(range(dim + 1, rank))
        # the 0/1 matrix takes the source's dtype (int64 indices stay exact integers): an op's
        # operands share its dtype
        m = self.literal(mat, src.dtype, stem="select")
        groups = [[i] for i in range(dim)] + [[rank + 1, rank]] + [[i] for i in
                                                                    range(dim + 1, rank)]
        return self.contract([(v, src_axes), (m, [dim, rank + 1])], sizes, [], src.dtype,
                             out_groups=groups, stem=stem)


def linear_coef(e: Expr) -> float | None:
    """c when e is c * x0 (through neg, mul and div by constants)."""
    if e.fn == "neg":
        c = linear_coef(e.args[0])
        return None if c is None else -c
    sp = e.scaled_product()
    return sp[1] if sp is not None and sp[0] == (0,) else None
