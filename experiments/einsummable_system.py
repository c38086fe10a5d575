"""The `einsummable` rows: optimize a captured graph, then simulate or run its plan.

Placeholder until the optimizer and runtime land: every entry point raises Unavailable naming
what is missing, so a row reads "unavailable: <reason>" instead of a number.
"""
from __future__ import annotations

from .systems import Unavailable


def measured_step(payload, block, x, rank: int, world: int):
    raise Unavailable("einsummable runtime not available yet")
