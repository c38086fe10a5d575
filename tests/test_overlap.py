"""The overlap objective A + max(C, W): its exact MIP (epigraph of the max) against brute force,
which of compute and weight gathers it hides in each regime, and what it changes in the plans."""
from __future__ import annotations

import random

import pytest

from einsummable.planning.candidates import graph_candidates
from einsummable.topology import synthetic

from einsummable.optimizer.objective import objective_s
from einsummable.optimizer.api import named_plan, optimize, plan_cost
from einsummable.optimizer.model import build_model, fixed_nodes
from einsummable.optimizer.search import solve_model
from einsummable.planning.cost import memory_bound_share
from einsummable.planning.kernel_time import contention_share, copy_charge
from einsummable.planning.plan import Options

from helpers import (EXHAUSTIVE_LIMIT, SOLVER_REL, TOPOLOGIES, exhaustive_best, mlp,
                     small_random_graph, truncate_candidates)


@pytest.mark.parametrize("count", [30, pytest.param(60, marks=pytest.mark.slow)])
def test_overlap_mip_matches_brute_force_on_random_graphs(count):
    # 30 graphs, five on each topology, in the suite's run; 60 with the slow tests
    rng = random.Random(1)
    topos = [(n, f()) for n, f in TOPOLOGIES]
    closed = 0
    for trial in range(count):
        name, topo = topos[trial % len(topos)]
        g = small_random_graph(rng)
        opts = Options(weights="sharded", steady_state=False, overlap=True)
        nodes = truncate_candidates(graph_candidates(g, topo, weights=opts.weights), rng, EXHAUSTIVE_LIMIT)
        model = build_model(g, topo, opts, nodes)
        res = solve_model(model)
        best = exhaustive_best(model)
        # The bound is a true lower bound, the incumbent a true plan of that objective.
        assert res.bound <= best * (1 + SOLVER_REL) + 1e-15, (trial, name)
        assert objective_s(model, res.assignment) == pytest.approx(res.objective, rel=1e-12)
        assert res.objective >= best * (1 - 1e-9) - 1e-15
        if res.gap <= SOLVER_REL:  # HiGHS' tolerance on the scaled max rows
            closed += 1
            assert res.objective == pytest.approx(best, rel=SOLVER_REL, abs=1e-15), (trial, name)
    assert closed == count  # one exact MIP: no duality gap left open


def _weights_and_compute(g, plan, steady_state: bool) -> tuple[float, float, float, float]:
    """(W, K, S, L) of a plan from first principles, not from the objective's `split`: W the
    seconds its weight gathers spend on the wire (each weight edge's exchange, synthesised
    and timed, less what the copies that stitch it add to its end, L), K its kernels
    (`compute_cost`), S those copies in full (device work, overlapped with the wire or
    not: `timing.stitch_time`)."""
    from einsummable.planning.cost import compute_cost, consumer_needs
    from einsummable.planning.exchange import synthesize
    from einsummable.planning.placement import output_layout
    from einsummable.planning.timing import exchange_parts, stitch_time
    topo = plan.topology
    opts = Options("sharded", steady_state)
    model = build_model(g, topo, opts, fixed_nodes(g, topo, opts, plan.chosen))
    w = tail = copies = 0.0
    c = sum(compute_cost(op, model.nodes[op.name].cands[0], g, topo).total_s for op in g.ops)
    for e in model.edges:
        if not (e.src.startswith("input:") and g.tensor(e.tensor).kind == "weight"):
            continue
        src, dst = model.nodes[e.src], model.nodes[e.dst]
        ex = synthesize(g.tensor(e.tensor), output_layout(src.op, src.cands[0]),
                        consumer_needs(dst.op, dst.cands[0], e.tensor), src.op.agg, topo)
        seconds, local = exchange_parts(ex, topo)
        w += seconds - local
        tail += local
        copies += stitch_time(ex, topo)
    return w, c, copies, tail


def test_weights_hidden_under_compute_cost_only_their_contention(tmp_path):
    # Many tokens: the gathered weights (0.79 ms on the wire) stream while the devices compute
    # (7.5 ms), so the objective is the plain sum of the same plan less the weights' time,
    # but for the share κ of the compute they take while they run (`kernel_time`).
    g = mlp(65536)
    plan = optimize(g, "a100x8", weights="sharded", steady_state=True, cache=tmp_path)
    weights_s, kernels_s, copies_s, tail_s = _weights_and_compute(g, plan, True)
    assert 0 < weights_s < kernels_s + copies_s
    mu = memory_bound_share(g, plan.topology)
    share = contention_share(plan.topology, mu)
    assert share > 0
    # the A100s copy on a copy stream: a copy costs compute only what memory-bound kernels
    # beside it lose to it, the memory-bound share μ of it
    assert copy_charge(plan.topology, mu) == mu < 1
    plain = plan_cost(g, "a100x8", plan.chosen, weights="sharded", steady_state=True,
                      overlap=False)
    # the plain sum counts what the copies add to each exchange's end; behind compute they
    # cost that share of their device time instead
    assert plan.objective_s == pytest.approx(
        plain - (1 - share) * weights_s - tail_s + mu * copies_s, rel=1e-9)
    assert plan.gap == pytest.approx(0.0, abs=1e-9)


def test_compute_under_longer_weight_gathers_is_what_is_hidden():
    # Few tokens under FSDP: gathering the weights (0.79 ms) outlasts the compute (0.24 ms),
    # so the compute is what hides: the objective is the plain sum less the kernels and what
    # the stitching copies added to the gathers' ends (the W it keeps is their wire time).
    g = mlp(64)
    plan = named_plan(g, "a100x8", "fsdp", weights="sharded", steady_state=True)
    weights_s, kernels_s, copies_s, tail_s = _weights_and_compute(g, plan, True)
    assert 0 < kernels_s + copies_s < weights_s
    plain = plan_cost(g, "a100x8", plan.chosen, weights="sharded", steady_state=True,
                      overlap=False)
    assert plan.objective_s == pytest.approx(plain - kernels_s - tail_s, rel=1e-9)


def test_overlap_plan_is_never_worse_than_a_named_strategy(tmp_path):
    g = mlp(2048, d=1024, f=4096)
    topo = synthetic(4)
    plan = optimize(g, topo, steady_state=True, cache=tmp_path)
    for name in ("fsdp", "megatron-tp", "megatron-tp-sp"):
        named = named_plan(g, topo, name, steady_state=True)
        assert plan.objective_s <= named.objective_s * (1 + 1e-9), name


def test_weights_crossing_nodes_stream_beside_exchanges_inside_them():
    """h100x8x2, Megatron TP inside each node: its all-reduces load NVLink, the weights it
    gathers from the other node load the NICs; the objective runs them side by side (it
    over-predicted the simulated block by 20% when activations and weights took turns)."""
    from einsummable.backend.runtime.simulator import block_time
    from einsummable.models.llama_ir import llama_block_graph
    from einsummable.models.presets import preset_config
    from einsummable.optimizer.api import named_plan
    from einsummable.optimizer.model import plan_model
    from einsummable.optimizer.objective import split
    from einsummable.topology import load_topology

    g = llama_block_graph(preset_config("llama-7b"), 4, 2048, "float16", 1)
    plan = named_plan(g, load_topology("h100x8x2"), "megatron-tp", weights="sharded",
                      steady_state=True)
    model = plan_model(plan)
    parts = split(model, {k: 0 for k in model.nodes})
    (node_a, node_w), (gpu_a, gpu_w) = parts.levels
    assert node_a == 0.0 and gpu_a == pytest.approx(parts.activations_s)
    assert node_w > gpu_w > 0.0
    assert parts.finish_s + gpu_a + gpu_w < parts.activations_s + parts.weights_s
    assert plan.objective_s == pytest.approx(parts.total_s)
    assert block_time(plan) == pytest.approx(plan.objective_s, rel=0.10)

