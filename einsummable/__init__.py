"""Einsummable: every kernel is a join. Write single-device PyTorch; get a multi-device plan.

    g = es.trace(module, args)                  # torch.export capture -> es.Graph
    topo = es.load_topology("a100x8")
    plan = es.optimize(g, topo)                 # one MIP over every op's decompositions
    plan = es.choose_plan(g, topo)              # ... or the least simulated of it and the experts
    print(es.explain(plan))
    outs = es.run(plan, es.bind(g, module, args), backend="gloo")

The names below follow the pipeline: the front end (graphs in), the machine, planning, the
optimizer, the back end (plans out), the choice by simulated time, and `compile`, which
strings them together.
"""
from . import models
from .backend.lowering import Lowered, lower
from .backend.runtime import run, simulate
from .compiler import compile
from .training import TrainStep, compile_train
from .errors import (
                     DTypeError,
                     EinsummableError,
                     EinsumParseError,
                     InfeasibleError,
                     PlanError,
                     RuntimeFault,
                     ShapeError,
                     SolverError,
                     TopologyError,
                     UnknownFunctionError,
                     UnsupportedOpError,
)
from .frontend.builder import Builder, TensorHandle
from .frontend.capture import StepGraph, bind, bind_step, trace, trace_step
from .frontend.einsum import parse_einsum
from .frontend.ir import Constant, Graph, Op, TensorInfo, make_op
from .frontend.reference import evaluate, evaluate_op
from .optimizer.api import candidates, named_plan, optimize, plan_cost
from .optimizer.report import explain
from .planning.placement import Candidate
from .planning.plan import Options, Plan
from .planning.spec import Decomposition, decompositions, tuples
from .selection.choose import choose_plan
from .topology import Topology, load_topology

__all__ = [
    # errors
    "DTypeError", "EinsumParseError", "EinsummableError", "InfeasibleError", "PlanError",
    "RuntimeFault", "ShapeError", "SolverError", "TopologyError", "UnknownFunctionError",
    "UnsupportedOpError",
    # front end
    "Builder", "Constant", "Graph", "Op", "StepGraph", "TensorHandle", "TensorInfo", "bind",
    "bind_step", "evaluate", "evaluate_op", "make_op", "models", "parse_einsum", "trace",
    "trace_step",
    # the machine
    "Topology", "load_topology",
    # planning and the optimizer
    "Candidate", "Decomposition", "Options", "Plan", "candidates", "choose_plan",
    "decompositions", "explain",
    "named_plan", "optimize", "plan_cost", "tuples",
    # back end and the whole path
    "Lowered", "TrainStep", "compile", "compile_train", "lower", "run", "simulate",
]
