r"""Weight transfers hidden under compute: the objective, and how the MIP minimises it.

Weights do not depend on the activations, so lowering sends them ahead of the ops that read
them (numbered prefetch queues on a low-priority stream) while the devices compute. A plan's
time is modelled as

    T(x) = A(x) + max(C(x), W(x))

    A   activation exchanges: every edge whose source is not a weight, the steady-state edge
        and the fold of unfed graph outputs; they sit on the critical path
    C   compute: the candidates' kernel seconds
    W   weight exchanges: the edges out of "input:<weight>" nodes, which stream behind the
        compute (they cannot finish before their bytes have crossed); the copies that
        stitch a gathered weight together are device work and count in C in full
        (`EdgeCost.copy_s`: overlapping the wire does not take them off the device's
        stream, where the compute runs) or, where the devices copy on a copy stream
        beside their kernels, the share μ the memory-bound kernels lose to them
        (`Model.copy_charge`), and so does the
        compute the stream takes while it runs: κ W (`planning/kernel_time.py`,
        contention_share; per kernel, the simulator's rule gives this where W <= C).
        Where the transport charges per message, lowering sends every weight in one batch,
        whose route latencies and message costs are paid once, not once per weight: there
        each weight edge counts its batched seconds (`EdgeCost.batched_s`)

A training step's gradients stream too (`handoff.streamed_gradients`, edges of kind "gradient"):
nothing in the step waits for an optimizer update, so lowering sends a gradient as soon as
the backward has computed it. Its seconds, less the stitching at the reader (`local_s`),
join W, and the compute its transfers take while they run, κ times them, joins C, as a
weight's do: W is every byte that streams behind the compute. (In a stack of layers FSDP
hides its reduce-scatter behind the backward the same way.) The folds, and the stitches of
the folded blocks into the update's blocks, run on the side stream as they land
(`backend/early.py`), so the stitching is charged as a weight's is, μ of its copies on C.
The gradients stream only where every device has a side stream; where one does not (the cpu
topologies) the folds would wait for the update on the compute stream, and an exchange's
price does not tell its folds from its transfers, so there the gradients' edges stay on the
path (`model.build_model`; on cpu2 the llama-tiny step at 2048 tokens: objective 21.37 ms
streamed, 23.74 on the path, simulated 24.29).

On a machine of several levels (nodes joined by NICs) a weight stream that crosses nodes
runs beside the activation exchanges inside them: they load different links. Let o_L(e) be
the seconds exchange e keeps level L's links busy (its busiest level-L resource,
`timing.level_busy`), s_L(e) = o_L(e) / max_L' o_L'(e) its share there, x_e its seconds
(a weight's wire seconds) and F the folds of unfed outputs. Then

    A'_L = sum_act x_e s_L(e),   W_L = sum_weights x_e s_L(e)
    T(x) = F + max(A' + C, max_L (A'_L + W_L))           (A = F + A')

On one level every share is 1 and T is A + max(C, W) again; the objective keeps that form.
(Summing the weights' busy seconds o_L instead, as if the stream pipelined fully, put the
h100x8x2 FSDP block at 0.77 of its simulated time; the whole seconds put it at 1.20: the
simulator's stream overlaps a weight's last hops with the next one's first, not more.)
A stream's contention on C is κ at the rate of the level whose links it keeps busiest
(`Model.level_contention`): a weight gathered across nodes passes through a device at its
NICs' rate, and κ at its NVLink ports' rate charged the h100x8x2 Megatron block 0.09 ms of
compute the simulator's loaded kernels do not lose (objective 1.149 ms, simulated 1.013;
with κ by level 1.059).

T is not a sum of pairwise terms, but it is one MIP away: formulations.Problem takes
"overlapping parts", an objective plain + max(part 0, part 1), and models the max as an
epigraph variable z ≥ part 0, z ≥ part 1. A is the plain cost, C part 0, W part 1 (on
several levels: F plain, A' + C part 0, A'_L + W_L part 1 + L); the MIP
then minimises T itself, exactly, in one solve (an earlier Lagrangian search over
A + (1 - β) C + β W needed several solves and could leave a duality gap). Extra incumbents (the
named strategies) are scored with T too, so the result is never worse than any of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import formulations as fm

from ..planning.cost import EdgeCost
from .model import EdgeTerm, Model, price_all
from .pricing import EdgeMatrix


@dataclass(frozen=True)
class Split:
    """T's parts for one choice, in seconds: A (folds of unfed outputs included), C, W, and on
    a machine of several levels F and per level (A'_L, W_L) (module docstring)."""
    activations_s: float
    compute_s: float
    weights_s: float
    levels: tuple[tuple[float, float], ...] = ()
    finish_s: float = 0.0

    @property
    def total_s(self) -> float:
        if not self.levels:
            return self.activations_s + max(self.compute_s, self.weights_s)
        return max(self.activations_s + self.compute_s,
                   max(self.finish_s + a + w for a, w in self.levels))


def n_levels(model: Model) -> int:
    """Levels the objective keeps apart: the topology's, or 1 (module docstring)."""
    return len(model.topology.levels) if model.options.overlap else 1


def level_terms(model: Model, e: EdgeTerm, x: EdgeCost) -> tuple[float, ...]:
    """The seconds cell x adds to each level's part (module docstring): its seconds (a
    weight's wire seconds) times its share there. Where it is not priced yet, 0 (a lower
    bound, as unpriced cells' estimates are)."""
    n = n_levels(model)
    top = max(x.levels, default=0.0)
    if len(x.levels) != n or top <= 0:
        return (0.0,) * n
    seconds = stream_s(e, x) if is_streamed(e) else x.seconds
    return tuple(seconds * o / top for o in x.levels)


def is_weight_edge(e: EdgeTerm) -> bool:
    return e.kind == "weight"


def is_streamed(e: EdgeTerm) -> bool:
    """Whether edge e streams behind compute (W) rather than waits on the path (A)."""
    return e.kind in ("weight", "gradient")


def stream_s(e: EdgeTerm, x: EdgeCost) -> float:
    """The seconds a streamed edge's cell x adds to W: a weight's wire seconds (batched), a
    gradient's seconds less its reader's stitching (module docstring)."""
    if is_weight_edge(e):
        return x.in_batch_s - x.local_s
    return x.seconds - x.local_s


def stream_contention(model: Model, x: EdgeCost) -> float:
    """κ for a streamed cell x: on several levels that of the level whose links it keeps
    busiest (a weight gathered across nodes passes through a device at the NICs' rate, far
    below its NVLink ports'), else the device's at its ports' rate."""
    if model.level_contention and x.levels and max(x.levels) > 0:
        return model.level_contention[max(range(len(x.levels)), key=x.levels.__getitem__)]
    return model.contention


def split(model: Model, choice: Mapping[str, int]) -> Split:
    """A, C and W of a choice (node -> candidate index), summed in a fixed order, and on
    several levels F and the per-level (A'_L, W_L)."""
    a = c = w = f_s = 0.0
    n = n_levels(model)
    lv_a, lv_w = [0.0] * n, [0.0] * n
    for k in model.nodes:
        c += model.compute[k][choice[k]].total_s
        f = model.finish.get(k)
        if f:
            f_s += f[choice[k]].seconds
    a = f_s
    for e in model.edges:
        x = e.cost(choice[e.src], choice[e.dst])
        streamed = is_streamed(e)
        if streamed:
            wire = stream_s(e, x)
            w += wire
            c += stream_contention(model, x) * wire + model.copy_charge * x.copy_s
        else:
            a += x.seconds
        if n > 1:
            for i, t in enumerate(level_terms(model, e, x)):
                (lv_w if streamed else lv_a)[i] += t
    if n == 1:
        return Split(a, c, w)
    return Split(a, c, w, tuple(zip(lv_a, lv_w)), f_s)


def objective_s(model: Model, choice: Mapping[str, int]) -> float:
    """A plan's objective: with overlap, A + max(C, W) (`split`); else the plain sum, in the
    same order as formulations.objective on `to_problem(model)`."""
    if model.options.overlap:
        return split(model, choice).total_s
    total = 0.0
    for k in model.nodes:
        total += model.unary(k, choice[k])
    for e in model.edges:
        total += e.cost(choice[e.src], choice[e.dst]).seconds
    return total


def _overlap_cell_terms(model: Model, e: EdgeTerm, x: EdgeCost) -> tuple[float, tuple | None]:
    """A cell's plain cost and parts in `overlap_problem`, for edge cost x: a weight edge
    streams its wire seconds behind compute (W), stitches on the device and takes its share
    of the compute while it runs (C); a gradient streams likewise (its folds and stitches on
    the side stream); an activation edge is plain (A). On several levels
    (module docstring) every edge has parts (A' + C, then A'_L + W_L per level)."""
    n = n_levels(model)
    if is_streamed(e):
        wire = stream_s(e, x)
        on_compute = stream_contention(model, x) * wire + model.copy_charge * x.copy_s
        if n == 1:
            return 0.0, (on_compute, wire)
        return 0.0, (on_compute,) + level_terms(model, e, x)
    if n == 1:
        return x.seconds, None
    return 0.0, (x.seconds,) + level_terms(model, e, x)


def overlap_problem(model: Model, warm_start: Mapping[str, int] | None,
                    unpriced_penalty: float = 0.0):
    """The pairwise problem of T: A as plain costs, C and W as the two overlapping parts
    (formulations.Problem: objective = plain + max(part 0, part 1)). Unpriced edge cells carry
    their estimates, which are at most the exact seconds and local seconds, so every part,
    and T (non-decreasing in each), is at most its exact value; `unpriced_penalty` seconds
    join their plain cost (`search.solve_lazily`'s last solve under a time limit)."""
    nodes = []
    n_parts = 1 + n_levels(model)
    for k, oc in model.nodes.items():
        mem = model.memory[k] if model.memory is not None else None
        f = model.finish.get(k)
        n = len(oc.cands)
        nodes.append(fm.Node(k, tuple(f[c].seconds if f else 0.0 for c in range(n)), mem,
                             (tuple(model.compute[k][c].total_s for c in range(n)),)
                             + ((0.0,) * n,) * (n_parts - 1)))
    edges = []
    for e in model.edges:
        terms = [[_overlap_cell_terms(model, e, x) for x in row] for row in e.matrix.estimates()]
        pen = unpriced_penalties(e.matrix, unpriced_penalty)
        plain = tuple(tuple(t[0] + p for t, p in zip(row, prow))
                      for row, prow in zip(terms, pen))
        if is_streamed(e) or n_parts > 2:  # cells with parts (`_overlap_cell_terms`)
            parts = tuple(tuple(tuple(t[1][k] for t in row) for row in terms)
                          for k in range(n_parts))
            edges.append(fm.Edge(e.src, e.dst, plain, e.rows, e.cols, parts))
        else:
            edges.append(fm.Edge(e.src, e.dst, plain, e.rows, e.cols))
    return fm.Problem(tuple(nodes), tuple(edges), model.capacities, tie=model.ties,
                      warm_start=dict(warm_start) if warm_start else None)


def to_problem(model: Model, warm_start: Mapping[str, int] | None = None, *,
               exact: bool = True, unpriced_penalty: float = 0.0):
    """The generic pairwise-choice problem of `formulations` (module docstring). `exact`
    prices every edge cell first; else unpriced cells carry their lower bound (the form
    `search.solve_lazily` solves) plus `unpriced_penalty` seconds (its last solve under
    a time limit, which keeps to priced cells)."""
    if exact:
        price_all(model)
    nodes = []
    for k, oc in model.nodes.items():
        mem = model.memory[k] if model.memory is not None else None
        nodes.append(fm.Node(k, tuple(model.unary(k, c) for c in range(len(oc.cands))), mem))
    edges = []
    for e in model.edges:
        pen = unpriced_penalties(e.matrix, unpriced_penalty)
        edges.append(fm.Edge(e.src, e.dst, tuple(
            tuple(x.seconds + p for x, p in zip(row, prow))
            for row, prow in zip(e.matrix.estimates(), pen)), e.rows, e.cols))
    return fm.Problem(tuple(nodes), tuple(edges), model.capacities, tie=model.ties,
                      warm_start=dict(warm_start) if warm_start else None)


def unpriced_penalties(matrix: EdgeMatrix, penalty: float) -> tuple[tuple[float, ...], ...]:
    """Per cell: `penalty` where the cell is not priced yet, else 0."""
    R, S = matrix.shape
    if not penalty:
        return ((0.0,) * S,) * R
    return tuple(tuple(0.0 if matrix.priced(r, s) else penalty for s in range(S))
                 for r in range(R))


def cell_terms(model: Model, e: EdgeTerm, x: EdgeCost) -> tuple[float, tuple | None]:
    """A cell's coefficients in the problem `solve_model` solves, for edge cost x: its plain
    seconds, and with overlap its (compute, weights) parts (`_overlap_cell_terms`)."""
    if model.options.overlap:
        return _overlap_cell_terms(model, e, x)
    return x.seconds, None

