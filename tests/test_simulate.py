"""Simulator: exact on hand-computable cases; bandwidth is shared; optimized exchange is not
slower than naive on the DGX-1 cube mesh."""
from __future__ import annotations

import random

import pytest

from einsummable.builder import Builder
from einsummable.lower import lower
from einsummable.placement import INPUT_PREFIX, input_op, place
from einsummable.runtime.simulate import simulate, simulate_programs
from einsummable.topology import load_topology, synthetic

from test_lower_local import random_choice, random_graph, TOPOS


def matmul_graph(n=256):
    b = Builder()
    x = b.input("x", (n, n))
    w = b.weight("w", (n, n))
    return b.build([b.einsum("ij,jk->ik", x, w)])


def one_device_choice(g, dev=0):
    ch = {op.name: place(op, {}, [dev]) for op in g.ops}
    for info in g.inputs:
        ch[INPUT_PREFIX + info.name] = place(input_op(info), {}, [dev])
    return ch


def test_single_rank_is_compute_only():
    g = matmul_graph()
    topo = synthetic(1)
    res = simulate(g, one_device_choice(g), topo)
    dev = topo.devices[0]
    op = g.ops[0]
    # Two Places and one Compute pay the per-instruction overhead; the matmul is rate-bound.
    roofline = max(op.flops / dev.peak("float32"), 3 * 256 * 256 * 4 / dev.mem_bw)
    assert res.time_s == pytest.approx(3 * dev.launch_s + roofline)
    assert res.link_bytes == {}


def test_one_transfer_is_latency_plus_bytes_over_bw():
    g = matmul_graph()
    topo = synthetic(2)
    ch = one_device_choice(g, 1)
    ch[INPUT_PREFIX + "x"] = place(input_op(g.tensor("x")), {}, [0])
    res = simulate(g, ch, topo)
    link = topo.link(0, 1)
    dev = topo.devices[1]
    nbytes = g.tensor("x").nbytes
    # Per-instruction overhead on the critical path: Place x, Send x, Compute, Send out.
    want = (nbytes / link.bw + link.latency_s  # x to rank 1
            + 4 * dev.launch_s + g.ops[0].flops / dev.peak("float32")
            + nbytes / topo.link(1, 0).bw + topo.link(1, 0).latency_s)  # output to rank 0
    assert res.time_s == pytest.approx(want, rel=1e-6)
    assert res.link_bytes == {(0, 1): nbytes, (1, 0): nbytes}


def test_flows_on_one_resource_share_its_bandwidth():
    # Rank 0 sends x to ranks 1..3 over per-device NICs of a 2-node synthetic: nic0.0 is shared.
    b = Builder()
    x = b.input("x", (512, 512))
    y = b.map(__import__("einsummable.scalar", fromlist=["arg"]).arg(0) * 2.0, x)
    g = b.build([y])
    topo = synthetic(2, nodes=2)
    ch = {g.ops[0].name: place(g.ops[0], {}, [1]),
          INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {}, [0])}
    one = simulate(g, ch, topo).time_s
    assert one > g.tensor("x").nbytes / topo.link(0, 1).bw


def test_random_plans_simulate_and_optimized_beats_naive_on_dgx1():
    rng = random.Random(0)
    topo = load_topology("dgx1-v100")
    wins = 0
    for seed in range(12):
        g = random_graph(random.Random(seed))
        ch = random_choice(g, 8, random.Random(seed))
        opt = simulate(g, ch, topo).time_s
        naive = simulate(g, ch, topo, mode="naive").time_s
        assert opt > 0 and naive > 0
        wins += opt <= naive * 1.05
    assert wins >= 10
