"""Einsummable: every kernel is a join. Write single-device PyTorch; get a multi-device plan.

    g = es.trace(module, args)                  # torch.export capture -> es.Graph
    topo = es.load_topology("a100x8")
    plan = es.optimize(g, topo)                 # one MIP over every op's decompositions
    outs = es.run(plan, es.bind(g, module, args), backend="gloo")
"""
from .errors import (DTypeError, EinsumParseError, EinsummableError, InfeasibleError, PlanError,
                     RuntimeFault, ShapeError, SolverError, TopologyError, UnknownFunctionError,
                     UnsupportedOpError)
from .ir import Constant, Graph, Op, TensorInfo, make_op, parse_einsum
from .builder import Builder, T
from .reference import evaluate, evaluate_op
from .spec import Decomposition, decompositions, tuples
from .placement import Candidate
from .topology import Topology, load_topology
from .capture import bind, trace
from .plan import Plan
from .optimize import candidates, named_plan, optimize, plan_cost
from .lower import lower
from .runtime import Lowered, run, simulate
from .compile import compile
from . import models

__all__ = [
    "Builder", "Candidate", "Constant", "Decomposition", "DTypeError", "EinsumParseError",
    "EinsummableError", "Graph", "InfeasibleError", "Lowered", "Op", "Plan", "PlanError",
    "RuntimeFault", "ShapeError", "SolverError", "T", "TensorInfo", "Topology", "TopologyError",
    "UnknownFunctionError", "UnsupportedOpError", "bind", "candidates", "compile",
    "decompositions", "evaluate", "evaluate_op", "load_topology", "lower", "make_op", "models",
    "named_plan", "optimize", "parse_einsum", "plan_cost", "run", "simulate", "trace", "tuples",
]
