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
        the copies that stitch a gathered weight together are device work and count in C

T is not a sum of pairwise terms, so the pairwise MIP minimises its Lagrangian instead. For
every β in [0, 1], max(C, W) ≥ (1 - β) C + β W, hence

    L(β) = min_x  A(x) + (1 - β) C(x) + β W(x)   ≤   min_x T(x)

is the same pairwise MIP with scaled costs, the solver's bound on it is a bound on T, and its
minimiser x_β is a plan whose T is an incumbent. L is concave in β with supergradient
W(x_β) - C(x_β): where the weights of x_β hide (W ≤ C) a smaller β is tried, else a larger one.
At a β whose minimiser has W = C, or at β = 0 when its minimiser has W ≤ C (the common case:
compute dominates), the incumbent equals the bound and the plan is optimal. The search stops
there or after `MAX_DUAL_STEPS` solves and reports the gap that remains. Extra incumbents (the
named strategies) are scored with T too, so the result is never worse than any of them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

# Solves of the Lagrangian after β = 0 before the remaining gap is reported.
MAX_DUAL_STEPS = 6
# Relative gap at which the search stops (solver tolerances are of this order).
GAP_TOLERANCE = 1e-9


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
            w += x.seconds - x.local_s
            c += x.local_s
        else:
            a += x.seconds
    return Split(a, c, w)


def lagrangian_problem(model, beta: float, warm_start: Mapping[str, int] | None):
    """The pairwise problem of L(β): C scaled by 1 - β, W by β (A as it is)."""
    import formulations as fm
    nodes = []
    for k, oc in model.nodes.items():
        mem = model.memory[k] if model.memory is not None else None
        f = model.finish.get(k)
        nodes.append(fm.Node(k, tuple((1 - beta) * model.compute[k][c].total_s
                                      + (f[c].seconds if f else 0.0)
                                      for c in range(len(oc.cands))), mem))
    edges = []
    for e in model.edges:
        # estimates: exact where priced, else a bound on the wire part and 0 local, which
        # bounds β·wire + (1 - β)·local from below as well
        cells = e.matrix.estimates()
        if is_weight_edge(model, e):
            cost = tuple(tuple(beta * (x.seconds - x.local_s) + (1 - beta) * x.local_s
                               for x in row) for row in cells)
        else:
            cost = tuple(tuple(x.seconds for x in row) for row in cells)
        edges.append(fm.Edge(e.src, e.dst, cost, e.rows, e.cols))
    return fm.Problem(tuple(nodes), tuple(edges), model.capacities, tie=model.ties,
                      warm_start=dict(warm_start) if warm_start else None)


@dataclass(frozen=True)
class Result:
    assignment: dict[str, int]
    objective: float
    bound: float
    gap: float
    wall_s: float
    status: str
    betas: tuple[float, ...]


def solve(model, solve_problem, *, incumbents: tuple[Mapping[str, int], ...] = (),
          time_limit_s: float | None = None) -> Result:
    """Minimise T over the model's choices. `solve_problem(make, warm_start, time_limit_s)`
    solves the pairwise problem `make(warm_start)` builds (optimize.solve_lazily with the
    caller's solver settings)."""
    from .errors import SolverError
    from formulations.problem import gap_of as relative_gap
    t0 = time.perf_counter()
    best: tuple[float, dict[str, int]] | None = None
    for inc in incumbents:
        t = split(model, inc).total_s
        if best is None or t < best[0]:
            best = (t, dict(inc))
    bound = float("-inf")
    status = "optimal"
    lo, hi = 0.0, 1.0
    beta = 0.0
    betas = []
    for step in range(MAX_DUAL_STEPS + 1):
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            status = "time_limit"
            break
        sol = solve_problem(lambda warm, b=beta: lagrangian_problem(model, b, warm),
                            best[1] if best else None, left)
        betas.append(beta)
        if sol.status != "optimal":
            status = "time_limit"
        bound = max(bound, sol.bound)
        s = split(model, sol.assignment)
        if best is None or s.total_s < best[0]:
            best = (s.total_s, dict(sol.assignment))
        if relative_gap(best[0], bound) <= GAP_TOLERANCE:
            break
        if s.weights_s > s.compute_s:
            lo = beta          # weights exposed: weigh them more
        else:
            hi = beta          # weights hidden: weigh compute more
        if hi <= lo:           # β = 0 hides the weights but the solve was not exact
            break
        beta = (lo + hi) / 2
    if best is None:
        raise SolverError("no plan found within the time limit", fix="raise time_limit_s")
    bound = min(bound, best[0])
    gap = relative_gap(best[0], bound)
    if gap > GAP_TOLERANCE and status == "optimal":
        status = "gap"  # every solve was exact; the Lagrangian bound leaves this gap
    return Result(best[1], best[0], bound, gap, time.perf_counter() - t0, status, tuple(betas))
