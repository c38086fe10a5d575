"""Einsummable: every kernel is a join. Write single-device PyTorch; get a multi-device plan."""
from .errors import (DTypeError, EinsumParseError, EinsummableError, InfeasibleError, PlanError,
                     RuntimeFault, ShapeError, SolverError, TopologyError, UnknownFunctionError,
                     UnsupportedOpError)
from .ir import Constant, Graph, Op, TensorInfo, make_op, parse_einsum
from .builder import Builder, T
from .reference import evaluate, evaluate_op
from .spec import Decomposition, decompositions, tuples

__all__ = [
    "Builder", "Constant", "Decomposition", "DTypeError", "EinsumParseError", "EinsummableError",
    "Graph", "InfeasibleError", "Op", "PlanError", "RuntimeFault", "ShapeError", "SolverError",
    "T", "TensorInfo", "TopologyError", "UnknownFunctionError", "UnsupportedOpError",
    "decompositions", "evaluate", "evaluate_op", "make_op", "parse_einsum", "tuples",
]
