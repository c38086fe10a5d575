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

Where no plan fits, the cuts are elastic memory rows: the model of least memory
(`formulations`: min δ over rows <= capacity + δ) relaxes them by the same δ, so capacity +
δ* is a lower bound on the least capacity any plan needs with its gathered blocks counted;
cutting off its plan at that level where the gathers take it past it and solving again
finds the least (`least_capacity`).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

from formulations.problem import LinearConstraint, Solution

from ..errors import InfeasibleError
from ..frontend.ir import DTYPE_BYTES
from ..planning.cost import consumer_needs
from ..planning.placement import output_layout
from .memory import FIT_REL_TOL, Footprint, fits, footprints
from .model import Model
from .peak import assignment_loads, assignment_peaks, missing_bytes, overfilled

# Solves under cuts before a plan whose gathers still overfill a device is refused: each
# round cuts off the plan before it, so rounds are few where a plan that fits is near.
MEMORY_CUT_ROUNDS = 12
# Rounds of the least-capacity search (error path): each cuts off one plan of least δ, and
# the model of least memory can hold many plans at that δ whose gathered blocks differ, one
# cut off a round. The llama-7b block (1 x 512) on a100x8 reached its least, 115.9 MB,
# after 43 rounds (15 s); 12 ended at a range, asking for 138.5-140.5 MB in two runs. The
# caller's deadline bounds them too.
LEAST_CUT_ROUNDS = 100
MB = 1e6  # bytes in messages
log = logging.getLogger(__name__)


def all_footprints(model: Model) -> dict[str, Footprint]:
    """Every candidate's footprint of every node (the rows' coefficients at any step)."""
    layouts = {k: [output_layout(oc.op, c) for c in oc.cands] for k, oc in model.nodes.items()}
    return footprints(model.graph, model.topology, model.nodes, layouts,
                      model.options.weights, layers=model.options.layers)


def gather_cuts(model: Model, assignment: Mapping[str, int],
                full: Callable[[], Mapping[str, Footprint]], tag: str = "",
                excess: float = 0.0) -> list[LinearConstraint]:
    """cut(d,t,B) for each device d that `assignment` fills past capacity(d) + `excess` once
    its gathered weight blocks are counted, t its fullest step, B the pairs gathered there;
    [] when the plan fits or weights are stored once (then the rows count every block).
    `full()`: every candidate's footprint (`all_footprints`), asked for only when a device
    overfills. The cuts are elastic: memory rows the model of least memory relaxes by δ."""
    if model.options.weights == "sharded":
        return []
    loads = assignment_loads(model, assignment)
    cuts = []
    for d in range(model.topology.world_size):
        cap = float(model.topology.devices[d].mem_bytes)
        t = loads.fullest(d)
        pairs = [x for x in loads.extra if x.device == d and x.first <= t <= x.last]
        if loads.rows[d][t] <= (cap + excess) * (1 + FIT_REL_TOL) or not pairs:
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
                                     rhs, f"gathers{tag}_d{d}_t{t}", elastic=True))
    return cuts


def weight_gathers(model: Model, weight: str, op: str, b: int, d: int) -> list[int]:
    """G_d(a, b) for every candidate a of the weight's node: the bytes op's candidate b
    reads on device d that the weight's layout a does not hold there."""
    oc, src = model.nodes[op], model.nodes[weight]
    info = model.graph.tensor(src.op.output)
    needs = [(q, e) for q, e in consumer_needs(oc.op, oc.cands[b], info.name) if e == d]
    return [missing_bytes(needs, output_layout(src.op, c), DTYPE_BYTES[info.dtype]).get(d, 0)
            for c in src.cands]


def fits_with_gathers(model: Model, assignment: Mapping[str, int]) -> bool:
    """Whether a plan fits every device with the weight blocks it gathers where a weight is
    stored otherwise counted (`memory.fits` checks the rows alone, which miss them)."""
    return fits(model.memory, model.capacities, assignment) and \
        overfilled(model, assignment) is None


def fit_gathers(model: Model, sol: Solution,
                resolve: Callable[[Sequence[LinearConstraint], float | None], Solution],
                deadline: float | None = None
                ) -> tuple[Solution, tuple[LinearConstraint, ...]]:
    """Solve again under gather cuts while the plan found overfills a device (module
    docstring): `resolve(cuts, seconds left)` solves the model under the cuts. Returns the
    last solution (it may still overfill: out of rounds or time; the caller checks) and the
    cuts. Where the cuts leave no plan, raises the error `least_capacity` words."""
    if model.options.weights == "sharded":
        return sol, ()
    full = _full(model)
    cuts: list[LinearConstraint] = []
    tried = [sol.assignment]
    for r in range(MEMORY_CUT_ROUNDS):
        new = gather_cuts(model, sol.assignment, full, tag=str(r))
        left = _left(deadline)
        if not new or (left is not None and left <= 0):
            break
        cuts += new
        log.info("memory cuts, round %d: %d device(s) overfilled by gathered weight blocks",
                 r + 1, len(new), extra={"progress": (f"memory cuts {r + 1}", None, None)})
        try:
            sol = resolve(tuple(cuts), left)
        except InfeasibleError as e:
            raise least_capacity(model, e, resolve, cuts, tried, deadline) from None
        tried.append(sol.assignment)
    return sol, tuple(cuts)


def least_capacity(model: Model, err: InfeasibleError,
                   resolve: Callable[[Sequence[LinearConstraint], float | None], Solution],
                   cuts: Sequence[LinearConstraint] = (),
                   tried: Sequence[Mapping[str, int]] = (),
                   deadline: float | None = None) -> InfeasibleError:
    """No plan fits: the least capacity a plan needs with its gathered weight blocks counted.

    `err` comes from the solve under `cuts` (elastic: `formulations` then minimises the
    excess δ over the rows and the cuts together, and `err.assignment` is a plan of least
    δ). Every plan's true peak is at least capacity + δ(plan), the cuts being lower bounds
    of its load, so capacity + δ* bounds the least from below. The plan of least δ is cut
    off at that level where its gathered blocks take it past it and the model of least
    memory is solved again, until its plan holds what the model says (the bound is met: the
    least, exactly) or the rounds or the time run out (the least then lies between the
    bound and the best plan met, which is the capacity reported: a plan meets it)."""
    full, cuts = _full(model), list(cuts)
    met = [max(assignment_peaks(model, a), key=lambda p: p.bytes) for a in tried]
    bound: float | None = None
    for r in range(LEAST_CUT_ROUNDS):
        a = getattr(err, "assignment", None)
        if a is None:
            break
        met.append(max(assignment_peaks(model, a), key=lambda p: p.bytes))
        delta = _excess(err, cuts, a)
        bound = float(model.topology.devices[met[-1].device].mem_bytes) + delta
        new = gather_cuts(model, a, full, tag=f"least{r}", excess=delta)
        left = _left(deadline)
        if not new or (left is not None and left <= 0):
            break
        cuts += new
        log.info("least capacity, round %d: between %.1f and %.1f MB", r + 1, bound / MB,
                 min(p.bytes for p in met) / MB,
                 extra={"progress": (f"least capacity {r + 1}", None, None)})
        try:
            resolve(tuple(cuts), left)
            break  # not reached: cuts only take plans away from a model no plan fits
        except InfeasibleError as e:
            err = e
    if not met:
        return err
    best = min(met, key=lambda p: p.bytes)
    cap = model.topology.devices[best.device].mem_bytes
    if bound is None or best.bytes <= bound * (1 + FIT_REL_TOL):
        need = f"the least any plan needs is {best.bytes / MB:.1f} MB on its fullest device"
    else:
        need = (f"the least any plan needs is between {bound / MB:.1f} and "
                f"{best.bytes / MB:.1f} MB on its fullest device")
    out = InfeasibleError(
        f"no plan fits the devices' memory ({cap / MB:.1f} MB) once the weight blocks an op "
        "gathers where the weight is stored otherwise are counted (weights placed freely): "
        f"{need}; the least plan found: {best.describe()}",
        fix=f"give each device at least {best.bytes / MB:.1f} MB (that plan fits it); or use "
            "more devices, weights='sharded', or a smaller batch or sequence")
    out.min_capacity = float(best.bytes)
    out.lower_bound = bound
    return out


def _excess(err: InfeasibleError, cuts: Sequence[LinearConstraint], a: Mapping[str, int]
            ) -> float:
    """δ of plan a: how far it exceeds the rows (`err.extra`, the solver's) and the cuts."""
    over = [sum(x for k, c, x in cut.terms if a.get(k) == c) - cut.rhs for cut in cuts]
    rows = getattr(err, "extra", None)
    return max(over + ([rows] if rows is not None else []), default=0.0)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.perf_counter()


def _full(model: Model) -> Callable[[], Mapping[str, Footprint]]:
    """`all_footprints(model)`, computed on the first call and kept."""
    memo: list[Mapping[str, Footprint]] = []

    def full() -> Mapping[str, Footprint]:
        if not memo:
            memo.append(all_footprints(model))
        return memo[0]
    return full
