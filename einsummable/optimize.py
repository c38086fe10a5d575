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
              and only the cells its solutions use are synthesised (`solve_lazily`); where
              that would take many rounds, the LP relaxation picks the cells first
              (`lp_pricing`, `formulations/relax.py`) and bounds every other one;
    m         resident bytes (below).

With `Options.overlap` (the default) the objective is not that plain sum but
A + max(C, W): activation exchanges, plus compute or weight exchanges (which lowering prefetches
behind the compute), whichever is longer; `overlap.py` states it and minimises it with the same
MIP plus an epigraph variable for the max (one solve).

Steady state adds, for every block input x paired with a block output y of the same shape, an
edge from y's producer to "input:x" whose needs are x's layout: the block must hand its output
on in the layout its input came in, or pay the exchange that restores it.

Memory (liveness model). Ops run in graph order t = 0..T-1. A tensor is live from the step that
produces it (graph inputs: from the start) through its last reader (graph outputs: to the end);
weights are live throughout. At step t device d holds every live tensor's pieces on d (replicas
and partial slices count in full) plus the input blocks op t gathers on d. This gives one row per
(device, step); rows that no choice can violate are dropped before solving.

Weights "sharded": a weight's candidates never replicate (each byte on one device); its
consumers may still gather it (FSDP-like) and pay for that exchange. "free": any layout, at no
cost (weights placed ahead of time).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .candidates import OpCandidates, graph_candidates, roles, Roles, structural
from .cost import (ComputeCost, CostModel, EdgeCost, EdgeMatrix, EdgePricer, compute_cost,
                   consumer_needs, finished_needs, needs_bytes, resident_bytes)
from .errors import EinsummableError, PlanError
from .ir import Graph
from pathlib import Path
from .placement import INPUT_PREFIX, Candidate, output_layout

# Where a solve spends its time (model build, each solve, each pricing), at INFO: for a user
# asking why a plan is slow to come (`experiments/optimizer_bench.py --phases`).
log = logging.getLogger(__name__)

WEIGHT_MODES = ("sharded", "free")
MIN_TIE_PERIOD = 4  # ops per repeated block; shorter periods are patterns inside one block
# Lazy pricing: solves on bounds before every edge cell is priced (see `solve_lazily`).
LAZY_ROUNDS = 3
# Relative margin on the incumbent when deciding which cells could still matter (rounding).
HOPEFUL_MARGIN = 1e-9
# Under a time limit, another solve starts only with at least this share of the last solve's
# wall time left (model building is outside the solver's own limit).
MIN_SOLVE_SHARE = 0.5
# The LP relaxation picks the cells to price (`lp_pricing`) only where pricing every hopeful
# cell is predicted to take longer than LP_PRICING_MIN_S (measured before the LP's column
# generation: its rounds, 25-93 re-solves of 0.1-1.6 s each, lost to pricing everything
# below that; 0.02-0.5 s each since), and
# for at most LP_PRICING_SHARE of that prediction (a phase cut short still bounds cells).
LP_PRICING_MIN_S = 20.0
LP_PRICING_SHARE = 0.5
# An LP phase that ends with its bound this far (relative) below its best plan leaves the
# hopeful cells priced before the MIP: there the MIP rounds on bounds are long (h100x8x2
# llama-65b, LP 8% below: three rounds of 18-54 s, then those cells priced all the same).
LP_TIGHT_GAP = 0.01
# The last solve under a time limit charges every unpriced cell this multiple of the best exact
# plan's cost, so that it keeps to priced cells (see `solve_lazily`).
PRICED_ONLY_PENALTY = 1.01
# A proved gap below this is float rounding in the sums (the objective re-added in another
# order), not a missing proof: an optimal plan reports its objective as the bound, so the
# same inputs give the same bytes whichever rounds (timed decisions) proved it.
ROUNDING_GAP = 1e-12


@dataclass(frozen=True)
class Options:
    """`overlap`: weight exchanges stream behind compute (objective A + max(C, W), see
    `overlap.py`); False prices every exchange on the critical path (the plain sum above)."""
    weights: str = "sharded"
    steady_state: bool = False
    cost: CostModel = field(default_factory=CostModel)
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_MODES:
            raise PlanError(f"unknown weights option {self.weights!r}",
                            fix=f"use one of: {', '.join(WEIGHT_MODES)}")

    def to_dict(self) -> dict:
        return {"weights": self.weights, "steady_state": self.steady_state,
                "cost": self.cost.to_dict(), "overlap": self.overlap}


@dataclass(frozen=True)
class EdgeTerm:
    """One pairwise term: tensor moving from node src to node dst."""

    src: str
    dst: str
    tensor: str
    rows: tuple[int, ...]          # src candidate -> layout index
    cols: tuple[int, ...]          # dst candidate -> needs index
    matrix: EdgeMatrix             # priced lazily (`solve_lazily`)
    kind: str = "data"             # "data" or "steady" (output fed back to the block input)

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

    def objective(self, choice: Mapping[str, int]) -> float:
        """With overlap, A + max(C, W) (`overlap.split`); else the same sum, in the same order,
        as formulations.objective on `to_problem(model)`."""
        if self.options.overlap:
            from .overlap import split
            return split(self, choice).total_s
        total = 0.0
        for k in self.nodes:
            total += self.unary(k, choice[k])
        for e in self.edges:
            total += e.cost(choice[e.src], choice[e.dst]).seconds
        return total


# --------------------------------------------------------------------------- repeats

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


def _tie_groups(graph: Graph, nodes: Mapping[str, OpCandidates]) -> tuple[tuple[str, ...], ...]:
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


# --------------------------------------------------------------------------- building

def steady_pairs(graph: Graph) -> tuple[tuple[str, str], ...]:
    """(block input, block output) pairs: activation inputs and outputs of equal shape/dtype."""
    outs = list(graph.outputs)
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


def producer_key(graph: Graph, tensor: str) -> str:
    p = graph.producer(tensor)
    return p.name if p is not None else INPUT_PREFIX + tensor


def _project(values: Sequence) -> tuple[tuple[int, ...], list]:
    index: dict = {}
    proj = []
    for v in values:
        proj.append(index.setdefault(v, len(index)))
    return tuple(proj), list(index)


class _Shared:
    """Memo for one model build. Repeated blocks have ops that differ only in names, so their
    layouts, needs, compute costs and edge matrices are computed once, keyed on the op's
    structure (names stripped) and its candidate tuple, and the very same objects are reused."""

    def __init__(self, graph: Graph, topology, options: Options, pricer: EdgePricer) -> None:
        self.graph, self.topology, self.options, self.pricer = graph, topology, options, pricer
        self.computed = {op.output for op in graph.ops}
        self._struct: dict[str, object] = {}
        self._memo: dict[tuple, object] = {}

    def struct(self, oc: OpCandidates):
        s = self._struct.get(oc.key)
        if s is None:
            s = (structural(oc.op), oc.cands)
            self._struct[oc.key] = s
        return s

    def _get(self, key: tuple, make):
        hit = self._memo.get(key)
        if hit is None:
            hit = make()
            self._memo[key] = hit
        return hit

    def layouts(self, oc: OpCandidates) -> list:
        sop, cands = self.struct(oc)
        return self._get(("layouts", sop, cands),
                         lambda: [output_layout(sop, c) for c in cands])

    def compute(self, oc: OpCandidates) -> tuple[ComputeCost, ...]:
        sop, cands = self.struct(oc)
        g = self.graph
        sig = (tuple(g.tensor(n).dtype for n in oc.op.inputs), g.tensor(oc.op.output).dtype,
               oc.op.output in self.computed)
        return self._get(("compute", sop, cands, sig), lambda: tuple(
            compute_cost(oc.op, c, g, self.topology, self.options.cost) for c in oc.cands))

    def projected_layouts(self, oc: OpCandidates):
        sop, cands = self.struct(oc)
        return self._get(("rows", sop, cands), lambda: _project(self.layouts(oc)))

    def projected_needs(self, oc: OpCandidates, tensor: str):
        sop, cands = self.struct(oc)
        where = tuple(i for i, n in enumerate(oc.op.inputs) if n == tensor)
        return self._get(("cols", sop, cands, where), lambda: _project(
            [consumer_needs(oc.op, c, tensor) for c in oc.cands]))

    def projected_finished(self, oc: OpCandidates):
        sop, cands = self.struct(oc)
        return self._get(("finished", sop, cands), lambda: _project(
            [finished_needs(p) for p in self.layouts(oc)]))

    def matrix(self, info, lay: list, needs: list, agg) -> EdgeMatrix:
        key = ("matrix", info.shape, info.dtype, agg, id(lay), id(needs))
        return self._get(key, lambda: EdgeMatrix(self.pricer, info, lay, needs, agg))


def build_model(graph: Graph, topology, options: Options = Options(),
                nodes: dict[str, OpCandidates] | None = None,
                pricer: EdgePricer | None = None) -> Model:
    t_build = time.perf_counter()
    r = roles(graph)
    nodes = nodes if nodes is not None else graph_candidates(graph, topology,
                                                             weights=options.weights, r=r)
    pricer = pricer or EdgePricer(topology, options.cost)
    sh = _Shared(graph, topology, options, pricer)
    compute = {k: sh.compute(oc) for k, oc in nodes.items()}
    layouts = {k: sh.layouts(oc) for k, oc in nodes.items()}

    # (src, dst, tensor, rows, layouts, cols, needs, agg, kind)
    specs = []
    for op in graph.ops:
        for name in dict.fromkeys(op.inputs):
            if graph.tensor(name).kind == "constant":
                continue
            src = producer_key(graph, name)
            rows, lay = sh.projected_layouts(nodes[src])
            cols, needs = sh.projected_needs(nodes[op.name], name)
            specs.append((src, op.name, name, rows, lay, cols, needs, nodes[src].op.agg, "data"))
    pairs = steady_pairs(graph) if options.steady_state else ()
    if options.steady_state and not pairs:
        raise PlanError("steady_state needs a block output shaped like an activation input",
                        fix="pass steady_state=False for graphs that are not stackable blocks")
    for x, y in pairs:
        src, dst = producer_key(graph, y), INPUT_PREFIX + x
        rows, lay = sh.projected_layouts(nodes[src])
        cols, needs = sh.projected_finished(nodes[dst])
        specs.append((src, dst, y, rows, lay, cols, needs, nodes[src].op.agg, "steady"))
    fed_back = {y for _, y in pairs}
    finish_specs = []
    for y in dict.fromkeys(graph.outputs):
        if y in fed_back:
            continue
        src = producer_key(graph, y)
        finish_specs.append((src, y))

    # Edge cells are priced lazily (`solve_lazily`); the folds of unfed outputs, one per
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
    memory, caps = _memory(graph, topology, nodes, layouts, sh)
    model = Model(graph, topology, options, nodes, compute, finish, edges,
                  _tie_groups(graph, nodes), memory, caps, r, pricer)
    if log.isEnabledFor(logging.INFO):
        seen = {id(e.matrix): e.matrix.shape for e in edges}
        log.info("model: %d nodes, %d edges, %d distinct edge cells, built in %.2f s",
                 len(nodes), len(edges), sum(r * c for r, c in seen.values()),
                 time.perf_counter() - t_build)
    return model


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


def _memory(graph: Graph, topology, nodes: Mapping[str, OpCandidates],
            layouts: Mapping[str, list], shared: "_Shared | None" = None):
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
        return shared._get(("bytes", sop, cands, sig),
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


def peak_memory(model: "Model", choice: Mapping[str, int]) -> tuple[float, ...]:
    """Largest resident bytes per device over the steps (liveness model), for one choice."""
    graph, topology = model.graph, model.topology
    n, steps = topology.world_size, max(1, len(graph.ops))
    step_of = {op.name: i for i, op in enumerate(graph.ops)}
    live = _liveness(graph, model.nodes)
    totals = [[0.0] * steps for _ in range(n)]
    for k, oc in model.nodes.items():
        c = choice[k]
        one = OpCandidates(k, oc.op, (oc.cands[c],), (oc.level_parts[c],))
        held, gathered = _node_bytes(graph, one, [output_layout(oc.op, oc.cands[c])], n,
                                     k in step_of)
        lo, hi = live[k]
        for d in range(n):
            for t in range(lo, hi + 1):
                totals[d][t] += held[0][d]
            totals[d][lo] += gathered[0][d]
    return tuple(max(row) for row in totals)


# --------------------------------------------------------------------------- the MIP

def to_problem(model: Model, warm_start: Mapping[str, int] | None = None, *,
               exact: bool = True, unpriced_penalty: float = 0.0):
    """The generic pairwise-choice problem of `formulations` (module docstring). `exact`
    prices every edge cell first; else unpriced cells carry their lower bound (the form
    `solve_lazily` solves) plus `unpriced_penalty` seconds (`solve_lazily`'s last solve under
    a time limit, which keeps to priced cells)."""
    import formulations as fm
    if exact:
        price_all(model)
    nodes = []
    for k, oc in model.nodes.items():
        mem = model.memory[k] if model.memory is not None else None
        nodes.append(fm.Node(k, tuple(model.unary(k, c) for c in range(len(oc.cands))), mem))
    edges = []
    for e in model.edges:
        pen = unpriced_penalties(e.matrix, unpriced_penalty)
        edges.append(fm.Edge(e.src, e.dst, tuple(
            tuple(x.seconds + p for x, p in zip(row, prow))
            for row, prow in zip(e.matrix.estimates(), pen)), e.rows, e.cols))
    return fm.Problem(tuple(nodes), tuple(edges), model.capacities, tie=model.ties,
                      warm_start=dict(warm_start) if warm_start else None)


def unpriced_penalties(matrix: EdgeMatrix, penalty: float) -> tuple[tuple[float, ...], ...]:
    """Per cell: `penalty` where the cell is not priced yet, else 0."""
    R, S = matrix.shape
    if not penalty:
        return ((0.0,) * S,) * R
    return tuple(tuple(0.0 if matrix.priced(r, s) else penalty for s in range(S))
                 for r in range(R))


def solve_model(model: Model, *, time_limit_s: float | None = None, solver: str = "highs",
                warm_start: Mapping[str, int] | None = None, incumbents: Sequence = ()):
    """Solve; errors of `formulations` become InfeasibleError / SolverError. With overlap,
    `overlap.solve` minimises A + max(C, W); `incumbents` (assignments, e.g. the named
    strategies) are scored too. Edge cells are priced lazily (`solve_lazily`)."""
    def solve(make, warm, limit):
        return solve_lazily(model, make, warm, lambda p, t: _solve_problem(p, t, solver), limit)
    if model.options.overlap:
        from . import overlap
        return overlap.solve(model, solve, incumbents=tuple(incumbents),
                             time_limit_s=time_limit_s)
    return solve(lambda w, pen: to_problem(model, w, exact=False, unpriced_penalty=pen),
                 warm_start, time_limit_s)


def price_all(model: Model) -> None:
    """Price every cell of every edge (in worker processes when there are many)."""
    shorts = []
    for e in model.edges:
        R, S = e.matrix.shape
        shorts += [e.matrix.short(r, s) for r in range(R) for s in range(S)]
    model.pricer.prefetch_short(shorts)


def floor_s(model: Model) -> float:
    """A lower bound on every plan's objective: each node's least unary cost (compute, and
    the fold of an unfed output), no exchange. It holds with overlap too: there T = A + max(C,
    W) >= (folds in A) + C."""
    return sum(min(model.unary(k, c) for c in range(len(oc.cands)))
               for k, oc in model.nodes.items())


def hopeful_cells(model: Model, upper: float,
                  lp_bounds: Mapping[tuple, float] | None = None) -> list[tuple]:
    """Unpriced cells that could be in a plan of objective <= `upper` (a plan's exact cost):
    those whose own bound plus `floor_s` (every node's least unary cost) does not exceed
    it, nor does their bound from the LP relaxation (`lp_bounds`, `lp_cell_bounds`) where
    one is given. The others keep their bounds in the MIP: any choice using one costs more
    than `upper` on the bounds alone, so an optimal solve never picks it (and `solve_lazily`
    checks that it did not). Lowest bound first: the order to price them in when time is
    short."""
    from .overlap import is_weight_edge
    overlap = model.options.overlap
    floor = floor_s(model)
    slack = upper * (1 + HOPEFUL_MARGIN)
    out: dict[tuple, float] = {}
    seen: set[int] = set()
    for e in model.edges:
        if id(e.matrix) in seen:
            continue
        seen.add(id(e.matrix))
        weight = overlap and is_weight_edge(model, e)
        R, S = e.matrix.shape
        for r in range(R):
            for s_ in range(S):
                seconds, local = e.matrix.bounds[r][s_]
                if weight:
                    lb = max(floor + local, e.matrix.estimate(r, s_).in_batch_s - local)
                else:
                    lb = floor + seconds
                if lb <= slack and not e.matrix.priced(r, s_):
                    key = e.matrix.short(r, s_)
                    if lp_bounds is not None and lp_bounds.get(key, lb) > slack:
                        continue
                    out[key] = min(lb, out.get(key, lb))
    return sorted(out, key=out.__getitem__)


def lp_cell_bounds(model: Model, lp) -> dict[tuple, float]:
    """Per pricer key, the least LP bound (`formulations.relax`) over the cells it prices:
    no plan using that key's cell costs less."""
    out: dict[tuple, float] = {}
    for j, e in enumerate(model.edges):
        b = lp.bounds(j)
        R, S = e.matrix.shape
        for r in range(R):
            for s_ in range(S):
                key = e.matrix.short(r, s_)
                v = float(b[r, s_])
                if v < out.get(key, float("inf")):
                    out[key] = v
    return out


@dataclass(frozen=True)
class LpPhase:
    """What `_lp_phase` leaves: `bound` holds for every plan, `cells` per pricer key and
    `options` per node and option for every plan using them (`formulations.relax`); `best`
    is the best exact plan (cost, choice) so far."""
    bound: float
    cells: dict[tuple, float]
    options: dict[str, np.ndarray]
    best: tuple[float, Mapping[str, int]]
    converged: bool

    def allowed(self, upper: float) -> tuple[dict[str, tuple[int, ...]], float]:
        """Per node, the options whose bound does not exceed `upper` (a plan's exact cost:
        the others are in no plan as good), and the least bound of those left out (inf if
        none)."""
        slack = upper * (1 + HOPEFUL_MARGIN)
        keep: dict[str, tuple[int, ...]] = {}
        out = float("inf")
        for node, b in self.options.items():
            ok = b <= slack
            if not ok.all():
                keep[node] = tuple(int(c) for c in np.flatnonzero(ok))
                out = min(out, float(b[~ok].min()))
        return keep, out


def _lp_phase(model: Model, make_problem, best: tuple, n_hopeful: int, predicted: float,
              stop: float) -> LpPhase:
    """`lp_pricing` until `stop`, then its rounding as an incumbent."""
    log.info("pricing %d hopeful cells would take about %.1f s: LP relaxation first",
             n_hopeful, predicted)
    got = lp_pricing(model, make_problem, best[0], stop, seed=best[1])
    if got is None:
        return LpPhase(0.0, {}, {}, best, False)
    lp, converged = got
    rounded = lp_rounding(model, lp, make_problem)
    if rounded is not None:
        exact = model.objective(rounded)
        log.info("LP solution rounded: a plan of %.6g s", exact)
        if exact < best[0]:
            best = (exact, rounded)
    return LpPhase(lp.value, lp_cell_bounds(model, lp),
                   {n: lp.option_bounds(n) for n in lp.x}, best, converged)


def lp_rounding(model: Model, lp, make_problem) -> dict[str, int] | None:
    """Each node's option of largest LP value (the lowest on ties; tied nodes share theirs),
    where that plan meets memory and side constraints: near an integral LP optimum, a plan
    near the optimum, whose exact cost is a good incumbent for the hopeful test."""
    import formulations as fm
    choice = {k: int(max(range(len(v)), key=lambda c: (v[c], -c))) for k, v in lp.x.items()}
    return None if fm.violations(make_problem(None, 0.0), choice) else choice


def cell_terms(model: Model, e: EdgeTerm, x: EdgeCost) -> tuple[float, tuple | None]:
    """A cell's coefficients in the problem `solve_model` solves, for edge cost x: its plain
    seconds, and with overlap its (compute, weights) parts (`overlap.cell_terms`)."""
    if model.options.overlap:
        from .overlap import cell_terms as overlap_terms
        return overlap_terms(model, e, x)
    return x.seconds, None


def lp_pricing(model: Model, make_problem, upper: float, stop_at: float,
               seed: Mapping[str, int] | None = None):
    """Price what the LP relaxation uses until it uses priced cells only (column generation):
    solve the LP on the estimates, price the unpriced cells its solution uses, re-solve from
    the last basis, until none is left or the clock passes `stop_at`. Each round's value is a
    lower bound on every plan (estimates never exceed the costs), and where the LP is tight,
    as the pairwise relaxation of these models is once its cells are priced, the cells it
    ends on are the ones the best plans use: a few hundred where the rounds of MIP solves
    would price thousands. Returns the last LP's `formulations.relax.LpResult` and whether
    it converged, or None where the LP could not be solved."""
    from formulations.errors import SolveFailed
    from formulations.relax import Relaxation
    t0 = time.perf_counter()
    try:
        problem = make_problem(None, 0.0)
        # the cells of a plan (`seed`, the incumbent) among the LP's first columns: a
        # feasible start for its column generation
        cells = [] if seed is None else [(j, *e.cell(seed)) for j, e in enumerate(model.edges)]
        relax = Relaxation(problem, upper, cells=cells)
        where: dict[tuple, list[tuple[int, int, int]]] = {}  # pricer key -> its cells
        for j, e in enumerate(model.edges):
            if relax.ycols[j] is None:
                continue
            R, S = e.matrix.shape
            for r in range(R):
                for s_ in range(S):
                    where.setdefault(e.matrix.short(r, s_), []).append((j, r, s_))

        def unpriced_keys(res) -> list[tuple]:
            """The pricer keys of the unpriced cells `res` uses."""
            todo: dict[tuple, None] = {}
            for j, e in enumerate(model.edges):
                for r, s_ in res.support(j):
                    if not e.matrix.priced(r, s_):
                        todo[e.matrix.short(r, s_)] = None
            return list(todo)

        rounds = 0
        while True:
            res = relax.solve()
            rounds += 1
            todo = unpriced_keys(res)
            if not todo or time.perf_counter() >= stop_at:
                break
            model.pricer.prefetch_short(todo, stop_at)
            for key in todo:
                x = model.pricer.known_short(key)
                if x is None:  # out of time before it was priced
                    continue
                for j, r, s_ in where[key]:
                    relax.set_cell(j, r, s_, *cell_terms(model, model.edges[j], x))
        log.info("LP relaxation: %d rounds in %.2f s, bound %.6g s%s",
                 rounds, time.perf_counter() - t0, res.value,
                 "" if not todo else f" ({len(todo)} cells it uses left unpriced)")
        return res, not todo
    except SolveFailed as exc:
        log.info("LP relaxation failed (%s); the MIP rounds go on without it", exc)
        return None


def unpriced(model: Model, choice: Mapping[str, int]) -> list[tuple]:
    """The edge cells `choice` uses that are not priced yet (pricer keys, no repeats)."""
    out: dict[tuple, None] = {}
    for e in model.edges:
        r, s = e.cell(choice)
        if not e.matrix.priced(r, s):
            out[e.matrix.short(r, s)] = None
    return list(out)


def solve_lazily(model: Model, make_problem, warm_start, solve_problem,
                 time_limit_s: float | None):
    """Solve the problem `make_problem(warm_start)` builds from the edges' estimates (exact
    where priced, a lower bound elsewhere), price the cells the solution uses, and repeat
    until it uses priced cells only. Then it is optimal for the exact costs as well: its cost
    is exact and every other choice costs at least its estimate. Each round's solver bound is
    a bound on the exact problem (estimates never exceed the costs), and each round prices at
    least one new cell, so this ends. Where the bounds are loose (cross-node exchanges: the
    cut bound lets every NIC carry its share, which the synthesis reaches only in part) rounds
    could go on for long, so after `LAZY_ROUNDS` solves every cell that could still be in a
    plan no worse than the current one is priced (`hopeful_cells`), and the next solve is
    exact. That happens after an earlier solve already when pricing those cells is predicted
    (`EdgePricer.predict_s`) to take no longer than the solve did. Where it is predicted to
    take longer than LP_PRICING_MIN_S, the LP relaxation goes first (`lp_pricing`, before the
    first MIP solve given a warm start): it prices the cells its solution uses until that
    uses priced cells only, for at most LP_PRICING_SHARE of the predicted pricing time; its
    value is a bound, its rounding an incumbent, and its reduced costs bound every cell,
    which narrows the hopeful ones; cut short, or ending with its bound more than
    LP_TIGHT_GAP below its best plan, the hopeful cells it leaves are priced before the next
    solve (on h100x8x2 llama-7b: 685 cells priced in 26 LP rounds, where about 25,600 were
    hopeful).

    `time_limit_s` bounds the whole loop, pricing included (the hopeful cells are priced
    lowest bound first until one more solve would not fit, and no solve starts with less than
    `MIN_SOLVE_SHARE` of the last one's time left). When the deadline cuts that pricing short,
    or leaves room for one more solve only, the last solve keeps to priced cells (every
    unpriced one costs more than the best exact plan, `unpriced_penalty`), so its answer is
    a plan whose cost is exact; that solve's bound
    is not one on the real problem and is not used. Out of time, the answer is the best plan
    whose cost is exact (the warm start's, a round's solution once its cells are priced, or
    that last solve's), with the best round bound as its bound: status "time_limit" and an
    honest gap. `make_problem(warm_start, unpriced_penalty)` builds the problem."""
    t0 = time.perf_counter()
    deadline = None if time_limit_s is None else t0 + time_limit_s
    warm = warm_start
    rounds = 0
    best: tuple[float, Mapping[str, int]] | None = None  # least exact objective seen, its plan
    if warm_start:
        best = (model.objective(warm_start), warm_start)
    # the best bound proved on the exact problem; the floor holds even where a solve is cut
    # short before its root relaxation proves one
    bound = floor_s(model)
    priced_only = False  # the last solve: unpriced cells out of reach
    lp: LpPhase | None = None
    lp_bounds: dict[tuple, float] | None = None  # from the LP relaxation, once it ran
    exact_next = False  # every hopeful cell is priced: the next solve is exact
    lp_considered = False
    while True:
        if not lp_considered and best is not None:
            # once there is a plan to beat (before the first solve, given a warm start):
            # where pricing every hopeful cell is predicted to be long, the LP goes first, for
            # at most LP_PRICING_SHARE of that (under a limit, half the time left)
            lp_considered = True
            n_hopeful = len(hopeful_cells(model, best[0]))
            predicted = model.pricer.predict_s(n_hopeful)
            if predicted > LP_PRICING_MIN_S:
                stop = time.perf_counter() + LP_PRICING_SHARE * predicted
                if deadline is not None:
                    stop = min(stop, time.perf_counter() + (deadline - time.perf_counter()) / 2)
                lp = _lp_phase(model, make_problem, best, n_hopeful, predicted, stop)
                bound = max(bound, lp.bound)
                best, lp_bounds = lp.best, lp.cells
                warm = best[1]
                # price what could still matter before the next solve, unless the LP ended
                # tight: then its rounding is near optimal and few cells could beat it
                if not lp.converged or lp.bound < best[0] * (1 - LP_TIGHT_GAP):
                    hopeful = hopeful_cells(model, best[0], lp_bounds)
                    done = _price_logged(
                        model, hopeful, f"cells that could be in a plan <= {best[0]:.6g} s",
                        None if deadline is None
                        else time.perf_counter() + (deadline - time.perf_counter()) / 2)
                    priced_only = done < len(hopeful)
                    exact_next = not priced_only
        # more than the best exact plan costs: an optimal solve never uses an unpriced cell
        # (and not much more: the solver scales costs by the largest one)
        penalty = PRICED_ONLY_PENALTY * best[0] if priced_only and best is not None else 0.0
        t_solve = time.perf_counter()
        problem = make_problem(warm, penalty)
        barred_s = float("inf")  # the least bound of the options left out
        if lp is not None:  # options the LP proves in no plan as good as the best: out
            allowed, barred_s = lp.allowed(best[0])
            if allowed:
                problem = dataclasses.replace(problem, allowed=allowed)
                log.info("LP bounds leave out %d of %d options", sum(
                    len(lp.options[n]) - len(cs) for n, cs in allowed.items()),
                    sum(len(b) for b in lp.options.values()))
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            left = 1e-3  # one more (short) solve returns the incumbent found so far
        sol = solve_problem(problem, left)
        solve_s = time.perf_counter() - t_solve
        todo = unpriced(model, sol.assignment)
        log.info("solve %d%s: objective %.6g s on the estimates, bound %.6g s, %.2f s; "
                 "%d cells it uses unpriced", rounds + 1, " (priced cells only)" * priced_only,
                 sol.objective, sol.bound, solve_s, len(todo))
        if not todo and sol.status == "optimal" and not penalty:
            return sol
        rounds += 1
        _price_logged(model, todo, "the solution's cells")
        if not penalty:  # the solve's bound holds for the options kept; the others: barred_s
            bound = max(bound, min(sol.bound, barred_s))
        exact = model.objective(sol.assignment)
        if best is None or exact < best[0]:
            best = (exact, sol.assignment)
        out_of_time = sol.status != "optimal" or priced_only or (
            deadline is not None and time.perf_counter() >= deadline)
        if not out_of_time:
            hopeful = hopeful_cells(model, best[0], lp_bounds)
            predicted = model.pricer.predict_s(len(hopeful))
            # price them once rounds have not converged, or as soon as that is predicted to
            # take no longer than the solve just made (where pricing is cheap, one exact solve
            # beats more rounds); stop in time for one more solve, which uses the prices
            if hopeful and (rounds >= LAZY_ROUNDS or predicted <= solve_s):
                done = _price_logged(model, hopeful,
                                     f"cells that could be in a plan <= {best[0]:.6g} s",
                                     None if deadline is None else deadline - solve_s)
                priced_only = done < len(hopeful)
                exact_next = not priced_only
        warm = best[1]
        if deadline is not None and not out_of_time:
            left = deadline - time.perf_counter()
            # a solve with too little of the last one's time left would end past the limit;
            # with room for one more only, make it the last, over priced cells
            out_of_time = left < MIN_SOLVE_SHARE * solve_s
            priced_only = priced_only or (left < 2 * solve_s and not exact_next)
        if out_of_time:
            from formulations.problem import gap_of
            obj = best[0]
            low = min(bound, obj)
            log.info("out of time after %.2f s: best plan %.6g s, bound %.6g s",
                     time.perf_counter() - t0, obj, low)
            return dataclasses.replace(sol, assignment=dict(best[1]), objective=obj,
                                       status="time_limit", bound=low, gap=gap_of(obj, low))


def _price_logged(model: Model, cells: list[tuple], what: str,
                  deadline: float | None = None) -> int:
    t0 = time.perf_counter()
    done = model.pricer.prefetch_short(cells, deadline)
    log.info("priced %d %s in %.2f s%s", done, what, time.perf_counter() - t0,
             "" if done >= len(cells) else f" ({len(cells) - done} left: out of time)")
    return done


def _solve_problem(problem, time_limit_s: float | None, solver: str):
    import formulations as fm
    from .errors import InfeasibleError, SolverError
    try:
        return fm.solve(problem, solver=solver, time_limit_s=time_limit_s)
    except fm.Infeasible as e:
        err = InfeasibleError(
            f"no plan fits: {e}", fix="use more devices, weights='sharded', or a smaller batch"
            if e.min_capacity is None else
            f"each device needs at least {e.min_capacity / 1e9:.3f} GB; use more devices, "
            "weights='sharded', or a smaller batch or sequence")
        err.min_capacity = e.min_capacity
        raise err from None
    except fm.FormulationError as e:
        raise SolverError(f"the {solver} solve failed: {e}",
                          fix="raise time_limit_s, or try solver='cbc'") from None


# --------------------------------------------------------------------------- named plans

def named_assignment(model: Model, strategy: str) -> tuple[dict[str, int], tuple[str, ...]]:
    """The strategy's candidate index per node; also the ops that had no exact match."""
    from .named import check_strategy, op_choice
    check_strategy(strategy)
    graph = model.graph
    activations = {t.name for t in graph.tensors if t.kind in ("input", "intermediate")}
    fan = model.topology.fanouts()
    choice: dict[str, int] = {}
    inexact = []
    for op in graph.ops:
        i, exact = op_choice(strategy, model.nodes[op.name], model.roles.modes[op.name],
                             activations, fan)
        choice[op.name] = i
        if not exact:
            inexact.append(op.name)
    # Graph inputs: the layout cheapest given the ops (ties break on the lowest index, so
    # tied weights of repeated blocks choose alike).
    touching: dict[str, list[EdgeTerm]] = {}
    for e in model.edges:
        for end in (e.src, e.dst):
            if end.startswith(INPUT_PREFIX) and end not in choice:
                touching.setdefault(end, []).append(e)
    for k, oc in model.nodes.items():
        if k in choice:
            continue
        def cost(c: int, exact: bool) -> float:
            """The layout's seconds on its edges: exact (priced now), or their estimates."""
            tot = model.unary(k, c)
            for e in touching.get(k, ()):
                a, b = (c, choice[e.dst]) if e.src == k else (choice[e.src], c)
                x = e.cost(a, b) if exact else e.matrix.estimate(e.rows[a], e.cols[b])
                tot += x.seconds
            return tot
        choice[k] = _cheapest(len(oc.cands), cost)
    return {k: choice[k] for k in model.nodes}, tuple(inexact)


def _cheapest(n: int, cost) -> int:
    """argmin over c < n of (cost(c, exact=True), c), pricing few cells: candidates go in order
    of their estimate (a lower bound, summed in the same order), and once one's (estimate,
    index) exceeds the best exact (cost, index), no later one can win."""
    best: tuple[float, int] | None = None
    for low, c in sorted((cost(c, False), c) for c in range(n)):
        if best is not None and (low, c) > best:
            break
        here = (cost(c, True), c)
        if best is None or here < best:
            best = here
    assert best is not None
    return best[1]


# --------------------------------------------------------------------------- public API

def _options(weights: str, steady_state: bool, cost_model: CostModel | None,
             exchange_mode: str, overlap: bool = True) -> Options:
    cm = cost_model or CostModel()
    if exchange_mode != cm.exchange_mode:
        cm = CostModel(cm.flop_efficiency, cm.mem_efficiency, exchange_mode)
    return Options(weights, steady_state, cm, overlap)


def _plan(model: Model, assignment: Mapping[str, int], objective: float, bound, gap,
          solve_s: float, extra: Mapping[str, object]):
    from .plan import Plan
    choice = tuple((k, model.nodes[k].cands[assignment[k]]) for k in model.nodes)
    opts = dict(model.options.to_dict())
    opts.update(extra)
    return Plan(model.graph, model.topology, choice, objective, bound, gap, solve_s,
                tuple(sorted(opts.items())))


def candidates(graph: Graph, topology, weights: str = "sharded") -> dict[str, list[Candidate]]:
    """Node key (op name, or "input:<name>" for a graph input's layout) -> its candidates."""
    from .topology import load_topology
    topology = load_topology(topology)
    return {k: list(oc.cands) for k, oc in
            graph_candidates(graph, topology, weights=weights).items()}


def _restricted(graph: Graph, topology, options: Options,
                choice: Mapping[str, Candidate | int]) -> dict[str, OpCandidates]:
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
                from .placement import check_candidate
                check_candidate(oc.op, c)
                out[k] = OpCandidates(k, oc.op, (c,), ((),))
                continue
        out[k] = OpCandidates(k, oc.op, (oc.cands[i],), (oc.level_parts[i],))
    return out


def plan_cost(graph: Graph, topology, choice: Mapping[str, Candidate | int], *,
              weights: str = "sharded", steady_state: bool = False,
              cost_model: CostModel | None = None, exchange_mode: str = "optimized",
              overlap: bool = True) -> float:
    """The objective (seconds) of one candidate per node, exactly as the MIP scores it."""
    from .topology import load_topology
    topology = load_topology(topology)
    options = _options(weights, steady_state, cost_model, exchange_mode, overlap)
    model = build_model(graph, topology, options, _restricted(graph, topology, options, choice))
    return model.objective({k: 0 for k in model.nodes})


def named_plan(graph: Graph, topology, name: str, *, weights: str = "sharded",
               steady_state: bool = False, cost_model: CostModel | None = None,
               exchange_mode: str = "optimized", model: Model | None = None,
               overlap: bool = True):
    """The named strategy as a Plan in the same IR, priced on the same cost model."""
    from .named import STRATEGY_WEIGHTS, check_strategy
    from .topology import load_topology
    check_strategy(name)
    topology = load_topology(topology)
    options = _options(STRATEGY_WEIGHTS.get(name, weights), steady_state, cost_model,
                       exchange_mode, overlap)
    if model is None or model.options != options:
        model = build_model(graph, topology, options)
    assignment, inexact = named_assignment(model, name)
    obj = model.objective(assignment)
    return _plan(model, assignment, obj, None, None, 0.0,
                 {"strategy": name, "inexact_ops": list(inexact)})


# Part of every cache key: raise it whenever pricing changes which plan is optimal, so that
# no cached plan of an older cost model is served (2: exchanges over the rails; weights sent
# in one batch priced once).
CACHE_VERSION = 2
CACHE_ENV = "EINSUMMABLE_CACHE_DIR"


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "einsummable" / "plans"


def cache_key(graph: Graph, topology, options: Options, time_limit_s, solver: str) -> str:
    blob = json.dumps({"version": CACHE_VERSION, "graph": graph.to_dict(),
                       "topology": topology.to_dict(), "options": options.to_dict(),
                       "time_limit_s": time_limit_s, "solver": solver},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _load_cached(path: Path, graph: Graph, topology):
    """The cached plan, or None when absent, corrupt, or for another graph/topology."""
    from .plan import Plan
    try:
        plan = Plan.from_json(path.read_text())
    except (OSError, UnicodeDecodeError, EinsummableError, Exception):  # corrupt: rebuild
        return None
    if plan.graph.to_dict() != graph.to_dict() or plan.topology.to_dict() != topology.to_dict():
        return None
    return plan


def _store(path: Path, plan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(plan.to_json(timing=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs a re-solve next time


def optimize(graph: Graph, topology, time_limit_s: float | None = None,
             weights: str = "sharded", steady_state: bool = False, *, solver: str = "highs",
             cache: bool | str | os.PathLike = True, cost_model: CostModel | None = None,
             exchange_mode: str = "optimized", warm_start: bool = True,
             pricer: EdgePricer | None = None, overlap: bool = True):
    """The MIP-optimal Plan for `graph` on `topology` (see the module docstring).

    time_limit_s: wall seconds for the whole search, model build and pricing included; when
    it runs out the best plan found is returned with its bound and gap (status "time_limit").
    cache: True (default directory, or $EINSUMMABLE_CACHE_DIR), a directory, or False.
    pricer: an EdgePricer for this topology and cost model to reuse (its memo is shared with
    later builds, e.g. of named plans on the same graph); None makes a fresh one.
    overlap: weight exchanges stream behind compute (`overlap.py`); False: plain sum.
    """
    from .topology import load_topology
    t0 = time.perf_counter()
    topology = load_topology(topology)
    options = _options(weights, steady_state, cost_model, exchange_mode, overlap)
    path = None
    if cache:
        d = cache_dir(None if cache is True else cache)
        path = d / f"{cache_key(graph, topology, options, time_limit_s, solver)}.json"
        hit = _load_cached(path, graph, topology)
        if hit is not None:
            return hit
    model = build_model(graph, topology, options, pricer=pricer)
    warm = None
    best_named = None
    named: list[dict[str, int]] = []
    if warm_start:
        from .named import STRATEGIES, STRATEGY_WEIGHTS
        for name in STRATEGIES:
            if STRATEGY_WEIGHTS.get(name, options.weights) != options.weights:
                continue
            a, _ = named_assignment(model, name)
            named.append(a)
            obj = model.objective(a)
            if best_named is None or obj < best_named[0]:
                best_named = (obj, a, name)
        warm = best_named[1] if best_named else None
    left = None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - t0))
    sol = solve_model(model, time_limit_s=left, solver=solver, warm_start=warm,
                      incumbents=named)
    solve_s = time.perf_counter() - t0
    extra = {"solver": solver, "status": sol.status, "time_limit_s": time_limit_s,
             "warm_start": best_named[2] if best_named else None}
    bound, gap = sol.bound, sol.gap
    if sol.status == "optimal" and gap <= ROUNDING_GAP:
        bound, gap = sol.objective, 0.0
    plan = _plan(model, sol.assignment, sol.objective, bound, gap, solve_s, extra)
    if path is not None:
        _store(path, plan)
    return plan


# --------------------------------------------------------------------------- explain

def explain_plan(plan, strategies: bool = True) -> str:
    """Text report: per op the split per level, compute and exchange seconds, bytes moved in,
    and the op's seconds under each named strategy."""
    from .named import STRATEGIES, STRATEGY_WEIGHTS
    opt = plan.option
    options = _options(opt.get("weights", "sharded"), bool(opt.get("steady_state", False)),
                       CostModel(**opt["cost"]) if "cost" in opt else None,
                       opt.get("cost", {}).get("exchange_mode", "optimized"),
                       bool(opt.get("overlap", True)))
    graph, topology = plan.graph, plan.topology
    model = build_model(graph, topology, options,
                        _restricted(graph, topology, options, plan.chosen))
    mine = {k: 0 for k in model.nodes}
    per_op = _per_node(model, mine)
    others: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    if strategies:
        for name in STRATEGIES:
            sp = named_plan(graph, topology, name, weights=options.weights,
                            steady_state=options.steady_state, cost_model=options.cost,
                            overlap=options.overlap)
            sopt = sp.option
            so = _options(sopt["weights"], options.steady_state, options.cost,
                          options.cost.exchange_mode, options.overlap)
            m2 = build_model(graph, topology, so, _restricted(graph, topology, so, sp.chosen))
            others[name] = {k: v[0] + v[1] for k, v in _per_node(m2, {k: 0 for k in m2.nodes}).items()}
            totals[name] = sp.objective_s
    lines = [f"plan for {len(graph.ops)} ops on {topology.name} ({topology.world_size} devices), "
             f"weights={options.weights}, steady_state={options.steady_state}",
             f"objective {plan.objective_s * 1e3:.4f} ms"
             + (f", bound {plan.bound_s * 1e3:.4f} ms, gap {plan.gap:.2e}"
                if plan.bound_s is not None and plan.gap is not None else "")
             + (f", solved in {plan.solve_s:.2f} s" if plan.solve_s else "")
             + (" (stopped at the time limit: the best plan found)"
                if opt.get("status") == "time_limit" else "")]
    if options.overlap:
        from .overlap import split
        parts = split(model, mine)
        lines.append(f"activation exchanges {parts.activations_s * 1e3:.4f} ms + max(compute "
                     f"{parts.compute_s * 1e3:.4f} ms, weight exchanges {parts.weights_s * 1e3:.4f}"
                     " ms streamed behind it)")
    if totals:
        lines.append("named strategies: " + ", ".join(
            f"{n} {t * 1e3:.4f} ms" + (" (weights replicated)" if n in STRATEGY_WEIGHTS else "")
            for n, t in totals.items()))
    head = f"{'op':<28} {'split per level':<34} {'compute ms':>10} {'exch ms':>9} {'MB in':>9}"
    if others:
        head += "  " + " ".join(f"{n[:12]:>12}" for n in others)
    lines.append(head)
    for k, (comp, exch, nbytes) in per_op.items():
        label = str(plan.chosen[k])
        row = f"{k[:28]:<28} {label[:34]:<34} {comp * 1e3:>10.4f} {exch * 1e3:>9.4f} " \
              f"{nbytes / 1e6:>9.2f}"
        if others:
            row += "  " + " ".join(f"{others[n].get(k, 0.0) * 1e3:>12.4f}" for n in others)
        lines.append(row)
    return "\n".join(lines)


def _per_node(model: Model, choice: Mapping[str, int]) -> dict[str, tuple[float, float, int]]:
    """Per node: compute seconds, seconds of the exchanges into it, bytes moved into it."""
    out = {k: [model.unary(k, choice[k]), 0.0, 0] for k in model.nodes}
    for e in model.edges:
        c = e.cost(choice[e.src], choice[e.dst])
        out[e.dst][1] += c.seconds
        out[e.dst][2] += c.nbytes
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}
