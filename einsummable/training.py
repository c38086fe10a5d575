"""`compile_train(module, args, loss_fn, targets, optimizer=..., lr=..., ...)`: one training
step planned over the devices as one graph, forward, backward and update
(`capture.trace_step`, `frontend/optim.py`), returned as a callable

    step = es.compile_train(module, (x,), loss_fn, (y,), optimizer="adamw", lr=1e-3)
    loss = step((x,), (y,))        # a float; module's parameters updated in place

whose updates equal torch.optim.SGD / AdamW's with the same hyperparameters. The plan is the
least simulated of the MIP's pool and the named strategies (`selection.choose_plan`); its
gradients are partial sums folded by the synthesised exchanges like any other (never an
all-reduce).

The optimizer state and the parameters stay on the ranks between calls, each rank holding
its blocks in the plan's layout (`backend/carry.py`: every updated tensor is handed on in
the layout its input arrives in and kept there, `Keep`). The state is placed once, zeros on
the first call, and never passes through the caller again; `step.optimizer_state()` gathers
it on request. The parameters also come back whole to rank 0 every call and are written
into the module in place, as torch.optim does; a parameter the caller changed between calls
(replaced, or written in place through it; torch does not count writes through `.data`) is
sent to the ranks again on the next call.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .backend.carry import Carry
from .backend.lowering import lower
from .backend.runtime import kept, run
from .backend.runtime.pool import Pools
from .errors import EinsummableError
from .frontend.capture import StepGraph, bind_step, trace_step
from .frontend.optim import Hyper, TrainGraph, with_update
from .selection.choose import choose_plan


class TrainStep:
    """A compiled training step (module docstring). `plan`, `lowered` and `train` (the
    TrainGraph) say what runs; `steps` counts the steps taken. With `resident` False, the
    state lives in `state`, full size, and every call feeds it and the parameters to the
    ranks and gathers them all back (what `resident` replaces; kept to measure it)."""

    def __init__(self, module: torch.nn.Module, train: TrainGraph, plan: Any,
                 backend: str, n_args: int, *, resident: bool = True,
                 pools: Pools | None = None) -> None:
        self.module, self.train, self.plan, self.backend = module, train, plan, backend
        self.n_args, self.resident, self.pools = n_args, resident, pools
        self.steps = 0
        self._step = StepGraph(train.graph, train.loss, ())
        params = dict(module.named_parameters())
        self.dtype = next(iter(params.values())).dtype
        # the optimizer's state: what the update replaces that is not a parameter
        self.state_names = tuple(name for name, _ in train.updates if name not in params)
        carry = Carry(train.updates, tuple(y for x, y in train.updates if x in params))
        self.lowered = lower(plan, carry=carry if resident else None)
        self._kept: dict = {}  # the local backend's kept blocks (rank -> blocks)
        # per parameter, (object, version, storage) as the last step wrote it: another value
        # there means the caller changed it, and it is sent to the ranks again
        self._written: dict[str, tuple[int, int, int]] = {}
        self.state: dict[str, torch.Tensor] = {} if resident else self._zeros()

    def _zeros(self) -> dict[str, torch.Tensor]:
        return {name: torch.zeros(self.train.graph.tensor(name).shape, dtype=self.dtype)
                for name in self.state_names}

    def __call__(self, args: Sequence[Any], targets: Sequence[Any]) -> float:
        args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
        targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
        if len(args) != self.n_args:
            raise EinsummableError(f"the step was compiled for {self.n_args} arguments, got "
                                   f"{len(args)}", fix="pass args and targets as two tuples")
        step = self.steps + 1
        scalars = {name: torch.tensor([value], dtype=self.dtype)
                   for name, value in self.train.scalar_values(step).items()}
        params = dict(self.module.named_parameters())
        state = self.state if not self.resident else self._zeros() if step == 1 else \
            dict.fromkeys(self.state_names)  # kept by the ranks: bound, then left out
        feed = bind_step(self._step, self.module, args, targets, {**state, **scalars})
        if self.resident and step > 1:
            for name in self.state_names:
                del feed[name]
            for name, p in params.items():
                if self._written.get(name) == _identity(p):
                    del feed[name]  # the ranks keep what the last step wrote
        outs = run(self.lowered, feed, backend=self.backend, resident=self._kept,
                   pools=self.pools)
        with torch.no_grad():
            for name, out in self.train.updates:
                if name in params:
                    params[name].copy_(outs[out].reshape(params[name].shape))
                    self._written[name] = _identity(params[name])
                elif not self.resident:
                    self.state[name] = outs[out].reshape(feed[name].shape)
        self.steps = step
        return float(outs[self.train.loss].reshape(()))

    def optimizer_state(self) -> dict[str, dict[str, Any]]:
        """Per parameter, its optimizer state as torch.optim keeps it ({"step", "exp_avg",
        "exp_avg_sq"} for AdamW; nothing for SGD), gathered from the ranks (CPU tensors)."""
        if not self.state_names:
            return {}
        if self.resident:
            if self.steps == 0:
                raise EinsummableError("the step has not run: no optimizer state yet",
                                       fix="take a step first")
            got = kept(self.lowered, self.state_names, self.backend, resident=self._kept,
                       pools=self.pools)
        else:
            got = self.state
        out: dict[str, dict[str, Any]] = {}
        for name in self.state_names:
            param, kind = name.rsplit(".", 1)
            shape = dict(self.module.named_parameters())[param].shape
            out.setdefault(param, {"step": self.steps})[kind] = got[name].reshape(shape).clone()
        return out


def _identity(p: torch.Tensor) -> tuple[int, int, int]:
    """What changes when a parameter's value is replaced or written in place through it (a
    write through `.data`, which torch does not count, is not seen)."""
    return id(p), p._version, p.data_ptr()


def compile_train(module: torch.nn.Module, args: Sequence[Any], loss_fn: Any,
                  targets: Sequence[Any], *, optimizer: str = "sgd", lr: float = 1e-3,
                  weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                  eps: float = 1e-8, topology: Any = "cpu4", backend: str = "gloo",
                  plan: Any = None, resident: bool = True, pools: Pools | None = None
                  ) -> TrainStep:
    """Trace, plan and lower one training step (module docstring). `plan`: a Plan of the
    training graph to use instead of choosing one (e.g. a named strategy's). `resident`:
    the optimizer state and parameters stay on the ranks between calls; `pools`: the worker
    pools of the gloo and nccl backends (by default the process's)."""
    hyper = Hyper(optimizer, lr, weight_decay, tuple(betas), eps)
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    train = with_update(trace_step(module, args, loss_fn, targets), hyper)
    if plan is None:
        plan = choose_plan(train.graph, topology)
    return TrainStep(module, train, plan, backend, len(args), resident=resident, pools=pools)
