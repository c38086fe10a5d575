"""A greedy planner, as a baseline for the exchange benchmark: op by op, the candidate (the
canonical placement on every device, or one) of least compute plus incoming exchange time
given the layouts chosen so far; inputs start whole on device 0, as a caller holds them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from einsummable.frontend.ir import Graph
from einsummable.planning.cost import compute_cost
from einsummable.planning.exchange import synthesize
from einsummable.planning.placement import (INPUT_PREFIX, Candidate, input_needs, input_op,
                                            output_layout, place)
from einsummable.planning.spec import decompositions
from einsummable.planning.timing import exchange_time
from einsummable.topology import load_topology


@dataclass(frozen=True)
class GreedyPlan:
    graph: Graph
    topology: Any
    choice: Mapping[str, Candidate]


def greedy_plan(graph: Graph, topology: Any) -> GreedyPlan:
    """Op by op, the candidate (canonical placement, n tuples or one) of least
    compute + incoming exchange time; inputs start whole on device 0, as a caller holds them."""
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
            cost = compute_cost(op, cand, graph, topo).total_s
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
