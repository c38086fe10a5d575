"""`compile(module, args, topology=..., backend=...)`: trace, plan, lower, and return a
callable with the module's signature whose outputs equal the module's. The plan is the least
simulated of the MIP's optimum and the named strategies (`selection.choose_plan`).

A graph can be passed instead of tracing (`graph=`, or a Graph as `module`), and a plan
instead of optimizing (`plan=`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .backend.lowering import lower
from .backend.runtime import run
from .errors import EinsummableError
from .frontend.capture import trace
from .frontend.ir import Graph
from .selection.choose import choose_plan


def compile(module: Any, args: Sequence[Any] = (), *, topology: Any = "cpu4",
            backend: str = "gloo", graph: Graph | None = None, mode: str = "optimized",
            plan: Any = None) -> Callable[..., Any]:
    """A callable `fn(*args)` computing the module's outputs with the plan on `backend`.

    Positional args map to the graph's activation inputs in order; weights are the module's
    named parameters (and buffers), read at every call so updated weights are seen."""
    if isinstance(module, Graph):
        graph, module = module, None
    if graph is None:
        graph = trace(module, args)
    if plan is None:
        plan = choose_plan(graph, topology)
    low = lower(plan, mode=mode)
    acts = [t.name for t in graph.inputs if t.kind == "input"]
    weights = [t.name for t in graph.weights]

    def fn(*call_args: Any, **named: torch.Tensor) -> Any:
        if len(call_args) != len(acts) and not named:
            raise EinsummableError(f"expected {len(acts)} positional inputs ({', '.join(acts)}), "
                                   f"got {len(call_args)}", fix="call with the traced signature")
        feed: dict[str, torch.Tensor] = dict(zip(acts, call_args))
        feed.update(named)
        if module is not None:
            params = {**dict(module.named_parameters()), **dict(module.named_buffers())}
            for w in weights:
                if w in params and w not in feed:
                    feed[w] = params[w].detach()
        missing = [w for w in weights if w not in feed]
        if missing:
            raise EinsummableError(f"no value for weights {missing}",
                                   fix="pass them by name, or compile the module they belong to")
        outs = run(low, feed, backend=backend)
        vals = [outs[name] for name in graph.outputs]
        return vals[0] if len(vals) == 1 else tuple(vals)

    fn.plan = plan  # type: ignore[attr-defined]
    fn.lowered = low  # type: ignore[attr-defined]
    fn.graph = graph  # type: ignore[attr-defined]
    return fn
