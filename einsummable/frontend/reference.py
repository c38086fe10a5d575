"""Single-device evaluation of a Graph: the oracle that every plan, exchange and backend is
checked against. `evaluate_op` runs one op on blocks and is also the kernel every executor calls
per tuple, so a plan and the reference share one definition of each op's arithmetic.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import torch

from ..core.geometry import Range, Region, region_shape
from ..errors import EinsummableError, ShapeError
from .constant_kernels import selection_kernel
from .einsum import flat_modes
from .ir import Constant, Graph, Op, TensorInfo
from .kernels import bind_kernel
from .scalar import FUNCTIONS, Expr, reduce
from .scalar import evaluate as eval_expr

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64,
}

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def evaluate_op(op: Op, blocks: Sequence[torch.Tensor],
                ranges: Mapping[str, Range] | None = None) -> torch.Tensor:
    """Run `op` on input blocks. `ranges` gives each mode's global range (default: whole)."""
    return op_runner(op, ranges)(blocks)


def op_runner(op: Op, ranges: Mapping[str, Range] | None = None,
              known: Mapping[int, torch.Tensor] | None = None) -> Callable[
        [Sequence[torch.Tensor]], torch.Tensor]:
    """`evaluate_op` with the op and its ranges bound: executors that run one block of one op
    again and again build this once per instruction, so a call pays for the kernel only.
    `known`: input index -> the block that input always holds (a generated constant), for
    kernels specialised on its values (`constant_kernels`)."""
    if ranges is None:
        ranges = {m: (0, op.size[m]) for m in op.modes}
    if op.fused is not None:
        rng = dict(ranges)
        out_shape = torch.Size(math.prod(rng[m][1] - rng[m][0] for m in g) for g in op.out_dims)
        bound = bind_kernel(op, rng)
        return lambda blocks: shaped(bound(blocks), out_shape)
    ext = tuple(ranges[m][1] - ranges[m][0] for m in op.modes)
    for i, value in (known or {}).items():
        special = selection_kernel(op, dict(zip(op.modes, ext)), i, value)
        if special is not None:
            return special
    return _plan(op, ext)


# Executors run the same op on blocks of the same extents again and again: each (op, block
# extents) pair gets its subscripts, permutations and shapes worked out once.
PLAN_CACHE_SIZE = 4096
_Plan = Callable[[Sequence[torch.Tensor]], torch.Tensor]


def _plan(op: Op, ext_t: tuple[int, ...]) -> _Plan:
    key = (id(op), ext_t)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is op:
        return hit[1]
    if len(_PLANS) >= PLAN_CACHE_SIZE:
        _PLANS.clear()
    plan = _make_plan(op, dict(zip(op.modes, ext_t)))
    _PLANS[key] = (op, plan)  # the op is kept so its id cannot be reused while cached
    return plan


_PLANS: dict[tuple[int, tuple[int, ...]], tuple[Op, _Plan]] = {}


def shaped(t: torch.Tensor, size: torch.Size) -> torch.Tensor:
    """`t.reshape(size)`, skipped when `t` has that shape already: on the small blocks of a
    split plan a reshape's dispatch costs as much as the arithmetic."""
    return t if t.shape == size else t.reshape(size)


def _make_plan(op: Op, ext: dict[str, int]) -> _Plan:
    out_shape = torch.Size(math.prod(ext[m] for m in g) for g in op.out_dims)
    fine_shapes = [torch.Size(ext[m] for g in d for m in g) for d in op.in_dims]
    letters = {m: _LETTERS[i] for i, m in enumerate(op.modes)}
    present = [m for m in op.out_modes if any(m in flat_modes(d) for d in op.in_dims)]
    product = op.join.scaled_product()
    if product is not None and op.agg in ("sum", None) and product[0] \
            and sorted(set(product[0])) == list(range(len(op.inputs))):
        # A scaled product of inputs folded by sum is an einsum: no broadcast intermediate.
        factors, scale = product
        subs = ",".join("".join(letters[m] for m in flat_modes(op.in_dims[i])) for i in factors)
        eq = subs + "->" + "".join(letters[m] for m in present)
        shapes = [fine_shapes[i] for i in factors]
        mm = None
        if scale == 1.0:
            mm = (_small_contraction_plan(op, factors, present, ext)
                  or _matmul_plan(op, factors, present, ext))
        if mm is not None:
            return mm

        def run_einsum(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
            result = torch.einsum(eq, *(shaped(blocks[i], s) for i, s in zip(factors, shapes)))
            if scale != 1.0:
                result = result * scale
            return shaped(result, out_shape)
        return run_einsum
    # General path: broadcast every operand over all modes, join, fold the aggregated modes.
    order = list(op.modes)
    views = []
    for d, shape in zip(op.in_dims, fine_shapes):
        have = flat_modes(d)
        perm = sorted(range(len(have)), key=lambda i: order.index(have[i]))
        view = [ext[m] if m in have else 1 for m in order]
        views.append((shape, perm if perm != list(range(len(have))) else None,
                      torch.Size(view)))
    agg_axes = tuple(i for i, m in enumerate(order) if m not in op.out_modes)
    agg = op.agg
    join = _compile(op.join)
    full = torch.Size([max((v[2][i] for v in views), default=1) for i in range(len(order))])

    def run_general(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        aligned = []
        for t, (shape, perm, view) in zip(blocks, views):
            t = shaped(t, shape)
            if perm is not None:
                t = t.permute(perm)
            aligned.append(shaped(t, view))
        joined = join(aligned)
        if not isinstance(joined, torch.Tensor):  # a join of constants only
            joined = torch.full(full, joined, dtype=blocks[0].dtype, device=blocks[0].device)
        elif joined.shape != full:
            joined = joined.expand(full)
        result = joined if agg is None else reduce(agg, joined, agg_axes)
        # Modes absent from every input were size-1 output dims: reshape restores them.
        return shaped(result, out_shape)
    return run_general


def _compile(expr: Expr) -> Callable[[Sequence[torch.Tensor]], torch.Tensor | float]:
    """A join as nested closures (what `scalar.evaluate` does, without walking the tree and
    broadcasting shapes on every call); constant subtrees are folded once."""
    if expr.fn == "arg":
        i = int(expr.value)
        return lambda xs: xs[i]
    if expr.fn == "const" or expr.arity == 0:
        value = eval_expr(expr, []).item() if expr.fn != "const" else expr.value
        return lambda xs: value
    parts = [_compile(a) for a in expr.args]
    fn = FUNCTIONS[expr.fn][1]
    if expr.fn == "pow":
        (base,), exponent = parts, expr.value
        return lambda xs: torch.pow(base(xs), exponent)
    scalar_ok = expr.fn not in ("max", "min")  # torch.maximum has no scalar overload
    consts = [a.fn == "const" or a.arity == 0 for a in expr.args]
    if len(parts) == 1:
        (a,) = parts
        return lambda xs: fn(a(xs))
    a, b = parts
    if scalar_ok or not any(consts):
        return lambda xs: fn(a(xs), b(xs))

    def with_scalar(xs: Sequence[torch.Tensor]) -> torch.Tensor:
        va, vb = a(xs), b(xs)
        ref = va if isinstance(va, torch.Tensor) else vb
        lift = lambda v: v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=ref.dtype)  # noqa: E731
        return fn(lift(va), lift(vb))
    return with_scalar


# A contraction this short against an operand this small (rotate-half's 2x2) runs as a few
# broadcast multiply-adds: einsum would permute the big operand to a matmul of width 2.
SMALL_CONTRACTION = 4
SMALL_OPERAND = 16


def _small_contraction_plan(op: Op, factors: tuple[int, ...], present: list[str],
                            ext: dict[str, int]) -> _Plan | None:
    if len(factors) != 2 or len(set(factors)) != 2 or op.agg != "sum":
        return None
    dims = [flat_modes(op.in_dims[i]) for i in factors]
    k = [m for m in dims[1] if m in dims[0] and m not in present]
    sizes = [math.prod(ext[m] for m in d) for d in dims]
    small = min(range(2), key=lambda i: sizes[i])
    if len(k) != 1 or ext[k[0]] > SMALL_CONTRACTION or sizes[small] > SMALL_OPERAND \
            or any(m not in present and m not in k for d in dims for m in d):
        return None
    order = present + k
    views = []
    for i, d in zip(factors, dims):
        perm = [d.index(m) for m in order if m in d]
        views.append((torch.Size(ext[m] for m in d), perm,
                      torch.Size(ext[m] if m in d else 1 for m in order)))
    out_shape = torch.Size(math.prod(ext[m] for m in g) for g in op.out_dims)
    n = ext[k[0]]

    def run(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        a, b = (shaped(shaped(blocks[i], f).permute(p), v)
                for i, (f, p, v) in zip(factors, views))
        acc = a[..., 0] * b[..., 0]
        for j in range(1, n):
            acc = acc + a[..., j] * b[..., j]
        return shaped(acc, out_shape)
    return run


def _matmul_plan(op: Op, factors: tuple[int, ...], present: list[str],
                 ext: dict[str, int]) -> _Plan | None:
    """A two-operand contraction with no batch modes (every shared mode summed, the others
    kept) as one 2-D torch.matmul on the stored layouts: rows x columns, the output a permuted
    view. The projections of every block take this path instead of einsum's permutations."""
    if len(factors) != 2 or len(set(factors)) != 2 or op.agg != "sum":
        return None
    xi, wi = factors
    dx, dw = flat_modes(op.in_dims[xi]), flat_modes(op.in_dims[wi])
    k = [m for m in dw if m in dx]
    rows = [m for m in dx if m not in k]
    cols = [m for m in dw if m not in k]
    if not k or sorted(present) != sorted(rows + cols) or len(present) != len(rows + cols):
        return None
    size = lambda ms: math.prod(ext[m] for m in ms)  # noqa: E731
    x_fine, w_fine = [ext[m] for m in dx], [ext[m] for m in dw]
    x_perm = None if list(dx) == rows + k else [dx.index(m) for m in rows + k]
    if list(dw) == k + cols:
        w_perm, w_t = None, False
    elif list(dw) == cols + k:
        w_perm, w_t = None, True
    else:
        w_perm, w_t = [dw.index(m) for m in cols + k], True
    grid = torch.Size(ext[m] for m in rows + cols)
    have = rows + cols
    out_perm = None if have == present else [have.index(m) for m in present]
    out_shape = torch.Size(math.prod(ext[m] for m in g) for g in op.out_dims)
    r, c, kk = size(rows), size(cols), size(k)
    x_rows, w_cols, w_rows = torch.Size((r, kk)), torch.Size((c, kk)), torch.Size((kk, c))

    def run(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        x, w = blocks[xi], blocks[wi]
        if x_perm is not None:
            x = x.reshape(x_fine).permute(x_perm)
        if w_perm is not None:
            w = w.reshape(w_fine).permute(w_perm)
        if x.shape[-1] != kk:  # the contracted modes are x's trailing ones, grouped or not
            x = x.reshape(x_rows)
        if w_t:  # (columns, k) as stored: the product x w^T is torch's linear
            y = torch.nn.functional.linear(x, shaped(w, w_cols))
        else:
            y = torch.matmul(x, shaped(w, w_rows))
        y = shaped(y, grid)
        return shaped(y if out_perm is None else y.permute(out_perm), out_shape)
    return run


def materialize(const: Constant, info: TensorInfo, region: Region | None = None,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Generate a constant (or one block of it) locally; no device ever receives one."""
    dtype = TORCH_DTYPES[info.dtype]
    reg = region if region is not None else tuple((0, s) for s in info.shape)
    idx = [torch.arange(lo, hi, device=device) for lo, hi in reg]
    if const.kind == "causal_mask":
        q, k = idx[-2][:, None], idx[-1][None, :]
        full = torch.zeros(q.shape[0], k.shape[1], dtype=dtype, device=device)
        out = full.masked_fill(k > q, float("-inf"))
        return out.reshape(region_shape(reg))
    if const.kind == "diagonal":  # runs (d_0, v_0, d_1, v_1, ...) along q - k
        starts = torch.tensor(const.values[0::2], dtype=torch.float64, device=device)
        vals = torch.tensor(const.values[1::2], dtype=torch.float64, device=device)
        d = (idx[-2][:, None] - idx[-1][None, :]).double()
        at = (torch.searchsorted(starts, d.contiguous(), right=True) - 1).clamp_min(0)
        return vals[at].to(dtype).reshape(region_shape(reg))
    if const.kind in ("rope_cos", "rope_sin"):
        pos, col = idx[0].double()[:, None], idx[1][None, :]
        dim = info.shape[1]
        freq = const.theta ** (-(2 * (col % (dim // 2))).double() / dim)
        ang = pos * freq
        out = torch.cos(ang) if const.kind == "rope_cos" else torch.sin(ang)
        return out.to(dtype)
    if const.kind == "rotate_half":
        full = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=dtype, device=device)
        return full[tuple(slice(lo, hi) for lo, hi in reg)]
    if const.kind == "fill":  # every element is values[0], at any size
        return torch.full(region_shape(reg), const.values[0], dtype=dtype, device=device)
    if const.kind == "literal":
        full = torch.tensor(const.values, dtype=dtype, device=device).reshape(info.shape)
        return full[tuple(slice(lo, hi) for lo, hi in reg)]
    raise EinsummableError(f"unknown constant kind {const.kind!r} for {info.name!r}")


def check_inputs(graph: Graph, inputs: Mapping[str, torch.Tensor]) -> None:
    for t in graph.inputs:
        if t.name not in inputs:
            raise ShapeError(f"missing input {t.name!r} of shape {t.shape}",
                             fix=f"pass every input: {', '.join(i.name for i in graph.inputs)}")
        if tuple(inputs[t.name].shape) != t.shape:
            raise ShapeError(f"input {t.name!r} has shape {tuple(inputs[t.name].shape)}, the graph "
                             f"expects {t.shape}", source=t.source,
                             fix="trace or build the graph again for the new shapes")


def evaluate(graph: Graph, inputs: Mapping[str, torch.Tensor], *,
             keep_all: bool = False) -> dict[str, torch.Tensor]:
    """Evaluate the whole graph; returns the outputs (every tensor with `keep_all`)."""
    check_inputs(graph, inputs)
    env: dict[str, torch.Tensor] = {}
    for t in graph.tensors:
        if t.kind in ("input", "weight"):
            env[t.name] = inputs[t.name].to(TORCH_DTYPES[t.dtype])
        elif t.kind == "constant":
            env[t.name] = materialize(graph.constant[t.name], t)
    for op in graph.ops:
        env[op.output] = evaluate_op(op, [env[n] for n in op.inputs]).to(
            TORCH_DTYPES[graph.tensor(op.output).dtype])
    if keep_all:
        return env
    return {name: env[name] for name in graph.outputs}


