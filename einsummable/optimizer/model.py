r"""The optimisation model of one (graph, topology, options): nodes, candidates, costs, memory.

Nodes are the graph inputs ("input:<name>", whose candidate is the layout the tensor arrives
in) and the ops. With x[v,c] = 1 when node v takes candidate c, the MIP that `formulations`
solves is

    minimise    sum_v sum_c  a[v,c] x[v,c]  +  sum_{e=(u,v)} sum_{r,s} w[e,r,s] y[e,r,s]
    subject to  onehot_v:   sum_c x[v,c] = 1
                ysrc_e_r:   sum_s y[e,r,s] = sum_{c : L_u(c) = r} x[u,c]
                ydst_e_s:   sum_r y[e,r,s] = sum_{c : N_ev(c) = s} x[v,c]
                mem_{d,t}:  sum_v sum_c m[v,c,d,t] x[v,c] <= capacity(d)
                tie_g:      x[v,c] = x[v',c] for v, v' in one repeated-block group g

    a[v,c]    compute seconds of c (`cost.compute_cost`), plus, for a graph output that is
              not fed back (no steady state), the exchange that folds its partial sums;
    L_u(c)    the output layout of u's candidate c (rows of the edge matrix: a projection);
    N_ev(c)   the blocks v's candidate c reads of the edge's tensor (columns);
    w[e,r,s]  exchange seconds from layout r to needs s (`exchange.synthesize` + time),
              priced lazily: the MIP first sees a lower bound (`bound.py`) for each cell
              and only the cells its solutions use are synthesised (`search.solve_lazily`); where
              that would take many rounds, the LP relaxation picks the cells first
              (`lp_phase.lp_pricing`, `formulations/relax.py`) and bounds every other one;
    m         resident bytes (`memory.py`).

The objective is not always that plain sum: with `Options.overlap` (the default) it is
A + max(C, W) (`objective.py`).

An activation read by several ops (`placement.rereads`) is delivered once from its producer,
to its first reader (the head); every later reader's edge runs from the head, its rows the
head's needs as layouts: w[e,r,s] is the exchange from need r (whole blocks where the head
read them) to need s, 0 where s asks for nothing the head's devices lack. Lowering does the
same, so a block gathered for the head (the sequence-parallel norm output read by the Q, K and
V projections) is paid once, not once per reader.

Steady state adds, for every block input x paired with a block output y of the same shape, an
edge from y's producer to "input:x" whose needs are x's layout: the block must hand its output
on in the layout its input came in, or pay the exchange that restores it.

Weights "free" (the default): any layout, at no cost (weights placed ahead of time), held
within the memory rows. "sharded": a weight's candidates never replicate (each byte on one
device); its consumers may still gather it (FSDP-like) and pay for that exchange.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping

from ..errors import PlanError
from ..frontend.handoff import fed_back as fed_back_of, steady_pairs, streamed_gradients
from ..frontend.ir import Graph
from ..planning.candidates import OpCandidates, Roles, graph_candidates, roles
from ..planning.node_parallel import grouped, node_parallel_candidates
from ..planning.cost import ComputeCost, EdgeCost, finished_needs, memory_bound_share
from ..planning.kernel_time import contention_share, copy_charge
from ..planning.placement import INPUT_PREFIX, Candidate, check_candidate, rereads
from ..planning.plan import Options, Plan
from .memo import BuildMemo
from .memory import memory_rows
from .pricing import EdgeMatrix, EdgePricer
from .ties import tie_groups

# Where a build spends its time, at INFO (`experiments/optimizer_bench.py --phases`).
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EdgeTerm:
    """One pairwise term: tensor moving from node src to node dst."""

    src: str
    dst: str
    tensor: str
    rows: tuple[int, ...]          # src candidate -> layout index
    cols: tuple[int, ...]          # dst candidate -> needs index
    matrix: EdgeMatrix             # priced lazily (`search.solve_lazily`)
    kind: str = "data"             # "data", "weight" (out of a weight input: streamed
                                   # behind compute), "reread" (from the head reader's needs,
                                   # `placement.rereads`), "steady" (output fed back),
                                   # "carried" (`Graph.carried`, handed on each call) or
                                   # "gradient" (`handoff.streamed_gradients`: sent as soon as
                                   # computed, behind the rest of the backward)

    def cost(self, a: int, b: int) -> EdgeCost:
        """The exact cost (priced now if it was not yet)."""
        return self.matrix.exact(self.rows[a], self.cols[b])

    def cell(self, choice: Mapping[str, int]) -> tuple[int, int]:
        return self.rows[choice[self.src]], self.cols[choice[self.dst]]


@dataclass
class Model:
    graph: Graph
    topology: object
    options: Options
    nodes: dict[str, OpCandidates]
    compute: dict[str, tuple[ComputeCost, ...]]
    finish: dict[str, tuple[EdgeCost, ...]]
    edges: list[EdgeTerm]
    ties: tuple[tuple[str, ...], ...]
    memory: dict[str, tuple[tuple[float, ...], ...]] | None  # node -> resource -> per cand
    capacities: tuple[float, ...] | None
    roles: Roles
    pricer: EdgePricer
    # Compute a weight stream costs per second it runs behind compute (`kernel_time`).
    contention: float = 0.0
    # Compute a weight's stitching copies cost per second of copy (`kernel_time.copy_charge`).
    copy_charge: float = 1.0
    # The (device, step) of each memory row, in the order of `capacities`.
    row_keys: tuple[tuple[int, int], ...] | None = None
    # On several levels: per level, the contention of a stream whose busiest links are that
    # level's (its bytes pass through a device at that level's rate); () on one level.
    level_contention: tuple[float, ...] = ()

    def unary(self, key: str, c: int) -> float:
        f = self.finish.get(key)
        return self.compute[key][c].total_s + (f[c].seconds if f else 0.0)

    def index(self, key: str, cand: Candidate) -> int:
        for i, c in enumerate(self.nodes[key].cands):
            if c.parts == cand.parts and c.devices == cand.devices:
                return i
        raise PlanError(f"candidate {cand} is not among the {len(self.nodes[key].cands)} "
                        "candidates of this node", op=key,
                        fix="pick one from es.candidates(graph, topology)")


def producer_key(graph: Graph, tensor: str) -> str:
    p = graph.producer(tensor)
    return p.name if p is not None else INPUT_PREFIX + tensor


def search_topology(graph: Graph, topology, options: Options, r: Roles | None = None):
    """The hierarchy the search sees: node-parallel plans group the nodes where the batch
    does not divide over them (`node_parallel.grouped`); otherwise the machine's own."""
    return grouped(graph, topology, r) if options.nodes == "parallel" else topology


def model_candidates(graph: Graph, topology, options: Options,
                     r: Roles | None = None) -> dict[str, OpCandidates]:
    """Every node's candidates for the options' search: every level, or node-parallel."""
    if options.nodes == "parallel":
        return node_parallel_candidates(graph, topology, weights=options.weights, r=r)
    return graph_candidates(graph, topology, weights=options.weights, r=r)


def build_model(graph: Graph, topology, options: Options = Options(),
                nodes: dict[str, OpCandidates] | None = None,
                pricer: EdgePricer | None = None) -> Model:
    t_build = time.perf_counter()
    r = roles(graph)
    topology = search_topology(graph, topology, options, r)
    nodes = nodes if nodes is not None else model_candidates(graph, topology, options, r)
    if pricer is None or pricer.topology is not topology:  # a pricer of the hierarchy searched
        pricer = EdgePricer(topology, options.cost)
    sh = BuildMemo(graph, topology, options, pricer)
    compute = {k: sh.compute(oc) for k, oc in nodes.items()}
    layouts = {k: sh.layouts(oc) for k, oc in nodes.items()}

    # (src, dst, tensor, rows, layouts, cols, needs, agg, kind)
    specs = []
    heads = rereads(graph)
    # Gradients stream where every device folds beside its compute (a side stream); on the
    # others their folds wait on the compute stream at the update, and an exchange's price
    # does not tell its folds from its transfers, so there they stay on the path.
    side = all(d.prefetch_stream for d in topology.devices)
    streamed = streamed_gradients(graph) if side else {}
    for op in graph.ops:
        for name in dict.fromkeys(op.inputs):
            if graph.tensor(name).kind == "constant":
                continue
            cols, needs = sh.projected_needs(nodes[op.name], name)
            head = heads.get(name, op.name)
            if head != op.name:  # a later reader: from the head's needs, folded and whole
                rows, lay = sh.projected_sources(nodes[head], name)
                specs.append((head, op.name, name, rows, lay, cols, needs, None, "reread"))
                continue
            src = producer_key(graph, name)
            rows, lay = sh.projected_layouts(nodes[src])
            kind = ("weight" if graph.tensor(name).kind == "weight"
                    else "gradient" if streamed.get(name) == op.name else "data")
            specs.append((src, op.name, name, rows, lay, cols, needs, nodes[src].op.agg, kind))
    pairs = steady_pairs(graph) if options.steady_state else ()
    if options.steady_state and not pairs:
        raise PlanError("steady_state needs a block output shaped like an activation input",
                        fix="pass steady_state=False for graphs that are not stackable blocks")
    # A carried output (a trained parameter, its optimizer state) is handed on to its input's
    # layout at the end of every call, steady state or not: the next call reads it there.
    for (x, y), kind in [(p, "steady") for p in pairs] + [(p, "carried") for p in graph.carried]:
        src, dst = producer_key(graph, y), INPUT_PREFIX + x
        rows, lay = sh.projected_layouts(nodes[src])
        cols, needs = sh.projected_finished(nodes[dst])
        specs.append((src, dst, y, rows, lay, cols, needs, nodes[src].op.agg, kind))
    fed_back = set(fed_back_of(graph, options.steady_state))
    finish_specs = []
    for y in dict.fromkeys(graph.outputs):
        if y in fed_back:
            continue
        src = producer_key(graph, y)
        finish_specs.append((src, y))

    # Edge cells are priced lazily (`search.solve_lazily`); the folds of unfed outputs, one per
    # layout, are priced now.
    keys = []
    for src, y in finish_specs:
        info = graph.tensor(y)
        keys += [pricer.key(info, l, finished_needs(l), nodes[src].op.agg) for l in layouts[src]]
    pricer.prefetch(keys)

    edges = []
    for src, dst, name, rows, lay, cols, needs, agg, kind in specs:
        info = graph.tensor(name)
        edges.append(EdgeTerm(src, dst, name, rows, cols, sh.matrix(info, lay, needs, agg), kind))
    finish = {}
    for src, y in finish_specs:
        info = graph.tensor(y)
        finish[src] = tuple(pricer.price(info, l, finished_needs(l), nodes[src].op.agg)
                            for l in layouts[src])
    memory, caps, mem_rows = memory_rows(graph, topology, nodes, layouts, options.weights, sh,
                                         options.layers)
    mu = memory_bound_share(graph, topology, options.cost)
    model = Model(graph, topology, options, nodes, compute, finish, edges,
                  tie_groups(graph, nodes), memory, caps, r, pricer,
                  contention_share(topology, mu), copy_charge(topology, mu), mem_rows,
                  tuple(contention_share(topology, mu, level=lv) for lv in range(len(
                      topology.levels))) if len(topology.levels) > 1 else ())
    if log.isEnabledFor(logging.INFO):
        seen = {id(e.matrix): e.matrix.shape for e in edges}
        log.info("model: %d nodes, %d edges, %d distinct edge cells, built in %.2f s",
                 len(nodes), len(edges), sum(r * c for r, c in seen.values()),
                 time.perf_counter() - t_build, extra={"progress": ("model built", None, None)})
    return model


def price_all(model: Model) -> None:
    """Price every cell of every edge (in worker processes when there are many)."""
    shorts = []
    for e in model.edges:
        R, S = e.matrix.shape
        shorts += [e.matrix.short(r, s) for r in range(R) for s in range(S)]
    model.pricer.prefetch_short(shorts)


def fixed_nodes(graph: Graph, topology, options: Options,
                choice: Mapping[str, Candidate | int]) -> dict[str, OpCandidates]:
    """Every node with one candidate: the one `choice` gives it (an index into its candidates,
    or a Candidate, which need not be among them but must be legal)."""
    nodes = graph_candidates(graph, topology, weights=options.weights)
    out = {}
    for k, oc in nodes.items():
        if k not in choice:
            raise PlanError(f"the choice has no candidate for {k!r}", op=k,
                            fix="give one candidate per op and per graph input ('input:<name>')")
        c = choice[k]
        if isinstance(c, int):
            i = c
        else:
            i = next((j for j, x in enumerate(oc.cands)
                      if x.parts == c.parts and x.devices == c.devices), None)
            if i is None:
                check_candidate(oc.op, c)
                out[k] = OpCandidates(k, oc.op, (c,), ((),))
                continue
        out[k] = OpCandidates(k, oc.op, (oc.cands[i],), (oc.level_parts[i],))
    return out


def plan_model(plan: Plan) -> Model:
    """The model of one plan, on the options it was solved under: each node fixed to its
    chosen candidate (index 0)."""
    return build_model(plan.graph, plan.topology, plan.options,
                       fixed_nodes(plan.graph, plan.topology, plan.options, plan.chosen))
