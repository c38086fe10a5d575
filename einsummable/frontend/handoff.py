"""Which outputs a graph hands on to which of its inputs, and which of its tensors stream.

A stackable block hands its output on as the next block's input (steady state); a training
step hands its new parameters and optimizer state on as the next step's (`Graph.carried`);
and a training step's gradients, which nothing but an optimizer update waits for, can leave
as soon as they are computed.
"""
from __future__ import annotations

from .ir import Graph


def fed_back(graph: Graph, steady: bool) -> dict[str, str]:
    """Output -> the input it is handed on as: the carried pairs, and with steady state the
    block's (`steady_pairs`)."""
    pairs = graph.carried + (steady_pairs(graph) if steady else ())
    return {y: x for x, y in pairs}


def streamed_gradients(graph: Graph) -> dict[str, str]:
    """Tensor -> the update op that reads it first, for every tensor the step computes (a
    gradient) whose first reader makes a carried output (an optimizer update) while its
    producer does not. Nothing else in the call waits for an update, so the exchange of such
    a tensor can start as soon as it is computed and run behind the rest of the backward."""
    carried = {y for _, y in graph.carried}
    out: dict[str, str] = {}
    for op in graph.ops:
        if op.output not in carried:
            continue
        for name in dict.fromkeys(op.inputs):
            producer = graph.producer(name)
            if (producer is not None and producer.output not in carried
                    and graph.consumers(name)[0] is op):
                out[name] = op.name
    return out


def steady_pairs(graph: Graph) -> tuple[tuple[str, str], ...]:
    """(block input, block output) pairs of a stackable block: each activation input with the
    first unpaired output of its shape and dtype, which the next block reads in its place
    (steady state: the output is handed on in the layout the input arrived in)."""
    carried = {y for _, y in graph.carried}
    outs = [y for y in graph.outputs if y not in carried]
    pairs = []
    for t in graph.inputs:
        if t.kind != "input":
            continue
        for y in outs:
            info = graph.tensor(y)
            if info.shape == t.shape and info.dtype == t.dtype and graph.producer(y):
                pairs.append((t.name, y))
                outs.remove(y)
                break
    return tuple(pairs)
