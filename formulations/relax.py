r"""The LP relaxation of the pairwise problem, re-solved as costs change, and the bounds it proves.

The relaxation of `pairwise.py`'s MIP (before its presolve), over w = (x, y, z):

    minimise    c·w
    subject to  onehot_v    Σ_c x[v,c] = 1                      (tied nodes share one x)
                ysrc_e_r    Σ_s y[e,r,s] − Σ_{c ∈ P_e(r)} x[u,c] = 0
                ydst_e_s    Σ_r y[e,r,s] − Σ_{c ∈ Q_e(s)} x[v,c] = 0
                maxpart_k   z − Σ p_k·x − Σ q_k·y ≥ 0            (problems with parts)
                mem_k, side_i                                    (as in the MIP)
                0 ≤ x, y ≤ 1,   0 ≤ z ≤ upper

z ≤ upper − (the least the plain terms can sum to) holds for every plan whose objective is at
most `upper`, and y ≤ 1 for every integral plan.

Bounds. For row multipliers π whose signs fit the rows (π_i ≥ 0 on ≥ rows, ≤ 0 on ≤ rows, free
on equalities) and d = c − Aᵀπ, every feasible w has

    c·w  =  π·(A w) + d·w  ≥  L  =  Σ_i π_i·(lo_i if π_i > 0 else up_i) + Σ_j min(0, d_j)·u_j

and if the variables in a set J are at 1, c·w ≥ L + Σ_{j ∈ J} max(0, d_j) (d⁺ below). A plan
that gives class u option c has x[u,c] = 1 and, on every edge f at u, one y at 1 in the row (or
column) c projects to; those are distinct variables, so with

    g_F(u, c) = d⁺_x[u,c] + Σ_{f at u, f ∉ F} min_s d⁺_y[f, P_f(c), s]

(min_r d⁺_y[f, r, Q_f(c)] where u is f's dst), every plan giving u option c costs at least
option_bound(u, c) = L + g_∅(u, c). A plan using cell (r, s) of edge e = (u, v) has
y[e,r,s] = 1, x[u,c] = 1 for some c ∈ P_e(r) and x[v,c'] = 1 for some c' ∈ Q_e(s); counting
each edge between u and v once (at u),

    bound(e, r, s) = L + d⁺_y[e,r,s] + min_{c ∈ P_e(r)} g_{e}(u, c)
                       + min_{c' ∈ Q_e(s)} g_{E(u,v)}(v, c')

with E(u, v) the edges between u and v.

With π the LP optimum's duals L is the LP's value. π is clipped to the right signs and d is
recomputed from the model kept here, so the bounds hold whatever tolerances the LP solver
worked to. Where some costs are lower bounds of the true ones (cells not priced yet), so are
L and every bound(e, r, s): raising a cost only raises c·w.

Column generation. Of the y columns HiGHS holds only some: per edge the FIRST_CHEAPEST
cheapest of each row and column, and the cells of a given plan (a feasible start). After a run
the duals π give d for every column, held or not; the columns left out with d < 0 join and
the run repeats from its basis, until none does: then π is optimal for the whole LP. L above
reads d of every column, so it is a bound at every step, and at the end it is the LP's value.
Should the columns held admit no feasible point, every column joins.

Re-solving: `set_cell` gives a cell of the same problem a raised cost (priced since) and
changes only its coefficients; HiGHS starts from the last basis (presolve off), which is
what makes many rounds of price-and-re-solve cheap (`einsummable.optimizer.lp_phase.lp_pricing`). An
edge between two nodes of one tie group is a unary cost of their shared choice here; it keeps
the costs it was built with (still lower bounds of the raised ones, so every bound stays
valid) and reports no y.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .compact import _classes
from .errors import SolveFailed
from .problem import Problem

# Bounds are reported this much (relative) below what the arithmetic gives, so that float
# rounding in L's long sums cannot exclude a cell that a plan of cost exactly `upper` uses.
SAFETY = 1e-9
# y values above this count as used by the LP solution (simplex values are exact zeros else).
SUPPORT_TOL = 1e-7
# A column left out of HiGHS joins when its reduced cost is below -PRICE_TOL (solver units,
# costs scaled to at most 1): HiGHS's own dual feasibility tolerance.
PRICE_TOL = 1e-7
# The y columns HiGHS starts with: per edge, this many of the cheapest cells of each row and of
# each column (with the incumbent's cells, `cells`). On h100x8x2 llama-7b 9,539 of the
# 69,800 columns; an LP solve then takes 0.02-0.5 s where it took 0.4-1.4 s with every
# column in HiGHS (each simplex iteration scans them all).
FIRST_CHEAPEST = 3


@dataclass(frozen=True)
class LpResult:
    """value: L in the problem's units (seconds). y[j]: the LP's y of problem edge j as an
    R x S array (None for an edge inside one tie class). `bounds(j)`: bound(e, r, s) above,
    per cell of edge j, in seconds."""
    value: float
    y: tuple[np.ndarray | None, ...]
    x: dict[str, np.ndarray]  # node -> the LP's x per option (tied nodes: their class's)
    _raw: float  # L in solver units
    _gain: np.ndarray  # max(0, d) per column
    _owner: "Relaxation"

    def support(self, j: int) -> np.ndarray:
        """(r, s) pairs of edge j the LP solution uses."""
        y = self.y[j]
        return np.zeros((0, 2), dtype=int) if y is None else np.argwhere(y > SUPPORT_TOL)

    def bounds(self, j: int) -> np.ndarray:
        return self._owner._cell_bounds(j, self._raw, self._gain, self._edge_minima)

    def option_bounds(self, node: str) -> np.ndarray:
        """Per option of `node`: a bound on every plan that gives node that option."""
        o = self._owner
        return o._seconds(self._raw + o._option_gain(o.class_of[node], self._gain, (),
                                                     self._edge_minima))

    @functools.cached_property
    def _edge_minima(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per edge with y: the least d⁺_y of each row and of each column (computed once)."""
        return {j: (self._gain[c].min(axis=1), self._gain[c].min(axis=0))
                for j, c in enumerate(self._owner.ycols) if c is not None and c.size}


class Relaxation:
    """The LP of `problem` with z ≤ `upper` (see the module docstring), kept in HiGHS; with
    `cells` (edge, r, s) among the columns HiGHS starts with (column generation)."""

    def __init__(self, problem: Problem, upper: float,
                 cells: Iterable[tuple[int, int, int]] = ()) -> None:
        import highspy
        p = problem
        members, class_of = _classes(p)
        self.class_of = class_of
        self.names = [n.name for n in p.nodes]
        nodes = {n.name: n for n in p.nodes}
        k_opts = [nodes[ms[0]].n_options for ms in members]
        unary = [np.zeros(k) for k in k_opts]
        unary_parts = [np.zeros((p.n_parts, k)) for k in k_opts]
        for n in p.nodes:
            unary[class_of[n.name]] += n.costs
            if n.parts is not None:
                unary_parts[class_of[n.name]] += np.asarray(n.parts)
        fixed = {class_of[n]: c for n, c in p.fixed.items()}
        barred = [set() for _ in k_opts]  # per class: options not allowed to some member
        for n, cs in p.allowed.items():
            barred[class_of[n]] |= set(range(nodes[n].n_options)) - set(cs)
        self.parts = p.has_parts  # z and the maxpart rows
        costs = [np.asarray(e.cost, dtype=float) for e in p.edges]
        self.shapes = [c.shape for c in costs]
        mags = [float(np.abs(u).max()) for u in unary + unary_parts if u.size]
        mags += [float(c.max()) for c in costs]
        mags += [float(np.abs(np.asarray(e.parts)).max()) for e in p.edges if e.parts is not None]
        self.scale = scale = max([m for m in mags if m > 0] or [1.0])

        cost: list[float] = []
        ub: list[float] = []
        ri: list[int] = []
        cj: list[int] = []
        va: list[float] = []
        lo: list[float] = []
        up: list[float] = []

        def col(c: float, u: float = 1.0) -> int:
            cost.append(c)
            ub.append(u)
            return len(cost) - 1

        def row(entries, low: float, high: float) -> int:
            i = len(lo)
            for j, a in entries:
                ri.append(i)
                cj.append(j)
                va.append(a)
            lo.append(low)
            up.append(high)
            return i

        self.proj: list[tuple[np.ndarray, np.ndarray]] = []
        self.ends: list[tuple[int, int]] = []
        for e in p.edges:
            u, v = class_of[e.src], class_of[e.dst]
            self.ends.append((u, v))
            r = np.arange(k_opts[u]) if e.src_proj is None else np.asarray(e.src_proj)
            s = np.arange(k_opts[v]) if e.dst_proj is None else np.asarray(e.dst_proj)
            self.proj.append((r, s))
            if u == v:  # both ends share one choice: a unary cost
                unary[u] += np.asarray(e.cost)[r, s]
                if e.parts is not None:
                    unary_parts[u] += np.asarray(e.parts)[:, r, s]
        # per class: the edges at it that have y, and at which end (0: src, 1: dst)
        self.incident: list[list[tuple[int, int]]] = [[] for _ in k_opts]
        for j, (u, v) in enumerate(self.ends):
            if u != v:
                self.incident[u].append((j, 0))
                self.incident[v].append((j, 1))
        # x: one column per option; options outside a fixed or allowed domain get upper bound 0
        self.x = []
        for i, k in enumerate(k_opts):
            dom = np.array([col(unary[i][c] / scale,
                                0.0 if (i in fixed and fixed[i] != c) or c in barred[i] else 1.0)
                            for c in range(k)], dtype=int)
            self.x.append(dom)
            row([(int(j), 1.0) for j in dom], 1.0, 1.0)
        part_terms: list[list[tuple[int, float]]] = [[] for _ in range(p.n_parts)]
        if self.parts:
            for i, dom in enumerate(self.x):
                for k in range(p.n_parts):
                    part_terms[k] += [(int(j), -unary_parts[i][k, c] / scale)
                                      for c, j in enumerate(dom) if unary_parts[i][k, c]]
        self.ycols: list[np.ndarray | None] = []
        self.parts_now: list[np.ndarray | None] = []
        for j, e in enumerate(p.edges):
            u, v = class_of[e.src], class_of[e.dst]
            if u == v:
                self.ycols.append(None)
                self.parts_now.append(None)
                continue
            R, S = costs[j].shape
            y = np.array([[col(costs[j][a, b] / scale) for b in range(S)] for a in range(R)],
                         dtype=int).reshape(R, S)
            self.ycols.append(y)
            r, s = self.proj[j]
            for a in range(R):
                row([(int(c), 1.0) for c in y[a]]
                    + [(int(self.x[u][c]), -1.0) for c in np.flatnonzero(r == a)], 0.0, 0.0)
            for b in range(S):
                row([(int(c), 1.0) for c in y[:, b]]
                    + [(int(self.x[v][c]), -1.0) for c in np.flatnonzero(s == b)], 0.0, 0.0)
            if self.parts and e.parts is not None:
                pm = np.asarray(e.parts, dtype=float)
                self.parts_now.append(pm.copy())
                for k in range(p.n_parts):  # every cell, zeros too: later prices fill them
                    part_terms[k] += [(int(y[a, b]), -pm[k, a, b] / scale)
                                      for a in range(R) for b in range(S)]
            else:
                self.parts_now.append(None)
        self.part_rows: list[int] = []
        if self.parts:
            # z <= upper minus the least the plain terms can add up to (0 for costs in seconds)
            least = sum(min(0.0, float(u.min())) for u in unary) + sum(
                min(0.0, float(costs[j].min())) for j, y in enumerate(self.ycols) if y is not None)
            z = col(1.0, (upper - least) / scale * (1 + 1e-6))
            for k in range(p.n_parts):
                self.part_rows.append(row([(z, 1.0)] + part_terms[k], 0.0, np.inf))
        if p.capacities is not None:
            for k, cap in enumerate(p.capacities):
                div = max(1.0, abs(cap))
                terms = [(int(self.x[class_of[n.name]][c]), m / div)
                         for n in p.nodes if n.memory is not None
                         for c, m in enumerate(n.memory[k]) if m]
                if terms:
                    row(terms, -np.inf, cap / div)
        for s_ in p.side:
            terms = [(int(self.x[class_of[n]][c]), a) for n, c, a in s_.terms]
            row(terms, s_.rhs if s_.sense in (">=", "==") else -np.inf,
                s_.rhs if s_.sense in ("<=", "==") else np.inf)

        self.cost = np.asarray(cost, dtype=float)  # per column, in solver units
        self.ub = np.asarray(ub)
        self.lo, self.up = np.asarray(lo), np.asarray(up)
        # column-major, as HiGHS takes it; repeated (row, column) entries (tied nodes' memory,
        # side terms) summed into one
        rows, cols, vals = (np.asarray(ri, dtype=np.int64), np.asarray(cj, dtype=np.int64),
                            np.asarray(va, dtype=float))
        key = cols * max(1, len(lo)) + rows
        uniq, inverse = np.unique(key, return_inverse=True)
        summed = np.zeros(len(uniq))
        np.add.at(summed, inverse, vals)
        self.cj, self.ri, self.va = uniq // max(1, len(lo)), uniq % max(1, len(lo)), summed
        # where each (part row, y column) coefficient sits in va, for updates
        self._entry = {}
        if self.part_rows:
            part_set = set(self.part_rows)
            for idx in np.flatnonzero(np.isin(self.ri, list(part_set))):
                self._entry[(int(self.ri[idx]), int(self.cj[idx]))] = int(idx)
        n = len(self.cost)
        self._start = np.searchsorted(self.cj, np.arange(n + 1))
        # the columns HiGHS holds (column generation, below): every x and z, and of the y
        # the FIRST_CHEAPEST cheapest of each row and column of each edge, and the `cells` given
        first = np.ones(n, dtype=bool)
        for j, y in enumerate(self.ycols):
            if y is None or not y.size:
                continue
            first[y] = False
            c = self.cost[y]
            kr, kc = min(FIRST_CHEAPEST, y.shape[1]), min(FIRST_CHEAPEST, y.shape[0])
            first[np.take_along_axis(y, np.argpartition(c, kr - 1, axis=1)[:, :kr], axis=1)] = True
            first[np.take_along_axis(y, np.argpartition(c, kc - 1, axis=0)[:kc, :], axis=0)] = True
        for j, r, s_ in cells:
            if self.ycols[j] is not None:
                first[self.ycols[j][r, s_]] = True
        held = np.flatnonzero(first)
        self._held = held  # HiGHS's columns, in its order
        self._hcol = np.full(n, -1, dtype=np.int64)  # column -> its index in HiGHS (-1: out)
        self._hcol[held] = np.arange(len(held))
        starts, index, values = self._entries(held)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(held), len(self.lo)
        lp.col_cost_ = self.cost[held]
        lp.col_lower_ = np.zeros(len(held))
        lp.col_upper_ = self.ub[held]
        lp.row_lower_ = np.where(np.isinf(self.lo), -highspy.kHighsInf, self.lo)
        lp.row_upper_ = np.where(np.isinf(self.up), highspy.kHighsInf, self.up)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = index
        lp.a_matrix_.value_ = values
        self._pending: dict[int, float] = {}  # column -> new cost (solver units)
        from .pairwise import _quiet_stdout
        with _quiet_stdout():  # the banner HiGHS prints once per process (pairwise.py)
            self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("presolve", "off")  # keep the basis between re-solves
        if self.h.passModel(lp) != highspy.HighsStatus.kOk:
            raise SolveFailed("HiGHS did not accept the LP relaxation")

    @property
    def active(self) -> np.ndarray:
        """Per column: whether HiGHS holds it."""
        return self._hcol >= 0

    def _entries(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column-wise (starts, row indices, values) of the matrix restricted to `cols`
        (len(cols) + 1 starts)."""
        first, last = self._start[cols], self._start[cols + 1]
        counts = last - first
        starts = np.concatenate(([0], np.cumsum(counts)))
        at = np.repeat(first - starts[:-1], counts) + np.arange(starts[-1])
        return starts.astype(np.int32), self.ri[at].astype(np.int32), self.va[at]

    def _add(self, cols: np.ndarray) -> None:
        """Hand columns `cols` (not held yet) to HiGHS; its basis stays (they start at 0)."""
        import highspy
        starts, index, values = self._entries(cols)
        self._hcol[cols] = len(self._held) + np.arange(len(cols))
        self._held = np.concatenate((self._held, cols))
        if self.h.addCols(len(cols), self.cost[cols], np.zeros(len(cols)), self.ub[cols],
                          len(index), starts[:-1], index, values) != highspy.HighsStatus.kOk:
            raise SolveFailed("HiGHS did not take the LP relaxation's new columns")

    def set_cell(self, j: int, r: int, s: int, cost: float,
                 parts: tuple[float, ...] | None = None) -> None:
        """Give cell (r, s) of problem edge j a new cost (and parts, on an edge that has
        them); cost changes are handed to HiGHS at the next `solve`."""
        col = int(self.ycols[j][r, s])
        if parts is not None and self.parts_now[j] is not None:
            for k, value in enumerate(parts):
                if value != self.parts_now[j][k, r, s]:
                    self.parts_now[j][k, r, s] = value
                    row = self.part_rows[k]
                    self.va[self._entry[(row, col)]] = -value / self.scale
                    if self._hcol[col] >= 0:
                        self.h.changeCoeff(row, int(self._hcol[col]), -value / self.scale)
        self._pending[col] = cost / self.scale

    def solve(self) -> LpResult:
        """Solve from the last basis. Column generation: HiGHS holds a subset of the columns;
        after each run every column's reduced cost d is computed from the duals, those left
        out with d < 0 join, and the run repeats until none does, which is then the LP's
        optimum over every column. The bounds read d of every column, so they hold at any
        round of this."""
        import highspy
        if self._pending:
            cols = np.fromiter(self._pending, dtype=np.int64, count=len(self._pending))
            vals = np.fromiter(self._pending.values(), dtype=float, count=len(cols))
            self.cost[cols] = vals
            at = self._hcol[cols]
            held = at >= 0
            self.h.changeColsCost(int(held.sum()), at[held].astype(np.int32), vals[held])
            self._pending = {}
        while True:
            self.h.run()
            status = self.h.getModelStatus()
            if status != highspy.HighsModelStatus.kOptimal:
                lacking = (highspy.HighsModelStatus.kInfeasible,
                           highspy.HighsModelStatus.kUnboundedOrInfeasible)
                if not self.active.all() and status in lacking:
                    self._add(np.flatnonzero(~self.active))  # the columns held were too few
                    continue
                raise SolveFailed("the LP relaxation did not solve to optimality "
                                  f"({self.h.modelStatusToString(status)})")
            sol = self.h.getSolution()
            pi = np.asarray(sol.row_dual, dtype=float).copy()
            pi[np.isinf(self.up) & (pi < 0)] = 0.0  # >= rows: pi >= 0
            pi[np.isinf(self.lo) & (pi > 0)] = 0.0  # <= rows: pi <= 0
            if self.parts:  # z costs 1: maxpart duals summing past 1 (by the solver's
                # tolerance) would charge min(0, d_z)·upper, a large loss where upper is large
                total = pi[self.part_rows].sum()
                if total > 1.0:  # a hair below 1 after rounding, so that d_z stays >= 0
                    pi[self.part_rows] /= total * (1 + 4 * np.finfo(float).eps)
            d = self.cost - np.bincount(self.cj, weights=self.va * pi[self.ri],
                                        minlength=len(self.cost))
            enter = np.flatnonzero((d < -PRICE_TOL) & ~self.active)
            if not enter.size:
                break
            self._add(enter)
        values = np.zeros(len(self.cost))
        values[self._held] = np.asarray(sol.col_value)
        side = np.where(pi > 0, self.lo, self.up)
        value = float(np.sum(pi[pi != 0] * side[pi != 0])
                      + np.sum(np.minimum(0.0, d) * self.ub))
        y = tuple(None if c is None else values[c] for c in self.ycols)
        x = {n: values[self.x[self.class_of[n]]] for n in self.names}
        return LpResult(float(self._seconds(value)), y, x, value, np.maximum(0.0, d), self)

    def _option_gain(self, cls: int, gain: np.ndarray, skip, minima) -> np.ndarray:
        """g_skip(cls, c) of the module docstring per option c: d⁺ of the option and the
        least d⁺ of a y it forces on each edge at the class not in `skip`; options outside a
        fixed or allowed domain: inf."""
        cols = self.x[cls]
        out = np.where(self.ub[cols] > 0, gain[cols], np.inf)
        for j, end in self.incident[cls]:
            if j not in skip and j in minima:
                out = out + minima[j][end][self.proj[j][end]]
        return out

    def _seconds(self, raw) -> np.ndarray | float:
        """Solver units to seconds, lowered by SAFETY (relative) against rounding."""
        v = np.asarray(raw * self.scale, dtype=float)
        with np.errstate(invalid="ignore"):  # inf (unreachable cells) stays inf
            return np.where(np.isfinite(v), v - SAFETY * np.abs(v), v)

    def _cell_bounds(self, j: int, raw: float, gain: np.ndarray, minima) -> np.ndarray:
        u, v = self.ends[j]
        r, s = self.proj[j]
        R, S = self.shapes[j]
        xu = self._option_gain(u, gain, (j,), minima)
        between = {f for f, _ in self.incident[u] if set(self.ends[f]) == {u, v}}
        xv = self._option_gain(v, gain, between | {j}, minima)
        if self.ycols[j] is None:  # one shared choice decides the cell
            out = np.full((R, S), np.inf)
            np.minimum.at(out, (r, s), xu)
        else:
            best_r = np.full(R, np.inf)
            np.minimum.at(best_r, r, xu)
            best_s = np.full(S, np.inf)
            np.minimum.at(best_s, s, xv)
            out = gain[self.ycols[j]] + best_r[:, None] + best_s[None, :]
        return self._seconds(raw + out)
