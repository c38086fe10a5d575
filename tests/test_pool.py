"""The MIP's pool: after the optimum, the best plans that split some time-heavy op otherwise
(`optimizer/pool.py`), checked against brute force, and judged by the selection stage."""
from __future__ import annotations

import random

import pytest

from einsummable.errors import InfeasibleError, PlanError
from einsummable.optimizer.api import optimize_pool
from einsummable.optimizer.model import build_model
from einsummable.optimizer.pool import differ_cut, heavy_ops, meets
from einsummable.optimizer.search import solve_model
from einsummable.planning.candidates import graph_candidates
from einsummable.planning.plan import Options, Plan, Solved
from einsummable.selection.choose import choose_plan, pool_label
from einsummable.topology.uniform import synthetic

from helpers import (EXHAUSTIVE_LIMIT, SOLVER_REL, TOPOLOGIES, exhaustive_best, llama_tiny,
                     small_random_graph, truncate_candidates)


def _heavy_splits(model, assignment) -> dict:
    return {k: model.nodes[k].cands[assignment[k]].dec for k in heavy_ops(model, assignment)}


def test_each_plan_of_the_pool_is_the_best_its_cuts_leave():
    # On random small graphs (overlap on every other one): the k-th solve under the cuts of
    # the plans before it equals brute force over the plans the cuts leave, and each plan
    # splits some heavy op of every earlier plan otherwise.
    rng = random.Random(3)
    topos = [(n, f()) for n, f in TOPOLOGIES]
    checked = 0
    for trial in range(40):
        name, topo = topos[trial % len(topos)]
        g = small_random_graph(rng)
        opts = Options(weights="sharded", steady_state=False, overlap=trial % 2 == 0)
        nodes = truncate_candidates(graph_candidates(g, topo, weights=opts.weights), rng,
                                    EXHAUSTIVE_LIMIT)
        model = build_model(g, topo, opts, nodes)
        plans = [solve_model(model).assignment]
        for _ in range(2):
            cuts = [differ_cut(model, a, f"pool {i}") for i, a in enumerate(plans, 1)]
            if any(c is None for c in cuts):
                break
            best = exhaustive_best(model, keep=lambda choice: meets(cuts, choice))
            try:
                sol = solve_model(model, side=cuts)
            except InfeasibleError:
                assert best == float("inf"), (trial, name)
                break
            assert sol.objective == pytest.approx(best, rel=SOLVER_REL, abs=1e-15), (trial, name)
            assert meets(cuts, sol.assignment)
            for before in plans:
                assert any(model.nodes[k].cands[sol.assignment[k]].dec != dec
                           for k, dec in _heavy_splits(model, before).items()), (trial, name)
            plans.append(sol.assignment)
            checked += 1
    assert checked >= 30


@pytest.fixture(scope="module")
def tiny():
    g, _, _ = llama_tiny(2, 8)
    return g


def test_the_pool_comes_in_order_with_proofs_against_the_optimum(tiny, tmp_path):
    plans = optimize_pool(tiny, "cpu4", 3, options=Options("sharded", True), cache=tmp_path)
    assert len(plans) == 3
    first = plans[0]
    objs = [p.objective_s for p in plans]
    assert objs == sorted(objs)
    for rank, p in enumerate(plans, 1):
        assert isinstance(p.origin, Solved) and p.origin.pool_rank == rank
        # every plan's bound is the optimum's, a proof over all plans
        assert p.bound_s == pytest.approx(first.bound_s)
        assert p.gap == pytest.approx((p.objective_s - first.bound_s) / p.objective_s, abs=1e-9)
        again = Plan.from_json(p.to_json())
        assert again.origin == p.origin
    # each later plan splits some op the optimum's heaviest ops use otherwise
    heavy = {k for k, c in first.choice if c.dec != plans[1].chosen[k].dec}
    assert heavy
    # cached: the same plans come back, served from the files
    assert [p.to_json() for p in optimize_pool(tiny, "cpu4", 3, options=Options("sharded", True),
                                               cache=tmp_path)] == [p.to_json() for p in plans]
    assert len(list(tmp_path.glob("*-pool*.json"))) == 2


def test_the_pool_ends_where_no_plan_splits_otherwise(tiny):
    # one device: every op has one split, so no plan differs from the optimum
    plans = optimize_pool(tiny, synthetic(1), 3, cache=False)
    assert len(plans) == 1 and plans[0].origin.pool_rank == 1


def test_the_pool_size_is_checked(tiny):
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(PlanError, match="pool size"):
            optimize_pool(tiny, "cpu4", bad, cache=False)


def test_choose_plan_judges_the_pool(tiny):
    plan = choose_plan(tiny, "cpu4", options=Options("sharded", True), cache=False, pool=3)
    labels = [c.label for c in plan.judged.considered]
    assert {pool_label(1), pool_label(2), pool_label(3)} <= set(labels)
    assert pool_label(1) == "optimized" and pool_label(2) == "optimized-2"
    alone = choose_plan(tiny, "cpu4", options=Options("sharded", True), cache=False, pool=1)
    assert "optimized-2" not in [c.label for c in alone.judged.considered]
    # more plans considered never simulate slower
    assert plan.judged.simulated_s <= alone.judged.simulated_s


def test_a_later_plan_of_the_pool_says_what_it_is(tiny):
    from einsummable.optimizer.report import explain
    second = optimize_pool(tiny, "cpu4", 2, options=Options("sharded", True), cache=False)[1]
    text = explain(second, strategies=False)
    assert "the MIP's plan 2: optimal among the plans that split some time-heavy op " \
           "otherwise than the 1 before it" in text
