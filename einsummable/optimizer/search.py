"""The search: solve the MIP on bounds, price what the solutions use, repeat (`solve_lazily`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Mapping, Sequence

import formulations as fm
from formulations.problem import LinearConstraint, Solution, gap_of

from ..errors import InfeasibleError, SolverError
from .lp_phase import LpPhase, lp_phase
from .model import Model
from .objective import is_streamed, is_weight_edge, objective_s, overlap_problem, split, to_problem
from .peak import assignment_peaks
from .policy import DEFAULT_POLICY, SearchPolicy

# Where a solve spends its time (each solve, each pricing), at INFO: for a user asking why a
# plan is slow to come (`experiments/optimizer_bench.py --phases`).
log = logging.getLogger(__name__)
MB = 1e6  # bytes in the infeasibility message


def solve_model(model: Model, *, time_limit_s: float | None = None, solver: str = "highs",
                warm_start: Mapping[str, int] | None = None, incumbents: Sequence = (),
                policy: SearchPolicy = DEFAULT_POLICY, side: Sequence[LinearConstraint] = ()):
    """Solve; errors of `formulations` become InfeasibleError / SolverError. With overlap,
    `solve_overlap` minimises A + max(C, W); `incumbents` (assignments, e.g. the named
    strategies) are scored too. Edge cells are priced lazily (`solve_lazily`). `side`:
    linear constraints over the choices (`pool.differ_cut`); the warm start and incumbents
    must meet them."""
    def solve(make, warm, limit):
        def constrained(w, pen):
            problem = make(w, pen)
            return dataclasses.replace(problem, side=problem.side + tuple(side))
        return solve_lazily(model, constrained if side else make, warm,
                            lambda p, t: _solve_problem(p, t, solver, model), limit, policy)
    if model.options.overlap:
        return solve_overlap(model, solve, incumbents=tuple(incumbents),
                             time_limit_s=time_limit_s)
    return solve(lambda w, pen: to_problem(model, w, exact=False, unpriced_penalty=pen),
                 warm_start, time_limit_s)


def floor_s(model: Model) -> float:
    """A lower bound on every plan's objective: each node's least unary cost (compute, and
    the fold of an unfed output), no exchange. It holds with overlap too: there T = A + max(C,
    W) >= (folds in A) + C."""
    return sum(min(model.unary(k, c) for c in range(len(oc.cands)))
               for k, oc in model.nodes.items())


def hopeful_cells(model: Model, upper: float, lp_bounds: Mapping[tuple, float] | None = None,
                  margin: float = DEFAULT_POLICY.hopeful_margin) -> list[tuple]:
    """Unpriced cells that could be in a plan of objective <= `upper` (a plan's exact cost):
    those whose own bound plus `floor_s` (every node's least unary cost) does not exceed
    it, nor does their bound from the LP relaxation (`lp_bounds`, `lp_cell_bounds`) where
    one is given. The others keep their bounds in the MIP: any choice using one costs more
    than `upper` on the bounds alone, so an optimal solve never picks it (and `solve_lazily`
    checks that it did not). Lowest bound first: the order to price them in when time is
    short."""
    overlap = model.options.overlap
    floor = floor_s(model)
    slack = upper * (1 + margin)
    out: dict[tuple, float] = {}
    seen: set[int] = set()
    for e in model.edges:
        if id(e.matrix) in seen:
            continue
        seen.add(id(e.matrix))
        weight = overlap and is_weight_edge(e)
        gradient = overlap and not weight and is_streamed(e)  # stitched beside, as a weight
        R, S = e.matrix.shape
        for r in range(R):
            for s_ in range(S):
                seconds, local, copy = e.matrix.bounds[r][s_]
                if weight:
                    lb = max(floor + model.copy_charge * copy,
                             e.matrix.estimate(r, s_).in_batch_s - local)
                elif gradient:
                    lb = max(floor + model.copy_charge * copy, seconds - local)
                else:
                    lb = floor + seconds
                if lb <= slack and not e.matrix.priced(r, s_):
                    key = e.matrix.short(r, s_)
                    if lp_bounds is not None and lp_bounds.get(key, lb) > slack:
                        continue
                    out[key] = min(lb, out.get(key, lb))
    return sorted(out, key=out.__getitem__)


def unpriced(model: Model, choice: Mapping[str, int]) -> list[tuple]:
    """The edge cells `choice` uses that are not priced yet (pricer keys, no repeats)."""
    out: dict[tuple, None] = {}
    for e in model.edges:
        r, s = e.cell(choice)
        if not e.matrix.priced(r, s):
            out[e.matrix.short(r, s)] = None
    return list(out)


def solve_lazily(model: Model, make_problem, warm_start, solve_problem,
                 time_limit_s: float | None, policy: SearchPolicy = DEFAULT_POLICY):
    """Solve the problem `make_problem(warm_start)` builds from the edges' estimates (exact
    where priced, a lower bound elsewhere), price the cells the solution uses, and repeat
    until it uses priced cells only. Then it is optimal for the exact costs as well: its cost
    is exact and every other choice costs at least its estimate. Each round's solver bound is
    a bound on the exact problem (estimates never exceed the costs), and each round prices at
    least one new cell, so this ends.

    Where the bounds are loose (cross-node exchanges: the cut bound lets every NIC carry its
    share, which the synthesis reaches only in part) rounds could go on for long, so after
    `policy.lazy_rounds` solves every cell that could still be in a plan no worse than the
    current one is priced (`hopeful_cells`), and the next solve is exact. That happens after
    an earlier solve already when pricing those cells is predicted (`EdgePricer.predict_s`)
    to take no longer than the solve did. Where it is predicted to take longer than
    `policy.lp_pricing_min_s`, the LP relaxation goes first (`lp_phase`, before the first MIP
    solve given a warm start): it prices the cells its solution uses until that uses priced
    cells only, for at most `policy.lp_pricing_share` of the predicted pricing time; its
    value is a bound, its rounding an incumbent, and its reduced costs bound every cell,
    which narrows the hopeful ones; cut short, or ending with its bound more than
    `policy.lp_tight_gap` below its best plan, the hopeful cells it leaves are priced before
    the next solve (on h100x8x2 llama-7b: 685 cells priced in 26 LP rounds, where about
    25,600 were hopeful).

    `time_limit_s` bounds the whole loop, pricing included (the hopeful cells are priced
    lowest bound first until one more solve would not fit, and no solve starts with less than
    `policy.min_solve_share` of the last one's time left). When the deadline cuts that
    pricing short, or leaves room for one more solve only, the last solve keeps to priced
    cells (every unpriced one costs more than the best exact plan, `unpriced_penalty`), so
    its answer is a plan whose cost is exact; that solve's bound is not one on the real
    problem and is not used. Out of time, the answer is the best plan whose cost is exact
    (the warm start's, a round's solution once its cells are priced, or that last solve's),
    with the best round bound as its bound: status "time_limit" and an honest gap.
    `make_problem(warm_start, unpriced_penalty)` builds the problem."""
    t0 = time.perf_counter()
    deadline = None if time_limit_s is None else t0 + time_limit_s
    warm = warm_start
    rounds = 0
    best: tuple[float, Mapping[str, int]] | None = None  # least exact objective seen, its plan
    if warm_start:
        best = (objective_s(model, warm_start), warm_start)
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
            # at most policy.lp_pricing_share of that (under a limit, half the time left)
            lp_considered = True
            n_hopeful = len(hopeful_cells(model, best[0], margin=policy.hopeful_margin))
            predicted = model.pricer.predict_s(n_hopeful)
            if predicted > policy.lp_pricing_min_s:
                stop = time.perf_counter() + policy.lp_pricing_share * predicted
                if deadline is not None:
                    stop = min(stop, time.perf_counter() + (deadline - time.perf_counter()) / 2)
                lp = lp_phase(model, make_problem, best, n_hopeful, predicted, stop)
                bound = max(bound, lp.bound)
                best, lp_bounds = lp.best, lp.cells
                warm = best[1]
                # price what could still matter before the next solve, unless the LP ended
                # tight: then its rounding is near optimal and few cells could beat it
                if not lp.converged or lp.bound < best[0] * (1 - policy.lp_tight_gap):
                    hopeful = hopeful_cells(model, best[0], lp_bounds,
                                            policy.hopeful_margin)
                    done = _price_logged(
                        model, hopeful, f"cells that could be in a plan <= {best[0]:.6g} s",
                        None if deadline is None
                        else time.perf_counter() + (deadline - time.perf_counter()) / 2)
                    priced_only = done < len(hopeful)
                    exact_next = not priced_only
        # more than the best exact plan costs: an optimal solve never uses an unpriced cell
        # (and not much more: the solver scales costs by the largest one)
        penalty = (policy.priced_only_penalty * best[0]
                   if priced_only and best is not None else 0.0)
        t_solve = time.perf_counter()
        problem = make_problem(warm, penalty)
        barred_s = float("inf")  # the least bound of the options left out
        if lp is not None:  # options the LP proves in no plan as good as the best: out
            allowed, barred_s = lp.allowed(best[0], policy.hopeful_margin)
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
                 sol.objective, sol.bound, solve_s, len(todo),
                 extra={"progress": (f"solve {rounds + 1}", best[0] if best else None,
                                     max(bound, sol.bound) if not penalty else bound)})
        if not todo and sol.status == "optimal" and not penalty:
            return sol
        rounds += 1
        _price_logged(model, todo, "the solution's cells")
        if not penalty:  # the solve's bound holds for the options kept; the others: barred_s
            bound = max(bound, min(sol.bound, barred_s))
        exact = objective_s(model, sol.assignment)
        if best is None or exact < best[0]:
            best = (exact, sol.assignment)
        out_of_time = sol.status != "optimal" or priced_only or (
            deadline is not None and time.perf_counter() >= deadline)
        if not out_of_time:
            hopeful = hopeful_cells(model, best[0], lp_bounds, policy.hopeful_margin)
            predicted = model.pricer.predict_s(len(hopeful))
            # price them once rounds have not converged, or as soon as that is predicted to
            # take no longer than the solve just made (where pricing is cheap, one exact solve
            # beats more rounds); stop in time for one more solve, which uses the prices
            if hopeful and (rounds >= policy.lazy_rounds or predicted <= solve_s):
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
            out_of_time = left < policy.min_solve_share * solve_s
            priced_only = priced_only or (left < 2 * solve_s and not exact_next)
        if out_of_time:
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
             "" if done >= len(cells) else f" ({len(cells) - done} left: out of time)",
             extra={"progress": (f"priced {done} exchanges", None, None)})
    return done


def _solve_problem(problem, time_limit_s: float | None, solver: str, model: Model):
    try:
        return fm.solve(problem, solver=solver, time_limit_s=time_limit_s)
    except fm.Infeasible as e:
        if e.min_capacity is None:
            err = InfeasibleError(f"no plan fits: {e}",
                                  fix="use more devices, weights='sharded', or a smaller batch")
            err.min_capacity = None
        else:  # the least any plan needs on its fullest device (the solver's excess MIP)
            err = InfeasibleError(
                f"no plan fits the devices' memory: the plan that needs least still needs "
                f"{e.min_capacity / MB:.1f} MB on a device that has {e.capacity / MB:.1f} MB"
                + (" (at most: the search hit its time limit)" if "at most" in str(e) else "")
                + _fullest(model, e),
                fix=f"give each device at least {e.min_capacity / MB:.1f} MB; or use more "
                    "devices, weights='sharded', or a smaller batch or sequence")
            err.min_capacity = e.min_capacity
        # the plan of least memory by the rows (and the caller's elastic rows) and its excess
        # over them: with weights free the rows miss gathered blocks, and
        # `gather_cuts.least_capacity` goes on from it to the least with them counted
        err.assignment, err.extra = e.assignment, e.extra
        raise err from None
    except fm.FormulationError as e:
        raise SolverError(f"the {solver} solve failed: {e}",
                          fix="raise time_limit_s, or try solver='cbc'") from None


def _fullest(model: Model, e) -> str:
    """What fills the binding device under the plan that needs least (`peak.py`): the
    device, the op running at its peak, the largest tensors then alive."""
    if e.assignment is None or model.row_keys is None or e.resource is None:
        return ""
    device = model.row_keys[e.resource][0]
    return ": " + assignment_peaks(model, e.assignment)[device].describe()


def solve_overlap(model: Model, solve_problem, *,
                  incumbents: tuple[Mapping[str, int], ...] = (),
                  time_limit_s: float | None = None) -> Solution:
    """Minimise T over the model's choices: one MIP (`overlap_problem`), its max as an
    epigraph variable. `solve_problem(make, warm_start, time_limit_s)` solves the problem
    `make(warm_start, unpriced_penalty)` builds (`solve_lazily` with the caller's
    solver settings).
    `incumbents` (e.g. the named strategies) are scored with T; the best warm-starts the
    solve, and the result is never worse than any of them."""
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
    return Solution(best[1], best[0], bound, gap_of(best[0], bound),
                    time.perf_counter() - t0, sol.status, sol.solver)

