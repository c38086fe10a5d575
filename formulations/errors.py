"""Exceptions raised by the formulations package (einsummable wraps them in its own family)."""

from __future__ import annotations

from collections.abc import Mapping


class FormulationError(Exception):
    """Base class of every error raised by `formulations`."""


class InvalidProblem(FormulationError, ValueError):
    """The problem is malformed: shapes disagree, an option index is out of range, ..."""


class SolveFailed(FormulationError):
    """The solver stopped without any feasible assignment (e.g. a time limit hit before the
    first incumbent), or reported a status we cannot interpret."""


class Infeasible(FormulationError):
    """No assignment satisfies the constraints.

    When memory is the reason (the problem is feasible once memory is ignored), the attributes
    say how much memory would be needed:

    - ``extra``: the smallest number of bytes that, added to *every* capacity, makes the
      problem feasible (min over assignments of max_k (mem_k - cap_k)).
    - ``resource``: the resource k that binds at that optimum.
    - ``capacity``: its current capacity cap_k.
    - ``min_capacity``: cap_k + extra, the capacity resource k would need. For uniform
      capacities (identical devices) this is exactly the smallest capacity that fits.
    - ``assignment``: an assignment that needs least (node -> option), for the caller's
      account of what fills resource k.

    Otherwise (fixed options, ties or side constraints conflict) all four are None.
    """

    def __init__(
        self,
        message: str,
        *,
        min_capacity: float | None = None,
        resource: int | None = None,
        capacity: float | None = None,
        extra: float | None = None,
        assignment: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.min_capacity = min_capacity
        self.resource = resource
        self.capacity = capacity
        self.extra = extra
        self.assignment = dict(assignment) if assignment is not None else None
