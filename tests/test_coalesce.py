"""Message coalescing: blocks for one peer in one batch travel as one packed message, on
topologies whose transport charges per message; the programs still equal the reference on
random graphs and plans (world sizes 1, 2, 3, 4, 6, 8, uneven shapes), in the local executor,
the simulator, and on gloo ranks."""
from __future__ import annotations

import random

import torch
from hypothesis import given, settings, strategies as st

from einsummable.planning.prefetch import worth_packing
from einsummable.backend.lowering import lower
from einsummable.frontend.reference import evaluate
from einsummable.backend.runtime.local import run_local
from einsummable.backend.lowering import Lowered
from einsummable.core.program import Pack, Recv, Send, Unpack
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.topology import synthetic

from helpers import (WORLD_SIZES as WORLDS, inputs_for, llama_tiny, named_plans, random_choice,
                     random_graph, rel_err)

# A transport that charges a millisecond a message: every small block is worth packing.
PER_MESSAGE_S = 1e-3
PACKING = {n: synthetic(n, nodes=2 if n == 6 else 1, message_s=PER_MESSAGE_S) for n in WORLDS}
PLAIN = {n: synthetic(n, nodes=2 if n == 6 else 1) for n in WORLDS}


def _count(low: Lowered, kind) -> int:
    return sum(isinstance(i, kind) for p in low.programs for i in p.instrs)


def _blocks_sent(low: Lowered) -> int:
    """Blocks that leave their rank: one per plain Send, one per part of a packed one."""
    n = 0
    for p in low.programs:
        packed = {i.out: len(i.srcs) for i in p.instrs if isinstance(i, Pack)}
        n += sum(packed.get(i.src, 1) for i in p.instrs if isinstance(i, Send))
    return n


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(WORLDS))
def test_packed_programs_equal_the_reference(seed, n):
    rng = random.Random(seed)
    g = random_graph(rng)
    choice = random_choice(g, n, rng)
    packed = lower(g, choice, PACKING[n])
    # the same exchanges unpacked (the synthesis may pick other programs where messages
    # cost nothing, so the comparison is on the packing topology)
    plain = lower(g, choice, PACKING[n], coalesce=False)
    ins = inputs_for(g, seed)
    want = evaluate(g, ins)[g.outputs[0]]
    got = run_local(packed, ins)[g.outputs[0]]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Packing only merges messages: never more of them, the same bytes in all.
    assert _count(packed, Send) <= _count(plain, Send)
    assert _count(packed, Recv) == _count(packed, Send)
    packs = _count(packed, Pack)
    assert _blocks_sent(packed) == _count(plain, Send)
    assert _count(packed, Unpack) >= packs  # a pack may go to several peers
    # It serialises and prints.
    back = Lowered.from_json(packed.to_json())
    assert back.programs == packed.programs
    if packs:
        assert "pack(" in str(packed) and "unpack %" in str(packed)
    # The simulator runs both without deadlock and sees the same bytes on every link.
    assert simulate_programs(packed, PACKING[n]).link_bytes == \
        simulate_programs(plain, PACKING[n]).link_bytes


def test_packing_happens_and_saves_messages_on_a_gather():
    # Every device needs the whole weight: each peer's blocks of it go as one message.
    from einsummable.frontend.builder import Builder
    from einsummable.planning.placement import INPUT_PREFIX, input_op, place
    b = Builder()
    x = b.input("x", (8, 16))
    w = b.weight("w", (16, 12))
    g = b.build([b.einsum("ij,jk->ik", x, w)])
    op = g.ops[0]
    n = 4
    choice = {op.name: place(op, {"i": n}, list(range(n))),
              INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {"a": n}, list(range(n))),
              # the weight in 8 row blocks, two per device: each reader gets two per peer
              INPUT_PREFIX + "w": place(input_op(g.tensor("w")), {"a": 2 * n},
                                        [d for d in range(n) for _ in range(2)])}
    packed, plain = lower(g, choice, PACKING[n]), lower(g, choice, PLAIN[n])
    assert _count(packed, Pack) > 0
    assert _count(packed, Send) < _count(plain, Send)
    ins = inputs_for(g, 0)
    torch.testing.assert_close(run_local(packed, ins)[g.outputs[0]], evaluate(g, ins)[g.outputs[0]])
    # With a per-message price the simulator sees the saving.
    assert simulate_programs(packed, PACKING[n]).time_s < simulate_programs(plain, PACKING[n]).time_s


def test_only_small_blocks_are_worth_a_copy():
    dev = PACKING[2].devices[0]
    small = int(PER_MESSAGE_S * dev.mem_bw / 8)
    assert worth_packing(small, dev, dev)
    assert not worth_packing(small * 4, dev, dev)
    gpu = PLAIN[2].devices[0]  # no per-message price: nothing is packed
    assert not worth_packing(1, gpu, gpu)


def test_packed_llama_tiny_on_gloo_equals_reference():
    from einsummable.backend.runtime.pool import Pools, run_dist
    g, ins, _ = llama_tiny()
    topo = PACKING[4]
    want = evaluate(g, ins)[g.outputs[0]]
    pools = Pools()
    try:
        packed_any = False
        for name, choice in named_plans(g, topo).items():
            low = lower(g, choice, topo)
            packed_any |= _count(low, Pack) > 0
            got = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
            assert rel_err(got[g.outputs[0]], want) <= 1e-5, name
            again = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
            assert torch.equal(got[g.outputs[0]], again[g.outputs[0]]), name
        assert packed_any
    finally:
        pools.close()


def test_a_local_copy_between_exchanges_keeps_them_one_batch():
    # The own half of a gathered weight is copied beside the half a receive lands in: a copy
    # that waits on no message does not split the exchange, so its blocks can go as one.
    from einsummable.core.program import Alloc, Assemble, Place, batch_keepers, p2p_batches
    own = Assemble(out=3, shape=(4,), dtype="float32", parts=((0, ((0, 2),), ((0, 2),)),),
                   alloc=False)
    of_received = Assemble(out=5, shape=(2,), dtype="float32", parts=((1, ((0, 2),), ((0, 2),)),),
                           alloc=True)
    instrs = [Place(0, "w", ((0, 2),)), Alloc(3, (4,), "float32"),
              Recv(1, 1, 0, (2,), "float32", into=3, at=((2, 4),)), own,
              Send(0, 1, 1), Send(0, 1, 2), of_received, Send(0, 1, 3)]
    assert batch_keepers(instrs) == [True, True, False, True, False, False, False, False]
    # One batch up to the copy of a received block, which ends it; the last send opens another.
    assert p2p_batches(instrs) == {2, 7}


def test_fsdp_llama_tiny_gathers_its_weights_in_one_message_each_way():
    from einsummable.optimizer.api import named_plan
    from einsummable.topology import load_topology
    g, ins, _ = llama_tiny(batch=4, seq=16)
    topo = load_topology("cpu2")
    plan = named_plan(g, topo, "fsdp", weights="sharded")
    low = lower(g, plan.choice, topo)
    outputs_to_rank0 = 1  # rank 1 delivers its half of the block's output to rank 0
    assert [sum(isinstance(i, Send) for i in p.instrs) for p in low.programs] \
        == [1, 1 + outputs_to_rank0]
    want = evaluate(g, ins)[g.outputs[0]]
    assert rel_err(run_local(low, ins)[g.outputs[0]], want) <= 1e-5
