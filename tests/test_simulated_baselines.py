"""The analytic long-context baselines (Ulysses, ring attention) and the plan summaries that
stand beside them in the harness's tables."""
from __future__ import annotations

import pytest

from einsummable.frontend.fuse import fuse
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.topology import load_topology, synthetic
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


# LLaMA-7B block, 1 x 8192 tokens, fp16: the weights (two norms of 4096, four 4096x4096
# projections, three 4096x11008 FFN matrices) and the 8192x4096 activations in bytes.
WEIGHT_BYTES = 2 * (2 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008)  # 404766720
ACTIVATION_BYTES = 2 * 8192 * 4096                                   # 64 MiB


def _ring_collective_s(kind, nbytes, n=8, bw=300e9, latency=3e-6):
    """NCCL's ring collectives on n devices (bw, latency of the slowest ring hop), by hand."""
    moved = {"all_gather": (n - 1) / n, "ring_pass": (n - 1) / n,
             "all_to_all": (n - 1) / n ** 2, "all_reduce": 2 * (n - 1) / n}[kind]
    hops = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return moved * nbytes / bw + hops * latency


def test_ring_collective_times_are_the_hand_computed_figures():
    # 8 devices, 1 GB/s, 1 ms a hop, 8 MB: an all-reduce moves 2 x 7/8 of it and pays 14 hops.
    c = simulated.Collective
    assert simulated.collective_time(c("all_reduce", "t", 8_000_000), 8, 1e9, 1e-3) == \
        pytest.approx(0.014 + 0.014, rel=1e-12)
    assert simulated.collective_time(c("all_gather", "t", 8_000_000), 8, 1e9, 1e-3) == \
        pytest.approx(0.007 + 0.007, rel=1e-12)
    assert simulated.collective_time(c("all_to_all", "t", 8_000_000), 8, 1e9, 1e-3) == \
        pytest.approx(0.000875 + 0.007, rel=1e-12)
    assert simulated.collective_time(c("all_reduce", "t", 8_000_000), 1, 1e9, 1e-3) == 0.0
    # a100x8: NVSwitch, every hop 300 GB/s and 3 us
    assert simulated.ring(load_topology("a100x8")) == (300e9, 3e-6)


def test_ulysses_and_ring_attention_are_priced_from_their_collectives(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    gathers = sum(_ring_collective_s("all_gather", w.nbytes) for w in long_block.weights)
    assert sum(w.nbytes for w in long_block.weights) == WEIGHT_BYTES
    assert len(long_block.weights) == 9
    # Ulysses: every weight all-gathered once (ZeRO-3), and four all-to-alls of 64 MiB
    # (queries, keys, values in; the attention output back).
    uly = simulated.simulate_baseline("ulysses", long_block, topo)
    assert sorted(c.kind for c in uly.collectives) == ["all_gather"] * 9 + ["all_to_all"] * 4
    assert uly.comm_s == pytest.approx(
        gathers + 4 * _ring_collective_s("all_to_all", ACTIVATION_BYTES), rel=1e-9)
    assert uly.time_s == pytest.approx(uly.compute_s + uly.comm_s)
    # Ring attention: keys and values pass round the ring, 2 x 216.7 us, behind each device's
    # attention, which takes at least 4 s^2 d FLOP / 8 devices at 312 TFLOP/s = 440.5 us: only
    # the weight gathers show.
    passes = 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES)
    assert passes < 4 * 8192 ** 2 * 4096 / (8 * 312e12)
    ring = simulated.simulate_baseline("ring-attention", long_block, topo)
    assert sorted(c.kind for c in ring.collectives) == ["all_gather"] * 9 + ["ring_pass"] * 2
    assert ring.comm_s == pytest.approx(gathers, rel=1e-9)
    # At a sixth of the bandwidth the passes outlast the attention: the excess shows.
    slow = synthetic(8, intra_bw=50e9)
    slow_ring = simulated.simulate_baseline("ring-attention", long_block, slow)
    slow_gathers = sum(_ring_collective_s("all_gather", w.nbytes, bw=50e9)
                       for w in long_block.weights)
    attention = simulated.attention_compute(long_block, slow)
    assert 4 * 8192 ** 2 * 4096 / (8 * 312e12) <= attention <= 1.05 * 4 * 8192 ** 2 * 4096 / (
        8 * 312e12)
    exposed = 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES, bw=50e9) - attention
    assert exposed > 0
    assert slow_ring.comm_s == pytest.approx(slow_gathers + exposed, rel=1e-9)


def test_plan_summary_names_what_each_strategy_splits(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    uly = op_splits(named_plan(long_block, topo, "ulysses"))
    attention = [k for k, s in uly.items() if s.endswith("(attention)")]
    assert attention and all(uly[k].startswith("feature") for k in attention)  # heads
    assert all(s.startswith("seq 8192/8") for k, s in uly.items() if k not in attention)
    tp = describe(named_plan(long_block, topo, "megatron-tp"))
    assert "feature 32/8" in tp and "feature 11008/8" in tp  # heads, then the FFN width
