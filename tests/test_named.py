"""Named strategies: plans in the same IR, never better than the optimizer."""
from __future__ import annotations


import pytest

from einsummable.errors import PlanError
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.optimizer.named import STRATEGIES, STRATEGY_WEIGHTS
from einsummable.topology import load_topology
from einsummable.optimizer.api import named_plan, plan_cost
from einsummable.optimizer.model import build_model
from einsummable.optimizer.search import solve_model
from einsummable.planning.plan import Options

from helpers import split_modes



# pcie4-numa solves both optima in seconds; a100x8's eight devices take half a minute (slow)
@pytest.fixture(scope="module", params=["pcie4-numa", pytest.param("a100x8", marks=pytest.mark.slow)])
def block(request):
    g = llama_block_graph(preset_config("llama-7b", width=0.25), 2, 256, "float16")
    topo = load_topology(request.param)
    return g, topo, build_model(g, topo, Options("sharded", True))


def test_every_strategy_is_an_exact_plan_and_not_better_than_the_optimum(block):
    g, topo, model = block
    free_model = build_model(g, topo, Options("free", True))
    best = solve_model(model)
    free = solve_model(free_model)
    for name in STRATEGIES:
        m = free_model if STRATEGY_WEIGHTS.get(name) == "free" else model
        w = m.options.weights
        plan = named_plan(g, topo, name, weights=w, steady_state=True, model=m)
        assert plan.origin.strategy == name
        assert plan.origin.inexact_ops == (), name
        ref = free if STRATEGY_WEIGHTS.get(name) == "free" else best
        assert ref.objective <= plan.objective_s * (1 + 1e-6), name
        assert plan_cost(g, topo, plan.chosen, weights=w, steady_state=True) == plan.objective_s


def test_megatron_is_column_then_row_and_sp_splits_the_sequence(block):
    g, topo, model = block
    tp = named_plan(g, topo, "megatron-tp", steady_state=True, model=model)
    sp = named_plan(g, topo, "megatron-tp-sp", steady_state=True, model=model)
    mm = [op for op in g.ops if op.agg == "sum" and any(g.tensor(i).kind == "weight" for i in op.inputs)]
    wq, wo, w1, w2 = mm[0], mm[3], mm[4], mm[6]
    assert split_modes(tp, wq.name) == {"h"}          # heads: column parallel
    assert split_modes(tp, wo.name) == {"h"}          # contraction over heads: row parallel
    assert split_modes(tp, w1.name) == {"f"} and split_modes(tp, w2.name) == {"f"}
    norm = g.ops[0]
    assert split_modes(tp, norm.name) == set()        # replicated
    roles = model.roles.modes[norm.name]
    assert {roles[m] for m in split_modes(sp, norm.name)} == {"seq"}


def test_data_parallel_and_ulysses(block):
    g, topo, model = block
    dp = named_plan(g, topo, "fsdp", steady_state=True, model=model)
    for op in g.ops:
        roles = model.roles.modes[op.name]
        assert {roles[m] for m in split_modes(dp, op.name)} <= {"batch", "seq"}, op.name
    ul = named_plan(g, topo, "ulysses", steady_state=True, model=model)
    scores = next(op for op in g.ops if sum(model.roles.modes[op.name].get(m) == "seq"
                                            for m in op.modes if op.size[m] > 1) >= 2)
    assert {model.roles.modes[scores.name][m] for m in split_modes(ul, scores.name)} == {"feature"}


def test_unknown_strategy():
    g = llama_block_graph(preset_config("llama-tiny"), 1, 16, "float32")
    with pytest.raises(PlanError):
        named_plan(g, "cpu4", "pipeline")
