"""The join-agg IR: tensors, ops, graphs, and the einsum-string parser.

An op computes

    out[O] = AGG over A of JOIN(in_1[I_1], ..., in_k[I_k]),     modes M = O ∪ A

Every tensor dimension of an operand (or of the output) is a *group* of one or more modes,
outermost first. Ordinary ops have one mode per dimension; a reshape is an op whose input (or
output) dimension groups several modes, e.g. ``bs(he)->bshe`` splits ``d`` into heads ``h`` and
head width ``e``. A mode of size 1 that is absent from the output broadcasts (it is reduced over
a single element, which changes nothing), so broadcasting needs no special case.

Fused ops (``fused`` set) name a kernel from `kernels.py` instead of a join; ``splittable``
lists the modes their kernel lets a decomposition split.

A windowed op (convolution, pooling: `conv_kernels.py`) reads an input dimension through a
`Window` (`windows.py`): that dimension's mode is never split, and a tuple reads the window of
its output block's range of the window's output mode instead.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Sequence

from ..errors import (
    DTypeError,
    EinsummableError,
    EinsumParseError,
    ShapeError,
    UnknownFunctionError,
)
from .einsum import Dims, dims_shape, dims_to_str, flat_modes, parse_einsum
from . import attention_grad  # noqa: F401  (registers the attention backward's kernel)
from .conv_kernels import WINDOWED_KERNELS
from .kernels import KERNELS
from .scalar import Expr, check_aggregation
from .windows import Window, check_window

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}
TENSOR_KINDS = ("input", "weight", "constant", "intermediate")


def check_dtype(dtype: str, where: str = "") -> str:
    if dtype not in DTYPE_BYTES:
        raise DTypeError(f"unknown dtype {dtype!r}{' for ' + where if where else ''}",
                         fix=f"use one of: {', '.join(DTYPE_BYTES)}")
    return dtype


# --------------------------------------------------------------------------- einsum strings


# --------------------------------------------------------------------------- tensors and ops

@dataclass(frozen=True)
class Constant:
    """A graph input every device can generate locally: no owner, never sent.

    kind: "causal_mask" (0 on and below the diagonal, -inf above; shape (q, k)), "fill"
    (every element is values[0]),
    "literal" (values given row-major in `values`), "diagonal" (a mask along q - k over
    shape (q, k): `values` = (d_0, v_0, d_1, v_1, ...), v_i where d_i <= q - k < d_{i+1}, v_0
    below d_0), "rope_cos"/"rope_sin" (value tables of a
    rotary embedding with base `theta`, shape (seq, head_dim)), "rotate_half" ((2, 2) matrix
    that maps the halves (x1, x2) to (-x2, x1)).
    """

    kind: str
    values: tuple[float, ...] = ()
    theta: float = 10000.0


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    kind: str = "intermediate"
    source: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Op:
    """One join-agg (or fused) op. Sizes are per mode; dims group modes per tensor dimension."""

    name: str
    inputs: tuple[str, ...]
    in_dims: tuple[Dims, ...]
    output: str
    out_dims: Dims
    sizes: tuple[tuple[str, int], ...]
    join: Expr | None = None
    agg: str | None = None
    fused: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    splittable: frozenset[str] | None = None
    source: str | None = None
    windows: tuple[Window, ...] = ()

    @cached_property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    @cached_property
    def out_modes(self) -> tuple[str, ...]:
        return flat_modes(self.out_dims)

    @cached_property
    def modes(self) -> tuple[str, ...]:
        """Output modes first, then the others in order of appearance (canonical order)."""
        seen = list(self.out_modes)
        for dims in self.in_dims:
            for m in flat_modes(dims):
                if m not in seen:
                    seen.append(m)
        return tuple(seen)

    @cached_property
    def agg_modes(self) -> tuple[str, ...]:
        """Modes that are folded by the aggregation (size-1 broadcast modes included)."""
        return tuple(m for m in self.modes if m not in self.out_modes)

    @cached_property
    def param(self) -> dict[str, Any]:
        return dict(self.params)

    @cached_property
    def window(self) -> dict[str, Window]:
        """Windowed input mode -> its window."""
        return {w.mode: w for w in self.windows}

    def share(self, ranges: Sequence[tuple[int, int]]) -> float:
        """The share of the join space a tuple with these ranges (canonical mode order) covers:
        a windowed mode's range follows its output mode's, so it is not counted again."""
        share = 1.0
        for m, (lo, hi) in zip(self.modes, ranges):
            if m not in self.window:
                share *= (hi - lo) / self.size[m]
        return share

    def can_split(self, mode: str) -> bool:
        if mode in self.window:
            return False
        if self.splittable is not None and mode not in self.splittable:
            return False
        return self.size[mode] > 1

    @property
    def is_view(self) -> bool:
        """Reshape / permute / squeeze: no arithmetic, only a change of layout."""
        return (self.fused is None and self.agg is None and len(self.inputs) == 1
                and self.join is not None and self.join.is_arg(0))

    @property
    def einsum(self) -> str:
        return ",".join(dims_to_str(d) for d in self.in_dims) + "->" + dims_to_str(self.out_dims)

    @cached_property
    def flops(self) -> int:
        """Scalar operations: elements of the join space × (join ops + one fold when aggregating)."""
        if self.fused is not None:
            return KERNELS[self.fused].flops(self)
        if self.is_view:
            return 0
        points = math.prod(self.size.values())
        folds = 1 if self.agg is not None and any(self.size[m] > 1 for m in self.agg_modes) else 0
        return points * (self.join.calls + folds)

    def describe(self) -> str:
        what = f"fused:{self.fused}" if self.fused else f"join={self.join} agg={self.agg}"
        return f"{self.name}: {self.output} = [{self.einsum}] {what}({', '.join(self.inputs)})"

    def error_context(self) -> dict[str, str | None]:
        return {"op": self.name, "source": self.source}


def validate_op(op: Op, shapes: dict[str, tuple[int, ...]]) -> None:
    """Check an op against its tensors' shapes; raise with the op's name, source and a fix."""
    ctx = op.error_context()
    if len(op.inputs) != len(op.in_dims):
        raise ShapeError(f"{len(op.inputs)} inputs but {len(op.in_dims)} operand mode strings",
                         **ctx, fix="give one operand per input in the einsum string")
    for m, s in op.sizes:
        if not isinstance(s, int) or s < 1:
            raise ShapeError(f"mode {m!r} has size {s!r}", **ctx, fix="sizes are positive integers")
    missing = [m for m in op.modes if m not in op.size]
    if missing:
        raise ShapeError(f"modes {missing} have no size", **ctx)
    for name, dims in zip(op.inputs, op.in_dims):
        want = dims_shape(dims, op.size)
        if tuple(shapes[name]) != want:
            raise ShapeError(f"input {name!r} has shape {tuple(shapes[name])} but [{op.einsum}] "
                             f"with the op's mode sizes needs {want}", **ctx,
                             fix="mode sizes must agree across operands; check the einsum string "
                                 "and the operand order")
    in_modes = {m for d in op.in_dims for m in flat_modes(d)} | {w.out for w in op.windows}
    for m in op.out_modes:
        if m not in in_modes and op.size[m] != 1:
            raise ShapeError(f"output mode {m!r} of size {op.size[m]} appears in no input", **ctx)
    for win in op.windows:
        check_window(win, op.size, op.name, op.source)
    if op.windows and op.fused not in WINDOWED_KERNELS:
        raise EinsummableError(f"kernel {op.fused!r} does not read windows", **ctx,
                               fix=f"windowed ops run one of: {', '.join(WINDOWED_KERNELS)}")
    if op.fused is not None:
        if op.fused not in KERNELS:
            raise UnknownFunctionError(f"unknown fused kernel {op.fused!r}", **ctx,
                                       fix=f"use one of: {', '.join(sorted(KERNELS))}")
        return
    if op.join is None:
        raise EinsummableError("a join-agg op needs a join function", **ctx)
    check_aggregation(op.agg)
    if op.join.arity > len(op.inputs):
        raise ShapeError(f"join {op.join} reads x{op.join.arity - 1} but the op has "
                         f"{len(op.inputs)} inputs", **ctx)
    if op.agg is None:
        wide = [m for m in op.agg_modes if op.size[m] > 1]
        if wide:
            raise ShapeError(f"modes {wide} are not in the output, so they must be aggregated",
                             **ctx, fix="give an aggregation (sum, max, min, prod) or keep the "
                                        "modes in the output")


@dataclass(frozen=True)
class Graph:
    """Tensors, ops in topological order, outputs, and generated constants. `carried`:
    (input x, output y) pairs of a graph run again and again on its own results, y being x's
    value at the next call (a training step's parameters and optimizer state): every call
    hands y on in the layout x is read in, so that hand-off is part of the call's work."""

    tensors: tuple[TensorInfo, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    constants: tuple[tuple[str, Constant], ...] = ()
    carried: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for t in self.tensors:
            if t.name in seen:
                raise ShapeError(f"tensor {t.name!r} is defined twice")
            check_dtype(t.dtype, t.name)
            seen.add(t.name)
        shapes = {t.name: t.shape for t in self.tensors}
        defined = {t.name for t in self.tensors if t.kind != "intermediate"}
        for op in self.ops:
            for name in op.inputs:
                if name not in defined:
                    raise EinsummableError(f"input {name!r} is used before it is produced",
                                           **op.error_context(), fix="list ops in topological order")
            if op.output not in shapes:
                raise EinsummableError(f"output {op.output!r} has no tensor", **op.error_context())
            validate_op(op, shapes)
            want = dims_shape(op.out_dims, op.size)
            if tuple(shapes[op.output]) != want:
                raise ShapeError(f"output {op.output!r} has shape {shapes[op.output]} but the op "
                                 f"makes {want}", **op.error_context())
            defined.add(op.output)
        for name in self.outputs:
            if name not in defined:
                raise EinsummableError(f"graph output {name!r} is never produced")
        for name, _ in self.constants:
            if name not in shapes or self.tensor(name).kind != "constant":
                raise EinsummableError(f"constant {name!r} needs a tensor of kind 'constant'")
        self._check_carried()

    def _check_carried(self) -> None:
        """A named error unless each carried pair is an input and an output of one shape and
        dtype, each named once."""
        by = {t.name: t for t in self.tensors}
        xs = [x for x, _ in self.carried]
        ys = [y for _, y in self.carried]
        if len(set(xs)) != len(xs) or len(set(ys)) != len(ys):
            raise EinsummableError("a carried input or output is named twice",
                                   fix="pair each input with one output")
        for x, y in self.carried:
            if x not in by or by[x].kind in ("intermediate", "constant"):
                raise EinsummableError(f"carried input {x!r} is not an input of the graph",
                                       fix="pair each output with one of the graph's inputs")
            if y not in self.outputs:
                raise EinsummableError(f"carried output {y!r} is not an output of the graph",
                                       fix="pair each input with one of the graph's outputs")
            if (by[x].shape, by[x].dtype) != (by[y].shape, by[y].dtype):
                raise EinsummableError(
                    f"output {y!r} ({by[y].shape}, {by[y].dtype}) cannot stand for input {x!r} "
                    f"({by[x].shape}, {by[x].dtype}) next call", fix="pair tensors of one "
                    "shape and dtype")

    @cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def _producer(self) -> dict[str, Op]:
        return {op.output: op for op in self.ops}

    @cached_property
    def _consumers(self) -> dict[str, tuple[Op, ...]]:
        out: dict[str, list[Op]] = {}
        for op in self.ops:
            for name in dict.fromkeys(op.inputs):
                out.setdefault(name, []).append(op)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def constant(self) -> dict[str, Constant]:
        return dict(self.constants)

    def tensor(self, name: str) -> TensorInfo:
        return self._by_name[name]

    @cached_property
    def _op_by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    def op(self, name: str) -> Op:
        return self._op_by_name[name]

    def producer(self, tensor: str) -> Op | None:
        return self._producer.get(tensor)

    def consumers(self, tensor: str) -> tuple[Op, ...]:
        return self._consumers.get(tensor, ())

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        """Every tensor the caller feeds: activations and weights (constants are generated)."""
        return tuple(t for t in self.tensors if t.kind in ("input", "weight"))

    @property
    def weights(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors if t.kind == "weight")

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def bytes(self) -> int:
        """Bytes every op reads and writes once, summed: the memory traffic at no reuse."""
        return sum(sum(self.tensor(n).nbytes for n in op.inputs) + self.tensor(op.output).nbytes
                   for op in self.ops)

    def with_dtype(self, dtype: str) -> "Graph":
        check_dtype(dtype)
        tensors = tuple(TensorInfo(t.name, t.shape, dtype, t.kind, t.source) for t in self.tensors)
        return Graph(tensors, self.ops, self.outputs, self.constants, self.carried)

    # ----------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        out = {
            "tensors": [[t.name, list(t.shape), t.dtype, t.kind, t.source] for t in self.tensors],
            "ops": [_op_to_dict(op) for op in self.ops],
            "outputs": list(self.outputs),
            "constants": [[n, c.kind, list(c.values), c.theta] for n, c in self.constants],
        }
        if self.carried:  # absent otherwise, so a graph without them keeps its digest
            out["carried"] = [list(p) for p in self.carried]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "Graph":
        tensors = tuple(TensorInfo(n, tuple(s), d, k, src) for n, s, d, k, src in data["tensors"])
        consts = tuple((n, Constant(k, tuple(v), th)) for n, k, v, th in data["constants"])
        return Graph(tensors, tuple(_op_from_dict(o) for o in data["ops"]),
                     tuple(data["outputs"]), consts,
                     tuple((x, y) for x, y in data.get("carried", ())))

    @staticmethod
    def from_json(text: str) -> "Graph":
        return Graph.from_dict(json.loads(text))

    def summary(self) -> str:
        lines = [f"{len(self.ops)} ops, {self.flops / 1e9:.3f} GFLOP, {self.bytes / 1e6:.1f} MB moved"]
        lines += ["  " + op.describe() for op in self.ops]
        return "\n".join(lines)


def _op_to_dict(op: Op) -> dict[str, Any]:
    return {
        "name": op.name, "inputs": list(op.inputs),
        "einsum": op.einsum, "output": op.output, "sizes": [[m, s] for m, s in op.sizes],
        "join": op.join.to_json() if op.join is not None else None, "agg": op.agg,
        "fused": op.fused, "params": [[k, v] for k, v in op.params],
        "splittable": sorted(op.splittable) if op.splittable is not None else None,
        "source": op.source,
        # Only windowed ops carry the key: every other graph's JSON (and cache key) is as before.
        **({"windows": [w.to_json() for w in op.windows]} if op.windows else {}),
    }


def _op_from_dict(d: dict[str, Any]) -> Op:
    in_dims, out_dims = parse_einsum(d["einsum"], strict=False)
    return Op(d["name"], tuple(d["inputs"]), in_dims, d["output"], out_dims,
              tuple((m, int(s)) for m, s in d["sizes"]),
              Expr.from_json(d["join"]) if d["join"] is not None else None, d["agg"],
              d["fused"], tuple((k, v) for k, v in d["params"]),
              frozenset(d["splittable"]) if d["splittable"] is not None else None, d["source"],
              tuple(Window.from_json(w) for w in d.get("windows", ())))


def make_op(name: str, einsum: str, inputs: Sequence[str], output: str,
            shapes: dict[str, tuple[int, ...]], *, join: Expr | None = None, agg: str | None = None,
            fused: str | None = None, params: Iterable[tuple[str, Any]] = (),
            splittable: Iterable[str] | None = None, source: str | None = None,
            out_sizes: dict[str, int] | None = None, strict: bool = True) -> Op:
    """Build an op from an einsum string, inferring mode sizes from the input shapes.

    Grouped dims need the sizes of all but one of their modes: give them in `out_sizes`.
    """
    try:
        in_dims, out_dims = parse_einsum(einsum, strict=strict)
    except EinsumParseError as e:
        raise EinsumParseError(str(e), op=name, source=source) from None
    size: dict[str, int] = dict(out_sizes or {})
    for tname, dims in zip(inputs, in_dims):
        shape = shapes[tname]
        if len(shape) != len(dims):
            raise ShapeError(f"input {tname!r} has rank {len(shape)} but operand "
                             f"'{dims_to_str(dims)}' of [{einsum}] has {len(dims)} dims",
                             op=name, source=source, fix="name one mode per dimension")
        for g, extent in zip(dims, shape):
            unknown = [m for m in g if m not in size]
            known = math.prod(size[m] for m in g if m in size)
            if len(unknown) == 1:
                if extent % known:
                    raise ShapeError(f"dimension of size {extent} does not split by {known}",
                                     op=name, source=source)
                size[unknown[0]] = extent // known
            elif len(unknown) > 1:
                raise ShapeError(f"group ({''.join(g)}) has {len(unknown)} modes of unknown size",
                                 op=name, source=source, fix="pass their sizes in out_sizes")
            elif known != extent:
                mode_list = ", ".join(f"{m}={size[m]}" for m in g)
                raise ShapeError(f"mode sizes disagree: input {tname!r} has extent {extent} where "
                                 f"[{einsum}] already fixed {mode_list}", op=name, source=source,
                                 fix="check the operand order and shapes")
    for g in out_dims:
        for m in g:
            size.setdefault(m, 1)
    modes: list[str] = []
    for dims in (out_dims, *in_dims):
        for m in flat_modes(dims):
            if m not in modes:
                modes.append(m)
    sizes = tuple((m, size[m]) for m in modes)
    return Op(name, tuple(inputs), in_dims, output, out_dims, sizes, join, agg, fused,
              tuple(params), frozenset(splittable) if splittable is not None else None, source)
