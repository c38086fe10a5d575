"""The optimizer's update as join ops: a step graph (`capture.trace_step`) becomes a training
graph whose outputs are the loss, the updated parameters and the updated optimizer state.

Every update is elementwise over a parameter's modes, so each is one join with no
aggregation, split however the parameter is. For a parameter p with gradient g (torch.optim's
rules, PyTorch 2.x, no momentum for SGD, no amsgrad for AdamW):

    SGD     p' = p - lr (g + wd p)
    AdamW   m' = b1 m + (1 - b1) g
            v' = b2 v + (1 - b2) g g
            p' = p (1 - lr wd) - s1 m' / (sqrt(v') s2 + eps),
            s1 = lr / (1 - b1^t),  s2 = 1 / sqrt(1 - b2^t)   at step t = 1, 2, ...

s1 and s2 change every step, so they are inputs of one element (`TrainGraph.scalars`), and
one plan serves every step; lr, wd, b1, b2 and eps are fixed when the graph is built. The
state m and v are inputs of kind "weight" named "<param>.exp_avg" and "<param>.exp_avg_sq",
laid out by the plan like the parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import PlanError
from .capture import StepGraph
from .ir import Graph, Op, TensorInfo, make_op
from .scalar import Expr, arg, call

OPTIMIZERS = ("sgd", "adamw")
STEP_SIZE, INV_SQRT_BC2 = "adamw.step_size", "adamw.inv_sqrt_bias_correction2"
STATE = ("exp_avg", "exp_avg_sq")
MODES = "abcdefghijklmnopqrstuvwxy"  # a parameter's modes; "z" is a scalar's


@dataclass(frozen=True)
class Hyper:
    """The update's fixed hyperparameters (torch.optim's names and defaults)."""
    optimizer: str
    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"unknown optimizer {self.optimizer!r}",
                            fix=f"use one of: {', '.join(OPTIMIZERS)}")
        for name, v in (("lr", self.lr), ("weight_decay", self.weight_decay),
                        ("eps", self.eps), *zip(("beta1", "beta2"), self.betas)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise PlanError(f"{name} must be a finite number >= 0, got {v!r}",
                                fix=f"pass e.g. {name}=0.01")
        if not all(b < 1 for b in self.betas):
            raise PlanError(f"betas must be below 1, got {self.betas}", fix="e.g. (0.9, 0.999)")


@dataclass(frozen=True)
class TrainGraph:
    """A training step with its update: `graph`'s outputs are the loss, then per parameter
    its new value and (AdamW) new state, named in `updates` as (input, output) pairs: the
    parameter or state tensor and what replaces it after the step (also `graph.carried`, so
    a plan prices handing them on to the next step's layout)."""
    graph: Graph
    loss: str
    updates: tuple[tuple[str, str], ...]
    hyper: Hyper
    scalars: tuple[str, ...] = ()

    def scalar_values(self, step: int) -> dict[str, float]:
        """The one-element inputs at step `step` (1 for the first)."""
        if self.hyper.optimizer != "adamw":
            return {}
        b1, b2 = self.hyper.betas
        return {STEP_SIZE: self.hyper.lr / (1 - b1 ** step),
                INV_SQRT_BC2: 1 / math.sqrt(1 - b2 ** step)}


def with_update(step: StepGraph, hyper: Hyper) -> TrainGraph:
    """The step graph with `hyper`'s update appended (module docstring)."""
    g = step.graph
    tensors = list(g.tensors)
    ops: list[Op] = list(g.ops)
    shapes = {t.name: t.shape for t in tensors}
    updates: list[tuple[str, str]] = []
    scalars: tuple[str, ...] = ()

    def add(name: str, shape: tuple[int, ...], dtype: str, kind: str = "intermediate") -> str:
        tensors.append(TensorInfo(name, shape, dtype, kind, "optimizer update"))
        shapes[name] = shape
        return name

    def join(name: str, inputs: list[str], expr: Expr, dtype: str) -> str:
        """An elementwise join over the first input's modes; a one-element scalar input
        broadcasts through a mode of size one."""
        letters = MODES[:len(shapes[inputs[0]])]
        subs = ["z" if i in scalars else letters for i in inputs]
        out = add(name, shapes[inputs[0]], dtype)
        ops.append(make_op(name, ",".join(subs) + "->" + letters, inputs, out, shapes,
                           join=expr, source="optimizer update"))
        return out

    if hyper.optimizer == "adamw":
        dtype = g.tensor(step.grads[0][1]).dtype if step.grads else "float32"
        scalars = (add(STEP_SIZE, (1,), dtype, "input"), add(INV_SQRT_BC2, (1,), dtype, "input"))
    lr, wd, eps = hyper.lr, hyper.weight_decay, hyper.eps
    b1, b2 = hyper.betas
    p, gr = arg(0), arg(1)
    for param, grad in step.grads:
        info = g.tensor(param)
        if g.tensor(grad).shape != info.shape:
            raise PlanError(f"the gradient of {param} has shape {g.tensor(grad).shape}, the "
                            f"parameter {info.shape}", fix="report this capture as a bug")
        if hyper.optimizer == "sgd":
            new = join(f"{param}.updated", [param, grad], p - lr * (gr + wd * p), info.dtype)
            updates.append((param, new))
            continue
        m_in = add(f"{param}.{STATE[0]}", info.shape, info.dtype, "weight")
        v_in = add(f"{param}.{STATE[1]}", info.shape, info.dtype, "weight")
        m_new = join(f"{m_in}.updated", [m_in, grad], b1 * p + (1 - b1) * gr, info.dtype)
        v_new = join(f"{v_in}.updated", [v_in, grad], b2 * p + (1 - b2) * gr * gr,
                     info.dtype)
        # args: p, m', v', s1, s2 (as x0, x1, x2, x3, x4)
        step_expr = p * (1 - lr * wd) - arg(3) * gr / (call("sqrt", arg(2)) * arg(4) + eps)
        new = join(f"{param}.updated", [param, m_new, v_new, *scalars], step_expr, info.dtype)
        updates += [(param, new), (m_in, m_new), (v_in, v_new)]
    outputs = (step.loss,) + tuple(out for _, out in updates)
    graph = Graph(tuple(tensors), tuple(ops), outputs, g.constants, tuple(updates))
    return TrainGraph(graph, step.loss, tuple(updates), hyper, scalars)
