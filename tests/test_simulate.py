"""Simulator: exact on hand-computable cases; bandwidth is shared; optimized exchange is not
slower than naive on the DGX-1 cube mesh."""
from __future__ import annotations

import random

import pytest

from einsummable.frontend.builder import Builder
from einsummable.frontend.scalar import arg
from einsummable.backend.lowering import lower
from einsummable.planning.placement import INPUT_PREFIX, input_op, place
from einsummable.backend.runtime.simulator import simulate, simulate_programs
from einsummable.topology import load_topology, synthetic

import einsummable.planning.network as N

from helpers import random_choice, random_graph


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
    # Only the Compute launches a kernel (Places are resident); the matmul is rate-bound.
    roofline = max(op.flops / dev.peak("float32"), 3 * 256 * 256 * 4 / dev.mem_bw)
    assert res.time_s == pytest.approx(dev.launch_s + roofline)
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
    # Launches on the critical path: the p2p batch sending x, Compute, the batch sending out.
    want = (nbytes / link.bw + link.latency_s  # x to rank 1
            + 3 * dev.launch_s + g.ops[0].flops / dev.peak("float32")
            + nbytes / topo.link(1, 0).bw + topo.link(1, 0).latency_s)  # output to rank 0
    assert res.time_s == pytest.approx(want, rel=1e-6)
    assert res.link_bytes == {(0, 1): nbytes, (1, 0): nbytes}


def _halves_over_the_nics(senders, readers, rows=512):
    """x (rows x 512 fp32) in two row halves on `senders`, y = 2x split the same way on
    `readers` of the other node of synthetic(4, nodes=2); naive exchange: each half goes
    straight from its owner to its reader over the owner's NIC. Returns the simulated time
    at which each reader's compute could start (its half arrived), minus the p2p launch and
    the link latency: the seconds the half spent on the wire."""
    b = Builder()
    x = b.input("x", (rows, 512))
    g = b.build([b.map(arg(0) * 2.0, x)])
    op = g.ops[0]
    topo = synthetic(4, nodes=2)
    ch = {op.name: place(op, {op.modes[0]: len(readers)}, list(readers)),
          INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {"a": len(senders)}, list(senders))}
    res = simulate_programs(lower(g, ch, topo, mode="naive"), topo, trace=True)
    link = topo.link(0, 2)
    fixed = topo.devices[0].launch_s + link.latency_s
    return {e[0]: e[4] - fixed for e in res.trace if e[2] == "Compute"}, \
        g.tensor("x").nbytes / len(senders) / link.bw


def test_flows_on_one_resource_share_its_bandwidth():
    # Node 0 = ranks 0, 1 (NICs nic0.0, nic0.1), node 1 = ranks 2, 3. Two equal halves that
    # both leave rank 0 (to ranks 2 and 3) share nic0.0: each gets half its bandwidth and both
    # arrive after twice one half's wire time. Halves leaving ranks 0 and 1 use separate NICs
    # and arrive after one wire time, as a half sent alone does.
    shared, wire = _halves_over_the_nics([0, 0], [2, 3])
    apart, _ = _halves_over_the_nics([0, 1], [2, 3])
    alone, _ = _halves_over_the_nics([0, 1], [2, 1])  # rank 1 keeps its half: one flow
    assert sorted(shared) == sorted(apart) == [2, 3]
    assert shared[2] == pytest.approx(2 * wire, rel=1e-6)
    assert shared[3] == pytest.approx(2 * wire, rel=1e-6)
    assert apart[2] == pytest.approx(wire, rel=1e-6) and apart[3] == pytest.approx(wire, rel=1e-6)
    assert alone[2] == pytest.approx(wire, rel=1e-6)


def test_random_plans_simulate_in_both_modes_on_dgx1():
    # These graphs move 16-200 byte tensors: latency and launches, not bandwidth, decide, and a
    # relay or reduce tree costs extra p2p batches and Reduce kernels that direct sends do not.
    # So optimized may lose to naive here, but only by a few launches.
    topo = load_topology("dgx1-v100")
    for seed in range(12):
        g = random_graph(random.Random(seed))
        ch = random_choice(g, 8, random.Random(seed))
        opt = simulate(g, ch, topo).time_s
        naive = simulate(g, ch, topo, mode="naive").time_s
        assert opt > 0 and naive > 0
        assert opt <= naive + 20 * topo.devices[0].launch_s


def test_sends_share_the_senders_egress_port():
    # On a100x8 every link loads its GPU's 300 GB/s NVSwitch port: rank 0 sending x to 7 peers
    # takes 7 x bytes / port_bw (as a ring's (N-1)/N · B / bw), not bytes / bw.
    b = Builder()
    x = b.input("x", (1024, 1024))
    y = b.map(arg(0) * 2.0, x)
    g = b.build([y])
    topo = load_topology("a100x8")
    op = g.ops[0]
    ch = {op.name: place(op, {"i0": 8} if "i0" in op.modes else {op.modes[0]: 8}, list(range(8))),
          INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {}, [0])}
    low = lower(g, ch, topo)
    res = simulate_programs(low, topo, trace=True)
    link = topo.link(0, 1)
    slab = g.tensor("x").nbytes / 8
    last_arrival = max(e[4] for e in res.trace if e[0] != 0 and e[2] == "Compute")
    batch_launch = topo.devices[0].launch_s  # the one p2p group of the 7 sends
    want = batch_launch + 7 * slab / link.port_bw + link.latency_s
    assert last_arrival == pytest.approx(want, rel=0.02)


def test_one_launch_per_p2p_batch():
    from einsummable.core.program import Free, Recv, Reduce, Send
    from einsummable.core.program import p2p_batches
    prog = [Recv(1, 1, 0, (1,), "float32"), Send(0, 1, 1), Send(0, 2, 2), Free(0),
            Recv(2, 1, 3, (1,), "float32"), Send(2, 3, 4),  # relay of %2 opens a new batch
            Reduce(3, "sum", (2,)), Send(3, 1, 5)]            # a kernel ends the batch
    # Free (host bookkeeping) does not end a batch.
    assert p2p_batches(prog) == {0, 5, 7}


def test_a_tensor_read_by_two_ops_crosses_once():
    # y = x*2 split by rows; both readers need y whole on rank 0: one gather, not two.
    from einsummable.frontend.scalar import arg
    b = Builder()
    x = b.input("x", (256, 256))
    y = b.map(arg(0) * 2.0, x)
    g = b.build([b.map(arg(0) + arg(1), y, b.map(arg(0) * 3.0, y))])
    topo = synthetic(2)
    first = g.ops[0]
    ch = one_device_choice(g, 0)
    ch[first.name] = place(first, {first.modes[0]: 2}, [0, 1])
    ch[INPUT_PREFIX + "x"] = place(input_op(g.tensor("x")), {first.modes[0]: 2}, [0, 1])
    low = lower(g, ch, topo)
    res = simulate_programs(low, topo)
    assert res.link_bytes[(1, 0)] == g.tensor(first.output).nbytes // 2


def _gathered_weight_chain(n=256):
    """x @ w1 @ w2 with both weights stored by rows over 2 ranks and every op on rank 0."""
    b = Builder()
    x = b.input("x", (64, n))
    w1, w2 = b.weight("w1", (n, n)), b.weight("w2", (n, n))
    g = b.build([b.einsum("ij,jk->ik", b.einsum("ij,jk->ik", x, w1, name="mm1"), w2, name="mm2")])
    ch = one_device_choice(g, 0)
    for w in ("w1", "w2"):
        ch[INPUT_PREFIX + w] = place(input_op(g.tensor(w)), {"a": 2}, [0, 1])
    return g, ch


def test_received_rows_land_in_place_without_a_copy():
    from einsummable.backend.runtime.local import run_local
    from einsummable.core.program import Alloc, Assemble, Recv
    from einsummable.frontend.reference import evaluate
    import torch
    g, ch = _gathered_weight_chain()
    low = lower(g, ch, synthetic(2))
    instrs = low.programs[0].instrs
    into = [i for i in instrs if isinstance(i, Recv) and i.into is not None]
    assert len(into) == 2 and sum(isinstance(i, Alloc) for i in instrs) == 2
    # Only rank 0's own half is copied into each gathered weight.
    assert all(len(i.parts) == 1 and not i.alloc for i in instrs if isinstance(i, Assemble))
    inputs = {t.name: torch.randn(t.shape) for t in g.inputs}
    got = run_local(low, inputs)[g.outputs[0]]
    assert torch.allclose(got, evaluate(g, inputs)[g.outputs[0]], rtol=1e-5, atol=1e-5)


def test_weight_prefetch_goes_out_in_need_order_behind_urgent_traffic():
    from einsummable.core.program import Send
    g, ch = _gathered_weight_chain(2048)  # 8 MB halves: bandwidth, not launches, decides
    topo = synthetic(2)
    low = lower(g, ch, topo, prefetch=1)
    sends = [i for i in low.programs[1].instrs if isinstance(i, Send)]
    # Both weights are prefetched, w1 (needed first) with the lower queue number.
    assert [s.queue for s in sends] == [1, 2]
    res = simulate_programs(low, topo, trace=True)
    half = g.tensor("w1").nbytes / 2
    link = topo.link(1, 0)
    mm = [e for e in res.trace if e[0] == 0 and e[2] == "Compute"]
    # w1's half arrives alone at full rate (w2 waits its turn on the prefetch stream).
    assert mm[0][4] >= half / link.bw + link.latency_s
    assert mm[0][4] == pytest.approx(topo.devices[1].launch_s + half / link.bw + link.latency_s,
                                     rel=0.05)
    lazy = simulate_programs(lower(g, ch, topo, prefetch=0), topo).time_s
    assert res.time_s <= lazy + 1e-12


def test_gigabyte_flows_late_in_the_run_finish():
    # Float drift once left remainders whose time to drain no longer moved the clock, and the
    # network stepped through them forever (a 131072-token block never finished simulating).
    net = N.Network()
    net.now = 0.1234567
    for i in range(7):
        net.start(N.Flow(i, ((f"link{i % 3}", 300e9), ("port", 450e9)), 1e-6,
                          2818572288.0 / (i + 1)))
    steps = 0
    while net.flows and steps < 1000:
        net.advance(net.next_done())
        steps += 1
    assert not net.flows and sorted(net.arrived) == list(range(7))
    assert steps <= 7


def _late_reader(rows: int):
    """x (rows x 512 fp32) on rank 0; rank 1 first runs a matmul of its own, then reads x.
    Lowered without sending ahead, x's receive comes after the matmul on rank 1 (ahead, it
    would be posted before it). Returns (when the matmul ends,
    when rank 1's read of x starts, x's bytes, the wire seconds of x)."""
    b = Builder()
    x = b.input("x", (rows, 512))
    w = b.weight("w", (512, 512))
    v = b.weight("v", (512, 512))
    y = b.einsum("ij,jk->ik", w, v)
    g = b.build([b.einsum("ij,jk->ik", x, y)])
    topo = synthetic(2)
    ch = one_device_choice(g, 1)
    ch[INPUT_PREFIX + "x"] = place(input_op(g.tensor("x")), {}, [0])
    low = lower(g, ch, topo, ahead=False)
    res = simulate_programs(low, topo, trace=True)
    computes = sorted(e for e in res.trace if e[0] == 1 and e[2] == "Compute")
    link = topo.link(0, 1)
    nbytes = g.tensor("x").nbytes
    return computes[0][5], computes[1][4], nbytes, nbytes / link.bw + link.latency_s


def test_a_large_message_waits_for_its_receive_a_small_one_does_not():
    """Over `network.EAGER_BYTES` a send is a rendezvous: x (8 MiB) leaves only once rank 1
    reached its receive, after the matmul, so the read waits a whole wire time past it; x
    of 1 MiB fits the receiver's buffer, crosses during the matmul, and the read starts as
    the matmul ends and its receive's p2p batch is launched."""
    end, read, nbytes, wire = _late_reader(4096)
    assert nbytes > N.EAGER_BYTES
    assert read >= end + wire
    end, read, nbytes, wire = _late_reader(512)
    assert nbytes <= N.EAGER_BYTES and wire < end
    assert read == pytest.approx(end + synthetic(2).devices[1].launch_s)
