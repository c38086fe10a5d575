r"""Weight transfers hidden under compute: the objective, and how the MIP minimises it.

Weights do not depend on the activations, so lowering sends them ahead of the ops that read
them (numbered prefetch queues on a low-priority stream) while the devices compute. A plan's
time is modelled as

    T(x) = A(x) + max(C(x), W(x))

    A   activation exchanges: every edge whose source is not a weight, the steady-state edge
        and the fold of unfed graph outputs; they sit on the critical path
    C   compute: the candidates' kernel seconds
    W   weight exchanges: the edges out of "input:<weight>" nodes, which stream behind the
        compute (they cannot finish before their bytes have crossed, nor slow compute down);
        the copies that stitch a gathered weight together are device work and count in C.
        Where the transport charges per message, lowering sends every weight in one batch,
        whose route latencies and message costs are paid once, not once per weight: there
        each weight edge counts its batched seconds (`EdgeCost.batched_s`)

T is not a sum of pairwise terms, but it is one MIP away: formulations.Problem takes
"overlapping parts", an objective plain + max(part 0, part 1), and models the max as an
epigraph variable z ≥ part 0, z ≥ part 1. A is the plain cost, C part 0, W part 1; the MIP
then minimises T itself, exactly, in one solve (an earlier Lagrangian search over
A + (1 - β) C + β W needed several solves and could leave a duality gap). Extra incumbents (the
named strategies) are scored with T too, so the result is never worse than any of them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Split:
    """T's three parts for one choice, in seconds."""
    activations_s: float
    compute_s: float
    weights_s: float

    @property
    def total_s(self) -> float:
        return self.activations_s + max(self.compute_s, self.weights_s)


def is_weight_edge(model, e) -> bool:
    return e.src.startswith("input:") and model.graph.tensor(e.tensor).kind == "weight"


def split(model, choice: Mapping[str, int]) -> Split:
    """A, C and W of a choice (node -> candidate index), summed in a fixed order."""
    a = c = w = 0.0
    for k in model.nodes:
        c += model.compute[k][choice[k]].total_s
        f = model.finish.get(k)
        if f:
            a += f[choice[k]].seconds
    for e in model.edges:
        x = e.cost(choice[e.src], choice[e.dst])
        if is_weight_edge(model, e):
            w += x.in_batch_s - x.local_s
            c += x.local_s
        else:
            a += x.seconds
    return Split(a, c, w)


def cell_terms(model, e, x) -> tuple[float, tuple[float, float] | None]:
    """A cell's plain cost and (C, W) parts in `overlap_problem`, for edge cost x: a weight
    edge streams its wire seconds behind compute (W) and stitches on the device (C)."""
    if is_weight_edge(model, e):
        return 0.0, (x.local_s, x.in_batch_s - x.local_s)
    return x.seconds, None


def overlap_problem(model, warm_start: Mapping[str, int] | None,
                    unpriced_penalty: float = 0.0):
    """The pairwise problem of T: A as plain costs, C and W as the two overlapping parts
    (formulations.Problem: objective = plain + max(part 0, part 1)). Unpriced edge cells carry
    their estimates, which are at most the exact seconds and local seconds, so every part,
    and T (non-decreasing in each), is at most its exact value; `unpriced_penalty` seconds
    join their plain cost (`optimize.solve_lazily`'s last solve under a time limit)."""
    import formulations as fm
    from .optimize import unpriced_penalties
    nodes = []
    for k, oc in model.nodes.items():
        mem = model.memory[k] if model.memory is not None else None
        f = model.finish.get(k)
        n = len(oc.cands)
        nodes.append(fm.Node(k, tuple(f[c].seconds if f else 0.0 for c in range(n)), mem,
                             (tuple(model.compute[k][c].total_s for c in range(n)),
                              (0.0,) * n)))
    edges = []
    for e in model.edges:
        terms = [[cell_terms(model, e, x) for x in row] for row in e.matrix.estimates()]
        pen = unpriced_penalties(e.matrix, unpriced_penalty)
        plain = tuple(tuple(t[0] + p for t, p in zip(row, prow))
                      for row, prow in zip(terms, pen))
        if is_weight_edge(model, e):
            parts = tuple(tuple(tuple(t[1][k] for t in row) for row in terms) for k in range(2))
            edges.append(fm.Edge(e.src, e.dst, plain, e.rows, e.cols, parts))
        else:
            edges.append(fm.Edge(e.src, e.dst, plain, e.rows, e.cols))
    return fm.Problem(tuple(nodes), tuple(edges), model.capacities, tie=model.ties,
                      warm_start=dict(warm_start) if warm_start else None)


def solve(model, solve_problem, *, incumbents: tuple[Mapping[str, int], ...] = (),
          time_limit_s: float | None = None):
    """Minimise T over the model's choices: one MIP (`overlap_problem`), its max as an
    epigraph variable. `solve_problem(make, warm_start, time_limit_s)` solves the problem
    `make(warm_start, unpriced_penalty)` builds (optimize.solve_lazily with the caller's
    solver settings).
    `incumbents` (e.g. the named strategies) are scored with T; the best warm-starts the
    solve, and the result is never worse than any of them."""
    from .errors import SolverError
    from formulations.problem import Solution, gap_of as relative_gap
    t0 = time.perf_counter()
    best: tuple[float, dict[str, int]] | None = None
    for inc in incumbents:
        t = split(model, inc).total_s
        if best is None or t < best[0]:
            best = (t, dict(inc))
    sol = solve_problem(lambda warm, pen: overlap_problem(model, warm, pen),
                        best[1] if best else None, time_limit_s)
    t = split(model, sol.assignment).total_s  # the same sums, in the order plans are scored
    if best is None or t < best[0]:
        best = (t, dict(sol.assignment))
    if best is None:
        raise SolverError("no plan found within the time limit", fix="raise time_limit_s")
    bound = min(sol.bound, best[0])
    return Solution(best[1], best[0], bound, relative_gap(best[0], bound),
                  time.perf_counter() - t0, sol.status, sol.solver)
