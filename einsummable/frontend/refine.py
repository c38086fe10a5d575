"""A graph's ops read every tensor dim cut as its producer wrote it.

An op writes a dim as a group of modes (an eager grouped-query score matmul writes the head
dim as (key heads, group)); a reader of the tensor names that dim with one mode of its own.
`refine_modes` splits such a reader's mode m, read as one dim written with mode sizes
(s_1, ..., s_r), into r modes of those sizes wherever m occurs in the op: index m is the
row-major number of (m_1, ..., m_r), so every operand, the output and the aggregation mean
what they meant. The graph computes the same; fusion matches chains on it (`fuse.py`).
"""
from __future__ import annotations

import dataclasses
import math

from .einsum import flat_modes
from .ir import Graph, Op

# Mode letters for the modes a split adds.
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def refine_modes(graph: Graph) -> Graph:
    """The same graph, each plain op's modes split where a tensor it reads was written with
    a dim cut finer than the op reads it: a mode m read as one dim of sizes (s_1, ..., s_r)
    becomes r modes of those sizes, wherever m occurs in the op (row-major, so every
    operand, the output and the aggregation keep their meaning)."""
    cuts: dict[str, tuple[tuple[int, ...], ...]] = {}  # tensor -> per dim, its mode sizes
    ops = []
    for op in graph.ops:
        split: dict[str, tuple[int, ...]] = {}
        if op.fused is None:
            for name, dims in zip(op.inputs, op.in_dims):
                for g, written in zip(dims, cuts.get(name, ())):
                    cut = tuple(n for n in written if n > 1)
                    if len(g) == 1 and len(cut) > 1 and g[0] not in split \
                            and math.prod(cut) == op.size[g[0]]:
                        split[g[0]] = cut
        if split:
            op = _split_modes(op, split)
        cuts[op.output] = tuple(tuple(op.size[m] for m in g) for g in op.out_dims)
        ops.append(op)
    return Graph(graph.tensors, tuple(ops), graph.outputs, graph.constants, graph.carried)


def _split_modes(op: Op, split: dict[str, tuple[int, ...]]) -> Op:
    free = iter(c for c in LETTERS if c not in op.size)
    new = {m: tuple(next(free) for _ in cut) for m, cut in split.items()}
    sizes = dict(op.size)
    for m, cut in split.items():
        del sizes[m]
        sizes.update(zip(new[m], cut))

    def dims(d):
        return tuple(tuple(x for m in g for x in new.get(m, (m,))) for g in d)
    in_dims = tuple(dims(d) for d in op.in_dims)
    out_dims = dims(op.out_dims)
    order = dict.fromkeys([m for d in (out_dims, *in_dims) for m in flat_modes(d)] + list(sizes))
    return dataclasses.replace(op, in_dims=in_dims, out_dims=out_dims,
                               sizes=tuple((m, sizes[m]) for m in order))
