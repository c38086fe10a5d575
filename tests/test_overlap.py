"""The overlap objective A + max(C, W): its exact MIP (epigraph of the max) against brute force, its split,
and what it changes in the plans."""
from __future__ import annotations

import itertools
import random
import sys

import pytest

import formulations as fm
from einsummable.frontend.builder import Builder
from einsummable.planning.candidates import graph_candidates
from einsummable.optimizer.search import solve_overlap
from einsummable.optimizer.objective import split
from einsummable.topology import load_topology, synthetic

from test_optimize import EXHAUSTIVE_LIMIT, TOPOLOGIES, _random_graph, _truncate

from einsummable.optimizer.objective import objective_s
from einsummable.optimizer.api import named_plan, optimize, plan_cost
from einsummable.optimizer.model import fixed_nodes
from einsummable.optimizer.report import explain
from einsummable.optimizer.model import build_model
from einsummable.optimizer.objective import to_problem
from einsummable.optimizer.search import solve_model
from einsummable.planning.plan import Options


def _brute_force(model) -> float:
    """Least A + max(C, W) over every assignment that meets ties and memory."""
    problem = to_problem(model)
    keys = list(model.nodes)
    best = float("inf")
    for combo in itertools.product(*(range(len(model.nodes[k].cands)) for k in keys)):
        a = dict(zip(keys, combo))
        if fm.violations(problem, a):
            continue
        best = min(best, objective_s(model, a))
    return best


def test_overlap_mip_matches_brute_force_on_random_graphs():
    rng = random.Random(1)
    topos = [(n, f()) for n, f in TOPOLOGIES]
    closed = 0
    for trial in range(60):
        name, topo = topos[trial % len(topos)]
        g = _random_graph(rng)
        opts = Options(weights="sharded", steady_state=False, overlap=True)
        nodes = _truncate(graph_candidates(g, topo, weights=opts.weights), rng, EXHAUSTIVE_LIMIT)
        model = build_model(g, topo, opts, nodes)
        res = solve_model(model)
        best = _brute_force(model)
        # The bound is a true lower bound, the incumbent a true plan of that objective.
        assert res.bound <= best * (1 + 1e-9) + 1e-15, (trial, name)
        assert objective_s(model, res.assignment) == pytest.approx(res.objective, rel=1e-12)
        assert res.objective >= best * (1 - 1e-9) - 1e-15
        if res.gap <= 1e-6:  # HiGHS' feasibility tolerance on the scaled max rows
            closed += 1
            assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-15), (trial, name)
    assert closed == 60  # one exact MIP: no duality gap left open


def _mlp(tokens: int, d: int = 4096, f: int = 16384):
    b = Builder("float16")
    x = b.input("x", (tokens, d))
    h = b.einsum("td,df->tf", x, b.weight("w1", (d, f)), name="up").relu()
    return b.build([b.einsum("tf,fd->td", h, b.weight("w2", (f, d)), name="down")])


def test_weights_hidden_under_compute_cost_nothing_extra(tmp_path):
    # Many tokens: the gathered weights stream while the devices compute, so the objective is
    # the activation exchanges plus compute, and it is below the plain sum of the same plan.
    g = _mlp(65536)
    plan = optimize(g, "a100x8", steady_state=True, cache=tmp_path)
    model = build_model(g, plan.topology, Options("sharded", True),
                          fixed_nodes(g, plan.topology, Options("sharded", True), plan.chosen))
    parts = split(model, {k: 0 for k in model.nodes})
    assert parts.weights_s > 0 and parts.weights_s <= parts.compute_s
    assert plan.objective_s == pytest.approx(parts.activations_s + parts.compute_s, rel=1e-9)
    plain = plan_cost(g, "a100x8", plan.chosen, steady_state=True, overlap=False)
    assert plain == pytest.approx(parts.activations_s + parts.compute_s + parts.weights_s,
                                  rel=1e-9)
    assert plan.gap == pytest.approx(0.0, abs=1e-9)


def test_overlap_plan_is_never_worse_than_a_named_strategy(tmp_path):
    g = _mlp(2048, d=1024, f=4096)
    topo = synthetic(4)
    plan = optimize(g, topo, steady_state=True, cache=tmp_path)
    for name in ("fsdp", "megatron-tp", "megatron-tp-sp"):
        named = named_plan(g, topo, name, steady_state=True)
        assert plan.objective_s <= named.objective_s * (1 + 1e-9), name
