"""The analytic long-context baselines (Ulysses, ring attention) and the plan summaries that
stand beside them in the harness's tables."""
from __future__ import annotations

import pytest

from einsummable.frontend.fuse import fuse
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.topology import load_topology
from experiments import simulated
from experiments.einsummable_system import named_plan
from experiments.plan_summary import describe, op_splits


@pytest.fixture(scope="module")
def long_block():
    # One sequence, many tokens: the shape where sequence-parallel attention matters.
    # Fused, as capture gives it; the spelled-out chain must give the same collectives.
    g = llama_block_graph(preset_config("llama-7b"), 1, 8192, "float16")
    return fuse(g), g


def test_attention_boundary_is_queries_keys_values_in_one_out(long_block):
    fused, chain = long_block
    assert len(simulated.attention_ops(fused)) == len(simulated.attention_ops(chain)) == 1
    for g in long_block:
        ins, keys, outs = simulated.attention_boundary(g)
        assert len(ins) == 3 and len(keys) == 2 and len(outs) == 1
        assert set(keys) < set(ins)  # the queries are not indexed by the key sequence
        assert [g.tensor(t).nbytes for t in ins] == [g.tensor(t).nbytes for t in
                                                     simulated.attention_boundary(fused)[0]]


def test_ulysses_and_ring_attention_are_priced_from_their_collectives(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    bw, lat = simulated.ring(topo)
    n = topo.world_size
    uly = simulated.simulate_baseline("ulysses", long_block, topo)
    a2a = [c for c in uly.collectives if c.kind == "all_to_all"]
    assert len(a2a) == 4  # q, k, v in; out
    assert uly.time_s == pytest.approx(uly.compute_s + uly.comm_s)
    assert uly.comm_s == pytest.approx(sum(simulated.collective_time(c, n, bw, lat)
                                           for c in uly.collectives))
    ring = simulated.simulate_baseline("ring-attention", long_block, topo)
    passes = [c for c in ring.collectives if c.kind == "ring_pass"]
    assert len(passes) == 2  # keys and values
    gathers = sum(simulated.collective_time(c, n, bw, lat) for c in ring.collectives
                  if c.kind == "all_gather")
    exposed = sum(simulated.collective_time(c, n, bw, lat) for c in passes) \
        - simulated.attention_compute(long_block, topo)
    assert ring.comm_s == pytest.approx(gathers + max(0.0, exposed))
    # An all-to-all moves 1/N of what a ring pass of the same tensor moves.
    c = a2a[0]
    assert simulated.collective_time(c, n, bw, 0.0) == pytest.approx(
        simulated.collective_time(simulated.Collective("ring_pass", c.tensor, c.nbytes),
                                  n, bw, 0.0) / n)


def test_plan_summary_names_what_each_strategy_splits(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    uly = op_splits(named_plan(long_block, topo, "ulysses"))
    attention = [k for k, s in uly.items() if s.endswith("(attention)")]
    assert attention and all(uly[k].startswith("feature") for k in attention)  # heads
    assert all(s.startswith("seq 8192/8") for k, s in uly.items() if k not in attention)
    tp = describe(named_plan(long_block, topo, "megatron-tp"))
    assert "feature 32/8" in tp and "feature 11008/8" in tp  # heads, then the FFN width
