"""Relays: a rank forwarding a block it is still receiving neither stalls its own kernels
(the simulator's communication engine) nor breaks the programs (the gloo executor parks the
send and forwards the block when it arrives); sends to one peer keep their order."""
from __future__ import annotations


from einsummable.backend.lowering import lower
from einsummable.backend.runtime.pool import run_dist
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.core.program import Compute, Recv, Send
from einsummable.frontend.builder import Builder
from einsummable.frontend.reference import evaluate
from einsummable.frontend.scalar import arg
from einsummable.planning.placement import INPUT_PREFIX, input_op, place

from helpers import inputs_for, rel_err, ring4

def _relayed_plan():
    """x lives on device 0; y = 2x is computed on device 2 (x crosses 0 -> 1 -> 2), and
    device 1 also squares an input of its own that needs nothing from anyone."""
    b = Builder()
    x = b.input("x", (64, 64))
    z = b.input("z", (64, 64))
    y = b.map(arg(0) * 2.0, x)
    w = b.map(arg(0) * arg(0), z)
    g = b.build([y, w])
    topo = ring4()
    ops = {op.output: op for op in g.ops}
    choice = {INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {}, [0]),
              INPUT_PREFIX + "z": place(input_op(g.tensor("z")), {}, [1]),
              ops[y.name].name: place(ops[y.name], {}, [2]),
              ops[w.name].name: place(ops[w.name], {}, [1])}
    return g, choice, topo


def test_the_relay_is_in_the_programs():
    g, choice, topo = _relayed_plan()
    low = lower(g, choice, topo)
    relay = low.programs[1].instrs
    received = {i.out for i in relay if isinstance(i, Recv) and i.peer == 0}
    assert any(isinstance(i, Send) and i.src in received and i.peer == 2 for i in relay)


def test_a_relay_does_not_stall_its_rank():
    g, choice, topo = _relayed_plan()
    low = lower(g, choice, topo)
    res = simulate_programs(low, topo, trace=True)
    prog = low.programs[1].instrs
    square = next(e for e in res.trace if e[0] == 1 and e[2] == "Compute")
    forward = next(pc for pc, i in enumerate(prog) if isinstance(i, Send) and i.peer == 2)
    square_pc = next(pc for pc, i in enumerate(prog) if isinstance(i, Compute))
    assert forward < square_pc  # the forward comes first in rank 1's program ...
    block = g.tensor("x").nbytes
    arrival = topo.link(0, 1).time(block)
    assert square[4] < arrival  # ... yet the square starts before the block has reached it
    # and y still waits for both hops: store and forward, each at the link's rate
    y = next(e for e in res.trace if e[0] == 2 and e[2] == "Compute")
    assert y[4] >= 2 * arrival


def test_the_gloo_executor_forwards_a_block_it_is_still_receiving(pools):
    g, choice, topo = _relayed_plan()
    low = lower(g, choice, topo)
    ins = inputs_for(g, 0)
    want = evaluate(g, ins)
    got = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
    for name in g.outputs:
        assert rel_err(got[name], want[name]) <= 1e-6, name
