"""How the search spends its time: the figures that steer `search.solve_lazily`.

None of them changes which plan is optimal; they decide how soon the search gets there (which
cells are priced when, when the LP relaxation goes first) and how it stops under a time limit.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchPolicy:
    # Solves on bounds before every cell that could still matter is priced.
    lazy_rounds: int = 3
    # Relative margin on the incumbent when deciding which cells or options could still be
    # in a plan as good (float rounding in the sums, not a tolerance on the answer).
    hopeful_margin: float = 1e-9
    # Under a time limit, another solve starts only with at least this share of the last
    # solve's wall time left (model building is outside the solver's own limit).
    min_solve_share: float = 0.5
    # The LP relaxation picks the cells to price (`lp_phase.lp_pricing`) only where pricing
    # every hopeful cell is predicted to take longer than this (measured before the LP's
    # column generation: its rounds, 25-93 re-solves of 0.1-1.6 s each, lost to pricing
    # everything below that; 0.02-0.5 s each since) ...
    lp_pricing_min_s: float = 20.0
    # ... and for at most this share of that prediction (a phase cut short still bounds cells).
    lp_pricing_share: float = 0.5
    # An LP phase that ends with its bound this far (relative) below its best plan leaves the
    # hopeful cells priced before the MIP: there the MIP rounds on bounds are long (h100x8x2
    # llama-65b, LP 8% below: three rounds of 18-54 s, then those cells priced all the same).
    lp_tight_gap: float = 0.01
    # The last solve under a time limit charges every unpriced cell this multiple of the best
    # exact plan's cost, so that it keeps to priced cells.
    priced_only_penalty: float = 1.01


DEFAULT_POLICY = SearchPolicy()
