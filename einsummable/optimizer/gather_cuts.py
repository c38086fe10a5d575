r"""Memory cuts for weights placed freely: the weight blocks an op gathers where the weight is
stored otherwise, which the memory rows cannot see.

The rows (`memory.py`) count each node's bytes by its own choice. With weights placed freely
an op v reading weight w gathers, on device d, the blocks its candidate b reads there that
w's candidate a does not hold there: G_d(a,b) bytes (`weight_gathers`) over v's window
fetch(v)..step(v) (`peak.stored_otherwise`). That depends on two choices, so the load of
row (d, t) is

    load(d,t) = sum_v sum_c m[v,c,d,t] x[v,c]
              + sum_{(w,v) : t in window(v)} sum_{a,b} G_d(a,b) x[w,a] x[v,b].

For one candidate b of v, with Gmax_d(b) = max_a G_d(a,b), every plan has

    sum_a G_d(a,b) x[w,a] x[v,b]  >=  sum_a G_d(a,b) x[w,a] - Gmax_d(b) (1 - x[v,b])

(equal where x[v,b] = 1; where it is 0 the right side is at most 0). So for any set B of
such (w, v, b) gathered on d at t, every plan that fits d at t meets

    cut(d,t,B):  sum_v sum_c m[v,c,d,t] x[v,c]
                 + sum_{B} ( sum_a G_d(a,b) x[w,a] + Gmax_d(b) x[v,b] )  <=  capacity(d) + sum_{B} Gmax_d(b)

and a plan taking every b of B meets it with its true load. A plan the solver returns whose
gathers overfill d at t is cut off by cut(d,t,B), B its own consumers' candidates there,
whatever layout it would move the weight to next; no plan that fits is. The search is
solved again under the cuts (`fit_gathers`), each solve's bound still a bound on every plan
that fits. One cut a device a round, at its fullest step.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

from formulations.problem import LinearConstraint, Solution

from ..errors import InfeasibleError
from ..frontend.ir import DTYPE_BYTES
from ..planning.candidates import OpCandidates
from ..planning.cost import consumer_needs
from ..planning.placement import output_layout
from .memory import FIT_REL_TOL, Footprint, footprints, load, steps_of
from .model import Model
from .peak import assignment_peaks, missing_bytes, stored_otherwise

# Solves under cuts before a plan whose gathers still overfill a device is refused: each
# round cuts off the plan before it, so rounds are few where a plan that fits is near.
MEMORY_CUT_ROUNDS = 12
MB = 1e6  # bytes in messages
log = logging.getLogger(__name__)


def all_footprints(model: Model) -> dict[str, Footprint]:
    """Every candidate's footprint of every node (the rows' coefficients at any step)."""
    return _footprints(model, model.nodes)


def _footprints(model: Model, nodes: Mapping[str, OpCandidates]) -> dict[str, Footprint]:
    layouts = {k: [output_layout(oc.op, c) for c in oc.cands] for k, oc in nodes.items()}
    return footprints(model.graph, model.topology, nodes, layouts, model.options.weights,
                      layers=model.options.layers)


def gather_cuts(model: Model, assignment: Mapping[str, int],
                full: Callable[[], Mapping[str, Footprint]], tag: str = ""
                ) -> list[LinearConstraint]:
    """cut(d,t,S) for each device d that `assignment` overfills once its gathered weight
    blocks are counted, t its fullest step, S the pairs gathered there; [] when the plan
    fits or weights are stored once (then the rows count every block). `full()`: every
    candidate's footprint (`all_footprints`), asked for only when a device overfills."""
    if model.options.weights == "sharded":
        return []
    chosen = {k: OpCandidates(k, oc.op, (oc.cands[assignment[k]],),
                              (oc.level_parts[assignment[k]],))
              for k, oc in model.nodes.items()}
    mine = _footprints(model, chosen)
    n, steps = model.topology.world_size, steps_of(model.graph)
    rows = load(mine, {k: 0 for k in mine}, n, steps)
    extra = stored_otherwise(model.graph, chosen, mine)
    for x in extra:
        for t in range(x.first, x.last + 1):
            rows[x.device][t] += x.bytes
    cuts = []
    for d in range(n):
        cap = float(model.topology.devices[d].mem_bytes)
        t = max(range(steps), key=lambda s: (rows[d][s], -s))
        pairs = [x for x in extra if x.device == d and x.first <= t <= x.last]
        if rows[d][t] <= cap * (1 + FIT_REL_TOL) or not pairs:
            continue
        coef: dict[tuple[str, int], float] = {}
        for k, f in full().items():
            for c in range(len(f.held)):
                b = f.at(c, d, t)
                if b:
                    coef[k, c] = coef.get((k, c), 0.0) + b
        rhs = cap
        for x in pairs:
            b = assignment[x.op]
            g = weight_gathers(model, x.weight, x.op, b, d)
            for a, nbytes in enumerate(g):
                if nbytes:
                    coef[x.weight, a] = coef.get((x.weight, a), 0.0) + nbytes
            coef[x.op, b] = coef.get((x.op, b), 0.0) + max(g)
            rhs += max(g)
        cuts.append(LinearConstraint(tuple((k, c, a) for (k, c), a in coef.items()), "<=",
                                     rhs, f"gathers{tag}_d{d}_t{t}"))
    return cuts


def weight_gathers(model: Model, weight: str, op: str, b: int, d: int) -> list[int]:
    """G_d(a, b) for every candidate a of the weight's node: the bytes op's candidate b
    reads on device d that the weight's layout a does not hold there."""
    oc, src = model.nodes[op], model.nodes[weight]
    info = model.graph.tensor(src.op.output)
    needs = [(q, e) for q, e in consumer_needs(oc.op, oc.cands[b], info.name) if e == d]
    return [missing_bytes(needs, output_layout(src.op, c), DTYPE_BYTES[info.dtype]).get(d, 0)
            for c in src.cands]


def fit_gathers(model: Model, sol: Solution,
                resolve: Callable[[Sequence[LinearConstraint], float | None], Solution],
                deadline: float | None = None, rounds: int | None = None
                ) -> tuple[Solution, tuple[LinearConstraint, ...]]:
    """Solve again under gather cuts while the plan found overfills a device (module
    docstring): `resolve(cuts, seconds left)` solves the model under the cuts. Returns the
    last solution (it may still overfill: out of rounds or time; the caller checks) and the
    cuts."""
    if model.options.weights == "sharded":
        return sol, ()
    memo: list[Mapping[str, Footprint]] = []

    def full() -> Mapping[str, Footprint]:
        if not memo:
            memo.append(all_footprints(model))
        return memo[0]
    cuts: list[LinearConstraint] = []
    tried = [sol.assignment]
    for r in range(MEMORY_CUT_ROUNDS if rounds is None else rounds):
        new = gather_cuts(model, sol.assignment, full, tag=str(r))
        left = None if deadline is None else deadline - time.perf_counter()
        if not new or (left is not None and left <= 0):
            break
        cuts += new
        log.info("memory cuts, round %d: %d device(s) overfilled by gathered weight blocks",
                 r + 1, len(new), extra={"progress": (f"memory cuts {r + 1}", None, None)})
        try:
            sol = resolve(tuple(cuts), left)
        except InfeasibleError:
            raise _none_fits(model, tried) from None
        tried.append(sol.assignment)
    return sol, tuple(cuts)


def _none_fits(model: Model, tried: Sequence[Mapping[str, int]]) -> InfeasibleError:
    """The cuts leave no plan: every plan overfills some device once its gathered weight
    blocks are counted. Of the plans the rounds found, the one whose fullest device holds
    least is named, with that device's account; its bytes are a capacity a plan meets."""
    fullest = min((max(assignment_peaks(model, a), key=lambda p: p.bytes) for a in tried),
                  key=lambda p: p.bytes)
    cap = model.topology.devices[fullest.device].mem_bytes
    err = InfeasibleError(
        f"no plan fits the devices' memory once the weight blocks an op gathers where the "
        f"weight is stored otherwise are counted (weights placed freely); of the plans found, "
        f"the one that needs least: {fullest.describe()}, over its {cap / MB:.1f} MB",
        fix=f"give each device at least {fullest.bytes / MB:.1f} MB (that plan fits it); or "
            "use more devices, weights='sharded', or a smaller batch or sequence")
    err.min_capacity = float(fullest.bytes)
    return err
