"""The generic pairwise-choice problem: nodes choose one option each; edges charge a cost for
every pair of choices; optional memory capacities and linear side constraints.

Nothing here knows about tensors or devices: einsummable builds a `Problem` and reads a
`Solution`. The helpers at the bottom (`objective`, `violations`, `memory_usage`) evaluate an
assignment on the *original* problem, so every solver's answer is scored the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .errors import InvalidProblem

Sense = Literal["<=", ">=", "=="]
Status = Literal["optimal", "time_limit"]

# Feasibility tolerance, relative to the size of each constraint. Solvers work to ~1e-7 on
# scaled rows; checking with the same slack keeps exhaustive and MIP answers comparable.
FEAS_TOL = 1e-7
# Overlapping parts of the objective (see Problem): e.g. the compute path, and what streams
# behind it on each level of a machine; every node and edge with parts gives the same number.


def _floats(values, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise InvalidProblem(f"{what}: expected a sequence of numbers ({exc})") from None


@dataclass(frozen=True)
class Node:
    """One choice. ``costs[c]`` is the unary cost of option c; ``memory[k][c]`` the bytes that
    option c uses on resource k (None: uses nothing)."""

    name: str
    costs: tuple[float, ...]
    memory: tuple[tuple[float, ...], ...] | None = None
    parts: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # see Problem

    def __post_init__(self) -> None:
        object.__setattr__(self, "costs", _floats(self.costs, f"node {self.name!r} costs"))
        if not self.costs:
            raise InvalidProblem(f"node {self.name!r} has no options")
        if self.parts is not None:
            parts = tuple(_floats(p, f"node {self.name!r} parts") for p in self.parts)
            if not parts or any(len(p) != len(self.costs) for p in parts):
                raise InvalidProblem(f"node {self.name!r}: parts must be one or more rows of "
                                     f"{len(self.costs)} costs")
            object.__setattr__(self, "parts", parts)
        if self.memory is not None:
            mem = tuple(_floats(row, f"node {self.name!r} memory") for row in self.memory)
            for k, row in enumerate(mem):
                if len(row) != len(self.costs):
                    raise InvalidProblem(
                        f"node {self.name!r}: memory[{k}] has {len(row)} entries for "
                        f"{len(self.costs)} options"
                    )
            object.__setattr__(self, "memory", mem)

    @property
    def n_options(self) -> int:
        return len(self.costs)


@dataclass(frozen=True)
class Edge:
    """Pairwise cost between ``src`` and ``dst``: ``cost[src_proj[a]][dst_proj[b]]`` when src
    picks a and dst picks b. A projection maps options to the (fewer) layouts that actually
    determine the cost; None means the identity (the matrix is over options)."""

    src: str
    dst: str
    cost: tuple[tuple[float, ...], ...]
    src_proj: tuple[int, ...] | None = None
    dst_proj: tuple[int, ...] | None = None
    parts: tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]] | None = None

    def __post_init__(self) -> None:
        rows = tuple(_floats(r, f"edge {self.src!r}->{self.dst!r} cost") for r in self.cost)
        if not rows or not rows[0]:
            raise InvalidProblem(f"edge {self.src!r}->{self.dst!r} has an empty cost matrix")
        if any(len(r) != len(rows[0]) for r in rows):
            raise InvalidProblem(f"edge {self.src!r}->{self.dst!r}: cost matrix is ragged")
        object.__setattr__(self, "cost", rows)
        if self.parts is not None:
            parts = tuple(tuple(_floats(r, f"edge {self.src!r}->{self.dst!r} parts") for r in m)
                          for m in self.parts)
            if not parts or any(
                    len(m) != len(rows) or any(len(r) != len(rows[0]) for r in m) for m in parts):
                raise InvalidProblem(f"edge {self.src!r}->{self.dst!r}: parts must be one or "
                                     "more matrices shaped like cost")
            object.__setattr__(self, "parts", parts)
        for attr, bound in (("src_proj", len(rows)), ("dst_proj", len(rows[0]))):
            proj = getattr(self, attr)
            if proj is None:
                continue
            proj = tuple(int(p) for p in proj)
            if any(p < 0 or p >= bound for p in proj):
                raise InvalidProblem(
                    f"edge {self.src!r}->{self.dst!r}: {attr} has an index outside 0..{bound - 1}"
                )
            object.__setattr__(self, attr, proj)


@dataclass(frozen=True)
class LinearConstraint:
    """Σ coef · x[node, option] (sense) rhs, over the one-hot choice variables. An `elastic`
    constraint (sense <=, in bytes) is a memory row the caller adds: where memory makes the
    problem infeasible, the model of the least memory lets it exceed its rhs by the same δ
    as the capacity rows, and the feasibility check without memory leaves it out."""

    terms: tuple[tuple[str, int, float], ...]
    sense: Sense
    rhs: float
    name: str = ""
    elastic: bool = False

    def __post_init__(self) -> None:
        if self.sense not in ("<=", ">=", "=="):
            raise InvalidProblem(f"side constraint {self.name!r}: sense must be <=, >= or ==")
        if self.elastic and self.sense != "<=":
            raise InvalidProblem(f"side constraint {self.name!r}: an elastic constraint is a "
                                 "memory row (sense <=)")
        terms = tuple((str(n), int(c), float(a)) for n, c, a in self.terms)
        object.__setattr__(self, "terms", terms)
        object.__setattr__(self, "rhs", float(self.rhs))


@dataclass(frozen=True)
class Problem:
    """Objective: Σ costs  +  max_k Σ parts[k] over the chosen options and cells. Parts model
    activities that overlap in time (e.g. compute, and transfers streamed behind it): only the
    longest counts. Every node and edge with parts gives the same number of them (`n_parts`);
    those without add 0 to each."""
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    capacities: tuple[float, ...] | None = None
    side: tuple[LinearConstraint, ...] = ()
    tie: tuple[tuple[str, ...], ...] = ()
    fixed: Mapping[str, int] = field(default_factory=dict)
    warm_start: Mapping[str, int] | None = None
    # node -> the options it may take (the others are out, as options other than a fixed one
    # are); e.g. the options a bound proves no better plan uses are left out
    allowed: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "side", tuple(self.side))
        object.__setattr__(self, "tie", tuple(tuple(g) for g in self.tie))
        object.__setattr__(self, "fixed", dict(self.fixed or {}))
        object.__setattr__(self, "allowed", {n: tuple(int(c) for c in cs)
                                             for n, cs in (self.allowed or {}).items()})
        if self.warm_start is not None:
            object.__setattr__(self, "warm_start", dict(self.warm_start))
        if self.capacities is not None:
            object.__setattr__(self, "capacities", _floats(self.capacities, "capacities"))
        self._validate()

    def _validate(self) -> None:
        counts = {len(x.parts) for x in (*self.nodes, *self.edges) if x.parts is not None}
        if len(counts) > 1:
            raise InvalidProblem(f"nodes and edges give different numbers of parts: {sorted(counts)}")
        by_name = {}
        for n in self.nodes:
            if n.name in by_name:
                raise InvalidProblem(f"node name {n.name!r} appears twice")
            by_name[n.name] = n
            if n.memory is not None and self.capacities is not None:
                if len(n.memory) != len(self.capacities):
                    raise InvalidProblem(
                        f"node {n.name!r} gives memory for {len(n.memory)} resources; "
                        f"there are {len(self.capacities)} capacities"
                    )

        def node(name: str, where: str) -> Node:
            if name not in by_name:
                raise InvalidProblem(f"{where} names unknown node {name!r}")
            return by_name[name]

        def option(name: str, c: int, where: str) -> None:
            k = node(name, where).n_options
            if not 0 <= c < k:
                raise InvalidProblem(f"{where}: option {c} of node {name!r} is outside 0..{k - 1}")

        for e in self.edges:
            where = f"edge {e.src!r}->{e.dst!r}"
            for end, proj, size in ((e.src, e.src_proj, len(e.cost)), (e.dst, e.dst_proj, len(e.cost[0]))):
                k = node(end, where).n_options
                want = k if proj is None else len(proj)
                if proj is None and size != k:
                    raise InvalidProblem(
                        f"{where}: cost matrix has {size} entries on the {end!r} side "
                        f"for {k} options (give a projection if it is over layouts)"
                    )
                if want != k:
                    raise InvalidProblem(f"{where}: projection for {end!r} has {want} entries for {k} options")
        for g in self.tie:
            ks = {node(n, "tie group").n_options for n in g}
            if len(ks) > 1:
                raise InvalidProblem(f"tie group {g!r} mixes nodes with different option counts")
        for n, c in self.fixed.items():
            option(n, c, "fixed")
        for n, cs in self.allowed.items():
            if not cs:
                raise InvalidProblem(f"allowed options of node {n!r}: none given")
            for c in cs:
                option(n, c, "allowed")
        for n, c in (self.warm_start or {}).items():
            option(n, c, "warm_start")
        for s in self.side:
            for n, c, _ in s.terms:
                option(n, c, f"side constraint {s.name!r}")

    @property
    def n_parts(self) -> int:
        """How many overlapping parts the objective has (0: none)."""
        return next((len(x.parts) for x in (*self.nodes, *self.edges) if x.parts is not None), 0)

    @property
    def has_parts(self) -> bool:
        return self.n_parts > 0

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


@dataclass(frozen=True)
class Solution:
    assignment: dict[str, int]
    objective: float
    bound: float
    gap: float
    wall_s: float
    status: Status
    solver: str


# ---- evaluation on the original problem --------------------------------------------------


def _proj(p: tuple[int, ...] | None, c: int) -> int:
    return c if p is None else p[c]


def objective(problem: Problem, assignment: Mapping[str, int]) -> float:
    total = 0.0
    parts = [0.0] * problem.n_parts
    for n in problem.nodes:
        c = assignment[n.name]
        total += n.costs[c]
        if n.parts is not None:
            for k in range(len(parts)):
                parts[k] += n.parts[k][c]
    for e in problem.edges:
        r, s = _proj(e.src_proj, assignment[e.src]), _proj(e.dst_proj, assignment[e.dst])
        total += e.cost[r][s]
        if e.parts is not None:
            for k in range(len(parts)):
                parts[k] += e.parts[k][r][s]
    return total + max(parts) if problem.has_parts else total


def memory_usage(problem: Problem, assignment: Mapping[str, int]) -> tuple[float, ...]:
    """Bytes used per resource (empty tuple when the problem has no capacities)."""
    if problem.capacities is None:
        return ()
    use = [0.0] * len(problem.capacities)
    for n in problem.nodes:
        if n.memory is not None:
            for k, row in enumerate(n.memory):
                use[k] += row[assignment[n.name]]
    return tuple(use)


def _slack_ok(lhs: float, sense: str, rhs: float, scale: float) -> bool:
    tol = FEAS_TOL * max(1.0, abs(rhs), scale)
    if sense == "<=":
        return lhs <= rhs + tol
    if sense == ">=":
        return lhs >= rhs - tol
    return abs(lhs - rhs) <= tol


def violations(problem: Problem, assignment: Mapping[str, int], *, memory: bool = True) -> list[str]:
    """Human-readable list of what the assignment breaks (empty: feasible)."""
    out: list[str] = []
    for n, c in problem.fixed.items():
        if assignment[n] != c:
            out.append(f"node {n!r} is fixed to option {c}")
    for n, cs in problem.allowed.items():
        if assignment[n] not in cs:
            out.append(f"node {n!r} takes option {assignment[n]}, not one of {list(cs)}")
    for g in problem.tie:
        if len({assignment[n] for n in g}) > 1:
            out.append(f"tie group {g!r} chooses different options")
    for s in problem.side:
        lhs = sum(a for n, c, a in s.terms if assignment[n] == c)
        size = sum(abs(a) for _, _, a in s.terms)
        if not _slack_ok(lhs, s.sense, s.rhs, size):
            out.append(f"side constraint {s.name!r}: {lhs:g} {s.sense} {s.rhs:g} fails")
    if memory and problem.capacities is not None:
        for k, (use, cap) in enumerate(zip(memory_usage(problem, assignment), problem.capacities)):
            if not _slack_ok(use, "<=", cap, 0.0):
                out.append(f"memory on resource {k}: {use:g} bytes > capacity {cap:g}")
    return out


def memory_excess(problem: Problem, assignment: Mapping[str, int]) -> tuple[float, int]:
    """max_k (mem_k - cap_k) and the first k attaining it."""
    assert problem.capacities is not None
    ex = [u - c for u, c in zip(memory_usage(problem, assignment), problem.capacities)]
    k = max(range(len(ex)), key=lambda i: (ex[i], -i))
    return ex[k], k


def gap_of(obj: float, bound: float) -> float:
    """Relative gap |obj - bound| / |obj| as HiGHS defines it (0 when both are 0)."""
    diff = max(0.0, obj - bound)
    if diff == 0.0:
        return 0.0
    return diff / max(abs(obj), 1e-300)
