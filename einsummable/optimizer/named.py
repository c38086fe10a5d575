"""Named parallel strategies as choices among the same candidates, for comparison.

Each strategy is a rule that, per op and per topology level, says which modes to split (by the
mode roles of `candidates.roles`); the candidate with exactly those parts per level is chosen.
Graph inputs then take the layout that is cheapest given the ops' choices. Because the choices
come from the optimizer's own candidate lists, the optimizer's objective is never above a named
plan's (on the same cost model and constraints).

- data-parallel: split token modes (batch, then sequence) over all devices; weights replicated
  (it is priced with weights="free": replicas are not stored once).
- fsdp: the same split, weights stored sharded and gathered by each op that reads them, under
  weights="sharded"; under "free" (the default) its weights take the layout cheapest for its
  ops, as every strategy's inputs do: data parallel's replicas.
- megatron-tp: inside the fastest level, split the feature mode (heads, FFN width; the
  contraction mode when the activation already carries it, so column- then row-parallel);
  ops without one (norms, residual adds) are replicated; slower levels (across nodes) run data
  parallel, as Megatron is deployed.
- megatron-tp-sp: as megatron-tp, but the replicated ops split the sequence instead.
- ulysses: split the sequence everywhere except attention (ops with two sequence modes: query
  and key), which splits heads.
- one-device: every op and input whole on device 0, the plan that sends nothing. It is not
  among the candidates (each of which uses every device), so it is no warm start for the MIP;
  `api.named_plan` prices it on a model whose nodes are fixed to it, memory rows included.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import PlanError
from ..frontend.ir import Op
from ..planning.candidates import TOKEN_ROLES, OpCandidates
from ..planning.placement import INPUT_PREFIX
from .model import EdgeTerm, Model

STRATEGIES = ("data-parallel", "fsdp", "megatron-tp", "megatron-tp-sp", "ulysses")
ONE_DEVICE = "one-device"
NAMED = STRATEGIES + (ONE_DEVICE,)  # every name `named_plan` takes
STRATEGY_WEIGHTS = {"data-parallel": "free"}  # overrides of the weights option


def check_strategy(name: str) -> None:
    if name not in NAMED:
        raise PlanError(f"unknown strategy {name!r}", fix=f"use one of: {', '.join(NAMED)}")


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _assign(op: Op, modes: list[str], f: int, used: dict[str, int], want: dict[str, int]) -> int:
    """Greedily give each mode the largest divisor of the remaining fan-out that fits."""
    for m in modes:
        if f == 1:
            break
        room = op.size[m] // (used.get(m, 1) * want.get(m, 1))
        for p in _divisors_desc(f):
            if p <= room and (p == 1 or op.can_split(m)):
                if p > 1:
                    want[m] = want.get(m, 1) * p
                    f //= p
                break
    return f


def _by_role(op: Op, roles: Mapping[str, str], role: str) -> list[str]:
    return [m for m in op.modes if roles.get(m) == role and op.size[m] > 1]


def _feature_modes(op: Op, roles: Mapping[str, str], activations: set[str]) -> list[str]:
    """Feature modes, those an activation operand already carries first (row-parallel)."""
    carried = {m for name, dims in zip(op.inputs, op.in_dims) if name in activations
               for g in dims for m in g}
    feats = _by_role(op, roles, "feature")
    return [m for m in feats if m in carried] + [m for m in feats if m not in carried]


def _level_rule(strategy: str, op: Op, roles: Mapping[str, str], activations: set[str],
                slow: bool) -> tuple[str, ...]:
    """What to split at one level: a tuple of role-kinds tried in order."""
    seqs = _by_role(op, roles, "seq")
    if strategy in ("data-parallel", "fsdp"):
        return ("tokens",)
    if strategy == "ulysses":
        return ("feature", "tokens") if len(seqs) >= 2 else ("seq-tokens",)
    if slow:  # Megatron across nodes: data parallel
        return ("tokens",)
    if _feature_modes(op, roles, activations):
        return ("feature", "tokens")
    return ("replicate",) if strategy == "megatron-tp" else ("seq-tokens",)


def _modes_for(kind: str, op: Op, roles: Mapping[str, str], activations: set[str]) -> list[str]:
    if kind == "tokens":
        return [m for r in TOKEN_ROLES for m in _by_role(op, roles, r)]
    if kind == "seq-tokens":
        return [m for r in reversed(TOKEN_ROLES) for m in _by_role(op, roles, r)]
    if kind == "feature":
        return _feature_modes(op, roles, activations)[:1]
    return []


def op_choice(strategy: str, oc: OpCandidates, roles: Mapping[str, str], activations: set[str],
              fanouts: tuple[int, ...]) -> tuple[int, bool]:
    """Index of the strategy's candidate for one op, and whether it is an exact match."""
    op = oc.op
    used: dict[str, int] = {}
    per_level = []
    for level, f in enumerate(fanouts):
        want: dict[str, int] = {}
        rest = f
        for kind in _level_rule(strategy, op, roles, activations, level < len(fanouts) - 1):
            if kind == "replicate":
                break
            rest = _assign(op, _modes_for(kind, op, roles, activations), rest, used, want)
        for m, p in want.items():
            used[m] = used.get(m, 1) * p
        per_level.append(tuple((m, want[m]) for m in op.modes if want.get(m, 1) > 1))
    exact = oc.index_of(tuple(per_level))
    if exact is not None:
        return exact, True
    combined = tuple((m, used.get(m, 1)) for m in op.modes)
    for i, c in enumerate(oc.cands):
        if c.parts == combined:
            return i, False
    # Closest: most modes split as wanted, then fewest extra splits, then first.
    def score(i: int) -> tuple[int, int, int]:
        part = dict(oc.cands[i].parts)
        hit = sum(1 for m, p in used.items() if part.get(m, 1) == p)
        extra = sum(1 for m, p in part.items() if p > 1 and used.get(m, 1) == 1)
        return (-hit, extra, i)
    return min(range(len(oc.cands)), key=score), False


def named_assignment(model: Model, strategy: str) -> tuple[dict[str, int], tuple[str, ...]]:
    """The strategy's candidate index per node; also the ops that had no exact match."""
    check_strategy(strategy)
    graph = model.graph
    activations = {t.name for t in graph.tensors if t.kind in ("input", "intermediate")}
    fan = model.topology.fanouts()
    choice: dict[str, int] = {}
    inexact = []
    for op in graph.ops:
        i, exact = op_choice(strategy, model.nodes[op.name], model.roles.modes[op.name],
                             activations, fan)
        choice[op.name] = i
        if not exact:
            inexact.append(op.name)
    return cheapest_inputs(model, choice), tuple(inexact)


def cheapest_inputs(model: Model, choice: Mapping[str, int]) -> dict[str, int]:
    """`choice` (a candidate index per op) completed with the layout of every graph input
    cheapest given the ops (ties break on the lowest index, so tied weights of repeated
    blocks choose alike)."""
    choice = dict(choice)
    touching: dict[str, list[EdgeTerm]] = {}
    for e in model.edges:
        for end in (e.src, e.dst):
            if end.startswith(INPUT_PREFIX) and end not in choice:
                touching.setdefault(end, []).append(e)
    for k, oc in model.nodes.items():
        if k in choice:
            continue
        def cost(c: int, exact: bool) -> float:
            """The layout's seconds on its edges: exact (priced now), or their estimates."""
            tot = model.unary(k, c)
            for e in touching.get(k, ()):
                a, b = (c, choice[e.dst]) if e.src == k else (choice[e.src], c)
                x = e.cost(a, b) if exact else e.matrix.estimate(e.rows[a], e.cols[b])
                tot += x.seconds
            return tot
        choice[k] = _cheapest(len(oc.cands), cost)
    return {k: choice[k] for k in model.nodes}


def _cheapest(n: int, cost) -> int:
    """argmin over c < n of (cost(c, exact=True), c), pricing few cells: candidates go in order
    of their estimate (a lower bound, summed in the same order), and once one's (estimate,
    index) exceeds the best exact (cost, index), no later one can win."""
    best: tuple[float, int] | None = None
    for low, c in sorted((cost(c, False), c) for c in range(n)):
        if best is not None and (low, c) > best:
            break
        here = (cost(c, True), c)
        if best is None or here < best:
            best = here
    assert best is not None
    return best[1]

