"""Exact dynamic program for problems whose graph is a forest (chains, trees) and that have no
memory capacities or side constraints. It drops in beside the MIP: same `Solution` type.

For each tree, rooted at its smallest node name, leaves are eliminated upwards:
    msg_v(c_parent) = min_c [ a_v(c) + Σ_{children w} msg_w(c) + w_e(c_parent, c) ]
then choices are read back from the root down. Parallel edges between the same two nodes are
summed first (that is still a tree); self-loops are unary costs.
"""

from __future__ import annotations

import time

import numpy as np

from .errors import FormulationError, InvalidProblem
from .problem import Problem, Solution, objective


class NotATree(InvalidProblem):
    """The problem has a cycle, ties, memory capacities or side constraints."""


def _full(e, ku: int, kv: int) -> np.ndarray:
    cost = np.asarray(e.cost, dtype=float)
    rows = np.arange(ku) if e.src_proj is None else np.asarray(e.src_proj)
    cols = np.arange(kv) if e.dst_proj is None else np.asarray(e.dst_proj)
    return cost[np.ix_(rows, cols)]


def forest_argmin(keys: list, unary: dict, pair: dict) -> dict:
    """Exact minimiser of Σ_v unary[v][c_v] + Σ_(a,b) pair[(a,b)][c_a, c_b] over a forest.

    keys: sorted node keys; pair[(a, b)] (a < b) is the matrix [a option][b option].
    Raises NotATree on a cycle. Ties in the minimum go to the lowest option index.
    """
    adj: dict = {n: [] for n in keys}
    for a, b in sorted(pair):
        adj[a].append(b)
        adj[b].append(a)
    choice: dict = {}
    seen: set = set()
    for root in keys:
        if root in seen:
            continue
        # iterative DFS: order, parents; a visited non-parent neighbour means a cycle
        order, parent, stack = [], {root: None}, [root]
        seen.add(root)
        while stack:
            v = stack.pop()
            order.append(v)
            for w in adj[v]:
                if w == parent[v]:
                    continue
                if w in seen:
                    raise NotATree(f"nodes {v!r} and {w!r} close a cycle; use formulations.solve")
                seen.add(w)
                parent[w] = v
                stack.append(w)
        total = {v: np.asarray(unary[v], dtype=float).copy() for v in order}  # a_v + child messages
        best_child: dict = {}
        for v in reversed(order):
            p = parent[v]
            if p is None:
                continue
            mat = pair[(p, v)] if (p, v) in pair else pair[(v, p)].T  # [p option][v option]
            cand = mat + total[v][None, :]
            best_child[v] = np.argmin(cand, axis=1)  # first minimum: deterministic
            total[p] = total[p] + cand[np.arange(len(total[p])), best_child[v]]
        if not np.isfinite(total[root].min()):
            raise FormulationError("fixed and allowed options leave no finite choice")
        choice[root] = int(np.argmin(total[root]))
        for v in order[1:]:
            choice[v] = int(best_child[v][choice[parent[v]]])
    return choice


def solve_tree(problem: Problem) -> Solution:
    t0 = time.perf_counter()
    if problem.capacities is not None and any(n.memory is not None for n in problem.nodes):
        raise NotATree("dp does not model memory capacities; use formulations.solve")
    if problem.side:
        raise NotATree("dp does not model side constraints; use formulations.solve")
    if problem.has_parts:
        raise NotATree("dp does not model overlapping parts (a max); use formulations.solve")
    if any(len(set(g)) > 1 for g in problem.tie):
        raise NotATree("tie groups couple distant nodes (not a tree); use formulations.solve")

    names = sorted(n.name for n in problem.nodes)
    k = {n.name: n.n_options for n in problem.nodes}
    unary = {n.name: np.asarray(n.costs, dtype=float).copy() for n in problem.nodes}
    big = float("inf")
    # a fixed option, or the allowed ones: forbid every other option
    domains = [(n, (c,)) for n, c in problem.fixed.items()] + list(problem.allowed.items())
    for n, cs in domains:
        mask = np.full(k[n], big)
        mask[list(cs)] = 0.0
        unary[n] = unary[n] + mask

    pair: dict[tuple[str, str], np.ndarray] = {}  # (a, b) with a < b -> matrix [a option][b option]
    for e in problem.edges:
        mat = _full(e, k[e.src], k[e.dst])
        if e.src == e.dst:
            unary[e.src] += np.diag(mat)
            continue
        a, b = sorted((e.src, e.dst))
        if a != e.src:
            mat = mat.T
        pair[(a, b)] = pair.get((a, b), 0.0) + mat
    choice = forest_argmin(names, unary, pair)
    assignment = {n: choice[n] for n in names}
    obj = objective(problem, assignment)
    return Solution(assignment, obj, obj, 0.0, time.perf_counter() - t0, "optimal", "dp")
