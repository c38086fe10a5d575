"""The LP phase: the relaxation picks the cells to price before the MIP does.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

import formulations as fm
from formulations.errors import SolveFailed
from formulations.relax import Relaxation

from .model import Model
from .objective import cell_terms, objective_s

log = logging.getLogger(__name__)


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
    """What `lp_phase` leaves: `bound` holds for every plan, `cells` per pricer key and
    `options` per node and option for every plan using them (`formulations.relax`); `best`
    is the best exact plan (cost, choice) so far."""
    bound: float
    cells: dict[tuple, float]
    options: dict[str, np.ndarray]
    best: tuple[float, Mapping[str, int]]
    converged: bool

    def allowed(self, upper: float, margin: float) -> tuple[dict[str, tuple[int, ...]], float]:
        """Per node, the options whose bound does not exceed `upper` (a plan's exact cost:
        the others are in no plan as good), and the least bound of those left out (inf if
        none)."""
        slack = upper * (1 + margin)
        keep: dict[str, tuple[int, ...]] = {}
        out = float("inf")
        for node, b in self.options.items():
            ok = b <= slack
            if not ok.all():
                keep[node] = tuple(int(c) for c in np.flatnonzero(ok))
                out = min(out, float(b[~ok].min()))
        return keep, out


def lp_phase(model: Model, make_problem, best: tuple, n_hopeful: int, predicted: float,
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
        exact = objective_s(model, rounded)
        log.info("LP solution rounded: a plan of %.6g s", exact)
        if exact < best[0]:
            best = (exact, rounded)
    return LpPhase(lp.value, lp_cell_bounds(model, lp),
                   {n: lp.option_bounds(n) for n in lp.x}, best, converged)


def lp_rounding(model: Model, lp, make_problem) -> dict[str, int] | None:
    """Each node's option of largest LP value (the lowest on ties; tied nodes share theirs),
    where that plan meets memory and side constraints: near an integral LP optimum, a plan
    near the optimum, whose exact cost is a good incumbent for the hopeful test."""
    choice = {k: int(max(range(len(v)), key=lambda c: (v[c], -c))) for k, v in lp.x.items()}
    return None if fm.violations(make_problem(None, 0.0), choice) else choice


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
                 "" if not todo else f" ({len(todo)} cells it uses left unpriced)",
                 extra={"progress": ("LP relaxation", None, res.value)})
        return res, not todo
    except SolveFailed as exc:
        log.info("LP relaxation failed (%s); the MIP rounds go on without it", exc)
        return None

