"""Node-parallel plans (`planning/node_parallel.py`): each node runs its share of the batch,
the levels inside a node searched; the plan they give is a plan of the whole machine."""
from __future__ import annotations

import dataclasses

import pytest

from einsummable import choose_plan, optimize
from einsummable.backend.lowering import lower
from einsummable.backend.runtime.local import run_local
from einsummable.errors import PlanError
from einsummable.optimizer.api import plan_cost
from einsummable.planning.candidates import graph_candidates, roles
from einsummable.planning.node_parallel import grouped, node_parallel_candidates
from einsummable.planning.placement import INPUT_PREFIX
from einsummable.planning.plan import Options, Plan
from einsummable.topology import synthetic

from helpers import llama_tiny, rel_err


def _batch_modes(oc, r):
    modes = r.modes.get(oc.key) if not oc.key.startswith(INPUT_PREFIX) else None
    if modes is None:
        return set()
    return {m for m, role in modes.items() if role == "batch"}


def test_the_slowest_level_splits_the_batch_or_replicates():
    g, _, _ = llama_tiny(batch=4, seq=8)
    topo = synthetic(4, nodes=2)
    r = roles(g)
    nodes = node_parallel_candidates(g, topo, weights="sharded", r=r)
    full = graph_candidates(g, topo, weights="sharded", r=r)
    assert nodes.keys() == full.keys()
    for key, oc in nodes.items():
        assert oc.cands
        level0 = {lp[0] for lp in oc.level_parts}
        batch = _batch_modes(oc, r)
        info = g.tensor(key[len(INPUT_PREFIX):]) if key.startswith(INPUT_PREFIX) else None
        if batch:
            assert all(len(l0) == 1 and l0[0][0] in batch and l0[0][1] == 2 for l0 in level0)
        elif info is not None and info.kind == "weight":  # stored once: split over the nodes
            assert all(l0 != () for l0 in level0)
        elif info is None:
            assert level0 == {()}  # tables and weight-only ops: one copy per node
    # the search inside a node is what is left: far fewer candidates than every level's
    assert sum(len(oc.cands) for oc in nodes.values()) < sum(len(oc.cands) for oc in full.values())


def test_free_weights_are_replicated_over_the_nodes():
    g, _, _ = llama_tiny(batch=4, seq=8)
    nodes = node_parallel_candidates(g, synthetic(4, nodes=2), weights="free")
    for t in g.inputs:
        if t.kind == "weight":
            assert {lp[0] for lp in nodes[INPUT_PREFIX + t.name].level_parts} == {()}


def test_the_node_parallel_optimum_runs_and_matches_the_reference():
    g, inputs, want = llama_tiny(batch=4, seq=8)
    topo = synthetic(4, nodes=2)
    plan = optimize(g, topo, options=Options(nodes="parallel"), cache=False)
    assert plan.options.nodes == "parallel"
    # every batch-split op gives node k the batch blocks of its half
    r = roles(g)
    for key, cand in plan.choice:
        if key.startswith(INPUT_PREFIX):
            continue
        batch = [m for m, role in r.modes[key].items() if role == "batch"]
        if batch:
            parts = dict(cand.parts)
            assert any(parts.get(b, 1) % 2 == 0 for b in batch)
    # priced as the MIP scores it, and the programs compute the block
    assert plan_cost(g, topo, plan.chosen, options=plan.options) == pytest.approx(
        plan.objective_s, rel=1e-9)
    out = run_local(lower(g, plan.chosen, topo), inputs)[g.outputs[0]]
    assert rel_err(out, want) <= 1e-5
    # a plan's JSON keeps the option (and drops it when free, as plans before it had none)
    assert Plan.from_json(plan.to_json()).options.nodes == "parallel"
    assert "nodes" not in Options().to_dict()
    assert Options.from_dict(plan.options.to_dict()) == plan.options


def test_the_selection_judges_the_node_parallel_optimum_on_a_machine_of_nodes():
    g, _, _ = llama_tiny(batch=4, seq=8)
    plan = choose_plan(g, synthetic(4, nodes=2), cache=False, pool=1)
    labels = [c.label for c in plan.judged.considered]
    assert "optimized-nodes" in labels and "optimized" in labels
    # on one level there is nothing to fix: not considered
    plan = choose_plan(g, synthetic(2), cache=False, pool=1)
    assert "optimized-nodes" not in [c.label for c in plan.judged.considered]


def test_where_the_rule_cannot_hold_the_error_says_so():
    g, _, _ = llama_tiny(batch=3, seq=8)
    with pytest.raises(PlanError, match="multiple of 2"):
        node_parallel_candidates(g, synthetic(4, nodes=2))
    with pytest.raises(PlanError, match="one level"):
        node_parallel_candidates(g, synthetic(4))
    with pytest.raises(PlanError, match="unknown nodes option"):
        Options(nodes="pipeline")
    # the selection records why it left the node-parallel search out
    plan = choose_plan(g, synthetic(4, nodes=2), cache=False, pool=1)
    assert any(label == "optimized-nodes" and "multiple of 2" in why
               for label, why in plan.judged.left_out)


def test_a_batch_that_does_not_divide_over_the_nodes_groups_them():
    """Batch 2 on 4 nodes: the nodes pair up (2 groups of 2 nodes), each pair runs one
    sequence, and the search inside a pair may use both of its nodes. The plan computes the
    block, is priced as the MIP scored it, and its groups are the machine's nodes in order."""
    g, inputs, want = llama_tiny(batch=2, seq=8)
    topo = synthetic(8, nodes=4)
    assert grouped(g, topo).fanouts() == (2, 2, 2)
    assert grouped(g, topo).levels[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert grouped(g, synthetic(4, nodes=2)) == synthetic(4, nodes=2)  # 2 divides: as it is
    assert grouped(*llama_tiny(batch=3, seq=8)[:1], topo) == topo  # nothing divides: as it is
    plan = optimize(g, topo, options=Options(nodes="parallel"), cache=False)
    assert plan.topology.fanouts() == (2, 2, 2)
    assert plan.topology.devices == topo.devices and plan.topology.links == topo.links
    r = roles(g)
    for key, cand in plan.choice:  # every batch-split op: sequence k on pair k's devices
        batch = [m for m, role in r.modes.get(key, {}).items() if role == "batch"]
        if batch and dict(cand.parts).get(batch[0], 1) == 2:
            assert all(set(d) <= {0, 1, 2, 3} or set(d) <= {4, 5, 6, 7}
                       for d in cand.devices)
    assert plan_cost(g, plan.topology, plan.chosen, options=plan.options) == pytest.approx(
        plan.objective_s, rel=1e-9)
    out = run_local(lower(g, plan.chosen, plan.topology), inputs)[g.outputs[0]]
    assert rel_err(out, want) <= 1e-5
    assert Plan.from_json(plan.to_json()).topology.fanouts() == (2, 2, 2)


def test_options_keep_every_other_field():
    o = dataclasses.replace(Options(weights="free", steady_state=True), nodes="parallel")
    assert Options.from_dict(o.to_dict()) == o
