r"""The pairwise-choice MIP, solved through PuLP (HiGHS via highspy, or CBC).

Formulation (after the exact presolve in `compact.py`; sets below are over the presolved classes)

    variables
        x[v,c] ∈ {0,1}          class v uses option c                       (c in dom(v))
        y[e,r,s] ≥ 0            edge e = (u,v) sits at cost cell (r,s)      (continuous)

    projections  P_e(r) = {c : row_e(c) = r},  Q_e(s) = {c' : col_e(c') = s}

    minimise    Σ_v Σ_c a[v,c]·x[v,c]  +  Σ_e Σ_{r,s} w[e,r,s]·y[e,r,s]

    subject to
        onehot_v        Σ_c x[v,c] = 1
        ysrc_e_r        Σ_s y[e,r,s] = Σ_{c ∈ P_e(r)} x[u,c]
        ydst_e_s        Σ_r y[e,r,s] = Σ_{c' ∈ Q_e(s)} x[v,c']
        mem_k           Σ_v Σ_c m[k,v,c]·x[v,c] ≤ cap[k] − (memory of one-option classes)
        side_i          Σ coef·x  (≤ | ≥ | =)  rhs − (constants of one-option classes)
        maxpart_k       z ≥ Σ_v Σ_c p_k[v,c]·x[v,c] + Σ_e Σ_{r,s} q_k[e,r,s]·y[e,r,s] + const_k
                        (with overlapping parts, Problem: z joins the objective, so it is
                        the larger part at the optimum)

With x integral the marginals of y are the one-hot vectors of the two projected choices, so
y is their outer product and integral without being declared binary; the LP relaxation is the
standard local-marginal relaxation, exact on trees. Objective coefficients are divided by their
largest magnitude before solving (seconds are small numbers; solver tolerances are absolute) and
the bound is scaled back. The reported objective is always re-evaluated on the original problem.

When memory makes the problem infeasible, a second model minimises δ subject to
mem_k ≤ cap[k] + δ for all k (same onehot / side / tie constraints, no objective terms), which
gives the smallest extra memory per resource that would fit. Elastic side constraints are
memory rows the caller adds (e.g. cuts over pairs of choices): they take the same δ there, and
the feasibility check without memory leaves them out.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pulp

from .compact import Compact, compact
from .dp import NotATree, forest_argmin
from .errors import Infeasible, InvalidProblem, SolveFailed
from .problem import Problem, Solution, gap_of, memory_excess, objective, violations

SolverName = Literal["highs", "cbc"]
_SEED = 0
# Objectives are scaled to at most 1 per term; a returned solution whose objective differs from
# the reported one by more than this is not the solution HiGHS found.
STALE_TOL = 1e-6
# The least time limit handed to HiGHS (it needs a positive one to return its incumbent).
MIN_SOLVER_S = 1e-3


@contextlib.contextmanager
def _quiet_stdout():
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _HiGHS(pulp.HiGHS):
    """pulp.HiGHS (in-process highspy) plus a MIP start and a guard for runs with no solution."""

    def __init__(self, start: list[tuple[pulp.LpVariable, float]] | None = None,
                 deadline: float | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._start = start
        self._deadline = deadline  # time.perf_counter() by which the solve must end

    def createAndConfigureSolver(self, lp) -> None:
        if self.msg:
            return super().createAndConfigureSolver(lp)
        # HiGHS prints its banner from the C++ constructor (once per process) before
        # output_flag can be cleared; keep stdout clean for callers that print JSON there.
        with _quiet_stdout():
            super().createAndConfigureSolver(lp)

    def callSolver(self, lp) -> None:
        if self._deadline is not None:
            # PuLP hands the model to HiGHS first (seconds for large models): what is left
            # of the budget is HiGHS's own limit
            left = self._deadline - time.perf_counter()
            lp.solverModel.setOptionValue("time_limit", max(MIN_SOLVER_S, left))
        if self._start:
            import highspy

            values = [0.0] * lp.solverModel.getNumCol()
            for var, val in self._start:  # var.index was set by buildSolverModel
                values[var.index] = val
            sol = highspy.HighsSolution()
            sol.col_value = values
            sol.value_valid = True
            lp.solverModel.setSolution(sol)
        super().callSolver(lp)

    def findSolutionValues(self, lp):
        # pulp indexes the (empty) solution vector even when HiGHS found nothing.
        if lp.solverModel.getInfo().primal_solution_status != 2:
            return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound
        return super().findSolutionValues(lp)


@dataclass
class _Built:
    lp: pulp.LpProblem
    x: dict[tuple[int, int], pulp.LpVariable]
    y: list[dict[tuple[int, int], pulp.LpVariable]]
    scale: float  # solver objective = (true objective - offset) / scale
    offset: float
    trivially_infeasible: str | None  # a row with no variables that cannot hold
    z: pulp.LpVariable | None = None  # max of the parts (scaled), when the problem has parts
    part_consts: tuple[float, ...] = ()  # each part's constant from one-option classes


def _affine(terms) -> pulp.LpAffineExpression:
    return pulp.LpAffineExpression(terms)


def _build(cp: Compact, capacities: tuple[float, ...] | None, mode: str) -> _Built:
    """mode: "cost" (the MIP), "feasible" (no memory rows, zero objective), "excess" (min δ)."""
    lp = pulp.LpProblem("pairwise", pulp.LpMinimize)
    active = cp.active
    x: dict[tuple[int, int], pulp.LpVariable] = {}
    for i in active:
        row = []
        for c in cp.domain[i]:
            var = lp.add_variable(f"x_{i}_{c}", cat=pulp.LpBinary)
            x[(i, c)] = var
            row.append((var, 1.0))
        lp.addConstraint(pulp.LpConstraint(_affine(row), pulp.LpConstraintEQ, f"onehot_{i}", 1.0))

    offset = float(sum(cp.unary[i][cp.domain[i][0]] for i in range(len(cp.domain)) if len(cp.domain[i]) == 1))
    obj: list[tuple[pulp.LpVariable, float]] = []
    ys: list[dict[tuple[int, int], pulp.LpVariable]] = []
    scale = 1.0
    if mode == "cost":
        mags = [float(np.max(np.abs(cp.unary[i][list(cp.domain[i])]))) for i in active]
        mags += [float(e.cost.max()) for e in cp.edges]
        if cp.unary_parts is not None:
            mags += [float(np.max(np.abs(cp.unary_parts[i][:, list(cp.domain[i])]))) for i in active]
            mags += [float(np.abs(e.parts).max()) for e in cp.edges if e.parts is not None]
        scale = max([m for m in mags if m > 0] or [1.0])
        for i in active:
            obj += [(x[(i, c)], float(cp.unary[i][c]) / scale) for c in cp.domain[i]]
        for j, e in enumerate(cp.edges):
            R, S = e.cost.shape
            y = {(r, s): lp.add_variable(f"y_{j}_{r}_{s}", lowBound=0) for r in range(R) for s in range(S)}
            ys.append(y)
            obj += [(y[(r, s)], float(e.cost[r, s]) / scale) for r in range(R) for s in range(S) if e.cost[r, s] != 0]
            for r in range(R):
                terms = [(y[(r, s)], 1.0) for s in range(S)]
                terms += [(x[(e.u, c)], -1.0) for c in cp.domain[e.u] if e.rows[c] == r]
                lp.addConstraint(pulp.LpConstraint(_affine(terms), pulp.LpConstraintEQ, f"ysrc_{j}_{r}", 0.0))
            for s in range(S):
                terms = [(y[(r, s)], 1.0) for r in range(R)]
                terms += [(x[(e.v, c)], -1.0) for c in cp.domain[e.v] if e.cols[c] == s]
                lp.addConstraint(pulp.LpConstraint(_affine(terms), pulp.LpConstraintEQ, f"ydst_{j}_{s}", 0.0))
        if cp.unary_parts is not None:
            # objective + max_k part_k: z >= part_k for every k, z in the objective
            z = lp.add_variable("z_max_parts")
            obj.append((z, 1.0))
            consts = []
            for k in range(cp.unary_parts[0].shape[0]):
                const = float(sum(cp.unary_parts[i][k, cp.domain[i][0]]
                                  for i in range(len(cp.domain)) if len(cp.domain[i]) == 1))
                consts.append(const)
                terms = [(z, 1.0)]
                for i in active:
                    terms += [(x[(i, c)], -float(cp.unary_parts[i][k, c]) / scale)
                              for c in cp.domain[i] if cp.unary_parts[i][k, c] != 0]
                for e, y in zip(cp.edges, ys):
                    if e.parts is None:
                        continue
                    R, S = e.cost.shape
                    terms += [(y[(r, s)], -float(e.parts[k, r, s]) / scale)
                              for r in range(R) for s in range(S) if e.parts[k, r, s] != 0]
                lp.addConstraint(pulp.LpConstraint(_affine(terms), pulp.LpConstraintGE,
                                                   f"maxpart_{k}", const / scale))
            z_var, part_consts = z, tuple(consts)

    bad: str | None = None
    senses = {"<=": pulp.LpConstraintLE, ">=": pulp.LpConstraintGE, "==": pulp.LpConstraintEQ}
    rows = capacities is not None and cp.memory is not None
    memory_rows = (rows or any(s.elastic for s in cp.side)) and mode != "feasible"
    # Excess mode: δ is the bytes every memory row (capacity rows and elastic side rows) may
    # exceed its bound by, in units of the common scale (so δ = 1 is `common` bytes). In
    # bytes, its coefficients (1/common, about 1e-8) sat where HiGHS's tolerances hide them:
    # it returned a far larger excess than the least, as "optimal".
    delta = lp.add_variable("delta") if mode == "excess" and memory_rows else None
    common = max([1.0] + [abs(c) for c in capacities or ()]
                 + [float(np.abs(m).max()) for m in cp.memory or ()]
                 + [abs(s.rhs) for s in cp.side if s.elastic])
    for idx, s in enumerate(cp.side):
        if s.elastic and mode == "feasible":
            continue  # a memory row: the check without memory leaves it out
        if s.elastic and delta is not None:
            safe = re.sub(r"[^A-Za-z0-9_]", "_", s.name)[:40]
            expr = _affine([(x[(i, c)], a / common) for i, c, a in s.terms] + [(delta, -1.0)])
            lp.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintLE, f"side_{idx}_{safe}",
                                               s.rhs / common))
            continue
        if not s.terms:
            ok = {"<=": 0.0 <= s.rhs + 1e-9, ">=": 0.0 >= s.rhs - 1e-9, "==": abs(s.rhs) <= 1e-9}[s.sense]
            if not ok:
                bad = f"side constraint {s.name!r} cannot hold with the fixed options"
            continue
        safe = re.sub(r"[^A-Za-z0-9_]", "_", s.name)[:40]
        expr = _affine([(x[(i, c)], a) for i, c, a in s.terms])
        lp.addConstraint(pulp.LpConstraint(expr, senses[s.sense], f"side_{idx}_{safe}", s.rhs))

    if memory_rows and rows:
        # One common scale for excess mode keeps δ comparable across resources.
        for k, cap in enumerate(capacities):
            const = float(sum(cp.memory[i][k, cp.domain[i][0]] for i in range(len(cp.domain)) if len(cp.domain[i]) == 1))
            div = common if mode == "excess" else max(1.0, abs(cap))
            terms = [(x[(i, c)], float(cp.memory[i][k, c]) / div) for i in active for c in cp.domain[i] if cp.memory[i][k, c] != 0]
            if delta is not None:
                terms.append((delta, -1.0))
            elif not terms:
                if const > cap + 1e-7 * max(1.0, abs(cap)):
                    bad = bad or "memory"
                continue
            lp.addConstraint(pulp.LpConstraint(_affine(terms), pulp.LpConstraintLE, f"mem_{k}", (cap - const) / div))
    if delta is not None:
        obj = [(delta, 1.0)]
    if not obj:  # keep one variable in the objective so every backend accepts the model
        first = next(iter(x.values()), None)
        if first is not None:
            obj = [(first, 0.0)]
    lp.setObjective(_affine(obj))
    if mode == "cost" and cp.unary_parts is not None:
        return _Built(lp, x, ys, scale, offset, bad, z_var, part_consts)
    return _Built(lp, x, ys, scale, offset, bad)


@dataclass(frozen=True)
class _Run:
    status: str  # optimal | time_limit | infeasible | failed
    bound: float | None  # in solver units
    detail: str


def _run(lp: pulp.LpProblem, solver: str, time_limit_s, threads, msg, start) -> _Run:
    if solver == "highs":
        if not pulp.HiGHS().available():
            raise SolveFailed("HiGHS (highspy) is not installed; pip install highspy or use solver='cbc'")
        deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
        s = _HiGHS(start=start, deadline=deadline, msg=msg, timeLimit=time_limit_s,
                   threads=threads, gapRel=0.0, gapAbs=0.0, random_seed=_SEED)
        lp.solve(s)
        import highspy

        h = lp.solverModel
        if start and _stale(lp, h):
            # HiGHS may report an optimum it found in presolve yet hand back the MIP start's
            # values; solve again without the start (rare: tiny problems)
            lp.solve(_HiGHS(start=None, deadline=deadline, msg=msg, timeLimit=time_limit_s,
                            threads=threads,
                            gapRel=0.0, gapAbs=0.0, random_seed=_SEED))
            h = lp.solverModel
        st = h.getModelStatus()
        info = h.getInfo()
        has = info.primal_solution_status == 2
        text = h.modelStatusToString(st)
        M = highspy.HighsModelStatus
        if st == M.kOptimal:
            return _Run("optimal" if has else "failed", info.mip_dual_bound, text)
        if st in (M.kInfeasible, M.kUnboundedOrInfeasible):
            return _Run("infeasible", None, text)
        if st in (M.kTimeLimit, M.kInterrupt, M.kIterationLimit, M.kSolutionLimit):
            return _Run("time_limit" if has else "failed", info.mip_dual_bound, text)
        return _Run("failed", None, text)

    if solver == "cbc":
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "cbc.log")
            if start:
                for var in lp.variables():
                    var.setInitialValue(0.0)
                for var, val in start:
                    var.setInitialValue(val)
            with warnings.catch_warnings():  # the bundled CBC's class is marked for PuLP 4.0
                warnings.simplefilter("ignore", DeprecationWarning)
                s = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads,
                                      warmStart=bool(start), gapRel=0.0, gapAbs=0.0, logPath=log,
                                      options=[f"randomCbcSeed {_SEED + 1}"])
            lp.solve(s)
            text = open(log).read() if os.path.exists(log) else ""
        if msg:
            print(text)
        if lp.status == pulp.LpStatusInfeasible or "infeasible" in text.lower().split("result -")[-1][:60]:
            return _Run("infeasible", None, "infeasible")
        if lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return _Run("failed", None, pulp.LpStatus.get(lp.status, str(lp.status)))
        stopped = "stopped on time" in text.lower() or lp.sol_status == pulp.LpSolutionIntegerFeasible
        m = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
        bound = float(m.group(1)) if m else None
        if not stopped:
            return _Run("optimal", bound, "optimal")
        return _Run("time_limit", bound, "stopped on time limit")

    raise InvalidProblem(f"unknown solver {solver!r}; use 'highs' or 'cbc'")


def _stale(lp: pulp.LpProblem, h) -> bool:
    """The values handed back do not have the objective HiGHS reports for them."""
    info = h.getInfo()
    if info.primal_solution_status != 2:
        return False
    got = lp.objective.value() or 0.0
    want = info.objective_function_value
    return abs(got - want) > STALE_TOL * max(1.0, abs(want))


def _choice(cp: Compact, built: _Built) -> dict[int, int]:
    out = {}
    for i in cp.active:
        vals = [(built.x[(i, c)].varValue or 0.0, -c) for c in cp.domain[i]]
        out[i] = -max(vals)[1]
    return out


def _start_values(cp: Compact, built: _Built, choice: dict[int, int]) -> list[tuple[pulp.LpVariable, float]]:
    vals = [(built.x[(i, choice[i])], 1.0) for i in cp.active]
    parts = list(built.part_consts)
    for i in cp.active:
        for k in range(len(parts)):
            parts[k] += float(cp.unary_parts[i][k, choice[i]])
    for e, y in zip(cp.edges, built.y):
        cu = choice.get(e.u, cp.domain[e.u][0])
        cv = choice.get(e.v, cp.domain[e.v][0])
        r, s = int(e.rows[cu]), int(e.cols[cv])
        vals.append((y[(r, s)], 1.0))
        if e.parts is not None:
            for k in range(len(parts)):
                parts[k] += float(e.parts[k, r, s])
    if built.z is not None:
        vals.append((built.z, max(parts) / built.scale))
    return vals


def _tree_choice(cp: Compact) -> dict[int, int] | None:
    """Exact minimiser of unary + pairwise terms (memory and side rows ignored) when the
    pairwise terms form a forest; None otherwise (and with overlapping parts: a max of two
    sums does not decompose over the tree)."""
    if cp.unary_parts is not None:
        return None
    pair = {}
    for e in cp.edges:
        if (e.u, e.v) in pair:
            return None  # parallel edges that did not merge: leave them to the MIP
        du, dv = list(cp.domain[e.u]), list(cp.domain[e.v])
        pair[(e.u, e.v)] = e.cost[np.ix_(e.rows[du], e.cols[dv])]
    unary = {i: cp.unary[i][list(cp.domain[i])] for i in cp.active}
    try:
        pos = forest_argmin(list(cp.active), unary, pair)
    except NotATree:
        return None
    return {i: cp.domain[i][p] for i, p in pos.items()}


def _greedy(cp: Compact) -> dict[int, int]:
    # argmin of the unary costs: the exact optimum when no edges survive presolve
    return {i: min(cp.domain[i], key=lambda c: (cp.unary[i][c], c)) for i in cp.active}


def _initial(problem: Problem, cp: Compact) -> dict[int, int] | None:
    choice = _greedy(cp)
    if problem.warm_start:
        for i in cp.active:
            for n in cp.members[i]:
                c = problem.warm_start.get(n)
                if c is not None and c in cp.domain[i]:
                    choice[i] = c
                    break
    return choice if not violations(problem, cp.expand(choice)) else None


def _diagnose(problem: Problem, cp: Compact, solver, time_limit_s, threads, msg) -> Infeasible:
    plain = "no assignment satisfies the fixed options, tie groups and side constraints"
    if problem.capacities is None and not any(s.elastic for s in problem.side):
        return Infeasible(plain)
    feas = _build(cp, None, "feasible")
    if feas.trivially_infeasible:
        return Infeasible(f"{plain} ({feas.trivially_infeasible})")
    if cp.active:
        run = _run(feas.lp, solver, time_limit_s, threads, msg, None)
        if run.status == "infeasible":
            return Infeasible(plain)
        if run.status == "failed":
            raise SolveFailed(f"could not decide feasibility without memory limits ({run.detail})")
    ex = _build(cp, problem.capacities, "excess")
    approx = ""
    if cp.active:
        run = _run(ex.lp, solver, time_limit_s, threads, msg, None)
        if run.status in ("infeasible", "failed"):
            raise SolveFailed(f"could not compute the memory needed ({run.detail})")
        approx = "" if run.status == "optimal" else " (at most; the search hit the time limit)"
        choice = _choice(cp, ex)
    else:
        choice = {}
    least = cp.expand(choice)
    if problem.capacities is None:  # elastic side rows alone: the caller accounts for them
        return Infeasible(f"the memory rows the caller added cannot all hold{approx}",
                          assignment=least)
    extra, k = memory_excess(problem, least)
    cap = problem.capacities[k]
    need = cap + extra
    return Infeasible(
        f"memory needs at least {need:.6g} bytes on resource {k}; capacity is {cap:.6g}"
        f"{approx}. Every resource needs {extra:.6g} more bytes for any assignment to fit.",
        min_capacity=need, resource=k, capacity=cap, extra=extra, assignment=least,
    )


def solve(
    problem: Problem,
    solver: SolverName = "highs",
    time_limit_s: float | None = None,
    threads: int | None = None,
    msg: bool = False,
) -> Solution:
    """Optimal (or, under a time limit, best found) assignment of `problem`.

    Raises Infeasible (with the memory that would fit when memory is the reason), SolveFailed
    (no incumbent before the time limit, or an unexpected solver status), InvalidProblem.
    """
    t0 = time.perf_counter()
    if solver not in ("highs", "cbc"):
        raise InvalidProblem(f"unknown solver {solver!r}; use 'highs' or 'cbc'")
    if time_limit_s is not None and time_limit_s <= 0:
        raise InvalidProblem("time_limit_s must be positive")
    cp = compact(problem)
    # Exact fast paths that need no solver: no pairwise terms left (unary argmin), or a forest
    # of pairwise terms (DP). Both are optimal when the result also meets memory and side rows.
    quick = _tree_choice(cp)
    if quick is not None:
        assignment = cp.expand(quick)
        if not violations(problem, assignment):
            obj = objective(problem, assignment)
            return Solution(assignment, obj, obj, 0.0, time.perf_counter() - t0, "optimal", solver)
    built = _build(cp, problem.capacities, "cost")
    if built.trivially_infeasible:
        raise _diagnose(problem, cp, solver, time_limit_s, threads, msg)
    if not cp.active:
        assignment = cp.expand({})
        if violations(problem, assignment):
            raise _diagnose(problem, cp, solver, time_limit_s, threads, msg)
        obj = objective(problem, assignment)
        return Solution(assignment, obj, obj, 0.0, time.perf_counter() - t0, "optimal", solver)
    start = _initial(problem, cp)

    values = _start_values(cp, built, start) if start is not None else None
    # The time limit is a wall budget for the whole call, presolve and model building included.
    budget = None if time_limit_s is None else max(1e-3, time_limit_s - (time.perf_counter() - t0))
    run = _run(built.lp, solver, budget, threads, msg, values)
    if run.status == "infeasible":
        raise _diagnose(problem, cp, solver, time_limit_s, threads, msg)
    if run.status == "failed":
        limit = f" within {time_limit_s:g} s" if time_limit_s is not None else ""
        raise SolveFailed(f"{solver} found no feasible assignment{limit} ({run.detail}); "
                          "raise time_limit_s or give a feasible warm_start")
    assignment = cp.expand(_choice(cp, built))
    broken = violations(problem, assignment)
    if broken:
        raise SolveFailed(f"{solver} returned an assignment that breaks: {'; '.join(broken[:3])}")
    obj = objective(problem, assignment)
    if run.status == "optimal" and run.bound is None:
        bound = obj
    elif run.bound is None or not np.isfinite(run.bound):
        bound = float("-inf")
    else:
        bound = min(obj, run.bound * built.scale + built.offset)
    gap = gap_of(obj, bound) if np.isfinite(bound) else float("inf")
    return Solution(assignment, obj, bound, gap, time.perf_counter() - t0, run.status, solver)
