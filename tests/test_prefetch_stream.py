"""Prefetch streams: a weight prefetch's launches and stitching copies run beside the kernels
on GPUs (`Device.prefetch_stream`, `Assemble.queue`, `program.prefetch_batches`), and the contention rule that prices them, piecewise
over the flows' ends (`kernel_time.loaded_spans_s`, `network.Network.load`)."""
from __future__ import annotations

import dataclasses

import pytest

from einsummable.backend.lowering import STEADY, lower
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.core.program import (Assemble, Place, Recv, Reduce, Send, p2p_batches,
                                      prefetch_batches)
from einsummable.frontend.reference import evaluate
from einsummable.optimizer.api import named_plan
from einsummable.planning.kernel_time import (
    COPY_MEMORY_SHARE,
    KernelTime,
    Span,
    loaded_s,
    loaded_spans_s,
    memory_rate,
)
from einsummable.planning.network import Flow, Network
from einsummable.topology import load_topology

from helpers import inputs_for, mlp, rel_err


def _without_prefetch_streams(topo):
    return dataclasses.replace(topo, devices=tuple(dataclasses.replace(d, prefetch_stream=False)
                                                   for d in topo.devices))


def test_one_span_is_the_rule_as_before():
    dev = load_topology("a100x8").devices[0]
    for kt in (KernelTime(1e-3, 2e-4, 5e-6), KernelTime(1e-5, 3e-4, 5e-6)):
        for rate, drain in ((0.0, 1.0), (100e9, 1.0), (300e9, 5e-5), (600e9, 2e-3)):
            want = loaded_s(kt, dev, rate, drain)
            assert loaded_spans_s(kt, dev, (Span(rate, 0.0, drain, True),)) == want


def test_spans_load_the_kernel_piece_by_piece():
    dev = load_topology("a100x8").devices[0]
    slowdown = dev.achieved.transfer_slowdown
    gemm = KernelTime(1e-3, 1e-5, 0.0)  # compute-bound
    # loaded for 0.1 ms, then free: 0.1 ms at 1 - s of the rate, the rest at full rate
    got = loaded_spans_s(gemm, dev, (Span(100e9, 0.0, 1e-4, True), Span(0.0, 0.0, 1.0, False)))
    assert got == pytest.approx(1e-4 + (1e-3 - 1e-4 * (1 - slowdown)))
    # a copy engine's copy holds no compute units and leaves a compute-bound kernel the
    # memory it does not use: not slowed
    copy = COPY_MEMORY_SHARE * memory_rate(dev)
    assert loaded_spans_s(gemm, dev, (Span(0.0, copy, 1.0, False),)) == gemm.total_s
    # a memory-bound kernel shares the memory with the copy: it keeps half of what the
    # transfers leave, at least
    norm = KernelTime(0.0, 1e-4, 0.0)
    assert loaded_spans_s(norm, dev, (Span(0.0, 2 * memory_rate(dev), 1.0, False),)) == \
        pytest.approx(2e-4)
    rate = 0.3 * memory_rate(dev)
    alone = loaded_spans_s(norm, dev, (Span(rate, 0.0, 1.0, True),))
    both = loaded_spans_s(norm, dev, (Span(rate, 2 * memory_rate(dev), 1.0, True),))
    assert both == pytest.approx(1e-4 / ((1 - 0.3 * dev.achieved.transfer_memory) / 2))
    assert alone < both


def test_network_load_drops_each_flow_at_its_end():
    net = Network()
    net.start_all([Flow(0, (("a", 100.0),), 0.0, 100.0, ends=(0, 1)),
                   Flow(1, (("b", 100.0),), 0.0, 300.0, ends=(2, 0)),
                   Flow(2, (("c", 50.0),), 0.0, 50.0, ends=(0, 0), sms=False)])
    spans = net.load(0, 0.0, queued=250.0)
    assert [(s.transfer_rate, s.copy_rate, s.sms) for s in spans] == \
        [(200.0, 100.0, True), (100.0, 0.0, True), (200.0, 100.0, True)]
    assert [s.seconds for s in spans] == pytest.approx([1.0, 2.0, 250.0 / 300.0])
    assert net.load(3, 0.0) == ()


def _fsdp(tokens: int = 64):
    g = mlp(tokens, d=256, f=1024)
    return g, named_plan(g, "a100x8", "fsdp", weights="sharded", steady_state=True)


def test_weight_copies_are_queued_where_the_devices_have_prefetch_streams():
    g, plan = _fsdp()
    topo = plan.topology
    assert all(d.prefetch_stream for d in topo.devices)
    ins = inputs_for(g, 3)
    want = evaluate(g, ins)[g.outputs[0]]
    for t, queued in ((topo, True), (_without_prefetch_streams(topo), False)):
        low = lower(g, plan.chosen, t)
        copies = [(p, i) for p in low.programs for i in p.instrs
                  if isinstance(i, Assemble) and i.queue]
        assert bool(copies) == queued
        for p, ins_ in copies:  # the own shard only: the received ones land in place
            placed = {i.out for i in p.instrs if isinstance(i, Place)}
            received = {i.into for i in p.instrs if isinstance(i, Recv) and i.into is not None}
            assert ins_.out in received and all(src in placed for src, _, _ in ins_.parts)
        got = run_local(low, ins)[g.outputs[0]]
        assert rel_err(got.float(), want.float()) <= 1e-3


def test_prefetch_stream_takes_the_copies_off_the_compute_stream():
    g, plan = _fsdp(4096)
    topo = plan.topology
    seen = {}
    for t in (topo, _without_prefetch_streams(topo)):
        low = lower(g, plan.chosen, t, deliver=STEADY)
        res = simulate_programs(low, t, trace=True, cost_model=plan.options.cost)
        on_stream = sum(end - start for r, pc, kind, _, start, end in res.trace
                        if kind == "Assemble" and low.programs[r].instrs[pc].queue)
        copies = sum(end - start for _, _, kind, _, start, end in res.trace
                     if kind == "Assemble")
        seen[t.devices[0].prefetch_stream] = (res.time_s, on_stream, copies)
    assert seen[True][1] == 0.0 and seen[False][2] > 0.0
    assert seen[True][0] < seen[False][0]



def test_prefetch_batches_are_the_batches_of_prefetched_messages_only():
    instrs = (Send(0, 1, 10, queue=1), Recv(1, 1, 11, (4,), "float32"),  # prefetch only
              Reduce(2, "sum", (0, 1)),
              Send(0, 1, 12, queue=2), Recv(3, 1, 13, (4,), "float32"),  # with an activation
              Reduce(4, "sum", (0, 3)),
              Recv(5, 1, 14, (4,), "float32"))                             # prefetch only
    assert p2p_batches(instrs) == {0, 3, 6}
    assert prefetch_batches(instrs, {10, 11, 12, 14}) == {0, 6}


def test_prefetch_batches_launch_beside_the_kernels():
    g, plan = _fsdp(4096)
    topo = plan.topology
    seen = {}
    for t in (topo, _without_prefetch_streams(topo)):
        low = lower(g, plan.chosen, t, deliver=STEADY)
        res = simulate_programs(low, t, trace=True, cost_model=plan.options.cost)
        seen[t.devices[0].prefetch_stream] = sum(end - start for _, _, kind, _, start, end
                                                 in res.trace if kind in ("Send", "Recv"))
    # the gathers' launches leave the ranks' streams (the steady-state hand-on's stay)
    assert seen[True] < seen[False] / 2
