"""`compile(module, args, topology=..., backend=...)`: trace, optimize, lower, and return a
callable with the module's signature whose outputs equal the module's.

Tracing uses `einsummable.capture.trace` and planning `einsummable.optimize.optimize` when they
are installed. A graph can be passed instead of tracing (`graph=`, or a Graph as `module`), and
without the optimizer a greedy planner picks, op by op, the candidate with the least compute
plus exchange time from the layouts already chosen (the same cost terms the optimizer uses).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from .errors import EinsummableError
from .exchange import exchange_time, synthesize
from .ir import Graph, Op
from .lower import lower
from .placement import INPUT_PREFIX, Candidate, input_needs, input_op, output_layout, place
from .runtime import run
from .spec import decompositions


@dataclass(frozen=True)
class GreedyPlan:
    graph: Graph
    topology: Any
    choice: Mapping[str, Candidate]


def _compute_s(op: Op, cand: Candidate, topo, dtype: str) -> float:
    """Launch plus this device's share of the op's FLOPs at its peak rate."""
    dev = topo.devices[cand.devices[0][0]]
    return dev.launch_s + op.flops / len(cand.devices) / dev.peak(dtype)


def greedy_plan(graph: Graph, topology: Any) -> GreedyPlan:
    """Op by op, the candidate (canonical placement, n tuples or one) of least
    compute + incoming exchange time; inputs start whole on device 0, as a caller holds them."""
    from .topology import load_topology
    topo = load_topology(topology)
    n = topo.world_size
    devices = list(range(n))
    choice: dict[str, Candidate] = {}
    layouts: dict[str, tuple] = {}
    for info in graph.inputs:
        cand = place(input_op(info), {}, [0])
        choice[INPUT_PREFIX + info.name] = cand
        layouts[info.name] = (output_layout(input_op(info), cand), None)
    for op in graph.ops:
        best: tuple[float, Candidate] | None = None
        for dec in decompositions(op, n):
            if dec.n_tuples not in (1, n):
                continue
            cand = place(op, dec.part, devices if dec.n_tuples == n else [0])
            cost = _compute_s(op, cand, topo, graph.tensor(op.output).dtype)
            for i, name in enumerate(op.inputs):
                if name in layouts:
                    pieces, agg = layouts[name]
                    ex = synthesize(graph.tensor(name), pieces, input_needs(op, cand, i), agg,
                                    topo)
                    cost += exchange_time(ex, topo)
            if best is None or cost < best[0]:
                best = (cost, cand)
        assert best is not None
        choice[op.name] = best[1]
        layouts[op.output] = (output_layout(op, best[1]), op.agg)
    return GreedyPlan(graph, topo, choice)


def _trace(module: Any, args: Sequence[Any]) -> Graph:
    try:
        from .capture import trace  # type: ignore[attr-defined]
    except ImportError:
        raise EinsummableError("tracing nn.Modules needs einsummable.capture, which is not "
                               "installed", fix="pass graph=... (e.g. from the model's IR "
                                                "builder) or install the capture module") from None
    return trace(module, args)


def _plan(graph: Graph, topology: Any) -> Any:
    try:
        from .optimize import optimize  # type: ignore[import-not-found]
    except ImportError:
        return greedy_plan(graph, topology)
    return optimize(graph, topology)


def compile(module: Any, args: Sequence[Any] = (), *, topology: Any = "cpu4",
            backend: str = "gloo", graph: Graph | None = None, mode: str = "optimized",
            plan: Any = None) -> Callable[..., Any]:
    """A callable `fn(*args)` computing the module's outputs with the plan on `backend`.

    Positional args map to the graph's activation inputs in order; weights are the module's
    named parameters (and buffers), read at every call so updated weights are seen."""
    if isinstance(module, Graph):
        graph, module = module, None
    if graph is None:
        graph = _trace(module, args)
    if plan is None:
        plan = _plan(graph, topology)
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
