"""Repeated blocks: ops at the same position of structurally identical consecutive blocks
choose alike (tie_g: x[v,c] = x[v',c] in the MIP), which shrinks the search without losing
the optimum of a stack whose blocks see the same inputs and outputs."""
from __future__ import annotations

from typing import Mapping

from ..frontend.ir import Graph
from ..planning.candidates import OpCandidates, structural
from ..planning.placement import INPUT_PREFIX

MIN_TIE_PERIOD = 4  # ops per repeated block; shorter periods are patterns inside one block


def repeats(graph: Graph) -> tuple[tuple[str, ...], ...]:
    """Groups of ops at the same position of structurally identical consecutive blocks."""
    ops = graph.ops
    index = {op.output: i for i, op in enumerate(ops)}
    sigs = []
    for i, op in enumerate(ops):
        refs = []
        for name in op.inputs:
            t = graph.tensor(name)
            if name in index:
                refs.append(("op", i - index[name]))
            elif t.kind == "weight":
                refs.append(("w", t.shape, t.dtype))
            else:
                refs.append(("x", name))
        sigs.append((structural(op), tuple(refs)))
    n = len(ops)
    best = (0, 0, 0, 0)  # coverage, -period, start, count
    for p in range(MIN_TIE_PERIOD, n // 2 + 1):
        i = 0
        while i + p < n:
            if sigs[i] != sigs[i + p]:
                i += 1
                continue
            j = i
            while j + p < n and sigs[j] == sigs[j + p]:
                j += 1
            count = (j - i + p) // p
            if count >= 2 and (count * p, -p) > best[:2]:
                best = (count * p, -p, i, count)
            i = j + 1
    cover, neg_p, start, count = best
    if not cover:
        return ()
    p = -neg_p
    return tuple(tuple(ops[start + k * p + j].name for k in range(count)) for j in range(p))


def tie_groups(graph: Graph, nodes: Mapping[str, OpCandidates]) -> tuple[tuple[str, ...], ...]:
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        while parent.get(a, a) != a:
            a = parent[a]
        return a

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for group in repeats(graph):
        ops = [graph.op(n) for n in group]
        for op in ops[1:]:
            union(ops[0].name, op.name)
        for i, name in enumerate(ops[0].inputs):
            if graph.tensor(name).kind == "weight":
                for op in ops[1:]:
                    other = op.inputs[i]
                    if graph.tensor(other).kind == "weight" and other != name:
                        union(INPUT_PREFIX + name, INPUT_PREFIX + other)
    members: dict[str, list[str]] = {}
    for k in nodes:
        members.setdefault(find(k), []).append(k)
    out = []
    for group in members.values():
        if len(group) < 2:
            continue
        first = nodes[group[0]]
        if all(nodes[k].cands == first.cands for k in group):  # same options, same order
            out.append(tuple(group))
    return tuple(out)

