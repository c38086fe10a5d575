"""A plan of one block as k blocks in a row: what steady state means, spelled out as a graph.

With steady state the optimizer prices one block of a stack: its input x arrives in the layout
the plan gives `input:x`, and its output y (x's pair, `handoff.steady_pairs`) is handed on in that
layout for the next block. `stack(graph, choice, k)` builds the program that statement is
about: blocks 0..k-1, block i's tensors renamed `b<i>.<name>` (block 0 keeps its names), block
i > 0 reading, in place of x, an identity view `b<i>.<x>` of block i-1's y whose candidate is
the plan's layout of x (so y crosses into that layout between the blocks, as priced). Every
op of every block takes the plan's candidate for it. The simulator's time of one block in
steady state is then T(k) - T(k - 1): the first block's cold start (weights not yet in flight
while the first ops run) is not part of it.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..errors import PlanError
from ..frontend.handoff import steady_pairs
from ..frontend.ir import Graph, Op, TensorInfo
from .placement import INPUT_PREFIX, Candidate, input_op

BLOCK_PREFIX = "b{}."


def _rename(name: str, block: int) -> str:
    return name if block == 0 else BLOCK_PREFIX.format(block) + name


def stack(graph: Graph, choice: Mapping[str, Candidate], k: int
          ) -> tuple[Graph, dict[str, Candidate]]:
    """The graph of k blocks and the choice that runs each block as `choice` runs one."""
    pairs = steady_pairs(graph)
    if not pairs:
        raise PlanError("stacking needs a block output shaped like an activation input",
                        fix="stack only graphs optimized with steady_state=True")
    if k < 1:
        raise PlanError(f"a stack needs at least one block, got {k}", fix="pass k >= 1")
    fed = dict(pairs)  # x -> y
    tensors: list[TensorInfo] = []
    ops: list[Op] = []
    out: dict[str, Candidate] = {}
    for block in range(k):
        name = lambda n: _rename(n, block)  # noqa: E731 - one renaming rule per block
        for t in graph.tensors:
            kind = "intermediate" if block and t.name in fed else t.kind
            tensors.append(TensorInfo(name(t.name), t.shape, t.dtype, kind, t.source))
        if block:
            for x, y in fed.items():  # x := view of the previous block's y, in x's layout
                view = input_op(graph.tensor(x))
                ops.append(dataclasses.replace(view, name=name(x), output=name(x),
                                               inputs=(_rename(y, block - 1),)))
                out[name(x)] = choice[INPUT_PREFIX + x]
        for op in graph.ops:
            ops.append(dataclasses.replace(op, name=name(op.name), output=name(op.output),
                                           inputs=tuple(name(i) for i in op.inputs)))
            out[name(op.name)] = choice[op.name]
        for t in graph.inputs:
            if not (block and t.name in fed):
                out[INPUT_PREFIX + name(t.name)] = choice[INPUT_PREFIX + t.name]
    outputs = tuple(_rename(y, k - 1) for y in graph.outputs)
    consts = tuple((_rename(n, b), c) for b in range(k) for n, c in graph.constants)
    return Graph(tuple(tensors), tuple(ops), outputs, consts), out
