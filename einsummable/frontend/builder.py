"""Build a Graph with code that reads like PyTorch.

    b = Builder()
    x = b.input("x", (4, 128, 512))
    w = b.weight("w", (2048, 512))
    y = b.einsum("bsd,fd->bsf", x, w).silu()
    g = b.build([y])

Every call appends join-agg ops; composites (softmax, norms, rotary, attention) expand into
short chains of them. Each op records the caller's source line for error messages.
"""
from __future__ import annotations

import math
import sys
from typing import Sequence

from ..errors import DTypeError, EinsumParseError, ShapeError
from .einsum import dims_shape, parse_einsum
from .ir import Constant, Graph, Op, TensorInfo, check_dtype, make_op, validate_op
from .scalar import Expr, arg, call, const
from .windowed import conv_op, pool_op

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
Operand = "TensorHandle | float"


def _caller() -> str:
    """file:line of the first frame outside this module (the user's line)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


class TensorHandle:
    """A handle on a tensor being built; arithmetic on handles appends ops to the builder."""

    __slots__ = ("builder", "name")

    def __init__(self, builder: "Builder", name: str) -> None:
        self.builder = builder
        self.name = name

    @property
    def info(self) -> TensorInfo:
        return self.builder._tensors[self.name]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"TensorHandle({self.name}, {self.shape}, {self.info.dtype})"

    def _bin(self, fn: str, other: Operand, swap: bool = False) -> "TensorHandle":
        a, b = (other, self) if swap else (self, other)
        return self.builder.map(call(fn, arg(0), arg(1)), a, b)

    def __add__(self, o: Operand) -> "TensorHandle": return self._bin("add", o)
    def __radd__(self, o: Operand) -> "TensorHandle": return self._bin("add", o, True)
    def __sub__(self, o: Operand) -> "TensorHandle": return self._bin("sub", o)
    def __rsub__(self, o: Operand) -> "TensorHandle": return self._bin("sub", o, True)
    def __mul__(self, o: Operand) -> "TensorHandle": return self._bin("mul", o)
    def __rmul__(self, o: Operand) -> "TensorHandle": return self._bin("mul", o, True)
    def __truediv__(self, o: Operand) -> "TensorHandle": return self._bin("div", o)
    def __rtruediv__(self, o: Operand) -> "TensorHandle": return self._bin("div", o, True)
    def __neg__(self) -> "TensorHandle": return self.builder.map(-arg(0), self)
    def __pow__(self, p: float) -> "TensorHandle": return self.builder.map(arg(0) ** p, self)

    def apply(self, fn: str) -> "TensorHandle":
        return self.builder.map(call(fn, arg(0)), self)

    def exp(self) -> "TensorHandle": return self.apply("exp")
    def log(self) -> "TensorHandle": return self.apply("log")
    def sqrt(self) -> "TensorHandle": return self.apply("sqrt")
    def rsqrt(self) -> "TensorHandle": return self.apply("rsqrt")
    def relu(self) -> "TensorHandle": return self.apply("relu")
    def silu(self) -> "TensorHandle": return self.apply("silu")
    def sigmoid(self) -> "TensorHandle": return self.apply("sigmoid")
    def tanh(self) -> "TensorHandle": return self.apply("tanh")
    def abs(self) -> "TensorHandle": return self.apply("abs")

    def gelu(self, approximate: str = "none") -> "TensorHandle":
        return self.apply("gelu_tanh" if approximate == "tanh" else "gelu")

    def sum(self, dims: int | Sequence[int], keepdim: bool = False) -> "TensorHandle":
        return self.builder.reduce(self, "sum", dims, keepdim)

    def mean(self, dims: int | Sequence[int], keepdim: bool = False) -> "TensorHandle":
        return self.builder.mean(self, dims, keepdim)

    def amax(self, dims: int | Sequence[int], keepdim: bool = False) -> "TensorHandle":
        return self.builder.reduce(self, "max", dims, keepdim)

    def amin(self, dims: int | Sequence[int], keepdim: bool = False) -> "TensorHandle":
        return self.builder.reduce(self, "min", dims, keepdim)

    def reshape(self, *shape: int) -> "TensorHandle":
        return self.builder.reshape(self, shape[0] if len(shape) == 1 and
                                    isinstance(shape[0], (tuple, list)) else shape)

    def permute(self, *perm: int) -> "TensorHandle":
        return self.builder.permute(self, perm)

    def transpose(self, a: int, b: int) -> "TensorHandle":
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.builder.permute(self, perm)

    def softmax(self, dim: int = -1) -> "TensorHandle":
        return self.builder.softmax(self, dim)


class Builder:
    """Accumulates tensors and ops; `build` freezes them into a Graph."""

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = check_dtype(dtype)
        self._tensors: dict[str, TensorInfo] = {}
        self._ops: list[Op] = []
        self._constants: list[tuple[str, Constant]] = []
        self._counter = 0

    # ----------------------------------------------------------------- leaves

    def _new(self, name: str, shape: Sequence[int], dtype: str | None, kind: str,
             source: str) -> TensorHandle:
        if name in self._tensors:
            raise ShapeError(f"tensor name {name!r} is already used", source=source,
                             fix="give each input a distinct name")
        shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in shape):
            raise ShapeError(f"tensor {name!r} has a non-positive dimension {shape}", source=source)
        self._tensors[name] = TensorInfo(name, shape, check_dtype(dtype or self.dtype, name),
                                         kind, source)
        return TensorHandle(self, name)

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> TensorHandle:
        return self._new(name, shape, dtype, "input", _caller())

    def weight(self, name: str, shape: Sequence[int], dtype: str | None = None) -> TensorHandle:
        return self._new(name, shape, dtype, "weight", _caller())

    def constant(self, name: str, value: Constant, shape: Sequence[int],
                 dtype: str | None = None) -> TensorHandle:
        t = self._new(name, shape, dtype, "constant", _caller())
        self._constants.append((name, value))
        return t

    def _fresh(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}_{self._counter}"

    def _emit(self, stem: str, einsum: str, inputs: Sequence[TensorHandle], source: str, *,
              join: Expr | None = None, agg: str | None = None, fused: str | None = None,
              params: Sequence[tuple[str, object]] = (), splittable: Sequence[str] | None = None,
              out_sizes: dict[str, int] | None = None, strict: bool = False,
              name: str | None = None) -> TensorHandle:
        op_name = name or self._fresh(stem)
        out_name = op_name if op_name not in self._tensors else self._fresh(stem)
        shapes = {t.name: t.shape for t in inputs}
        op = make_op(op_name, einsum, [t.name for t in inputs], out_name, shapes, join=join,
                     agg=agg, fused=fused, params=params, splittable=splittable, source=source,
                     out_sizes=out_sizes, strict=strict)
        validate_op(op, shapes)
        dtype = inputs[0].info.dtype if inputs else self.dtype
        self._tensors[out_name] = TensorInfo(out_name, dims_shape(op.out_dims, op.size), dtype,
                                             "intermediate", source)
        self._ops.append(op)
        return TensorHandle(self, out_name)

    # ----------------------------------------------------------------- primitives

    def einsum(self, spec: str, *xs: TensorHandle, sizes: dict[str, int] | None = None,
               name: str | None = None) -> TensorHandle:
        """Product of the inputs, summed over modes absent from the output.

        A grouped operand such as ``(he)d`` reads a merged dim as several modes; `sizes` gives
        all but one mode of each group.
        """
        src = _caller()
        try:
            ins, _ = parse_einsum(spec)
        except EinsumParseError as e:
            raise EinsumParseError(str(e), op=name or "einsum", source=src) from None
        if len(ins) != len(xs):
            raise ShapeError(f"[{spec}] names {len(ins)} operands but {len(xs)} were given",
                             op=name or "einsum", source=src)
        dtypes = [x.info.dtype for x in xs]
        if len(set(dtypes)) > 1:  # a contraction's kernel takes one dtype (torch refuses mixes)
            raise DTypeError(f"[{spec}] contracts operands of different dtypes: "
                             + ", ".join(f"{x.name} {d}" for x, d in zip(xs, dtypes)),
                             op=name or "einsum", source=src,
                             fix="declare them in one dtype (the dtype= of Builder.input, "
                                 "weight or constant, or Builder(dtype))")
        join = arg(0)
        for i in range(1, len(xs)):
            join = join * arg(i)
        return self._emit("einsum", spec, xs, src, join=join, agg="sum", strict=True, name=name,
                          out_sizes=sizes)

    def joinagg(self, spec: str, join: Expr, agg: str | None, *xs: TensorHandle,
                name: str | None = None) -> TensorHandle:
        """The general op: any join expression and aggregation over an einsum string."""
        return self._emit("joinagg", spec, xs, _caller(), join=join, agg=agg, strict=True,
                          name=name)

    def fused(self, kernel: str, spec: str, *xs: TensorHandle, params: Sequence[tuple[str, object]] = (),
              splittable: Sequence[str] | None = None, name: str | None = None) -> TensorHandle:
        return self._emit(kernel, spec, xs, _caller(), fused=kernel, params=params,
                          splittable=splittable, name=name)

    def map(self, join: Expr, *operands: Operand, name: str | None = None) -> TensorHandle:
        """Elementwise join with NumPy broadcasting; Python numbers become constants."""
        src = _caller()
        tensors: list[TensorHandle] = []
        index: dict[int, Expr] = {}
        for i, o in enumerate(operands):
            if isinstance(o, TensorHandle):
                index[i] = arg(len(tensors))
                tensors.append(o)
            else:
                index[i] = const(float(o))
        join = _substitute(join, index)
        try:
            out_shape = _broadcast([t.shape for t in tensors])
        except ValueError:
            raise ShapeError(f"shapes {[t.shape for t in tensors]} do not broadcast",
                             op=name or "elementwise", source=src,
                             fix="make trailing dimensions equal or 1") from None
        rank = len(out_shape)
        out_modes = _LETTERS[:rank]
        spare = iter(_LETTERS[rank:])
        specs = []
        for t in tensors:
            off = rank - t.ndim
            s = ""
            for j, extent in enumerate(t.shape):
                s += out_modes[off + j] if extent == out_shape[off + j] else next(spare)
            specs.append(s)
        return self._emit("map", ",".join(specs) + "->" + out_modes, tensors, src, join=join,
                          agg=None, name=name)

    def reduce(self, x: TensorHandle, agg: str, dims: int | Sequence[int], keepdim: bool = False,
               join: Expr | None = None, name: str | None = None) -> TensorHandle:
        """Fold `dims` of x with `agg` (after applying `join` to each element)."""
        src = _caller()
        axes = _axes(dims, x.ndim, src)
        modes = _LETTERS[:x.ndim]
        out = "".join(m if i not in axes else (_LETTERS[x.ndim + i] if keepdim else "")
                      for i, m in enumerate(modes))
        return self._emit(f"reduce_{agg}", f"{modes}->{out}", [x], src,
                          join=join if join is not None else arg(0), agg=agg, name=name)

    def mean(self, x: TensorHandle, dims: int | Sequence[int], keepdim: bool = False,
             join: Expr | None = None) -> TensorHandle:
        axes = _axes(dims, x.ndim, _caller())
        count = math.prod(x.shape[a] for a in axes)
        body = join if join is not None else arg(0)
        return self.reduce(x, "sum", axes, keepdim, join=body * (1.0 / count))

    def permute(self, x: TensorHandle, perm: Sequence[int]) -> TensorHandle:
        src = _caller()
        perm = [p % x.ndim for p in perm] if x.ndim else []
        if sorted(perm) != list(range(x.ndim)):
            raise ShapeError(f"{list(perm)} is not a permutation of {x.ndim} dims", source=src)
        modes = _LETTERS[:x.ndim]
        return self._emit("permute", modes + "->" + "".join(modes[p] for p in perm), [x], src,
                          join=arg(0))

    def reshape(self, x: TensorHandle, shape: Sequence[int]) -> TensorHandle:
        """A view that splits and merges adjacent dims (and adds or drops size-1 dims)."""
        src = _caller()
        shape = _resolve_shape(tuple(int(s) for s in shape), x.shape, src)
        in_spec, out_spec, sizes = _reshape_groups(x.shape, shape, src)
        return self._emit("reshape", f"{in_spec}->{out_spec}", [x], src, join=arg(0),
                          out_sizes=sizes)

    # ----------------------------------------------------------------- composites

    def softmax(self, x: TensorHandle, dim: int = -1) -> TensorHandle:
        m = x.amax(dim, keepdim=True)
        e = self.map(call("exp", arg(0) - arg(1)), x, m)
        return e / e.sum(dim, keepdim=True)

    def rms_norm(self, x: TensorHandle, weight: TensorHandle, eps: float = 1e-6) -> TensorHandle:
        ms = self.mean(x, -1, keepdim=True, join=arg(0) * arg(0))
        return self.map(arg(0) * call("rsqrt", arg(1) + eps) * arg(2), x, ms, weight)

    def layer_norm(self, x: TensorHandle, weight: TensorHandle | None = None, bias: TensorHandle | None = None,
                   eps: float = 1e-5) -> TensorHandle:
        mu = x.mean(-1, keepdim=True)
        centred = x - mu
        var = self.mean(centred, -1, keepdim=True, join=arg(0) * arg(0))
        ops: list[Operand] = [centred, var]
        body = arg(0) * call("rsqrt", arg(1) + eps)
        if weight is not None:
            body = body * arg(len(ops))
            ops.append(weight)
        if bias is not None:
            body = body + arg(len(ops))
            ops.append(bias)
        return self.map(body, *ops)

    def rotary(self, x: TensorHandle, cos: TensorHandle, sin: TensorHandle) -> TensorHandle:
        """x * cos + rotate_half(x) * sin over the last dim, rotate_half(x1, x2) = (-x2, x1).

        rotate_half is an einsum with the 2x2 constant [[0, 1], [-1, 0]] over the halves, so
        the whole embedding stays join-agg. cos and sin are (seq, dim) and broadcast over the
        other dims; x is (..., seq, heads, dim) or (..., seq, dim) as long as they align.
        """
        src = _caller()
        half = x.shape[-1] // 2
        if x.shape[-1] % 2:
            raise ShapeError(f"rotary needs an even last dim, got {x.shape[-1]}", source=src)
        key = "rotate_half_2x2"
        if key not in self._tensors:
            self.constant(key, Constant("rotate_half"), (2, 2))
        lead = _LETTERS[:x.ndim - 1]
        rot = self._emit("rotate_half", f"{lead}(XY),XZ->{lead}(ZY)", [x, TensorHandle(self, key)], src,
                         join=arg(0) * arg(1), agg="sum", out_sizes={"Y": half, "X": 2})
        return self.map(arg(0) * arg(1) + arg(2) * arg(3), x, cos, rot, sin)

    def attention(self, q: TensorHandle, k: TensorHandle, v: TensorHandle, *, causal: bool = True, scale: float | None = None,
                  mask: TensorHandle | None = None, fused: bool = False) -> TensorHandle:
        """softmax(q k^TensorHandle * scale + mask) v over (batch, heads, seq, dim) operands.

        Grouped-query attention needs no copies: when k and v have fewer heads, q's heads are
        viewed as (kv heads, group) and the einsums share each kv head across its group.
        """
        src = _caller()
        b, h, s, e = q.shape
        kvh = k.shape[1]
        if h % kvh:
            raise ShapeError(f"{h} query heads do not group over {kvh} kv heads", source=src)
        scale = scale if scale is not None else 1.0 / math.sqrt(e)
        if fused:
            if kvh != h:
                raise ShapeError("fused attention takes equal head counts", source=src,
                                 fix="repeat k and v heads first, or use fused=False")
            params = (("causal", causal), ("scale", scale))
            return self.fused("sdpa", "bhqe,bhke,bhkf->bhqf", q, k, v, params=params,
                              splittable="bhq")
        rep = h // kvh
        qg = q.reshape(b, kvh, rep, s, e)
        scores = self.joinagg("bgrqe,bgke->bgrqk", arg(0) * arg(1) * scale, "sum", qg, k)
        if causal and mask is None:
            name = f"causal_mask_{s}x{k.shape[2]}"
            mask = (TensorHandle(self, name) if name in self._tensors else
                    self.constant(name, Constant("causal_mask"), (s, k.shape[2])))
        if mask is not None:
            m = self.map(arg(0) + arg(1), scores, mask)
            probs = self.softmax(m, -1)
        else:
            probs = self.softmax(scores, -1)
        out = self.einsum("bgrqk,bgkf->bgrqf", probs, v)
        return out.reshape(b, h, s, v.shape[-1])

    def conv(self, x: TensorHandle, w: TensorHandle, bias: TensorHandle | None = None, *,
             stride=1, padding=0, dilation=1, groups: int = 1) -> TensorHandle:
        """torch's convolution over 1 to 3 spatial dims, as a windowed op (`windowed.py`)."""
        name = self._fresh("conv")
        return self._add(conv_op(name, x.name, w.name, bias.name if bias else None, name,
                                 x.shape, w.shape, stride=stride, padding=padding,
                                 dilation=dilation, groups=groups, source=_caller()), x)

    def pool(self, x: TensorHandle, kind: str, kernel, *, stride=None, padding=0,
             dilation=1, count_include_pad: bool = True) -> TensorHandle:
        """Max ("max") or average ("avg") pooling, as a windowed op (`windowed.py`)."""
        name = self._fresh(f"{kind}_pool")
        return self._add(pool_op(name, kind, x.name, name, x.shape, kernel, stride=stride,
                                 padding=padding, dilation=dilation,
                                 count_include_pad=count_include_pad, source=_caller()), x)

    def _add(self, op: Op, like: TensorHandle) -> TensorHandle:
        validate_op(op, {n: self._tensors[n].shape for n in op.inputs})
        self._tensors[op.output] = TensorInfo(op.output, dims_shape(op.out_dims, op.size),
                                              like.info.dtype, "intermediate", op.source)
        self._ops.append(op)
        return TensorHandle(self, op.output)

    # ----------------------------------------------------------------- finish

    def build(self, outputs: Sequence[TensorHandle]) -> Graph:
        return Graph(tuple(self._tensors.values()), tuple(self._ops),
                     tuple(o.name for o in outputs), tuple(self._constants))


def _substitute(e: Expr, index: dict[int, Expr]) -> Expr:
    if e.fn == "arg":
        return index[int(e.value)]
    if e.fn == "const":
        return e
    return Expr(e.fn, tuple(_substitute(a, index) for a in e.args), e.value)


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for j, extent in enumerate(s):
            k = rank - len(s) + j
            if out[k] == 1:
                out[k] = extent
            elif extent not in (1, out[k]):
                raise ValueError
    return tuple(out)


def _axes(dims: int | Sequence[int], ndim: int, src: str) -> tuple[int, ...]:
    seq = [dims] if isinstance(dims, int) else list(dims)
    for d in seq:
        if not -ndim <= d < ndim:
            raise ShapeError(f"dim {d} is out of range for rank {ndim}", source=src)
    return tuple(sorted({d % ndim for d in seq}))


def _resolve_shape(shape: tuple[int, ...], old: tuple[int, ...], src: str) -> tuple[int, ...]:
    if shape.count(-1) > 1:
        raise ShapeError("only one dimension may be -1", source=src)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(math.prod(old) // known if s == -1 else s for s in shape)
    if math.prod(shape) != math.prod(old):
        raise ShapeError(f"cannot reshape {old} into {shape}", source=src,
                         fix="the number of elements must stay the same")
    return shape


def _reshape_groups(old: tuple[int, ...], new: tuple[int, ...],
                    src: str) -> tuple[str, str, dict[str, int]]:
    """Match old and new dims into segments that split one dim or merge several.

    Returns the einsum (with groups) and the sizes of the modes it introduces. A segment that
    both splits and merges (e.g. (6, 4) -> (4, 6)) is not a view of adjacent modes.
    """
    letters = iter(_LETTERS)
    in_groups: list[list[str]] = [[] for _ in old]
    out_groups: list[list[str]] = [[] for _ in new]
    sizes: dict[str, int] = {}
    i = j = 0
    while i < len(old) or j < len(new):
        if i < len(old) and old[i] == 1:  # a dropped size-1 dim: its own mode, not in the output
            m = next(letters)
            in_groups[i].append(m)
            sizes[m] = 1
            i += 1
            continue
        if j < len(new) and new[j] == 1:  # an added size-1 dim
            m = next(letters)
            out_groups[j].append(m)
            sizes[m] = 1
            j += 1
            continue
        si, sj = [i], [j]
        pi, pj = old[i], new[j]
        while pi != pj:
            if pi < pj:
                i += 1
                si.append(i)
                pi *= old[i]
            else:
                j += 1
                sj.append(j)
                pj *= new[j]
        if len(si) > 1 and len(sj) > 1:
            raise ShapeError(f"reshape {old} -> {new} regroups dims {si} into {sj}, which is "
                             "neither a split nor a merge", source=src,
                             fix="reshape in two steps (merge, then split)")
        if len(si) == 1:  # split old[i] into new[sj]
            for jj in sj:
                m = next(letters)
                sizes[m] = new[jj]
                out_groups[jj].append(m)
                in_groups[si[0]].append(m)
        else:  # merge old[si] into new[j]
            for ii in si:
                m = next(letters)
                sizes[m] = old[ii]
                in_groups[ii].append(m)
                out_groups[sj[0]].append(m)
        i += 1
        j += 1

    def spec(groups: list[list[str]]) -> str:
        return "".join(g[0] if len(g) == 1 else "(" + "".join(g) + ")" for g in groups)

    return spec(in_groups), spec(out_groups), sizes
