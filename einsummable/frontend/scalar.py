"""Join functions as small expression trees, and the aggregations that fold them.

A join function maps the k sub-tensors of one tuple to one sub-tensor, elementwise after
broadcasting. It is an `Expr`: a leaf is an argument (`arg(i)`) or a constant; an inner node
is a named function from `FUNCTIONS`. Expressions are plain frozen data, so they hash, compare,
print and round-trip through JSON; `evaluate` turns one into torch calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..errors import UnknownFunctionError

TorchFn = Callable[..., torch.Tensor]


def _gelu_exact(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    """0 where x is NaN, x elsewhere: a fully masked softmax row (every score -inf) is 0."""
    return torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf"))


# name -> (arity, implementation). Arity -1 means "takes the constant `value` as exponent".
FUNCTIONS: dict[str, tuple[int, TorchFn]] = {
    "add": (2, torch.add),
    "sub": (2, torch.sub),
    "mul": (2, torch.mul),
    "div": (2, torch.div),
    "max": (2, torch.maximum),
    "min": (2, torch.minimum),
    "neg": (1, torch.neg),
    "abs": (1, torch.abs),
    "exp": (1, torch.exp),
    "log": (1, torch.log),
    "sqrt": (1, torch.sqrt),
    "rsqrt": (1, torch.rsqrt),
    "relu": (1, torch.relu),
    "silu": (1, torch.nn.functional.silu),
    "sigmoid": (1, torch.sigmoid),
    "tanh": (1, torch.tanh),
    "erf": (1, torch.erf),  # exact GELU's derivative: backward passes
    "cos": (1, torch.cos),
    "sin": (1, torch.sin),
    "gelu": (1, _gelu_exact),
    "gelu_tanh": (1, _gelu_tanh),
    "nan_to_zero": (1, _nan_to_zero),
    "pow": (1, torch.pow),  # exponent is the node's `value`
}

# Aggregation name -> (pairwise combine, reduction over dims). `None` means no aggregation.
AGGREGATIONS: dict[str, tuple[TorchFn, Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]]] = {
    "sum": (torch.add, lambda t, d: t.sum(dim=d)),
    "max": (torch.maximum, lambda t, d: t.amax(dim=d)),
    "min": (torch.minimum, lambda t, d: t.amin(dim=d)),
    "prod": (torch.mul, lambda t, d: _prod(t, d)),
}


def _prod(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        t = t.prod(dim=d)
    return t


@dataclass(frozen=True)
class Expr:
    """`fn` is "arg" (value = argument index), "const" (value = the number) or a FUNCTIONS name."""

    fn: str
    args: tuple["Expr", ...] = ()
    value: float | None = None

    def __post_init__(self) -> None:
        if self.fn in ("arg", "const"):
            if self.value is None or self.args:
                raise UnknownFunctionError(f"malformed leaf {self.fn!r}", fix="use arg(i) or const(v)")
            return
        if self.fn not in FUNCTIONS:
            raise UnknownFunctionError(
                f"unknown join function {self.fn!r}",
                fix=f"use one of: {', '.join(sorted(FUNCTIONS))}")
        arity = FUNCTIONS[self.fn][0]
        if len(self.args) != arity:
            raise UnknownFunctionError(
                f"join function {self.fn!r} takes {arity} argument(s), got {len(self.args)}")
        if self.fn == "pow" and self.value is None:
            raise UnknownFunctionError("pow needs a constant exponent", fix="call('pow', x, value=2.0)")

    # Python operators so join functions read like arithmetic.
    def __add__(self, o: "Expr | float") -> "Expr": return call("add", self, _lift(o))
    def __radd__(self, o: float) -> "Expr": return call("add", _lift(o), self)
    def __sub__(self, o: "Expr | float") -> "Expr": return call("sub", self, _lift(o))
    def __rsub__(self, o: float) -> "Expr": return call("sub", _lift(o), self)
    def __mul__(self, o: "Expr | float") -> "Expr": return call("mul", self, _lift(o))
    def __rmul__(self, o: float) -> "Expr": return call("mul", _lift(o), self)
    def __truediv__(self, o: "Expr | float") -> "Expr": return call("div", self, _lift(o))
    def __rtruediv__(self, o: float) -> "Expr": return call("div", _lift(o), self)
    def __neg__(self) -> "Expr": return call("neg", self)
    def __pow__(self, p: float) -> "Expr": return Expr("pow", (self,), float(p))

    def __str__(self) -> str:
        if self.fn == "arg":
            return f"x{int(self.value)}"
        if self.fn == "const":
            return repr(self.value)
        inner = ", ".join(str(a) for a in self.args)
        return f"{self.fn}({inner}, {self.value!r})" if self.fn == "pow" else f"{self.fn}({inner})"

    @property
    def arity(self) -> int:
        """Number of inputs the expression reads (1 + the largest argument index)."""
        if self.fn == "arg":
            return int(self.value) + 1
        return max((a.arity for a in self.args), default=0)

    @property
    def calls(self) -> int:
        """Scalar operations per output element: the FLOPs of one join, one per function node."""
        if self.fn in ("arg", "const"):
            return 0
        return 1 + sum(a.calls for a in self.args)

    def is_arg(self, i: int | None = None) -> bool:
        return self.fn == "arg" and (i is None or int(self.value) == i)

    def scaled_product(self) -> tuple[tuple[int, ...], float] | None:
        """(argument indices, constant factor) when the expression is c * x_i * x_j * ..."""
        if self.fn == "const":
            return (), float(self.value)
        if self.fn == "arg":
            return (int(self.value),), 1.0
        if self.fn in ("mul", "div"):
            left, right = self.args[0].scaled_product(), self.args[1].scaled_product()
            if left is None or right is None:
                return None
            if self.fn == "mul":
                return left[0] + right[0], left[1] * right[1]
            if not right[0] and right[1] != 0.0:  # division by a constant only
                return left[0], left[1] / right[1]
        return None

    def to_json(self) -> Any:
        if self.fn == "arg":
            return ["arg", int(self.value)]
        if self.fn == "const":
            return ["const", self.value]
        out: list[Any] = [self.fn, [a.to_json() for a in self.args]]
        if self.value is not None:
            out.append(self.value)
        return out

    @staticmethod
    def from_json(data: Any) -> "Expr":
        if data[0] == "arg":
            return arg(int(data[1]))
        if data[0] == "const":
            return const(float(data[1]))
        value = float(data[2]) if len(data) > 2 else None
        return Expr(data[0], tuple(Expr.from_json(a) for a in data[1]), value)


def arg(i: int) -> Expr:
    return Expr("arg", (), float(i))


def const(v: float) -> Expr:
    return Expr("const", (), float(v))


def call(fn: str, *args: Expr, value: float | None = None) -> Expr:
    return Expr(fn, tuple(args), value)


def _lift(o: "Expr | float") -> Expr:
    return o if isinstance(o, Expr) else const(float(o))


def evaluate(expr: Expr, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Evaluate on broadcast-compatible tensors; the result has the broadcast shape."""
    out = _eval(expr, inputs)
    if not isinstance(out, torch.Tensor):  # a join of constants only
        shape = torch.broadcast_shapes(*(t.shape for t in inputs)) if inputs else ()
        ref = inputs[0] if inputs else torch.empty(())
        return torch.full(shape, out, dtype=ref.dtype, device=ref.device)
    if inputs:
        shape = torch.broadcast_shapes(*(t.shape for t in inputs))
        if out.shape != shape:
            out = out.expand(shape)
    return out


def _eval(expr: Expr, inputs: Sequence[torch.Tensor]) -> torch.Tensor | float:
    if expr.fn == "arg":
        return inputs[int(expr.value)]
    if expr.fn == "const":
        return expr.value
    vals = [_eval(a, inputs) for a in expr.args]
    if expr.fn == "pow":
        base = vals[0]
        return base ** expr.value if not isinstance(base, torch.Tensor) else torch.pow(base, expr.value)
    if not any(isinstance(v, torch.Tensor) for v in vals):
        return float(FUNCTIONS[expr.fn][1](*(torch.tensor(v, dtype=torch.float64) for v in vals)))
    ref = next(v for v in vals if isinstance(v, torch.Tensor))
    if expr.fn in ("max", "min"):  # torch.maximum has no scalar overload
        vals = [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=ref.dtype) for v in vals]
    return FUNCTIONS[expr.fn][1](*vals)


def check_aggregation(agg: str | None) -> None:
    if agg is not None and agg not in AGGREGATIONS:
        raise UnknownFunctionError(
            f"unknown aggregation {agg!r}", fix=f"use one of: {', '.join(AGGREGATIONS)} or None")


def combine(agg: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Fold two partial results of the same output block."""
    return AGGREGATIONS[agg][0](a, b)


def reduce(agg: str, t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    return AGGREGATIONS[agg][1](t, dims) if dims else t


