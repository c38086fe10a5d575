"""Exact presolve: rewrite a `Problem` into a smaller equivalent one before any solver sees it.

Every step preserves the optimum exactly (the objective differs by no more than float rounding):

1. Tie groups become one *class*: its members share one set of x variables, their unary costs
   and memory add up.
2. Fixed options shrink a class's domain to one option, allowed options to those allowed for
   every member; one-option classes carry no variables, their cost is a constant and their
   memory a constant on each capacity row.
3. An edge inside a class costs cost[proj_u(c)][proj_v(c)] for the shared choice c: unary.
4. Every other edge is restricted to the domains, rows/columns that are equal are merged (an
   automatic projection), then row minima are moved to the source's unary cost and column
   minima to the destination's (a matrix a[r] + b[s] is fully absorbed and the edge dropped).
   Repeat until stable: subtracting minima can make rows equal.
5. Edges between the same pair of classes (repeated layers after tying) are summed into one
   matrix over the product projection when that does not enlarge the y variable count.

With overlapping parts (Problem.parts) every cost is a stack of components (plain, part 0,
part 1): rows and columns merge only when equal in every component, and minima move to the
unary cost of the same component, so each part is preserved exactly and so is their max.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import Infeasible
from .problem import Problem


@dataclass(frozen=True)
class CEdge:
    u: int  # class indices, u < v
    v: int
    rows: np.ndarray  # option of u -> row of cost (-1 outside u's domain)
    cols: np.ndarray  # option of v -> column of cost (-1 outside v's domain)
    cost: np.ndarray  # R x S, non-negative with a zero in every row and column
    parts: np.ndarray | None = None  # n_parts x R x S (each likewise), when the problem has parts


@dataclass(frozen=True)
class CSide:
    name: str
    terms: tuple[tuple[int, int, float], ...]  # (class, option, coefficient), active classes only
    sense: str
    rhs: float  # constants of one-option classes already moved here
    elastic: bool = False  # a memory row: exceeds its rhs by δ in the least-memory model


@dataclass(frozen=True)
class Compact:
    members: tuple[tuple[str, ...], ...]  # node names per class (sorted)
    n_options: tuple[int, ...]
    domain: tuple[tuple[int, ...], ...]
    unary: tuple[np.ndarray, ...]  # per class, over all its options
    edges: tuple[CEdge, ...]
    memory: tuple[np.ndarray, ...] | None  # per class: resources x options
    side: tuple[CSide, ...]
    class_of: dict[str, int]
    unary_parts: tuple[np.ndarray, ...] | None = None  # per class: n_parts x options

    @property
    def active(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.domain) if len(d) > 1)

    def expand(self, choice: dict[int, int]) -> dict[str, int]:
        """Class choice (active classes; others take their only option) -> node assignment."""
        out: dict[str, int] = {}
        for i, names in enumerate(self.members):
            c = choice[i] if i in choice else self.domain[i][0]
            for n in names:
                out[n] = c
        return dict(sorted(out.items()))


def _classes(problem: Problem) -> tuple[list[list[str]], dict[str, int]]:
    names = sorted(n.name for n in problem.nodes)
    parent = {n: n for n in names}

    def find(a: str) -> str:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for group in problem.tie:
        for other in group[1:]:
            ra, rb = find(group[0]), find(other)
            if ra != rb:  # the smaller name stays the root, so classes do not depend on order
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    members = [groups[r] for r in sorted(groups)]
    class_of = {n: i for i, ms in enumerate(members) for n in ms}
    return members, class_of


def _dedupe(index: np.ndarray, mat: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge equal rows (axis 0) or columns (axis 1), numbered by first occurrence; index maps
    options to old rows/columns and is returned mapped to the new ones."""
    # mat is K x R x S (components stacked); rows/columns merge when equal in all of them
    m = np.moveaxis(mat, axis + 1, 0) + 0.0  # + 0.0 turns -0.0 into 0.0 so both merge
    seen: dict[bytes, int] = {}
    keep: list[int] = []
    remap = np.empty(m.shape[0], dtype=np.int64)
    for r in range(m.shape[0]):
        j = seen.setdefault(np.ascontiguousarray(m[r]).tobytes(), len(keep))
        if j == len(keep):
            keep.append(r)
        remap[r] = j
    if len(keep) == m.shape[0]:
        return index, mat
    return remap[index], (mat[:, keep] if axis == 0 else mat[:, :, keep])


def _canonical(
    u: int, v: int, rows: np.ndarray, cols: np.ndarray, cost: np.ndarray,
    domain: tuple[tuple[int, ...], ...], unary: list[np.ndarray],
) -> CEdge | None:
    du, dv = np.array(domain[u]), np.array(domain[v])
    used_r, ru = np.unique(rows[du], return_inverse=True)
    used_c, cv = np.unique(cols[dv], return_inverse=True)
    ru, cv = ru.reshape(-1), cv.reshape(-1)
    mat = cost[:, used_r][:, :, used_c].astype(float, copy=True)  # K x R x S
    for _ in range(4):
        shape = mat.shape
        ru, mat = _dedupe(ru, mat, 0)
        cv, mat = _dedupe(cv, mat, 1)
        rmin = mat.min(axis=2)  # K x R
        if np.any(rmin != 0):
            unary[u][:, du] += rmin[:, ru]
            mat = mat - rmin[:, :, None]
        cmin = mat.min(axis=1)  # K x S
        if np.any(cmin != 0):
            unary[v][:, dv] += cmin[:, cv]
            mat = mat - cmin[:, None, :]
        if not np.any(mat):
            return None
        if mat.shape == shape and not np.any(rmin) and not np.any(cmin):
            break
    full_r = np.full(len(rows), -1, dtype=np.int64)
    full_c = np.full(len(cols), -1, dtype=np.int64)
    full_r[du], full_c[dv] = ru, cv
    return CEdge(u, v, full_r, full_c, mat)


def _merge(a: CEdge, b: CEdge, domain, unary) -> CEdge | None | bool:
    """Sum two edges on the same pair of classes; False when the product is not smaller."""
    du, dv = np.array(domain[a.u]), np.array(domain[a.v])
    R, S = b.cost.shape[1:]
    pr = a.rows[du] * R + b.rows[du]
    pc = a.cols[dv] * S + b.cols[dv]
    ur, ir = np.unique(pr, return_inverse=True)
    uc, ic = np.unique(pc, return_inverse=True)
    if len(ur) * len(uc) > a.cost[0].size + b.cost[0].size:
        return False
    ar, br = ur // R, ur % R
    ac, bc = uc // S, uc % S
    mat = a.cost[:, ar][:, :, ac] + b.cost[:, br][:, :, bc]
    rows = np.full(len(a.rows), -1, dtype=np.int64)
    cols = np.full(len(a.cols), -1, dtype=np.int64)
    rows[du], cols[dv] = ir.reshape(-1), ic.reshape(-1)
    return _canonical(a.u, a.v, rows, cols, mat, domain, unary)


def compact(problem: Problem) -> Compact:
    members, class_of = _classes(problem)
    nodes = {n.name: n for n in problem.nodes}
    n_options = tuple(nodes[ms[0]].n_options for ms in members)

    domain: list[tuple[int, ...]] = []
    for i, ms in enumerate(members):
        fixed = {problem.fixed[n] for n in ms if n in problem.fixed}
        if len(fixed) > 1:
            raise Infeasible(
                f"nodes {', '.join(repr(n) for n in ms if n in problem.fixed)} are tied "
                f"but fixed to different options {sorted(fixed)}"
            )
        keep = (fixed.pop(),) if fixed else tuple(range(n_options[i]))
        for n in ms:
            if n in problem.allowed:
                keep = tuple(c for c in keep if c in problem.allowed[n])
        if not keep:
            raise Infeasible(f"no option of {', '.join(repr(n) for n in ms)} is both fixed "
                             "(or tied) and allowed")
        domain.append(keep)
    dom = tuple(domain)

    # components: the plain cost, then each overlapping part (Problem)
    k_parts = problem.n_parts
    unary = [np.zeros((1 + k_parts, k)) for k in n_options]
    for n in problem.nodes:
        unary[class_of[n.name]][0] += np.asarray(n.costs)
        if k_parts and n.parts is not None:
            unary[class_of[n.name]][1:] += np.asarray(n.parts)

    memory = None
    if problem.capacities is not None:
        nk = len(problem.capacities)
        memory = [np.zeros((nk, k)) for k in n_options]
        for n in problem.nodes:
            if n.memory is not None:
                memory[class_of[n.name]] += np.asarray(n.memory)

    # Raw sums first: edges on the same class pair with the same projections (a repeated
    # layer's copies) add up without any product projection.
    raw: dict[tuple, list] = {}
    order = sorted(range(len(problem.edges)), key=lambda j: (problem.edges[j].src, problem.edges[j].dst, j))
    for j in order:
        e = problem.edges[j]
        u, v = class_of[e.src], class_of[e.dst]
        plain = np.asarray(e.cost, dtype=float)
        cost = np.zeros((1 + k_parts,) + plain.shape)
        cost[0] = plain
        if k_parts and e.parts is not None:
            cost[1:] = np.asarray(e.parts, dtype=float)
        rows = np.arange(n_options[u]) if e.src_proj is None else np.asarray(e.src_proj)
        cols = np.arange(n_options[v]) if e.dst_proj is None else np.asarray(e.dst_proj)
        if u == v:  # both ends share one choice
            unary[u] += cost[:, rows, cols]
            continue
        if u > v:
            u, v, rows, cols, cost = v, u, cols, rows, cost.transpose(0, 2, 1)
        key = (u, v, rows.tobytes(), cols.tobytes(), cost.shape)
        if key in raw:
            raw[key][4] = raw[key][4] + cost
        else:
            raw[key] = [u, v, rows, cols, cost]

    pairs: dict[tuple[int, int], list[CEdge]] = {}
    for u, v, rows, cols, cost in raw.values():  # insertion order: deterministic
        ce = _canonical(u, v, rows, cols, cost, dom, unary)
        if ce is None:
            continue
        kept = pairs.setdefault((u, v), [])
        for idx, other in enumerate(kept):
            merged = _merge(other, ce, dom, unary)
            if merged is False:
                continue
            if merged is None:
                kept.pop(idx)
            else:
                kept[idx] = merged
            break
        else:
            kept.append(ce)
    edges = tuple(CEdge(e.u, e.v, e.rows, e.cols, e.cost[0], e.cost[1:] if k_parts else None)
                  for key in sorted(pairs) for e in pairs[key])

    side = []
    for s in problem.side:
        coef: dict[tuple[int, int], float] = {}
        rhs = s.rhs
        for n, c, a in s.terms:
            i = class_of[n]
            if c not in dom[i]:
                continue  # that x is forced to 0
            if len(dom[i]) == 1:
                rhs -= a
            else:
                coef[(i, c)] = coef.get((i, c), 0.0) + a
        terms = tuple((i, c, a) for (i, c), a in sorted(coef.items()) if a != 0.0)
        side.append(CSide(s.name, terms, s.sense, rhs, s.elastic))

    return Compact(
        members=tuple(tuple(ms) for ms in members),
        n_options=n_options,
        domain=dom,
        unary=tuple(u[0] for u in unary),
        edges=edges,
        memory=None if memory is None else tuple(memory),
        side=tuple(side),
        class_of=class_of,
        unary_parts=tuple(u[1:] for u in unary) if k_parts else None,
    )
