"""The MIP's next-best plans that split the time-heavy ops otherwise: a pool for the simulator.

The objective T_obj is a model of the simulated time T_sim; the two agree within a few percent,
so plans a few percent apart on T_obj may come in either order on T_sim. The selection stage
(`selection.choose`) returns the least simulated plan of those it considers; this module
gives it more of the MIP's own plans to consider, each optimal on T_obj in what is left.

The cut. For a plan a (one option a_n per node n), let the heavy ops be

    H(a) = { n : compute_n(a_n) >= HEAVY_SHARE * max_m compute_m(a_m) }

and S_n(a) = { c : dec(c) = dec(a_n) } the options of n that split it as a does (any
placement). The constraint

    sum_{n in H(a)} sum_{c in S_n(a)} x[n, c]  <=  |H(a)| - 1

keeps exactly the plans in which at least one heavy op is split otherwise than in a. The
k-th plan of the pool is the MIP's optimum under the cuts of plans 1..k-1. Placement-only
twins (the same splits on other devices) are cut with their original: on the symmetric
fabrics they cost the same on both models, and a pool of them would tell the simulator
nothing new. Light ops are not in the cut: a plan that differs only in where an
elementwise op runs is the same plan to within its few microseconds.

Proofs: the k-th plan's objective is optimal among the plans its cuts leave; the pool's first
plan's bound holds for every plan, so the k-th plan's gap is stated against it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from formulations.problem import LinearConstraint

from .model import Model

# An op is heavy when its compute is at least this share of the plan's largest op's: in a
# LLaMA-7B block (a100x8, 4 x 2048) the seven projections and attention (the attention
# projections and attention itself at 0.38 of an FFN projection), not the SwiGLU product
# (0.16), norms, rotary or residuals (0.05-0.07), so a cut makes a projection or attention
# change its split. Where launches dominate (tiny blocks) every op is heavy.
HEAVY_SHARE = 0.25


def heavy_ops(model: Model, assignment: Mapping[str, int],
              share: float = HEAVY_SHARE) -> tuple[str, ...]:
    """H(a): the nodes whose chosen option's compute is at least `share` of the largest."""
    compute = {k: model.compute[k][c].total_s for k, c in assignment.items()}
    largest = max(compute.values(), default=0.0)
    return tuple(k for k, s in compute.items() if largest > 0 and s >= share * largest)


def differ_cut(model: Model, assignment: Mapping[str, int], name: str,
               share: float = HEAVY_SHARE) -> LinearConstraint | None:
    """The constraint that some heavy op of `assignment` is split otherwise (module
    docstring); None when no op is heavy (nothing to differ in)."""
    heavy = heavy_ops(model, assignment, share)
    if not heavy:
        return None
    terms = []
    for k in heavy:
        cands = model.nodes[k].cands
        dec = cands[assignment[k]].dec
        terms += [(k, c, 1.0) for c, cand in enumerate(cands) if cand.dec == dec]
    return LinearConstraint(tuple(terms), "<=", len(heavy) - 1, name)


def meets(cuts: Sequence[LinearConstraint], assignment: Mapping[str, int]) -> bool:
    """Whether `assignment` is a plan the cuts leave."""
    return all(sum(a for n, c, a in cut.terms if assignment.get(n) == c) <= cut.rhs
               for cut in cuts)
