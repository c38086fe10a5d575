"""Generic pairwise-choice optimisation: every node picks one option; unary and pairwise
costs, memory capacities, ties and linear side constraints. Imports nothing from einsummable.

    solve(problem, solver="highs" | "cbc", time_limit_s=None, threads=None, msg=False)
    exhaustive(problem)      brute-force oracle for small problems
    solve_tree(problem)      exact DP for forests without memory or side constraints
"""

from .dp import NotATree, solve_tree
from .errors import FormulationError, Infeasible, InvalidProblem, SolveFailed
from .exhaustive import exhaustive
from .pairwise import solve
from .problem import (
    Edge,
    LinearConstraint,
    Node,
    Problem,
    Solution,
    memory_usage,
    objective,
    violations,
)

__all__ = [
    "Edge", "LinearConstraint", "Node", "Problem", "Solution",
    "solve", "exhaustive", "solve_tree",
    "objective", "memory_usage", "violations",
    "FormulationError", "Infeasible", "InvalidProblem", "SolveFailed", "NotATree",
]
