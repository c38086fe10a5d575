"""Brute force over every assignment: the oracle the MIP is tested against (small problems)."""

from __future__ import annotations

import itertools
import time

from .compact import compact
from .errors import Infeasible, InvalidProblem
from .problem import Problem, Solution, memory_excess, objective, violations

MAX_ASSIGNMENTS = 2_000_000


def exhaustive(problem: Problem) -> Solution:
    """Enumerate every choice (tie groups choose once, fixed nodes do not vary); the first
    assignment of least objective in lexicographic order of classes wins. Raises Infeasible
    with the same memory diagnosis as `solve`."""
    t0 = time.perf_counter()
    cp = compact(problem)  # only for the classes and domains; costs come from `problem`
    size = 1
    for d in cp.domain:
        size *= len(d)
    if size > MAX_ASSIGNMENTS:
        raise InvalidProblem(f"exhaustive search over {size} assignments is too large")
    idx = list(range(len(cp.domain)))
    best: tuple[float, dict[str, int]] | None = None
    # (excess, resource, assignment) over assignments feasible apart from memory
    least_excess: tuple[float, int, dict[str, int]] | None = None
    for combo in itertools.product(*cp.domain):
        assignment = cp.expand(dict(zip(idx, combo)))
        if violations(problem, assignment, memory=False):
            continue
        if problem.capacities is not None:
            ex = memory_excess(problem, assignment)
            if least_excess is None or ex[0] < least_excess[0]:
                least_excess = (*ex, assignment)
        if violations(problem, assignment):
            continue
        obj = objective(problem, assignment)
        if best is None or obj < best[0]:
            best = (obj, assignment)
    if best is None:
        if least_excess is None:
            raise Infeasible("no assignment satisfies the fixed options, tie groups and side constraints")
        extra, k, least = least_excess
        cap = problem.capacities[k]
        raise Infeasible(
            f"memory needs at least {cap + extra:.6g} bytes on resource {k}; capacity is {cap:.6g}",
            min_capacity=cap + extra, resource=k, capacity=cap, extra=extra, assignment=least,
        )
    obj, assignment = best
    return Solution(assignment, obj, obj, 0.0, time.perf_counter() - t0, "optimal", "exhaustive")
