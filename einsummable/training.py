"""`compile_train(module, args, loss_fn, targets, optimizer=..., lr=..., ...)`: one training
step planned over the devices as one graph, forward, backward and update
(`capture.trace_step`, `frontend/optim.py`), returned as a callable

    step = es.compile_train(module, (x,), loss_fn, (y,), optimizer="adamw", lr=1e-3)
    loss = step((x,), (y,))        # a float; module's parameters updated in place

whose updates equal torch.optim.SGD / AdamW's with the same hyperparameters. The plan is the
least simulated of the MIP's pool and the named strategies (`selection.choose_plan`); its
gradients are partial sums folded by the synthesised exchanges like any other (never an
all-reduce). The optimizer state lives in the step object, in the parameters' shapes, and
is fed to the ranks with the parameters every call.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .backend.lowering import lower
from .backend.runtime import run
from .errors import EinsummableError
from .frontend.capture import StepGraph, bind_step, trace_step
from .frontend.optim import Hyper, TrainGraph, with_update
from .selection.choose import choose_plan


class TrainStep:
    """A compiled training step (module docstring). `plan`, `lowered` and `train` (the
    TrainGraph) say what runs; `steps` counts the steps taken."""

    def __init__(self, module: torch.nn.Module, train: TrainGraph, plan: Any,
                 backend: str, n_args: int) -> None:
        self.module, self.train, self.plan, self.backend = module, train, plan, backend
        self.lowered = lower(plan)
        self.n_args = n_args
        self.steps = 0
        self._step = StepGraph(train.graph, train.loss, ())
        params = dict(module.named_parameters())
        self.dtype = next(iter(params.values())).dtype
        # the optimizer's state (what the update replaces that is not a parameter), zeros
        self.state: dict[str, torch.Tensor] = {
            name: torch.zeros(train.graph.tensor(name).shape, dtype=self.dtype)
            for name, _ in train.updates if name not in params}

    def __call__(self, args: Sequence[Any], targets: Sequence[Any]) -> float:
        args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
        targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
        if len(args) != self.n_args:
            raise EinsummableError(f"the step was compiled for {self.n_args} arguments, got "
                                   f"{len(args)}", fix="pass args and targets as two tuples")
        step = self.steps + 1
        scalars = {name: torch.tensor([value], dtype=self.dtype)
                   for name, value in self.train.scalar_values(step).items()}
        feed = bind_step(self._step, self.module, args, targets, {**self.state, **scalars})
        outs = run(self.lowered, feed, backend=self.backend)
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, out in self.train.updates:
                new = outs[out].reshape(feed[name].shape)
                if name in params:
                    params[name].copy_(new)
                else:
                    self.state[name] = new
        self.steps = step
        return float(outs[self.train.loss].reshape(()))


def compile_train(module: torch.nn.Module, args: Sequence[Any], loss_fn: Any,
                  targets: Sequence[Any], *, optimizer: str = "sgd", lr: float = 1e-3,
                  weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                  eps: float = 1e-8, topology: Any = "cpu4", backend: str = "gloo",
                  plan: Any = None) -> TrainStep:
    """Trace, plan and lower one training step (module docstring). `plan`: a Plan of the
    training graph to use instead of choosing one (e.g. a named strategy's)."""
    hyper = Hyper(optimizer, lr, weight_decay, tuple(betas), eps)
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    train = with_update(trace_step(module, args, loss_fn, targets), hyper)
    if plan is None:
        plan = choose_plan(train.graph, topology)
    return TrainStep(module, train, plan, backend, len(args))
