"""One exception family. Every message names the op (or field), the source line when known,
and what to do about it."""
from __future__ import annotations


class EinsummableError(Exception):
    """Base of every error the library raises on purpose."""

    def __init__(self, message: str, *, op: str | None = None, source: str | None = None,
                 fix: str | None = None) -> None:
        parts = []
        if op:
            parts.append(f"op '{op}'")
        if source:
            parts.append(f"at {source}")
        head = (" ".join(parts) + ": ") if parts else ""
        text = head + message
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
        self.op = op
        self.source = source
        self.fix = fix


class EinsumParseError(EinsummableError):
    """A malformed einsum or mode string."""


class ShapeError(EinsummableError):
    """Mode sizes that disagree, wrong ranks, impossible reshapes."""


class DTypeError(EinsummableError):
    """Unknown or mismatched dtypes."""


class UnknownFunctionError(EinsummableError):
    """A join function, aggregation or fused kernel that does not exist."""


class UnsupportedOpError(EinsummableError):
    """Capture met an operator it cannot map to join-agg."""


class TopologyError(EinsummableError):
    """A broken topology description."""


class InfeasibleError(EinsummableError):
    """No plan satisfies the constraints (memory, world size)."""


class SolverError(EinsummableError):
    """The MIP solver failed or hit its limit without an incumbent."""


class PlanError(EinsummableError):
    """A plan that does not fit its graph or topology."""


class RuntimeFault(EinsummableError):
    """A rank died, timed out or disagreed with the plan."""
