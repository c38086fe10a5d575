"""Memory (liveness model). Ops run in graph order t = 0..T-1. A tensor is live from the step that
produces it (graph inputs: from the start) through its last reader (graph outputs: to the end);
weights are live throughout. At step t device d holds every live tensor's pieces on d (replicas
and partial slices count in full) plus the input blocks op t gathers on d. This gives one row per
(device, step); rows that no choice can violate are dropped before solving.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..frontend.ir import Graph
from ..planning.candidates import OpCandidates
from ..planning.cost import consumer_needs, needs_bytes, resident_bytes
from .memo import BuildMemo


def _liveness(graph: Graph, nodes: Mapping[str, OpCandidates]) -> dict[str, tuple[int, int]]:
    steps = max(1, len(graph.ops))
    step_of = {op.name: i for i, op in enumerate(graph.ops)}
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            last[name] = i
    for y in graph.outputs:
        last[y] = steps - 1
    live = {}
    for k, oc in nodes.items():
        info = graph.tensor(oc.op.output)
        first = step_of.get(k, 0)
        end = steps - 1 if info.kind == "weight" else last.get(oc.op.output, first)
        live[k] = (first, max(first, end))
    return live


def _node_bytes(graph: Graph, oc: OpCandidates, layouts: Sequence, n: int, is_op: bool):
    """Per candidate: bytes held per device, and bytes gathered per device at its own step."""
    info = graph.tensor(oc.op.output)
    held = [resident_bytes(l, info.dtype, n) for l in layouts]
    gathered = []
    for c in oc.cands:
        tot = [0] * n
        if is_op:
            for name in dict.fromkeys(oc.op.inputs):
                t = graph.tensor(name)
                for d, b in enumerate(needs_bytes(consumer_needs(oc.op, c, name), t.dtype, n)):
                    tot[d] += b
        gathered.append(tot)
    return held, gathered


def memory_rows(graph: Graph, topology, nodes: Mapping[str, OpCandidates],
            layouts: Mapping[str, list], shared: BuildMemo | None = None):
    """Rows (device, step) of the liveness model that some choice could overfill; (None, None)
    when no choice can break any row (then the constraints are redundant and left out)."""
    n = topology.world_size
    steps = max(1, len(graph.ops))
    step_of = {op.name: i for i, op in enumerate(graph.ops)}
    live = _liveness(graph, nodes)
    def node_bytes(k: str, oc: OpCandidates):
        if shared is None:
            return _node_bytes(graph, oc, layouts[k], n, k in step_of)
        sop, cands = shared.struct(oc)
        sig = (tuple(graph.tensor(x).dtype for x in oc.op.inputs),
               tuple(oc.op.inputs.index(x) for x in oc.op.inputs),  # which inputs coincide
               graph.tensor(oc.op.output).dtype, k in step_of)
        return shared.get(("bytes", sop, cands, sig),
                           lambda: _node_bytes(graph, oc, layouts[k], n, k in step_of))
    data = {k: node_bytes(k, oc) for k, oc in nodes.items()}
    worst = [[0.0] * (steps + 1) for _ in range(n)]  # difference arrays per device
    for k, (held, gathered) in data.items():
        lo, hi = live[k]
        for d in range(n):
            h = max(row[d] for row in held)
            hg = max(a[d] + b[d] for a, b in zip(held, gathered))
            worst[d][lo] += hg
            worst[d][lo + 1] += h - hg
            worst[d][hi + 1] -= h
    keep = []
    for d in range(n):
        acc = 0.0
        cap = float(topology.devices[d].mem_bytes)
        for t in range(steps):
            acc += worst[d][t]
            if acc > cap:
                keep.append((d, t))
    if not keep:
        return None, None
    memory = {}
    for k, (held, gathered) in data.items():
        lo, hi = live[k]
        rows = []
        for d, t in keep:
            rows.append(tuple(float((a[d] if lo <= t <= hi else 0) + (b[d] if t == lo else 0))
                              for a, b in zip(held, gathered)))
        memory[k] = tuple(rows)
    return memory, tuple(float(topology.devices[d].mem_bytes) for d, _ in keep)




# A row may sit this far (relative) over its capacity and still fit: the solver keeps rows
# feasible to about 1e-7 of their size, so its own answers must pass.
FIT_REL_TOL = 1e-6


def fits(memory: Mapping[str, Sequence[Sequence[float]]] | None,
         capacities: Sequence[float] | None, assignment: Mapping[str, int]) -> bool:
    """Whether a choice (node -> candidate index) keeps every kept (device, step) row of the
    liveness model within its capacity. No rows: every choice fits."""
    if memory is None or capacities is None:
        return True
    return all(sum(memory[k][i][c] for k, c in assignment.items()) <= cap * (1 + FIT_REL_TOL)
               for i, cap in enumerate(capacities))
