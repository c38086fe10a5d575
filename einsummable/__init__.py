"""Einsummable: every kernel is a join. Write single-device PyTorch; get a multi-device plan.

    g = es.trace(module, args)                  # torch.export capture -> es.Graph
    topo = es.load_topology("a100x8")
    plan = es.optimize(g, topo)                 # one MIP over every op's decompositions
    outs = es.run(plan, es.bind(g, module, args), backend="gloo")
"""
from .errors import (DTypeError, EinsumParseError, EinsummableError, InfeasibleError, PlanError,
                     RuntimeFault, ShapeError, SolverError, TopologyError, UnknownFunctionError,
                     UnsupportedOpError)
from .frontend.ir import Constant, Graph, Op, TensorInfo, make_op
from .frontend.einsum import parse_einsum
from .frontend.builder import Builder, TensorHandle
from .frontend.reference import evaluate, evaluate_op
from .planning.spec import Decomposition, decompositions, tuples
from .planning.placement import Candidate
from .topology import Topology, load_topology
from .frontend.capture import bind, trace
from .planning.plan import Plan
from .optimizer.api import candidates, named_plan, optimize, plan_cost
from .optimizer.report import explain
from .backend.lowering import lower
from .backend.runtime import Lowered, run, simulate
from .compiler import compile
from . import models

__all__ = [
    "Builder", "Candidate", "Constant", "Decomposition", "DTypeError", "EinsumParseError",
    "EinsummableError", "Graph", "InfeasibleError", "Lowered", "Op", "Plan", "PlanError",
    "RuntimeFault", "ShapeError", "SolverError", "TensorHandle", "TensorInfo", "Topology", "TopologyError",
    "UnknownFunctionError", "UnsupportedOpError", "bind", "candidates", "compile", "explain",
    "decompositions", "evaluate", "evaluate_op", "load_topology", "lower", "make_op", "models",
    "named_plan", "optimize", "parse_einsum", "plan_cost", "run", "simulate", "trace", "tuples",
]
